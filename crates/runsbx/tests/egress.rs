//! Egress: a sandbox's network holds only its own loopback; the way out is
//! the proxy runsbx serves from the host side, which checks every
//! destination. Real servers on the host's 127.0.0.1, a real Python client
//! inside the sandbox, as root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture, Out};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// An HTTP server on the host's 127.0.0.1 that answers `hello` to every
/// request and counts the connections it accepted.
struct HostServer {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

impl HostServer {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                count.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut head = Vec::new();
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match conn.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = conn.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                    );
                });
            }
        });
        Self { port, accepted }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Options that allow `allowed.test:PORT`, resolved to the test's server
/// on the host's loopback, which the test marks as a destination it means
/// (the proxy refuses loopback otherwise).
fn allow_test_server(port: u16) -> Vec<String> {
    vec![
        "--allow-host".to_owned(),
        format!("allowed.test:{port}"),
        "--proxy-resolve".to_owned(),
        "allowed.test=127.0.0.1".to_owned(),
        "--proxy-allow-address".to_owned(),
        format!("127.0.0.1:{port}"),
    ]
}

/// `runsbx call --json OPTS -- python3 -c SCRIPT`.
fn python(fx: &Fixture, opts: &[String], script: &str) -> (Out, Value) {
    let mut args: Vec<String> = vec![
        "call".into(),
        "--json".into(),
        "--timeout".into(),
        "60s".into(),
    ];
    args.extend(opts.iter().cloned());
    args.extend(["--".into(), "python3".into(), "-c".into(), script.into()]);
    let out = fx.run(&args);
    let json = out.json();
    (out, json)
}

