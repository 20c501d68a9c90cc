//! An engine's overlay rootfs, made again over idmapped layers.
//!
//! podman's, docker's and containerd's overlay drivers hand runsbx a
//! rootfs that is an overlay mount, and overlayfs cannot be idmapped as a
//! whole; its layers, directories on an ordinary filesystem, can. So as
//! root runsbx reads the engine's overlay from mountinfo and builds the
//! same overlay from idmapped, detached mounts of each layer: the files
//! keep their real owners inside the sandbox while its processes stay in
//! their own unprivileged host range, and writes land in the engine's own
//! upper layer, as they would through the engine's mount. Its work
//! directory is runsbx's own, beside the engine's: two overlays must not
//! share one (mounting cleans it).

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use runsbx_image::mountinfo::{self, MountEntry};

use crate::error::{Result, RuntimeError};
use crate::sys::newmount;

/// The name of runsbx's work directory, beside the engine's upper layer.
const WORK_DIR: &str = "runsbx-work";

/// overlayfs options that change how the layers' contents are read, kept
/// from the engine's mount; the rest (layer paths, uuid, ...) are not.
const KEPT_OPTIONS: &[&str] = &["redirect_dir", "metacopy", "index", "xino", "volatile"];

/// The layers of the engine's overlay mounted at a rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOverlay {
    /// From the top down.
    pub lowers: Vec<PathBuf>,
    pub upper: Option<PathBuf>,
    pub options: Vec<(String, String)>,
}

impl EngineOverlay {
    /// The overlay whose root is mounted at `rootfs`; `None` when the
    /// rootfs is not one.
    pub fn at(rootfs: &Path) -> Result<Option<Self>> {
        let entry = mountinfo::mount_at(rootfs)?;
        match entry {
            Some(m) if m.fstype == "overlay" && m.root == Path::new("/") => {
                parse(&m).map(Some).map_err(|reason| {
                    RuntimeError::invalid(format!("the engine's overlay rootfs {rootfs:?}"), reason)
                })
            }
            _ => Ok(None),
        }
    }

    /// Where runsbx's work directory for this overlay is.
    pub fn work_dir(&self) -> Option<PathBuf> {
        let upper = self.upper.as_ref()?;
        Some(upper.parent()?.join(WORK_DIR))
    }

    /// The same overlay, detached, over mounts of its layers idmapped
    /// through `userns` (the upper one through `upper_userns`, which also
    /// maps the host's root, whose credentials overlayfs writes with);
    /// read-only when `read_only` or when it has no upper layer.
    ///
    /// The writable pair is attached for the moment at `scratch` (an empty
    /// directory only root may enter): overlayfs takes an upper layer only
    /// from a mount in its namespace or the root of a detached one, and the
    /// upper and work directories are beneath one mount.
    pub fn idmapped(
        &self,
        userns: BorrowedFd<'_>,
        upper_userns: Option<BorrowedFd<'_>>,
        read_only: bool,
        scratch: &Path,
    ) -> nix::Result<OwnedFd> {
        let mapped = |path: &Path, userns: BorrowedFd<'_>| -> nix::Result<OwnedFd> {
            let tree = newmount::clone_dir(path)?;
            newmount::idmap(tree.as_fd(), userns)?;
            Ok(tree)
        };
        let layer = |path: &Path| mapped(path, userns);
        let (upper, _attached) = match (&self.upper, self.work_dir(), upper_userns) {
            (Some(upper), Some(work), Some(upper_userns)) if !read_only => {
                fresh_dir(&work)?;
                let upper_layer = |path: &Path| mapped(path, upper_userns);
                let (pair, attached) = upper_and_work(upper, &work, &upper_layer, scratch)?;
                (Some(pair), Some(attached))
            }
            _ => (None, None),
        };
        // Read-only, the engine's upper layer (what the container already
        // holds, the mount points the engine made) is the top lower one.
        let read_only_upper = self.upper.as_ref().filter(|_| upper.is_none());
        let lowers = read_only_upper
            .into_iter()
            .chain(&self.lowers)
            .map(|l| layer(l))
            .collect::<nix::Result<Vec<_>>>()?;
        let lowers: Vec<BorrowedFd<'_>> = lowers.iter().map(AsFd::as_fd).collect();
        let options: Vec<(&str, &str)> = self
            .options
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        newmount::overlay(
            &lowers,
            upper.as_ref(),
            &options,
            read_only,
            &mut Vec::new(),
        )
    }
}

/// Whether `spec`'s rootfs is an engine's per-container layer: the root
/// of an overlay mount (kernel overlayfs with an upper directory, or
/// fuse-overlayfs, rootless podman's) whose writable directory lies in
/// storage no other host user may enter (a directory on its path owned by
/// root and closed to others), so that nothing the sandbox writes there
/// is reachable by them.
pub fn is_container_layer(spec: &libcontainer::oci_spec::runtime::Spec) -> bool {
    let Some(rootfs) = spec.root().as_ref().map(|r| r.path().clone()) else {
        return false;
    };
    let Ok(Some(m)) = mountinfo::mount_at(&rootfs) else {
        return false;
    };
    if m.root != Path::new("/") {
        return false;
    }
    let upper = match m.fstype.as_str() {
        "overlay" => match parse(&m) {
            Ok(EngineOverlay {
                upper: Some(upper), ..
            }) => upper,
            _ => return false,
        },
        "fuse.fuse-overlayfs" => rootfs,
        _ => return false,
    };
    closed_to_others(&upper)
}

