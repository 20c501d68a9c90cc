//! podman drives runsbx (`--runtime`), as root and rootless: run, a
//! terminal, exec, its default network, the deadline annotation.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use runsbx_testkit::{
    self as kit, as_root_and_rootless, output_via_files, skip, Fixture, Out, Who,
};

use crate::{IMAGE, RUNSBX};

/// podman with its own storage under the fixture, no network (the sandbox
/// has its own loopback; slirp4netns cannot open /dev/net/tun here).
pub(crate) struct Podman<'a> {
    fx: &'a Fixture,
    xdg: PathBuf,
    driver: &'static str,
}

impl<'a> Podman<'a> {
    pub(crate) fn new(fx: &'a Fixture) -> Self {
        Self::with_driver(fx, "vfs")
    }

    /// podman with its default storage driver, overlay: each container's
    /// rootfs is an overlay mount of the image's layers and its own.
    pub(crate) fn with_overlay(fx: &'a Fixture) -> Self {
        Self::with_driver(fx, "overlay")
    }

    fn with_driver(fx: &'a Fixture, driver: &'static str) -> Self {
        let xdg = fx.dir.path().join("xdg");
        fs::create_dir_all(&xdg).unwrap();
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
        if let Who::User(u) = &fx.who {
            nix::unistd::chown(xdg.as_path(), Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        Self { fx, xdg, driver }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let d = self.fx.dir.path();
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(d.join("storage"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args([
                "--storage-driver",
                self.driver,
                "--cgroup-manager",
                "cgroupfs",
                "--events-backend",
                "file",
            ])
            .arg("--tmpdir")
            .arg(d.join("podman-tmp"))
            .args(args)
            // podman's own defaults: its ulimits (nofile and nproc 1048576)
            // exceed this host's hard limits, and runsbx lowers them to the
            // profile's, so no containers.conf is needed.
            .env_remove("CONTAINERS_CONF")
            .env("XDG_RUNTIME_DIR", &self.xdg);
        self.fx.as_who(&mut cmd);
        if let Who::User(u) = &self.fx.who {
            // as_who drops XDG_RUNTIME_DIR; rootless podman needs one.
            cmd.env("XDG_RUNTIME_DIR", &self.xdg).env("USER", &u.name);
        }
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> Out {
        output_via_files(&mut self.cmd(args))
    }

    /// `podman --runtime runsbx run --rm --network none ARGS…` (ARGS: run's
    /// options, the image, the command).
    pub(crate) fn run_sandboxed(&self, args: &[&str]) -> Out {
        let bin = self.fx.bin();
        let runtime = ["--runtime", bin.to_str().unwrap()];
        let run = ["run", "--rm", "--network", "none"];
        self.run(&[&runtime[..], &run[..], args].concat())
    }

    /// `localhost/runsbx-busybox:test`, imported from a tar of the test rootfs.
    pub(crate) fn import_busybox(&self) {
        let tar = kit::rootfs_tar(self.fx.dir.path());
        self.run(&["import", tar.to_str().unwrap(), IMAGE]).ok();
    }
}

impl Drop for Podman<'_> {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force"]);
        let storage = self.fx.dir.path().join("storage");
        match &self.fx.who {
            // As root, the overlay driver binds its directory onto itself
            // (a private mount of the host's) and leaves it mounted; any
            // podman command, `podman unshare` among them, binds it again.
            Who::Root => {
                let overlay = storage.join("overlay");
                let _ = nix::mount::umount2(&overlay, nix::mount::MntFlags::MNT_DETACH);
                let _ = fs::remove_dir_all(&storage);
            }
            // Rootless storage holds files owned by subordinate ids; its
            // mounts live in podman's own mount namespace.
            Who::User(_) => {
                let _ = self.run(&["unshare", "rm", "-rf", storage.to_str().unwrap()]);
            }
        }
        // Last: rootless podman keeps a pause process holding its user
        // namespace, and every podman command above may start it again.
        let pidfile = self.fx.dir.path().join("podman-tmp/pause.pid");
        if let Some(pid) = fs::read_to_string(pidfile)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // A mount left on the host outlives the test run, and every later
        // read of the mount table (libcgroups reads it per controller)
        // pays for it.
        if !std::thread::panicking() {
            assert_eq!(
                self.fx.stray_mounts(),
                Vec::<String>::new(),
                "podman left mounts behind"
            );
        }
    }
}

fn podman_runs_runsbx(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let log = fx.dir.path().join("runsbx.log");
    if let Who::User(u) = &fx.who {
        fs::write(&log, "").unwrap();
        nix::unistd::chown(&log, Some(u.uid.into()), Some(u.gid.into())).unwrap();
    }
    let bin = fx.bin();
    let runtime_log = format!("log={}", log.display());
    let out = podman.run(&[
        "--runtime",
        bin.to_str().unwrap(),
        "--runtime-flag",
        "debug",
        "--runtime-flag",
        &runtime_log,
        "run",
        "--rm",
        "--network",
        "none",
        IMAGE,
        "echo",
        "hi",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "hi\n");
    // runsbx's own log proves it was the runtime podman called.
    let text = fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("container directory will be"),
        "runsbx log: {text}"
    );

    let out = podman.run_sandboxed(&[IMAGE, "sh", "-c", "probe status; probe lo; exit 7"]);
    assert_eq!(out.code, 7, "{out:?}");
    // Hardened under podman too.
    kit::assert_hardened(&out);

    // A terminal (podman hands runsbx a console socket), a detached
    // container, and exec into it with and without a terminal.
    let rt = ["--runtime", bin.to_str().unwrap()];
    let out = podman.run(
        &[
            &rt[..],
            &["run", "-t", "--rm", "--network", "none", IMAGE, "tty"],
        ]
        .concat(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("/dev/pts/"), "{out:?}");
    podman
        .run(
            &[
                &rt[..],
                &[
                    "run",
                    "-d",
                    "--name",
                    "long",
                    "--network",
                    "none",
                    IMAGE,
                    "sleep",
                    "1000",
                ],
            ]
            .concat(),
        )
        .ok();
    let out = podman.run(
        &[
            &rt[..],
            &["exec", "long", "sh", "-c", "echo in-exec; exit 3"],
        ]
        .concat(),
    );
    assert_eq!((out.code, out.stdout.as_str()), (3, "in-exec\n"), "{out:?}");
    let out = podman.run(&[&rt[..], &["exec", "-t", "long", "tty"]].concat());
    assert!(out.stdout.starts_with("/dev/pts/"), "{out:?}");
    podman.run(&[&rt[..], &["kill", "long"]].concat()).ok();
    podman.run(&[&rt[..], &["rm", "long"]].concat()).ok();
}
as_root_and_rootless!(RUNSBX, podman_runs_runsbx: podman_as_root, podman_rootless);

/// `podman exec` is held to the sandbox: the init's user namespace and
/// host uid (never host root), no capabilities, seccomp, only lo.
fn podman_exec_is_held_to_the_sandbox(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let canary = kit::Canary::start();
    let bin = fx.bin();
    let rt = ["--runtime", bin.to_str().unwrap()];
    podman
        .run(
            &[
                &rt[..],
                &[
                    "run",
                    "-d",
                    "--name",
                    "entered",
                    "--network",
                    "none",
                    IMAGE,
                    "sh",
                    "-c",
                    kit::ENTERED_INIT,
                ],
            ]
            .concat(),
        )
        .ok();
    let deadline = Instant::now() + Duration::from_secs(10);
    while podman
        .run(&[&rt[..], &["exec", "entered", "cat", "/tmp/init-map"]].concat())
        .code
        != 0
    {
        assert!(Instant::now() < deadline, "the init never got ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = podman.run(
        &[
            &rt[..],
            &["exec", "entered", "sh", "-c", kit::ENTERED_PROBE],
        ]
        .concat(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    kit::assert_entered(&out, &canary);

    let init: i32 = podman
        .run(&["inspect", "--format", "{{.State.Pid}}", "entered"])
        .ok()
        .stdout
        .trim()
        .parse()
        .unwrap();
    let mark = kit::unique_mark();
    podman
        .run(&[&rt[..], &["exec", "-d", "entered", "sleep", &mark]].concat())
        .ok();
    let (uid, cgroups) = kit::host_view(kit::pid_of_sleep(&mark));
    let (init_uid, init_cgroups) = kit::host_view(init);
    assert_eq!((uid, cgroups), (init_uid, init_cgroups));
    assert_ne!(uid, 0, "podman exec runs as host root");
    if let Who::User(u) = &fx.who {
        assert_eq!(uid, u.uid);
    }
    podman.run(&["rm", "-f", "entered"]).ok();
}
as_root_and_rootless!(RUNSBX, podman_exec_is_held_to_the_sandbox: podman_exec_as_root, podman_exec_rootless);

/// podman as a new user runs it as root, with its own default network
/// (a CNI bridge in a namespace at /run/netns/…): the sandbox gets its own
/// loopback instead, and `runsbx harden` of podman's spec says so. With
/// `--uidmap` podman wires its bridge in after create; start removes it.
/// A `runsbx.timeout` annotation ends the container.
#[test]
fn podman_default_network_and_deadline() {
    if !kit::is_root() {
        skip!("podman_default_network_and_deadline: podman's default bridge network needs root");
    }
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let bin = fx.bin();
    let rt = ["--runtime", bin.to_str().unwrap()];

    let out = podman.run(
        &[
            &rt[..],
            &["run", "--rm", IMAGE, "sh", "-c", "echo hi; probe ifaces"],
        ]
        .concat(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "hi\nif lo\naddr lo 127.0.0.1\n", "{out:?}");

    podman
        .run(&[&rt[..], &["create", "--name", "cr", IMAGE, "true"]].concat())
        .ok();
    podman.run(&[&rt[..], &["init", "cr"]].concat()).ok();
    let dir = podman
        .run(&["inspect", "--format", "{{.StaticDir}}", "cr"])
        .ok()
        .stdout
        .trim()
        .to_owned();
    let config = fs::read_to_string(Path::new(&dir).join("config.json")).unwrap();
    assert!(
        config.contains("\"/run/netns/"),
        "podman's spec has no netns path: {config}"
    );
    let out = output_via_files(Command::new(bin).args(["harden", "--bundle", &dir]));
    assert_eq!(out.code, 0, "{out:?}");
    let changes = out.json()["changes"].clone();
    assert!(
        changes
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["field"] == "linux.namespaces.network"
                && c["reason"].as_str().unwrap().contains("/run/netns/")),
        "{changes}"
    );
    podman.run(&["rm", "-f", "cr"]).ok();

    let out = podman.run(
        &[
            &rt[..],
            &[
                "run",
                "--rm",
                "--uidmap",
                "0:400000:65536",
                "--gidmap",
                "0:400000:65536",
                IMAGE,
                "sh",
                "-c",
                "probe ifaces; probe connect 10.88.0.1 9; true",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        out.stdout, "if lo\naddr lo 127.0.0.1\nconnect ENETUNREACH\n",
        "{out:?}"
    );

    // The deadline: the engine reaps a sandbox killed with SIGKILL (137).
    let started = Instant::now();
    let out = podman.run(
        &[
            &rt[..],
            &[
                "run",
                "--rm",
                "--annotation",
                "runsbx.timeout=2s",
                IMAGE,
                "sh",
                "-c",
                "while :; do :; done",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.code, 137, "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "ended before its deadline"
    );
    let out = podman.run(
        &[
            &rt[..],
            &[
                "run",
                "--rm",
                "--annotation",
                "runsbx.timeout=forever",
                IMAGE,
                "true",
            ],
        ]
        .concat(),
    );
    assert_ne!(out.code, 0, "{out:?}");
    assert!(
        out.stderr.contains("runsbx.timeout") && out.stderr.contains("is not a duration"),
        "{out:?}"
    );
}

/// podman with its default overlay storage, as root and rootless: an
/// image whose `USER` is 1000 keeps its files' owners (a 0600 file of
/// 1000's is readable, its WORKDIR writable, `ls -ln` shows the image's
/// ids), the container's own layer takes writes, and the sandbox's ids are
/// unprivileged host ids, never host root: as root its own range (the
/// rootfs rebuilt over idmapped layers), rootless the caller's subordinate
/// ids (mapped with newuidmap).
fn podman_overlay_keeps_owners_and_a_writable_layer(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::with_overlay(&fx);
    // The busybox rootfs, with /home/app owned by 1000 (0700) holding a
    // 0600 file, as `RUN chown` in a Containerfile would leave it.
    let root = fx.dir.path().join("user-rootfs");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(kit::rootfs())
        .arg(&root)
        .status()
        .unwrap();
    assert!(cp.success());
    let app = root.join("home/app");
    fs::create_dir_all(&app).unwrap();
    fs::write(app.join("secret"), "only-1000\n").unwrap();
    fs::set_permissions(app.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(&app, fs::Permissions::from_mode(0o700)).unwrap();
    for p in [&app, &app.join("secret")] {
        nix::unistd::chown(p.as_path(), Some(1000.into()), Some(1000.into())).unwrap();
    }
    let tar = fx.dir.path().join("user.tar");
    kit::run_ok(
        Command::new("tar")
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
    );
    let image = "localhost/runsbx-user:test";
    let out = podman.run(&[
        "import",
        "--change",
        "USER 1000",
        "--change",
        "WORKDIR /home/app",
        tar.to_str().unwrap(),
        image,
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let out = podman.run_sandboxed(&[
        image,
        "sh",
        "-c",
        "id -u; cat secret; touch made && echo wrote; ls -ln /home; cat /proc/self/uid_map",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "1000", "{out:?}");
    assert_eq!(lines[1], "only-1000", "{out:?}");
    assert_eq!(lines[2], "wrote", "{out:?}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("drwx------") && l.contains(" 1000 ") && l.ends_with(" app")),
        "the image's owners: {out:?}"
    );
    // Success says nothing on stderr (no warning about id shifting).
    assert!(!out.stderr.contains("idmapped"), "{out:?}");

    // Seen from the host, the image's user 1000 is an unprivileged id.
    let bin = fx.bin();
    let rt = ["--runtime", bin.to_str().unwrap()];
    let out = podman.run(
        &[
            &rt[..],
            &[
                "run",
                "-d",
                "--name",
                "owner",
                "--network",
                "none",
                image,
                "sleep",
                "1000",
            ],
        ]
        .concat(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    let out = podman.run(&["inspect", "--format", "{{.State.Pid}}", "owner"]);
    let pid = out
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{out:?}"));
    let host_uid = kit::host_uid_of(pid);
    match &fx.who {
        // The sandbox's own range.
        Who::Root => assert!(host_uid >= 1_000_000_000 + 1000, "host uid {host_uid}"),
        // Container id n (n >= 1) is the n-th subordinate id.
        Who::User(u) => {
            let (start, count) = kit::subordinate_uids(&u.name).expect("the test user's subuids");
            assert_eq!(
                host_uid,
                u64::from(start) + 999,
                "host uid {host_uid} (subuids {start}+{count})"
            );
        }
    }
    podman.run(&[&rt[..], &["kill", "owner"]].concat()).ok();
    podman
        .run(&[&rt[..], &["rm", "--force", "owner"]].concat())
        .ok();

    // Root in the container writes to the image's files: into its own
    // layer, with the owners the files had.
    let out = podman.run_sandboxed(&[
        "--user",
        "0",
        image,
        "sh",
        "-c",
        "echo extra >> /etc/passwd && tail -1 /etc/passwd && ls -ln /etc/passwd",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("extra\n"), "{out:?}");
    assert!(out.stdout.contains(" 0        0 "), "{out:?}");
    // What was staged for these sandboxes is gone with them: no staged
    // rootfs still names a work directory in this podman's storage.
    let left: Vec<PathBuf> = fs::read_dir("/run/runsbx-rootfs")
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    for dir in left {
        let work = fs::read_to_string(dir.join("overlay-work-dir")).unwrap_or_default();
        assert!(
            !Path::new(&work).starts_with(fx.dir.path()),
            "{dir:?} is left, for {work}"
        );
    }
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, podman_overlay_keeps_owners_and_a_writable_layer: podman_overlay_as_root, podman_overlay_rootless);

/// podman's `--init` (catatonit, bound read-only at /run/podman-init and
/// run as pid 1) and a named volume (its data kept from one container to
/// the next, owned by container root) work under the default profile,
/// while a host path stays refused (podman_errors_are_one_clear_line).
fn podman_init_and_named_volumes(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    if !Path::new("/usr/libexec/podman/catatonit").exists() {
        skip!("podman's init is not installed (apt-get install catatonit)");
    }
    let podman = Podman::with_overlay(&fx);
    podman.import_busybox();
    let out = podman.run_sandboxed(&[
        "--init",
        IMAGE,
        "sh",
        "-c",
        "tr '\\0' ' ' < /proc/1/cmdline; echo; probe status; probe lo",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("/run/podman-init -- sh "), "{out:?}");
    kit::assert_hardened(&out);

    let out = podman.run(&["volume", "create", "vol"]);
    assert_eq!(out.code, 0, "{out:?}");
    let out = podman.run_sandboxed(&["-v", "vol:/data", IMAGE, "sh", "-c", "echo kept > /data/f"]);
    assert_eq!(out.code, 0, "{out:?}");
    let out = podman.run_sandboxed(&[
        "-v",
        "vol:/data",
        IMAGE,
        "sh",
        "-c",
        "cat /data/f; ls -ln /data/f",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "kept", "{out:?}");
    assert!(
        lines[1].contains(" 0        0 "),
        "owned by container root: {out:?}"
    );
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, podman_init_and_named_volumes: podman_init_volumes_as_root, podman_init_volumes_rootless);

/// `podman build --runtime runsbx`: each `RUN` step runs in a sandbox
/// whose writes land in the image being built (as root and rootless), and
/// the image runs with them.
fn podman_build_runs_its_steps_in_runsbx(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::with_overlay(&fx);
    podman.import_busybox();
    let context = fx.dir.path().join("context");
    fs::create_dir_all(&context).unwrap();
    fs::write(
        context.join("Containerfile"),
        format!(
            "FROM {IMAGE}\n\
             RUN mkdir -p /etc/app && echo built > /etc/app/f\n\
             USER 1000\n\
             RUN cat /etc/app/f && id -u\n"
        ),
    )
    .unwrap();
    if let Who::User(u) = &fx.who {
        for p in [context.clone(), context.join("Containerfile")] {
            nix::unistd::chown(&p, Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
    }
    let bin = fx.bin();
    // No network for the steps: rootless podman's slirp4netns cannot open
    // /dev/net/tun on these machines.
    let out = podman.run(&[
        "build",
        "--runtime",
        bin.to_str().unwrap(),
        "--network",
        "none",
        "--no-cache",
        "-t",
        "localhost/runsbx-built:test",
        context.to_str().unwrap(),
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("built\n1000\n"),
        "the second RUN's output: {out:?}"
    );
    let out = podman.run_sandboxed(&["localhost/runsbx-built:test", "cat", "/etc/app/f"]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "built\n"), "{out:?}");
    fx.assert_clean();
}
as_root_and_rootless!(RUNSBX, podman_build_runs_its_steps_in_runsbx: podman_build_as_root, podman_build_rootless);

/// `--tmpfs` (podman asks for `tmpcopyup`) and `--read-only` (its tmpfs on
/// /run, /tmp and /var/tmp): the tmpfs starts with the image's content at
/// that path, with its owners, and takes writes.
fn podman_tmpfs_starts_with_the_images_content(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let out = podman.run_sandboxed(&[
        "--read-only",
        "--tmpfs",
        "/etc",
        IMAGE,
        "sh",
        "-c",
        "grep -c '^root:' /etc/passwd; ls -ln /etc/passwd; echo new > /etc/new && cat /etc/new; \
         grep ' /etc ' /proc/self/mountinfo",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "1", "the image's /etc/passwd: {out:?}");
    assert!(
        lines[1].starts_with("-rw-r--r--") && lines[1].contains(" 0        0 "),
        "owner and mode kept: {out:?}"
    );
    assert_eq!(lines[2], "new", "{out:?}");
    assert!(lines[3].contains(" - tmpfs "), "a tmpfs: {out:?}");

    // A tmpfs below the profile's /tmp is not covered by it.
    let out = podman.run_sandboxed(&[
        "--tmpfs",
        "/tmp/x:size=1m",
        IMAGE,
        "sh",
        "-c",
        "touch /tmp/x/f && grep -c ' /tmp/x ' /proc/self/mountinfo",
    ]);
    assert_eq!((out.code, out.stdout.as_str()), (0, "1\n"), "{out:?}");
}
as_root_and_rootless!(RUNSBX, podman_tmpfs_starts_with_the_images_content: podman_tmpfs_as_root, podman_tmpfs_rootless);

/// What goes wrong is said once, in podman's first line, in runsbx's
/// words: a missing command (127, as under runc: podman reads runc's
/// words), a working directory the image lacks (podman's own check), a
/// refused host bind; and
/// no libcontainer log line reaches podman's stderr.
fn podman_errors_are_one_clear_line(fx: Fixture) {
    if !kit::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let run =
        |extra: &[&str], command: &str| podman.run_sandboxed(&[extra, &[IMAGE, command]].concat());
    let cases: [(&[&str], &str, i32, &str); 3] = [
        (
            &[],
            "no-such-command",
            127,
            "executable file not found in $PATH",
        ),
        (
            &["--workdir", "/nope"],
            "true",
            126,
            // podman checks this one itself, before runsbx is called.
            "workdir \"/nope\" does not exist",
        ),
        (&["-v", "/etc:/hostetc"], "true", 126, "bind_mounts"),
    ];
    for (extra, command, code, cause) in cases {
        let out = run(extra, command);
        assert_eq!(out.code, code, "{extra:?} {command}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains(cause),
            "{extra:?}: first line {first:?}: {out:?}"
        );
        assert_eq!(out.stderr.matches(cause).count(), 1, "said once: {out:?}");
        assert!(
            !out.stderr.contains("ERROR"),
            "a libcontainer line: {out:?}"
        );
    }
    // exec into a running container with a working directory it lacks.
    let bin = fx.bin();
    let rt = ["--runtime", bin.to_str().unwrap()];
    let run_d = [
        "run",
        "-d",
        "--name",
        "up",
        "--network",
        "none",
        IMAGE,
        "sleep",
        "1000",
    ];
    let out = podman.run(&[&rt[..], &run_d[..]].concat());
    assert_eq!(out.code, 0, "{out:?}");
    let out = podman.run(&[&rt[..], &["exec", "up", "sh", "-c", "echo > /tmp/data"]].concat());
    assert_eq!(out.code, 0, "{out:?}");
    // A missing command and one that is not executable get runc's codes
    // (255 for both, before: libcontainer's failed exec); podman reads a
    // missing working directory's "no such file or directory" as runc's.
    let exec_cases: [(&[&str], i32, &str); 3] = [
        (
            &["-w", "/nope", "up", "true"],
            127,
            "exec: working directory \"/nope\": does not exist in container",
        ),
        (
            &["up", "no-such-command"],
            127,
            "command `no-such-command`: executable file not found in $PATH",
        ),
        (
            &["up", "/tmp/data"],
            126,
            "command `/tmp/data` is not an executable file",
        ),
    ];
    for (args, code, cause) in exec_cases {
        let out = podman.run(&[&rt[..], &["exec"], args].concat());
        assert_eq!(out.code, code, "{args:?}: {out:?}");
        let first = out.stderr.lines().next().unwrap_or_default();
        assert!(first.contains(cause), "first line {first:?}: {out:?}");
        assert_eq!(out.stderr.matches(cause).count(), 1, "said once: {out:?}");
        assert!(
            !out.stderr.contains("ERROR"),
            "a libcontainer line: {out:?}"
        );
    }
    podman
        .run(&[&rt[..], &["rm", "--force", "up"]].concat())
        .ok();
}
as_root_and_rootless!(RUNSBX, podman_errors_are_one_clear_line: podman_errors_as_root, podman_errors_rootless);
