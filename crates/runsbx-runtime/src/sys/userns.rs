//! runsbx's own user namespace, for an unprivileged caller on a host where
//! it cannot make cgroups (see cgroupless.rs), and the user-namespace
//! lookups joining one needs.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::sched::{unshare, CloneFlags};
use nix::unistd::{Gid, Pid, Uid};

use crate::error::{Result, RuntimeError};
use crate::sys::privilege;

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
    if privilege::can_manage_cgroups() || privilege::in_user_namespace() {
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
    if !privilege::in_user_namespace() {
        return None;
    }
    let from = std::env::var(USERNS_FROM_ENV).ok()?;
    let (uid, gid) = from.split_once(':')?;
    Some((uid.parse().ok()?, gid.parse().ok()?))
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

/// The uid runsbx was invoked as: before it re-executed itself in a user
/// namespace of its own (see [`reexec_in_own_userns`]), or its effective uid.
pub fn caller_uid() -> u32 {
    userns_from()
        .map(|(uid, _)| uid)
        .unwrap_or_else(|| Uid::effective().as_raw())
}

pub(crate) fn open_ns(pid: Pid, kind: &str) -> std::io::Result<fs::File> {
    fs::File::open(format!("/proc/{pid}/ns/{kind}"))
}

pub(crate) fn same_file(a: &fs::File, b: &fs::File) -> Result<bool> {
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
