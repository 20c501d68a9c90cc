//! The warm pool (`runsbx serve`): a pooled call is a cold call's equal
//! (the same attestation, the same observations from inside), a sandbox
//! is never handed out twice, requests that do not fit run cold, and the
//! pool leaves nothing behind: not after many calls, not when its owner
//! is SIGKILLed. As root and rootless.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

use runsbx_testkit::{self as kit, as_root_and_rootless, Fixture, Who};
use serde_json::{json, Value};

const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

/// What a sandbox shows from inside: its ids, privileges, processes,
/// files, network, limits and environment.
const PROBE: &str = "id; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
    ls /proc; ls -A /tmp /workspace; cat /proc/net/dev | cut -d: -f1; ulimit -n -u; \
    cat /proc/self/mountinfo | cut -d' ' -f5 | sort; env | sort; pwd";

/// A `runsbx serve` of the fixture's, on the test rootfs.
struct Serve {
    child: Child,
    to: Option<ChildStdin>,
    from: BufReader<ChildStdout>,
    next_id: u64,
}

impl Serve {
    fn start(fx: &Fixture, size: u32) -> Self {
        let mut cmd = fx.cmd(["serve", "--size", &size.to_string(), "--rootfs"]);
        cmd.arg(kit::rootfs());
        Self::spawn(cmd)
    }

    /// A new session of the fixture's and its pool; the session's name.
    fn of_new_session(fx: &Fixture) -> (String, Self) {
        let name = format!("pool-{}", kit::unique_mark());
        let out = fx.run(["session", "create", &name]);
        assert_eq!(out.code, 0, "{out:?}");
        (
            name.clone(),
            Self::spawn(fx.cmd(["serve", "--session", &name])),
        )
    }

    /// `cmd`, a `runsbx serve`, speaking JSON Lines with the test.
    fn spawn(mut cmd: std::process::Command) -> Self {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a test may kill it with its workers.
            .process_group(0);
        let mut child = kit::spawn(&mut cmd);
        let to = child.stdin.take();
        let from = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            to,
            from,
            next_id: 1,
        }
    }

    /// Sends requests (runsbx call's arguments) without waiting.
    fn send(&mut self, argv: &[&str], stdin: Option<&str>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let stdin = stdin.map(|s| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(s)
        });
        let line = json!({"id": id, "argv": argv, "stdin": stdin}).to_string();
        let to = self.to.as_mut().unwrap();
        writeln!(to, "{line}").unwrap();
        to.flush().unwrap();
        id
    }

    fn reply(&mut self) -> Value {
        let mut line = String::new();
        self.from.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("reply {line:?}: {e}"))
    }

    /// One request, and its reply.
    fn call(&mut self, argv: &[&str]) -> Value {
        let id = self.send(argv, None);
        let reply = self.reply();
        assert_eq!(reply["id"], id, "{reply}");
        reply
    }

    /// Closes the pool (its stdin) and waits for it.
    fn close(mut self) {
        drop(self.to.take());
        let status = wait_within(&mut self.child, Duration::from_secs(60));
        assert_eq!(status.code(), Some(0), "runsbx serve ended with {status:?}");
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        drop(self.to.take());
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_secs(2));
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

fn wait_within(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < limit, "runsbx serve did not end");
        std::thread::sleep(kit::POLL);
    }
}

/// `call` arguments on the test rootfs, `sh -c SCRIPT`.
fn sh_args<'a>(rootfs: &'a str, opts: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut a = vec!["--json", "--rootfs", rootfs];
    a.extend(opts);
    a.extend(["--", "sh", "-c", script]);
    a
}

fn rootfs_arg() -> String {
    kit::rootfs().to_string_lossy().into_owned()
}

/// The attestation with each sandbox's own host id range taken out (as
/// root every sandbox has its own).
fn attestation_shape(result: &Value) -> Vec<Value> {
    let mut layers = result["attestation"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for l in &mut layers {
        if l["layer"] == "user_namespace" {
            let detail = l["detail"].as_str().unwrap_or_default();
            l["detail"] = Value::from(strip_host_ids(detail));
        }
    }
    layers
}

fn strip_host_ids(detail: &str) -> String {
    match detail.find("host ids ") {
        Some(i) => {
            let rest = &detail[i + "host ids ".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '-'))
                .unwrap_or(rest.len());
            format!("{}host ids N-M{}", &detail[..i], &rest[end..])
        }
        None => detail.to_owned(),
    }
}

fn host_ids(result: &Value) -> Option<String> {
    result["attestation"]
        .as_array()?
        .iter()
        .find(|l| l["layer"] == "user_namespace")?["detail"]
        .as_str()
        .map(str::to_owned)
}

