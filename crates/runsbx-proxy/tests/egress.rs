//! The proxy against real servers on 127.0.0.1: what goes through, what is
//! refused, and that a refused destination never sees a connection.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use runsbx_proxy::{AddressClass, Allowlist, DenyReason, ProxyConfig};

#[test]
fn get_is_forwarded_in_origin_form() {
    let server = http_server();
    let p = proxy(config_for(server.port()));
    let port = server.port();
    let r = request(
        &p,
        &format!(
            "GET http://allowed.test:{port}/path?q=1 HTTP/1.1\r\nHost: other\r\nProxy-Authorization: Basic eA==\r\nProxy-Connection: keep-alive\r\n\r\n"
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello");
    assert_eq!(r.header("connection").as_deref(), Some("close"));
    assert_eq!(r.header("keep-alive"), None);
    let heads = server.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    assert!(
        heads[0].starts_with("GET /path?q=1 HTTP/1.1\r\n"),
        "{}",
        heads[0]
    );
    assert!(
        heads[0].contains(&format!("Host: allowed.test:{port}\r\n")),
        "{}",
        heads[0]
    );
    assert!(
        !heads[0].to_ascii_lowercase().contains("proxy-"),
        "{}",
        heads[0]
    );
    assert!(p.events().is_empty());
    let stats = p.stats();
    assert!(stats.bytes_up > 0 && stats.bytes_down > 0, "{stats:?}");
}

#[test]
fn a_forwarded_exchange_ends_with_its_response() {
    let server = http_server();
    let p = proxy(config_for(server.port()));
    let mut stream = connect(&p);
    write!(
        stream,
        "GET http://allowed.test:{}/ HTTP/1.1\r\n\r\n",
        server.port()
    )
    .unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).unwrap();
    assert_eq!(parse_response(&out).body, "hello");
    // The client keeps its side open; the proxy lets go of the connection
    // anyway, long before the idle timeout.
    let start = Instant::now();
    while p.stats().active > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "connection still held"
        );
        thread::sleep(Duration::from_millis(10));
    }
    drop(stream);
}

#[test]
fn post_body_is_streamed() {
    let server = http_server();
    let p = proxy(config_for(server.port()));
    let body = "x".repeat(100_000);
    let r = request(
        &p,
        &format!(
            "POST http://allowed.test:{}/ HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            server.port(),
            body.len()
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "got 100000");
}

#[test]
fn connect_tunnels_bytes() {
    let echo = echo_server();
    let p = proxy(config_for(echo.port()));
    let (r, mut tunnel) = open_tunnel(&p, &format!("allowed.test:{}", echo.port()));
    assert_eq!(r.status, 200, "{r:?}");
    for msg in ["ping", "a longer line\n", &"z".repeat(50_000)] {
        tunnel.write_all(msg.as_bytes()).unwrap();
        let mut back = vec![0u8; msg.len()];
        tunnel.read_exact(&mut back).unwrap();
        assert_eq!(back, msg.as_bytes());
    }
}

#[test]
fn a_name_off_the_list_is_refused_with_an_event() {
    let server = http_server();
    let p = proxy(config_for(server.port()));
    let r = request(
        &p,
        &format!(
            "GET http://blocked.test:{}/ HTTP/1.1\r\n\r\n",
            server.port()
        ),
    );
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("blocked by policy"), "{}", r.body);
    assert!(r.body.contains("blocked.test"), "{}", r.body);
    assert_eq!(r.header("x-runsbx-deny").as_deref(), Some("not_allowed"));
    let events = p.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, DenyReason::NotAllowed);
    assert_eq!(events[0].host, "blocked.test");
    assert_eq!(events[0].port, server.port());
    assert_eq!(events[0].method, "GET");
    assert_eq!(events[0].client.ip().to_string(), "127.0.0.1");
    assert_eq!(events[0].message, r.body.trim_end());
    // The allowed name on another port is not allowed either.
    let (r, _) = open_tunnel(&p, "allowed.test:443");
    assert_eq!(r.status, 403);
    assert_eq!(p.stats().denied, 2);
    assert_eq!(server.accepted(), 0);
}