/// Whether a directory on `path`'s way (itself included) is owned by the
/// host's root (or by the caller, rootless) and lets no one else through.
/// Group root may pass as root (docker's storage is `0710 root:root`):
/// its members are root's own.
pub(crate) fn closed_to_others(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::Uid::effective().as_raw();
    let real_root = !crate::sys::privilege::rootless();
    path.ancestors().any(|dir| {
        fs::metadata(dir).is_ok_and(|md| {
            let group_closed = md.mode() & 0o010 == 0 || (real_root && md.gid() == 0);
            md.is_dir() && md.uid() == me && md.mode() & 0o001 == 0 && group_closed
        })
    })
}

/// The upper and work directories, opened beneath one idmapped mount of
/// their common parent, attached at `scratch` until the overlay exists.
fn upper_and_work(
    upper: &Path,
    work: &Path,
    layer: &dyn Fn(&Path) -> nix::Result<OwnedFd>,
    scratch: &Path,
) -> nix::Result<(newmount::Upper, Attached)> {
    let parent = upper.parent().ok_or(nix::Error::EINVAL)?;
    if work.parent() != Some(parent) {
        return Err(nix::Error::EXDEV);
    }
    let tree = layer(parent)?;
    newmount::attach(tree.as_fd(), scratch)?;
    let attached = Attached(scratch.to_owned());
    let open = |dir: &Path| -> nix::Result<OwnedFd> {
        let name = dir.file_name().ok_or(nix::Error::EINVAL)?;
        fs::File::open(scratch.join(name))
            .map(OwnedFd::from)
            .map_err(errno)
    };
    let pair = newmount::Upper {
        upper: open(upper)?,
        work: open(work)?,
    };
    Ok((pair, attached))
}

/// A mount attached for the moment, detached when dropped (the overlay
/// made from it keeps its own private copy).
struct Attached(PathBuf);

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// An empty directory at `path`, only root's (what a previous container
/// left there is removed).
fn fresh_dir(path: &Path) -> nix::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match fs::remove_dir_all(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(errno(e)),
    }
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(errno)
}

/// Removes runsbx's work directory beside `upper`, if there is one.
pub fn remove_work_dir(work: &Path) -> Result<()> {
    if work.file_name() != Some(WORK_DIR.as_ref()) {
        return Err(RuntimeError::invalid(
            format!("the recorded work directory {work:?}"),
            "is not one runsbx makes",
        ));
    }
    match fs::remove_dir_all(work) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io(format!("remove {work:?}"), e)),
    }
}

fn errno(e: std::io::Error) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// The layers of the overlay `m`. Relative layer paths (engines shorten
/// long option strings that way) are taken from the directory the
/// engine's layers live in: the upper layer's grandparent when it is
/// absolute (containerd), else the mount point's (docker, podman).
fn parse(m: &MountEntry) -> std::result::Result<EngineOverlay, String> {
    let mut lowers = Vec::new();
    let mut upper = None;
    let mut options = Vec::new();
    for option in split_options(&m.super_options) {
        let (key, value) = option.split_once('=').unwrap_or((option.as_str(), ""));
        match key {
            "lowerdir" => {
                if value.contains("::") {
                    return Err(
                        "it has data-only layers (`::`), which runsbx does not rebuild".into(),
                    );
                }
                lowers.extend(split_unescaped(value, ':').into_iter().map(PathBuf::from));
            }
            // A layer given by fd (the new mount API) is shown one per
            // option, by its path, in the order given: from the top down.
            "lowerdir+" => lowers.push(PathBuf::from(value)),
            "datadir+" => {
                return Err(
                    "it has data-only layers (`datadir+`), which runsbx does not rebuild".into(),
                )
            }
            "upperdir" => upper = Some(PathBuf::from(value)),
            "workdir" => {}
            _ if KEPT_OPTIONS.contains(&key) => options.push((key.to_owned(), value.to_owned())),
            _ => {}
        }
    }
    if lowers.is_empty() {
        return Err("mountinfo shows no lowerdir for it".into());
    }
    let base = match &upper {
        Some(u) if u.is_absolute() => u.parent().and_then(Path::parent),
        _ => m.mount_point.parent().and_then(Path::parent),
    }
    .map(Path::to_path_buf)
    .unwrap_or_default();
    let resolve = |p: PathBuf| if p.is_absolute() { p } else { base.join(p) };
    let lowers: Vec<PathBuf> = lowers.into_iter().map(resolve).collect();
    let upper = upper.map(resolve);
    for layer in lowers.iter().chain(upper.iter()) {
        if !layer.is_dir() {
            return Err(format!(
                "its layer {layer:?} is not a directory (as read from mountinfo)"
            ));
        }
    }
    Ok(EngineOverlay {
        lowers,
        upper,
        options,
    })
}

