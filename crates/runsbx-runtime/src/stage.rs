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

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;
use nix::mount::{mount, MsFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult};
use runsbx_policy::IdRange;

use crate::error::{Result, RuntimeError};

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
    let userns = userns_with(range)
        .map_err(|e| RuntimeError::sys(ctx("a user namespace for the idmapped rootfs"), e))?;
    match idmapped_bind(&root, &target, &userns) {
        Ok(()) => {}
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
    for m in spec.mounts().iter().flatten() {
        let dest = m.destination();
        if root.resolve(dest).is_ok() {
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
    crate::mountinfo::unmount_under(&dir)?;
    fs::remove_dir_all(&dir).map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))
}

/// A user namespace whose ids 0..size are host ids base.., for
/// mount_setattr(MOUNT_ATTR_IDMAP): a forked child unshares it, runsbx
/// writes its maps, keeps an fd to it, and lets the child go.
fn userns_with(range: IdRange) -> nix::Result<fs::File> {
    let (ready_r, ready_w) = nix::unistd::pipe()?;
    let (done_r, done_w) = nix::unistd::pipe()?;
    // SAFETY: runsbx is single-threaded here; the child makes syscalls only.
    match unsafe { fork() }? {
        ForkResult::Child => {
            // Only the parent may hold these ends, or the reads never end.
            drop(ready_r);
            drop(done_w);
            let ok = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok();
            let _ = nix::unistd::write(&ready_w, &[u8::from(ok)]);
            let mut b = [0u8; 1];
            let _ = nix::unistd::read(done_r.as_raw_fd(), &mut b);
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
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
            result
        }
    }
}

fn io_errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// open_tree(OPEN_TREE_CLONE) + mount_setattr(MOUNT_ATTR_IDMAP) +
/// move_mount: `source` appears at `target` with its ids mapped through
/// `userns`.
fn idmapped_bind(source: &Path, target: &Path, userns: &fs::File) -> nix::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let src = CString::new(source.as_os_str().as_bytes()).map_err(|_| nix::Error::EINVAL)?;
    let dst = CString::new(target.as_os_str().as_bytes()).map_err(|_| nix::Error::EINVAL)?;
    let empty = c"";
    // SAFETY: these syscalls take C strings we own and return an fd or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        )
    };
    if tree < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: the kernel just returned this fd.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: attr is a live, correctly sized mount_attr.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(nix::Error::last());
    }
    // SAFETY: as above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(nix::Error::last());
    }
    Ok(())
}
