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
