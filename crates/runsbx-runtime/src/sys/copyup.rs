//! `tmpcopyup`: a tmpfs that starts with the image's content at its
//! mount point (podman asks for it on `--tmpfs` and `--read-only`'s /run,
//! as crun implements it). mount(2) knows no such option; once the
//! container exists and before its process starts, a helper joins the
//! container's user and mount namespaces, where the tmpfs is mounted, and
//! copies what the image holds under that path into it, with its owners
//! and modes. The image side is opened before the helper leaves runsbx's
//! mount namespace; everything is walked by fd, never following a link.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::AtFlags;
use nix::fcntl::{openat, OFlag};
use nix::sched::{setns, CloneFlags};
use nix::sys::stat::{fchmod, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fchownat, symlinkat, Gid, Pid, Uid};

use crate::error::{Result, RuntimeError};

/// How deep a copied tree may go (an image is not a fork bomb of
/// directories; the helper's stack is bounded).
const MAX_DEPTH: usize = 64;

/// Copies, for each of `dests`, the image's directory at that path under
/// `rootfs` (runsbx's view of the container's root) into the tmpfs the
/// container `init` has mounted there.
pub fn copy_up(init: Pid, own_userns: bool, rootfs: &Path, dests: &[PathBuf]) -> Result<()> {
    if dests.is_empty() {
        return Ok(());
    }
    let root = pathrs::Root::open(rootfs)
        .map_err(|e| RuntimeError::invalid(format!("open the rootfs {rootfs:?}"), e.to_string()))?;
    // What the image holds at each destination, opened here (a symlink in
    // the image cannot lead out of it); a missing one copies nothing.
    let mut sources = Vec::new();
    for dest in dests {
        if let Ok(handle) = root.resolve(dest) {
            let dir = handle
                .reopen(pathrs::flags::OpenFlags::O_RDONLY | pathrs::flags::OpenFlags::O_DIRECTORY)
                .map_err(|e| {
                    RuntimeError::invalid(
                        format!("tmpcopyup of {dest:?}"),
                        format!("the image's {dest:?} is not a directory: {e}"),
                    )
                })?;
            sources.push((dest.clone(), OwnedFd::from(dir)));
        }
    }
    if sources.is_empty() {
        return Ok(());
    }
    let pidfd = crate::sys::procs::pidfd_open(init)?;
    let mut flags = CloneFlags::CLONE_NEWNS;
    if own_userns {
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    let child = crate::sys::fork::child("the tmpcopyup helper", &[], || {
        if let Err(e) = setns(&pidfd, flags) {
            return 128 + (e as i32).clamp(1, 127);
        }
        crate::sys::privilege::moved();
        // Joining a user namespace keeps the ids; as its root, what the
        // helper makes is the sandbox root's (host root is not mapped
        // there: files made with its ids would be EOVERFLOW).
        if own_userns {
            let zero_g = Gid::from_raw(0);
            let zero_u = Uid::from_raw(0);
            let became = nix::unistd::setresgid(zero_g, zero_g, zero_g)
                .and_then(|()| nix::unistd::setresuid(zero_u, zero_u, zero_u));
            if let Err(e) = became {
                return 128 + (e as i32).clamp(1, 127);
            }
        }
        for (dest, src) in &sources {
            if let Err(e) = copy_into(src.as_fd(), dest) {
                return (e as i32).clamp(1, 127);
            }
        }
        0
    })?;
    let ctx = |step: &str| format!("tmpcopyup into the container's tmpfs: {step}");
    loop {
        return match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(WaitStatus::Exited(_, code)) if code > 128 => Err(RuntimeError::sys(
                ctx("join its namespaces"),
                nix::Error::from_raw(code - 128),
            )),
            Ok(WaitStatus::Exited(_, errno)) => Err(RuntimeError::sys(
                ctx(&format!(
                    "copy {:?}",
                    dests
                        .iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                )),
                nix::Error::from_raw(errno),
            )),
            Ok(other) => Err(RuntimeError::invalid(
                ctx("helper"),
                format!("ended unexpectedly: {other:?}"),
            )),
            Err(nix::Error::EINTR) => continue,
            Err(e) => Err(RuntimeError::sys(ctx("waitpid"), e)),
        };
    }
}

