//! Host names and IP literals, as requests and allowlist entries spell them.
//!
//! The system resolver (glibc `getaddrinfo`, via `inet_aton`) reads
//! `2130706433`, `0x7f000001`, `017700000001` and `127.1` as 127.0.0.1. A proxy
//! that checked such a host as a *name* and then handed it to the resolver
//! would connect to the host's loopback. So every spelling `inet_aton` (and
//! the WHATWG URL standard) accepts is parsed here as the IP it is, and a host
//! that merely looks numeric but is no valid address is refused outright: it
//! never reaches a resolver.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

/// A checked host: a DNS name (lower case, no trailing dot) or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Name(name) => f.write_str(name),
            Self::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Self::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

impl std::str::FromStr for Host {
    type Err = HostError;

    /// A host without port: a name, an IP in any `inet_aton` spelling, or
    /// an IPv6 address with or without brackets.
    fn from_str(s: &str) -> Result<Self, HostError> {
        match s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            Some(inner) => parse_host(inner, true),
            None => parse_host(s, false),
        }
    }
}

/// Why a host or authority is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("`[...]` must hold an IPv6 address")]
    BadIpv6,
    #[error("IPv6 zone identifiers are not accepted")]
    Zone,
    #[error("a numeric host that is no valid IPv4 address")]
    NumericNotIp,
    #[error("host name longer than 253 characters")]
    TooLong,
    #[error("host name label is empty or longer than 63 characters")]
    BadLabel,
    #[error("host name holds a character other than a-z, 0-9, `-`, `_` and `.`")]
    BadChar,
    #[error("port must be a number from 1 to 65535")]
    BadPort,
}

/// Split `host[:port]` or `[v6][:port]`. The host part is returned without
/// brackets, with a flag telling whether it had them.
pub(crate) fn split_authority(s: &str) -> Result<(&str, bool, Option<u16>), HostError> {
    if let Some(rest) = s.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or(HostError::BadIpv6)?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(
                after.strip_prefix(':').ok_or(HostError::BadPort)?,
            )?),
        };
        return Ok((inner, true, port));
    }
    match s.matches(':').count() {
        0 => Ok((s, false, None)),
        // A bare IPv6 address: it cannot carry a port without brackets.
        2.. => Ok((s, false, None)),
        _ => {
            let (host, port) = s.split_once(':').ok_or(HostError::BadPort)?;
            Ok((host, false, Some(parse_port(port)?)))
        }
    }
}

pub(crate) fn parse_port(s: &str) -> Result<u16, HostError> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::BadPort);
    }
    match s.parse::<u16>() {
        Ok(0) | Err(_) => Err(HostError::BadPort),
        Ok(port) => Ok(port),
    }
}

/// Parse a host (no port). `bracketed` says it came from `[...]`.
pub(crate) fn parse_host(raw: &str, bracketed: bool) -> Result<Host, HostError> {
    if bracketed || raw.contains(':') {
        if raw.contains('%') {
            return Err(HostError::Zone);
        }
        return raw
            .parse::<Ipv6Addr>()
            .map(|ip| Host::Ip(IpAddr::V6(ip)))
            .map_err(|_| HostError::BadIpv6);
    }
    // One trailing dot is the DNS root; "127.0.0.1." is still 127.0.0.1.
    let host = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if host.is_empty() {
        return Err(HostError::Empty);
    }
    if let Some(ip) = parse_ipv4_loose(&host) {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    // WHATWG URL: a host whose last label is a number is an IPv4 address or
    // an error. No top-level domain is numeric, so nothing real is lost.
    let last = host.rsplit('.').next().unwrap_or(&host);
    if looks_numeric(last) {
        return Err(HostError::NumericNotIp);
    }
    check_name(&host)?;
    Ok(Host::Name(host))
}

fn check_name(host: &str) -> Result<(), HostError> {
    if host.len() > 253 {
        return Err(HostError::TooLong);
    }
    for label in host.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(HostError::BadLabel);
        }
        let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_';
        if !label.bytes().all(ok) {
            return Err(HostError::BadChar);
        }
    }
    Ok(())
}

fn looks_numeric(label: &str) -> bool {
    if let Some(hex) = label.strip_prefix("0x") {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit())
}

/// IPv4 in every spelling `inet_aton` accepts: one to four parts, each
/// decimal, octal (leading 0) or hex (0x); the last part fills the bytes
/// that remain (`127.1` = 127.0.0.1, `2130706433` = 127.0.0.1).
pub(crate) fn parse_ipv4_loose(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        values.push(parse_part(part)?);
    }
    let (last, init) = values.split_last()?;
    let mut addr: u32 = 0;
    for (i, v) in init.iter().enumerate() {
        if *v > 255 {
            return None;
        }
        addr |= (*v as u32) << (24 - 8 * i);
    }
    // The last part covers the remaining 4 - init.len() bytes.
    let room = 8 * (4 - init.len() as u32);
    if room < 32 && *last >= 1u64 << room {
        return None;
    }
    if *last > u32::MAX as u64 {
        return None;
    }
    addr |= *last as u32;
    Some(Ipv4Addr::from(addr))
}

