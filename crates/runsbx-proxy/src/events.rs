//! Deny events and counters: what the call result reports about egress.
//!
//! The sink is bounded (a sandbox can provoke refusals in a loop): the first
//! `max_events` are kept, the rest are only counted. The first ones are the
//! ones that explain what the code tried.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::addr::AddressClass;

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "code", rename_all = "snake_case")]
pub enum DenyReason {
    /// The host (or port) is not on the allowlist.
    NotAllowed,
    /// The host is an IP address (in any spelling) that is not on the
    /// allowlist as such.
    IpLiteral,
    /// The name resolved to an address that is not public.
    AddressClass { class: AddressClass, addr: IpAddr },
    /// The name did not resolve (or not in time).
    ResolveFailed,
    /// Not a proxy request the proxy understands.
    BadRequest,
    /// A limit: too many connections, or a connection's byte budget.
    LimitReached,
    /// The destination is allowed for some requests only (method and path
    /// rules, listed as written), and this one is none of them, or cannot
    /// be read to be checked.
    RequestNotAllowed { rules: Vec<String> },
    /// A secret's sentinel was sent where its value may not go: another
    /// host, another header, a path.
    SecretMisdirected { secret: String },
}

impl DenyReason {
    /// The code in the `X-Runsbx-Deny` header and in the event.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotAllowed => "not_allowed",
            Self::IpLiteral => "ip_literal",
            Self::AddressClass { .. } => "address_class",
            Self::ResolveFailed => "resolve_failed",
            Self::BadRequest => "bad_request",
            Self::LimitReached => "limit_reached",
            Self::RequestNotAllowed { .. } => "request_not_allowed",
            Self::SecretMisdirected { .. } => "secret_misdirected",
        }
    }
}

/// One refusal, as the call result reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DenyEvent {
    /// When, serialised as RFC 3339.
    pub time: DateTime<Utc>,
    /// The sandbox-side peer (an address on the sandbox's own loopback).
    pub client: SocketAddr,
    /// `CONNECT`, `GET`, ...; empty when no request was read.
    pub method: String,
    /// The host as asked for (printable ASCII, at most 255 characters);
    /// empty when none was read.
    pub host: String,
    /// 0 when none was read.
    pub port: u16,
    /// The request's target (path and query) when the proxy read one
    /// (forwarded plain HTTP); empty for a tunnel.
    pub path: String,
    pub reason: DenyReason,
    /// The sentence the client was sent.
    pub message: String,
}

/// What learn mode saw go out: one destination and, when the proxy read
/// the request, its method and path, with how often.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LearnedRequest {
    /// `GET`, `POST`, ...; `CONNECT` for a tunnel whose requests the proxy
    /// did not read.
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The request's path as the rules match it (unreserved escapes
    /// undone, without the query); `None` for an unread tunnel.
    pub path: Option<String>,
    /// Whether it came through a TLS tunnel the proxy inspected.
    pub tls: bool,
    pub count: u64,
}

/// What learn mode saw, as the call result reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Learned {
    /// Each distinct request, sorted by host, port, path, method.
    pub requests: Vec<LearnedRequest>,
    /// Distinct requests beyond the bound, counted only.
    pub dropped: u64,
}

/// The key of a learned request: host, port, path, method, tls.
type LearnKey = (String, u16, Option<String>, String, bool);

/// Counters, as the call result reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProxyStats {
    /// Connections accepted, including those refused at the limit.
    pub connections: u64,
    /// Connections being served now.
    pub active: u64,
    /// Refusals, including those not kept as events (and the refusals at
    /// the connection limit, one event per burst).
    pub denied: u64,
    /// Upstreams that could not be reached (answered 502).
    pub upstream_errors: u64,
    /// Bytes from the sandbox to upstreams (request heads as rewritten).
    pub bytes_up: u64,
    /// Bytes from upstreams to the sandbox.
    pub bytes_down: u64,
}

/// Shared between the serving thread and the handle.
#[derive(Debug)]
pub(crate) struct Shared {
    max_events: usize,
    events: Mutex<Vec<DenyEvent>>,
    /// In learn mode, the requests let through (at most `max_events`
    /// distinct ones); `None` otherwise.
    learned: Option<Mutex<BTreeMap<LearnKey, u64>>>,
    learn_dropped: AtomicU64,
    pub dropped: AtomicU64,
    pub connections: AtomicU64,
    pub active: AtomicU64,
    pub denied: AtomicU64,
    pub upstream_errors: AtomicU64,
    pub bytes_up: AtomicU64,
    pub bytes_down: AtomicU64,
}

impl Shared {
    pub fn new(max_events: usize, learn: bool) -> Self {
        Self {
            max_events,
            events: Mutex::new(Vec::new()),
            learned: learn.then(|| Mutex::new(BTreeMap::new())),
            learn_dropped: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            active: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        }
    }