#[test]
fn ip_literals_and_localhost_never_reach_the_server() {
    let server = http_server();
    let port = server.port();
    let p = proxy(config_for(port));
    for host in [
        "127.0.0.1",
        "2130706433",
        "0x7f000001",
        "017700000001",
        "0177.0.0.1",
        "127.1",
        "127.0.1",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "0.0.0.0",
        "0",
        "[::]",
        "localhost",
        "LOCALHOST.",
    ] {
        let r = request(&p, &format!("GET http://{host}:{port}/ HTTP/1.1\r\n\r\n"));
        assert_eq!(r.status, 403, "GET {host}: {r:?}");
        let (r, _) = open_tunnel(&p, &format!("{host}:{port}"));
        assert_eq!(r.status, 403, "CONNECT {host}: {r:?}");
        assert!(r.body.contains("policy"), "{}", r.body);
    }
    assert_eq!(server.accepted(), 0);
    for event in p.events() {
        let want = if event.host.starts_with("localhost") {
            DenyReason::NotAllowed
        } else {
            DenyReason::IpLiteral
        };
        assert_eq!(event.reason, want, "{event:?}");
    }
}

#[test]
fn localhost_on_the_list_is_still_loopback() {
    let server = http_server();
    let port = server.port();
    // No allow_addresses: the system resolver's answer for localhost is judged.
    let p = proxy(ProxyConfig::new(
        Allowlist::parse([format!("localhost:{port}")]).unwrap(),
    ));
    let (r, _) = open_tunnel(&p, &format!("localhost:{port}"));
    assert_eq!(r.status, 403, "{r:?}");
    assert_eq!(r.header("x-runsbx-deny").as_deref(), Some("address_class"));
    let events = p.events();
    assert!(
        matches!(
            events[0].reason,
            DenyReason::AddressClass {
                class: AddressClass::Loopback,
                ..
            }
        ),
        "{events:?}"
    );
    assert_eq!(server.accepted(), 0);
}

#[test]
fn a_name_mapped_to_loopback_needs_an_explicit_exemption() {
    let server = http_server();
    let mut config = config_for(server.port());
    config.allow_addresses.clear();
    let p = proxy(config);
    let r = request(
        &p,
        &format!(
            "GET http://allowed.test:{}/ HTTP/1.1\r\n\r\n",
            server.port()
        ),
    );
    assert_eq!(r.status, 403, "{r:?}");
    assert!(
        r.body.contains("resolves to 127.0.0.1, a loopback address"),
        "{}",
        r.body
    );
    let events = p.events();
    assert_eq!(
        events[0].reason,
        DenyReason::AddressClass {
            class: AddressClass::Loopback,
            addr: "127.0.0.1".parse().unwrap()
        }
    );
    assert_eq!(server.accepted(), 0);
}

#[test]
fn metadata_and_private_names_are_refused() {
    let mut config =
        ProxyConfig::new(Allowlist::parse(["meta.test", "lan.test", "mixed.test"]).unwrap());
    config
        .hosts
        .insert("meta.test".into(), vec!["169.254.169.254".parse().unwrap()]);
    config
        .hosts
        .insert("lan.test".into(), vec!["192.168.1.10".parse().unwrap()]);
    config.hosts.insert(
        "mixed.test".into(),
        vec![
            "93.184.215.14".parse().unwrap(),
            "::ffff:10.0.0.1".parse().unwrap(),
        ],
    );
    let p = proxy(config);
    for (host, class) in [
        ("meta.test", AddressClass::Metadata),
        ("lan.test", AddressClass::Private),
        ("mixed.test", AddressClass::Private),
    ] {
        let (r, _) = open_tunnel(&p, &format!("{host}:443"));
        assert_eq!(r.status, 403, "{host}: {r:?}");
        let event = p.events().pop().unwrap();
        assert!(
            matches!(event.reason, DenyReason::AddressClass { class: c, .. } if c == class),
            "{event:?}"
        );
    }
}

