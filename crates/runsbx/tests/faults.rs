//! Fault injection: runsbx killed with SIGKILL at random instants of
//! `create`, `start`, `delete` and `call` (its main process, and its whole
//! process group as a terminal or a supervisor kills it), then one
//! `delete --force` (or, for calls, one more call, which sweeps); many
//! calls at once; long runs of calls, cold and pooled. Afterwards nothing
//! may be left on the host: no process, mount, cgroup, id slot, cgroup
//! claim, staged rootfs, state or network namespace. Every kind is
//! counted separately, as the difference between snapshots taken before
//! and after.
//!
//! `RUNSBX_FAULT_KILLS` sets the kills of each kind (default 100),
//! `RUNSBX_FAULT_CALLS` the concurrent calls (default 200, 50 rootless),
//! `RUNSBX_FAULT_SOAK` and `RUNSBX_FAULT_POOL_SOAK` the cold and the
//! pooled calls of the soaks (300 each); hack/faults.sh runs the long mode.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use runsbx_testkit::{self as kit, as_root_and_rootless, Fixture, Who};

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// The fault tests count host resources; they run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n.max(1)
    }
}

fn entries(dir: &str) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                .collect()
        })
        .unwrap_or_default()
}

/// What runsbx could leave on the host, by kind.
fn snapshot(fx: &Fixture) -> BTreeMap<&'static str, BTreeSet<String>> {
    let mut s = BTreeMap::new();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root = fx.dir.path().to_string_lossy().into_owned();
    s.insert(
        "mounts",
        mountinfo
            .lines()
            .filter(|l| l.contains("/run/runsbx-rootfs") || l.contains(&root))
            .map(|l| l.split_whitespace().nth(4).unwrap_or("").to_owned())
            .collect(),
    );
    s.insert(
        "netns",
        mountinfo
            .lines()
            .filter(|l| l.contains(" - nsfs "))
            .map(|l| l.split_whitespace().nth(4).unwrap_or("").to_owned())
            .collect(),
    );
    let mut cgroups = BTreeSet::new();
    for h in entries("/sys/fs/cgroup") {
        cgroups.extend(entries(&format!("{h}/runsbx")));
    }
    s.insert("cgroups", cgroups);
    s.insert("id slots", entries("/run/runsbx-ids"));
    s.insert("cgroup claims", entries("/run/runsbx-cgroups"));
    s.insert("staged rootfs", entries("/run/runsbx-rootfs"));
    s.insert("state", fx.leftovers().into_iter().collect());
    let mut procs = BTreeSet::new();
    let me = std::process::id().to_string();
    // Rootless, a sandbox's processes run as the test user's own ids: its
    // uid and its subordinate range.
    let subordinate = match &fx.who {
        Who::User(u) => kit::subordinate_uids(&u.name),
        Who::Root => None,
    };
    let user_ids = |uid: u32| match &fx.who {
        Who::User(u) => {
            uid == u.uid
                || subordinate.is_some_and(|(start, count)| uid >= start && uid - start < count)
        }
        Who::Root => false,
    };
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if pid.parse::<u32>().is_err() || pid == me {
            continue;
        }
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let uid = kit::host_view_uid(&pid);
        let state = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = state
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        let ours = cmdline.contains(&root)
            || cmdline.contains("youki:")
            || uid.is_some_and(|u| u >= 1_000_000_000 || user_ids(u));
        if ours && !zombie {
            procs.insert(format!("{pid}: {cmdline}"));
        }
    }
    s.insert("processes", procs);
    s
}

/// What `after` holds that `before` did not, by kind; waits up to 30 s for
/// it to drain (watchdogs finish their work after runsbx is gone).
fn leftovers(fx: &Fixture, before: &BTreeMap<&'static str, BTreeSet<String>>) -> Vec<String> {
    kit::settle(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let after = snapshot(fx);
            after
                .iter()
                .flat_map(|(kind, items)| {
                    items
                        .difference(&before[kind])
                        .map(move |i| format!("{kind}: {i}"))
                })
                .collect::<Vec<String>>()
        },
        Vec::is_empty,
    )
}

/// Spawns runsbx with `args` in a process group of its own.
fn spawn(fx: &Fixture, args: &[&str]) -> std::process::Child {
    let mut cmd = fx.cmd(args);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    kit::spawn(&mut cmd)
}

