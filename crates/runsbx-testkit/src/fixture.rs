//! A test's own directory and state root, who runs runsbx in it, and what
//! must be gone from the host when the test is done.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::command::{output_via_files, Out};
use crate::rootfs::{rootfs, runsbx_copy};

/// The unprivileged user the test setup (hack/test.sh) creates.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

/// The unprivileged test user: `RUNSBX_TEST_USER`, by default
/// `runsbx-test`, if it exists.
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

/// The first subordinate uid range `/etc/subuid` gives user `name`:
/// (start, count).
pub fn subordinate_uids(name: &str) -> Option<(u32, u32)> {
    std::fs::read_to_string("/etc/subuid")
        .ok()?
        .lines()
        .find_map(|line| {
            let mut f = line.split(':');
            if f.next()? != name {
                return None;
            }
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
}

/// The real uid of process `pid`, as the host sees it.
pub fn host_uid_of(pid: i64) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no Uid line in /proc/{pid}/status"))
}

/// Who runs runsbx in a test.
#[derive(Debug, Clone)]
pub enum Who {
    Root,
    User(User),
}

/// A temporary directory, a state root in it, who runs runsbx, and the
/// runsbx under test. Dropping it deletes every container left in the
/// state root.
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub who: Who,
    bin: PathBuf,
}

impl Fixture {
    /// A fixture for `who` running `built` (the binary cargo built,
    /// `env!("CARGO_BIN_EXE_runsbx")`, through its shared copy).
    pub fn new(built: impl AsRef<Path>, who: Who) -> Self {
        let bin = runsbx_copy(built.as_ref());
        let dir = tempfile::Builder::new()
            .prefix("runsbx-test-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        if let Who::User(u) = &who {
            nix::unistd::chown(dir.path(), Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        let state = dir.path().join("state");
        Self {
            dir,
            state,
            who,
            bin,
        }
    }

    /// The runsbx under test, runnable by this fixture's user.
    pub fn bin(&self) -> &Path {
        &self.bin
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
        let mut cmd = Command::new(&self.bin);
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

    /// Runs runsbx to the end (its output through files: see
    /// [`output_via_files`]).
    pub fn run<I, S>(&self, args: I) -> Out
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_via_files(&mut self.cmd(args))
    }

    /// `runsbx --config CONFIG run --bundle BUNDLE ID`, to the end.
    pub fn run_with_config(&self, config: &Path, bundle: &Path, id: &str) -> Out {
        let (config, bundle) = (config.as_os_str(), bundle.as_os_str());
        self.run([
            OsStr::new("--config"),
            config,
            OsStr::new("run"),
            OsStr::new("--bundle"),
            bundle,
            OsStr::new(id),
        ])
    }

    /// A bundle named `name` running `args` on the shared busybox rootfs,
    /// from `runsbx spec` (with `--rootless` for the unprivileged user),
    /// then `edit`.
    pub fn bundle(&self, name: &str, args: &[&str], edit: impl FnOnce(&mut Value)) -> PathBuf {
        let dir = self.dir.path().join(name);
        fs::create_dir_all(&dir).unwrap();
        if let Who::User(u) = &self.who {
            nix::unistd::chown(&dir, Some(u.uid.into()), Some(u.gid.into())).unwrap();
        }
        let mut spec = Command::new(&self.bin);
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
    /// directories, and whatever those still hold. The compiled seccomp
    /// filters (`@seccomp/<hash>.bpf`, runsbx-runtime's sys/seccomp.rs)
    /// are kept for every later sandbox, as a cache: not left behind.
    pub fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        let Ok(entries) = fs::read_dir(&self.state) else {
            return left;
        };
        let cached_filter = |name: &str| {
            name.strip_suffix(".bpf")
                .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('@') {
                for inner in fs::read_dir(e.path()).unwrap().flatten() {
                    let inner = inner.file_name().to_string_lossy().into_owned();
                    if name == "@seccomp" && cached_filter(&inner) {
                        continue;
                    }
                    left.push(format!("{name}/{inner}"));
                }
            } else {
                left.push(name);
            }
        }
        left.sort();
        left
    }

    /// Processes whose command line mentions this fixture.
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

    /// cgroups of this fixture's containers. As root, runsbx names each
    /// `runsbx/<key>-<id>` in every hierarchy, `<key>` being the FNV-1a
    /// hash of the state root's path in 8 hex digits (runsbx-runtime's
    /// `stage_key`), so other fixtures' cgroups never match.
    pub fn stray_cgroups(&self) -> Vec<String> {
        let key = self
            .state
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
            }) as u32;
        let prefix = format!("{key:08x}-");
        let mut parents = vec![PathBuf::from("/sys/fs/cgroup/runsbx")];
        for h in fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            parents.push(h.path().join("runsbx"));
        }
        let mut found = Vec::new();
        for parent in parents {
            for e in fs::read_dir(&parent).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    found.push(e.path().display().to_string());
                }
            }
        }
        found
    }

    /// Asserts nothing of this fixture's containers is left on the host:
    /// no state, no process, no mount, no cgroup.
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
        assert_eq!(
            self.stray_cgroups(),
            Vec::<String>::new(),
            "cgroups left behind"
        );
    }

    /// Waits until `state ID` reports `status` (10 s at most).
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
            std::thread::sleep(crate::POLL);
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
