//! A session's storage, mounted for one call in the call's private mount
//! namespace (nobody else sees it, and it dies with the call):
//!
//! - as root, the session's disk (`disk.img`, ext4) through a loop device
//!   that detaches itself once its last mount is gone;
//! - the rootfs: an overlay of the image under the session's `upper/`,
//!   which `sys/stage.rs` makes again over idmapped layers, as it does an
//!   engine's overlay rootfs;
//! - the session's `workspace/`, bound where the call's workspace goes.
//!
//! Each directory is opened without following links (openat2
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) and mounted by its fd: a link
//! planted in the session's directory is refused, never followed.

use std::fs::{self, File};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::mount::{umount2, MntFlags};

use super::{Session, DISK, FS_DIR, UPPER, WORK, WORKSPACE};
use crate::error::{Result, RuntimeError};
use crate::sandbox::workspace::Workspace;
use crate::sys::{beneath, loopdev, newmount, privilege};

/// How long a call waits for the disk of a call that ended to be let go
/// (its sandbox's mount namespace dies just after it).
const DISK_WAIT: Duration = Duration::from_secs(10);

/// The session's disk and rootfs, mounted for one call; unmounted when
/// dropped (the workspace, bound from it, unmounts itself).
#[derive(Debug)]
pub struct Storage {
    /// The rootfs: the image under the session's layer.
    pub rootfs: PathBuf,
    /// Mount points to detach, last mounted first.
    mounts: Vec<PathBuf>,
}

impl Session {
    /// Mounts the session's storage under `call_dir`, over the image rootfs
    /// `lower`, and binds its workspace; inputs copied into the workspace
    /// go to `owner`.
    pub fn mount(
        &self,
        call_dir: &Path,
        lower: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<(Storage, Workspace)> {
        let name = &self.settings.name;
        let ctx = |what: &str| format!("mount session `{name}`'s storage: {what}");
        // Unmounted on any error from here on.
        let (mut storage, base) = self.mount_disk(&call_dir.join("disk"))?;
        storage.rootfs = call_dir.join("rootfs");
        let dir = |name: &str| {
            open_beneath(&base.fd, Path::new(name))
                .map_err(|e| RuntimeError::io(ctx(&format!("open {name}/")), e))
        };
        let (upper, work, workspace) = (dir(UPPER)?, dir(WORK)?, dir(WORKSPACE)?);
        let image = open_dir(lower)?;
        let overlay = newmount::writable_overlay(
            image.as_fd(),
            upper.as_fd(),
            work.as_fd(),
            privilege::rootless(),
        )
        .map_err(|e| {
            RuntimeError::sys(ctx("an overlay of the image under the session's layer"), e)
        })?;
        make_dir(&storage.rootfs)?;
        newmount::attach(overlay.as_fd(), &storage.rootfs)
            .map_err(|e| RuntimeError::sys(ctx("attach the rootfs"), e))?;
        storage.mounts.push(storage.rootfs.clone());
        let tree = newmount::clone_fd(workspace.as_fd())
            .map_err(|e| RuntimeError::sys(ctx("a bind mount of the workspace"), e))?;
        let workspace = Workspace::session(tree.as_fd(), &call_dir.join(WORKSPACE), owner)?;
        Ok((storage, workspace))
    }

    /// Mounts the session's disk at `target` (as root; rootless there is
    /// none): the returned storage unmounts it when dropped, and `Base` is
    /// the directory holding the layer and the workspace.
    pub(crate) fn mount_disk(&self, target: &Path) -> Result<(Storage, Base)> {
        let name = &self.settings.name;
        let ctx = |what: &str| format!("mount session `{name}`'s storage: {what}");
        let mut storage = Storage {
            rootfs: PathBuf::new(),
            mounts: Vec::new(),
        };
        if privilege::rootless() {
            let fd = open_beneath(&open_dir(&self.dir)?, Path::new(FS_DIR))
                .map_err(|e| RuntimeError::io(ctx(&format!("open {FS_DIR}/")), e))?;
            let path = self.dir.join(FS_DIR);
            return Ok((storage, Base { fd, path }));
        }
        let image = open_disk(&self.dir.join(DISK))
            .map_err(|e| RuntimeError::io(ctx(&format!("open {DISK}")), e))?;
        self.wait_for_disk()?;
        make_dir(target)?;
        loopdev::mount_ext4(&image, target)
            .map_err(|e| RuntimeError::io(ctx(&format!("mount {DISK} on {target:?}")), e))?;
        storage.mounts.push(target.to_owned());
        let fd = open_dir(target)?;
        Ok((
            storage,
            Base {
                fd,
                path: target.to_owned(),
            },
        ))
    }

    /// Waits until no loop device holds the disk: the mount namespace of
    /// the last call's sandbox may outlive it by a moment. Refused after
    /// [`DISK_WAIT`]: two mounts of one ext4 filesystem would corrupt it.
    fn wait_for_disk(&self) -> Result<()> {
        let disk = self.dir.join(DISK);
        let start = Instant::now();
        loop {
            let held = loopdev::attached_to(&disk);
            if held.is_empty() {
                return Ok(());
            }
            if start.elapsed() > DISK_WAIT {
                return Err(RuntimeError::Conflict {
                    what: format!("session `{}`'s disk", self.settings.name),
                    reason: format!(
                        "is still mounted through {held:?} by a sandbox that has not ended \
                         (a runsbx killed with SIGKILL: its watchdog ends it); try again"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The directory holding a session's layer and workspace, open.
pub(crate) struct Base {
    pub fd: OwnedFd,
    pub path: PathBuf,
}

impl Base {
    /// `name` (the layer or the workspace), reached without a link.
    pub fn open(&self, name: &str) -> std::io::Result<OwnedFd> {
        open_beneath(&self.fd, Path::new(name))
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = umount2(m, MntFlags::MNT_DETACH);
            let _ = fs::remove_dir(m);
        }
    }
}

/// The session's disk image: a regular file of runsbx's user, not a link.
fn open_disk(path: &Path) -> std::io::Result<File> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let md = file.metadata()?;
    if !md.is_file() || md.uid() != nix::unistd::Uid::effective().as_raw() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file of runsbx's user",
        ));
    }
    Ok(file)
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| RuntimeError::io(format!("open {path:?}"), e))
}

fn make_dir(path: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|e| RuntimeError::io(format!("create {path:?}"), e))
}

/// The directory `rel` beneath `dir`, reached without a symlink, a magic
/// link or another mount on the way.
fn open_beneath(dir: &OwnedFd, rel: &Path) -> std::io::Result<OwnedFd> {
    beneath::open(dir.as_fd(), rel, libc::O_RDONLY | libc::O_DIRECTORY)
}
