//! The egress allowlist: which `host:port` destinations a sandbox may ask for.
//!
//! Entries: `name`, `name:port`, `*.suffix`, `*.suffix:port`, an IP address
//! (`1.2.3.4`, `[2001:db8::1]:443`). Names compare case-insensitively and
//! without a trailing dot. `*.example.com` matches every name below
//! example.com but not example.com itself: allowing a whole zone and allowing
//! its apex are two decisions. An entry without a port allows 80 and 443
//! only, the two ports HTTP and HTTPS use: any other port must be named.
//! An empty allowlist allows nothing.
//!
//! An entry may also name methods and a path glob (`GET,HEAD
//! github.com/org/**`, see `runsbx_policy::request_rule`): then it lets
//! through only those requests. A host some entry allows whole is open;
//! a host only such entries allow is open to their requests alone.

use std::net::IpAddr;

use runsbx_policy::request_rule::{Entry, RequestRule};
use thiserror::Error;

use crate::host::{parse_host, split_authority, Host};

/// A parsed allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    pattern: Pattern,
    /// `None`: the web ports, 80 and 443.
    port: Option<u16>,
    /// `None`: every request; else only the requests it allows.
    request: Option<RequestRule>,
}

/// What the allowlist lets through to one `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access<'a> {
    /// Nothing: no entry names it.
    Closed,
    /// Every request: an entry allows the destination whole.
    Open,
    /// Only the requests one of these rules allows.
    Requests(Vec<&'a RequestRule>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Exact(String),
    /// Held with its leading dot: `.example.com`.
    Below(String),
    Ip(IpAddr),
}

/// An allowlist entry that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("allowlist entry \"{entry}\": {reason}")]
pub struct AllowlistError {
    pub entry: String,
    pub reason: String,
}

const WEB_PORTS: [u16; 2] = [80, 443];

