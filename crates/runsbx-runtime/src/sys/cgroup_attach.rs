//! Placing a new sandbox in its cgroup v1 hierarchies without waiting for
//! an RCU grace period.
//!
//! Writing a pid to a v1 `cgroup.procs` file moves a whole thread group, so
//! the kernel takes its global `cgroup_threadgroup_rwsem` for writing, and
//! the first writer after a quiet moment waits for a full RCU grace period
//! (7-15 ms measured on a 2-core VM, with both CPUs idle). libcontainer's
//! intermediate process does exactly that when it joins the sandbox's
//! cgroups: it was half of a cold `runsbx run`. A thread that moves only
//! itself (`0` written to `tasks`) is exempt from that lock, and a process
//! forked by a thread starts in that thread's cgroups.
//!
//! So, as root on a cgroup v1 (or hybrid) host, runsbx
//! - makes the sandbox's cgroup in each hierarchy libcontainer will use
//!   (as libcontainer would, cpuset's cpus and mems copied down), and
//!   writes its limits and device rules there itself when it can write
//!   them exactly as libcontainer would (sys/cgroup_limits.rs),
//! - enters a mount namespace of its own, from which nothing propagates
//!   back, where libcontainer's own cgroup writes land in plain files:
//!   - when runsbx wrote the limits, libcontainer is given none, and sees
//!     a cgroup2 root at /sys/fs/cgroup (the host's unified hierarchy,
//!     bound there), so that it builds its cgroup v2 manager, which finds
//!     nothing (see [`ManagerView`]): the v1 manager it builds otherwise
//!     searches the mount table once per controller, a fifth of a cold
//!     call here; its one write, the process into `cgroup.procs`, goes to
//!     a file of a tmpfs mounted over runsbx's part of that hierarchy;
//!   - otherwise, a plain file bound over each of the sandbox's v1
//!     `cgroup.procs`, and libcontainer writes the limits,
//! - builds the container from a thread that has first moved itself into
//!   the sandbox's cgroups: libcontainer's intermediate process is forked
//!   there,
//! - moves that thread back, and returns to the host's mount namespace.
//!
//! `exec` does the same with the sandbox's existing cgroups; it joins the
//! sandbox's user namespace before it builds, so it cannot return to the
//! host's mount namespace and stays in its own until it ends.
//!
//! The sandbox's processes end up in exactly the cgroups libcontainer
//! would have put them in; only the lock is skipped. Where any of this does
//! not apply (cgroup v2, a relative cgroup path, a hierarchy not mounted at
//! its root, a pids limit under [`MIN_PIDS_LIMIT`], a process with other
//! threads; for `exec`, a paused sandbox or a sub-cgroup), libcontainer
//! joins the cgroups itself.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcontainer::oci_spec::runtime::{LinuxResources, Spec};
use nix::mount::{mount, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use crate::error::{Result, RuntimeError};
use crate::sys::cgroup_limits;
use crate::sys::privilege::{self, CgroupLayout};

/// The v1 controllers libcontainer's cgroup manager uses, each with the
/// last path components of the mount points it accepts for it (its own
/// rule: a hierarchy mounted elsewhere is one it does not use).
const CONTROLLERS: &[(&str, &[&str])] = &[
    ("cpu", &["cpu,cpuacct", "cpu"]),
    ("cpuacct", &["cpu,cpuacct", "cpuacct"]),
    ("cpuset", &["cpuset"]),
    ("devices", &["devices"]),
    ("hugetlb", &["hugetlb"]),
    ("memory", &["memory"]),
    ("pids", &["pids"]),
    ("perf_event", &["perf_event"]),
    ("blkio", &["blkio"]),
    (
        "net_prio",
        &["net_cls,net_prio", "net_prio,net_cls", "net_prio"],
    ),
    (
        "net_cls",
        &["net_cls,net_prio", "net_prio,net_cls", "net_cls"],
    ),
    ("freezer", &["freezer"]),
];

/// While it builds, the building thread is one more task in the sandbox's
/// pids cgroup (besides libcontainer's intermediate process and the
/// init). Below this limit libcontainer joins the cgroups itself, so that
/// the thread never takes a task the sandbox was given.
const MIN_PIDS_LIMIT: i64 = 16;

/// How long [`PrivateMounts::back`] waits for a joined thread to finish
/// exiting.
const THREAD_EXIT: Duration = Duration::from_secs(1);

/// The cgroup limits `spec` gives its sandbox, for [`FastAttach::prepare`].
pub(crate) fn resources(spec: &Spec) -> Option<&LinuxResources> {
    spec.linux().as_ref().and_then(|l| l.resources().as_ref())
}

/// One hierarchy the sandbox joins.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hierarchy {
    /// The sandbox's cgroup directory in it.
    sandbox: PathBuf,
    /// The cgroup directory this process is in now.
    home: PathBuf,
    /// The controllers mounted there (`cpu` and `cpuacct` often share one).
    controllers: Vec<&'static str>,
}

