//! Shared parts of the integration tests: the built binary, a busybox root
//! filesystem, bundles, the unprivileged test user, and loud skips.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// Skips the test with a loud `SKIP <reason>`; under CI (CI=true) a skip
/// is a failure, since CI installs everything the tests need.
#[macro_export]
macro_rules! skip {
    ($($arg:tt)*) => {{
        let reason = format!($($arg)*);
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("SKIP is not allowed under CI: {reason}");
        }
        eprintln!("SKIP {reason}");
        return;
    }};
}

/// A directory every user can reach, for what the unprivileged test user
/// must read or run: the checkout may sit under a private home. hack/test.sh
/// removes these after the run.
fn shared_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(format!("/tmp/runsbx-tests/{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for d in [Path::new("/tmp/runsbx-tests"), &dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        dir
    })
}

/// The runsbx under test: a copy of the built binary in the shared
/// directory, so that the unprivileged user can run it too.
pub fn bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let copy = shared_dir().join("runsbx");
        let tmp = shared_dir().join(format!("runsbx.{:?}", std::thread::current().id()));
        fs::copy(env!("CARGO_BIN_EXE_runsbx"), &tmp).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755)).unwrap();
        fs::rename(&tmp, &copy).unwrap();
        copy
    })
    .clone()
}

pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The unprivileged user the test setup (hack/test.sh) creates.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

pub fn test_user() -> Option<User> {
    let name = std::env::var("RUNSBX_TEST_USER").unwrap_or_else(|_| "runsbx-test".to_owned());
    let user = nix::unistd::User::from_name(&name).ok()??;
    Some(User {
        name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        home: user.dir,
    })
}

/// Who runs runsbx in a test.
#[derive(Debug, Clone)]
pub enum Who {
    Root,
    User(User),
}

/// A busybox root filesystem shared by every test (read-only to them).
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let dir = shared_dir().join("rootfs");
        let _ = fs::remove_dir_all(&dir);
        let bin = dir.join("bin");
        fs::create_dir_all(&bin).unwrap();
        let busybox = ["/bin/busybox", "/usr/bin/busybox"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("busybox-static is installed (apt-get install busybox-static)");
        fs::copy(busybox, bin.join("busybox")).unwrap();
        // The original, not the copy: another test thread forking while the
        // copy's fd is open would make exec of the copy fail with ETXTBSY.
        let list = Command::new(busybox).arg("--list").output().unwrap();
        for applet in String::from_utf8_lossy(&list.stdout).lines() {
            if applet != "busybox" {
                let _ = symlink("busybox", bin.join(applet));
            }
        }
        for d in ["proc", "sys", "dev", "tmp", "etc", "root", "workspace"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        // The in-sandbox probe (tests/probe.c), static so that it runs in
        // the busybox image.
        let probe_c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/probe.c");
        let built = Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(bin.join("probe"))
            .arg(&probe_c)
            .status()
            .expect("gcc is installed (apt-get install build-essential)");
        assert!(built.success(), "building {probe_c:?} failed");
        fs::write(
            dir.join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
        )
        .unwrap();
        fs::write(dir.join("etc/group"), "root:x:0:\nnobody:x:65534:\n").unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        dir
    })
}

/// The busybox rootfs plus the host's Python 3, pip and two coreutils
/// (tests/python-rootfs.sh), shared by the tests that need real programs.
pub fn python_rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let dir = shared_dir().join("python-rootfs");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/python-rootfs.sh");
        let out = Out::of(
            Command::new("bash")
                .arg(&script)
                .arg(rootfs())
                .arg(&dir)
                .output()
                .unwrap(),
        );
        assert_eq!(out.code, 0, "{script:?}: {out:?}");
        dir
    })
}

/// A temporary directory, a state root in it, and who runs runsbx.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub who: Who,
}

impl Fixture {
    pub fn new(who: Who) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("runsbx-test-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        if let Who::User(u) = &who {
            nix::unistd::chown(dir.path(), Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        let state = dir.path().join("state");
        Self { dir, state, who }
    }

    pub fn rootless(&self) -> bool {
        matches!(self.who, Who::User(_))
    }

    /// A runsbx command with this fixture's state root, as `who`.
    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(bin());
        cmd.arg("--root").arg(&self.state).args(args);
        self.as_who(&mut cmd);
        cmd
    }

    /// Makes `cmd` run as this fixture's user.
    pub fn as_who(&self, cmd: &mut Command) {
        if let Who::User(u) = &self.who {
            cmd.uid(u.uid)
                .gid(u.gid)
                .env("HOME", &u.home)
                .env_remove("XDG_RUNTIME_DIR");
        }
    }