fn pooled_and_cold_calls_agree(fx: Fixture) {
    let rootfs = rootfs_arg();
    let args = sh_args(&rootfs, &["--env", "PROBE=1"], PROBE);
    let cold = fx.run(std::iter::once("call").chain(args.iter().copied()));
    assert_eq!(cold.code, 0, "{cold:?}");
    let cold = cold.json();
    let mut pool = Serve::start(&fx, 1);
    let warm = pool.call(&args);
    assert_eq!(warm["warm"], true, "the request fits the pool: {warm}");
    let w = &warm["result"];
    assert_eq!(w["status"], "exited", "{warm}");
    assert_eq!(
        w["stdout"]["data"], cold["stdout"]["data"],
        "what the probe saw"
    );
    assert_eq!(w["stderr"]["data"], cold["stderr"]["data"]);
    assert_eq!(attestation_shape(w), attestation_shape(&cold));
    assert_eq!(w["limits"], cold["limits"]);
    assert_eq!(w["command"], cold["command"]);
    assert_eq!(warm["exit_code"], 0);
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, pooled_and_cold_calls_agree: agree_as_root, agree_rootless);

fn a_sandbox_runs_one_call(fx: Fixture) {
    let rootfs = rootfs_arg();
    // Each call leaves a file in /tmp and /workspace and a process
    // behind; the next must see none of them.
    let script = "ls -A /tmp /workspace; cat /proc/[0-9]*/comm | grep -c sleep; \
        touch /tmp/left /workspace/left; (sleep 1000 &) ; echo done";
    let mut pool = Serve::start(&fx, 2);
    let mut ids = BTreeSet::new();
    let mut ranges = BTreeSet::new();
    for _ in 0..6 {
        let r = pool.call(&sh_args(&rootfs, &[], script));
        assert_eq!(r["warm"], true, "{r}");
        let res = &r["result"];
        assert_eq!(
            res["stdout"]["data"], "/tmp:\n\n/workspace:\n0\ndone\n",
            "a fresh sandbox: nothing in /tmp or /workspace, no other process: {r}"
        );
        assert!(
            ids.insert(res["id"].to_string()),
            "a call id came twice: {r}"
        );
        if !fx.rootless() {
            assert!(
                ranges.insert(host_ids(res).unwrap()),
                "host ids reused: {r}"
            );
        }
    }
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_sandbox_runs_one_call: once_as_root, once_rootless);

/// A pool's workers log where and as `runsbx serve` was told to, and a
/// warm call's steps (runsbx's phase events, which hack/phases.py reads)
/// come in the order they happen: the sandbox built, waiting, then the
/// request, its command and the reply, then the teardown.
fn workers_log_with_serve_and_mark_each_step(fx: Fixture) {
    let rootfs = rootfs_arg();
    let log = fx
        .dir
        .path()
        .join(format!("serve-{}.log", kit::unique_mark()));
    let log_arg = log.to_string_lossy().into_owned();
    let mut cmd = fx.cmd([
        "--log-format",
        "json",
        "--log",
        &log_arg,
        "serve",
        "--size",
        "1",
        "--rootfs",
        &rootfs,
    ]);
    cmd.env("RUNSBX_LOG", "runsbx::phase=debug");
    let mut pool = Serve::spawn(cmd);
    let reply = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(reply["warm"], true, "{reply}");
    assert_eq!(reply["result"]["exit_code"], 0, "{reply}");
    pool.close();
    let text = fs::read_to_string(&log).unwrap();
    let mut steps: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for line in text.lines() {
        let event: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        assert!(event["time"].is_string(), "{line}");
        let msg = event["msg"].as_str().unwrap();
        let (step, pid) = msg.rsplit_once(" pid=").unwrap_or_else(|| panic!("{line}"));
        steps
            .entry(pid.parse().unwrap())
            .or_default()
            .push(step.to_owned());
    }
    let served: Vec<&Vec<String>> = steps
        .values()
        .filter(|s| s.iter().any(|step| step == "request read"))
        .collect();
    assert_eq!(served.len(), 1, "one worker served the request: {steps:?}");
    let mut served = served[0].clone();
    // As root, the pool's zygote forks each worker (serve/zygote.rs);
    // rootless, serve spawns it, and it starts again in a user namespace
    // of its own (the same process, exec'd again).
    let first = if matches!(fx.who, Who::Root) {
        "forked"
    } else {
        assert_eq!(served[..2], ["process up", "process up"], "{text}");
        served.remove(0);
        "process up"
    };
    assert_eq!(
        served,
        [
            first,
            "resolved",
            "namespaced",
            "workspace mounted",
            "hardened",
            "rootfs staged, cgroups made",
            "built (libcontainer)",
            "network up",
            "created",
            "command started",
            "ready",
            "request read",
            "fitted",
            "command execed",
            "command ended",
            "replied",
            "removed",
            "done",
        ],
        "{text}"
    );
    // serve itself, and the worker that replaced the used one.
    assert!(steps.len() >= 2, "{steps:?}");
}
as_root_and_rootless!(RUNSBX, workers_log_with_serve_and_mark_each_step: steps_as_root, steps_rootless);