/// The cgroup, in every hierarchy, under which runsbx makes its
/// sandboxes' (state/container.rs, `runsbx_cgroup_path`).
pub(crate) const CGROUP_PARENT: &str = "runsbx";

/// Whether the memory cgroups runsbx makes can limit swap: the kernel
/// keeps swap accounts (`swapaccount=0` or a kernel built without them
/// leaves them out).
///
/// cgroup v1 has them as `memory.memsw.*`, in every memory cgroup the
/// root included; the memory hierarchy is looked for where hosts mount
/// it, and in the mount table only if it is not there. cgroup v2 has
/// `memory.swap.max` in every cgroup but the root: in the one runsbx makes
/// its sandboxes under, in its own, or in one of systemd's. A v2 host
/// where none of them exists yet is taken to have none (the first
/// sandbox makes the first). Asked only where runsbx manages cgroups.
pub(crate) fn swap_accounting() -> bool {
    match privilege::cgroup_layout() {
        CgroupLayout::V1 | CgroupLayout::Hybrid => {
            let file = "memory.memsw.limit_in_bytes";
            Path::new("/sys/fs/cgroup/memory").join(file).exists()
                || libcgroups::v1::util::get_subsystem_mount_point(
                    &libcgroups::v1::ControllerType::Memory,
                )
                .is_ok_and(|mount| mount.join(file).exists())
        }
        CgroupLayout::V2 => {
            let root = Path::new(libcgroups::common::DEFAULT_CGROUP_ROOT);
            let own = fs::read_to_string("/proc/self/cgroup")
                .ok()
                .and_then(|c| {
                    c.lines()
                        .find_map(|l| l.strip_prefix("0::/").map(|p| root.join(p)))
                })
                .filter(|dir| dir != root);
            [
                Some(root.join(CGROUP_PARENT)),
                own,
                Some(root.join("init.scope")),
                Some(root.join("system.slice")),
            ]
            .into_iter()
            .flatten()
            .any(|dir: PathBuf| dir.join("memory.swap.max").exists())
        }
        CgroupLayout::None => false,
    }
}

/// What the fast placement needs, found and made before the build.
#[derive(Debug)]
pub(crate) struct FastAttach {
    hierarchies: Vec<Hierarchy>,
    sink: PathBuf,
    cgroup_path: PathBuf,
    /// runsbx wrote the sandbox's limits itself: libcontainer must be given
    /// none (see [`Self::wrote_limits`]).
    wrote_limits: bool,
}