fn kill_after(child: &mut std::process::Child, after: Duration, group: bool) {
    std::thread::sleep(after);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let sig = nix::sys::signal::Signal::SIGKILL;
    let _ = if group {
        nix::sys::signal::killpg(pid, sig)
    } else {
        nix::sys::signal::kill(pid, sig)
    };
    let _ = child.wait();
}

fn kills_leave_nothing(fx: Fixture) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let kills = count("RUNSBX_FAULT_KILLS", 100);
    let mut rng = Lcg(0xfa17 + u64::from(fx.rootless()));
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    let bundle = b.to_str().unwrap();
    // One container made and deleted first, so that runsbx's own
    // directories (state root, @locks, /run/runsbx-*) are in `before`.
    fx.run(["run", "--detach", "--bundle", bundle, "warm"]).ok();
    fx.run(["delete", "--force", "warm"]).ok();
    let before = snapshot(&fx);

    let delete = |id: &str, what: &str| {
        let out = fx.run(["delete", "--force", id]);
        assert_eq!(out.code, 0, "{what}: delete --force {id}: {out:?}");
    };
    for n in 0..kills {
        let id = format!("create{n}");
        let mut child = spawn(&fx, &["create", "--bundle", bundle, &id]);
        kill_after(&mut child, Duration::from_micros(rng.below(40_000)), false);
        delete(&id, "create killed");
    }
    for n in 0..kills {
        let id = format!("start{n}");
        fx.run(["create", "--bundle", bundle, &id]).ok();
        let mut child = spawn(&fx, &["start", &id]);
        kill_after(&mut child, Duration::from_micros(rng.below(10_000)), false);
        delete(&id, "start killed");
    }
    for n in 0..kills {
        let id = format!("delete{n}");
        fx.run(["run", "--detach", "--bundle", bundle, &id]).ok();
        let mut child = spawn(&fx, &["delete", "--force", &id]);
        kill_after(&mut child, Duration::from_micros(rng.below(20_000)), false);
        delete(&id, "delete killed");
    }
    let left = leftovers(&fx, &before);
    assert!(
        left.is_empty(),
        "after killed create/start/delete: {left:#?}"
    );

    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    for group in [false, true] {
        for _ in 0..kills {
            let mut child = spawn(&fx, &["call", "--rootfs", &rootfs, "--", "sleep", "1000"]);
            kill_after(&mut child, Duration::from_micros(rng.below(60_000)), group);
        }
        // The next call sweeps what a killed watchdog could not.
        fx.run(["call", "--rootfs", &rootfs, "--", "true"]).ok();
        let left = leftovers(&fx, &before);
        let how = if group {
            "process group"
        } else {
            "main process"
        };
        assert!(left.is_empty(), "after calls killed ({how}): {left:#?}");
    }
}
as_root_and_rootless!(RUNSBX, kills_leave_nothing: kills_as_root, kills_rootless);

/// Many calls at once: each gets its own sandbox and its own answer, and
/// nothing is left. Every sandbox waits on its stdin until all of them are
/// alive together, so that, as root, each must have had a host id range
/// no other live sandbox had.
fn concurrent_calls(fx: Fixture) {
    use std::io::Write;
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let calls = count("RUNSBX_FAULT_CALLS", if fx.rootless() { 50 } else { 200 });
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    fx.run(["call", "--rootfs", &rootfs, "--", "true"]).ok();
    let before = snapshot(&fx);
    let mark = format!("concurrent-{}", std::process::id());
    let mut children: Vec<_> = (0..calls)
        .map(|n| {
            let mut cmd = fx.cmd([
                "call",
                "--json",
                "--timeout",
                "300s",
                "--stdin",
                "-",
                "--rootfs",
                &rootfs,
                "--",
                "sh",
                "-c",
                &format!("read go; echo {n}; cat /proc/self/uid_map # {mark}"),
            ]);
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            kit::spawn(&mut cmd)
        })
        .collect();
    // The barrier: every sandbox's shell is running, seen from the host.
    kit::wait_until(
        &format!("all {calls} sandboxes alive at once"),
        Duration::from_secs(240),
        || sandboxes_with(&mark) == calls,
    );
    for child in &mut children {
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }
    let mut maps = BTreeSet::new();
    for (n, child) in children.into_iter().enumerate() {
        let out = kit::Out::of(child.wait_with_output().unwrap());
        assert_eq!(out.code, 0, "call {n}: {out:?}");
        let r = out.json();
        let stdout = r["stdout"]["data"].as_str().unwrap().to_owned();
        let mut lines = stdout.lines();
        assert_eq!(
            lines.next(),
            Some(n.to_string().as_str()),
            "call {n}: {stdout}"
        );
        maps.insert(lines.next().unwrap_or("").to_owned());
    }
    if matches!(fx.who, Who::Root) {
        // As root every sandbox had its own host id range.
        assert_eq!(maps.len(), calls, "shared id ranges: {maps:?}");
    }
    let left = leftovers(&fx, &before);
    assert!(left.is_empty(), "after {calls} concurrent calls: {left:#?}");
    assert!(Path::new(&rootfs).exists());
}

