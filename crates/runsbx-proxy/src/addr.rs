//! Which addresses the proxy may connect to.
//!
//! A sandbox must not reach the host's loopback, the host's private networks
//! or a cloud metadata service through the proxy, whatever name it asks for:
//! that is where the agent's own API, the host's other services and the
//! instance's credentials are (docs/security.md, "Network and egress").
//! [`classify`] names the class of every address that is not plain public
//! unicast; the proxy refuses a destination when any of its resolved
//! addresses has a class. IPv6 forms that carry an IPv4 address
//! (mapped, compatible, NAT64, 6to4) are judged by the address they carry,
//! since that is where the packets end up.
//!
//! Ranges: the IANA IPv4 and IPv6 Special-Purpose Address Registries
//! (RFC 6890 and its updates).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

/// Why an address is not a public unicast destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AddressClass {
    /// 127.0.0.0/8, ::1: the host's own services.
    Loopback,
    /// 0.0.0.0, ::: Linux connects these to the local host.
    Unspecified,
    /// 10/8, 172.16/12, 192.168/16, fc00::/7 (and deprecated site-local fec0::/10).
    Private,
    /// 169.254/16, fe80::/10.
    LinkLocal,
    /// Cloud instance metadata services: 169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200. Checked before the range they sit in, so the event
    /// says what was really at stake.
    Metadata,
    /// 100.64/10, carrier-grade NAT: a provider's internal network.
    SharedAddressSpace,
    /// 224/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18/15, 2001:2::/48.
    Benchmarking,
    /// Everything else that is not global unicast: 0/8, 192.0.0/24,
    /// 192.88.99/24, 240/4, IPv6 outside 2000::/3, Teredo, ORCHID, ...
    Reserved,
}

impl AddressClass {
    /// A short phrase for messages ("a loopback address").
    pub fn describe(self) -> &'static str {
        match self {
            Self::Loopback => "a loopback address",
            Self::Unspecified => "the unspecified address",
            Self::Private => "a private address",
            Self::LinkLocal => "a link-local address",
            Self::Metadata => "a cloud metadata address",
            Self::SharedAddressSpace => "a carrier-grade NAT address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::Documentation => "a documentation address",
            Self::Benchmarking => "a benchmarking address",
            Self::Reserved => "a reserved address",
        }
    }
}

/// The class of `ip`, or `None` when it is a public unicast address.
pub fn classify(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let o = ip.octets();
    let class = match o {
        [169, 254, 169, 254] | [100, 100, 100, 200] => Metadata,
        [0, 0, 0, 0] => Unspecified,
        [255, 255, 255, 255] => Broadcast,
        // "This network": Linux treats 0.x.y.z as the local host.
        [0, ..] => Reserved,
        [127, ..] => Loopback,
        [10, ..] => Private,
        [172, b, ..] if b & 0xf0 == 16 => Private,
        [192, 168, ..] => Private,
        [169, 254, ..] => LinkLocal,
        [100, b, ..] if b & 0xc0 == 64 => SharedAddressSpace,
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => Documentation,
        [198, 18 | 19, ..] => Benchmarking,
        // IETF protocol assignments (incl. 192.0.0.192, a metadata address
        // on some clouds) and the deprecated 6to4 relay anycast.
        [192, 0, 0, _] | [192, 88, 99, _] => Reserved,
        [a, ..] if a & 0xf0 == 224 => Multicast,
        [a, ..] if a & 0xf0 == 240 => Reserved,
        _ => return None,
    };
    Some(class)
}

fn classify_v6(ip: Ipv6Addr) -> Option<AddressClass> {
    use AddressClass::*;
    let s = ip.segments();
    if ip.is_unspecified() {
        return Some(Unspecified);
    }
    if ip.is_loopback() {
        return Some(Loopback);
    }
    // The embedded-IPv4 forms, judged by what they carry:
    // ::ffff:a.b.c.d (mapped), ::a.b.c.d (compatible, deprecated but still
    // routed by some stacks), 64:ff9b::a.b.c.d (NAT64, RFC 6052).
    if let Some(v4) = embedded_v4(ip) {
        return classify_v4(v4);
    }
    // 6to4 (RFC 3056): 2002:AABB:CCDD::/48 tunnels to the IPv4 AA.BB.CC.DD.
    // A public one is still refused if the relay would deliver to a private
    // address.
    if s[0] == 0x2002 {
        let [a, b] = s[1].to_be_bytes();
        let [c, d] = s[2].to_be_bytes();
        return classify_v4(Ipv4Addr::new(a, b, c, d));
    }
    if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        return Some(Metadata);
    }
    let class = match s[0] {
        0xfe80..=0xfebf => LinkLocal,
        // Site-local (fec0::/10) is deprecated (RFC 3879) but still means
        // "this site's network" where it is used.
        0xfec0..=0xfeff => Private,
        0xfc00..=0xfdff => Private,
        0xff00..=0xffff => Multicast,
        0x2001 if s[1] == 0x0db8 => Documentation,
        0x2001 if s[1] == 0x0002 && s[2] == 0 => Benchmarking,
        // Teredo (2001::/32) hides an obfuscated IPv4 client address; the
        // rest of 2001::/23 is IETF protocol assignments (ORCHID, ...).
        0x2001 if s[1] < 0x0200 => Reserved,
        0x3fff if s[1] < 0x1000 => Documentation,
        // Outside 2000::/3 nothing is global unicast (100::/64 discard,
        // 64:ff9b:1::/48 local-use NAT64, unassigned space).
        a if a & 0xe000 != 0x2000 => Reserved,
        _ => return None,
    };
    Some(class)
}

/// The IPv4 address inside a mapped, compatible or NAT64 IPv6 address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let tail = || {
        let [a, b] = s[6].to_be_bytes();
        let [c, d] = s[7].to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0, 0, _, _] => Some(tail()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail()),
        _ => None,
    }
}

#[cfg(test)]
#[path = "addr_tests.rs"]
mod tests;