/// A command larger than the stub's socket holds at once (three
/// variables of 120,000 bytes, one message with the header and the fd)
/// reaches it whole.
fn a_large_command_reaches_the_stub(fx: Fixture) {
    let rootfs = rootfs_arg();
    let values: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|c| format!("{}={}", c.to_uppercase(), c.repeat(120_000)))
        .collect();
    let mut opts = Vec::new();
    for v in &values {
        opts.extend(["--env", v.as_str()]);
    }
    let script = "echo ${#A} ${#B} ${#C}; case $C in *cc) echo whole;; esac";
    let mut pool = Serve::start(&fx, 1);
    let r = pool.call(&sh_args(&rootfs, &opts, script));
    assert_eq!(r["warm"], true, "the request fits the pool: {r}");
    assert_eq!(
        r["result"]["stdout"]["data"], "120000 120000 120000\nwhole\n",
        "{r}"
    );
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_large_command_reaches_the_stub: large_as_root, large_rootless);

/// A waiting sandbox's stub holds its stdio and the socket its command
/// comes on: nothing of what runsbx had open when it built the sandbox.
/// On x86_64 it waits in runsbx-stub, exec'd from a sealed memfd, whose
/// few pages are all the command's exec has to tear down.
fn a_waiting_stub_holds_only_its_socket(fx: Fixture) {
    let pool = Serve::start(&fx, 1);
    let serve = pool.child.id() as i32;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let waits_in_stub = cfg!(target_arch = "x86_64");
    let mut held = Vec::new();
    let stub = loop {
        let stub = descendants(serve).into_iter().find(|pid| is_stub(*pid));
        if let Some(stub) = stub {
            held = fds_of(stub);
            // While libcontainer builds it, the init holds a dozen more.
            if held.len() == 4 {
                break stub;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stub of the pool came down to 4 fds in 30 s; the last one seen held {held:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let numbers: Vec<i32> = held.iter().map(|(fd, _)| *fd).collect();
    assert_eq!(&numbers[..3], [0, 1, 2], "{held:?}");
    assert!(held[3].1.starts_with("socket:"), "{held:?}");
    if waits_in_stub {
        let status = fs::read_to_string(format!("/proc/{stub}/status")).unwrap();
        let rss_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(u64::MAX);
        // A fork of runsbx holds megabytes.
        assert!(
            rss_kb <= 256,
            "the waiting stub holds {rss_kb} kB:\n{status}"
        );
    }
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_waiting_stub_holds_only_its_socket: stub_fds_as_root, stub_fds_rootless);

/// As root, a pool's workers are forked by its zygote (serve/zygote.rs),
/// each of them serve's own child, with its sandbox below it; once the
/// zygote is gone, serve spawns them and the pool serves on; the zygote
/// ends with serve. Rootless, there is no zygote: serve spawns each
/// worker.
fn a_root_pool_forks_its_workers(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 1);
    let serve = pool.child.id() as i32;
    // serve's children, by what they run: the zygote has no children, a
    // ready worker its sandbox's stub.
    let children = || -> Vec<(i32, String, bool)> {
        let all = descendants(serve);
        all.iter()
            .filter(|pid| parent_of(**pid) == Some(serve))
            .map(|pid| {
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let words: Vec<String> = cmdline
                    .split(|b| *b == 0)
                    .map(|w| String::from_utf8_lossy(w).into_owned())
                    .collect();
                let runs = words
                    .iter()
                    .find(|w| w.starts_with("pool-"))
                    .cloned()
                    .unwrap_or_default();
                let has_stub = descendants(*pid).into_iter().any(is_stub);
                (*pid, runs, has_stub)
            })
            .collect()
    };
    let spawned =
        |kids: &[(i32, String, bool)]| kids.len() == 1 && kids[0].1 == "pool-worker" && kids[0].2;
    if fx.rootless() {
        kit::wait_until(
            "serve's first spawned worker, waiting",
            Duration::from_secs(30),
            || spawned(&children()),
        );
        let r = pool.call(&sh_args(&rootfs, &[], "true"));
        assert_eq!(r["warm"], true, "{r}");
        kit::wait_until(
            "the next spawned worker, waiting",
            Duration::from_secs(30),
            || spawned(&children()),
        );
        pool.close();
        fx.assert_clean();
        return;
    }
    let settled = |kids: &[(i32, String, bool)], worker: &str| {
        kids.len() == 2
            && kids.iter().any(|(_, runs, stub)| runs == worker && *stub)
            && kids
                .iter()
                .any(|(_, runs, stub)| runs == "pool-zygote" && !*stub)
    };
    kit::wait_until(
        "serve's zygote and its first forked worker, waiting",
        Duration::from_secs(30),
        || settled(&children(), "pool-zygote"),
    );
    let kids = children();
    let zygote = kids.iter().find(|(_, _, stub)| !*stub).unwrap().0;
    let r = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["warm"], true, "{r}");
    kit::wait_until(
        "the next forked worker, waiting",
        Duration::from_secs(30),
        || settled(&children(), "pool-zygote"),
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(zygote),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The worker that was ready serves this call; its replacement finds
    // the zygote gone, and is spawned.
    let r = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["warm"], true, "{r}");
    kit::wait_until("a spawned worker, waiting", Duration::from_secs(30), || {
        spawned(&children())
    });
    let r = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["warm"], true, "{r}");
    pool.close();
    fx.assert_clean();
}

as_root_and_rootless!(RUNSBX, a_root_pool_forks_its_workers: forked_as_root, spawned_rootless);

fn parent_of(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `pid` is a pool sandbox's init, where the command is awaited.
fn is_stub(pid: i32) -> bool {
    match fs::read_link(format!("/proc/{pid}/exe")) {
        Ok(exe) if cfg!(target_arch = "x86_64") => {
            exe.to_str() == Some("/memfd:runsbx-stub (deleted)")
        }
        _ => comm_of(pid) == "youki:[2:INIT]",
    }
}

/// Every process below `ancestor`.
fn descendants(ancestor: i32) -> Vec<i32> {
    let parents: Vec<(i32, i32)> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = fs::read_to_string(e.path().join("stat")).ok()?;
            // The parent is the second field after the parenthesised name.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?;
            Some((pid, ppid.parse().ok()?))
        })
        .collect();
    let mut found = vec![ancestor];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.split_off(1)
}

