//! Paths beneath a directory that no link can lead out of: openat2 with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV`, for what a sandbox wrote (a call's outputs, a
//! session's directories); and owners given through an fd, never a path.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Opens `rel` beneath `dir` with `flags` (`O_NOFOLLOW | O_CLOEXEC` are
/// added), reached without a symlink, a magic link or another mount on the
/// way: ELOOP for a link, EXDEV for a path that leaves `dir`.
pub fn open(dir: BorrowedFd<'_>, rel: &Path, flags: libc::c_int) -> io::Result<OwnedFd> {
    openat2(
        dir,
        rel,
        flags | libc::O_NOFOLLOW,
        libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | libc::RESOLVE_NO_XDEV,
    )
}

/// openat2(2) of `rel` from `dir` with `flags` (`O_CLOEXEC` added) and
/// the `resolve` flags, once: EAGAIN (a rename or mount raced it) is the
/// caller's to retry or hand on.
pub fn openat2(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: libc::c_int,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = CString::new(rel.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: open_how is a plain C struct; all-zero is its valid default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: a live dirfd, a NUL-terminated path and a correctly sized
    // open_how; the kernel returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Gives what `fd` is open on (an `O_PATH` fd of a link is the link
/// itself) to `uid`:`gid`.
pub fn chown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: a live fd and an empty C string.
    let rc = unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes the directory `path` and everything in it, never entering a
/// mount point below it: a filesystem still mounted there (a session's
/// disk or its overlay over the image, in a call's directory) would
/// otherwise be emptied through it, deleting the session's files and
/// writing a whiteout over each of the image's. The removal stops at the
/// first mount point it meets, which is the error (EXDEV), and leaves
/// what it has not removed yet. A `path` that is not there is no error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let top = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => OwnedFd::from(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    empty(top)?;
    match std::fs::remove_dir(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Removes what the directory `dir` holds, each directory reached
/// beneath it without crossing a mount ([`open`]: EXDEV at a mount point).
fn empty(dir: OwnedFd) -> io::Result<()> {
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let raw = dir.as_raw_fd();
    let mut names = Vec::new();
    let mut listing = nix::dir::Dir::from(dir.try_clone()?)?;
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        names.push(std::ffi::OsStr::from_bytes(name).to_owned());
    }
    drop(listing);
    for name in names {
        let rel = Path::new(&name);
        match open(dir.as_fd(), rel, libc::O_DIRECTORY | libc::O_RDONLY) {
            Ok(sub) => {
                empty(sub)?;
                unlinkat(Some(raw), rel, UnlinkatFlags::RemoveDir)?;
            }
            // Not a directory (a link, too, is not followed): unlinked.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOTDIR)
                    || e.raw_os_error() == Some(libc::ELOOP) =>
            {
                unlinkat(Some(raw), rel, UnlinkatFlags::NoRemoveDir)?;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("{}: {e} (a mount point is left as it is)", rel.display()),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn remove_tree_removes_links_not_what_they_name() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "k").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        std::fs::write(tree.join("a/b/file"), "f").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", tree.join("dangling")).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "k");
        // Already gone: no error.
        remove_tree(&tree).unwrap();
    }
}
