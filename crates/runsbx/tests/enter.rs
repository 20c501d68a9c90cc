//! Every process that enters a sandbox after its init is held to it: exec
//! (plain, `--process`, `--user`, `--cwd`, detached) joins the sandbox's
//! user namespace and cgroup with the init's limits; a network an engine
//! wires in after create is gone before any process runs; a deadline from
//! the profile or an annotation ends the whole sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use runsbx_testkit::{
    self as kit, as_root_and_rootless, skip, Canary, Fixture, Who, ENTERED_INIT, ENTERED_PROBE,
};
use serde_json::Value;

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// Starts `c1` running [`ENTERED_INIT`] and waits until its init is ready.
fn start_entered(fx: &Fixture) -> i32 {
    let b = fx.bundle("b", &["sh", "-c", ENTERED_INIT], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    wait_ready(fx);
    fx.run(["state", "c1"]).ok().json()["pid"].as_i64().unwrap() as i32
}

/// Waits until the init of `c1` has recorded its uid_map (10 s at most).
fn wait_ready(fx: &Fixture) {
    kit::wait_until("the init to get ready", Duration::from_secs(10), || {
        fx.run(["exec", "c1", "cat", "/tmp/init-map"]).code == 0
    });
}

/// Runs `exec -d --pid-file` of a sleep and returns its host pid.
fn exec_detached(fx: &Fixture, extra: &[&str]) -> i32 {
    let pid_file = fx.dir.path().join(format!("exec-{}.pid", extra.len()));
    let mut args = vec!["exec", "--detach", "--pid-file", pid_file.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["c1", "sleep", "1001"]);
    fx.run(args).ok();
    fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn exec_is_held_to_the_sandbox(fx: Fixture) {
    let canary = Canary::start();
    let init = start_entered(&fx);

    let out = fx.run(["exec", "c1", "sh", "-c", ENTERED_PROBE]);
    assert_eq!(out.code, 0, "{out:?}");
    kit::assert_entered(&out, &canary);

    // The same from a process.json, and with another working directory.
    let process = fx.dir.path().join("process.json");
    fs::write(
        &process,
        serde_json::json!({
            "args": ["sh", "-c", ENTERED_PROBE],
            "cwd": "/tmp",
            "env": ["PATH=/bin"],
            "user": {"uid": 0, "gid": 0},
        })
        .to_string(),
    )
    .unwrap();
    let out = fx.run(["exec", "--process", process.to_str().unwrap(), "c1"]);
    assert_eq!(out.code, 0, "{out:?}");
    kit::assert_entered(&out, &canary);
    let out = fx.run(["exec", "--cwd", "/tmp", "c1", "sh", "-c", ENTERED_PROBE]);
    assert_eq!(out.code, 0, "{out:?}");
    kit::assert_entered(&out, &canary);

    // From the host: the exec'd process has the init's host uid (the
    // sandbox's own range as root, the caller rootless; never host root)
    // and the init's cgroups.
    let (init_uid, init_cgroups) = kit::host_view(init);
    let (uid, cgroups) = kit::host_view(exec_detached(&fx, &[]));
    assert_eq!(uid, init_uid);
    assert_ne!(uid, 0, "an exec'd process runs as host root");
    assert_eq!(cgroups, init_cgroups);
    match &fx.who {
        Who::User(u) => assert_eq!(uid, u.uid),
        Who::Root => {
            // Another user of the sandbox maps into the same range.
            let (uid, _) = kit::host_view(exec_detached(&fx, &["--user", "1000:1000"]));
            assert_eq!(uid, init_uid + 1000);
        }
    }

    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, exec_is_held_to_the_sandbox: exec_held_as_root, exec_held_rootless);

/// What an exec may not ask for: more capabilities than the profile's, a
/// user the sandbox does not map, a stopped container. Each refused with
/// its documented code, nothing left behind.
fn exec_refusals(fx: Fixture) {
    start_entered(&fx);
    let out = fx.run(["exec", "--cap", "CAP_SYS_ADMIN", "c1", "true"]);
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stderr.contains("exec --cap CAP_SYS_ADMIN"), "{out:?}");

    let process = fx.dir.path().join("caps.json");
    fs::write(
        &process,
        serde_json::json!({
            "args": ["sh", "-c", "probe status"],
            "cwd": "/",
            "env": ["PATH=/bin"],
            "user": {"uid": 0, "gid": 0},
            "capabilities": {
                "bounding": ["CAP_SYS_ADMIN"],
                "effective": ["CAP_SYS_ADMIN"],
                "permitted": ["CAP_SYS_ADMIN"],
            },
        })
        .to_string(),
    )
    .unwrap();
    let out = fx.run(["exec", "--process", process.to_str().unwrap(), "c1"]);
    // The capabilities are dropped to the profile's (none), as for the init.
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("CapEff:\t0000000000000000"), "{out:?}");

    // The sandbox maps 65536 ids as root; rootless the caller's own and its
    // 65536 subordinate ids.
    for user in ["70000", "0:70000"] {
        let out = fx.run(["exec", "--user", user, "c1", "true"]);
        assert_eq!(out.code, 3, "{out:?}");
        assert!(out.stderr.contains("is not mapped"), "{out:?}");
    }

    // A working directory the container lacks, said plainly, once.
    let out = fx.run(["exec", "--cwd", "/nope", "c1", "true"]);
    assert_eq!(out.code, 3, "{out:?}");
    let cause = "exec: working directory \"/nope\": does not exist in container `c1`";
    assert!(
        out.stderr.starts_with(&format!("runsbx: error: {cause}")),
        "{out:?}"
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");

    fx.run(["kill", "c1", "KILL"]).ok();
    fx.wait_status("c1", "stopped");
    let out = fx.run(["exec", "c1", "true"]);
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stderr.contains("container not running"), "{out:?}");
    fx.run(["delete", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, exec_refusals: exec_refusals_as_root, exec_refusals_rootless);

/// `run` starts the sandbox it made: its create's network setup stands for
/// the check at start, and the layer that says so is recorded in the
/// container's attestation (after the start, beside the command) by the
/// time `run --detach` returns; an exec then checks again.
fn run_records_its_check_at_start(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    let report = || -> Value {
        serde_json::from_str(
            &fs::read_to_string(fx.state.join("@bundles/c1/hardening.json")).unwrap(),
        )
        .unwrap()
    };
    let rechecked = |report: &Value| -> Vec<String> {
        report["attestation"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["layer"] == "network_rechecked" && l["in_force"] == true)
            .map(|l| l["detail"].as_str().unwrap().to_owned())
            .collect()
    };
    let checked_at = |when: &str| {
        let report = report();
        assert_eq!(
            rechecked(&report),
            [format!("checked at {when}: only lo")],
            "{report}"
        );
    };
    checked_at("start");
    fx.run(["exec", "c1", "true"]).ok();
    checked_at("exec");
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, run_records_its_check_at_start: run_check_as_root, run_check_rootless);

/// A veth pair as an engine makes one: the host end with an address and a
/// listener, the other end moved into `pid`'s network namespace with an
/// address, plus a stray address on the sandbox's `lo`.
struct Veth {
    host: String,
    host_ip: String,
}

impl Veth {
    fn wire(pid: i32, n: u32) -> Self {
        let tag = (std::process::id() % 10_000) * 10 + n;
        let (host, peer) = (format!("rsbh{tag}"), format!("rsbp{tag}"));
        let subnet = format!("10.213.{}", (std::process::id() * 4 + n) % 250);
        let host_ip = format!("{subnet}.1");
        let netns = format!("/proc/{pid}/ns/net");
        let sh = |script: String| {
            let out = kit::output_via_files(Command::new("sh").args(["-ec", &script]));
            assert_eq!(out.code, 0, "{script}: {out:?}");
        };
        sh(format!(
            "ip link add {host} type veth peer name {peer}; ip link set {peer} netns {netns}; \
             ip addr add {host_ip}/24 dev {host}; ip link set {host} up; \
             nsenter --net={netns} sh -ec 'ip addr add {subnet}.2/24 dev {peer}; \
             ip link set {peer} up; ip addr add 192.0.2.{n}/32 dev lo'"
        ));
        Self { host, host_ip }
    }

    /// Whether the host end still exists (deleting either end of a veth
    /// pair deletes both).
    fn exists(&self) -> bool {
        Path::new("/sys/class/net").join(&self.host).exists()
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .output();
    }
}

/// Links and addresses of `pid`'s network namespace, seen from the host.
fn netns_view(pid: i32) -> String {
    let out = kit::output_via_files(Command::new("nsenter").args([
        &format!("--net=/proc/{pid}/ns/net"),
        "ip",
        "-o",
        "addr",
    ]));
    assert_eq!(out.code, 0, "{out:?}");
    out.stdout
        .lines()
        .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What an engine wires into a sandbox's network after `create` (root
/// podman does with `--uidmap`) is gone before `start` runs the process,
/// and again before an `exec`; nothing but `lo` is ever reachable.
#[test]
fn an_engine_wired_network_is_removed() {
    if !kit::is_root() {
        skip!("an_engine_wired_network_is_removed: needs root to make veth pairs");
    }
    for tool in ["ip", "nsenter"] {
        if !kit::have(tool) {
            skip!("{tool} is not installed (apt-get install iproute2 util-linux)");
        }
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    let canary = Canary::start();
    let b = fx.bundle("b", &["sh", "-c", ENTERED_INIT], |_| {});
    fx.run(["create", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    let pid = fx.run(["state", "c1"]).ok().json()["pid"].as_i64().unwrap() as i32;
    let veth = Veth::wire(pid, 1);
    let listener = std::net::TcpListener::bind((veth.host_ip.as_str(), 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(netns_view(pid).contains("rsbp"), "{}", netns_view(pid));

    fx.run(["start", "c1"]).ok();
    assert!(!veth.exists(), "the veth pair survived start");
    let only_lo = "1: lo inet 127.0.0.1/8\n1: lo inet6 ::1/128";
    assert_eq!(netns_view(pid), only_lo);
    let report: Value = serde_json::from_str(
        &fs::read_to_string(fx.state.join("@bundles/c1/hardening.json")).unwrap(),
    )
    .unwrap();
    let layer = report["attestation"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["layer"] == "network_rechecked")
        .unwrap_or_else(|| panic!("no network_rechecked layer: {report}"));
    let detail = layer["detail"].as_str().unwrap();
    assert!(
        detail.contains("checked at start") && detail.contains("interface rsbp"),
        "{detail}"
    );

    wait_ready(&fx);

    // Wired again while it runs: the next exec gets only lo too.
    let again = Veth::wire(pid, 2);
    let out = fx.run([
        "exec",
        "c1",
        "sh",
        "-c",
        &format!(
            "{ENTERED_PROBE}; probe connect {} {port}; probe connect {} {port}",
            veth.host_ip, again.host_ip
        ),
    ]);
    assert_eq!(out.code, 1, "{out:?}");
    kit::assert_entered(&out, &canary);
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| *l == "connect ENETUNREACH")
            .count(),
        2,
        "{out:?}"
    );
    assert!(!again.exists(), "the veth pair survived exec");
    assert_eq!(netns_view(pid), only_lo);
    match listener.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the host listener was reached: {other:?}"),
    }
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}

/// A CPU spin that also left a background process behind, under a
/// `runsbx.timeout` annotation.
fn spinning(fx: &Fixture, name: &str, timeout: &str, mark: &str) -> std::path::PathBuf {
    fx.bundle(
        name,
        &["sh", "-c", &format!("sleep {mark} & while :; do :; done")],
        |c| c["annotations"] = serde_json::json!({"runsbx.timeout": timeout}),
    )
}

/// Processes running `sleep MARK`, waiting up to 10 s for them to go: a
/// killed sandbox's last processes take a moment to be reaped.
fn processes_with(mark: &str) -> Vec<String> {
    kit::settle(
        Duration::from_secs(10),
        kit::POLL,
        || processes_now(mark),
        Vec::is_empty,
    )
}

fn processes_now(mark: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline == format!("sleep {mark} ") {
            found.push(format!("{}: {cmdline}", e.file_name().to_string_lossy()));
        }
    }
    found
}

fn deadline_ends_the_sandbox(fx: Fixture) {
    let mark = format!("{}", 7_000_000 + std::process::id() % 1_000_000);
    // Foreground: `run` ends with the code `runsbx call` gives a timeout.
    let b = spinning(&fx, "fg", "2s", &mark);
    let started = Instant::now();
    let out = fx.run(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    assert_eq!(out.code, 124, "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ended before its deadline"
    );
    assert_eq!(processes_with(&mark), Vec::<String>::new());
    fx.assert_clean();

    // Detached: `state` says why it stopped.
    let b = spinning(&fx, "bg", "1s", &mark);
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c2"])
        .ok();
    fx.wait_status("c2", "stopped");
    let state = fx.run(["state", "c2"]).ok().json();
    assert_eq!(state["annotations"]["runsbx.ended"], "timed_out", "{state}");
    assert_eq!(processes_with(&mark), Vec::<String>::new());
    fx.run(["delete", "c2"]).ok();

    // Bad values and values beyond the profile's deadline: refused, with
    // the annotation named, and nothing left.
    let config = kit::operator_config(
        fx.dir.path(),
        "short",
        "name = \"short\"\n[tmpfs]\n\"/tmp\" = \"16M\"\n[limits]\ntimeout = \"5s\"\n",
    );
    for (i, (timeout, needle)) in [
        ("soon", "is not a duration"),
        ("-2s", "is not a duration"),
        ("10s", "longer than the profile's deadline"),
    ]
    .into_iter()
    .enumerate()
    {
        let b = spinning(&fx, &format!("bad{i}"), timeout, &mark);
        let out = fx.run_with_config(&config, &b, "c3");
        assert_eq!(out.code, 3, "{timeout}: {out:?}");
        assert!(
            out.stderr.contains("runsbx.timeout") && out.stderr.contains(needle),
            "{timeout}: {out:?}"
        );
    }
    // The profile's own deadline applies without an annotation.
    let b = fx.bundle("own", &["sh", "-c", "while :; do :; done"], |_| {});
    fx.run([
        "--config",
        config.to_str().unwrap(),
        "run",
        "--detach",
        "--bundle",
        b.to_str().unwrap(),
        "c4",
    ])
    .ok();
    let report: Value = serde_json::from_str(
        &fs::read_to_string(fx.state.join("@bundles/c4/hardening.json")).unwrap(),
    )
    .unwrap();
    assert!(
        report["attestation"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["layer"] == "deadline" && l["in_force"] == true),
        "{report}"
    );
    fx.run(["delete", "--force", "c4"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, deadline_ends_the_sandbox: deadline_as_root, deadline_rootless);
