//! Applying image layers, tar streams, to a root filesystem: OCI
//! whiteouts, and no entry reaching outside the root.
//!
//! Every path is resolved inside the root by pathrs (openat2
//! `RESOLVE_IN_ROOT`): a symlink in the tree, whatever it points at, is
//! followed as if the root were `/`, so a layer with `a -> /tmp` and then
//! `a/evil` writes `<root>/tmp/evil`, never the host's /tmp. The last
//! component of an entry is never followed: an entry replaces a symlink
//! there, it does not write through it. Entries named with `..` or an
//! absolute path are refused outright; no image tool makes them.
//!
//! Whiteouts follow the OCI image spec (image-spec/layer.md): `.wh.<name>`
//! deletes `<name>` of the lower layers, `.wh..wh..opq` empties its
//! directory of lower-layer content. Either only touches what lower layers
//! made, never an entry of its own layer.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::{File, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime};

use pathrs::flags::OpenFlags;
use pathrs::{InodeType, Root};
use tar::EntryType;

use crate::error::{ImageError, Result};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";

/// Unpacks layers, lowest first, into one root filesystem.
pub(super) struct Unpacker {
    root: Root,
    /// Keep the owners of the entries: only real root can (otherwise every
    /// file belongs to the caller).
    chown: bool,
    /// Directory attributes, applied by `finish` once nothing more is
    /// written into them (a read-only directory must still take entries of
    /// later layers, and every write would change its mtime).
    dirs: BTreeMap<PathBuf, Attrs>,
    /// Device nodes and fifos left out.
    pub(super) skipped: usize,
}

#[derive(Debug, Clone, Copy)]
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: u64,
}

impl Unpacker {
    pub(super) fn new(rootfs: &Path, chown: bool) -> Result<Self> {
        let root = Root::open(rootfs)
            .map_err(|e| ImageError::io(format!("open {rootfs:?}"), io::Error::other(e)))?;
        Ok(Self {
            root,
            chown,
            dirs: BTreeMap::new(),
            skipped: 0,
        })
    }