fn parse_part(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if part.is_empty() || !digits.bytes().all(|b| (b as char).is_digit(radix)) {
        return None;
    }
    // "0x" alone is 0 for inet_aton. Long runs of leading zeros are fine,
    // values that overflow are not addresses.
    let digits = digits.trim_start_matches('0');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn numeric_spellings_are_ip_literals() {
        for (raw, want) in [
            ("2130706433", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0X7F000001", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0x7f.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("127.0.0.1", "127.0.0.1"),
            ("127.0.0.1.", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("0.0.0.0", "0.0.0.0"),
            ("0x0", "0.0.0.0"),
            ("0x", "0.0.0.0"),
            ("127.0.0.0x", "127.0.0.0"),
            ("169.254.43518", "169.254.169.254"),
            ("0xa9fea9fe", "169.254.169.254"),
            ("10.0x10000", "10.1.0.0"),
            ("00000000000000000000127.1", "87.0.0.1"),
        ] {
            assert_eq!(parse_host(raw, false), Ok(ip(want)), "{raw}");
        }
    }

    #[test]
    fn ipv6_literals() {
        assert_eq!(parse_host("::1", true), Ok(ip("::1")));
        assert_eq!(parse_host("::", true), Ok(ip("::")));
        assert_eq!(
            parse_host("::ffff:127.0.0.1", true),
            Ok(ip("::ffff:127.0.0.1"))
        );
        assert_eq!(parse_host("::1", false), Ok(ip("::1")));
        assert_eq!(parse_host("fe80::1%25eth0", true), Err(HostError::Zone));
        assert_eq!(parse_host("example.com", true), Err(HostError::BadIpv6));
    }

    #[test]
    fn numeric_lookalikes_never_become_names() {
        for raw in [
            "4294967296",
            "256.0.0.1",
            "1.2.3.4.5",
            "127.0.0.09",
            "08",
            "1.2.3.999",
            "99999999999999999999999",
            "example.123",
            "example.0x1f",
        ] {
            assert!(parse_host(raw, false).is_err(), "{raw}");
        }
        // "1.2.3.4.5" has five parts: not inet_aton, still numeric.
        assert_eq!(parse_host("1.2.3.4.5", false), Err(HostError::NumericNotIp));
    }

    #[test]
    fn names_are_normalised() {
        let name = |s: &str| Ok(Host::Name(s.to_owned()));
        assert_eq!(parse_host("Example.COM", false), name("example.com"));
        assert_eq!(parse_host("example.com.", false), name("example.com"));
        assert_eq!(
            parse_host("123.example.com", false),
            name("123.example.com")
        );
        assert_eq!(parse_host("0x.example", false), name("0x.example"));
        // Not hex, so not a number: inet_aton refuses it too.
        assert_eq!(parse_host("0x1g", false), name("0x1g"));
        assert_eq!(parse_host("_srv.example", false), name("_srv.example"));
        assert_eq!(parse_host("", false), Err(HostError::Empty));
        assert_eq!(parse_host(".", false), Err(HostError::Empty));
        assert_eq!(parse_host("a..b", false), Err(HostError::BadLabel));
        assert_eq!(parse_host("a b", false), Err(HostError::BadChar));
        assert_eq!(parse_host("a%2eb", false), Err(HostError::BadChar));
        assert_eq!(parse_host("user@host", false), Err(HostError::BadChar));
        assert_eq!(parse_host(&"a".repeat(64), false), Err(HostError::BadLabel));
        let long = vec!["a".repeat(60); 5].join(".");
        assert_eq!(parse_host(&long, false), Err(HostError::TooLong));
    }

    #[test]
    fn from_str_takes_brackets_or_not() {
        assert_eq!("[::1]".parse(), Ok(ip("::1")));
        assert_eq!("::1".parse(), Ok(ip("::1")));
        assert_eq!("0x7f000001".parse(), Ok(ip("127.0.0.1")));
        assert_eq!("Example.com.".parse(), Ok(Host::Name("example.com".into())));
        assert_eq!("[example.com]".parse::<Host>(), Err(HostError::BadIpv6));
    }

    #[test]
    fn authorities() {
        assert_eq!(
            split_authority("example.com:443"),
            Ok(("example.com", false, Some(443)))
        );
        assert_eq!(
            split_authority("example.com"),
            Ok(("example.com", false, None))
        );
        assert_eq!(split_authority("[::1]:8080"), Ok(("::1", true, Some(8080))));
        assert_eq!(split_authority("[::1]"), Ok(("::1", true, None)));
        assert_eq!(
            split_authority("2001:db8::1"),
            Ok(("2001:db8::1", false, None))
        );
        for bad in [
            "a:", "a:0", "a:65536", "a:+1", "a:1x", "[::1]x", "[::1", "[::1]:",
        ] {
            assert!(split_authority(bad).is_err(), "{bad}");
        }
    }
}
