//! Method and path rules, against a real HTTP server on the host's
//! loopback (mapped and exempted as an operator would).
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use runsbx_proxy::{Allowlist, DenyReason, ProxyConfig};

/// The test server allowed for `rules` only (each `METHODS PATH`).
fn config_with(port: u16, rules: &[&str]) -> ProxyConfig {
    let entries: Vec<String> = rules
        .iter()
        .map(|r| {
            let (methods, path) = r.split_once(' ').unwrap();
            format!("{methods} allowed.test:{port}{path}")
        })
        .collect();
    ProxyConfig {
        allow: Allowlist::parse(&entries).unwrap(),
        ..config_for(port)
    }
}

fn get(p: &runsbx_proxy::ProxyHandle, method: &str, port: u16, target: &str) -> Response {
    request(
        p,
        &format!(
            "{method} http://allowed.test:{port}{target} HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
        ),
    )
}

#[test]
fn only_the_allowed_methods_and_paths_reach_the_server() {
    let server = http_server();
    let port = server.port();
    let p = proxy(config_with(
        port,
        &["GET,HEAD /org/**", "POST /org/*/git-upload-pack"],
    ));
    for (method, target) in [
        ("GET", "/org/repo/info/refs?service=git-upload-pack"),
        ("HEAD", "/org/x"),
        ("POST", "/org/repo/git-upload-pack"),
        ("GET", "/%6Frg/escaped"),
    ] {
        let r = get(&p, method, port, target);
        assert_eq!(r.status, 200, "{method} {target}: {r:?}");
    }
    assert!(p.events().is_empty(), "{:?}", p.events());
    let seen = server.accepted();
    assert_eq!(seen, 4);

    for (method, target) in [
        ("POST", "/org/repo/git-receive-pack"),
        ("DELETE", "/org/repo"),
        ("GET", "/other/repo"),
        ("GET", "/org/../other/repo"),
        ("GET", "/org%2F..%2Fother"),
        ("get", "/org/x"),
    ] {
        let r = get(&p, method, port, target);
        assert_eq!(r.status, 403, "{method} {target}: {r:?}");
        assert_eq!(
            r.header("x-runsbx-deny").as_deref(),
            Some("request_not_allowed")
        );
        assert!(
            r.body
                .contains("GET,HEAD /org/**; POST /org/*/git-upload-pack"),
            "{}",
            r.body
        );
    }
    // None of them reached the server.
    assert_eq!(server.accepted(), seen);
    let events = p.events();
    assert_eq!(events.len(), 6, "{events:?}");
    let first = &events[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/org/repo/git-receive-pack");
    assert_eq!(first.host, "allowed.test");
    assert_eq!(
        first.reason,
        DenyReason::RequestNotAllowed {
            rules: vec![
                "GET,HEAD /org/**".into(),
                "POST /org/*/git-upload-pack".into()
            ]
        }
    );
    assert!(
        first
            .message
            .contains("POST /org/repo/git-receive-pack is not allowed"),
        "{}",
        first.message
    );
    assert!(events[3].message.contains("`..`"), "{}", events[3].message);
}

#[test]
fn a_tunnel_to_a_host_open_to_some_requests_is_refused() {
    let echo = echo_server();
    let port = echo.port();
    let p = proxy(config_with(port, &["GET /**"]));
    let (r, _) = open_tunnel(&p, &format!("allowed.test:{port}"));
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("cannot be checked"), "{}", r.body);
    assert_eq!(echo.accepted(), 0);
    let events = p.events();
    assert_eq!(events[0].method, "CONNECT");
    assert_eq!(events[0].path, "");
}

#[test]
fn an_entry_allowing_the_host_whole_wins() {
    let echo = echo_server();
    let port = echo.port();
    let config = ProxyConfig {
        allow: Allowlist::parse([
            format!("GET allowed.test:{port}/x"),
            format!("allowed.test:{port}"),
        ])
        .unwrap(),
        ..config_for(port)
    };
    let p = proxy(config);
    let (r, _) = open_tunnel(&p, &format!("allowed.test:{port}"));
    assert_eq!(r.status, 200, "{r:?}");
}
