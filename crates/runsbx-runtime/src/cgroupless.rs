//! Letting libcontainer build a container where runsbx cannot make cgroups.
//!
//! libcontainer 0.7 always moves a new container's first process into a
//! cgroup, and on a cgroup v1 (or hybrid) host its v1 manager ignores the
//! rootless flag: an unprivileged caller fails with EACCES on
//! `/sys/fs/cgroup/<controller>/…`, as does root inside rootless podman's
//! user namespace. runc and crun skip cgroups there instead.
//!
//! runsbx does the same without patching libcontainer: before building the
//! container it moves itself into a private mount namespace (in a user
//! namespace it owns, when it is not in one already) and mounts an empty
//! tmpfs over `/sys/fs/cgroup`, holding only the directories and files the
//! v1 manager touches for this container's cgroup path. The manager then
//! "joins" files in that tmpfs: no cgroup exists and nothing on the host
//! changes. The container's own limits come from rlimits; this is logged,
//! and the policy's attestation says so.
//!
//! The tmpfs is visible only to this runsbx process and the namespaces it
//! creates (the container pivots away from it), and it is unmounted as soon
//! as the container exists.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::{Gid, Pid, Uid};

use crate::error::{Result, RuntimeError};
use crate::host;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The shadow over `/sys/fs/cgroup`; unmount it with [`Shadow::leave`] once
/// libcontainer has made its cgroup calls.
#[derive(Debug)]
pub struct Shadow(());

impl Shadow {
    pub fn leave(self) -> Result<()> {
        umount2(CGROUP_ROOT, MntFlags::MNT_DETACH).map_err(|e| {
            RuntimeError::sys(format!("unmount the cgroup shadow on {CGROUP_ROOT}"), e)
        })
    }
}

/// Set on the re-executed runsbx: the uid and gid it ran as before it made
/// its own user namespace, so that the spec's id mappings can be rewritten.
const USERNS_FROM_ENV: &str = "_RUNSBX_USERNS_FROM";

