//! As root, what the sandbox's unprivileged ids must reach: the image,
//! through an idmapped mount, and the files engines bind in.
//!
//! Container root is an unprivileged host id range (see runsbx-policy's
//! userns module). libcontainer resolves the rootfs and every bind source
//! from inside that user namespace, so each must be reachable by it, and
//! mount points (/workspace) must be creatable in the image. runsbx mounts
//! the image, idmapped to the sandbox's range (host root's files appear
//! owned by container root), and each bind source, under
//! `/run/runsbx-rootfs/<key>/`, a path anyone may traverse but not list.
//! `remove` unmounts them all.
//!
//! A read-only rootfs is presented as a filesystem of its own (a one-layer
//! overlay whose layer is the idmapped image, handed over as a detached
//! mount), so that the sandbox's `/proc/self/mountinfo` names neither the
//! image's host directory nor the host's block device. Rootless, the same
//! view is made in runsbx's private mount namespace ([`private_view`]).

use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;
use nix::mount::{mount, MsFlags};
use nix::sys::wait::waitpid;
use runsbx_policy::IdRange;

use crate::error::{Result, RuntimeError};
use crate::sys::{fork, newmount};

pub(crate) const STAGE_ROOT: &str = "/run/runsbx-rootfs";

pub fn dir(key: &str) -> PathBuf {
    Path::new(STAGE_ROOT).join(key)
}

/// Stages `spec`'s rootfs and bind sources for container `key`, rewriting
/// the spec to point at them.
pub fn prepare(key: &str, range: IdRange, spec: &mut Spec) -> Result<()> {
    let dir = dir(key);
    let ctx = |what: &str| format!("stage {what} for the sandbox's ids under {dir:?}");
    for d in [Path::new(STAGE_ROOT), &dir] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(d)
            .map_err(|e| RuntimeError::io(ctx("a directory"), e))?;
        // Traversable by the sandbox's ids, not listable.
        fs::set_permissions(d, fs::Permissions::from_mode(0o711))
            .map_err(|e| RuntimeError::io(ctx("a directory"), e))?;
    }
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| RuntimeError::invalid("config.json", "has no root"))?;
    let target = dir.join("rootfs");
    fs::create_dir_all(&target).map_err(|e| RuntimeError::io(ctx("the rootfs mount point"), e))?;
    // Mount points must exist before the sandbox's unprivileged root looks
    // for them; made here as host root, resolved inside the rootfs (a
    // symlink in the image cannot point them outside).
    precreate_mount_points(&root, spec)?;
    let read_only = spec
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let userns = userns_with(range)?;
    let tree = newmount::clone_tree(&root)
        .map_err(|e| RuntimeError::sys(ctx(&format!("a copy of the rootfs mount {root:?}")), e))?;
    match newmount::idmap(tree.as_fd(), userns.as_fd()) {
        Ok(()) => {
            let view = if read_only {
                own_filesystem(tree)
            } else {
                // A writable rootfs is the bundle's own directory, written
                // through as under runc; its mount shows its host path.
                tree
            };
            newmount::attach(view.as_fd(), &target).map_err(|e| {
                RuntimeError::sys(ctx(&format!("an idmapped mount of the rootfs {root:?}")), e)
            })?;
        }
        // Filesystems without idmapped mount support (overlayfs as a whole,
        // as containerd's snapshots are): the image is bound as it is, and
        // its files keep host ownership; what "others" may read stays
        // readable.
        Err(nix::Error::EINVAL) => {
            tracing::warn!(rootfs = ?root, "the rootfs's filesystem cannot be idmapped: bound without id shifting; files only root may read stay unreadable in the sandbox");
            mount(
                Some(&root),
                &target,
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .map_err(|e| {
                RuntimeError::sys(ctx(&format!("a bind mount of the rootfs {root:?}")), e)
            })?;
        }
        Err(e) => {
            return Err(RuntimeError::sys(
                ctx(&format!("an idmapped mount of the rootfs {root:?}")),
                e,
            ))
        }
    }
    if let Some(r) = spec.root_mut() {
        r.set_path(target);
    }
    let mut mounts = spec.mounts().clone().unwrap_or_default();
    for (i, m) in mounts.iter_mut().enumerate() {
        let bind = runsbx_policy::is_bind_mount(m);
        let Some(source) = m.source().clone().filter(|_| bind) else {
            continue;
        };
        let meta = fs::metadata(&source)
            .map_err(|e| RuntimeError::io(format!("bind mount source {source:?}"), e))?;
        let staged = dir.join(format!("bind-{i}"));
        if meta.is_dir() {
            fs::create_dir_all(&staged)
        } else {
            fs::write(&staged, b"")
        }
        .map_err(|e| RuntimeError::io(ctx("a bind mount point"), e))?;
        mount(
            Some(&source),
            &staged,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| RuntimeError::sys(ctx(&format!("bind mount source {source:?}")), e))?;
        m.set_source(Some(staged));
    }
    spec.set_mounts(Some(mounts));
    Ok(())
}