impl Allowlist {
    /// Parse every entry; the first bad one is the error.
    pub fn parse<I, S>(entries: I) -> Result<Self, AllowlistError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let rules = entries
            .into_iter()
            .map(|entry| {
                let entry = entry.as_ref();
                parse_rule(entry).map_err(|reason| AllowlistError {
                    entry: entry.to_owned(),
                    reason,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether some entry names `host:port` (whole or for some requests).
    /// An IP host matches only an IP entry for the same address.
    pub fn allows(&self, host: &Host, port: u16) -> bool {
        self.rules.iter().any(|rule| rule.names(host, port))
    }

    /// What the entries naming `host:port` let through.
    pub fn access(&self, host: &Host, port: u16) -> Access<'_> {
        let mut requests = Vec::new();
        for rule in self.rules.iter().filter(|rule| rule.names(host, port)) {
            match &rule.request {
                None => return Access::Open,
                Some(request) => requests.push(request),
            }
        }
        if requests.is_empty() {
            Access::Closed
        } else {
            Access::Requests(requests)
        }
    }
}

impl Rule {
    fn names(&self, host: &Host, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => WEB_PORTS.contains(&port),
        };
        port_ok
            && match (&self.pattern, host) {
                (Pattern::Exact(want), Host::Name(name)) => want == name,
                (Pattern::Below(suffix), Host::Name(name)) => name.ends_with(suffix.as_str()),
                (Pattern::Ip(want), Host::Ip(ip)) => *want == ip.to_canonical(),
                _ => false,
            }
    }
}

fn parse_rule(entry: &str) -> Result<Rule, String> {
    if entry.trim().is_empty() {
        return Err("empty entry".into());
    }
    let Entry {
        authority,
        rule: request,
    } = Entry::parse(entry)?;
    if authority.is_empty() {
        return Err("no host: write `METHODS HOST[:PORT]/PATH`".into());
    }
    Ok(Rule {
        request,
        ..parse_destination(authority)?
    })
}

fn parse_destination(entry: &str) -> Result<Rule, String> {
    let (raw_host, bracketed, port) = split_authority(entry).map_err(|e| e.to_string())?;
    if let Some(below) = raw_host.strip_prefix("*.") {
        if below.contains('*') {
            return Err("`*` may only stand as the whole first label".into());
        }
        return match parse_host(below, false).map_err(|e| e.to_string())? {
            Host::Name(name) => Ok(Rule {
                pattern: Pattern::Below(format!(".{name}")),
                port,
                request: None,
            }),
            Host::Ip(_) => Err("a wildcard cannot stand over an IP address".into()),
        };
    }
    if raw_host.contains('*') {
        return Err(if raw_host == "*" {
            "`*` alone would allow every host: name the hosts".into()
        } else {
            "`*` may only stand as the whole first label, as in `*.example.com`".into()
        });
    }
    match parse_host(raw_host, bracketed).map_err(|e| e.to_string())? {
        Host::Name(name) => Ok(Rule {
            pattern: Pattern::Exact(name),
            port,
            request: None,
        }),
        Host::Ip(ip) => {
            // `2130706433` in an allowlist is far more likely a mistake than
            // a wish to reach 127.0.0.1: only the usual spelling is taken.
            if raw_host.parse::<IpAddr>().is_err() {
                return Err(format!("write the IP address as {ip}"));
            }
            Ok(Rule {
                pattern: Pattern::Ip(ip.to_canonical()),
                port,
                request: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn list(entries: &[&str]) -> Allowlist {
        Allowlist::parse(entries).unwrap()
    }

    fn allows(list: &Allowlist, host: &str, port: u16) -> bool {
        let (raw, bracketed, _) = split_authority(host).unwrap();
        list.allows(&parse_host(raw, bracketed).unwrap(), port)
    }

    #[test]
    fn names_without_port_allow_web_ports_only() {
        let l = list(&["example.com"]);
        assert!(allows(&l, "example.com", 443));
        assert!(allows(&l, "example.com", 80));
        assert!(!allows(&l, "example.com", 22));
        assert!(!allows(&l, "example.com", 8443));
        assert!(!allows(&l, "www.example.com", 443));
        assert!(!allows(&l, "example.org", 443));
        assert!(!allows(&l, "badexample.com", 443));
    }

    #[test]
    fn ports_are_exact() {
        let l = list(&["example.com:8443"]);
        assert!(allows(&l, "example.com", 8443));
        assert!(!allows(&l, "example.com", 443));
        assert!(!allows(&l, "example.com", 80));
    }

    #[test]
    fn case_and_trailing_dot_are_ignored() {
        let l = list(&["API.Example.COM."]);
        assert!(allows(&l, "api.example.com", 443));
        assert!(allows(&l, "Api.Example.Com.", 443));
    }

    #[test]
    fn wildcards_match_subdomains_not_the_apex() {
        let l = list(&["*.example.com"]);
        assert!(allows(&l, "a.example.com", 443));
        assert!(allows(&l, "a.b.example.com", 80));
        assert!(allows(&l, "A.EXAMPLE.COM.", 443));
        assert!(!allows(&l, "example.com", 443));
        assert!(!allows(&l, "badexample.com", 443));
        assert!(!allows(&l, "example.com.evil.net", 443));
        assert!(!allows(&l, "a.example.com", 22));
        let l = list(&["*.example.com:8080"]);
        assert!(allows(&l, "a.example.com", 8080));
        assert!(!allows(&l, "a.example.com", 443));
    }

    #[test]
    fn ip_entries_match_only_that_ip() {
        let l = list(&["93.184.215.14:8443", "[2001:4860::1]", "1.1.1.1"]);
        assert!(allows(&l, "93.184.215.14", 8443));
        assert!(allows(&l, "[::ffff:93.184.215.14]", 8443));
        assert!(!allows(&l, "93.184.215.14", 443));
        assert!(allows(&l, "[2001:4860::1]", 443));
        assert!(allows(&l, "1.1.1.1", 80));
        assert!(!allows(&l, "1.0.0.1", 80));
        // A name is never matched by an IP entry, nor an IP by a name entry.
        let l = list(&["1.1.1.1", "one.one"]);
        assert!(!allows(&l, "one.one.one.one", 443));
        // Another spelling of an allowed address is that address.
        assert!(allows(&l, "0x01010101", 443));
    }

    #[test]
    fn a_whole_host_entry_opens_what_request_rules_narrow() {
        let host = |h: &str| h.parse::<Host>().unwrap();
        let l = list(&["GET,HEAD example.com/org/**", "POST *.example.com/upload"]);
        let access = l.access(&host("example.com"), 443);
        let rules = match &access {
            Access::Requests(rules) => rules.iter().map(ToString::to_string).collect(),
            _ => Vec::new(),
        };
        assert_eq!(rules, ["GET,HEAD /org/**"], "{access:?}");
        assert!(
            matches!(l.access(&host("a.example.com"), 80), Access::Requests(r) if r.len() == 1)
        );
        assert_eq!(l.access(&host("example.org"), 443), Access::Closed);
        assert_eq!(l.access(&host("example.com"), 22), Access::Closed);
        assert!(allows(&l, "example.com", 443));
        let l = list(&["GET example.com/x", "example.com"]);
        assert_eq!(l.access(&host("example.com"), 443), Access::Open);
    }

    #[test]
    fn empty_allows_nothing() {
        let l = Allowlist::default();
        assert!(l.is_empty());
        assert!(!allows(&l, "example.com", 443));
    }

    #[test]
    fn bad_entries_say_why() {
        for (entry, needle) in [
            ("", "empty"),
            ("*", "every host"),
            ("a.*.com", "first label"),
            ("*.*.com", "first label"),
            ("*.1.2.3.4", "IP address"),
            ("example.com:0", "port"),
            ("example.com:http", "port"),
            ("exa mple.com", "character"),
            ("get example.com/x", "character"),
            ("GET;POST example.com/x", "character"),
            ("bad host!", "character"),
            ("GET /x", "no host"),
            ("GET *.example.com:0/x", "port"),
            ("GET example.com/a[b]", "wildcards"),
            ("2130706433", "127.0.0.1"),
            ("[example.com]", "IPv6"),
            ("example.123", "numeric"),
        ] {
            let err = Allowlist::parse([entry]).unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("allowlist entry \"{entry}\": ")),
                "{text}"
            );
            assert!(text.contains(needle), "{entry}: {text}");
        }
    }
}