/// How many processes on the host run a sandbox's shell marked `mark`
/// (their command line; runsbx's own name it too, after `--`, so only the
/// shells, whose first word is `sh`, count).
fn sandboxes_with(mark: &str) -> usize {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            cmdline.starts_with("sh\0-c\0") && cmdline.contains(mark)
        })
        .count()
}
as_root_and_rootless!(RUNSBX, concurrent_calls: concurrent_as_root, concurrent_rootless);

/// Calls one after another (`RUNSBX_FAULT_SOAK`, default 300): each
/// answers, and nothing accumulates.
fn soak(fx: Fixture) {
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let calls = count("RUNSBX_FAULT_SOAK", 300);
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    fx.run(["call", "--rootfs", &rootfs, "--", "true"]).ok();
    let before = snapshot(&fx);
    for n in 0..calls {
        let out = fx.run(["call", "--rootfs", &rootfs, "--", "echo", &n.to_string()]);
        assert_eq!(
            (out.code, out.stdout.trim()),
            (0, n.to_string().as_str()),
            "call {n}: {out:?}"
        );
    }
    let left = leftovers(&fx, &before);
    assert!(left.is_empty(), "after a soak of {calls} calls: {left:#?}");
}
as_root_and_rootless!(RUNSBX, soak: soak_as_root, soak_rootless);

/// Pooled calls through `runsbx serve`, two at a time
/// (`RUNSBX_FAULT_POOL_SOAK`, default 300; 10,000 in hack/faults.sh):
/// each is warm and answers, and once serve has ended nothing of its
/// sandboxes is left.
fn pool_soak(fx: Fixture) {
    use std::io::{BufRead, BufReader, Write};

    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let calls = count("RUNSBX_FAULT_POOL_SOAK", 300);
    let rootfs = kit::rootfs().to_str().unwrap().to_owned();
    let before = snapshot(&fx);
    let mut cmd = fx.cmd(["serve", "--size=4", "--rootfs", &rootfs]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut serve = kit::spawn(&mut cmd);
    let mut to = serve.stdin.take().unwrap();
    let mut from = BufReader::new(serve.stdout.take().unwrap());
    let mut send = |n: usize| {
        // The pool's rootfs, or the request does not fit and runs cold.
        let argv = ["--json", "--rootfs", &rootfs, "--", "echo", &n.to_string()];
        let line = serde_json::json!({"id": n, "argv": argv}).to_string();
        writeln!(to, "{line}").unwrap();
        to.flush().unwrap();
    };
    let mut sent = 0;
    let mut answered = BTreeSet::new();
    while sent < calls.min(2) {
        send(sent);
        sent += 1;
    }
    for _ in 0..calls {
        let mut line = String::new();
        from.read_line(&mut line).unwrap();
        let reply: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?}: {e}"));
        let n = reply["id"].as_u64().unwrap_or_else(|| panic!("{reply}"));
        assert!(answered.insert(n), "call {n} answered twice: {reply}");
        assert_eq!(
            (&reply["warm"], &reply["result"]["exit_code"]),
            (&serde_json::json!(true), &serde_json::json!(0)),
            "call {n}: {reply}"
        );
        assert_eq!(
            reply["result"]["stdout"]["data"],
            format!("{n}\n"),
            "{reply}"
        );
        if sent < calls {
            send(sent);
            sent += 1;
        }
    }
    // serve ends at the end of its stdin, once its sandboxes are gone.
    drop(to);
    let status = serve.wait().unwrap();
    assert!(status.success(), "runsbx serve ended with {status}");
    let left = leftovers(&fx, &before);
    assert!(left.is_empty(), "after {calls} pooled calls: {left:#?}");
}
as_root_and_rootless!(RUNSBX, pool_soak: pool_soak_as_root, pool_soak_rootless);