fn comm_of(pid: i32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim_end()
        .to_owned()
}

/// A process's fds and what each refers to, by number.
fn fds_of(pid: i32) -> Vec<(i32, String)> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    let mut fds: Vec<(i32, String)> = dir
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_str()?.parse().ok()?;
            let target = fs::read_link(e.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect();
    fds.sort();
    fds
}

/// A pooled call's seccomp denials and hints are reported in its own
/// result, and only in its own: the next pooled call, in the next sandbox,
/// has none.
fn pooled_calls_report_their_seccomp_denials(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 1);
    let r = pool.call(&sh_args(
        &rootfs,
        &[],
        "mount -t tmpfs none /tmp; echo rc=$?; nc 127.0.0.1 9 </dev/null; echo nc=$?",
    ));
    assert_eq!(r["warm"], true, "{r}");
    // EPERM, as without the report: busybox says "permission denied".
    assert_eq!(r["result"]["stdout"]["data"], "rc=1\nnc=1\n", "{r}");
    let stderr = r["result"]["stderr"]["data"].as_str().unwrap();
    assert!(stderr.contains("permission denied"), "{r}");
    let denied: Vec<(String, String)> = r["result"]["seccomp"]["denied"]
        .as_array()
        .unwrap_or_else(|| panic!("no seccomp report: {r}"))
        .iter()
        .map(|d| {
            (
                d["syscall"].as_str().unwrap().to_owned(),
                d["process"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        denied.contains(&("mount".to_owned(), "mount".to_owned())),
        "{r}"
    );
    // The refused connect is explained, as in a cold call.
    let hint = &r["result"]["hints"]["connects"][0];
    assert_eq!(
        (&hint["kind"], &hint["destination"], &hint["process"]),
        (
            &json!("loopback_is_own"),
            &json!("127.0.0.1:9"),
            &json!("nc")
        ),
        "{r}"
    );
    let r = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["seccomp"]["denied"], json!([]), "{r}");
    assert_eq!(r["result"]["hints"]["connects"], json!([]), "{r}");
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, pooled_calls_report_their_seccomp_denials: seccomp_as_root, seccomp_rootless);

/// A template that a cold call refuses ends the pool before its first
/// sandbox, whether or not its owner still holds its stdin: the call's
/// own error, said once however many sandboxes were asked for, the call's
/// exit code for it (125), and nothing left.
fn a_refused_template_ends_the_pool(fx: Fixture) {
    let missing = fx.dir.path().join("no-such-rootfs");
    let missing = missing.to_str().unwrap();
    let out = fx.run(["serve", "--size", "3", "--rootfs", missing]);
    assert_eq!(out.code, 125, "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    let first = out.stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("runsbx: error: --rootfs "), "{out:?}");
    assert!(first.contains("no-such-rootfs"), "{out:?}");
    assert_eq!(out.stderr.matches("no-such-rootfs").count(), 1, "{out:?}");
    fx.assert_clean();
    // Its stdin open: it ends all the same, at once.
    let mut cmd = fx.cmd(["serve", "--rootfs", missing]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = kit::spawn(&mut cmd);
    let status = wait_within(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(125), "{status:?}");
    drop(child.stdin.take());
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_refused_template_ends_the_pool: refused_template_as_root, refused_template_rootless);

/// `--socket`: requests on a unix socket only its owner may use (0600),
/// one serve per path, and SIGTERM ends serve and removes its socket.
/// Anything else at the path (someone's file, a link) is refused and left
/// as it was; only a stale socket, nobody listening, is replaced.
fn serve_on_a_socket(fx: Fixture) {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let rootfs = rootfs_arg();
    let file = fx.dir.path().join("notes.txt");
    fs::write(&file, "keep me\n").unwrap();
    let link = fx.dir.path().join("link.sock");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    for taken in [&file, &link] {
        let taken = taken.to_str().unwrap();
        let mut cmd = fx.cmd(["serve", "--socket", taken, "--rootfs", &rootfs]);
        let out = kit::output_within(&mut cmd, Duration::from_secs(30));
        assert_eq!(out.code, 125, "{out:?}");
        assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
        assert!(
            out.stderr.starts_with("runsbx: error: --socket ")
                && out.stderr.contains("exists and is not a socket"),
            "{out:?}"
        );
    }
    // Before, serve took the file for a stale socket and removed it.
    assert_eq!(fs::read_to_string(&file).unwrap(), "keep me\n");
    assert!(fs::symlink_metadata(&link).unwrap().is_symlink());
    fx.assert_clean();

    let path = fx.dir.path().join("serve.sock");
    let socket = path.to_str().unwrap();
    // A stale socket (its serve was SIGKILLed, say) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let mut cmd = fx.cmd([
        "serve", "--size", "1", "--socket", socket, "--rootfs", &rootfs,
    ]);
    cmd.stdin(Stdio::null()).process_group(0);
    let mut serve = kit::spawn(&mut cmd);
    let start = std::time::Instant::now();
    let conn = loop {
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(conn) => break conn,
            Err(e) => assert!(start.elapsed() < Duration::from_secs(30), "{e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let meta = fs::symlink_metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let argv = [
        "--json",
        "--rootfs",
        &rootfs,
        "--",
        "echo",
        "over the socket",
    ];
    let line = json!({"id": 1, "argv": argv, "stdin": null}).to_string();
    writeln!(&conn, "{line}").unwrap();
    let mut reply = String::new();
    BufReader::new(&conn).read_line(&mut reply).unwrap();
    let r: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(r["id"], 1, "{r}");
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["result"]["stdout"]["data"], "over the socket\n", "{r}");
    drop(conn);
    // One serve per path.
    let mut cmd = fx.cmd(["serve", "--socket", socket, "--rootfs", &rootfs]);
    let out = kit::output_within(&mut cmd, Duration::from_secs(30));
    assert_eq!(out.code, 125, "{out:?}");
    assert!(
        out.stderr.contains("another runsbx serve listens there"),
        "{out:?}"
    );
    let pid = nix::unistd::Pid::from_raw(serve.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = wait_within(&mut serve, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(fs::symlink_metadata(&path).is_err(), "the socket is left");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, serve_on_a_socket: socket_as_root, socket_rootless);

fn requests_that_do_not_fit_run_cold(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 1);
    // Stdin and files fit the pool's sandbox.
    let id = pool.send(
        &["--json", "--stdin=-", "--rootfs", &rootfs, "--", "cat"],
        Some("from stdin\n"),
    );
    let r = pool.reply();
    assert_eq!(r["id"], id);
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["stdout"]["data"], "from stdin\n", "{r}");
    let input = fx.dir.path().join("in.txt");
    fs::write(&input, "an input\n").unwrap();
    if let kit::Who::User(u) = &fx.who {
        nix::unistd::chown(&input, Some(u.uid.into()), None).unwrap();
    }
    let spec = format!("{}:in.txt", input.display());
    let r = pool.call(&sh_args(
        &rootfs,
        &["--input", &spec],
        "cat in.txt; ls -ln in.txt | cut -c1-10",
    ));
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(
        r["result"]["stdout"]["data"], "an input\n-rw-r--r--\n",
        "{r}"
    );
    // Another memory limit: another sandbox, built cold.
    let r = pool.call(&sh_args(&rootfs, &["--memory", "100M"], "true"));
    assert_eq!(r["warm"], false, "{r}");
    if !fx.rootless() {
        assert_eq!(r["result"]["limits"]["memory_bytes"], 100 << 20, "{r}");
    }
    // A command the rootfs lacks: the cold call's own error.
    let r = pool.call(&["--json", "--rootfs", &rootfs, "--", "no-such-command"]);
    assert_eq!(r["warm"], false, "{r}");
    assert_eq!(r["result"]["status"], "error", "{r}");
    let cold = fx.run([
        "call",
        "--json",
        "--rootfs",
        &rootfs,
        "--",
        "no-such-command",
    ]);
    assert_eq!(r["exit_code"], cold.code, "{r} / {cold:?}");
    assert_eq!(r["result"]["error"]["kind"], cold.json()["error"]["kind"]);
    // Not a request at all.
    let to = pool.to.as_mut().unwrap();
    writeln!(to, "not json").unwrap();
    to.flush().unwrap();
    let r = pool.reply();
    assert!(r["error"].as_str().unwrap().contains("not JSON"), "{r}");
    // JSON, but not a request: each told what is wrong, by its id.
    for (line, id, said) in [
        ("[1, 2]", Value::Null, "not a JSON object"),
        (r#"{"id": 71}"#, json!(71), "has no \"argv\""),
        (
            r#"{"id": 72, "argv": "true"}"#,
            json!(72),
            "\"argv\" is not an array of strings",
        ),
        (
            r#"{"id": 73, "argv": ["--", 1]}"#,
            json!(73),
            "\"argv\" is not an array of strings",
        ),
    ] {
        let to = to_of(&mut pool);
        writeln!(to, "{line}").unwrap();
        to.flush().unwrap();
        let r = pool.reply();
        assert_eq!(r["id"], id, "{line}: {r}");
        assert!(r["error"].as_str().unwrap().contains(said), "{line}: {r}");
    }
    // And the pool still serves.
    let r = pool.call(&sh_args(&rootfs, &[], "echo still"));
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["stdout"]["data"], "still\n");
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, requests_that_do_not_fit_run_cold: misfits_as_root, misfits_rootless);

/// Many calls, several at a time: afterwards no state, process, mount,
/// cgroup or id range is left.
fn many_calls_leave_nothing(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 2);
    let n = 60;
    let sent: BTreeSet<u64> = (0..n)
        .map(|i| {
            let script = format!("echo {i}");
            pool.send(&sh_args(&rootfs, &[], &script), None)
        })
        .collect();
    let mut got = BTreeSet::new();
    for _ in 0..n {
        let r = pool.reply();
        assert_eq!(r["result"]["status"], "exited", "{r}");
        assert_eq!(r["warm"], true, "{r}");
        got.insert(r["id"].as_u64().unwrap());
    }
    assert_eq!(got, sent);
    pool.close();
    fx.assert_clean();
    kit::wait_until(
        "the pool's cgroups and id ranges to go",
        Duration::from_secs(10),
        || host_resources(&fx).is_empty(),
    );
}
as_root_and_rootless!(RUNSBX, many_calls_leave_nothing: no_leaks_as_root, no_leaks_rootless);

