//! Real container engines drive runsbx: podman (as root and rootless) and
//! containerd through `ctr run --runc-binary`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use support::{output_via_files, Fixture, Out, Who};

/// A tar of the busybox rootfs, as `podman import` takes it.
fn rootfs_tar(dir: &Path) -> PathBuf {
    let tar = dir.join("busybox.tar");
    let out = Out::of(
        Command::new("tar")
            .arg("-C")
            .arg(support::rootfs())
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .unwrap(),
    );
    assert_eq!(out.code, 0, "{out:?}");
    fs::set_permissions(&tar, fs::Permissions::from_mode(0o644)).unwrap();
    tar
}

/// podman with its own storage under the fixture, no network (the sandbox
/// has its own loopback; slirp4netns cannot open /dev/net/tun here).
struct Podman<'a> {
    fx: &'a Fixture,
    xdg: PathBuf,
}

impl<'a> Podman<'a> {
    fn new(fx: &'a Fixture) -> Self {
        let xdg = fx.dir.path().join("xdg");
        fs::create_dir_all(&xdg).unwrap();
        fs::set_permissions(&xdg, fs::Permissions::from_mode(0o700)).unwrap();
        if let Who::User(u) = &fx.who {
            nix::unistd::chown(xdg.as_path(), Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        Self { fx, xdg }
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
                "vfs",
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

    fn run(&self, args: &[&str]) -> Out {
        output_via_files(&mut self.cmd(args))
    }

    /// `localhost/runsbx-busybox:test`, imported from a tar of the test rootfs.
    fn import_busybox(&self) {
        let tar = rootfs_tar(self.fx.dir.path());
        self.run(&[
            "import",
            tar.to_str().unwrap(),
            "localhost/runsbx-busybox:test",
        ])
        .ok();
    }
}

impl Drop for Podman<'_> {
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force"]);
        // Rootless storage holds files owned by subordinate ids.
        let _ = self.run(&[
            "unshare",
            "rm",
            "-rf",
            self.fx.dir.path().join("storage").to_str().unwrap(),
        ]);
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
    }
}

fn podman_runs_runsbx(fx: Fixture) {
    if !support::have("podman") {
        skip!("podman is not installed (apt-get install podman)");
    }
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let log = fx.dir.path().join("runsbx.log");
    if let Who::User(u) = &fx.who {
        fs::write(&log, "").unwrap();
        nix::unistd::chown(&log, Some(u.uid.into()), Some(u.gid.into())).unwrap();
    }
    let bin = support::bin();
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
        "localhost/runsbx-busybox:test",
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

    let out = podman.run(&[
        "--runtime",
        bin.to_str().unwrap(),
        "run",
        "--rm",
        "--network",
        "none",
        "localhost/runsbx-busybox:test",
        "sh",
        "-c",
        "probe status; probe lo; exit 7",
    ]);
    assert_eq!(out.code, 7, "{out:?}");
    // Hardened under podman too.
    support::assert_hardened(&out);

    // A terminal (podman hands runsbx a console socket), a detached
    // container, and exec into it with and without a terminal.
    let rt = ["--runtime", bin.to_str().unwrap()];
    let out = podman.run(
        &[
            &rt[..],
            &[
                "run",
                "-t",
                "--rm",
                "--network",
                "none",
                "localhost/runsbx-busybox:test",
                "tty",
            ],
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
                    "localhost/runsbx-busybox:test",
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
as_root_and_rootless!(podman_runs_runsbx: podman_as_root, podman_rootless);

/// A containerd of the test's own: root, state, socket and config in a
/// temporary directory; killed when dropped.
struct Containerd {
    child: Child,
    socket: PathBuf,
    namespace: String,
}

impl Containerd {
    fn start(dir: &Path) -> Self {
        let socket = dir.join("containerd.sock");
        let config = dir.join("containerd.toml");
        fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 [grpc]\n  address = \"{sock}\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
                root = dir.join("root").display(),
                state = dir.join("state-ctd").display(),
                sock = socket.display(),
                opt = dir.join("opt").display(),
            ),
        )
        .unwrap();
        let log = fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let ctd = Self {
            child,
            socket,
            namespace: format!("runsbx-test-{}", std::process::id()),
        };
        while ctd.ctr(&["version"]).code != 0 {
            assert!(
                Instant::now() < deadline,
                "containerd did not come up: {}",
                fs::read_to_string(dir.join("containerd.log")).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        ctd
    }

    fn ctr(&self, args: &[&str]) -> Out {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(&self.socket)
            .arg("--namespace")
            .arg(&self.namespace)
            .args(args);
        output_via_files(&mut cmd)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The shim's --root for this namespace, outside the test directory.
        let _ = fs::remove_dir_all(PathBuf::from("/run/containerd/runc").join(&self.namespace));
    }
}

#[test]
fn containerd_runs_runsbx() {
    if !support::is_root() {
        skip!("containerd_runs_runsbx: needs root");
    }
    for tool in ["containerd", "ctr", "podman"] {
        if !support::have(tool) {
            skip!("{tool} is not installed (apt-get install containerd podman)");
        }
    }
    let fx = Fixture::new(Who::Root);
    // An image archive to import: podman's docker-archive of the rootfs.
    let podman = Podman::new(&fx);
    podman.import_busybox();
    let archive = fx.dir.path().join("image.tar");
    podman
        .run(&[
            "save",
            "--format",
            "docker-archive",
            "-o",
            archive.to_str().unwrap(),
            "localhost/runsbx-busybox:test",
        ])
        .ok();

    let ctd = Containerd::start(fx.dir.path());
    ctd.ctr(&["images", "import", archive.to_str().unwrap()])
        .ok();
    let bin = support::bin();
    let out = ctd.ctr(&[
        "run",
        "--rm",
        "--runc-binary",
        bin.to_str().unwrap(),
        "localhost/runsbx-busybox:test",
        "t1",
        "sh",
        "-c",
        "echo hi; probe lo; probe status; exit 7",
    ]);
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stdout.starts_with("hi\n"), "{out:?}");
    support::assert_hardened(&out);

    let out = ctd.ctr(&[
        "run",
        "--rm",
        "--runc-binary",
        bin.to_str().unwrap(),
        "--seccomp",
        "localhost/runsbx-busybox:test",
        "t2",
        "grep",
        "^Seccomp:",
        "/proc/self/status",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "Seccomp:\t2\n");
    let tasks = ctd.ctr(&["tasks", "ls", "-q"]).ok();
    assert_eq!(tasks.stdout, "", "tasks left behind");
    let containers = ctd.ctr(&["containers", "ls", "-q"]).ok();
    assert_eq!(containers.stdout, "", "containers left behind");
    // The shim's --root for this namespace holds runsbx's own bookkeeping
    // directory (runc has none): runsbx was the runtime called.
    let root = PathBuf::from("/run/containerd/runc").join(&ctd.namespace);
    assert!(
        root.join("@locks").is_dir(),
        "runsbx did not run: no {root:?}/@locks"
    );
    let left: Vec<_> = fs::read_dir(&root)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| !n.to_string_lossy().starts_with('@'))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "runsbx state left in {root:?}: {left:?}");
}