fn precreate_mount_points(rootfs: &Path, spec: &Spec) -> Result<()> {
    let ctx = |dest: &Path| format!("create the mount point {dest:?} in the rootfs {rootfs:?}");
    let root = pathrs::Root::open(rootfs)
        .map_err(|e| RuntimeError::invalid(format!("open the rootfs {rootfs:?}"), e.to_string()))?;
    let dir_perm = fs::Permissions::from_mode(0o755);
    let mounts: Vec<_> = spec.mounts().iter().flatten().collect();
    for m in &mounts {
        let dest = m.destination();
        // A mount point on another mount (/dev/pts on /dev's tmpfs) is made
        // there, when that mount exists, not in the image.
        let on_another = mounts
            .iter()
            .any(|o| o.destination() != dest && dest.starts_with(o.destination()));
        if on_another || root.resolve(dest).is_ok() {
            continue;
        }
        let file_source = m
            .source()
            .as_ref()
            .is_some_and(|s| fs::metadata(s).is_ok_and(|md| !md.is_dir()))
            && m.typ().as_deref() == Some("bind");
        if file_source {
            if let Some(parent) = dest.parent() {
                root.mkdir_all(parent, &dir_perm)
                    .map_err(|e| RuntimeError::invalid(ctx(dest), e.to_string()))?;
            }
            root.create(
                dest,
                &pathrs::InodeType::File(fs::Permissions::from_mode(0o644)),
            )
            .map_err(|e| RuntimeError::invalid(ctx(dest), e.to_string()))?;
        } else {
            root.mkdir_all(dest, &dir_perm)
                .map_err(|e| RuntimeError::invalid(ctx(dest), e.to_string()))?;
        }
    }
    Ok(())
}

/// Unmounts and removes everything staged for `key`.
pub fn remove(key: &str) -> Result<()> {
    let dir = dir(key);
    if !dir.exists() {
        return Ok(());
    }
    runsbx_image::mountinfo::unmount_under(&dir)?;
    fs::remove_dir_all(&dir).map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))
}