impl FastAttach {
    /// For a sandbox whose cgroup path is `cgroup_path` (absolute, as
    /// runsbx gives it) and whose limits are `resources`, with `sink` a
    /// path where a plain file may be made. `None` where libcontainer
    /// should join the cgroups itself. With `make`, the cgroups are made,
    /// and the limits written where [`cgroup_limits::writable`] says (a
    /// create); without, they must exist (an exec).
    pub(crate) fn prepare(
        cgroup_path: &Path,
        resources: Option<&LinuxResources>,
        sink: PathBuf,
        make: bool,
    ) -> Result<Option<FastAttach>> {
        let pids_limit = resources.and_then(|r| r.pids().as_ref()).map(|p| p.limit());
        if !matches!(
            privilege::cgroup_layout(),
            CgroupLayout::V1 | CgroupLayout::Hybrid
        ) || privilege::rootless()
            || pids_limit.is_some_and(|l| (0..MIN_PIDS_LIMIT).contains(&l))
        {
            return Ok(None);
        }
        let mounts = runsbx_image::mountinfo::entries_of(&["cgroup"])?;
        let own = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| RuntimeError::io("read /proc/self/cgroup", e))?;
        let Some(hierarchies) = hierarchies(&mounts, &own, cgroup_path) else {
            return Ok(None);
        };
        for h in &hierarchies {
            if make {
                make_cgroup(&h.sandbox)?;
            } else if !h.sandbox.is_dir() {
                return Ok(None);
            }
        }
        let wrote_limits = match resources {
            Some(r) if make && cgroup_limits::writable(r) => {
                let dir_of = |controller: &str| {
                    hierarchies
                        .iter()
                        .find(|h| h.controllers.contains(&controller))
                        .map(|h| h.sandbox.as_path())
                };
                cgroup_limits::write(r, dir_of)?;
                true
            }
            _ => false,
        };
        Ok(Some(FastAttach {
            hierarchies,
            sink,
            cgroup_path: cgroup_path.to_owned(),
            wrote_limits,
        }))
    }

    /// runsbx wrote the sandbox's limits into its cgroups: the spec
    /// libcontainer builds from must have none (libcontainer's manager,
    /// which would write them again, only places the process).
    pub(crate) fn wrote_limits(&self) -> bool {
        self.wrote_limits
    }

    /// [`Self::prepare`] with `make` on a thread of its own while this
    /// thread does `work` (a create stages the rootfs meanwhile: making nine
    /// v1 cgroups is most of a millisecond of kernel time). Returns once
    /// that thread is gone from this process, not only joined, since
    /// [`Self::enter`] needs this process to have no other thread.
    pub(crate) fn prepare_during<T>(
        cgroup_path: &Path,
        resources: Option<&LinuxResources>,
        sink: PathBuf,
        work: impl FnOnce() -> T,
    ) -> (Result<Option<FastAttach>>, T) {
        let (prepared, tid, done) = std::thread::scope(|s| {
            let making = s.spawn(|| {
                let tid = nix::unistd::gettid();
                (Self::prepare(cgroup_path, resources, sink, true), tid)
            });
            let done = work();
            let (prepared, tid) = making
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (prepared, tid, done)
        });
        // A joiner is woken when the thread's memory goes; its filesystem
        // context goes a moment later, when it is reaped (see
        // `PrivateMounts::back`).
        let task = PathBuf::from(format!("/proc/self/task/{tid}"));
        let deadline = Instant::now() + THREAD_EXIT;
        while task.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(20));
        }
        (prepared, done)
    }

    /// Opens the `tasks` files, enters a mount namespace of this process's
    /// own and there makes libcontainer's cgroup writes land in plain
    /// files: a [`ManagerView`] when runsbx wrote the limits, else the sink
    /// bound over each `cgroup.procs`. `None` when this process has other
    /// threads (they share its filesystem context, so the kernel refuses
    /// it a mount namespace of its own).
    pub(crate) fn enter(self) -> Result<Option<Entered>> {
        let ctx = |step: &str| format!("place the sandbox in its cgroups: {step}");
        let open_tasks = |dir: &Path| {
            OpenOptions::new()
                .write(true)
                .open(dir.join("tasks"))
                .map_err(|e| RuntimeError::io(ctx(&format!("open {}/tasks", dir.display())), e))
        };
        let mut into = Vec::new();
        let mut back = Vec::new();
        for h in &self.hierarchies {
            into.push(open_tasks(&h.sandbox)?);
            back.push(open_tasks(&h.home)?);
        }
        let Some(ns) = PrivateMounts::enter()? else {
            return Ok(None);
        };
        if self.wrote_limits && ManagerView::make(&self.cgroup_path)? {
            return Ok(Some(Entered { into, back, ns }));
        }
        fs::write(&self.sink, "")
            .map_err(|e| RuntimeError::io(ctx(&format!("create {}", self.sink.display())), e))?;
        for h in &self.hierarchies {
            let procs = h.sandbox.join("cgroup.procs");
            mount(
                Some(&self.sink),
                &procs,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| RuntimeError::sys(ctx(&format!("bind over {}", procs.display())), e))?;
        }
        Ok(Some(Entered { into, back, ns }))
    }
}