    /// Applies one layer; `what` names it in errors ("layer 2/5 of …").
    pub(super) fn apply(&mut self, layer: impl Read, what: &str) -> Result<()> {
        let corrupt = |e: io::Error| ImageError::invalid(what, format!("not a valid tar: {e}"));
        let mut archive = tar::Archive::new(layer);
        // This layer's own paths and their parents, which its whiteouts
        // must leave alone.
        let mut ours: HashSet<PathBuf> = HashSet::new();
        for entry in archive.entries().map_err(corrupt)? {
            let mut entry = entry.map_err(corrupt)?;
            let raw = entry.path().map_err(corrupt)?.into_owned();
            let path = in_root(&raw)
                .map_err(|reason| ImageError::invalid(what, format!("entry {raw:?}: {reason}")))?;
            let Some(path) = path else {
                continue; // the root itself ("./")
            };
            let name = path.file_name().unwrap_or_default();
            if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
                let dir = path.parent().unwrap_or(Path::new(""));
                if name == OPAQUE_WHITEOUT {
                    self.clear_lower(dir, &ours, what)?;
                } else if !hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
                    // (Other `.wh..wh.` names are aufs bookkeeping.)
                    let target = dir.join(OsStr::from_bytes(hidden));
                    if !ours.contains(&target) {
                        self.remove(&target, what)?;
                    }
                }
                continue;
            }
            for p in path.ancestors().take_while(|p| !p.as_os_str().is_empty()) {
                ours.insert(p.to_path_buf());
            }
            self.entry(&path, &mut entry, what)?;
        }
        Ok(())
    }

    /// Gives the directories their modes, owners and mtimes, deepest
    /// first.
    pub(super) fn finish(self) -> Result<()> {
        for (path, attrs) in self.dirs.iter().rev() {
            // Gone or replaced by a later layer: nothing to do.
            let Ok(handle) = self.root.resolve_nofollow(path) else {
                continue;
            };
            let Ok(dir) = handle.reopen(OpenFlags::O_RDONLY | OpenFlags::O_DIRECTORY) else {
                continue;
            };
            let ctx = || format!("set the attributes of {path:?}");
            self.set_attrs(&dir, attrs)
                .map_err(|e| ImageError::io(ctx(), e))?;
        }
        Ok(())
    }

    fn entry<R: Read>(&mut self, path: &Path, entry: &mut tar::Entry<R>, what: &str) -> Result<()> {
        let attrs = Attrs::of(entry)
            .map_err(|e| ImageError::invalid(what, format!("entry {path:?}: bad header: {e}")))?;
        let link = || -> Result<PathBuf> {
            match entry.link_name() {
                Ok(Some(target)) => Ok(target.into_owned()),
                _ => Err(ImageError::invalid(
                    what,
                    format!("entry {path:?}: a link without a target"),
                )),
            }
        };
        match entry.header().entry_type() {
            EntryType::Directory => self.dir(path, attrs, what),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.file(path, entry, attrs, what)
            }
            EntryType::Symlink => {
                let target = link()?;
                self.symlink(path, &target, attrs, what)
            }
            EntryType::Link => {
                let target = link()?;
                self.hardlink(path, &target, what)
            }
            // A rootless caller cannot mknod, and a sandbox never needs the
            // image's: its /dev is a tmpfs of its own.
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                tracing::debug!("{what}: skipping device node or fifo {path:?}");
                self.skipped += 1;
                Ok(())
            }
            other => {
                tracing::debug!("{what}: skipping {path:?} (tar entry type {other:?})");
                Ok(())
            }
        }
    }

    fn dir(&mut self, path: &Path, attrs: Attrs, what: &str) -> Result<()> {
        if !self.make_room(path, true, what)? {
            // Owner rwx until `finish`: later entries are written into it.
            let perm = Permissions::from_mode(attrs.mode & 0o777 | 0o700);
            self.root
                .create(path, &InodeType::Directory(perm))
                .map_err(|e| fs_error(what, "create directory", path, e))?;
        }
        self.dirs.insert(path.to_path_buf(), attrs);
        Ok(())
    }

    fn file(&mut self, path: &Path, data: &mut impl Read, attrs: Attrs, what: &str) -> Result<()> {
        self.make_room(path, false, what)?;
        let flags = OpenFlags::O_WRONLY | OpenFlags::O_EXCL | OpenFlags::O_NOFOLLOW;
        let mut file = self
            .root
            .create_file(path, flags, &Permissions::from_mode(0o600))
            .map_err(|e| fs_error(what, "create", path, e))?;
        copy(data, &mut file).map_err(|e| match e {
            CopyError::Read(e) => {
                ImageError::invalid(what, format!("entry {path:?}: cannot read its data: {e}"))
            }
            CopyError::Write(e) => ImageError::io(format!("{what}: write {path:?}"), e),
        })?;
        // Set-id bits are kept, as in the image: the sandbox runs with
        // no_new_privs, so they give nothing there.
        self.set_attrs(&file, &attrs)
            .map_err(|e| ImageError::io(format!("{what}: set the attributes of {path:?}"), e))
    }

    fn symlink(&mut self, path: &Path, target: &Path, attrs: Attrs, what: &str) -> Result<()> {
        self.make_room(path, false, what)?;
        // The target is stored as it is; it is only ever resolved inside a
        // root (here by pathrs, in the sandbox by the kernel).
        self.root
            .create(path, &InodeType::Symlink(target.to_path_buf()))
            .map_err(|e| fs_error(what, "create symlink", path, e))?;
        if self.chown {
            let handle = self
                .root
                .resolve_nofollow(path)
                .map_err(|e| fs_error(what, "open symlink", path, e))?;
            nix::unistd::fchownat(
                Some(handle.as_fd().as_raw_fd()),
                "",
                Some(attrs.uid.into()),
                Some(attrs.gid.into()),
                nix::fcntl::AtFlags::AT_EMPTY_PATH | nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| ImageError::sys(format!("{what}: chown symlink {path:?}"), e))?;
        }
        Ok(())
    }

    fn hardlink(&mut self, path: &Path, target: &Path, what: &str) -> Result<()> {
        // A hard link names another entry of the archive: inside the root,
        // and resolved there by pathrs like every path.
        let target = match in_root(target) {
            Ok(Some(target)) => target,
            Ok(None) => PathBuf::from("/"),
            Err(reason) => {
                return Err(ImageError::invalid(
                    what,
                    format!("hard link {path:?} to {target:?}: {reason}"),
                ))
            }
        };
        if target == path {
            return Ok(());
        }
        self.make_room(path, false, what)?;
        self.root
            .create(path, &InodeType::Hardlink(target.clone()))
            .map_err(|e| match errno(&e) {
                Some(libc::ENOENT) => ImageError::invalid(
                    what,
                    format!("hard link {path:?} to {target:?}, which is not in the image"),
                ),
                _ => fs_error(what, "create hard link", path, e),
            })
    }

    /// Makes `path` free for a new entry: creates its parents, and removes
    /// what is there, unless that is a directory and a directory comes.
    /// Returns whether that directory is there.
    fn make_room(&mut self, path: &Path, for_dir: bool, what: &str) -> Result<bool> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            self.root
                .mkdir_all(parent, &Permissions::from_mode(0o755))
                .map_err(|e| {
                    fs_error(
                        what,
                        "create the parents (one is a file, or a symlink to nowhere in the image?) of",
                        path,
                        e,
                    )
                })?;
        }
        let existing = match self.root.resolve_nofollow(path) {
            Ok(handle) => handle,
            Err(e) if errno(&e) == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(fs_error(what, "look up", path, e)),
        };
        let is_dir = File::from(OwnedFd::from(existing))
            .metadata()
            .map_err(|e| ImageError::io(format!("{what}: stat {path:?}"), e))?
            .is_dir();
        if is_dir && for_dir {
            return Ok(true);
        }
        if is_dir {
            self.remove(path, what)?;
        } else {
            self.root
                .remove_file(path)
                .map_err(|e| fs_error(what, "replace", path, e))?;
        }
        Ok(false)
    }

    /// Removes `path` and everything under it, if it is there.
    fn remove(&mut self, path: &Path, what: &str) -> Result<()> {
        match self.root.remove_all(path) {
            Ok(()) => {}
            Err(e) if matches!(errno(&e), Some(libc::ENOENT | libc::ENOTDIR)) => {}
            Err(e) => return Err(fs_error(what, "remove", path, e)),
        }
        self.dirs.retain(|d, _| !d.starts_with(path));
        Ok(())
    }

    /// An opaque whiteout: removes what lower layers put in `dir`, keeping
    /// this layer's entries (`ours`) there and below.
    fn clear_lower(&mut self, dir: &Path, ours: &HashSet<PathBuf>, what: &str) -> Result<()> {
        let children = children(&self.root, dir)
            .map_err(|e| ImageError::io(format!("{what}: read directory {dir:?}"), e))?;
        for child in children {
            if ours.contains(&child) {
                self.clear_lower(&child, ours, what)?;
            } else {
                self.remove(&child, what)?;
            }
        }
        Ok(())
    }

    /// Owner (as root), then mode (a chown clears set-id bits), then mtime.
    fn set_attrs(&self, file: &File, attrs: &Attrs) -> io::Result<()> {
        if self.chown {
            std::os::unix::fs::fchown(file, Some(attrs.uid), Some(attrs.gid))?;
        }
        file.set_permissions(Permissions::from_mode(attrs.mode))?;
        file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(attrs.mtime))
    }
}