/// A user namespace whose ids 0..size are host ids base.., for
/// mount_setattr(MOUNT_ATTR_IDMAP): a forked child unshares it, runsbx
/// writes its maps, keeps an fd to it, and lets the child go.
fn userns_with(range: IdRange) -> Result<fs::File> {
    let ctx = "a user namespace for the idmapped rootfs";
    let pipe = || nix::unistd::pipe().map_err(|e| RuntimeError::sys(ctx, e));
    let (ready_r, ready_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    // The child holds only its own ends, or the reads never end.
    let child = fork::child(ctx, &[ready_r.as_fd(), done_w.as_fd()], || {
        let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
        let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
        let mut b = [0u8; 1];
        let _ = nix::unistd::read(done_r.as_raw_fd(), &mut b);
        0
    })?;
    drop(ready_w);
    drop(done_r);
    let mut b = [0u8; 1];
    let result = (|| {
        nix::unistd::read(ready_r.as_raw_fd(), &mut b)?;
        if b[0] != 1 {
            return Err(nix::Error::EPERM);
        }
        let map = format!("0 {} {}", range.base, range.size);
        for file in ["uid_map", "gid_map"] {
            fs::write(format!("/proc/{child}/{file}"), &map).map_err(io_errno)?;
        }
        fs::File::open(format!("/proc/{child}/ns/user")).map_err(io_errno)
    })();
    drop(done_w);
    let _ = waitpid(child, None);
    result.map_err(|e| RuntimeError::sys(ctx, e))
}

fn io_errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// `tree` (a detached mount of a read-only rootfs) as a filesystem of its
/// own, so that the sandbox's mountinfo names no host directory or device;
/// `tree` itself where the kernel cannot (before Linux 6.13, overlayfs
/// takes no layer by fd).
fn own_filesystem(tree: OwnedFd) -> OwnedFd {
    match newmount::read_only_view(tree.as_fd()) {
        Ok(view) => view,
        Err(e) => {
            tracing::debug!(error = %e, "the rootfs is bound as it is: overlayfs refused it as an fd layer");
            tree
        }
    }
}

/// Rootless: when `spec`'s rootfs is read-only, mounts it as a filesystem
/// of its own under `effective_dir` and points the spec at it; the mount
/// points the spec needs are made in the rootfs first (the view cannot be
/// written), as libcontainer would have made them.
pub fn private_view(effective_dir: &Path, spec: &mut Spec) -> Result<Option<PrivateView>> {
    let Some(root) = spec.root().clone() else {
        return Ok(None);
    };
    if !root.readonly().unwrap_or(false) {
        return Ok(None);
    }
    precreate_mount_points(root.path(), spec)?;
    let view = PrivateView::mount(root.path(), &effective_dir.join("rootfs"))?;
    if let (Some(view), Some(r)) = (&view, spec.root_mut()) {
        r.set_path(view.path().to_owned());
    }
    Ok(view)
}

/// A read-only rootfs mounted as a filesystem of its own (see
/// [`own_filesystem`]) in this process's private mount namespace, where a
/// rootless runsbx builds its container: the container's mount namespace
/// is copied from this one, so only it keeps the mount. Dropping it
/// detaches the mount here, so the directory can be removed.
#[derive(Debug)]
pub struct PrivateView {
    target: PathBuf,
}

impl PrivateView {
    /// Mounts `rootfs` at `target` (created, 0700); `None` when the kernel
    /// cannot, and the rootfs is to be bound as it is.
    pub fn mount(rootfs: &Path, target: &Path) -> Result<Option<Self>> {
        use std::os::unix::fs::DirBuilderExt;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(target)
            .map_err(|e| {
                RuntimeError::io(format!("create the rootfs mount point {target:?}"), e)
            })?;
        let tree = newmount::clone_tree(rootfs)
            .map_err(|e| RuntimeError::sys(format!("a copy of the rootfs mount {rootfs:?}"), e))?;
        let view = match newmount::read_only_view(tree.as_fd()) {
            Ok(view) => view,
            Err(e) => {
                tracing::debug!(error = %e, "the rootfs is bound as it is: overlayfs refused it as an fd layer");
                return Ok(None);
            }
        };
        newmount::attach(view.as_fd(), target).map_err(|e| {
            RuntimeError::sys(format!("mount the rootfs {rootfs:?} on {target:?}"), e)
        })?;
        Ok(Some(Self {
            target: target.to_owned(),
        }))
    }

    pub fn path(&self) -> &Path {
        &self.target
    }
}

impl Drop for PrivateView {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.target, nix::mount::MntFlags::MNT_DETACH);
    }
}
