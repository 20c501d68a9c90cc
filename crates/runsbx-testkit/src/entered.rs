//! What every process that enters a sandbox after its init is checked
//! against, whoever sends it in (`runsbx exec`, podman, docker, ctr, a
//! CRI ExecSync).

use std::fs;
use std::process::{Child, Command};

use crate::command::Out;

/// The init of a sandbox that other processes enter later: it records its
/// own uid_map and makes a file, then waits.
pub const ENTERED_INIT: &str = "probe bind 80 > /tmp/init-bind; echo init > /tmp/by-init; \
     cat /proc/self/uid_map > /tmp/init-map; exec sleep 1000";

/// What a process that entered a sandbox whose init ran [`ENTERED_INIT`]
/// reports; [`assert_entered_output`] reads it.
pub const ENTERED_PROBE: &str = "echo self $(cat /proc/self/uid_map); \
     echo init $(cat /tmp/init-map); echo init-$(cat /tmp/init-bind); probe status; \
     probe bind 80; \
     probe syscalls | grep socket_raw_inet; probe append /tmp/by-init; probe ifaces; \
     echo procs $(cat /proc/[0-9]*/cmdline | tr '\\0' ' ')";

/// A host process whose command line the sandbox must never see; killed
/// when dropped.
pub struct Canary {
    child: Child,
    pub mark: String,
}

impl Canary {
    pub fn start() -> Self {
        let mark = format!("{}", 8_000_000 + std::process::id() % 1_000_000);
        let child = Command::new("sleep").arg(&mark).spawn().unwrap();
        Self { child, mark }
    }
}

impl Drop for Canary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that the process that printed [`ENTERED_PROBE`] (its `stdout`)
/// was held to the sandbox as its init is: the init's uid_map (so its user
/// namespace, never the host's), no capabilities, no_new_privs, seccomp,
/// a port below 1024 only if the init may bind one (docker's spec lowers
/// `net.ipv4.ip_unprivileged_port_start` in the sandbox's own network), no
/// raw socket, write access to the init's files, only `lo`, and none of
/// the host's processes (`canary`).
pub fn assert_entered_output(stdout: &str, canary: &Canary) {
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line: {stdout}"))
            .to_owned()
    };
    let (own, init) = (line("self "), line("init "));
    assert_eq!(own, init, "uid_map differs from the init's: {stdout}");
    assert_ne!(
        own, "0 0 4294967295",
        "in the host's user namespace: {stdout}"
    );
    let bind = stdout
        .lines()
        .find(|l| l.starts_with("bind "))
        .unwrap_or_else(|| panic!("no bind line: {stdout}"));
    assert_eq!(
        bind,
        line("init-"),
        "a port below 1024 differs from the init's: {stdout}"
    );
    for want in [
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "socket_raw_inet EPERM",
        "append ok",
    ] {
        assert!(
            stdout.lines().any(|l| l == want),
            "{want:?} missing: {stdout}"
        );
    }
    let ifaces: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("if ") || l.starts_with("addr "))
        .collect();
    assert_eq!(ifaces, ["if lo", "addr lo 127.0.0.1"], "{stdout}");
    let procs = line("procs ");
    assert!(
        procs.contains("sleep 1000"),
        "the init is not visible: {stdout}"
    );
    assert!(
        !procs.contains(&canary.mark),
        "a host process is visible: {stdout}"
    );
}

/// The real uid and the cgroups of host process `pid`.
pub fn host_view(pid: i32) -> (u32, String) {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap();
    let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    (uid, cgroup)
}

/// A number no other test of this run uses, for `sleep MARK` processes
/// that a test finds on the host by their command line.
pub fn unique_mark() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!(
        "{}",
        6_000_000 + (std::process::id() % 10_000) * 100 + n % 100
    )
}

/// The host pid of the one process running exactly `sleep MARK`, waiting
/// up to 10 s for it to appear.
pub fn pid_of_sleep(mark: &str) -> i32 {
    let want = format!("sleep\0{mark}\0");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let found: Vec<i32> = fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let pid = e.file_name().to_str()?.parse().ok()?;
                (fs::read(e.path().join("cmdline")).ok()? == want.as_bytes()).then_some(pid)
            })
            .collect();
        match found.as_slice() {
            [pid] => return *pid,
            [] if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            other => panic!("`sleep {mark}` processes: {other:?}"),
        }
    }
}

/// [`assert_entered_output`] of a command's output, where the init may
/// bind no port below 1024 either (runsbx's own specs, podman's and
/// containerd's; not docker's).
pub fn assert_entered(out: &Out, canary: &Canary) {
    assert_entered_output(&out.stdout, canary);
    assert!(
        out.stdout.lines().any(|l| l == "bind EACCES"),
        "a port below 1024 was bound: {out:?}"
    );
}

/// The real uid of host process `pid` (a /proc entry name), if readable.
pub fn host_view_uid(pid: &str) -> Option<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
