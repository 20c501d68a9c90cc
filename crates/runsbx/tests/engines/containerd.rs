//! containerd drives runsbx through `ctr run --runc-binary`: the exit
//! code, hardening, `--seccomp`, and `ctr task exec` held to the sandbox.

use std::fs;
use std::path::Path;
use std::time::Duration;

use runsbx_testkit::{self as kit, output_via_files, skip, Daemon, Fixture, Out, Who};

use crate::podman::Podman;
use crate::{IMAGE, RUNSBX};

/// A containerd of the test's own (a [`Daemon`]): root, state, socket and
/// config in its directory, and so is the runc shim's root for runsbx
/// (`ctr run --runc-root`).
struct Containerd {
    daemon: Daemon,
    namespace: String,
}

impl Containerd {
    fn start() -> Self {
        let mut d = Daemon::prepare("runsbx-ctr-", RUNSBX);
        let p = d.path().to_path_buf();
        let config = p.join("containerd.toml");
        fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
                 [grpc]\n  address = \"{sock}\"\n\
                 [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
                root = p.join("root").display(),
                state = p.join("state-ctd").display(),
                sock = socket(&d).display(),
                opt = p.join("opt").display(),
            ),
        )
        .unwrap();
        let namespace = format!("runsbx-test-{}", std::process::id());
        // The runc shim runs its runtime with --root <runc-root>/<namespace>.
        d.runsbx_root = runc_root(&d).join(&namespace);
        d.start(
            "containerd",
            &["--config".to_owned(), config.display().to_string()],
        );
        let ns = namespace.clone();
        d.wait_ready(Duration::from_secs(30), |d| {
            ctr(d, &ns, &["version"]).code == 0
        });
        let ns = namespace.clone();
        d.on_drop(move |d| {
            // What a user would do on the way out: remove every container.
            let ids = ctr(d, &ns, &["containers", "ls", "-q"]).stdout;
            for id in ids.split_whitespace() {
                ctr(d, &ns, &["tasks", "delete", "--force", id]);
                ctr(d, &ns, &["containers", "delete", id]);
            }
        });
        Self {
            daemon: d,
            namespace,
        }
    }

    fn ctr(&self, args: &[&str]) -> Out {
        ctr(&self.daemon, &self.namespace, args)
    }

    /// `ctr run` with runsbx as the runtime, its state in the daemon's
    /// directory.
    fn run(&self, args: &[&str]) -> Out {
        let bin = self.daemon.runsbx.display().to_string();
        let root = runc_root(&self.daemon).display().to_string();
        let mut all = vec!["run", "--runc-binary", &bin, "--runc-root", &root];
        all.extend_from_slice(args);
        self.ctr(&all)
    }
}

fn socket(d: &Daemon) -> std::path::PathBuf {
    d.path().join("containerd.sock")
}

fn runc_root(d: &Daemon) -> std::path::PathBuf {
    d.path().join("runsbx-root")
}

fn ctr(d: &Daemon, namespace: &str, args: &[&str]) -> Out {
    let mut cmd = std::process::Command::new("ctr");
    cmd.arg("--address")
        .arg(socket(d))
        .arg("--namespace")
        .arg(namespace)
        .args(args);
    output_via_files(&mut cmd)
}

#[test]
fn containerd_runs_runsbx() {
    if !kit::is_root() {
        skip!("containerd_runs_runsbx: needs root");
    }
    for tool in ["containerd", "ctr", "podman", "unshare", "nsenter"] {
        if !kit::have(tool) {
            skip!("{tool} is not installed (hack/install-deps.sh)");
        }
    }
    let fx = Fixture::new(RUNSBX, Who::Root);
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
            IMAGE,
        ])
        .ok();

    let ctd = Containerd::start();
    ctd.ctr(&["images", "import", archive.to_str().unwrap()])
        .ok();
    let out = ctd.run(&[
        "--rm",
        IMAGE,
        "t1",
        "sh",
        "-c",
        "echo hi; probe lo; probe status; exit 7",
    ]);
    assert_eq!(out.code, 7, "{out:?}");
    assert!(out.stdout.starts_with("hi\n"), "{out:?}");
    kit::assert_hardened(&out);

    let out = ctd.run(&[
        "--rm",
        "--seccomp",
        IMAGE,
        "t2",
        "grep",
        "^Seccomp:",
        "/proc/self/status",
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "Seccomp:\t2\n");
    // ctr task exec is held to the sandbox as the task's init is.
    let canary = kit::Canary::start();
    ctd.run(&["-d", IMAGE, "t3", "sh", "-c", kit::ENTERED_INIT])
        .ok();
    let mut n = 0;
    kit::wait_until("the init to get ready", Duration::from_secs(10), || {
        n += 1;
        let id = format!("w{n}");
        let args = [
            "task",
            "exec",
            "--exec-id",
            &id,
            "t3",
            "cat",
            "/tmp/init-map",
        ];
        ctd.ctr(&args).code == 0
    });
    let out = ctd.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "probe",
        "t3",
        "sh",
        "-c",
        kit::ENTERED_PROBE,
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    kit::assert_entered(&out, &canary);
    let mark = kit::unique_mark();
    ctd.ctr(&[
        "task",
        "exec",
        "-d",
        "--exec-id",
        "bg",
        "t3",
        "sleep",
        &mark,
    ])
    .ok();
    let (uid, cgroups) = kit::host_view(kit::pid_of_sleep(&mark));
    let tasks = ctd.ctr(&["tasks", "ls"]).ok();
    let init: i32 = tasks
        .stdout
        .lines()
        .find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some("t3")).then(|| cols.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no t3 task: {tasks:?}"));
    assert_eq!((uid, cgroups), kit::host_view(init));
    assert_ne!(uid, 0, "ctr task exec runs as host root");
    ctd.ctr(&["task", "kill", "-s", "SIGKILL", "t3"]).ok();
    kit::wait_until("task t3 to stop", Duration::from_secs(10), || {
        ctd.ctr(&["task", "delete", "t3"]).code == 0
    });
    ctd.ctr(&["containers", "delete", "t3"]).ok();

    let tasks = ctd.ctr(&["tasks", "ls", "-q"]).ok();
    assert_eq!(tasks.stdout, "", "tasks left behind");
    let containers = ctd.ctr(&["containers", "ls", "-q"]).ok();
    assert_eq!(containers.stdout, "", "containers left behind");
    // The shim's --root for this namespace holds runsbx's own bookkeeping
    // directory (runc has none): runsbx was the runtime called.
    let root: &Path = &ctd.daemon.runsbx_root;
    assert!(
        root.join("@locks").is_dir(),
        "runsbx did not run: no {root:?}/@locks"
    );
    assert_eq!(
        ctd.daemon.runsbx_containers(),
        Vec::<String>::new(),
        "runsbx state left in {root:?}"
    );
}