/// In the private mount namespace, with the sinks bound.
#[derive(Debug)]
pub(crate) struct Entered {
    /// The sandbox's `tasks` files, opened as this process's own user
    /// (cgroup v1 checks a move against the opener's credentials).
    into: Vec<File>,
    /// The `tasks` files of this process's own cgroups.
    back: Vec<File>,
    ns: PrivateMounts,
}

impl Entered {
    /// Runs `build` (which forks libcontainer's intermediate process) from
    /// a thread placed in the sandbox's cgroups, as the module comment
    /// says.
    pub(crate) fn build<T: Send>(&self, build: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let ctx = |step: &str| format!("place the sandbox in its cgroups: {step}");
        std::thread::scope(|s| {
            s.spawn(|| {
                if let Err(e) = move_self(&self.into) {
                    // Whatever it joined, it leaves.
                    let _ = move_self(&self.back);
                    return Err(RuntimeError::io(ctx("join its cgroups"), e));
                }
                let built = build();
                // Out again before the thread ends, whatever the build did:
                // the sandbox's cgroups must hold only its own processes.
                let left = move_self(&self.back);
                let built = built?;
                left.map_err(|e| RuntimeError::io(ctx("leave its cgroups"), e))?;
                Ok(built)
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Back in the mount namespace this process came from.
    pub(crate) fn leave(self) -> Result<()> {
        self.ns.leave()
    }

    /// Stays in the private mount namespace, for a process that has since
    /// joined a user namespace from which it cannot go back, and that
    /// makes no mount of its own before it ends (`exec`).
    pub(crate) fn stay(mut self) {
        self.ns.left = true;
    }
}

/// This thread (only) into the cgroups whose `tasks` files are `files`.
fn move_self(files: &[File]) -> std::io::Result<()> {
    for mut f in files {
        f.write_all(b"0")?;
    }
    Ok(())
}

/// The hierarchies libcontainer's v1 manager will place the sandbox in,
/// from this process's mountinfo and /proc/self/cgroup; `None` where one
/// is not mounted at its root or the cgroup path is relative (the fast
/// placement would have to guess where libcontainer puts it).
fn hierarchies(
    mounts: &[runsbx_image::mountinfo::MountEntry],
    own_cgroups: &str,
    cgroup_path: &Path,
) -> Option<Vec<Hierarchy>> {
    let relative = cgroup_path.strip_prefix("/").ok()?;
    if relative.as_os_str().is_empty()
        || relative
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return None;
    }
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for (controller, names) in CONTROLLERS {
        let Some(m) = mounts
            .iter()
            .find(|m| names.iter().any(|n| m.mount_point.ends_with(n)))
        else {
            continue;
        };
        // This process's place in that hierarchy (libcontainer's manager
        // skips a controller /proc/self/cgroup does not list).
        let Some(own) = own_cgroups.lines().find_map(|l| {
            let mut fields = l.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == *controller)
                .then_some(path)
        }) else {
            continue;
        };
        if m.root != Path::new("/") {
            return None;
        }
        if !seen.insert(m.mount_point.clone()) {
            if let Some(h) = found
                .iter_mut()
                .find(|h: &&mut Hierarchy| h.sandbox.starts_with(&m.mount_point))
            {
                h.controllers.push(controller);
            }
            continue;
        }
        found.push(Hierarchy {
            sandbox: m.mount_point.join(relative),
            home: m.mount_point.join(own.trim_start_matches('/')),
            controllers: vec![controller],
        });
    }
    (!found.is_empty()).then_some(found)
}

/// Makes the sandbox's cgroup, and in the cpuset hierarchy gives every new
/// level its parent's cpus and mems (a task cannot join an empty cpuset).
fn make_cgroup(dir: &Path) -> Result<()> {
    let ctx = |what: &str| format!("make cgroup {}: {what}", dir.display());
    fs::create_dir_all(dir).map_err(|e| RuntimeError::io(ctx("mkdir"), e))?;
    if !dir.join("cpuset.cpus").exists() {
        return Ok(());
    }
    let levels: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| p.join("cpuset.cpus").exists())
        .collect();
    for pair in levels.windows(2).rev() {
        let (child, parent) = (pair[0], pair[1]);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let read = |p: &Path| {
                fs::read_to_string(p.join(file))
                    .map_err(|e| RuntimeError::io(ctx(&format!("read {}", p.display())), e))
            };
            if read(child)?.trim().is_empty() {
                fs::write(child.join(file), read(parent)?)
                    .map_err(|e| RuntimeError::io(ctx(&format!("write {file}")), e))?;
            }
        }
    }
    Ok(())
}

/// What libcontainer's intermediate process is shown at /sys/fs/cgroup
/// when runsbx wrote the sandbox's limits, in the private mount namespace
/// it is forked from (its init leaves that view when it pivots into the
/// rootfs).
///
/// libcontainer 0.7 always builds a cgroup manager there, and adds its own
/// process to it; with no limits to write, that is all it does. Its v1
/// manager first finds every controller's hierarchy (the mount table and
/// /proc/self/cgroup read again for each of twelve); its v2 manager, which
/// it builds where /sys/fs/cgroup is a cgroup2 filesystem, reads nothing.
/// So the host's unified (cgroup2) hierarchy is bound at /sys/fs/cgroup,
/// and a tmpfs over runsbx's directory in it holds the sandbox's path with
/// two plain files, `cgroup.procs` (where libcontainer writes its pid) and
/// `cgroup.kill` (which the manager would write, were a failed create to
/// remove it, rather than kill the pids listed in `cgroup.procs`). No
/// cgroup of the host is written. The intermediate process is in the
/// sandbox's v1 cgroups already (forked there), and the host's unified
/// hierarchy, with no controller, holds no limit.
struct ManagerView;

impl ManagerView {
    /// Where the host's unified hierarchy is mounted on a hybrid host.
    const UNIFIED: &'static str = "/sys/fs/cgroup/unified";

