//! dockerd drives runsbx (`--add-runtime runsbx=…`, `docker run --runtime
//! runsbx`) as a docker user would: run, exec, memory limits, hardening.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use runsbx_testkit::{self as kit, docker_archive, skip, Daemon};

use crate::{IMAGE, RUNSBX};

fn socket(d: &Daemon) -> String {
    format!("unix://{}", d.path().join("docker.sock").display())
}

fn docker(d: &Daemon, args: &[&str]) -> (i32, String, String) {
    let out = Command::new("docker")
        .arg("-H")
        .arg(socket(d))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn docker_ok(d: &Daemon, args: &[&str]) -> String {
    let (code, out, err) = docker(d, args);
    assert_eq!(code, 0, "docker {args:?}: {out}{err}");
    out
}

fn start_dockerd() -> Daemon {
    let mut d = Daemon::prepare("runsbx-docker-", RUNSBX);
    let p = d.path().to_path_buf();
    let args: Vec<String> = vec![
        format!("--data-root={}", p.join("data").display()),
        format!("--exec-root={}", p.join("exec").display()),
        format!("--pidfile={}", p.join("docker.pid").display()),
        format!("-H={}", socket(&d)),
        "--bridge=none".into(),
        "--iptables=false".into(),
        "--ip6tables=false".into(),
        // No overlay-on-whatever questions: the image is one small layer.
        "--storage-driver=vfs".into(),
        format!("--add-runtime=runsbx={}", d.runsbx.display()),
    ];
    // docker's runc-compatible runtimes keep their state here (the shim's
    // --root for docker's containerd namespace).
    d.runsbx_root = p.join("exec/runtime-runc/moby");
    d.start("dockerd", &args);
    d.wait_ready(Duration::from_secs(60), |d| {
        docker(d, &["version", "--format", "{{.Server.Version}}"]).0 == 0
    });
    d.on_drop(|d| {
        let (_, ids, _) = docker(d, &["ps", "-aq"]);
        for id in ids.split_whitespace() {
            let _ = docker(d, &["rm", "-f", id]);
        }
    });
    d
}

#[test]
fn docker_runs_runsbx() {
    if !kit::is_root() {
        skip!("docker_runs_runsbx: needs root");
    }
    for tool in ["dockerd", "docker", "unshare", "nsenter"] {
        if !kit::have(tool) {
            skip!("{tool} is not installed (apt-get install --no-install-recommends docker.io)");
        }
    }
    let d = start_dockerd();
    let archive = d.path().join("image.tar");
    docker_archive(kit::rootfs(), IMAGE, &["sh"], &archive);
    docker_ok(&d, &["load", "-i", archive.to_str().unwrap()]);

    let run = ["run", "--rm", "--runtime", "runsbx", "--network", "none"];
    let out = docker_ok(&d, &[&run[..], &[IMAGE, "echo", "hi"]].concat());
    assert_eq!(out, "hi\n");
    // runsbx's own bookkeeping in the runtime's state root: runsbx ran.
    assert!(
        d.runsbx_root.join("@locks").is_dir(),
        "runsbx did not run: no {:?}/@locks",
        d.runsbx_root
    );

    // Hardened under docker, and the exit code comes back.
    let (code, out, err) = docker(
        &d,
        &[
            &run[..],
            &[IMAGE, "sh", "-c", "probe status; probe lo; exit 7"],
        ]
        .concat(),
    );
    assert_eq!(code, 7, "{out}{err}");
    for line in [
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "lo UP",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} missing: {out}");
    }

    // A command missing from the image is 127, as under runc (docker reads
    // runc's words in the runtime's error), and said in runsbx's words.
    let (code, out, err) = docker(&d, &[&run[..], &[IMAGE, "no-such-command"]].concat());
    assert_eq!(code, 127, "{out}{err}");
    assert!(
        err.contains("command `no-such-command`: executable file not found in $PATH"),
        "{err}"
    );
    assert!(!err.contains("ERROR"), "a libcontainer line: {err}");

    // `--init` (docker's tini at /sbin/docker-init, run as pid 1) and a
    // named volume work under the default profile; a host path does not.
    let out = docker_ok(
        &d,
        &[
            &run[..],
            &[
                "--init",
                IMAGE,
                "sh",
                "-c",
                "tr '\\0' ' ' < /proc/1/cmdline",
            ],
        ]
        .concat(),
    );
    assert!(out.starts_with("/sbin/docker-init -- sh "), "{out}");
    docker_ok(&d, &["volume", "create", "vol"]);
    let vol = ["-v", "vol:/data", IMAGE, "sh", "-c"];
    docker_ok(&d, &[&run[..], &vol[..], &["echo kept > /data/f"]].concat());
    let out = docker_ok(
        &d,
        &[&run[..], &vol[..], &["cat /data/f; ls -ln /data/f"]].concat(),
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "kept", "{out}");
    assert!(
        lines[1].contains(" 0        0 "),
        "owned by container root: {out}"
    );
    let (code, out, err) = docker(
        &d,
        &[&run[..], &["-v", "/etc:/hostetc", IMAGE, "true"]].concat(),
    );
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains("bind mount of host path \"/etc\" at \"/hostetc\" is refused"),
        "{err}"
    );

    // A detached container with a memory limit, and exec into it.
    let id = docker_ok(
        &d,
        &[
            "run",
            "-d",
            "--runtime",
            "runsbx",
            "--network",
            "none",
            "--memory",
            "64m",
            IMAGE,
            "sleep",
            "1000",
        ],
    );
    let id = id.trim();
    // docker exec is held to the sandbox as the container's init is.
    let canary = kit::Canary::start();
    let held = docker_ok(
        &d,
        &[
            "run",
            "-d",
            "--runtime",
            "runsbx",
            "--network",
            "none",
            IMAGE,
            "sh",
            "-c",
            kit::ENTERED_INIT,
        ],
    );
    let held = held.trim();
    kit::wait_until("the init to get ready", Duration::from_secs(10), || {
        docker(&d, &["exec", held, "cat", "/tmp/init-map"]).0 == 0
    });
    let out = docker_ok(&d, &["exec", held, "sh", "-c", kit::ENTERED_PROBE]);
    kit::assert_entered_output(&out, &canary);
    let mark = kit::unique_mark();
    docker_ok(&d, &["exec", "-d", held, "sleep", &mark]);
    let (uid, cgroups) = kit::host_view(kit::pid_of_sleep(&mark));
    let init: i32 = docker_ok(&d, &["inspect", "-f", "{{.State.Pid}}", held])
        .trim()
        .parse()
        .unwrap();
    assert_eq!((uid, cgroups), kit::host_view(init));
    assert_ne!(uid, 0, "docker exec runs as host root");
    docker_ok(&d, &["rm", "-f", held]);

    let (code, out, err) = docker(&d, &["exec", id, "sh", "-c", "echo in-exec; exit 3"]);
    assert_eq!((code, out.as_str()), (3, "in-exec\n"), "{err}");
    // A command the container lacks, in runsbx's words (libcontainer's
    // failed exec before); docker exec says 126 for it, as under runc.
    // (docker prints the exec's error on stdout.)
    let (code, out, err) = docker(&d, &["exec", id, "no-such-command"]);
    assert_eq!(code, 126, "{out}{err}");
    assert!(
        format!("{out}{err}")
            .contains("command `no-such-command`: executable file not found in $PATH"),
        "{out}{err}"
    );
    let out = docker_ok(&d, &["exec", id, "probe", "status"]);
    assert!(out.contains("Seccomp:\t2"), "{out}");
    let pid = docker_ok(&d, &["inspect", "-f", "{{.State.Pid}}", id]);
    check_memory_limit(pid.trim());
    docker_ok(&d, &["rm", "-f", id]);
    assert_eq!(
        d.runsbx_containers(),
        Vec::<String>::new(),
        "runsbx state left"
    );
    assert_eq!(d.runsbx_bundles(), Vec::<String>::new(), "bundles left");
    assert_eq!(d.runsbx_mounts(), Vec::<String>::new(), "mounts left");
}

/// `--memory 64m` in process `pid`'s cgroup.
fn check_memory_limit(pid: &str) {
    let Some(limit) = memory_limit(pid) else {
        skip!("no memory cgroup controller on this host: docker's --memory cannot be read");
    };
    assert_eq!(limit, 64 * 1024 * 1024, "memory.limit_in_bytes");
}

/// The memory limit of process `pid`'s cgroup: v1's memory.limit_in_bytes,
/// or v2's memory.max.
fn memory_limit(pid: &str) -> Option<u64> {
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let file = format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes");
            return fs::read_to_string(file).ok()?.trim().parse().ok();
        }
        if controllers.is_empty() && !Path::new("/sys/fs/cgroup/memory").exists() {
            let file = format!("/sys/fs/cgroup{path}/memory.max");
            return fs::read_to_string(file).ok()?.trim().parse().ok();
        }
    }
    None
}
