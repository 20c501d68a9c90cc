//! The kernel's file-descriptor mount API (open_tree, mount_setattr,
//! fsopen/fsconfig/fsmount, move_mount), which nix does not wrap: mounts
//! are built detached, as fds, and attached only when complete.
//!
//! A detached mount has no place in any mount tree, so the kernel names it
//! `/` wherever it is asked for its path; this is how the sandbox's root
//! mount shows no host path (see [`read_only_view`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

// From <linux/mount.h>; the libc crate does not carry them all.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_RDONLY: libc::c_uint = 0x1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
const FSCONFIG_SET_FLAG: libc::c_uint = 0;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_SET_FD: libc::c_uint = 5;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c_path(path: &Path) -> nix::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| nix::Error::EINVAL)
}

/// An fd returned by a syscall, or its errno.
fn fd_from(ret: libc::c_long) -> nix::Result<OwnedFd> {
    if ret < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as i32) })
}

fn unit_from(ret: libc::c_long) -> nix::Result<()> {
    if ret < 0 {
        Err(nix::Error::last())
    } else {
        Ok(())
    }
}

/// A detached copy of the mount tree at `source` (open_tree with
/// OPEN_TREE_CLONE | AT_RECURSIVE): `source` as a bind mount that is not
/// attached anywhere yet.
pub fn clone_tree(source: &Path) -> nix::Result<OwnedFd> {
    open_tree_clone(source, AT_RECURSIVE)
}

/// A detached bind mount of the directory `source` alone, without the
/// mounts below it (an overlay layer holds none that belong to it; the
/// engine's own overlay may be mounted beside it).
pub fn clone_dir(source: &Path) -> nix::Result<OwnedFd> {
    open_tree_clone(source, 0)
}

/// A detached bind mount of the directory `dir` is open on (an fd found
/// without following links, so the mount is of that very directory).
pub fn clone_fd(dir: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
    // SAFETY: a live fd and an empty C string; returns an fd or -1.
    fd_from(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    })
}

fn open_tree_clone(source: &Path, flags: libc::c_uint) -> nix::Result<OwnedFd> {
    let src = c_path(source)?;
    // SAFETY: a C string we own; returns an fd or -1.
    fd_from(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | flags,
        )
    })
}

/// Maps the ids of every file under the detached `tree` through the user
/// namespace `userns` (MOUNT_ATTR_IDMAP). EINVAL: the filesystem cannot be
/// idmapped (overlayfs as a whole, for one).
pub fn idmap(tree: BorrowedFd<'_>, userns: BorrowedFd<'_>) -> nix::Result<()> {
    set_recursive(
        tree,
        &MountAttr {
            attr_set: MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: 0,
            userns_fd: userns.as_raw_fd() as u64,
        },
    )
}

/// Makes every mount of the detached `tree` read-only.
pub fn read_only(tree: BorrowedFd<'_>) -> nix::Result<()> {
    set_recursive(
        tree,
        &MountAttr {
            attr_set: u64::from(MOUNT_ATTR_RDONLY),
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        },
    )
}

/// mount_setattr of `attr` on every mount of the detached `tree`.
fn set_recursive(tree: BorrowedFd<'_>, attr: &MountAttr) -> nix::Result<()> {
    // SAFETY: attr is a live, correctly sized mount_attr; the path is "".
    unit_from(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
}

/// Attaches the detached mount `mnt` at `target`.
pub fn attach(mnt: BorrowedFd<'_>, target: &Path) -> nix::Result<()> {
    let dst = c_path(target)?;
    // SAFETY: C strings we own; returns 0 or -1.
    unit_from(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
}

/// A filesystem context being configured (fsopen); [`Context::mount`]
/// creates it and returns the detached, read-only mount.
struct Context(OwnedFd);

impl Context {
    fn open(fstype: &str) -> nix::Result<Self> {
        let fstype = CString::new(fstype).map_err(|_| nix::Error::EINVAL)?;
        // SAFETY: a C string we own; returns an fd or -1.
        fd_from(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })
            .map(Self)
    }

    fn set(&self, key: &str, value: &str) -> nix::Result<()> {
        let key = CString::new(key).map_err(|_| nix::Error::EINVAL)?;
        let value = CString::new(value).map_err(|_| nix::Error::EINVAL)?;
        // SAFETY: C strings we own; returns 0 or -1.
        unit_from(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })
    }

    fn set_flag(&self, key: &str) -> nix::Result<()> {
        let key = CString::new(key).map_err(|_| nix::Error::EINVAL)?;
        // SAFETY: a C string we own; returns 0 or -1.
        unit_from(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_SET_FLAG,
                key.as_ptr(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        })
    }

    fn set_fd(&self, key: &str, fd: BorrowedFd<'_>) -> nix::Result<()> {
        let key = CString::new(key).map_err(|_| nix::Error::EINVAL)?;
        // SAFETY: a C string we own and a live fd; returns 0 or -1.
        unit_from(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_SET_FD,
                key.as_ptr(),
                std::ptr::null::<libc::c_char>(),
                fd.as_raw_fd(),
            )
        })
    }

    fn mount(self) -> nix::Result<OwnedFd> {
        self.mount_with(MOUNT_ATTR_RDONLY)
    }

    fn mount_with(self, attrs: libc::c_uint) -> nix::Result<OwnedFd> {
        // SAFETY: no pointers; returns 0 or -1.
        unit_from(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                self.0.as_raw_fd(),
                FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        })?;
        // SAFETY: no pointers; returns an fd or -1.
        fd_from(unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                self.0.as_raw_fd(),
                FSMOUNT_CLOEXEC,
                attrs,
            )
        })
    }
}