/// SIGKILL of the pool's owner and all its workers: their watchdogs and
/// the next start remove every sandbox.
fn sigkill_leaves_nothing(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 2);
    let r = pool.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["warm"], true, "{r}");
    if !fx.rootless() {
        // What the check below looks for is there while the pool runs.
        kit::wait_until(
            "the refilled pool's cgroups",
            Duration::from_secs(20),
            || host_resources(&fx).len() >= 4,
        );
    }
    // A call in flight, and sandboxes waiting.
    pool.send(&sh_args(&rootfs, &[], "sleep 1000"), None);
    std::thread::sleep(Duration::from_millis(500));
    let group = nix::unistd::Pid::from_raw(-(pool.child.id() as i32));
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = pool.child.wait();
    drop(pool);
    let mut next = Serve::start(&fx, 1);
    let r = next.call(&sh_args(&rootfs, &[], "true"));
    assert_eq!(r["result"]["status"], "exited", "{r}");
    next.close();
    killed_pool_is_gone(&fx);
}
as_root_and_rootless!(RUNSBX, sigkill_leaves_nothing: sigkill_as_root, sigkill_rootless);

/// SIGKILL of the pool's owner alone (its workers live on): the calls in
/// flight, warm and cold, end at once, not at their deadline, since
/// nobody can get their results, and the waiting sandboxes are let go;
/// nothing is left.
fn owner_sigkill_ends_its_calls(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 2);
    // Its own in each test process and fixture (root and rootless run at
    // once).
    let mark = |kind: u8| {
        format!(
            "8{kind}{}{:06}",
            u8::from(fx.rootless()),
            std::process::id() % 1_000_000
        )
    };
    let (warm, cold) = (mark(1), mark(2));
    pool.send(&sh_args(&rootfs, &[], &format!("sleep {warm}")), None);
    // Another pids limit than the pool's: run cold.
    pool.send(
        &sh_args(&rootfs, &["--pids=77"], &format!("sleep {cold}")),
        None,
    );
    kit::wait_until("the calls' sleeps to run", Duration::from_secs(20), || {
        have_process_with(&warm) && have_process_with(&cold)
    });
    pool.child.kill().unwrap();
    let _ = pool.child.wait();
    kit::wait_until(
        "the orphaned calls' sleeps to end",
        Duration::from_secs(10),
        || !have_process_with(&warm) && !have_process_with(&cold),
    );
    drop(pool);
    killed_pool_is_gone(&fx);
}
as_root_and_rootless!(RUNSBX, owner_sigkill_ends_its_calls: owner_sigkill_as_root, owner_sigkill_rootless);

