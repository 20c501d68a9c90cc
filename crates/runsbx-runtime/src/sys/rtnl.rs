//! Just enough rtnetlink to hold a network namespace to "only `lo`": list
//! its links and addresses, and delete the ones that are not loopback's.
//! Used from a helper that has entered the sandbox's network namespace
//! (see netns.rs), never inside the sandbox.

use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::protocols::NETLINK_ROUTE;
use netlink_sys::Socket;

/// A network interface, as the kernel lists it.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub index: u32,
    pub name: String,
    pub loopback: bool,
}

/// An address on an interface.
#[derive(Debug, Clone)]
pub(crate) struct Address {
    pub index: u32,
    pub addr: Option<IpAddr>,
    pub prefix_len: u8,
    message: AddressMessage,
}

impl Address {
    /// The addresses a fresh network namespace gives `lo` once it is up:
    /// 127.0.0.1/8 and ::1/128.
    pub fn is_loopbacks_own(&self) -> bool {
        match self.addr {
            Some(IpAddr::V4(a)) => a == std::net::Ipv4Addr::LOCALHOST && self.prefix_len == 8,
            Some(IpAddr::V6(a)) => a == std::net::Ipv6Addr::LOCALHOST && self.prefix_len == 128,
            None => false,
        }
    }
}

pub(crate) struct Rtnl {
    socket: Socket,
    seq: u32,
}

impl Rtnl {
    pub fn open() -> io::Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        Ok(Self { socket, seq: 0 })
    }

    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let replies = self.request(
            RouteNetlinkMessage::GetLink(LinkMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(link) => Some(Link {
                    index: link.header.index,
                    name: link
                        .attributes
                        .iter()
                        .find_map(|a| match a {
                            LinkAttribute::IfName(n) => Some(n.clone()),
                            _ => None,
                        })
                        .unwrap_or_else(|| format!("#{}", link.header.index)),
                    loopback: link.header.flags.contains(LinkFlags::Loopback),
                }),
                _ => None,
            })
            .collect())
    }

    pub fn addresses(&mut self) -> io::Result<Vec<Address>> {
        let replies = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(message) => Some(Address {
                    index: message.header.index,
                    prefix_len: message.header.prefix_len,
                    // IFA_LOCAL is the interface's own address on
                    // point-to-point links; IFA_ADDRESS everywhere else.
                    addr: message.attributes.iter().fold(None, |found, a| match a {
                        AddressAttribute::Local(ip) => Some(*ip),
                        AddressAttribute::Address(ip) => found.or(Some(*ip)),
                        _ => found,
                    }),
                    message,
                }),
                _ => None,
            })
            .collect())
    }

    pub fn delete_link(&mut self, index: u32) -> io::Result<()> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        self.request(RouteNetlinkMessage::DelLink(message), NLM_F_ACK)
            .map(drop)
    }

    pub fn delete_address(&mut self, address: &Address) -> io::Result<()> {
        self.request(
            RouteNetlinkMessage::DelAddress(address.message.clone()),
            NLM_F_ACK,
        )
        .map(drop)
    }

    /// Sends one request and collects its replies until the kernel's
    /// DONE, ACK or error.
    fn request(
        &mut self,
        message: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut request = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(message));
        request.finalize();
        let mut buf = vec![0; request.header.length as usize];
        request.serialize(&mut buf);
        self.socket.send(&buf, 0)?;

        let mut replies = Vec::new();
        let mut buf = vec![0u8; 32 << 10];
        loop {
            let n = self.socket.recv(&mut &mut buf[..], 0)?;
            let mut offset = 0;
            while offset < n {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..n])
                    .map_err(|e| io::Error::other(format!("malformed netlink reply: {e}")))?;
                let len = reply.header.length as usize;
                if reply.header.sequence_number == self.seq {
                    match reply.payload {
                        NetlinkPayload::InnerMessage(m) => replies.push(m),
                        NetlinkPayload::Done(_) => return Ok(replies),
                        NetlinkPayload::Error(e) => {
                            return match e.code {
                                None => Ok(replies),
                                Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                            }
                        }
                        _ => {}
                    }
                }
                if len == 0 {
                    break;
                }
                offset += len;
            }
        }
    }
}
