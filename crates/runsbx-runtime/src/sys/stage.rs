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
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use libcontainer::oci_spec::runtime::Spec;
use nix::mount::{mount, MsFlags};
use runsbx_policy::IdRange;

use crate::error::{Result, RuntimeError};
use crate::sys::layers::{self, EngineOverlay};
use crate::sys::newmount;
use crate::sys::userns;

pub(crate) const STAGE_ROOT: &str = "/run/runsbx-rootfs";

/// The file, in a container's stage directory, naming the work directory
/// runsbx made beside an engine's upper layer (see sys/layers.rs).
const WORK_DIR_RECORD: &str = "overlay-work-dir";

pub fn dir(key: &str) -> PathBuf {
    Path::new(STAGE_ROOT).join(key)
}

/// Stages `spec`'s rootfs and bind sources for container `key`, rewriting
/// the spec to point at them.
///
/// `unshifted`: the profile lets an engine's rootfs that the kernel cannot
/// show with its owners be bound without id shifting instead of refused.
/// `volumes`: the destinations of binds that are the engine's named
/// volumes, bound idmapped (the others, such as a call's workspace, which
/// runsbx gave the sandbox's ids itself, as they are).
pub fn prepare(
    key: &str,
    range: IdRange,
    spec: &mut Spec,
    unshifted: bool,
    volumes: &[PathBuf],
) -> Result<()> {
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
            let (view, layers) = if read_only {
                own_filesystem(tree)
            } else {
                // A writable rootfs is the bundle's own directory, written
                // through as under runc; its mount shows its host path.
                (tree, Vec::new())
            };
            newmount::attach(view.as_fd(), &target).map_err(|e| {
                RuntimeError::sys(ctx(&format!("an idmapped mount of the rootfs {root:?}")), e)
            })?;
            keep_with_namespace(&dir, layers);
        }
        // overlayfs cannot be idmapped as a whole: an engine's overlay
        // rootfs is made again over idmapped layers (sys/layers.rs).
        Err(nix::Error::EINVAL) => {
            drop(tree);
            let view = match EngineOverlay::at(&root)? {
                Some(overlay) => rebuilt(&dir, &root, &overlay, range, userns.as_fd(), read_only),
                None => Err(
                    "its filesystem cannot be idmapped, and it is not the root of an \
                             overlay mount whose layers could be"
                        .to_owned(),
                ),
            };
            match view {
                Ok(view) => newmount::attach(view.as_fd(), &target).map_err(|e| {
                    RuntimeError::sys(
                        ctx(&format!("the rebuilt overlay of the rootfs {root:?}")),
                        e,
                    )
                })?,
                Err(reason) if unshifted => {
                    tracing::debug!(rootfs = ?root, "bound without id shifting, as the profile allows: {reason}");
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
                Err(reason) => {
                    return Err(RuntimeError::Unsupported {
                        what: format!(
                            "showing the rootfs {root:?} to the sandbox with its files' owners"
                        ),
                        reason: format!(
                            "{reason}; a profile may allow binding it without id shifting \
                             (`unshifted_rootfs = true`: files show as nobody's, and files only \
                             their owner may read stay unreadable)"
                        ),
                    })
                }
            }
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
        if volumes.contains(m.destination()) {
            bind_idmapped(&source, &staged, userns.as_fd())
        } else {
            mount(
                Some(&source),
                &staged,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        }
        .map_err(|e| RuntimeError::sys(ctx(&format!("bind mount source {source:?}")), e))?;
        m.set_source(Some(staged));
    }
    spec.set_mounts(Some(mounts));
    Ok(())
}

/// Binds `source` at `staged` with its files' owners shifted into the
/// sandbox's range, as the rootfs is: an engine's volume that root owns is
/// container root's. On a filesystem that cannot be idmapped, a plain
/// bind (its files show as nobody's, as before).
fn bind_idmapped(
    source: &Path,
    staged: &Path,
    userns: std::os::fd::BorrowedFd<'_>,
) -> nix::Result<()> {
    let detached = newmount::clone_dir(source)?;
    match newmount::idmap(detached.as_fd(), userns) {
        Ok(()) => newmount::attach(detached.as_fd(), staged),
        Err(nix::Error::EINVAL) => mount(
            Some(source),
            staged,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        ),
        Err(e) => Err(e),
    }
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

/// The engine's overlay `overlay`, made again over layers idmapped through
/// `userns`. Its work directory is recorded under `dir` before it exists.
fn rebuilt(
    dir: &Path,
    root: &Path,
    overlay: &EngineOverlay,
    range: IdRange,
    userns: std::os::fd::BorrowedFd<'_>,
    read_only: bool,
) -> std::result::Result<OwnedFd, String> {
    let upper_userns = if read_only {
        None
    } else {
        Some(userns_for_upper(range).map_err(|e| e.to_string())?)
    };
    if let Some(work) = overlay.work_dir().filter(|_| !read_only) {
        fs::write(
            dir.join(WORK_DIR_RECORD),
            work.as_os_str().as_encoded_bytes(),
        )
        .map_err(|e| format!("record the overlay's work directory: {e}"))?;
    }
    // Where the writable pair is attached for the moment (layers.rs).
    let scratch = dir.join("layers");
    if !read_only {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&scratch)
            .map_err(|e| format!("create {scratch:?}: {e}"))?;
    }
    overlay
        .idmapped(
            userns,
            upper_userns.as_ref().map(AsFd::as_fd),
            read_only,
            &scratch,
        )
        .map_err(|e| {
            format!(
                "{root:?} is an overlay, which cannot be idmapped as a whole, and this kernel \
             refused to make it again over idmapped layers ({e}; overlayfs takes layers by fd \
             from Linux 6.13)"
            )
        })
}

/// For a sandbox that runsbx builds and removes from a mount namespace of
/// its own (a call, a pool's sandbox): a tmpfs over [`STAGE_ROOT`] there,
/// so that its stage directories exist only in that namespace and go with
/// it. Nothing of them is made or removed on the host's filesystem, which
/// is a disk where /run is not a tmpfs: on such a host the three
/// directories of a call cost a few hundred microseconds each to remove.
/// Traversable by the sandbox's ids, as the host's directory is.
pub(crate) fn private_root() -> Result<()> {
    let ctx = || format!("mount a private tmpfs on {STAGE_ROOT} for the call's staging");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(STAGE_ROOT)
        .map_err(|e| RuntimeError::io(ctx(), e))?;
    mount(
        Some("runsbx-stage"),
        STAGE_ROOT,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("mode=0711,size=1m"),
    )
    .map_err(|e| RuntimeError::sys(ctx(), e))
}

/// Whether this process's stages are left to its mount namespace (see
/// [`leave_to_namespace`]).
static LEFT_TO_NAMESPACE: AtomicBool = AtomicBool::new(false);

/// For a call whose stage nothing else uses once it is done (not a
/// session's: its next call mounts the same layers, once this one's are
/// gone): what [`private_root`] holds is not unmounted by [`remove`] but
/// left to go with the call's mount namespace, all at once, when its
/// processes exit. Each unmount waits for an RCU grace period of its own
/// (an expedited one: interrupts to every CPU, and a kernel thread's
/// work, about 0.1-0.3 ms of CPU on these 2-core VMs); the namespace's end
/// waits for one anyway, whatever it holds.
pub(crate) fn leave_to_namespace() {
    LEFT_TO_NAMESPACE.store(true, Ordering::Relaxed);
}

/// Unmounts and removes everything staged for `key`.
pub fn remove(key: &str) -> Result<()> {
    let dir = dir(key);
    if !dir.exists() {
        return Ok(());
    }
    // Only a stage in this process's private tmpfs is found here once
    // [`leave_to_namespace`] was called (the host's STAGE_ROOT is hidden
    // under it); one with an overlay's work directory on a disk is
    // removed as ever.
    if LEFT_TO_NAMESPACE.load(Ordering::Relaxed) && !dir.join(WORK_DIR_RECORD).exists() {
        return Ok(());
    }
    runsbx_image::mountinfo::unmount_under(&dir)?;
    if let Ok(work) = fs::read(dir.join(WORK_DIR_RECORD)) {
        use std::os::unix::ffi::OsStrExt;
        layers::remove_work_dir(Path::new(std::ffi::OsStr::from_bytes(&work)))?;
    }
    crate::sys::beneath::remove_tree(&dir)
        .map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))
}

