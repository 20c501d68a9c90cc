//! dockerd drives runsbx (`--add-runtime runsbx=…`, `docker run --runtime
//! runsbx`) as a docker user would: run, exec, memory limits, hardening.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::process::{Command, Stdio};
use std::time::Duration;

use runsbx_engine_tests::{busybox_rootfs, docker_archive, entered, have, is_root, skip, Daemon};

const IMAGE: &str = "localhost/runsbx-busybox:test";

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
    let mut d = Daemon::prepare("runsbx-docker-");
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
    d.wait_until(Duration::from_secs(60), |d| {
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
    if !is_root() {
        skip!("docker_runs_runsbx: needs root");
    }
    for tool in ["dockerd", "docker", "unshare", "nsenter"] {
        if !have(tool) {
            skip!("{tool} is not installed (apt-get install --no-install-recommends docker.io)");
        }
    }
    let d = start_dockerd();
    let archive = d.path().join("image.tar");
    docker_archive(&busybox_rootfs(d.path()), IMAGE, &["sh"], &archive);
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
    let canary = entered::Canary::start();
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
            entered::ENTERED_INIT,
        ],
    );
    let held = held.trim();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while docker(&d, &["exec", held, "cat", "/tmp/init-map"]).0 != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the init never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = docker_ok(&d, &["exec", held, "sh", "-c", entered::ENTERED_PROBE]);
    entered::assert_entered_output(&out, &canary);
    let mark = entered::unique_mark();
    docker_ok(&d, &["exec", "-d", held, "sleep", &mark]);
    let (uid, cgroups) = entered::host_view(entered::pid_of_sleep(&mark));
    let init: i32 = docker_ok(&d, &["inspect", "-f", "{{.State.Pid}}", held])
        .trim()
        .parse()
        .unwrap();
    assert_eq!((uid, cgroups), entered::host_view(init));
    assert_ne!(uid, 0, "docker exec runs as host root");
    docker_ok(&d, &["rm", "-f", held]);

    let (code, out, err) = docker(&d, &["exec", id, "sh", "-c", "echo in-exec; exit 3"]);
    assert_eq!((code, out.as_str()), (3, "in-exec\n"), "{err}");
    let out = docker_ok(&d, &["exec", id, "probe", "status"]);
    assert!(out.contains("Seccomp:\t2"), "{out}");
    let pid = docker_ok(&d, &["inspect", "-f", "{{.State.Pid}}", id]);
    let memory = memory_limit(pid.trim());
    match memory {
        Some(limit) => assert_eq!(limit, 64 * 1024 * 1024, "memory.limit_in_bytes"),
        None => eprintln!("no memory cgroup controller on this host: --memory not checked"),
    }
    docker_ok(&d, &["rm", "-f", id]);
    assert_eq!(
        d.runsbx_containers(),
        Vec::<String>::new(),
        "runsbx state left"
    );
    assert_eq!(d.runsbx_bundles(), Vec::<String>::new(), "bundles left");
    assert_eq!(d.runsbx_mounts(), Vec::<String>::new(), "mounts left");
    let _ = fs::metadata(d.path());
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

use std::path::Path;
