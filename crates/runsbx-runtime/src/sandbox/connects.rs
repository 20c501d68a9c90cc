//! Connects that the sandbox's own network refuses, seen as they are made,
//! and the hints that explain them in a call's result.
//!
//! A program that cannot reach `127.0.0.1:8000` or `10.0.0.5:5432` gets
//! ECONNREFUSED or ENETUNREACH, which looks like a broken service rather
//! than a sandbox. The call's seccomp filter sends each `connect` to
//! runsbx's listener (runsbx-policy's `seccomp::OBSERVED`), which reads
//! the destination and the kind of socket from the process (it is the
//! owner of the sandbox's user namespace, so the kernel lets it), looks at
//! the sandbox's network namespace (its interfaces in
//! `/proc/<pid>/net/dev`, its listening sockets through a sock_diag socket
//! made inside it), and lets the connect continue unchanged. What it reads
//! decides nothing: a racing thread could change the address after it was
//! read, and the worst that does is a wrong hint.
//!
//! The judgement is pure ([`judge`], [`NetView`]) and unit-tested here; the
//! reading is in [`observe`].

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{getsockopt, sockopt, SockType};
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;
use serde::Serialize;

/// The most distinct (destination, process) pairs the hints list.
pub const MAX_HINTS: usize = 20;
/// sizeof(struct sockaddr_in6); an IPv4 address is shorter.
const SOCKADDR_IN6: usize = 28;
const AF_INET: u16 = libc::AF_INET as u16;
const AF_INET6: u16 = libc::AF_INET6 as u16;

/// Why the sandbox's network will refuse a connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Nothing listens on that loopback port inside the sandbox.
    NotListening,
    /// The destination is not on the loopback, and the sandbox has no other
    /// interface: no route.
    NoRoute,
}

/// A connect the sandbox's network refuses.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Refused {
    pub destination: SocketAddr,
    pub udp: bool,
    pub process: String,
    pub refusal: Refusal,
}

/// What the listener saw of the sandbox's network namespace when a
/// connect was made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NetView {
    /// Whether `lo` is its only interface.
    pub only_loopback: bool,
    /// The local addresses of its listening TCP sockets, or of its bound
    /// UDP sockets (for a UDP connect).
    pub bound: Vec<(IpAddr, u16)>,
}

/// Whether the sandbox's network will refuse a connect to `to`; `None`
/// when it may well succeed (or runsbx cannot tell).
pub fn judge(to: SocketAddr, view: &NetView) -> Option<Refusal> {
    let ip = canonical(to.ip());
    if ip.is_loopback() || ip.is_unspecified() {
        // Linux connects to the unspecified address through the loopback.
        // A listener on any loopback or wildcard address of that port may
        // take it (127.0.0.2 against a listener on 127.0.0.1 is refused,
        // but runsbx keeps to what it is sure of).
        let taken = view.bound.iter().any(|(addr, port)| {
            let addr = canonical(*addr);
            *port == to.port() && (addr.is_loopback() || addr.is_unspecified())
        });
        return (!taken).then_some(Refusal::NotListening);
    }
    view.only_loopback.then_some(Refusal::NoRoute)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The destination of a `struct sockaddr` as the process passed it; `None`
/// for a family other than AF_INET and AF_INET6 (a unix socket path,
/// AF_UNSPEC to disconnect).
pub fn sockaddr(bytes: &[u8]) -> Option<SocketAddr> {
    let family = u16::from_ne_bytes(bytes.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?);
    match family {
        AF_INET => {
            let ip: [u8; 4] = bytes.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::new(Ipv4Addr::from(ip).into(), port))
        }
        AF_INET6 => {
            let ip: [u8; 16] = bytes.get(8..24)?.try_into().ok()?;
            Some(SocketAddr::new(Ipv6Addr::from(ip).into(), port))
        }
        _ => None,
    }
}

/// Whether `/proc/<pid>/net/dev` lists no interface but `lo`.
pub fn only_loopback(dev: &str) -> bool {
    dev.lines()
        .filter_map(|l| l.split_once(':'))
        .all(|(name, _)| name.trim() == "lo")
}

/// Refused connects, aggregated by (destination, process), bounded.
#[derive(Debug, Default)]
pub struct Connects {
    seen: Vec<(Refused, u64)>,
    index: HashMap<Refused, usize>,
    dropped: u64,
}

impl Connects {
    /// Records one; true when it is the first of its kind (and listed).
    pub fn record(&mut self, refused: Refused) -> bool {
        if let Some(&i) = self.index.get(&refused) {
            if let Some((_, count)) = self.seen.get_mut(i) {
                *count += 1;
            }
            return false;
        }
        if self.seen.len() >= MAX_HINTS {
            self.dropped += 1;
            return false;
        }
        self.index.insert(refused.clone(), self.seen.len());
        self.seen.push((refused, 1));
        true
    }

    /// The hints, in the order first seen; `egress` says whether the call
    /// had runsbx's proxy (then HTTP_PROXY and HTTPS_PROXY are set in it).
    pub fn hints(self, egress: bool) -> Hints {
        Hints {
            connects: self
                .seen
                .into_iter()
                .map(|(r, count)| Hint::of(r, count, egress))
                .collect(),
            dropped: self.dropped,
        }
    }
}

