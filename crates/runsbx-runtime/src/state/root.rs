//! The state root: where each container's state lives, how ids are checked,
//! and the per-id lock that serializes commands on one container.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{fcntl, FcntlArg};
use nix::unistd::Uid;

use crate::error::{Result, RuntimeError};
use crate::sys::privilege;
use crate::sys::userns;

/// The longest container id accepted. Engines use 64 hex characters; the id
/// becomes a directory name, so it must stay well below NAME_MAX (255).
pub const MAX_ID_LEN: usize = 128;

/// The directory under the state root that holds the per-id lock files. `@`
/// cannot appear in an id, so this never collides with a container.
const LOCK_DIR: &str = "@locks";

/// Checks a container id before it is used as a path component.
pub fn validate_id(id: &str) -> Result<()> {
    let bad = |reason: &str| {
        Err(RuntimeError::InvalidId {
            id: id.chars().take(MAX_ID_LEN + 8).collect(),
            reason: reason.to_owned(),
            max: MAX_ID_LEN,
        })
    };
    if id.is_empty() {
        return bad("it is empty");
    }
    if id.len() > MAX_ID_LEN {
        return bad(&format!("it is {} bytes long", id.len()));
    }
    if id == "." || id == ".." {
        return bad("it names a directory");
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '-' | '.')))
    {
        return bad(&format!("character {c:?} is not allowed"));
    }
    Ok(())
}

/// The state root runc would use: `/run/runsbx` for real root,
/// `$XDG_RUNTIME_DIR/runsbx` for everyone else (rootless, or root inside a
/// user namespace as under rootless podman).
pub fn default_root() -> PathBuf {
    if !privilege::rootless() {
        return PathBuf::from("/run/runsbx");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Path::new(&dir).join("runsbx"),
        _ => PathBuf::from(format!("/tmp/runsbx-{}", userns::caller_uid())),
    }
}

/// A state root that exists, is a directory owned by us, and is not
/// writable by others.
#[derive(Debug, Clone)]
pub struct StateRoot {
    path: PathBuf,
}

impl StateRoot {
    /// Opens (creating if needed, mode 0700) the state root at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let ctx = || format!("state root {path:?}");
        match fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
        {
            Ok(()) => {}
            Err(e) => {
                return Err(RuntimeError::io(
                    format!("{}: create it (pass a writable --root)", ctx()),
                    e,
                ))
            }
        }
        // A root under a shared directory such as /tmp could have been made
        // by someone else to capture our state: refuse one we do not own.
        let meta = fs::symlink_metadata(path).map_err(|e| RuntimeError::io(ctx(), e))?;
        if !meta.is_dir() {
            return Err(RuntimeError::invalid(ctx(), "it is not a directory"));
        }
        if meta.uid() != Uid::effective().as_raw() {
            return Err(RuntimeError::invalid(
                ctx(),
                format!(
                    "it is owned by uid {}, not by us (uid {}); pass --root",
                    meta.uid(),
                    Uid::effective()
                ),
            ));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(RuntimeError::invalid(
                ctx(),
                format!(
                    "it is writable by others (mode {:o}); chmod go-w it",
                    meta.mode() & 0o7777
                ),
            ));
        }
        let path = fs::canonicalize(path).map_err(|e| RuntimeError::io(ctx(), e))?;
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The state directory of container `id` (which must be valid).
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.path.join(id)
    }

    /// Whether a container with this id has state here.
    pub fn exists(&self, id: &str) -> bool {
        self.container_dir(id).join("state.json").exists()
    }

    /// The ids of every container with state here.
    pub fn ids(&self) -> Result<Vec<String>> {
        let entries = fs::read_dir(&self.path)
            .map_err(|e| RuntimeError::io(format!("read state root {:?}", self.path), e))?;
        let mut ids: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| validate_id(name).is_ok() && self.exists(name))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Takes the lock of container `id`, waiting for any other runsbx
    /// command on the same id to finish.
    pub fn lock(&self, id: &str) -> Result<IdLock> {
        validate_id(id)?;
        // A waiting acquire returns a lock or an error, never None.
        IdLock::acquire(self, id, true)?
            .ok_or_else(|| RuntimeError::invalid(format!("lock container `{id}`"), "not taken"))
    }

    /// Takes the lock of container `id` if no other command holds it.
    pub fn try_lock(&self, id: &str) -> Result<Option<IdLock>> {
        validate_id(id)?;
        IdLock::acquire(self, id, false)
    }
}

