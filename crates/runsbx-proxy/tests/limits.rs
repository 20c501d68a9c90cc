//! A client that opens connections without end: the proxy holds at most
//! `max_connections` of them, refuses the rest at once, and keeps serving.
//! Its own test binary, so that the descriptor count is this test's alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use runsbx_proxy::DenyReason;

const LIMIT: usize = 8;
const FLOOD: usize = 200;

#[test]
fn a_connection_flood_is_refused_beyond_the_limit() {
    let server = http_server();
    let mut config = config_for(server.port());
    config.max_connections = LIMIT;
    // The held connections must outlive the test's checks.
    config.header_timeout = Duration::from_secs(60);
    let base = open_fds();
    let p = proxy(config);

    let mut flood: Vec<TcpStream> = (0..FLOOD)
        .map(|_| TcpStream::connect(p.local_addr()).unwrap())
        .collect();
    // Once the proxy has accepted them all, every refusal has been written.
    let start = Instant::now();
    while p.stats().connections < FLOOD as u64 {
        assert!(start.elapsed() < Duration::from_secs(10), "{:?}", p.stats());
        thread::sleep(Duration::from_millis(10));
    }
    // Every connection is either answered 503 and closed, or held.
    let (mut refused, mut held) = (0, 0);
    for stream in &mut flood {
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut out = Vec::new();
        match stream.read_to_end(&mut out) {
            Ok(_) => {
                let r = parse_response(&out);
                assert_eq!(r.status, 503, "{r:?}");
                assert_eq!(r.header("x-runsbx-deny").as_deref(), Some("limit_reached"));
                refused += 1;
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => held += 1,
            Err(e) => panic!("unexpected: {e}"),
        }
    }
    assert_eq!((held, refused), (LIMIT, FLOOD - LIMIT));
    // The proxy holds one descriptor per held connection, not per attempt.
    let during = open_fds();
    assert!(
        during <= base + FLOOD + LIMIT + 16,
        "fds: {base} before, {during} during"
    );
    let stats = p.stats();
    assert_eq!(stats.active, LIMIT as u64, "{stats:?}");
    assert_eq!(stats.connections, FLOOD as u64);
    // One event for the burst, every refusal counted.
    let events = p.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason, DenyReason::LimitReached);
    assert_eq!(stats.denied, (FLOOD - LIMIT) as u64);

    drop(flood);
    let start = Instant::now();
    while p.stats().active > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "connections not released"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let r = request(
        &p,
        &format!(
            "GET http://allowed.test:{}/ HTTP/1.1\r\n\r\n",
            server.port()
        ),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, "hello");
    let after = open_fds();
    assert!(after <= base + 16, "fds: {base} before, {after} after");
}
