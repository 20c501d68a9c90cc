//! Seccomp denials reported: a real Python inside the sandbox makes
//! syscalls the allowlist denies; each still fails with EPERM inside, and
//! the call's result names it, with the process that made it. As root and
//! rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use runsbx_testkit::{self as kit, as_root_and_rootless, skip, Fixture, Out};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// `runsbx call --json -- python3 -c SCRIPT`.
fn python(fx: &Fixture, script: &str) -> (Out, Value) {
    let out = fx.run([
        "call",
        "--json",
        "--timeout",
        "60s",
        "--",
        "python3",
        "-c",
        script,
    ]);
    let json = out.json();
    (out, json)
}

/// Each denied syscall, and the errno the program saw (`NAME RET ERRNO`).
const DENIED: &str = r#"
import ctypes, socket
libc = ctypes.CDLL(None, use_errno=True)
def report(name, ret):
    print(name, ret, ctypes.get_errno(), flush=True)
report("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
report("ptrace", libc.ptrace(0, 0, None, None))  # PTRACE_TRACEME
try:
    socket.socket(17, socket.SOCK_RAW, 0)  # AF_PACKET
    print("socket 0 0")
except OSError as e:
    print("socket -1", e.errno)
"#;

fn denials_are_reported_and_still_eperm(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let (out, r) = python(&fx, DENIED);
    assert_eq!(r["exit_code"], 0, "{out:?}");
    // Inside, each failed with EPERM, as without a listener.
    let stdout = r["stdout"]["data"].as_str().unwrap();
    for name in ["mount", "ptrace", "socket"] {
        assert!(
            stdout.lines().any(|l| l == format!("{name} -1 1")),
            "{name} did not fail with EPERM: {stdout:?}"
        );
    }
    let denied = r["seccomp"]["denied"].as_array().unwrap();
    assert_eq!(r["seccomp"]["dropped"], 0, "{r}");
    let mut names: Vec<&str> = denied
        .iter()
        .map(|d| d["syscall"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["mount", "ptrace", "socket"], "{r}");
    for d in denied {
        assert_eq!(d["process"], "python3", "{d}");
        assert_eq!(d["count"], 1, "{d}");
        assert_eq!(d["args"].as_array().unwrap().len(), 6, "{d}");
    }
    let socket = denied.iter().find(|d| d["syscall"] == "socket").unwrap();
    assert_eq!(socket["args"][0], 17, "AF_PACKET: {socket}");
    let ptrace = denied.iter().find(|d| d["syscall"] == "ptrace").unwrap();
    assert_eq!(ptrace["args"][0], 0, "PTRACE_TRACEME: {ptrace}");
    // The listener's socket went with the call, and everything else.
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, denials_are_reported_and_still_eperm: reported_as_root, reported_rootless);

fn a_call_without_denials_reports_none(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let (out, r) = python(&fx, "import os; print(os.getppid())");
    assert_eq!(r["exit_code"], 0, "{out:?}");
    assert_eq!(r["seccomp"]["denied"], serde_json::json!([]), "{r}");
    assert_eq!(r["seccomp"]["dropped"], 0, "{r}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_call_without_denials_reports_none: none_as_root, none_rootless);

/// Connects, and what the program got (`tcp|udp HOST PORT ok|ERRNO`).
const CONNECTS: &str = r#"
import errno, socket, sys
def connect(kind, host, port):
    s = socket.socket(socket.AF_INET, kind)
    name = "tcp" if kind == socket.SOCK_STREAM else "udp"
    try:
        s.connect((host, port))
        print(name, host, port, "ok", flush=True)
    except OSError as e:
        print(name, host, port, errno.errorcode[e.errno], flush=True)
own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
connect(socket.SOCK_STREAM, "127.0.0.1", own.getsockname()[1])
for port in sys.argv[1:]:
    connect(socket.SOCK_STREAM, "127.0.0.1", int(port))
connect(socket.SOCK_STREAM, "10.0.0.5", 5432)
connect(socket.SOCK_DGRAM, "10.0.0.2", 53)
"#;

/// The (kind, destination, protocol, errno, process, count) of each hint.
fn hints(r: &Value) -> Vec<(String, String, String, String, String, u64)> {
    assert_eq!(r["hints"]["dropped"], 0, "{r}");
    r["hints"]["connects"]
        .as_array()
        .unwrap_or_else(|| panic!("no hints: {r}"))
        .iter()
        .map(|h| {
            let s = |k: &str| {
                h[k].as_str()
                    .unwrap_or_else(|| panic!("{k}: {h}"))
                    .to_owned()
            };
            (
                s("kind"),
                s("destination"),
                s("protocol"),
                s("errno"),
                s("process"),
                h["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn refused_connects_are_explained(fx: Fixture) {
    if !kit::have_python_image() {
        skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    // The agent's own API on the host's loopback: the sandbox must not
    // reach it, and the result must say why its connect was refused.
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    api.set_nonblocking(true).unwrap();
    let port = api.local_addr().unwrap().port().to_string();
    let call = |extra: &[&str], ports: &[&str]| {
        let mut args = vec!["call", "--json", "--timeout", "60s"];
        args.extend(extra);
        args.extend(["--", "python3", "-c", CONNECTS]);
        args.extend(ports);
        let out = fx.run(args);
        let r = out.json();
        assert_eq!(r["exit_code"], 0, "{out:?}");
        r
    };
    let r = call(&[], &[&port]);
    let stdout = r["stdout"]["data"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[1..],
        [
            format!("tcp 127.0.0.1 {port} ECONNREFUSED"),
            "tcp 10.0.0.5 5432 ENETUNREACH".to_owned(),
            "udp 10.0.0.2 53 ENETUNREACH".to_owned(),
        ],
        "{r}"
    );
    // Its own listener took its own connect: observed, let through.
    assert!(
        lines[0].starts_with("tcp 127.0.0.1 ") && lines[0].ends_with(" ok"),
        "{r}"
    );
    assert!(
        matches!(api.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host's loopback was reached from the sandbox"
    );
    let py = "python3".to_owned();
    let hint = |kind: &str, to: &str, proto: &str, errno: &str| {
        (
            kind.to_owned(),
            to.to_owned(),
            proto.to_owned(),
            errno.to_owned(),
            py.clone(),
            1,
        )
    };
    assert_eq!(
        hints(&r),
        [
            hint(
                "loopback_is_own",
                &format!("127.0.0.1:{port}"),
                "tcp",
                "ECONNREFUSED"
            ),
            hint("no_route", "10.0.0.5:5432", "tcp", "ENETUNREACH"),
            hint("no_dns", "10.0.0.2:53", "udp", "ENETUNREACH"),
        ],
        "{r}"
    );
    let message = |r: &Value, i: usize| {
        r["hints"]["connects"][i]["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(message(&r, 0).contains("host's loopback"), "{r}");
    assert!(message(&r, 1).contains("--allow-host"), "{r}");
    // With egress, the proxy's port inside is taken (no hint for it), and
    // the way out the hints give is the proxy already set.
    let r = call(&["--allow-host", "example.invalid"], &[&port, "3128"]);
    let stdout = r["stdout"]["data"].as_str().unwrap();
    assert!(stdout.contains("tcp 127.0.0.1 3128 ok\n"), "{r}");
    let kinds: Vec<String> = hints(&r).into_iter().map(|h| h.0).collect();
    assert_eq!(kinds, ["loopback_is_own", "no_route", "no_dns"], "{r}");
    assert_eq!(
        r["hints"]["connects"][0]["destination"],
        format!("127.0.0.1:{port}")
    );
    assert!(message(&r, 1).contains("HTTPS_PROXY"), "{r}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, refused_connects_are_explained: hints_as_root, hints_rootless);
