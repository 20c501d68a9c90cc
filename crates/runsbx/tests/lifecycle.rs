//! Every runc command, driven through the built binary against a busybox
//! bundle, as root and as an unprivileged user.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::time::Duration;

use runsbx_testkit::{self as kit, as_root_and_rootless, output_within, Fixture};
use serde_json::{json, Value};

/// The runsbx under test.
const RUNSBX: &str = env!("CARGO_BIN_EXE_runsbx");

fn run_returns_exit_code(fx: Fixture) {
    let b = fx.bundle("b", &["sh", "-c", "exit 7"], |_| {});
    let out = fx.run(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    assert_eq!(out.code, 7, "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, run_returns_exit_code: run_exit_code_as_root, run_exit_code_rootless);

/// The container's init is killed from outside (an init cannot SIGKILL
/// itself in its own pid namespace): `run` returns 128 + 9.
fn run_reports_signal_as_128_plus(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    let mut cmd = fx.cmd(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    let run = std::thread::spawn(move || kit::output_via_files(&mut cmd));
    fx.wait_status("c1", "running");
    fx.run(["kill", "c1", "KILL"]).ok();
    let out = run.join().unwrap();
    assert_eq!(out.code, 128 + 9, "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, run_reports_signal_as_128_plus: run_signal_as_root, run_signal_rootless);

/// youki 0.7's `run` hangs on a process that exits at once; runsbx must not.
fn run_true_never_hangs(fx: Fixture) {
    let b = fx.bundle("b", &["/bin/true"], |_| {});
    for i in 0..20 {
        let id = format!("t{i}");
        let out = output_within(
            &mut fx.cmd(["run", "--bundle", b.to_str().unwrap(), &id]),
            Duration::from_secs(10),
        );
        assert_eq!(out.code, 0, "run {i}: {out:?}");
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, run_true_never_hangs: run_true_as_root, run_true_rootless);

fn run_forwards_signals(fx: Fixture) {
    let script = "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done";
    let b = fx.bundle("b", &["sh", "-c", script], |_| {});
    let mut cmd = fx.cmd(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    let mut child = kit::spawn(
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    let mut stdout = kit::Lines::of(child.stdout.take().unwrap());
    fx.wait_status("c1", "running");
    // sh sets the trap before it prints "ready".
    stdout.wait_for("ready", Duration::from_secs(10));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut out = kit::Out::of(child.wait_with_output().unwrap());
    out.stdout = stdout.all();
    assert_eq!(out.code, 42, "{out:?}");
    assert!(out.stdout.contains("ready"), "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, run_forwards_signals: run_forwards_signals_as_root, run_forwards_signals_rootless);

/// Inside the container: `lo` is up and usable, and seccomp is in force
/// (runsbx's allowlist replaces whatever profile the spec had). The client
/// connects once the server listens (it tries every 10 ms, 5 s at most).
fn loopback_up_and_seccomp_applied(fx: Fixture) {
    let script =
        "probe lo; grep '^Seccomp:' /proc/self/status; probe syscalls | grep unshare_user; \
                  nc -l -p 7777 >/dev/null & \
                  for i in $(seq 500); do \
                  echo hi | nc 127.0.0.1 7777 2>/dev/null && { echo loopback-connect=ok; break; }; \
                  sleep 0.01; done";
    let b = fx.bundle("b", &["sh", "-c", script], |c| {
        c["linux"]["seccomp"] = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64"],
        });
    });
    let out = fx.run(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("lo UP\n"), "lo is not up: {out:?}");
    assert!(
        out.stdout.contains("Seccomp:\t2"),
        "seccomp not applied: {out:?}"
    );
    assert!(out.stdout.contains("unshare_user EPERM"), "{out:?}");
    assert!(out.stdout.contains("loopback-connect=ok"), "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, loopback_up_and_seccomp_applied: lo_and_seccomp_as_root, lo_and_seccomp_rootless);

/// create → state → start → list → ps → exec → kill → delete.
fn full_lifecycle(fx: Fixture) {
    let b = fx.bundle(
        "b",
        &["sh", "-c", "trap 'exit 3' TERM; sleep 1000 & wait"],
        |_| {},
    );
    let pid_file = fx.dir.path().join("pid");
    let mut create = fx.cmd(["create", "--bundle", b.to_str().unwrap()]);
    create.arg("--pid-file").arg(&pid_file).arg("c1");
    let out = kit::output_via_files(&mut create).ok();
    assert_eq!(out.stdout, "");
    let pid: i64 = fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let state = fx.run(["state", "c1"]).ok().json();
    assert_eq!(state["status"], "created");
    assert_eq!(state["id"], "c1");
    assert_eq!(state["pid"], pid);
    assert_eq!(state["bundle"], b.canonicalize().unwrap().to_str().unwrap());
    assert!(state["ociVersion"].as_str().unwrap().starts_with("1."));
    assert!(state["created"].as_str().unwrap().contains('T'));
    // The caller, though rootless runsbx builds as root in a user
    // namespace of its own; and still after the start saves the state.
    let owner = match &fx.who {
        kit::Who::Root => "root",
        kit::Who::User(u) => u.name.as_str(),
    };
    assert_eq!(state["owner"], owner, "{state}");

    fx.run(["start", "c1"]).ok();
    fx.wait_status("c1", "running");
    assert_eq!(fx.run(["state", "c1"]).ok().json()["owner"], owner);
    let again = fx.run(["start", "c1"]);
    assert_eq!(again.code, 5, "second start: {again:?}");

    let list = fx.run(["list", "--format", "json"]).ok().json();
    let ids: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c1"]);
    let table = fx.run(["list"]).ok();
    assert!(table.stdout.starts_with("ID\tPID\tSTATUS"), "{table:?}");
    assert!(table.stdout.contains("c1\t"), "{table:?}");
    assert_eq!(fx.run(["list", "-q"]).ok().stdout, "c1\n");

    // Two processes: sh and its sleep.
    let pids = fx.run(["ps", "--format", "json", "c1"]).ok().json();
    let pids: Vec<i64> = pids
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap())
        .collect();
    assert!(pids.contains(&pid), "{pids:?}");
    assert_eq!(pids.len(), 2, "{pids:?}");
    let ps = fx.run(["ps", "c1"]).ok();
    assert!(ps.stdout.contains("sleep 1000"), "{ps:?}");

    let exec = fx.run([
        "exec",
        "--env",
        "GREETING=hello",
        "--cwd",
        "/tmp",
        "c1",
        "sh",
        "-c",
        "echo $GREETING from $(pwd); exit 4",
    ]);
    assert_eq!(exec.code, 4, "{exec:?}");
    assert_eq!(exec.stdout, "hello from /tmp\n");

    let process = fx.dir.path().join("process.json");
    fs::write(&process, serde_json::to_vec(&json!({
        "args": ["sh", "-c", "id -u; echo $FROM_FILE"], "cwd": "/", "env": ["FROM_FILE=yes", "PATH=/bin"],
        "user": {"uid": 0, "gid": 0}
    })).unwrap()).unwrap();
    let exec = fx.run(["exec", "--process", process.to_str().unwrap(), "c1"]);
    assert_eq!(exec.code, 0, "{exec:?}");
    assert_eq!(exec.stdout, "0\nyes\n");

    let exec_pid = fx.dir.path().join("exec.pid");
    let exec = fx.run([
        "exec",
        "--detach",
        "--pid-file",
        exec_pid.to_str().unwrap(),
        "c1",
        "sleep",
        "1000",
    ]);
    assert_eq!(exec.code, 0, "{exec:?}");
    let detached: i64 = fs::read_to_string(&exec_pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let pids = fx.run(["ps", "--format", "json", "c1"]).ok().json();
    assert!(
        pids.as_array().unwrap().contains(&Value::from(detached)),
        "{pids:?}"
    );

    fx.run(["kill", "c1", "TERM"]).ok();
    fx.wait_status("c1", "stopped");
    assert_eq!(fx.run(["state", "c1"]).ok().json()["pid"], 0);
    let kill = fx.run(["kill", "c1", "KILL"]);
    assert_eq!(kill.code, 5, "kill of a stopped container: {kill:?}");
    assert!(kill.stderr.contains("container not running"), "{kill:?}");

    fx.run(["delete", "c1"]).ok();
    let gone = fx.run(["state", "c1"]);
    assert_eq!(gone.code, 4, "{gone:?}");
    assert!(gone.stderr.contains("does not exist"), "{gone:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, full_lifecycle: lifecycle_as_root, lifecycle_rootless);

fn kill_all_reaches_every_process(fx: Fixture) {
    // Children that ignore TERM in the parent's trap but not in themselves.
    let b = fx.bundle(
        "b",
        &["sh", "-c", "trap '' TERM; sleep 1000 & sleep 1000 & wait"],
        |_| {},
    );
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    fx.wait_status("c1", "running");
    let before = fx.run(["ps", "--format", "json", "c1"]).ok().json();
    assert_eq!(before.as_array().unwrap().len(), 3, "{before:?}");
    fx.run(["kill", "--all", "c1", "9"]).ok();
    fx.wait_status("c1", "stopped");
    fx.run(["delete", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, kill_all_reaches_every_process: kill_all_as_root, kill_all_rootless);

fn delete_force_stops_a_running_container(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    fx.wait_status("c1", "running");
    let refused = fx.run(["delete", "c1"]);
    assert_eq!(
        refused.code, 5,
        "delete of a running container: {refused:?}"
    );
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, delete_force_stops_a_running_container: delete_force_as_root, delete_force_rootless);

/// pause, resume, events --stats and update need the container's cgroup:
/// applied as root; rootless on this cgroup v1 host, refused with exit 6.
fn cgroup_commands(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    fx.wait_status("c1", "running");
    if fx.rootless() {
        for args in [
            &["pause", "c1"][..],
            &["resume", "c1"],
            &["events", "--stats", "c1"],
            &["update", "--pids-limit", "9", "c1"],
        ] {
            let out = fx.run(args);
            assert_eq!(out.code, 6, "{args:?}: {out:?}");
            assert!(out.stderr.contains("cgroup"), "{args:?}: {out:?}");
        }
    } else {
        fx.run(["pause", "c1"]).ok();
        assert_eq!(fx.run(["state", "c1"]).ok().json()["status"], "paused");
        fx.run(["resume", "c1"]).ok();
        assert_eq!(fx.run(["state", "c1"]).ok().json()["status"], "running");
        let stats = fx.run(["events", "--stats", "c1"]).ok().json();
        assert_eq!(stats["type"], "stats");
        assert_eq!(stats["id"], "c1");
        assert!(stats["data"]["pids"].is_object(), "{stats}");
        fx.run(["update", "--pids-limit", "9", "--memory", "67108864", "c1"])
            .ok();
        // The container's cgroups, as its own process sees them.
        let pid = fx.run(["state", "c1"]).ok().json()["pid"].as_i64().unwrap();
        let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let path_of = |controller: &str| {
            let line = cgroups
                .lines()
                .find(|l| l.split(':').nth(1) == Some(controller))
                .unwrap();
            std::path::PathBuf::from(format!(
                "/sys/fs/cgroup/{controller}{}",
                line.split(':').nth(2).unwrap()
            ))
        };
        let pids = path_of("pids");
        assert!(pids.to_string_lossy().contains("/runsbx/"), "{pids:?}");
        assert_eq!(
            fs::read_to_string(pids.join("pids.max")).unwrap().trim(),
            "9"
        );
        let memory = |file: &str| {
            let path = path_of("memory").join(file);
            path.exists()
                .then(|| fs::read_to_string(path).unwrap().trim().to_owned())
        };
        assert_eq!(memory("memory.limit_in_bytes").unwrap(), "67108864");
        // Swap within the limit, where the kernel keeps swap accounts.
        if let Some(memsw) = memory("memory.memsw.limit_in_bytes") {
            assert_eq!(memsw, "67108864");
        }
        // Past the profile's limits (512M, 256 pids) or unlimited: refused
        // by the policy, naming the profile key, and nothing changes.
        let file = |name: &str, json: Value| {
            let path = fx.dir.path().join(name);
            fs::write(&path, json.to_string()).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let unlimited = file("unlimited.json", json!({"memory": {"limit": -1}}));
        let devices = file(
            "devices.json",
            json!({"devices": [{"allow": true, "access": "rwm"}]}),
        );
        for (args, code, says) in [
            (
                &["update", "--memory", "1073741824", "c1"][..],
                7,
                "limits.memory",
            ),
            (
                &["update", "-r", unlimited.as_str(), "c1"],
                7,
                "limits.memory",
            ),
            (
                &["update", "--pids-limit", "100000", "c1"],
                7,
                "limits.pids",
            ),
            (
                &["update", "-r", devices.as_str(), "c1"],
                3,
                "linux.resources.devices",
            ),
        ] {
            let out = fx.run(args);
            assert_eq!(out.code, code, "{args:?}: {out:?}");
            assert!(out.stderr.contains(says), "{args:?}: {out:?}");
            assert_eq!(out.stderr.lines().count(), 1, "{args:?}: {out:?}");
        }
        assert_eq!(memory("memory.limit_in_bytes").unwrap(), "67108864");
        assert_eq!(
            fs::read_to_string(pids.join("pids.max")).unwrap().trim(),
            "9"
        );
        fx.run(["delete", "--force", "c1"]).ok();
        assert!(!pids.exists(), "cgroup {pids:?} left behind");
    }
    fx.run(["delete", "--force", "c1"]);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, cgroup_commands: cgroup_commands_as_root, cgroup_commands_rootless);

/// A create that libcontainer fails after it forked the sandbox's
/// processes leaves nothing. Its own cleanup removes the state by which
/// they could be found, so runsbx kills them as its children. The
/// failures come from prestart hooks (in a profile that allows hooks): one
/// fails while the init waits for it; the other turns the container's
/// state file into a directory, so that libcontainer's last step fails
/// once the init is ready and waits for `start`, which nothing would send.
fn failed_create_leaves_nothing(fx: Fixture) {
    let config = kit::operator_config(fx.dir.path(), "hooked", "name = \"hooked\"\nhooks = true\n");
    let state = fx.state.join("c1/state.json");
    let unsaveable = format!("rm {0} && mkdir {0}", state.display());
    let hooks = [
        (json!({"path": "/bin/false"}), "hook"),
        (
            json!({"path": "/bin/sh", "args": ["sh", "-c", unsaveable]}),
            "state",
        ),
    ];
    for (i, (hook, needle)) in hooks.into_iter().enumerate() {
        let b = fx.bundle(&format!("b{i}"), &["sleep", "1000"], |spec| {
            spec["hooks"] = json!({"prestart": [hook]});
        });
        let out = fx.run_with_config(&config, &b, "c1");
        assert_eq!(out.code, 1, "{out:?}");
        assert!(out.stderr.contains(needle), "{out:?}");
        // At once: nothing waits for libcontainer's processes to notice
        // that runsbx is gone.
        fx.assert_clean();
    }
}
as_root_and_rootless!(RUNSBX, failed_create_leaves_nothing: failed_create_as_root, failed_create_rootless);

/// A sandbox's processes start with every signal at its default action,
/// whatever runsbx's caller ignored (here SIGINT, SIGQUIT and SIGHUP, as a
/// shell's background job and `nohup` do, and SIGPIPE) and though runsbx
/// ignores SIGPIPE while libcontainer builds (a hook may close its stdin
/// unread): an ignored signal is inherited across exec. Through runsbx's
/// executor, libcontainer's (a spec with a startContainer hook, where
/// libcontainer installs the filter) and an exec's.
fn signals_have_their_default_action(fx: Fixture) {
    use nix::sys::signal::{signal, SigHandler, Signal};
    use std::os::unix::process::CommandExt;
    let config = kit::operator_config(fx.dir.path(), "hooked", "name = \"hooked\"\nhooks = true\n");
    let ignoring = |cmd: &mut std::process::Command| {
        // SAFETY: sigaction is async-signal-safe; nothing else runs in
        // the child before its exec.
        unsafe {
            cmd.pre_exec(|| {
                for s in [
                    Signal::SIGINT,
                    Signal::SIGQUIT,
                    Signal::SIGHUP,
                    Signal::SIGPIPE,
                ] {
                    signal(s, SigHandler::SigIgn)?;
                }
                Ok(())
            });
        }
    };
    let ignored = |out: &kit::Out| -> u64 {
        let mask = out
            .stdout
            .trim()
            .strip_prefix("SigIgn:")
            .unwrap_or_else(|| panic!("{out:?}"));
        u64::from_str_radix(mask.trim(), 16).unwrap()
    };
    let show = ["grep", "SigIgn", "/proc/self/status"];
    let hooks = [
        json!(null),
        json!({"startContainer": [{"path": "/bin/true"}]}),
    ];
    for (i, hooks) in hooks.into_iter().enumerate() {
        let b = fx.bundle(&format!("b{i}"), &show, |spec| spec["hooks"] = hooks);
        let mut run = fx.cmd(["--config", config.to_str().unwrap(), "run", "--bundle"]);
        run.arg(&b).arg("c1");
        ignoring(&mut run);
        let out = kit::output_via_files(&mut run);
        assert_eq!((out.code, ignored(&out)), (0, 0), "hooks {i}: {out:?}");
    }
    let b = fx.bundle("long", &["sleep", "1000"], |_| {});
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c2"])
        .ok();
    let mut exec = fx.cmd(["exec", "c2"]);
    exec.args(show);
    ignoring(&mut exec);
    let out = kit::output_via_files(&mut exec);
    assert_eq!((out.code, ignored(&out)), (0, 0), "exec: {out:?}");
    fx.run(["delete", "--force", "c2"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, signals_have_their_default_action: default_signals_as_root, default_signals_rootless);

/// As root on a cgroup v1 host the sandbox's first process is forked into
/// its cgroups by a thread of runsbx that moved only itself there, and
/// libcontainer's own `cgroup.procs` writes (each a wait for an RCU grace
/// period) land in a plain file in a mount namespace of runsbx's own
/// (sys/cgroup_attach.rs). The sandbox ends up where libcontainer would
/// have put it, and runsbx leaves with its own cgroups and mount namespace
/// as they were. An exec'd process is placed the same way.
#[test]
fn the_sandbox_is_forked_into_its_cgroups() {
    if !kit::is_root() {
        kit::skip!("the_sandbox_is_forked_into_its_cgroups: needs root");
    }
    let fx = Fixture::new(RUNSBX, kit::Who::Root);
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    let mut run = fx.cmd(["run", "--bundle", b.to_str().unwrap(), "c1"]);
    run.stdout(std::process::Stdio::null());
    let mut runsbx = run.spawn().unwrap();
    fx.wait_status("c1", "running");
    let init = fx.run(["state", "c1"]).ok().json()["pid"].as_i64().unwrap();
    let read = |path: String| fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let v1 = |cgroups: &str| -> Vec<(String, String)> {
        cgroups
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                (!controllers.is_empty() && !controllers.starts_with("name="))
                    .then(|| (controllers.to_owned(), path.to_owned()))
            })
            .collect()
    };
    let ours = read("/proc/self/cgroup".into());
    let sink = fx.state.join("@bundles/c1/cgroup.procs.sink");
    if v1(&ours).is_empty() {
        // cgroup v2 only: libcontainer joins the cgroup itself.
        assert!(!sink.exists(), "{sink:?} on a host without cgroup v1");
    } else {
        for (controllers, path) in v1(&read(format!("/proc/{init}/cgroup"))) {
            assert!(
                path.starts_with("/runsbx/") && path.ends_with("-c1"),
                "{controllers}: {path}"
            );
        }
        // libcontainer's intermediate process wrote its pid into a plain
        // file, not into a real cgroup.procs. runsbx wrote the limits
        // itself, so on a hybrid host that file is in the tmpfs of the
        // build's own view of /sys/fs/cgroup (gone with it, and no
        // directory of the unified hierarchy made for the sandbox), and no
        // sink is made; on a host with v1 only, the sink.
        let unified = std::path::Path::new("/sys/fs/cgroup/unified/runsbx");
        let written = if unified.is_dir() {
            assert!(!sink.exists(), "{sink:?}");
            let made: Vec<_> = fs::read_dir(unified)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with("-c1"))
                .map(|e| e.path())
                .collect();
            assert!(made.is_empty(), "{made:?}");
            String::new()
        } else {
            let written = read(sink.to_string_lossy().into_owned());
            assert!(
                written.trim().parse::<u32>().is_ok(),
                "{sink:?}: {written:?}"
            );
            written
        };
        // An exec'd process is forked into the same cgroups, by another
        // intermediate process whose write lands in the same file.
        let pid_file = fx.dir.path().join("exec.pid");
        let mut exec = fx.cmd(["exec", "--detach", "--pid-file"]);
        exec.arg(&pid_file).args(["c1", "sleep", "1000"]);
        kit::output_via_files(&mut exec).ok();
        let exec_pid = read(pid_file.to_string_lossy().into_owned());
        assert_eq!(
            v1(&read(format!("/proc/{}/cgroup", exec_pid.trim()))),
            v1(&read(format!("/proc/{init}/cgroup"))),
            "the exec'd process's cgroups"
        );
        let again = read(sink.to_string_lossy().into_owned());
        assert!(
            again.trim().parse::<u32>().is_ok() && again != written,
            "{sink:?}: {again:?}"
        );
    }
    let pid = runsbx.id();
    assert_eq!(
        read(format!("/proc/{pid}/cgroup")),
        ours,
        "runsbx's own cgroups"
    );
    assert_eq!(
        fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        fs::read_link("/proc/self/ns/mnt").unwrap(),
        "runsbx's mount namespace"
    );
    assert!(
        !read("/proc/self/mountinfo".into()).contains("cgroup.procs"),
        "a bind over cgroup.procs reached the host"
    );
    fx.run(["kill", "c1", "KILL"]).ok();
    runsbx.wait().unwrap();
    fx.run(["delete", "--force", "c1"]);
    fx.assert_clean();
}

fn features_spec_version(fx: Fixture) {
    let features = fx.run(["features"]).ok().json();
    assert_eq!(features["ociVersionMin"], "1.0.0");
    assert_eq!(features["linux"]["seccomp"]["enabled"], true);
    assert!(features["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .contains(&Value::from("user")));

    let version = fx.run(["--version"]).ok();
    assert!(version.stdout.starts_with("runsbx "), "{version:?}");

    let b = fx.bundle("b", &["true"], |_| {});
    let config: Value = serde_json::from_slice(&fs::read(b.join("config.json")).unwrap()).unwrap();
    let namespaces: Vec<&str> = config["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["type"].as_str().unwrap())
        .collect();
    assert!(namespaces.contains(&"network"), "{namespaces:?}");
    if let kit::Who::User(u) = &fx.who {
        assert!(namespaces.contains(&"user"), "{namespaces:?}");
        assert_eq!(config["linux"]["uidMappings"][0]["hostID"], u.uid);
        assert_eq!(config["linux"]["uidMappings"][0]["containerID"], 0);
    }
    let again = fx.run(["spec", "--bundle", b.to_str().unwrap()]);
    assert_eq!(again.code, 3, "spec must not overwrite: {again:?}");
    assert!(again.stderr.contains("exists already"), "{again:?}");
}
as_root_and_rootless!(RUNSBX, features_spec_version: features_spec_version_as_root, features_spec_version_rootless);

/// Without --root, state goes where runc's would: /run/runsbx as root,
/// $XDG_RUNTIME_DIR/runsbx for an unprivileged user.
fn default_state_root(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    let id = format!("default-root-{}", std::process::id());
    let xdg = fx.dir.path().join("xdg");
    let expected = match &fx.who {
        kit::Who::Root => std::path::PathBuf::from("/run/runsbx"),
        kit::Who::User(_) => xdg.join("runsbx"),
    };
    let runsbx = |args: &[&str]| {
        let mut cmd = std::process::Command::new(fx.bin());
        cmd.args(args);
        fx.as_who(&mut cmd);
        if fx.rootless() {
            cmd.env("XDG_RUNTIME_DIR", &xdg);
        }
        kit::output_via_files(&mut cmd)
    };
    if fx.rootless() {
        fs::create_dir(&xdg).unwrap();
        if let kit::Who::User(u) = &fx.who {
            nix::unistd::chown(&xdg, Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
    }
    let out = runsbx(&["run", "--detach", "--bundle", b.to_str().unwrap(), &id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        expected.join(&id).join("state.json").exists(),
        "no state under {expected:?}"
    );
    let out = runsbx(&["delete", "--force", &id]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(!expected.join(&id).exists());
}
as_root_and_rootless!(RUNSBX, default_state_root: default_state_root_as_root, default_state_root_rootless);

/// Concurrent creates of one id: exactly one wins, the rest are told it
/// exists; nothing is corrupted.
fn concurrent_commands_are_serialized(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |_| {});
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let mut cmd = fx.cmd(["create", "--bundle", b.to_str().unwrap(), "same"]);
            std::thread::spawn(move || kit::output_via_files(&mut cmd))
        })
        .collect();
    let outs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let won = outs.iter().filter(|o| o.code == 0).count();
    assert_eq!(won, 1, "{outs:?}");
    for o in outs.iter().filter(|o| o.code != 0) {
        assert_eq!(o.code, 5, "{o:?}");
        assert!(o.stderr.contains("already exists"), "{o:?}");
    }
    assert_eq!(fx.run(["state", "same"]).ok().json()["status"], "created");
    // delete and state racing: state sees it whole or not at all.
    let mut del = fx.cmd(["delete", "--force", "same"]);
    let del = std::thread::spawn(move || kit::output_via_files(&mut del));
    for _ in 0..5 {
        let s = fx.run(["state", "same"]);
        assert!(s.code == 0 || s.code == 4, "{s:?}");
    }
    assert_eq!(del.join().unwrap().code, 0);
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, concurrent_commands_are_serialized: concurrent_as_root, concurrent_rootless);

/// `--log F --log-format json` writes runc's JSON lines, with the error
/// last, as containerd's shim reads them.
fn json_log_for_engines(fx: Fixture) {
    let log = fx.dir.path().join("log.json");
    let out = fx.run([
        "--log",
        log.to_str().unwrap(),
        "--log-format",
        "json",
        "start",
        "missing",
    ]);
    assert_eq!(out.code, 4, "{out:?}");
    let text = fs::read_to_string(&log).unwrap();
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "error");
    assert!(
        last["msg"].as_str().unwrap().contains("does not exist"),
        "{last}"
    );
    assert!(last["time"].is_string());
}
as_root_and_rootless!(RUNSBX, json_log_for_engines: json_log_as_root, json_log_rootless);

/// Only fds 0-2 reach the container, plus the ones `--preserve-fds` names.
fn preserve_fds(fx: Fixture) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let file = fx.dir.path().join("passed");
    fs::write(&file, "passed-through-fd-3\n").unwrap();
    let b = fx.bundle(
        "b",
        &[
            "sh",
            "-c",
            "ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; cat <&3",
        ],
        |_| {},
    );
    for (preserve, want_fd3) in [("0", false), ("1", true)] {
        let f = fs::File::open(&file).unwrap();
        let raw = f.as_raw_fd();
        let mut cmd = fx.cmd([
            "run",
            "--preserve-fds",
            preserve,
            "--bundle",
            b.to_str().unwrap(),
            "c1",
        ]);
        // SAFETY: dup2 is async-signal-safe; it runs in the child before exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc_dup2(raw, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = kit::output_via_files(&mut cmd);
        let first = out.stdout.lines().next().unwrap_or_default().to_owned();
        if want_fd3 {
            assert_eq!(out.code, 0, "{out:?}");
            assert!(out.stdout.contains("passed-through-fd-3"), "{out:?}");
        } else {
            // ls itself has one more fd open while listing (its own dirfd).
            assert!(
                !out.stdout.contains("passed-through-fd-3"),
                "fd 3 leaked: {out:?}"
            );
            let fds: Vec<&str> = first.split_whitespace().collect();
            assert!(
                fds.iter().all(|fd| ["0", "1", "2", "3"].contains(fd)) && fds.len() <= 4,
                "{out:?}"
            );
        }
        drop(f);
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, preserve_fds: preserve_fds_as_root, preserve_fds_rootless);

/// dup2, and clear close-on-exec on the target even when `from == to`.
fn libc_dup2(from: i32, to: i32) -> i32 {
    // SAFETY: plain dup2 and fcntl on fds owned by the caller.
    unsafe {
        if from != to && nix::libc::dup2(from, to) < 0 {
            return -1;
        }
        nix::libc::fcntl(to, nix::libc::F_SETFD, 0)
    }
}

/// A process exec'd into a container gets the container's seccomp filter
/// and rlimits (libcontainer 0.7's exec alone applies neither).
fn exec_gets_seccomp_and_rlimits(fx: Fixture) {
    let b = fx.bundle("b", &["sleep", "1000"], |c| {
        c["process"]["rlimits"] = json!([{"type": "RLIMIT_NOFILE", "hard": 77, "soft": 77}]);
    });
    fx.run(["run", "--detach", "--bundle", b.to_str().unwrap(), "c1"])
        .ok();
    let out = fx.run(["exec", "c1", "sh", "-c", "grep '^Seccomp:' /proc/self/status; ulimit -n; probe syscalls | grep -E 'unshare_user|clone_user |^mount'"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout, "Seccomp:\t2\n77\nmount EPERM\nunshare_user EPERM\nclone_user EPERM\n",
        "{out:?}"
    );
    fx.run(["delete", "--force", "c1"]).ok();
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, exec_gets_seccomp_and_rlimits: exec_seccomp_as_root, exec_seccomp_rootless);