/// Why a connect from the sandbox failed, as the call's result gives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hint {
    /// `loopback_is_own` (nothing listens there inside the sandbox; the
    /// host's loopback is not its), `no_route` (the sandbox's network is
    /// its loopback only) or `no_dns` (either, for port 53).
    pub kind: &'static str,
    /// `127.0.0.1:8000`, `[::1]:8000`.
    pub destination: String,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    /// What the program got: `ECONNREFUSED` (for UDP, on its first send)
    /// or `ENETUNREACH`.
    pub errno: &'static str,
    pub process: String,
    pub count: u64,
    /// One sentence for a person: what happened and what to do.
    pub message: String,
}

/// The `hints` of a call's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Hints {
    /// In the order first seen, at most [`MAX_HINTS`].
    pub connects: Vec<Hint>,
    /// Refused connects past the first [`MAX_HINTS`] kinds, not listed.
    pub dropped: u64,
}

impl Hint {
    fn of(r: Refused, count: u64, egress: bool) -> Self {
        let to = r.destination;
        let protocol = if r.udp { "udp" } else { "tcp" };
        let errno = match r.refusal {
            Refusal::NotListening => "ECONNREFUSED",
            Refusal::NoRoute => "ENETUNREACH",
        };
        let through_proxy = if egress {
            "HTTP and HTTPS go out only through runsbx's proxy, which HTTP_PROXY and \
             HTTPS_PROXY point at, to the hosts the call allows"
        } else {
            "this call has no egress: with --allow-host HOST, HTTP and HTTPS to HOST go out \
             through runsbx's proxy"
        };
        let (kind, message) = if to.port() == 53 {
            (
                "no_dns",
                format!(
                    "{protocol} {to}: the sandbox has no DNS resolver; names are resolved \
                     by runsbx's proxy only, and {through_proxy}"
                ),
            )
        } else {
            match r.refusal {
                Refusal::NotListening => (
                    "loopback_is_own",
                    format!(
                        "{protocol} {to}: nothing listens on that port inside the sandbox; \
                         its loopback is its own, so a service on the host's loopback (an \
                         agent's API, a database) cannot be reached from it"
                    ),
                ),
                Refusal::NoRoute => (
                    "no_route",
                    format!(
                        "{protocol} {to}: the sandbox's only network is its own loopback; \
                         {through_proxy}"
                    ),
                ),
            }
        };
        Self {
            kind,
            destination: to.to_string(),
            protocol,
            errno,
            process: r.process,
            count,
            message,
        }
    }
}

/// Reads a waiting `connect(fd, addr, len)` of process `pid` (`args` as
/// the notification gives them): the destination, the socket's kind, and
/// the sandbox's network as it is now (`sock_diag`: a sock_diag socket in
/// its network namespace); then judges it. `None` when it is not refused
/// or runsbx cannot read it. The caller checks that the notification is
/// still valid afterwards (then `pid` was that process).
pub fn observe(
    pid: u32,
    args: [u64; 6],
    process: String,
    sock_diag: Option<&OwnedFd>,
) -> Option<Refused> {
    let to = read_sockaddr(pid, args[1], args[2])?;
    let udp = match socket_type(pid, args[0])? {
        SockType::Stream => false,
        SockType::Datagram => true,
        _ => return None,
    };
    let ip = canonical(to.ip());
    let view = if ip.is_loopback() || ip.is_unspecified() {
        NetView {
            only_loopback: true,
            bound: crate::sys::sock_diag::bound(sock_diag?, udp).ok()?,
        }
    } else {
        let dev = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
        NetView {
            only_loopback: only_loopback(&dev),
            bound: Vec::new(),
        }
    };
    let refusal = judge(to, &view)?;
    Some(Refused {
        destination: to,
        udp,
        process,
        refusal,
    })
}

/// The `struct sockaddr` at `addr` in process `pid`, at most `len` bytes.
fn read_sockaddr(pid: u32, addr: u64, len: u64) -> Option<SocketAddr> {
    let len = usize::try_from(len).ok()?.min(SOCKADDR_IN6);
    let mut buf = [0u8; SOCKADDR_IN6];
    let local = &mut [IoSliceMut::new(&mut buf[..len])];
    let remote = &[RemoteIoVec {
        base: usize::try_from(addr).ok()?,
        len,
    }];
    let pid = Pid::from_raw(i32::try_from(pid).ok()?);
    let read = process_vm_readv(pid, local, remote).ok()?;
    sockaddr(&buf[..read])
}

