//! An engine's daemon (containerd, dockerd) that a test starts itself, in
//! network and mount namespaces of its own, with its own root, state and
//! socket in a temporary directory; stopped and cleaned up when dropped.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What to undo in a daemon before it is stopped.
type Cleanup = Box<dyn FnMut(&Daemon)>;

/// A daemon in network and mount namespaces of its own
/// (`unshare --net --mount --propagation private`): its loopback is up,
/// and /run/netns is a tmpfs of its own, so that the network namespaces
/// CNI names there stay off the host. Dropping it runs the `cleanup`
/// given to [`Daemon::on_drop`], deletes whatever runsbx still holds in
/// `runsbx_root`, stops the daemon and every process that names `dir`,
/// and removes `dir`.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub runsbx: PathBuf,
    pub runsbx_root: PathBuf,
    pub log: PathBuf,
    cleanup: Option<Cleanup>,
    /// The ids of the mounts the daemon's namespace copied from the host
    /// when it was made: other tests' stage mounts among them are not
    /// this daemon's to undo.
    inherited: Vec<String>,
}

impl Daemon {
    /// A temporary directory for a daemon, with a copy of `built` (the
    /// runsbx under test, `env!("CARGO_BIN_EXE_runsbx")`) in it: the
    /// runtime the daemon is configured with. `runsbx_root` is where that
    /// runtime keeps its state; the test sets it to what it configures.
    pub fn prepare(prefix: &str, built: impl AsRef<Path>) -> Self {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
        let runsbx = dir.path().join("runsbx");
        fs::copy(built.as_ref(), &runsbx).unwrap();
        fs::set_permissions(&runsbx, fs::Permissions::from_mode(0o755)).unwrap();
        let runsbx_root = dir.path().join("runsbx-root");
        let log = dir.path().join("daemon.log");
        Self {
            dir,
            child: None,
            runsbx,
            runsbx_root,
            log,
            cleanup: None,
            inherited: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Starts `program args` in its own network and mount namespaces.
    pub fn start(&mut self, program: &str, args: &[String]) {
        let log = fs::File::create(&self.log).unwrap();
        let child = Command::new("unshare")
            .args(["--net", "--mount", "--propagation", "private", "sh", "-c"])
            .arg(
                "set -e; ip link set lo up; mkdir -p /run/netns; \
                 mount -t tmpfs -o mode=0755 tmpfs /run/netns; exec \"$@\"",
            )
            .arg("sh")
            .arg(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `ready` holds, failing with the daemon's log after
    /// `limit`.
    pub fn wait_ready(&mut self, limit: Duration, mut ready: impl FnMut(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while !ready(self) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("the daemon exited ({status}): {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not come up: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.inherited = self
            .mountinfo()
            .iter()
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned)
            .collect();
    }

    /// The lines of the daemon namespace's mountinfo.
    fn mountinfo(&self) -> Vec<String> {
        fs::read_to_string(format!("/proc/{}/mountinfo", self.pid()))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// `program` in the daemon's network and mount namespaces.
    pub fn nsenter(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.pid().to_string())
            .args(["-n", "-m", "--"])
            .arg(program);
        cmd
    }

    /// What the daemon's engine must undo before it is stopped (remove its
    /// pods or containers).
    pub fn on_drop(&mut self, cleanup: impl FnMut(&Daemon) + 'static) {
        self.cleanup = Some(Box::new(cleanup));
    }

    /// The containers runsbx holds in its state root (not its own `@`
    /// directories).
    pub fn runsbx_containers(&self) -> Vec<String> {
        let mut ids: Vec<String> = fs::read_dir(&self.runsbx_root)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('@'))
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    }

    /// What runsbx still holds under its `@` directories (effective
    /// bundles, locks of live containers are not counted).
    pub fn runsbx_bundles(&self) -> Vec<String> {
        fs::read_dir(self.runsbx_root.join("@bundles"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Mounts in the daemon's mount namespace that runsbx made for its
    /// containers (staged rootfs) or that name the daemon's directory's
    /// runsbx state; not those the namespace copied from the host when it
    /// was made (the stage mounts of tests running beside this one).
    pub fn runsbx_mounts(&self) -> Vec<String> {
        self.mountinfo()
            .into_iter()
            .filter(|l| l.contains("/run/runsbx-rootfs/") || l.contains("runsbx-root"))
            .filter(|l| {
                let id = l.split(' ').next().unwrap_or_default();
                !self.inherited.iter().any(|i| i == id)
            })
            .collect()
    }

    /// Processes other than the daemon whose command line names the
    /// daemon's directory, or that run in a namespace runsbx made for one
    /// of its containers (their root is below the daemon's directory).
    pub fn stray_processes(&self) -> Vec<(i32, String)> {
        let needle = self.dir.path().to_string_lossy().into_owned();
        let daemon = self.child.as_ref().map(|c| c.id() as i32);
        let me = std::process::id() as i32;
        let mut found = Vec::new();
        for e in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if Some(pid) == daemon || pid == me {
                continue;
            }
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat.contains(") Z") {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&needle) {
                found.push((pid, cmdline));
            }
        }
        found
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut cleanup) = self.cleanup.take() {
            if self.child.is_some() {
                cleanup(self);
            }
        }
        if self.child.is_some() {
            for id in self.runsbx_containers() {
                let _ = self
                    .nsenter(self.runsbx.to_str().unwrap())
                    .arg("--root")
                    .arg(&self.runsbx_root)
                    .args(["delete", "--force", &id])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
        }
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // Shims and what they started outlive their daemon.
        for (pid, _) in self.stray_processes() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
        // Whatever was mounted lived in the daemon's mount namespace, gone
        // with its last process; the files are removed with the directory.
        let _ = fs::remove_dir_all(self.dir.path());
    }
}
