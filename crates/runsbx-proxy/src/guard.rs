//! The destination check: allowlist, resolution, address classes.
//!
//! The order matters. The allowlist is checked on the name first, so a
//! refused name is never even resolved (no DNS lookups on the sandbox's
//! behalf for names it may not reach). Then the proxy resolves the name
//! itself and judges *every* address: one private address among public ones
//! is enough to refuse, since a resolver may return them in any order. The
//! addresses it judged are the ones it connects to; it never resolves again,
//! so a DNS answer cannot change between check and use (rebinding).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::addr::classify;
use crate::allowlist::Allowlist;
use crate::events::DenyReason;
use crate::host::Host;

/// What the guard needs to know, fixed for the proxy's life.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub allow: Allowlist,
    /// Resolver override: lower-case names without trailing dot.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// Destinations exempt from the address-class check (canonical IPs).
    pub exempt: Vec<SocketAddr>,
    pub resolve_timeout: Duration,
}

impl Guard {
    /// The addresses to connect to for `host:port`, or why not.
    pub async fn check(&self, host: &Host, port: u16) -> Result<Vec<SocketAddr>, DenyReason> {
        let name = match host {
            Host::Ip(ip) => {
                // An IP on the allowlist was chosen by the operator, address
                // class and all; any other IP literal is refused unresolved.
                return if self.allow.allows(host, port) {
                    Ok(vec![SocketAddr::new(ip.to_canonical(), port)])
                } else {
                    Err(DenyReason::IpLiteral)
                };
            }
            Host::Name(name) => name,
        };
        if !self.allow.allows(host, port) {
            return Err(DenyReason::NotAllowed);
        }
        let ips = self.resolve(name, port).await?;
        self.judge(&ips, port)
    }

    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<IpAddr>, DenyReason> {
        if let Some(ips) = self.hosts.get(name) {
            return Ok(ips.clone());
        }
        let lookup = tokio::net::lookup_host((name, port));
        match tokio::time::timeout(self.resolve_timeout, lookup).await {
            Ok(Ok(addrs)) => Ok(addrs.map(|a| a.ip()).collect()),
            Ok(Err(e)) => {
                tracing::debug!(name, error = %e, "egress proxy: resolve failed");
                Err(DenyReason::ResolveFailed)
            }
            Err(_) => {
                tracing::debug!(name, "egress proxy: resolve timed out");
                Err(DenyReason::ResolveFailed)
            }
        }
    }

    /// Refuse if any address is not public (unless exempt); otherwise the
    /// distinct addresses, in the resolver's order.
    pub fn judge(&self, ips: &[IpAddr], port: u16) -> Result<Vec<SocketAddr>, DenyReason> {
        if ips.is_empty() {
            return Err(DenyReason::ResolveFailed);
        }
        let mut out: Vec<SocketAddr> = Vec::with_capacity(ips.len());
        for ip in ips {
            let dest = SocketAddr::new(ip.to_canonical(), port);
            if !self.exempt.contains(&dest) {
                if let Some(class) = classify(*ip) {
                    return Err(DenyReason::AddressClass { class, addr: *ip });
                }
            }
            if !out.contains(&dest) {
                out.push(dest);
            }
        }
        Ok(out)
    }
}