#[test]
fn malformed_requests_get_400() {
    let p = proxy(config_for(9));
    let big = format!(
        "GET http://allowed.test:9/ HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    for raw in [
        "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        "garbage\r\n\r\n",
        "CONNECT allowed.test HTTP/1.1\r\n\r\n",
        "GET http://user@allowed.test:9/ HTTP/1.1\r\n\r\n",
        big.as_str(),
    ] {
        let r = request(&p, raw);
        assert_eq!(r.status, 400, "{raw:.40}: {r:?}");
        assert_eq!(r.header("x-runsbx-deny").as_deref(), Some("bad_request"));
    }
    let events = p.events();
    assert_eq!(events.len(), 5);
    assert!(events.iter().all(|e| e.reason == DenyReason::BadRequest));
    assert!(
        events[4].message.contains("larger than 16 KiB"),
        "{:?}",
        events[4]
    );
}

#[test]
fn unreachable_upstream_is_502_not_a_deny() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = proxy(config_for(port));
    let (r, _) = open_tunnel(&p, &format!("allowed.test:{port}"));
    assert_eq!(r.status, 502, "{r:?}");
    assert!(p.events().is_empty());
    assert_eq!(p.stats().upstream_errors, 1);
}

#[test]
fn a_hundred_tunnels_at_once() {
    let echo = echo_server();
    let p = proxy(config_for(echo.port()));
    let target = format!("allowed.test:{}", echo.port());
    thread::scope(|s| {
        let handles: Vec<_> = (0..100)
            .map(|i| {
                let (p, target) = (&p, &target);
                s.spawn(move || {
                    let (r, mut tunnel) = open_tunnel(p, target);
                    assert_eq!(r.status, 200, "{r:?}");
                    let msg = format!("tunnel {i}");
                    tunnel.write_all(msg.as_bytes()).unwrap();
                    let mut back = vec![0u8; msg.len()];
                    tunnel.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg.as_bytes());
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    });
    assert_eq!(echo.accepted(), 100);
    assert!(p.events().is_empty());
}

#[test]
fn a_silent_tunnel_is_closed_after_the_idle_timeout() {
    let echo = echo_server();
    let mut config = config_for(echo.port());
    config.idle_timeout = Duration::from_millis(300);
    let p = proxy(config);
    let (r, mut tunnel) = open_tunnel(&p, &format!("allowed.test:{}", echo.port()));
    assert_eq!(r.status, 200);
    // Traffic keeps it open past the timeout.
    for _ in 0..4 {
        thread::sleep(Duration::from_millis(150));
        tunnel.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        tunnel.read_exact(&mut b).unwrap();
    }
    let start = Instant::now();
    let mut b = [0u8; 1];
    assert_eq!(tunnel.read(&mut b).unwrap(), 0, "EOF expected");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn a_slow_request_head_is_cut() {
    let mut config = config_for(9);
    config.header_timeout = Duration::from_millis(300);
    let p = proxy(config);
    let mut stream = connect(&p);
    let start = Instant::now();
    // One byte every 50 ms: each arrives well within any per-read timeout,
    // the head as a whole never does.
    let mut cut = false;
    for b in "CONNECT allowed.test:9 HTTP/1.1\r\nX-Slow: "
        .bytes()
        .cycle()
        .take(200)
    {
        if stream.write_all(&[b]).is_err() {
            cut = true;
            break;
        }
        thread::sleep(Duration::from_millis(50));
        if start.elapsed() > Duration::from_secs(1) {
            break;
        }
    }
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let r = parse_response(&out);
    assert!(cut || r.status == 408, "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
}

#[test]
fn the_byte_budget_ends_a_connection() {
    let echo = echo_server();
    let mut config = config_for(echo.port());
    config.max_bytes = 10_000;
    let p = proxy(config);
    let (r, mut tunnel) = open_tunnel(&p, &format!("allowed.test:{}", echo.port()));
    assert_eq!(r.status, 200);
    let _ = tunnel.write_all(&[b'x'; 20_000]);
    let mut out = Vec::new();
    let _ = tunnel.read_to_end(&mut out);
    assert!(out.len() <= 10_000, "{}", out.len());
    let events = p.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, DenyReason::LimitReached);
    assert_eq!(events[0].method, "CONNECT");
}