/// A user namespace whose ids 0..size are host ids base.., for
/// mount_setattr(MOUNT_ATTR_IDMAP): a child is cloned into it, runsbx
/// writes its maps, keeps an fd to it, and lets the child go.
fn userns_with(range: IdRange) -> Result<fs::File> {
    userns_mapping(&format!("0 {} {}", range.base, range.size))
}

/// The id, on disk, of what overlayfs writes as the host's root through an
/// idmapped upper layer (its work files, before copy-up gives each file
/// its owner): the highest valid id, outside any sandbox's range.
const MOUNTER_ON_DISK: u32 = u32::MAX - 1;

/// [`userns_with`], plus host root as [`MOUNTER_ON_DISK`]: for the idmapped
/// upper layer of a rebuilt overlay, where overlayfs works with the
/// mounter's (host root's) credentials, which must be mapped. The
/// sandbox's processes are never in this namespace; the rootfs is nosuid.
fn userns_for_upper(range: IdRange) -> Result<fs::File> {
    userns_mapping(&format!(
        "0 {} {}\n{MOUNTER_ON_DISK} 0 1",
        range.base, range.size
    ))
}

fn userns_mapping(map: &str) -> Result<fs::File> {
    userns::with_maps("a user namespace for the idmapped rootfs", map, map, false)
}

