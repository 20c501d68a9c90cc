//! Shutting the proxy down (or dropping its handle) leaves no thread, no
//! listener and no connection behind. Its own test binary, so that the
//! threads seen are this test's alone.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use runsbx_proxy::{Allowlist, ProxyHandle};

/// Threads of this process whose name starts with `runsbx-proxy`.
fn proxy_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("runsbx-proxy"))
        .collect()
}

/// Start a proxy, give it a live tunnel and a system-resolver lookup (a
/// blocking-pool thread), and stop it with `stop`.
fn check_stop(stop: impl FnOnce(ProxyHandle)) {
    let echo = echo_server();
    let mut config = config_for(echo.port());
    config.allow =
        Allowlist::parse([format!("allowed.test:{}", echo.port()), "localhost".into()]).unwrap();
    let p = proxy(config);
    let addr = p.local_addr();
    // A thread names itself once it runs: wait for that.
    let start = std::time::Instant::now();
    while proxy_threads().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "no runsbx-proxy thread"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let (r, mut tunnel) = open_tunnel(&p, &format!("allowed.test:{}", echo.port()));
    assert_eq!(r.status, 200);
    let (r, _) = open_tunnel(&p, "localhost:443");
    assert_eq!(r.status, 403);
    assert!(
        proxy_threads()
            .iter()
            .any(|t| t.starts_with("runsbx-proxy-ns")),
        "{:?}",
        proxy_threads()
    );

    stop(p);

    // A joined thread has ended, but the kernel may list its task under
    // /proc/self/task for a moment longer (join returns when the thread
    // clears its tid, before the task is released): wait for that, 1 s
    // at most.
    let start = std::time::Instant::now();
    while !proxy_threads().is_empty() && start.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(proxy_threads(), Vec::<String>::new());
    let err = TcpStream::connect(addr).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused);
    tunnel
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(tunnel.read(&mut b).unwrap(), 0, "the tunnel is closed");
}

#[test]
fn shutdown_and_drop_leave_nothing_behind() {
    check_stop(|p| p.shutdown());
    check_stop(drop);
}