    /// Log the event and keep it if there is room.
    pub fn record(&self, event: DenyEvent) {
        tracing::info!(
            client = %event.client,
            method = %event.method,
            host = %event.host,
            port = event.port,
            path = %event.path,
            reason = event.reason.code(),
            "egress denied: {}",
            event.message
        );
        self.denied.fetch_add(1, Ordering::Relaxed);
        // A panic while holding the lock cannot leave the Vec half-pushed.
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if events.len() < self.max_events {
            events.push(event);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// In learn mode, counts a request the proxy let through: `path` is
    /// `None` for a tunnel it does not read.
    pub fn learn(&self, method: &str, host: &str, port: u16, path: Option<&str>, tls: bool) {
        let Some(learned) = &self.learned else {
            return;
        };
        let mut learned = learned.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (
            host.to_owned(),
            port,
            path.map(str::to_owned),
            method.to_owned(),
            tls,
        );
        if let Some(count) = learned.get_mut(&key) {
            *count += 1;
        } else if learned.len() < self.max_events {
            tracing::info!(method, host, port, path, "egress learned");
            learned.insert(key, 1);
        } else {
            self.learn_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What learn mode saw; `None` when not learning.
    pub fn learned(&self) -> Option<Learned> {
        let learned = self
            .learned
            .as_ref()?
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let requests = learned
            .iter()
            .map(|((host, port, path, method, tls), count)| LearnedRequest {
                method: method.clone(),
                host: host.clone(),
                port: *port,
                path: path.clone(),
                tls: *tls,
                count: *count,
            })
            .collect();
        Some(Learned {
            requests,
            dropped: self.learn_dropped.load(Ordering::Relaxed),
        })
    }

    pub fn events(&self) -> Vec<DenyEvent> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn stats(&self) -> ProxyStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProxyStats {
            connections: get(&self.connections),
            active: get(&self.active),
            denied: get(&self.denied),
            upstream_errors: get(&self.upstream_errors),
            bytes_up: get(&self.bytes_up),
            bytes_down: get(&self.bytes_down),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(reason: DenyReason) -> DenyEvent {
        DenyEvent {
            time: Utc::now(),
            client: "127.0.0.1:40000".parse().unwrap(),
            method: "CONNECT".into(),
            host: "example.com".into(),
            port: 443,
            path: String::new(),
            reason,
            message: "m".into(),
        }
    }

    #[test]
    fn keeps_the_first_events_and_counts_the_rest() {
        let shared = Shared::new(3, false);
        for _ in 0..5 {
            shared.record(event(DenyReason::NotAllowed));
        }
        assert_eq!(shared.events().len(), 3);
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 2);
        assert_eq!(shared.stats().denied, 5);
    }

    #[test]
    fn learns_only_in_learn_mode() {
        let shared = Shared::new(3, false);
        shared.learn("GET", "a.test", 443, Some("/x"), true);
        assert_eq!(shared.learned(), None);
    }

    #[test]
    fn learned_requests_are_counted_once_each_and_bounded() {
        let shared = Shared::new(3, true);
        shared.learn("GET", "b.test", 443, Some("/x"), true);
        shared.learn("GET", "b.test", 443, Some("/x"), true);
        shared.learn("HEAD", "b.test", 443, Some("/x"), true);
        shared.learn("CONNECT", "a.test", 443, None, false);
        // A fourth distinct one is past the bound: counted only.
        shared.learn("GET", "c.test", 80, Some("/"), false);
        shared.learn("GET", "b.test", 443, Some("/x"), true);
        let learned = shared.learned().unwrap();
        assert_eq!(learned.dropped, 1);
        let seen: Vec<_> = learned
            .requests
            .iter()
            .map(|r| {
                (
                    r.method.as_str(),
                    r.host.as_str(),
                    r.path.as_deref(),
                    r.count,
                )
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("CONNECT", "a.test", None, 1),
                ("GET", "b.test", Some("/x"), 3),
                ("HEAD", "b.test", Some("/x"), 1),
            ]
        );
    }

    #[test]
    fn events_serialise_with_a_reason_code() {
        let e = event(DenyReason::AddressClass {
            class: AddressClass::Loopback,
            addr: "127.0.0.1".parse().unwrap(),
        });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["reason"]["code"], "address_class");
        assert_eq!(v["reason"]["class"], "loopback");
        assert_eq!(v["reason"]["addr"], "127.0.0.1");
        assert_eq!(v["client"], "127.0.0.1:40000");
        let time = v["time"].as_str().unwrap();
        assert!(DateTime::parse_from_rfc3339(time).is_ok(), "{time}");
        let v = serde_json::to_value(event(DenyReason::NotAllowed)).unwrap();
        assert_eq!(v["reason"], serde_json::json!({"code": "not_allowed"}));
        let rules = vec!["GET,HEAD /org/**".to_owned()];
        let v = serde_json::to_value(event(DenyReason::RequestNotAllowed { rules })).unwrap();
        assert_eq!(
            v["reason"],
            serde_json::json!({"code": "request_not_allowed", "rules": ["GET,HEAD /org/**"]})
        );
        assert_eq!(v["path"], "");
    }
}
