//! Credentials the sandbox never sees. A secret's value stays in the
//! proxy; the sandbox gets a sentinel (a random token) that it may put in
//! a request where the credential should go. In a request the proxy can
//! read (plain HTTP, or a tunnel it inspects) to the secret's host, the
//! sentinel in the secret's header is replaced by the value; a sentinel
//! anywhere else (another host, another header, the path) is refused and
//! reported, since that is the credential going where it should not.
//!
//! A sandbox with secrets has every tunnel inspected (server.rs), so that
//! no sentinel leaves unseen. What no proxy can prevent: an upstream that
//! echoes the credential in its response hands it to the sandbox.

use std::fmt;

use crate::events::DenyReason;
use crate::host::Host;

/// One secret: where its value may go, and the sentinel that stands for it.
#[derive(Clone)]
pub struct Secret {
    /// The name the caller gave (`RUNSBX_SECRET_<NAME>` in the sandbox).
    pub name: String,
    /// What the sandbox sees in place of the value.
    pub sentinel: String,
    /// The credential. Never logged, never in an event (see `Debug`).
    pub value: String,
    pub host: Host,
    /// `None`: 80 and 443, as an allowlist entry without a port.
    pub port: Option<u16>,
    /// The header the value goes in (`Authorization` by default).
    pub header: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl Secret {
    /// Whether the secret is for `host:port`.
    pub fn is_for(&self, host: &Host, port: u16) -> bool {
        self.host == *host
            && match self.port {
                Some(p) => p == port,
                None => port == 80 || port == 443,
            }
    }
}

/// Puts each secret of `host:port` in place of its sentinel in its header,
/// or refuses the request, naming the secret, when a sentinel is anywhere
/// else in it: in `target` (path and query), in another header, or in a
/// request to another host.
pub(crate) fn apply(
    secrets: &[Secret],
    host: &Host,
    port: u16,
    target: &str,
    headers: &mut [(String, Vec<u8>)],
) -> Result<(), (DenyReason, String)> {
    for secret in secrets {
        let refuse = || {
            let detail = format!(
                "the sentinel of secret {} goes only in the {} header of requests to {}",
                secret.name,
                secret.header,
                destination(secret)
            );
            Err((
                DenyReason::SecretMisdirected {
                    secret: secret.name.clone(),
                },
                detail,
            ))
        };
        if contains(target.as_bytes(), secret.sentinel.as_bytes()) {
            return refuse();
        }
        for (name, value) in headers.iter_mut() {
            if !contains(value, secret.sentinel.as_bytes()) {
                continue;
            }
            if !secret.is_for(host, port) || !name.eq_ignore_ascii_case(&secret.header) {
                return refuse();
            }
            *value = replace(value, secret.sentinel.as_bytes(), secret.value.as_bytes());
        }
    }
    Ok(())
}

fn destination(secret: &Secret) -> String {
    match secret.port {
        Some(port) => format!("{}:{port}", secret.host),
        None => secret.host.to_string(),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len() + with.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn secret() -> Secret {
        Secret {
            name: "GH".into(),
            sentinel: "runsbx-secret-GH-0123abcd".into(),
            value: "ghp_real".into(),
            host: "api.example.com".parse().unwrap(),
            port: None,
            header: "Authorization".into(),
        }
    }

    type Headers = Vec<(String, Vec<u8>)>;

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn the_sentinel_becomes_the_value_in_its_header_to_its_host() {
        let host: Host = "api.example.com".parse().unwrap();
        let mut h = headers(&[
            ("authorization", "Bearer runsbx-secret-GH-0123abcd"),
            ("Accept", "*/*"),
        ]);
        apply(&[secret()], &host, 443, "/user", &mut h).unwrap();
        assert_eq!(h[0].1, b"Bearer ghp_real");
        assert_eq!(h[1].1, b"*/*");
    }

    #[test]
    fn the_sentinel_anywhere_else_is_refused() {
        let other: Host = "evil.example.net".parse().unwrap();
        let host: Host = "api.example.com".parse().unwrap();
        let cases: Vec<(&Host, u16, &str, Headers)> = vec![
            (
                &other,
                443,
                "/",
                headers(&[("Authorization", "runsbx-secret-GH-0123abcd")]),
            ),
            (
                &host,
                8443,
                "/",
                headers(&[("Authorization", "runsbx-secret-GH-0123abcd")]),
            ),
            (
                &host,
                443,
                "/",
                headers(&[("X-Leak", "runsbx-secret-GH-0123abcd")]),
            ),
            (&host, 443, "/?t=runsbx-secret-GH-0123abcd", headers(&[])),
        ];
        for (h, port, target, mut hs) in cases {
            let (reason, detail) = apply(&[secret()], h, port, target, &mut hs).unwrap_err();
            assert_eq!(
                reason,
                DenyReason::SecretMisdirected {
                    secret: "GH".into()
                }
            );
            assert!(
                detail.contains("Authorization header of requests to api.example.com"),
                "{detail}"
            );
            // Nothing was replaced on the way to the refusal.
            assert!(hs.iter().all(|(_, v)| !contains(v, b"ghp_real")));
        }
    }

    #[test]
    fn a_request_without_sentinels_is_left_as_it_is() {
        let other: Host = "evil.example.net".parse().unwrap();
        let mut h = headers(&[("Authorization", "Bearer mine")]);
        apply(&[secret()], &other, 443, "/", &mut h).unwrap();
        assert_eq!(h[0].1, b"Bearer mine");
    }

    #[test]
    fn debug_never_shows_the_value_or_the_sentinel() {
        let text = format!("{:?}", secret());
        assert!(
            !text.contains("ghp_real") && !text.contains("0123abcd"),
            "{text}"
        );
    }
}