/// The comma-separated options of mountinfo's last field; overlayfs
/// escapes a comma in a path as `\,`.
fn split_options(text: &str) -> Vec<String> {
    split_unescaped(text, ',')
}

/// `text` split at each `sep` not escaped by a backslash; escapes of the
/// separator are removed.
fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut part = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&sep) => {
                part.push(sep);
                chars.next();
            }
            c if c == sep => parts.push(std::mem::take(&mut part)),
            c => part.push(c),
        }
    }
    parts.push(part);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(mount_point: &Path, options: &str) -> MountEntry {
        MountEntry {
            root: PathBuf::from("/"),
            mount_point: mount_point.to_owned(),
            fstype: "overlay".into(),
            source: "overlay".into(),
            super_options: options.into(),
        }
    }

    #[test]
    fn layers_are_read_from_mountinfo_absolute_or_relative() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path();
        for p in ["l/A", "l/B", "c1/diff", "c1/work", "c1/merged"] {
            fs::create_dir_all(s.join(p)).unwrap();
        }
        let merged = s.join("c1/merged");
        let absolute = format!(
            "rw,lowerdir={0}/l/A:{0}/l/B,upperdir={0}/c1/diff,workdir={0}/c1/work,redirect_dir=on,uuid=on",
            s.display()
        );
        let o = parse(&entry(&merged, &absolute)).unwrap();
        assert_eq!(o.lowers, [s.join("l/A"), s.join("l/B")]);
        assert_eq!(o.upper, Some(s.join("c1/diff")));
        assert_eq!(o.options, [("redirect_dir".to_owned(), "on".to_owned())]);
        assert_eq!(o.work_dir(), Some(s.join("c1").join(WORK_DIR)));
        // docker's short form: relative to the layers' directory.
        let relative = "rw,lowerdir=l/A:l/B,upperdir=c1/diff,workdir=c1/work";
        assert_eq!(
            parse(&entry(&merged, relative)).unwrap(),
            o_without_options(&o)
        );
        // containerd's: relative lowers, absolute upper.
        let mixed = format!(
            "rw,lowerdir=l/A:l/B,upperdir={0}/c1/diff,workdir={0}/c1/work",
            s.display()
        );
        assert_eq!(
            parse(&entry(Path::new("/run/elsewhere/rootfs"), &mixed)).unwrap(),
            o_without_options(&o)
        );
        // Layers given by fd, as the kernel shows them.
        let by_fd = format!(
            "rw,lowerdir+={0}/l/A,lowerdir+={0}/l/B,upperdir={0}/c1/diff,workdir={0}/c1/work",
            s.display()
        );
        assert_eq!(
            parse(&entry(&merged, &by_fd)).unwrap(),
            o_without_options(&o)
        );
        // A layer that does not exist, data-only layers, no lowerdir.
        assert!(parse(&entry(&merged, "rw,lowerdir=l/Z,upperdir=c1/diff")).is_err());
        assert!(parse(&entry(&merged, "rw,lowerdir=l/A::l/B")).is_err());
        assert!(parse(&entry(&merged, "rw,upperdir=c1/diff")).is_err());
    }

    fn o_without_options(o: &EngineOverlay) -> EngineOverlay {
        EngineOverlay {
            options: Vec::new(),
            ..o.clone()
        }
    }

    #[test]
    fn only_storage_closed_to_others_counts_as_a_container_layer() {
        use std::os::unix::fs::PermissionsExt;
        // A directory of runsbx's uid, 0700: what is below it is private.
        let private = tempfile::tempdir().unwrap();
        let upper = private.path().join("c1/diff");
        fs::create_dir_all(&upper).unwrap();
        fs::set_permissions(private.path(), fs::Permissions::from_mode(0o700)).unwrap();
        assert!(closed_to_others(&upper));
        // Every directory on the way open to others (/, /tmp, 0755 ones):
        // a setuid file made there would be anyone's to run.
        let open = tempfile::tempdir().unwrap();
        fs::set_permissions(open.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let upper = open.path().join("c1/diff");
        fs::create_dir_all(&upper).unwrap();
        for dir in [open.path().join("c1"), upper.clone()] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert!(!closed_to_others(&upper));
        // Group-traversable is open too, but to group root as real root
        // (docker's storage is 0710 root:root).
        fs::set_permissions(open.path(), fs::Permissions::from_mode(0o710)).unwrap();
        if nix::unistd::Uid::effective().is_root() && !crate::sys::privilege::rootless() {
            nix::unistd::chown(open.path(), None, Some(nix::unistd::Gid::from_raw(0))).unwrap();
            assert!(closed_to_others(&upper));
            nix::unistd::chown(open.path(), None, Some(nix::unistd::Gid::from_raw(1))).unwrap();
        }
        assert!(!closed_to_others(&upper));
    }

    #[test]
    fn escaped_separators_stay_in_paths() {
        assert_eq!(split_unescaped(r"a\,b,c", ','), ["a,b", "c"]);
        assert_eq!(split_unescaped(r"/x\:y:/z", ':'), ["/x:y", "/z"]);
    }
}