impl Attrs {
    /// The header's mode, owner and mtime, with PAX records overriding
    /// them (owners above 2^21 and precise times only fit there).
    fn of<R: Read>(entry: &mut tar::Entry<R>) -> io::Result<Self> {
        let header = entry.header();
        let narrow = |v: u64| u32::try_from(v).map_err(io::Error::other);
        let mut attrs = Self {
            mode: header.mode()? & 0o7777,
            uid: narrow(header.uid()?)?,
            gid: narrow(header.gid()?)?,
            mtime: header.mtime()?,
        };
        if let Some(pax) = entry.pax_extensions()? {
            for ext in pax.flatten() {
                let (Ok(key), Ok(value)) = (ext.key(), ext.value()) else {
                    continue;
                };
                match key {
                    "uid" => attrs.uid = value.parse().map_err(io::Error::other)?,
                    "gid" => attrs.gid = value.parse().map_err(io::Error::other)?,
                    "mtime" => {
                        let secs = value.split('.').next().unwrap_or_default();
                        attrs.mtime = secs.parse().unwrap_or(attrs.mtime);
                    }
                    _ => {}
                }
            }
        }
        Ok(attrs)
    }
}

/// The entries of directory `dir` inside `root`, as paths relative to the
/// root; none when it is missing or not a directory.
pub(super) fn children(root: &Root, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let lookup = if dir.as_os_str().is_empty() {
        Path::new("/")
    } else {
        dir
    };
    let opened = root
        .resolve_nofollow(lookup)
        .and_then(|h| h.reopen(OpenFlags::O_RDONLY | OpenFlags::O_DIRECTORY));
    let file = match opened {
        Ok(file) => file,
        Err(e) => {
            return match errno(&e) {
                Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => Ok(Vec::new()),
                Some(n) => Err(io::Error::from_raw_os_error(n)),
                None => Err(io::Error::other(e)),
            }
        }
    };
    // nix's Dir: std has no readdir on an open directory fd.
    let mut listing = nix::dir::Dir::from(file)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(dir.join(name));
        }
    }
    Ok(names)
}

/// An entry's path relative to the root: `None` for the root itself; an
/// error for `..` or an absolute path.
fn in_root(raw: &Path) -> std::result::Result<Option<PathBuf>, &'static str> {
    let mut path = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(part) => path.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("`..` would leave the image's root"),
            Component::RootDir | Component::Prefix(_) => {
                return Err("an absolute path is not allowed in a layer")
            }
        }
    }
    Ok((!path.as_os_str().is_empty()).then_some(path))
}

fn errno(e: &pathrs::error::Error) -> Option<i32> {
    match e.kind() {
        pathrs::error::ErrorKind::OsError(errno) => errno,
        _ => None,
    }
}

/// A failed file operation: the host's fault (no space, I/O) or, for
/// everything else, the layer's (a file where a directory must be, a
/// dangling symlink as a parent, a hard link to a directory).
fn fs_error(what: &str, op: &str, path: &Path, e: pathrs::error::Error) -> ImageError {
    match errno(&e) {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EIO | libc::EROFS | libc::ENOMEM) => {
            ImageError::io(format!("{what}: {op} {path:?}"), io::Error::other(e))
        }
        _ => ImageError::invalid(what, format!("{op} {path:?}: {e}")),
    }
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// `io::copy`, telling a bad archive from a full disk.
fn copy(from: &mut impl Read, to: &mut impl Write) -> std::result::Result<u64, CopyError> {
    let mut buf = vec![0u8; 128 * 1024];
    let mut total = 0;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        to.write_all(&buf[..n]).map_err(CopyError::Write)?;
        total += n as u64;
    }
}

#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;