    /// Makes the view for a sandbox at `cgroup_path` (absolute); false,
    /// leaving nothing, where it cannot be made: no unified hierarchy (a
    /// host with v1 only), a cgroup path outside runsbx's own (an
    /// engine's, whose name in the unified hierarchy belongs to others),
    /// or a unified hierarchy runsbx may not make its directory in or bind
    /// (inside another container, say). The sinks are used then.
    fn make(cgroup_path: &Path) -> Result<bool> {
        let ctx = |step: &str| format!("an empty cgroup manager's view for the build: {step}");
        let mut parts = cgroup_path.components();
        if parts.next() != Some(std::path::Component::RootDir) {
            return Ok(false);
        }
        let Some(first) = parts.next() else {
            return Ok(false);
        };
        let rest = parts.as_path();
        if first.as_os_str() != CGROUP_PARENT || rest.as_os_str().is_empty() {
            return Ok(false);
        }
        let unified = Path::new(Self::UNIFIED);
        let is_cgroup2 = nix::sys::statfs::statfs(unified)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
        if !is_cgroup2 {
            return Ok(false);
        }
        // runsbx's directory in the unified hierarchy: an empty cgroup that
        // never holds a process, only this view's mount point. Made once.
        match fs::create_dir(unified.join(CGROUP_PARENT)) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                tracing::debug!("{}: {e}", ctx("make its mount point"));
                return Ok(false);
            }
            _ => {}
        }
        let root = Path::new("/sys/fs/cgroup");
        if let Err(e) = mount(
            Some(unified),
            root,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ) {
            tracing::debug!("{}: {e}", ctx("bind the unified hierarchy"));
            return Ok(false);
        }
        let parent = root.join(CGROUP_PARENT);
        if let Err(e) = mount(
            Some("runsbx-cgroup-view"),
            &parent,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0700,size=64k"),
        ) {
            tracing::debug!("{}: {e}", ctx("mount its tmpfs"));
            // The v1 hierarchies back in view, for the sinks.
            nix::mount::umount2(root, nix::mount::MntFlags::MNT_DETACH)
                .map_err(|e| RuntimeError::sys(ctx("unbind the unified hierarchy"), e))?;
            return Ok(false);
        }
        let dir = parent.join(rest);
        fs::create_dir_all(&dir)
            .map_err(|e| RuntimeError::io(ctx("make the sandbox's path"), e))?;
        for file in ["cgroup.procs", "cgroup.kill"] {
            fs::write(dir.join(file), "")
                .map_err(|e| RuntimeError::io(ctx(&format!("make {file}")), e))?;
        }
        Ok(true)
    }
}