/// In the container's mount namespace: `src`'s content into `dest`, and
/// `src`'s owner and mode onto `dest` itself.
fn copy_into(src: BorrowedFd<'_>, dest: &Path) -> nix::Result<()> {
    let dst = open_dir(None, dest)?;
    let st = nix::sys::stat::fstat(src.as_raw_fd())?;
    copy_attrs(dst.as_fd(), None, &st)?;
    copy_dir(src, dst.as_fd(), 0)
}

fn copy_dir(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, depth: usize) -> nix::Result<()> {
    if depth > MAX_DEPTH {
        return Err(nix::Error::ELOOP);
    }
    let listing = nix::dir::Dir::openat(
        Some(src.as_raw_fd()),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        Mode::empty(),
    )?;
    let names: Vec<std::ffi::CString> = listing
        .into_iter()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_owned())
        .filter(|n| n.as_bytes() != b"." && n.as_bytes() != b"..")
        .collect();
    for name in names {
        let name = Path::new(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let st = fstatat(Some(src.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
        match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR => {
                mkdirat(Some(dst.as_raw_fd()), name, Mode::from_bits_truncate(0o700))?;
                let s = open_dir(Some(src), name)?;
                let d = open_dir(Some(dst), name)?;
                copy_dir(s.as_fd(), d.as_fd(), depth + 1)?;
                copy_attrs(d.as_fd(), None, &st)?;
            }
            SFlag::S_IFREG => {
                let s = open_at(src, name, OFlag::O_RDONLY, Mode::empty())?;
                let d = open_at(
                    dst,
                    name,
                    OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
                    Mode::from_bits_truncate(0o600),
                )?;
                let (mut s, mut d) = (File::from(s), File::from(d));
                std::io::copy(&mut s, &mut d).map_err(io_errno)?;
                copy_attrs(d.as_fd(), None, &st)?;
            }
            SFlag::S_IFLNK => {
                let target = nix::fcntl::readlinkat(Some(src.as_raw_fd()), name)?;
                symlinkat(target.as_os_str(), Some(dst.as_raw_fd()), name)?;
                copy_attrs(dst, Some(name), &st)?;
            }
            // Devices, fifos and sockets have no place in a tmpfs copy.
            _ => {}
        }
    }
    Ok(())
}

/// `st`'s owner (and, but for a symlink, mode) onto `fd`, or onto `name`
/// in the directory `fd` without following it. An owner the sandbox's user
/// namespace does not map (rootless, a file of another of the caller's
/// subordinate ids) cannot be given: the copy then stays the sandbox
/// root's (EINVAL is that case, and only that).
fn copy_attrs(fd: BorrowedFd<'_>, name: Option<&Path>, st: &FileStat) -> nix::Result<()> {
    let (uid, gid) = (
        Some(Uid::from_raw(st.st_uid)),
        Some(Gid::from_raw(st.st_gid)),
    );
    let owned = match name {
        Some(name) => fchownat(
            Some(fd.as_raw_fd()),
            name,
            uid,
            gid,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ),
        None => nix::unistd::fchown(fd.as_raw_fd(), uid, gid),
    };
    match owned {
        Ok(()) | Err(nix::Error::EINVAL) => {}
        Err(e) => return Err(e),
    }
    if name.is_none() {
        fchmod(
            fd.as_raw_fd(),
            Mode::from_bits_truncate(st.st_mode & 0o7777),
        )?;
    }
    Ok(())
}

fn open_dir(at: Option<BorrowedFd<'_>>, path: &Path) -> nix::Result<OwnedFd> {
    let fd = openat(
        at.map(|f| f.as_raw_fd()),
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_at(at: BorrowedFd<'_>, name: &Path, flags: OFlag, mode: Mode) -> nix::Result<OwnedFd> {
    let fd = openat(
        Some(at.as_raw_fd()),
        name,
        flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        mode,
    )?;
    // SAFETY: openat just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn io_errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}