/// An exclusive lock on one container id, held for the life of a command.
///
/// It is a POSIX record lock (`F_SETLKW`), not `flock`: libcontainer clones
/// the container's init process from this one, and that process keeps every
/// fd open until it execs. A `flock` would travel with the fd and stay held by
/// the container; a record lock belongs to this process alone.
///
/// When the lock is dropped and the container has no state (it was deleted,
/// or never existed), the lock file is removed too, so nothing is left behind.
#[derive(Debug)]
pub struct IdLock {
    file: File,
    path: PathBuf,
    container_dir: PathBuf,
}

impl IdLock {
    /// Takes the lock, waiting for it when `wait`; `None` when it is held
    /// and `wait` is false.
    fn acquire(root: &StateRoot, id: &str, wait: bool) -> Result<Option<Self>> {
        let dir = root.path.join(LOCK_DIR);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| RuntimeError::io(format!("create lock directory {dir:?}"), e))?;
        let path = dir.join(id);
        let ctx = || format!("lock container `{id}` ({path:?})");
        // Another command may unlink the file between our open and our lock
        // (it deleted the container); then our lock guards nothing and we
        // retry on the file that is there now.
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| RuntimeError::io(ctx(), e))?;
            let lock = libc::flock {
                l_type: libc::F_WRLCK as libc::c_short,
                l_whence: libc::SEEK_SET as libc::c_short,
                l_start: 0,
                l_len: 0,
                l_pid: 0,
            };
            loop {
                let arg = if wait {
                    FcntlArg::F_SETLKW(&lock)
                } else {
                    FcntlArg::F_SETLK(&lock)
                };
                match fcntl(file.as_raw_fd(), arg) {
                    Ok(_) => break,
                    Err(nix::Error::EINTR) => continue,
                    Err(nix::Error::EAGAIN | nix::Error::EACCES) if !wait => return Ok(None),
                    Err(e) => return Err(RuntimeError::sys(ctx(), e)),
                }
            }
            let held = file.metadata().map_err(|e| RuntimeError::io(ctx(), e))?;
            match fs::symlink_metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    return Ok(Some(Self {
                        file,
                        path,
                        container_dir: root.container_dir(id),
                    }))
                }
                _ => continue,
            }
        }
    }
}

impl Drop for IdLock {
    fn drop(&mut self) {
        // Still holding the lock: no other command can be between its open
        // and its lock on this inode without noticing the unlink.
        if !self.container_dir.exists() {
            let _ = fs::remove_file(&self.path);
        }
        let _ = &self.file;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_are_refused() {
        for id in ["", ".", "..", "a/b", "../x", "a b", "a\0b", "é", "x@y"] {
            let err = validate_id(id).err();
            assert!(
                matches!(err, Some(RuntimeError::InvalidId { .. })),
                "{id:?} was accepted"
            );
        }
        let long = "a".repeat(MAX_ID_LEN + 1);
        assert!(validate_id(&long).is_err());
        assert!(validate_id(&"a".repeat(MAX_ID_LEN)).is_ok());
        for id in ["a", "abc-DEF_1.2+3", "...", ".hidden"] {
            assert!(validate_id(id).is_ok(), "{id:?} was refused");
        }
    }

    #[test]
    fn lock_file_is_removed_when_no_container_exists() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| RuntimeError::io("tempdir", e))?;
        let root = StateRoot::open(&dir.path().join("state"))?;
        let lock = root.lock("c1")?;
        assert!(root.path().join(LOCK_DIR).join("c1").exists());
        drop(lock);
        assert!(!root.path().join(LOCK_DIR).join("c1").exists());
        Ok(())
    }
}