/// Waits until a killed pool's sandboxes are gone (their watchdogs, or
/// the next start, remove them), then finds nothing of the pool left.
fn killed_pool_is_gone(fx: &Fixture) {
    let left = kit::settle(
        Duration::from_secs(20),
        kit::POLL,
        || (fx.leftovers(), fx.stray_processes(), fx.stray_mounts()),
        |(state, procs, mounts)| state.is_empty() && procs.is_empty() && mounts.is_empty(),
    );
    assert!(
        left.0.is_empty() && left.1.is_empty() && left.2.is_empty(),
        "the killed pool's sandboxes were not gone after 20 s: state {:?}, processes {:?}, mounts {:?}",
        left.0,
        left.1,
        left.2
    );
    fx.assert_clean();
    kit::wait_until(
        "its cgroups and id ranges to go",
        Duration::from_secs(10),
        || host_resources(fx).is_empty(),
    );
}

/// The cgroups and id slots runsbx holds on the host for this fixture's
/// state root (as root; rootless runsbx makes neither): its cgroups (see
/// `Fixture::stray_cgroups`) and the id slots that name the state root.
fn host_resources(fx: &Fixture) -> BTreeSet<String> {
    let entries = |dir: &str| -> Vec<String> {
        fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut all: BTreeSet<String> = fx.stray_cgroups().into_iter().collect();
    let state = fx.state.to_string_lossy().into_owned();
    all.extend(
        entries("/run/runsbx-ids")
            .into_iter()
            .filter(|slot| fs::read_to_string(slot).is_ok_and(|o| o.contains(&state))),
    );
    all
}

/// A session's pool keeps one sandbox of the session ready: its calls are
/// warm, see what earlier calls left in the session (workspace, layer)
/// and a fresh /tmp; a request the session refuses runs cold (the pool
/// lets the session go for it) and gets the cold call's refusal.
fn a_session_is_pooled(fx: Fixture) {
    if !kit::have_python_image() {
        kit::skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let (name, mut pool) = Serve::of_new_session(&fx);
    let session = format!("--session={name}");
    let call = |pool: &mut Serve, script: &str| {
        let r = pool.call(&["--json", &session, "--", "sh", "-c", script]);
        assert_eq!(r["result"]["status"], "exited", "{r}");
        r
    };
    // (Rootless, the layer takes only what the sandbox makes at `/`.)
    let r = call(
        &mut pool,
        "echo kept > /workspace/f; echo gone > /tmp/t; mkdir /layer; echo $HOME",
    );
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["session"]["name"], name.as_str());
    assert_eq!(r["result"]["stdout"]["data"], "/workspace\n");
    let r = call(&mut pool, "cat /workspace/f; ls -A /tmp; ls -d /layer");
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["stdout"]["data"], "kept\n/layer\n", "{r}");
    // A wider deadline than the session's: the cold call's refusal (the
    // pool lets its sandbox, and the session, go for it).
    let r = pool.call(&["--json", &session, "--timeout=99h", "--", "true"]);
    assert_eq!(r["warm"], false, "{r}");
    assert_eq!(r["result"]["error"]["kind"], "bad_input", "{r}");
    let r = call(&mut pool, "cat /workspace/f");
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["stdout"]["data"], "kept\n");
    pool.close();
    let out = fx.run(["session", "rm", &name]);
    assert_eq!(out.code, 0, "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_session_is_pooled: session_as_root, session_rootless);

/// SIGKILL of a session's pool and its worker, whose sandbox is built:
/// the watchdog removes the sandbox from the call's mount namespace, where
/// the session's storage is still mounted, and the session keeps its
/// files and its view of the image (removing the call's directory through
/// that storage had hidden every file of the image under a whiteout in
/// the session's layer: the next call found no `sh`).
fn a_killed_session_pool_keeps_the_session(fx: Fixture) {
    if !kit::have_python_image() {
        kit::skip!("no `python` image: run `sudo runsbx image build python` (hack/test.sh does)");
    }
    let (name, mut pool) = Serve::of_new_session(&fx);
    let session = format!("--session={name}");
    let r = pool.call(&[
        "--json",
        &session,
        "--",
        "sh",
        "-c",
        "echo kept > f; mkdir /layer",
    ]);
    assert_eq!(r["result"]["status"], "exited", "{r}");
    assert_eq!(r["warm"], true, "{r}");
    // The session's next sandbox, built: its stub waits, holding only
    // its stdio and socket (libcontainer's init holds more).
    let serve = pool.child.id() as i32;
    kit::wait_until(
        "the session's next sandbox",
        Duration::from_secs(30),
        || {
            descendants(serve)
                .into_iter()
                .any(|pid| is_stub(pid) && fds_of(pid).len() == 4)
        },
    );
    let group = nix::unistd::Pid::from_raw(-(pool.child.id() as i32));
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = pool.child.wait();
    drop(pool);
    killed_pool_is_gone(&fx);
    let out = fx.run([
        "call",
        "--json",
        &session,
        "--",
        "sh",
        "-c",
        "cat f; ls -d /layer /usr/bin/python3",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let r: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(
        r["stdout"]["data"], "kept\n/layer\n/usr/bin/python3\n",
        "{r}"
    );
    let out = fx.run(["session", "rm", &name]);
    assert_eq!(out.code, 0, "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_killed_session_pool_keeps_the_session: killed_session_pool_as_root, killed_session_pool_rootless);

/// `{"cancel": ID}`: the call running request ID gets SIGTERM and ends
/// `interrupted`, its sandbox killed, as `runsbx call` given SIGTERM.
fn a_call_can_be_cancelled(fx: Fixture) {
    let rootfs = rootfs_arg();
    let mut pool = Serve::start(&fx, 1);
    // Its own in each test process and fixture (root and rootless run at
    // once).
    let mark = format!(
        "7{}{:06}",
        u8::from(fx.rootless()),
        std::process::id() % 1_000_000
    );
    let id = pool.send(&sh_args(&rootfs, &[], &format!("sleep {mark}")), None);
    kit::wait_until("the call's sleep to run", Duration::from_secs(20), || {
        have_process_with(&mark)
    });
    let to = to_of(&mut pool);
    writeln!(to, "{}", json!({"cancel": id})).unwrap();
    to.flush().unwrap();
    let r = pool.reply();
    assert_eq!(r["id"], id, "{r}");
    assert_eq!(r["warm"], true, "{r}");
    assert_eq!(r["result"]["status"], "interrupted", "{r}");
    assert!(!have_process_with(&mark), "the sandbox outlived the cancel");
    // A cancel of a request that is not running changes nothing.
    let to = to_of(&mut pool);
    writeln!(to, "{}", json!({"cancel": 999})).unwrap();
    to.flush().unwrap();
    let r = pool.call(&sh_args(&rootfs, &[], "echo after"));
    assert_eq!(r["result"]["stdout"]["data"], "after\n", "{r}");
    pool.close();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, a_call_can_be_cancelled: cancel_as_root, cancel_rootless);

fn to_of(pool: &mut Serve) -> &mut ChildStdin {
    pool.to.as_mut().unwrap()
}

/// Whether a host process has `token` as an argument.
fn have_process_with(token: &str) -> bool {
    fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
        cmdline.split(|b| *b == 0).any(|w| w == token.as_bytes())
    })
}