    /// Runs runsbx to the end. Output goes through files, not pipes: a
    /// container made by `create` or `run --detach` inherits runsbx's stdio
    /// and would hold a pipe open long after runsbx has exited.
    pub fn run<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_via_files(&mut self.cmd(args))
    }

    /// A bundle named `name` running `args`, from `runsbx spec` (with
    /// `--rootless` for the unprivileged user), then `edit`.
    pub fn bundle(&self, name: &str, args: &[&str], edit: impl FnOnce(&mut Value)) -> PathBuf {
        let dir = self.dir.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        if let Who::User(u) = &self.who {
            nix::unistd::chown(&dir, Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        let mut spec = Command::new(bin());
        spec.arg("spec").arg("--bundle").arg(&dir);
        if self.rootless() {
            spec.arg("--rootless");
        }
        self.as_who(&mut spec);
        let out = output_via_files(&mut spec);
        assert_eq!(out.code, 0, "runsbx spec: {}", out.stderr);
        let path = dir.join("config.json");
        let mut config: Value = serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        config["root"]["path"] = Value::from(rootfs().to_str().unwrap());
        config["process"]["terminal"] = Value::from(false);
        config["process"]["args"] =
            Value::from(args.iter().map(|a| Value::from(*a)).collect::<Vec<_>>());
        edit(&mut config);
        fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
        dir
    }

    /// The names in the state root other than runsbx's own bookkeeping
    /// directories, and whatever those still hold.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(entries) = fs::read_dir(&self.state) else {
            return left;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('@') {
                for inner in fs::read_dir(e.path()).unwrap().flatten() {
                    left.push(format!("{name}/{}", inner.file_name().to_string_lossy()));
                }
            } else {
                left.push(name);
            }
        }
        left.sort();
        left
    }

    /// Processes whose command line or root mentions this fixture.
    pub fn stray_processes(&self) -> Vec<String> {
        let needle = self.dir.path().to_string_lossy().into_owned();
        let mut found = Vec::new();
        for e in fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            if pid == std::process::id() as i32 {
                continue;
            }
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if cmdline.contains(&needle) && !state.contains(") Z") {
                found.push(format!("{pid}: {cmdline}"));
            }
        }
        found
    }

    /// Mounts whose source or target mentions this fixture.
    pub fn stray_mounts(&self) -> Vec<String> {
        let needle = self.dir.path().to_string_lossy().into_owned();
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&needle))
            .map(str::to_owned)
            .collect()
    }

    /// Asserts nothing of this fixture's containers is left on the host.
    pub fn assert_clean(&self) {
        assert_eq!(self.leftovers(), Vec::<String>::new(), "state left behind");
        assert_eq!(
            self.stray_processes(),
            Vec::<String>::new(),
            "processes left behind"
        );
        assert_eq!(
            self.stray_mounts(),
            Vec::<String>::new(),
            "mounts left behind"
        );
    }

    /// Waits until `state ID` reports `status`.
    pub fn wait_status(&self, id: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = self.run(["state", id]);
            if out.code == 0 && out.json()["status"] == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "`{id}` never became {status}: {out:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Leave no container behind even when a test fails half-way.
        if let Ok(entries) = fs::read_dir(&self.state) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with('@') {
                    let _ = self.cmd(["delete", "--force", &name]).output();
                }
            }
        }
    }
}

/// Asserts the lines `probe status; probe lo` print in a hardened sandbox:
/// no capabilities, no_new_privs, seccomp filter mode, lo up.
pub fn assert_hardened(out: &Out) {
    for line in [
        "CapEff:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "lo UP",
    ] {
        assert!(
            out.stdout.lines().any(|l| l == line),
            "{line:?} missing: {out:?}"
        );
    }
}

/// A finished command: exit code and text output.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn of(o: Output) -> Self {
        use std::os::unix::process::ExitStatusExt;
        let code = o
            .status
            .code()
            .unwrap_or_else(|| 128 + o.status.signal().unwrap_or(0));
        Self {
            code,
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "command failed: {self:?}");
        self
    }
}

/// Runs `cmd`, retrying while its binary is "busy": a test thread that
/// forks while another copies the binary (the runsbx copy in the shared
/// directory) holds a write fd to it until its child execs.
fn status_retrying_etxtbsy(cmd: &mut Command) -> std::process::ExitStatus {
    spawn(cmd).wait().unwrap()
}

/// Spawns `cmd`, retrying on ETXTBSY (see `status_retrying_etxtbsy`).
pub fn spawn(cmd: &mut Command) -> std::process::Child {
    for _ in 0..100 {
        match cmd.spawn() {
            Err(e) if e.raw_os_error() == Some(nix::libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(10))
            }
            other => return other.unwrap(),
        }
    }
    panic!("{cmd:?}: still ETXTBSY after 1 s");
}

/// Runs `cmd` to its end with stdout and stderr sent to files.
pub fn output_via_files(cmd: &mut Command) -> Out {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap());
    let status = status_retrying_etxtbsy(cmd);
    let read = |mut f: fs::File| {
        use std::io::{Read, Seek};
        let mut s = String::new();
        f.rewind().unwrap();
        f.read_to_string(&mut s).unwrap();
        s
    };
    use std::os::unix::process::ExitStatusExt;
    Out {
        code: status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
        stdout: read(out),
        stderr: read(err),
    }
}

/// Runs `cmd` and fails the test if it has not ended within `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Out {
    let mut child = spawn(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return Out::of(child.wait_with_output().unwrap());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{cmd:?} did not end within {limit:?}: {:?}", Out::of(out));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Each test body runs twice: as root and as the unprivileged test user.
#[macro_export]
macro_rules! as_root_and_rootless {
    ($body:ident: $root:ident, $rootless:ident) => {
        #[test]
        fn $root() {
            if !support::is_root() {
                skip!("{}: needs root", stringify!($root));
            }
            $body(support::Fixture::new(support::Who::Root));
        }

        #[test]
        fn $rootless() {
            if !support::is_root() {
                skip!(
                    "{}: needs root to switch to the test user",
                    stringify!($rootless)
                );
            }
            let Some(user) = support::test_user() else {
                skip!(
                    "{}: no test user (hack/test.sh creates `runsbx-test`)",
                    stringify!($rootless)
                );
            };
            $body(support::Fixture::new(support::Who::User(user)));
        }
    };
}

// What every way into a sandbox is checked against; shared with the
// engine tests of tests/cri.
#[path = "../../../../tests/entered.rs"]
mod entered;
#[allow(unused_imports)] // each test binary uses its own part of it
pub use entered::{
    assert_entered_output, host_view, pid_of_sleep, unique_mark, Canary, ENTERED_INIT,
    ENTERED_PROBE,
};

/// [`assert_entered_output`] of a runsbx command's output; under runsbx's
/// own specs and podman's and containerd's, no port below 1024 either.
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