/// The type of socket `fd` of process `pid`, from a copy of it
/// (pidfd_getfd), closed at once.
fn socket_type(pid: u32, fd: u64) -> Option<SockType> {
    let fd = RawFd::try_from(fd).ok()?;
    // SAFETY: pidfd_open takes a pid and flags, and returns a new fd or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = RawFd::try_from(pidfd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: a new fd, owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // SAFETY: pidfd_getfd takes a pidfd, the target's fd number and flags,
    // and returns a new fd (close-on-exec) or -1.
    let copy = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let copy = RawFd::try_from(copy).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: a new fd, owned by nobody else.
    let copy = unsafe { OwnedFd::from_raw_fd(copy) };
    getsockopt(&copy, sockopt::SockType).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sockaddrs_are_read_as_the_kernel_reads_them() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&AF_INET.to_ne_bytes());
        v4[2..4].copy_from_slice(&8000u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(sockaddr(&v4), Some(addr("127.0.0.1:8000")));
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&AF_INET6.to_ne_bytes());
        v6[2..4].copy_from_slice(&443u16.to_be_bytes());
        v6[8..24].copy_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(sockaddr(&v6), Some(addr("[2001:db8::1]:443")));
        // Too short, or a unix socket's path: nothing to judge.
        assert_eq!(sockaddr(&v4[..6]), None);
        let mut unix = [0u8; 16];
        unix[..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(sockaddr(&unix), None);
        assert_eq!(sockaddr(&[]), None);
    }

    #[test]
    fn devices_other_than_lo_mean_a_route_may_exist() {
        let lo = "Inter-|   Receive\n face |bytes\n    lo: 0 0 0\n";
        assert!(only_loopback(lo));
        assert!(!only_loopback(&format!("{lo}  eth0: 1 2 3\n")));
    }

    #[test]
    fn loopback_without_a_listener_and_anything_else_without_a_route_are_refused() {
        let view = NetView {
            only_loopback: true,
            bound: vec![
                (IpAddr::from([127, 0, 0, 1]), 3128),
                (IpAddr::V6(Ipv6Addr::UNSPECIFIED), 8080),
                (IpAddr::V6(Ipv6Addr::LOCALHOST), 80),
            ],
        };
        // The proxy's port, and ports on the wildcard, are taken.
        assert_eq!(judge(addr("127.0.0.1:3128"), &view), None);
        assert_eq!(judge(addr("127.0.0.1:8080"), &view), None);
        assert_eq!(judge(addr("[::1]:80"), &view), None);
        assert_eq!(judge(addr("[::ffff:127.0.0.1]:3128"), &view), None);
        // Nothing listens on 8000.
        for to in [
            "127.0.0.1:8000",
            "[::1]:8000",
            "0.0.0.0:8000",
            "127.0.0.53:53",
        ] {
            assert_eq!(judge(addr(to), &view), Some(Refusal::NotListening), "{to}");
        }
        for to in ["10.0.0.5:5432", "169.254.169.254:80", "[2001:db8::1]:443"] {
            assert_eq!(judge(addr(to), &view), Some(Refusal::NoRoute), "{to}");
        }
        // With another interface, runsbx cannot tell.
        let joined = NetView {
            only_loopback: false,
            ..view
        };
        assert_eq!(judge(addr("10.0.0.5:5432"), &joined), None);
    }

    fn refused(to: &str, process: &str, refusal: Refusal) -> Refused {
        Refused {
            destination: addr(to),
            udp: to.ends_with(":53"),
            process: process.to_owned(),
            refusal,
        }
    }

    #[test]
    fn hints_say_what_happened_and_what_to_do_bounded() {
        let mut c = Connects::default();
        assert!(c.record(refused("127.0.0.1:8000", "curl", Refusal::NotListening)));
        assert!(!c.record(refused("127.0.0.1:8000", "curl", Refusal::NotListening)));
        assert!(c.record(refused("10.0.0.5:5432", "psql", Refusal::NoRoute)));
        assert!(c.record(refused("10.0.0.2:53", "python3", Refusal::NoRoute)));
        for i in 0..MAX_HINTS {
            c.record(refused(&format!("10.1.0.{i}:80"), "x", Refusal::NoRoute));
        }
        let hints = c.hints(false);
        assert_eq!(hints.connects.len(), MAX_HINTS);
        assert_eq!(hints.dropped, 3);
        let [own, route, dns] = &hints.connects[..3] else {
            unreachable!()
        };
        assert_eq!(
            (own.kind, own.errno, own.count, own.protocol),
            ("loopback_is_own", "ECONNREFUSED", 2, "tcp")
        );
        assert_eq!(own.destination, "127.0.0.1:8000");
        assert!(own.message.contains("host's loopback"), "{}", own.message);
        assert_eq!((route.kind, route.errno), ("no_route", "ENETUNREACH"));
        assert!(route.message.contains("--allow-host"), "{}", route.message);
        assert_eq!((dns.kind, dns.protocol), ("no_dns", "udp"));
        // With egress, the way out is the proxy already set.
        let mut c = Connects::default();
        c.record(refused("10.0.0.5:5432", "psql", Refusal::NoRoute));
        let hint = &c.hints(true).connects[0];
        assert!(hint.message.contains("HTTPS_PROXY"), "{}", hint.message);
        assert!(!hint.message.contains("--allow-host"), "{}", hint.message);
        let json = serde_json::to_value(&hints).unwrap();
        assert_eq!(json["connects"][0]["kind"], "loopback_is_own");
        assert_eq!(json["dropped"], 3);
    }
}