/// This process in a mount namespace of its own until [`Self::leave`]
/// (or drop) takes it back, with its working directory.
#[derive(Debug)]
struct PrivateMounts {
    host: File,
    cwd: File,
    left: bool,
}

impl PrivateMounts {
    /// `None` when this process has other threads.
    fn enter() -> Result<Option<Self>> {
        let ctx =
            |step: &str| format!("a private mount namespace for the cgroup placement: {step}");
        let host = File::open("/proc/thread-self/ns/mnt")
            .map_err(|e| RuntimeError::io(ctx("open /proc/thread-self/ns/mnt"), e))?;
        let cwd = File::open(".").map_err(|e| RuntimeError::io(ctx("open ."), e))?;
        match unshare(CloneFlags::CLONE_NEWNS) {
            Ok(()) => {}
            Err(nix::Error::EINVAL) => return Ok(None),
            Err(e) => return Err(RuntimeError::sys(ctx("unshare"), e)),
        }
        let ns = PrivateMounts {
            host,
            cwd,
            left: false,
        };
        crate::sys::cgroupless::slave_mounts()
            .map_err(|e| RuntimeError::sys(ctx("make its mounts slaves"), e))?;
        Ok(Some(ns))
    }

    fn leave(mut self) -> Result<()> {
        self.left = true;
        self.back()
    }

    fn back(&self) -> Result<()> {
        let ctx = |step: &str| format!("return to the host's mount namespace: {step}");
        // The kernel refuses a mount namespace to a process whose
        // filesystem context another thread shares (EINVAL), and the
        // building thread, though joined, may still hold it: a joiner is
        // woken when the thread's memory goes (CLONE_CHILD_CLEARTID), and
        // its filesystem context goes a moment later. Measured here:
        // setns right after pthread_join failed 1 time in 20,000, and 83
        // in 20,000 with perf sampling at 20 kHz. Refused, runsbx would stay
        // in this namespace, where the sandbox's cgroup.procs are the
        // sinks, and its cleanup would not see the init, which would then
        // outlive every record of it.
        let deadline = Instant::now() + THREAD_EXIT;
        loop {
            match setns(self.host.as_fd(), CloneFlags::CLONE_NEWNS) {
                Err(nix::Error::EINVAL) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(50));
                }
                r => break r.map_err(|e| RuntimeError::sys(ctx("setns"), e))?,
            }
        }
        nix::unistd::fchdir(self.cwd.as_raw_fd()).map_err(|e| RuntimeError::sys(ctx("fchdir"), e))
    }
}