/// Python that fetches each URL through the environment's proxy and prints
/// `URL STATUS` (or the error), one line each.
fn fetch_script(urls: &[String]) -> String {
    format!(
        r#"
import os, urllib.request, urllib.error
# Through the proxy for every spelling: NO_PROXY would send the sandbox's
# own names (localhost, 127.0.0.1) straight to its own loopback.
for k in ["NO_PROXY", "no_proxy"]:
    os.environ.pop(k, None)
for url in {urls:?}:
    try:
        r = urllib.request.urlopen(url, timeout=10)
        print(url, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(url, e.code, e.read().decode()[:200].replace("\n", " "))
    except Exception as e:
        print(url, "error", type(e).__name__)
"#
    )
}

fn loopback_is_unreachable_by_every_spelling(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let server = HostServer::start();
    let p = server.port;
    let spellings = [
        format!("http://127.0.0.1:{p}/"),
        format!("http://localhost:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f000001:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        format!("http://agent-api.test:{p}/"),
    ];
    // Allowed by name, but the name resolves to the host's loopback (the
    // test resolver maps it): refused after resolution.
    let opts: Vec<String> = [
        "--allow-host",
        &format!("agent-api.test:{p}"),
        "--proxy-resolve",
        "agent-api.test=127.0.0.1",
    ]
    .map(String::from)
    .to_vec();
    let (out, r) = python(&fx, &opts, &fetch_script(&spellings));
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    for url in &spellings {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(url.as_str()))
            .unwrap_or_else(|| panic!("{url}: {stdout}"));
        assert!(
            line.contains(" 403 ") && line.contains("blocked by policy"),
            "{line}"
        );
    }
    let denied = r["egress"]["denied"].as_array().unwrap();
    assert_eq!(denied.len(), spellings.len(), "{denied:?}");
    assert!(
        denied
            .iter()
            .any(|d| d["host"] == "agent-api.test" && d["reason"]["code"] == "address_class"),
        "{denied:?}"
    );
    // Directly, without the proxy: the sandbox's own loopback has nothing
    // there, and no other address is routed.
    let direct = format!(
        r#"
import socket
for host in ["127.0.0.1", "::1", "10.0.2.2", "1.1.1.1"]:
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(3)
    try:
        s.connect((host, {p})); print(host, "connected")
    except OSError as e:
        print(host, type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"x", ("1.1.1.1", 53)); print("udp sent")
except OSError as e:
    print("udp", type(e).__name__)
"#
    );
    let (out, r) = python(&fx, &[], &direct);
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(
        !stdout.contains("connected") && !stdout.contains("udp sent"),
        "{out:?}"
    );
    assert!(r["egress"].is_null());
    assert_eq!(server.accepted(), 0, "the host server was reached");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, loopback_is_unreachable_by_every_spelling: loopback_as_root, loopback_rootless);

fn allowlisted_name_works_and_others_are_refused(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let server = HostServer::start();
    let p = server.port;
    let mut opts = allow_test_server(p);
    // Resolvable, but not on the allowlist.
    opts.extend([
        "--proxy-resolve".to_owned(),
        "blocked.test=127.0.0.1".to_owned(),
    ]);
    let urls = [
        format!("http://allowed.test:{p}/"),
        format!("http://blocked.test:{p}/"),
    ];
    let script = fetch_script(&urls)
        + &format!(
            r#"
import http.client, os
# HTTPS-style tunnel through CONNECT, by hand.
c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
c.set_tunnel("allowed.test", {p})
c.request("GET", "/")
print("tunnel", c.getresponse().read().decode())
# 100 connections at once through the one proxy.
from concurrent.futures import ThreadPoolExecutor
import urllib.request
def get(_):
    return urllib.request.urlopen("http://allowed.test:{p}/", timeout=30).read()
with ThreadPoolExecutor(100) as pool:
    print("concurrent", sum(b == b"hello" for b in pool.map(get, range(100))))
# Without the proxy nothing goes out (an opener with no proxies: urlopen's
# global one kept the environment's).
direct = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
try:
    direct.open("http://allowed.test:{p}/", timeout=5); print("direct ok")
except Exception as e:
    print("direct", type(e).__name__, e)
"#
        );
    let (out, r) = python(&fx, &opts, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(
        stdout.contains(&format!("http://allowed.test:{p}/ 200 hello")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("http://blocked.test:{p}/ 403")),
        "{stdout}"
    );
    assert!(stdout.contains("tunnel hello"), "{stdout}");
    assert!(stdout.contains("concurrent 100"), "{stdout}");
    assert!(stdout.contains("direct URLError"), "{stdout}");
    assert!(!stdout.contains("direct ok"), "{stdout}");
    let denied = r["egress"]["denied"].as_array().unwrap();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0]["host"], "blocked.test");
    assert_eq!(denied[0]["reason"]["code"], "not_allowed");
    assert_eq!(r["egress"]["stats"]["denied"], 1);
    assert!(server.accepted() >= 102, "{}", server.accepted());
    // The policy attests the call's allowlist, and only it.
    let layer = r["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "egress")
        .unwrap_or_else(|| panic!("no egress layer: {}", r["attestation"]));
    let detail = layer["detail"].as_str().unwrap();
    assert_eq!(layer["in_force"], true, "{layer}");
    assert!(detail.contains(&format!("allowed.test:{p}")), "{detail}");
    assert!(!detail.contains("blocked.test"), "{detail}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, allowlisted_name_works_and_others_are_refused: allowlist_as_root, allowlist_rootless);

/// `--allow "METHODS HOST/PATH"`: the proxy lets through the requests the
/// rule names and refuses the rest of the same host, each refusal an event
/// that names the rule.
fn request_rules_let_through_only_what_they_name(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let server = HostServer::start();
    let p = server.port;
    let opts: Vec<String> = [
        "--allow",
        &format!("GET,HEAD allowed.test:{p}/repo/**"),
        "--proxy-resolve",
        "allowed.test=127.0.0.1",
        "--proxy-allow-address",
        &format!("127.0.0.1:{p}"),
    ]
    .map(String::from)
    .to_vec();
    let script = format!(
        r#"
import os, urllib.request, urllib.error
for k in ["NO_PROXY", "no_proxy"]:
    os.environ.pop(k, None)
base = "http://allowed.test:{p}"
for method, path in [("GET", "/repo/a/info"), ("POST", "/repo/a/git-receive-pack"), ("GET", "/other")]:
    req = urllib.request.Request(base + path, method=method, data=b"x" if method == "POST" else None)
    try:
        r = urllib.request.urlopen(req, timeout=10)
        print(method, path, r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(method, path, e.code, e.headers.get("X-Runsbx-Deny"))
"#
    );
    let (out, r) = python(&fx, &opts, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(stdout.contains("GET /repo/a/info 200 hello"), "{stdout}");
    assert!(
        stdout.contains("POST /repo/a/git-receive-pack 403 request_not_allowed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("GET /other 403 request_not_allowed"),
        "{stdout}"
    );
    assert_eq!(
        server.accepted(),
        1,
        "only the allowed request reached the server"
    );
    let denied = r["egress"]["denied"].as_array().unwrap();
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert_eq!(denied[0]["method"], "POST");
    assert_eq!(denied[0]["path"], "/repo/a/git-receive-pack");
    assert_eq!(denied[0]["reason"]["code"], "request_not_allowed");
    assert_eq!(denied[0]["reason"]["rules"][0], "GET,HEAD /repo/**");
    assert_eq!(denied[1]["path"], "/other");

    // A whole-host flag does not take a rule, nor the rule flag a host.
    for (flag, value, needle) in [
        (
            "--allow-host",
            format!("GET allowed.test:{p}/x"),
            "use --allow",
        ),
        (
            "--allow",
            format!("allowed.test:{p}"),
            "names no method or path",
        ),
        ("--allow", format!("GET allowed.test:{p}/a[b]"), "wildcards"),
    ] {
        let out = fx.run(["call", flag, &value, "--", "/bin/true"]);
        assert_eq!(out.code, 125, "{flag} {value}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(first.contains(needle), "{flag} {value}: {first}");
    }
}

as_root_and_rootless!(RUNSBX, request_rules_let_through_only_what_they_name: request_rules_as_root, request_rules_rootless);

fn a_connection_flood_is_cut_off(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let server = HostServer::start();
    let p = server.port;
    let opts = allow_test_server(p);
    let script = format!(
        r#"
import socket, time, urllib.error, urllib.request
held, refused = [], 0
for i in range(400):
    held.append(socket.create_connection(("127.0.0.1", 3128), timeout=5))
time.sleep(1)
for s in held:
    try:
        if s.recv(64, socket.MSG_DONTWAIT).startswith(b"HTTP/1.1 503"):
            refused += 1
    except (BlockingIOError, TimeoutError):
        pass
print("refused", refused)
for s in held:
    s.close()
# The proxy answers at once all along (503 while it still counts the closed
# connections, which it notices asynchronously), then serves again.
for attempt in range(100):
    try:
        print("after", urllib.request.urlopen("http://allowed.test:{p}/", timeout=10).read().decode())
        break
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
        time.sleep(0.05)
"#
    );
    let (out, r) = python(&fx, &opts, &script);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    let stdout = r["stdout"]["data"].as_str().unwrap();
    let refused: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("refused "))
        .unwrap()
        .parse()
        .unwrap();
    // The bound is 128 connections: every one past it is refused at once.
    assert_eq!(refused, 400 - 128, "{stdout}");
    assert!(stdout.contains("after hello"), "{stdout}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_connection_flood_is_cut_off: flood_as_root, flood_rootless);

/// A container made by `run`/`create` (as podman and containerd do) gets
/// egress from its profile: a supervisor process serves the proxy and goes
/// with the container.
fn containers_get_egress_from_their_profile(fx: Fixture) {
    let server = HostServer::start();
    let p = server.port;
    let config = egress_profile(
        &fx,
        &format!(
            "allow = [\"allowed.test:{p}\"]\nresolve = {{ \"allowed.test\" = \"127.0.0.1\", \"blocked.test\" = \"127.0.0.1\" }}\nallow_addresses = [\"127.0.0.1:{p}\"]\n"
        ),
    );
    let urls = [
        format!("http://allowed.test:{p}/"),
        format!("http://blocked.test:{p}/"),
    ];
    let rootfs = kit::python_rootfs();
    let script = fetch_script(&urls);
    let b = fx.bundle("b", &["/usr/bin/python3", "-c", &script], |c| {
        c["root"]["path"] = Value::from(rootfs.to_str().unwrap());
        c["process"]["env"] = serde_json::json!(["PATH=/usr/bin:/bin", "HOME=/tmp"]);
    });
    let out = fx.run_with_config(&config, &b, "c1");
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout
            .contains(&format!("http://allowed.test:{p}/ 200 hello")),
        "{out:?}"
    );
    assert!(
        out.stdout
            .contains(&format!("http://blocked.test:{p}/ 403")),
        "{out:?}"
    );
    // The supervisor is gone with the container.
    kit::settle(
        std::time::Duration::from_secs(10),
        kit::POLL,
        || fx.stray_processes(),
        Vec::is_empty,
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, containers_get_egress_from_their_profile: container_egress_as_root, container_egress_rootless);

/// An operator config whose profile `egress` is the default one with this
/// `[egress]` section.
fn egress_profile(fx: &Fixture, egress: &str) -> std::path::PathBuf {
    let default = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bundles/profiles/default.toml"),
    )
    .unwrap();
    let profile =
        default.replace("name = \"default\"", "name = \"egress\"") + "\n[egress]\n" + egress;
    kit::operator_config(fx.dir.path(), "egress", &profile)
}

/// A profile whose allowlist does not parse is refused when it is loaded,
/// naming the profile, its file and the entry; nothing is left.
fn a_bad_profile_allowlist_is_refused(fx: Fixture) {
    let config = egress_profile(&fx, "allow = [\"pypi.org\", \"bad host!\"]\n");
    let b = fx.bundle("b", &["/bin/true"], |_| {});
    let out = fx.run_with_config(&config, &b, "c1");
    // Invalid input (README, "Exit codes").
    assert_eq!(out.code, 3, "{out:?}");
    let first = out.stderr.lines().next().unwrap_or_default();
    assert!(
        first.contains("profile `egress`")
            && first.contains("egress.toml")
            && first.contains("allowlist entry \"bad host!\""),
        "{out:?}"
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_bad_profile_allowlist_is_refused: bad_allowlist_as_root, bad_allowlist_rootless);