/// `tree` (a detached mount of a read-only rootfs) as a filesystem of its
/// own, so that the sandbox's mountinfo names no host directory or device;
/// `tree` itself where the kernel cannot (before Linux 6.13, overlayfs
/// takes no layer by fd).
///
/// Its layers (`tree`, and the empty one the overlay is given below it)
/// are returned too, still detached, for [`keep_with_namespace`].
fn own_filesystem(tree: OwnedFd) -> (OwnedFd, Vec<OwnedFd>) {
    let mut layers = Vec::new();
    match newmount::read_only_view(tree.as_fd(), &mut layers) {
        Ok(view) => {
            layers.push(tree);
            (view, layers)
        }
        Err(e) => {
            tracing::debug!(error = %e, "the rootfs is bound as it is: overlayfs refused it as an fd layer");
            (tree, layers)
        }
    }
}

/// The detached `layers` of a stage's rootfs view: attached under its
/// directory `dir` when the stage is left to the call's mount namespace
/// ([`leave_to_namespace`]), where they go at the namespace's end with
/// every other mount of it. Elsewhere they are dropped: each is then
/// dissolved at once, waiting for an RCU grace period of its own (about
/// 0.1-0.3 ms of CPU each on these VMs), as every unmount does. Attached
/// or dissolved, nothing but the view's overlay uses them (it holds
/// private copies of its layers).
///
/// Attached, each is read-only, under a directory only host root may
/// enter: the image's layer is the image itself, idmapped, and the
/// sandbox's own ids (its init, before it pivots into its rootfs, is in a
/// copy of this namespace) must not reach it there. A layer that cannot
/// be kept so is dropped.
fn keep_with_namespace(dir: &Path, layers: Vec<OwnedFd>) {
    if !LEFT_TO_NAMESPACE.load(Ordering::Relaxed) || layers.is_empty() {
        return;
    }
    let kept = dir.join("layers");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&kept) {
        tracing::debug!(dir = ?kept, "keep the rootfs view's layers: {e}");
        return;
    }
    for (i, layer) in layers.into_iter().enumerate() {
        let at = kept.join(i.to_string());
        let attached = newmount::read_only(layer.as_fd())
            .map_err(|e| e.to_string())
            .and_then(|()| {
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&at)
                    .map_err(|e| e.to_string())
            })
            .and_then(|()| newmount::attach(layer.as_fd(), &at).map_err(|e| e.to_string()));
        if let Err(e) = attached {
            tracing::debug!(layer = ?at, "keep a layer of the rootfs view: {e}");
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
        let view = match newmount::read_only_view(tree.as_fd(), &mut Vec::new()) {
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