/// The name the sandbox's root filesystem shows as its source.
const SOURCE: &str = "runsbx";

/// A read-only overlay whose only content is the detached `tree`: the same
/// files, ids and modes, but a filesystem of its own, so that the
/// sandbox's mountinfo shows its root as `/` on `overlay runsbx` rather
/// than the image's host directory on the host's block device. The layer
/// is handed over as an fd (Linux 6.13), and the kernel names a detached
/// layer `/`. overlayfs needs two layers when there is no upper one; the
/// second is an empty read-only tmpfs, below the image, which is pushed to
/// `made` (see [`overlay`]).
pub fn read_only_view(tree: BorrowedFd<'_>, made: &mut Vec<OwnedFd>) -> nix::Result<OwnedFd> {
    overlay(&[tree], None, &[], true, made)
}

/// A writable layer of an overlay: its upper and work directories, each a
/// detached (typically idmapped) mount.
pub struct Upper {
    pub upper: OwnedFd,
    pub work: OwnedFd,
}

/// An overlay of detached layers, handed over by fd (Linux 6.13): `lowers`
/// from the top down, and `upper` when it is writable. `options` are
/// overlayfs options copied from the mount it replaces (those that change
/// how the layers' contents are read). Always nosuid and nodev; read-only
/// without an upper layer, or when `read_only`.
///
/// A layer this makes itself (the empty one, below) is pushed to `made`,
/// still detached: the overlay keeps private copies of its layers, and a
/// detached mount is dissolved when its last fd closes, which waits for an
/// RCU grace period of its own. The caller may attach it where it goes with
/// other mounts instead (sys/stage.rs), or drop it.
pub fn overlay(
    lowers: &[BorrowedFd<'_>],
    upper: Option<&Upper>,
    options: &[(&str, &str)],
    read_only: bool,
    made: &mut Vec<OwnedFd>,
) -> nix::Result<OwnedFd> {
    let overlay = Context::open("overlay")?;
    overlay.set("source", SOURCE)?;
    for (key, value) in options {
        overlay.set(key, value)?;
    }
    for lower in lowers {
        overlay.set_fd("lowerdir+", *lower)?;
    }
    if upper.is_none() && lowers.len() == 1 {
        // Without an upper layer overlayfs wants two lower ones.
        let tmpfs = Context::open("tmpfs")?;
        tmpfs.set("source", SOURCE)?;
        let empty = tmpfs.mount()?;
        overlay.set_fd("lowerdir+", empty.as_fd())?;
        made.push(empty);
    }
    if let Some(upper) = upper {
        overlay.set_fd("upperdir", upper.upper.as_fd())?;
        overlay.set_fd("workdir", upper.work.as_fd())?;
    }
    // nosuid and nodev: the staged root is on a path other host users may
    // traverse, and a setuid file the sandbox made in its layer must mean
    // nothing there (inside, no_new_privs ignores it anyway).
    let mut attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if read_only || upper.is_none() {
        attrs |= MOUNT_ATTR_RDONLY;
    }
    overlay.mount_with(attrs)
}

/// A session's rootfs: the image `lower` under the session's layer
/// (`upper`, with overlayfs's `work`), each a directory fd; writable,
/// nosuid and nodev. `userxattr`: overlayfs keeps its own attributes in
/// the `user.` namespace, as it must in a user namespace (rootless).
pub fn writable_overlay(
    lower: BorrowedFd<'_>,
    upper: BorrowedFd<'_>,
    work: BorrowedFd<'_>,
    userxattr: bool,
) -> nix::Result<OwnedFd> {
    let overlay = Context::open("overlay")?;
    overlay.set("source", SOURCE)?;
    if userxattr {
        overlay.set_flag("userxattr")?;
    }
    overlay.set_fd("lowerdir+", lower)?;
    overlay.set_fd("upperdir", upper)?;
    overlay.set_fd("workdir", work)?;
    overlay.mount_with(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
}