/// For `create`/`run` by an unprivileged user on a host where runsbx cannot
/// make cgroups: re-executes runsbx in a user namespace of its own (mapping
/// the caller to 0), as rootless podman runs its runtime. Returns only when
/// that is not needed.
///
/// An exec is needed, not just unshare: a process's memory belongs to the
/// user namespace it exec'd in, and libcontainer makes itself and the
/// container's init non-dumpable, so only a runsbx exec'd inside the new
/// namespace may then open the init's namespaces (to bring `lo` up).
pub fn reexec_in_own_userns() -> Result<()> {
    use std::os::unix::ffi::OsStringExt;
    if host::can_manage_cgroups() || host::in_user_namespace() {
        return Ok(());
    }
    let (uid, gid) = (Uid::effective().as_raw(), Gid::effective().as_raw());
    enter_own_user_namespace(uid, gid)?;
    let argv = std::env::args_os()
        .map(|a| std::ffi::CString::new(a.into_vec()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| RuntimeError::invalid("command line", e.to_string()))?;
    std::env::set_var(USERNS_FROM_ENV, format!("{uid}:{gid}"));
    let err = nix::unistd::execv(c"/proc/self/exe", &argv).err();
    Err(RuntimeError::sys(
        "re-execute runsbx in its own user namespace",
        err.unwrap_or(nix::Error::UnknownErrno),
    ))
}

/// The caller's uid and gid when this runsbx runs in a user namespace it
/// made itself.
pub(crate) fn userns_from() -> Option<(u32, u32)> {
    if !host::in_user_namespace() {
        return None;
    }
    let from = std::env::var(USERNS_FROM_ENV).ok()?;
    let (uid, gid) = from.split_once(':')?;
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

/// For `create`/`run`: the shadow. (The spec's id mappings are already in
/// this namespace's terms: the policy reads them from /proc/self/uid_map.)
pub fn enter_for_create(cgroup_path: &Path) -> Result<Shadow> {
    shadow(cgroup_path)
}

/// For `exec`: joins the user namespace the container was created from
/// (the parent of its own), so that joining the container's user
/// namespace is allowed, then the shadow.
pub fn enter_for_exec(init: Pid, cgroup_path: &Path) -> Result<Shadow> {
    let ctx = |step: &str| format!("prepare exec into pid {init} without cgroups: {step}");
    let theirs =
        open_ns(init, "user").map_err(|e| RuntimeError::io(ctx("open its user namespace"), e))?;
    let ours = open_ns(Pid::this(), "user")
        .map_err(|e| RuntimeError::io(ctx("open our user namespace"), e))?;
    if !same_file(&theirs, &ours)? {
        let parent = parent_ns(&theirs)
            .map(fs::File::from)
            .map_err(|e| RuntimeError::sys(ctx("NS_GET_PARENT"), e))?;
        if !same_file(&parent, &ours)? {
            setns(&parent, CloneFlags::CLONE_NEWUSER).map_err(|e| {
                RuntimeError::sys(ctx("join the container's parent user namespace"), e)
            })?;
        }
    }
    shadow(cgroup_path)
}

/// Moves this process into a mount namespace of its own, from which
/// nothing mounted propagates back to the one it came from.
pub(crate) fn private_mount_namespace() -> nix::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
}

fn shadow(cgroup_path: &Path) -> Result<Shadow> {
    let ctx = |step: &str| format!("hide cgroups for a rootless container: {step}");
    let v1_mounts = crate::mountinfo::mount_points_of(&["cgroup"])?;
    let cpuset = read_trimmed("/sys/fs/cgroup/cpuset/cpuset.cpus");
    let mems = read_trimmed("/sys/fs/cgroup/cpuset/cpuset.mems");
    private_mount_namespace()
        .map_err(|e| RuntimeError::sys(ctx("a private mount namespace"), e))?;
    mount(
        Some("runsbx-cgroup-shadow"),
        CGROUP_ROOT,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=1m"),
    )
    .map_err(|e| RuntimeError::sys(ctx(&format!("mount tmpfs on {CGROUP_ROOT}")), e))?;
    let shadow = Shadow(());
    let relative: Vec<Component> = cgroup_path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    for mount_point in v1_mounts {
        if !mount_point.starts_with(CGROUP_ROOT) {
            continue;
        }
        // The v1 cpuset controller reads cpuset.cpus and cpuset.mems at
        // every level from its mount point down and copies them into the
        // new cgroup; every other controller just writes cgroup.procs.
        let mut dir = mount_point.clone();
        let write_level = |dir: &Path| -> std::io::Result<()> {
            fs::create_dir_all(dir)?;
            fs::write(dir.join("cpuset.cpus"), &cpuset)?;
            fs::write(dir.join("cpuset.mems"), &mems)
        };
        write_level(&dir).map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
        for component in &relative {
            dir.push(component);
            write_level(&dir)
                .map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
        }
        fs::write(dir.join("cgroup.procs"), "")
            .map_err(|e| RuntimeError::io(ctx(&format!("populate {dir:?}")), e))?;
    }
    Ok(shadow)
}

fn read_trimmed(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "0".to_owned())
}

fn enter_own_user_namespace(uid: u32, gid: u32) -> Result<()> {
    let ctx = |step: &str| format!("enter a user namespace of our own: {step}");
    unshare(CloneFlags::CLONE_NEWUSER).map_err(|e| {
        RuntimeError::sys(
            ctx("unshare(CLONE_NEWUSER) (are unprivileged user namespaces enabled? check sysctl user.max_user_namespaces and kernel.unprivileged_userns_clone)"),
            e,
        )
    })?;
    let write = |file: &str, text: String| {
        fs::write(format!("/proc/self/{file}"), text)
            .map_err(|e| RuntimeError::io(ctx(&format!("write /proc/self/{file}")), e))
    };
    write("setgroups", "deny".to_owned())?;
    write("uid_map", format!("0 {uid} 1"))?;
    write("gid_map", format!("0 {gid} 1"))
}

fn open_ns(pid: Pid, kind: &str) -> std::io::Result<fs::File> {
    fs::File::open(format!("/proc/{pid}/ns/{kind}"))
}

fn same_file(a: &fs::File, b: &fs::File) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (a, b) = (
        a.metadata()
            .map_err(|e| RuntimeError::io("fstat namespace", e))?,
        b.metadata()
            .map_err(|e| RuntimeError::io("fstat namespace", e))?,
    );
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// ioctl(NS_GET_PARENT): the parent of a user namespace.
pub(crate) fn parent_ns(ns: &fs::File) -> nix::Result<OwnedFd> {
    // _IO(0xb7, 0x2) from <linux/nsfs.h>.
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    // SAFETY: the ioctl takes no argument and returns a new fd or -1.
    let fd = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT) };
    if fd < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