impl Drop for PrivateMounts {
    fn drop(&mut self) {
        if !self.left {
            if let Err(e) = self.back() {
                tracing::error!("{e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use runsbx_image::mountinfo::MountEntry;

    fn cg(mount_point: &str, root: &str) -> MountEntry {
        MountEntry {
            root: root.into(),
            mount_point: mount_point.into(),
            fstype: "cgroup".into(),
            source: "cgroup".into(),
            super_options: "rw".into(),
        }
    }

    const OWN: &str =
        "12:pids:/user.slice\n4:memory:/m/n\n3:cpu,cpuacct:/\n1:name=systemd:/x\n0::/";

    #[test]
    fn the_hierarchies_libcontainer_uses() {
        let mounts = [
            cg("/sys/fs/cgroup/systemd", "/"),
            cg("/sys/fs/cgroup/cpu,cpuacct", "/"),
            cg("/sys/fs/cgroup/memory", "/"),
            cg("/sys/fs/cgroup/pids", "/"),
            // Not listed for this process: skipped, as libcontainer does.
            cg("/sys/fs/cgroup/freezer", "/"),
        ];
        let found = hierarchies(&mounts, OWN, Path::new("/runsbx/a-1"));
        let h = |s: &str, home: &str, controllers: &[&'static str]| Hierarchy {
            sandbox: s.into(),
            home: home.into(),
            controllers: controllers.to_vec(),
        };
        assert_eq!(
            found,
            Some(vec![
                h(
                    "/sys/fs/cgroup/cpu,cpuacct/runsbx/a-1",
                    "/sys/fs/cgroup/cpu,cpuacct/",
                    &["cpu", "cpuacct"]
                ),
                h(
                    "/sys/fs/cgroup/memory/runsbx/a-1",
                    "/sys/fs/cgroup/memory/m/n",
                    &["memory"]
                ),
                h(
                    "/sys/fs/cgroup/pids/runsbx/a-1",
                    "/sys/fs/cgroup/pids/user.slice",
                    &["pids"]
                ),
            ])
        );
    }

    #[test]
    fn where_it_would_guess_it_does_not_apply() {
        let mounts = [cg("/sys/fs/cgroup/pids", "/")];
        for path in ["runsbx/a", "/", "/runsbx/../a"] {
            assert_eq!(hierarchies(&mounts, OWN, Path::new(path)), None, "{path}");
        }
        // A hierarchy mounted below its root (inside a container).
        let inner = [cg("/sys/fs/cgroup/pids", "/docker/abc")];
        assert_eq!(hierarchies(&inner, OWN, Path::new("/runsbx/a")), None);
        // No v1 hierarchy at all.
        assert_eq!(hierarchies(&[], OWN, Path::new("/runsbx/a")), None);
    }

    /// The way back to the host's mount namespace waits for a thread that
    /// is still ending, as the building thread may be once joined: here
    /// one that has not ended yet when `leave` starts, so that without
    /// the wait `setns` fails every time, not one time in thousands.
    #[test]
    fn leaving_waits_for_a_thread_that_is_ending() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "SKIP is not allowed under CI: a mount namespace needs root"
            );
            eprintln!("SKIP leaving_waits_for_a_thread_that_is_ending: needs root");
            return;
        }
        // In a child: the test harness's threads would make the kernel
        // refuse this process a mount namespace of its own.
        // SAFETY: the child only runs this test's code and then _exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                let code = match PrivateMounts::enter() {
                    Ok(Some(ns)) => {
                        let _ending =
                            std::thread::spawn(|| std::thread::sleep(Duration::from_millis(20)));
                        match ns.leave() {
                            Ok(()) => 0,
                            Err(e) => {
                                eprintln!("leave: {e}");
                                1
                            }
                        }
                    }
                    Ok(None) => 2,
                    Err(e) => {
                        eprintln!("enter: {e}");
                        3
                    }
                };
                // SAFETY: ends the forked child without running the
                // harness's exit handlers.
                unsafe { libc::_exit(code) }
            }
            nix::unistd::ForkResult::Parent { child } => {
                let status = nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(child, 0));
            }
        }
    }
}