/// The sentence a refused client reads (and the event records). `host` is
/// already printable.
pub(crate) fn deny_message(reason: &DenyReason, host: &str, port: u16, detail: &str) -> String {
    let dest = format!("{host}:{port}");
    match reason {
        DenyReason::NotAllowed => {
            format!("runsbx: egress to {dest} is blocked by policy (not on the allowlist); do not retry")
        }
        DenyReason::IpLiteral => format!(
            "runsbx: egress to {dest} is blocked by policy (an IP address, not an allowed host name); do not retry"
        ),
        DenyReason::AddressClass { class, addr } => format!(
            "runsbx: egress to {dest} is blocked by policy ({host} resolves to {addr}, {}); do not retry",
            class.describe()
        ),
        DenyReason::ResolveFailed => {
            format!("runsbx: egress to {dest} failed: the proxy could not resolve {host}")
        }
        DenyReason::BadRequest => format!(
            "runsbx: bad proxy request ({detail}); send CONNECT host:port or an absolute http:// URL"
        ),
        DenyReason::LimitReached => format!("runsbx: egress limit reached ({detail})"),
        DenyReason::SecretMisdirected { .. } => {
            format!("runsbx: egress to {dest} is blocked by policy ({detail}); do not retry")
        }
        DenyReason::RequestNotAllowed { rules } => format!(
            "runsbx: egress to {dest} is blocked by policy ({detail}; the allowlist lets through \
             only {} there); do not retry",
            rules.join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::addr::AddressClass;

    fn guard(allow: &[&str], exempt: &[&str]) -> Guard {
        Guard {
            allow: Allowlist::parse(allow).unwrap(),
            hosts: HashMap::from([
                (
                    "mixed.test".to_owned(),
                    vec!["8.8.8.8".parse().unwrap(), "10.0.0.1".parse().unwrap()],
                ),
                (
                    "public.test".to_owned(),
                    vec!["8.8.8.8".parse().unwrap(), "8.8.8.8".parse().unwrap()],
                ),
                (
                    "mapped.test".to_owned(),
                    vec!["::ffff:127.0.0.1".parse().unwrap()],
                ),
                ("none.test".to_owned(), vec![]),
            ]),
            exempt: exempt.iter().map(|s| s.parse().unwrap()).collect(),
            resolve_timeout: Duration::from_secs(5),
        }
    }

    fn check(g: &Guard, host: Host, port: u16) -> Result<Vec<SocketAddr>, DenyReason> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(g.check(&host, port))
    }

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    #[test]
    fn allowlist_before_anything_else() {
        let g = guard(&["public.test"], &[]);
        assert_eq!(
            check(&g, name("other.test"), 443),
            Err(DenyReason::NotAllowed)
        );
        assert_eq!(
            check(&g, name("public.test"), 22),
            Err(DenyReason::NotAllowed)
        );
        assert_eq!(
            check(&g, name("public.test"), 443),
            Ok(vec!["8.8.8.8:443".parse().unwrap()])
        );
    }

    #[test]
    fn one_private_address_refuses_all() {
        let g = guard(&["mixed.test", "mapped.test", "none.test"], &[]);
        assert_eq!(
            check(&g, name("mixed.test"), 443),
            Err(DenyReason::AddressClass {
                class: AddressClass::Private,
                addr: "10.0.0.1".parse().unwrap()
            })
        );
        let err = check(&g, name("mapped.test"), 443).unwrap_err();
        assert!(matches!(
            err,
            DenyReason::AddressClass {
                class: AddressClass::Loopback,
                ..
            }
        ));
        assert_eq!(
            check(&g, name("none.test"), 443),
            Err(DenyReason::ResolveFailed)
        );
    }

    #[test]
    fn exemptions_are_exact() {
        let g = guard(
            &["mapped.test:8080", "mapped.test:8081"],
            &["127.0.0.1:8080"],
        );
        assert_eq!(
            check(&g, name("mapped.test"), 8080),
            Ok(vec!["127.0.0.1:8080".parse().unwrap()])
        );
        assert!(check(&g, name("mapped.test"), 8081).is_err());
    }

    #[test]
    fn ip_literals_only_when_listed() {
        let g = guard(&["127.0.0.1:9"], &["127.0.0.1:443"]);
        let lo = Host::Ip("127.0.0.1".parse().unwrap());
        assert_eq!(
            check(&g, lo.clone(), 9),
            Ok(vec!["127.0.0.1:9".parse().unwrap()])
        );
        // allow_addresses alone does not make an IP literal acceptable.
        assert_eq!(check(&g, lo, 443), Err(DenyReason::IpLiteral));
        let mapped = Host::Ip("::ffff:127.0.0.1".parse().unwrap());
        assert_eq!(
            check(&g, mapped, 9),
            Ok(vec!["127.0.0.1:9".parse().unwrap()])
        );
    }

    #[test]
    fn messages_name_the_destination_and_the_cause() {
        let m = deny_message(&DenyReason::NotAllowed, "example.com", 443, "");
        assert_eq!(
            m,
            "runsbx: egress to example.com:443 is blocked by policy (not on the allowlist); do not retry"
        );
        let m = deny_message(
            &DenyReason::AddressClass {
                class: AddressClass::Metadata,
                addr: "169.254.169.254".parse().unwrap(),
            },
            "meta.test",
            80,
            "",
        );
        assert!(
            m.contains("meta.test resolves to 169.254.169.254, a cloud metadata address"),
            "{m}"
        );
    }
}
