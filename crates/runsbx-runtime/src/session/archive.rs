//! A session as one tar file (`session export`, `session import`): its
//! settings, its workspace and its layer over the image, with the owners
//! the sandbox sees (container ids), so that it can be imported on
//! another host, as root or rootless.
//!
//! - `runsbx-session.json`: the settings (the first entry);
//! - `workspace/…`: the workspace;
//! - `layer/…`: the layer, in the OCI image layer's form: a deleted file
//!   is an empty `.wh.NAME`, a directory that hides the image's is marked
//!   by `.wh..wh..opq` (overlayfs's own forms are a 0:0 character device
//!   and an `overlay.opaque` attribute).
//!
//! Importing resolves every path inside the session's directories
//! (pathrs), so an archive cannot write anywhere else, and takes only
//! regular files, directories, links and whiteouts.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use pathrs::flags::OpenFlags;
use pathrs::{InodeType, Root};

use super::{NewSession, Session, Sessions, Settings, UPPER, WORKSPACE};
use crate::error::{Result, RuntimeError};
use crate::policy::Policy;
use crate::sys::{cgroupless, privilege};

const SETTINGS_ENTRY: &str = "runsbx-session.json";
const WORKSPACE_ENTRY: &str = "workspace";
const LAYER_ENTRY: &str = "layer";
const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// How a session's files' owners on disk become the container's ids, and
/// back: as root the workspace holds the session's host range, the layer
/// container ids (overlayfs writes it through an idmapped mount);
/// rootless both hold runsbx's own namespace's ids, which are the
/// container's.
#[derive(Clone, Copy)]
struct Ids {
    workspace_base: u32,
    size: u32,
}

impl Ids {
    fn of(session: &Session, config: Option<&Path>) -> Result<Self> {
        let policy = Policy::load(config)?;
        Ok(match session.id_range(&policy.config)? {
            Some(r) => Self {
                workspace_base: r.base,
                size: r.size,
            },
            None => Self {
                workspace_base: 0,
                size: u32::MAX,
            },
        })
    }

    /// The container id of a workspace file's owner on disk.
    fn to_container(self, id: u32) -> u32 {
        id.checked_sub(self.workspace_base)
            .filter(|i| *i < self.size)
            .unwrap_or(65534)
    }

    fn to_disk(self, id: u32) -> io::Result<u32> {
        if id >= self.size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("owner id {id} is outside the session's range"),
            ));
        }
        Ok(self.workspace_base + id)
    }
}

/// The xattr overlayfs marks an opaque directory with, in this mode.
fn opaque_xattr() -> &'static std::ffi::CStr {
    if privilege::rootless() {
        c"user.overlay.opaque"
    } else {
        c"trusted.overlay.opaque"
    }
}

impl Sessions {
    /// Writes session `name` to `out` as a tar file.
    pub fn export(&self, name: &str, out: &Path, config: Option<&Path>) -> Result<()> {
        let session = self.open_session(name)?;
        let ids = Ids::of(&session, config)?;
        cgroupless::private_mount_namespace()
            .map_err(|e| RuntimeError::sys("a private mount namespace for the export", e))?;
        let (_storage, base) = session.mount_disk(&session.dir.join(".export"))?;
        let ctx = |e: io::Error| RuntimeError::io(format!("export session `{name}` to {out:?}"), e);
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(out)
            .map_err(|e| {
                RuntimeError::invalid(
                    format!("export to {out:?}"),
                    format!("{e} (give a new file)"),
                )
            })?;
        let mut tar = tar::Builder::new(file);
        tar.follow_symlinks(false);
        let mut settings = session.settings.clone();
        settings.id_slot = None;
        settings.in_use = false;
        let json = serde_json::to_vec_pretty(&settings)
            .map_err(|e| RuntimeError::invalid("the session's settings", e.to_string()))?;
        let mut header = tar::Header::new_gnu();
        header.set_size(json.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, SETTINGS_ENTRY, &json[..])
            .map_err(ctx)?;
        let result = (|| {
            let ws = base.path.join(WORKSPACE);
            append_tree(
                &mut tar,
                &ws,
                Path::new(WORKSPACE_ENTRY),
                &|id| ids.to_container(id),
                false,
            )?;
            let upper = base.path.join(UPPER);
            append_tree(&mut tar, &upper, Path::new(LAYER_ENTRY), &|id| id, true)?;
            tar.finish()
        })();
        if let Err(e) = result {
            let _ = fs::remove_file(out);
            return Err(ctx(e));
        }
        Ok(())
    }

    /// Makes a session from a tar file `session export` wrote, named
    /// `name` or as it was; nothing of it is left when this fails.
    pub fn import(
        &self,
        file: &Path,
        name: Option<&str>,
        config: Option<&Path>,
    ) -> Result<Settings> {
        let bad =
            |reason: String| RuntimeError::invalid(format!("session archive {file:?}"), reason);
        let f = File::open(file).map_err(|e| bad(e.to_string()))?;
        let mut archive = tar::Archive::new(f);
        let mut entries = archive.entries().map_err(|e| bad(e.to_string()))?;
        let settings: Settings = match entries.next() {
            Some(Ok(mut e)) if e.path().is_ok_and(|p| p == Path::new(SETTINGS_ENTRY)) => {
                let mut text = String::new();
                e.by_ref()
                    .take(1 << 20)
                    .read_to_string(&mut text)
                    .map_err(|e| bad(e.to_string()))?;
                serde_json::from_str(&text).map_err(|e| bad(format!("{SETTINGS_ENTRY}: {e}")))?
            }
            _ => {
                return Err(bad(format!(
                    "it does not start with {SETTINGS_ENTRY} (not made by `runsbx session export`)"
                )))
            }
        };
        let made = self.create(&NewSession {
            name: Some(name.unwrap_or(&settings.name).to_owned()),
            image: Some(settings.image.clone()),
            disk: Some(settings.disk.limit_bytes),
            memory: settings.memory_bytes,
            pids: settings.pids,
            timeout: Some(std::time::Duration::from_millis(settings.timeout_ms)),
            egress: (!settings.allow_hosts.is_empty()).then(|| runsbx_policy::EgressPlan {
                allow: settings.allow_hosts.clone(),
                resolve: settings.proxy_resolve.clone(),
                allow_addresses: settings.proxy_allow_addresses.clone(),
                learn: None,
            }),
            profile: settings.profile.clone(),
            data_dir: self.data_dir.clone(),
            config: config.map(Path::to_path_buf),
        })?;
        let result = (|| {
            let session = self.open_session(&made.name)?;
            let ids = Ids::of(&session, config)?;
            cgroupless::private_mount_namespace()
                .map_err(|e| RuntimeError::sys("a private mount namespace for the import", e))?;
            let (_storage, base) = session.mount_disk(&session.dir.join(".import"))?;
            let open = |name: &str| -> Result<Root> {
                base.open(name)
                    .map(Root::from_fd)
                    .map_err(|e| RuntimeError::io(format!("open the session's {name}"), e))
            };
            let (workspace, layer) = (open(WORKSPACE)?, open(UPPER)?);
            // Modes exactly as archived.
            nix::sys::stat::umask(nix::sys::stat::Mode::empty());
            for entry in entries {
                let mut entry = entry.map_err(|e| bad(e.to_string()))?;
                let path = entry.path().map_err(|e| bad(e.to_string()))?.into_owned();
                let mut parts = path.components();
                let (root, is_layer, map): (&Root, bool, &dyn Fn(u32) -> io::Result<u32>) =
                    match parts.next() {
                        Some(Component::Normal(c)) if c == WORKSPACE_ENTRY => {
                            (&workspace, false, &|id| ids.to_disk(id))
                        }
                        Some(Component::Normal(c)) if c == LAYER_ENTRY => (&layer, true, &Ok),
                        _ => return Err(bad(format!("unexpected entry {path:?}"))),
                    };
                let rel = relative(parts.as_path())
                    .ok_or_else(|| bad(format!("entry {path:?} leaves its directory")))?;
                unpack(root, &rel, &mut entry, is_layer, map)
                    .map_err(|e| bad(format!("entry {path:?}: {e}")))?;
            }
            Ok(())
        })();
        match result {
            Ok(()) => {
                if made.image_created != settings.image_created {
                    tracing::warn!(
                        "session `{}` was exported from image `{}` as built at {}; here it is \
                         built at {}: its layer may not fit this image",
                        made.name,
                        made.image,
                        settings.image_created,
                        made.image_created
                    );
                }
                Ok(made)
            }
            Err(e) => {
                let _ = self.remove(&made.name);
                Err(e)
            }
        }
    }
}

/// `p` if it stays inside (only normal components), as `/`-rooted for
/// pathrs; `None` otherwise. The directory itself is `/`.
fn relative(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

/// Appends the tree at `dir` under `name`, owners through `map`; `layer`:
/// overlayfs's whiteouts and opaque directories in the OCI form.
fn append_tree(
    tar: &mut tar::Builder<File>,
    dir: &Path,
    name: &Path,
    map: &dyn Fn(u32) -> u32,
    layer: bool,
) -> io::Result<()> {
    let md = fs::symlink_metadata(dir)?;
    let mut header = header_of(&md, map);
    header.set_entry_type(tar::EntryType::Directory);
    tar.append_data(&mut header, name, io::empty())?;
    if layer && is_opaque(dir) {
        tar.append_data(&mut marker(), name.join(OPAQUE), io::empty())?;
    }
    let mut entries: Vec<_> = fs::read_dir(dir)?.collect::<io::Result<_>>()?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let child = name.join(entry.file_name());
        let md = fs::symlink_metadata(&path)?;
        let ft = md.file_type();
        let mut header = header_of(&md, map);
        if ft.is_dir() {
            append_tree(tar, &path, &child, map, layer)?;
        } else if ft.is_symlink() {
            header.set_entry_type(tar::EntryType::Symlink);
            tar.append_link(&mut header, &child, fs::read_link(&path)?)?;
        } else if ft.is_file() {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(md.len());
            tar.append_data(&mut header, &child, File::open(&path)?)?;
        } else if layer && is_whiteout(&md) {
            let mut name = std::ffi::OsString::from(WHITEOUT_PREFIX);
            name.push(entry.file_name());
            tar.append_data(&mut marker(), child.with_file_name(name), io::empty())?;
        }
        // Sockets, fifos and devices the sandbox made are not files to
        // carry over (it can make no device but a whiteout).
    }
    Ok(())
}

/// The header of an OCI whiteout or opaque marker: an empty file.
fn marker() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o600);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(0);
    h
}

fn header_of(md: &fs::Metadata, map: &dyn Fn(u32) -> u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_mode(md.mode() & 0o7777);
    h.set_uid(u64::from(map(md.uid())));
    h.set_gid(u64::from(map(md.gid())));
    h.set_mtime(md.mtime().max(0) as u64);
    h.set_size(0);
    h
}

fn is_whiteout(md: &fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    md.file_type().is_char_device() && md.rdev() == 0
}

fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut value = [0u8; 2];
    // SAFETY: C strings we own and a buffer of the length given.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            opaque_xattr().as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'y'
}

/// Writes one archive entry at `rel` inside `root`.
fn unpack(
    root: &Root,
    rel: &Path,
    entry: &mut tar::Entry<'_, File>,
    layer: bool,
    map: &dyn Fn(u32) -> io::Result<u32>,
) -> io::Result<()> {
    let other = |e: pathrs::error::Error| io::Error::other(e.to_string());
    let header = entry.header().clone();
    let mode = fs::Permissions::from_mode(header.mode()? & 0o7777);
    let (uid, gid) = (map(header.uid()? as u32)?, map(header.gid()? as u32)?);
    let name = rel
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_default();
    if layer && name == OPAQUE.as_bytes() {
        let dir = root
            .resolve(rel.parent().unwrap_or(Path::new("/")))
            .and_then(|h| h.reopen(OpenFlags::O_RDONLY | OpenFlags::O_DIRECTORY))
            .map_err(other)?;
        // SAFETY: a live fd, C strings we own, a one-byte value.
        let rc = unsafe {
            libc::fsetxattr(
                dir.as_raw_fd(),
                opaque_xattr().as_ptr(),
                c"y".as_ptr().cast(),
                1,
                0,
            )
        };
        return if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
    }
    if layer && name.starts_with(WHITEOUT_PREFIX.as_bytes()) {
        let hidden = CString::new(&name[WHITEOUT_PREFIX.len()..])?;
        let parent = root
            .resolve(rel.parent().unwrap_or(Path::new("/")))
            .map_err(other)?;
        // SAFETY: a live dirfd and a C string we own; a 0:0 character
        // device is overlayfs's whiteout, which needs no privilege.
        let rc = unsafe {
            libc::mknodat(
                parent.as_fd().as_raw_fd(),
                hidden.as_ptr(),
                libc::S_IFCHR,
                0,
            )
        };
        return if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        };
    }
    let handle = match header.entry_type() {
        tar::EntryType::Directory => {
            if root.resolve_nofollow(rel).is_err() {
                root.create(rel, &InodeType::Directory(mode.clone()))
                    .map_err(other)?;
            }
            root.resolve_nofollow(rel).map_err(other)?
        }
        tar::EntryType::Regular => {
            let mut file = root
                .create_file(
                    rel,
                    OpenFlags::O_WRONLY | OpenFlags::O_EXCL | OpenFlags::O_NOFOLLOW,
                    &mode,
                )
                .map_err(other)?;
            io::copy(entry, &mut file)?;
            root.resolve_nofollow(rel).map_err(other)?
        }
        tar::EntryType::Symlink => {
            let target = entry.link_name()?.ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "a link without a target")
            })?;
            root.create(rel, &InodeType::Symlink(target.into_owned()))
                .map_err(other)?;
            root.resolve_nofollow(rel).map_err(other)?
        }
        t => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{t:?} entries are not taken"),
            ))
        }
    };
    crate::sys::beneath::chown(handle.as_fd(), uid, gid)?;
    // After the owner (chown clears set-id bits), and on an existing
    // directory (the top one) too.
    if header.entry_type() != tar::EntryType::Symlink {
        handle
            .reopen(OpenFlags::O_RDONLY)
            .map_err(other)?
            .set_permissions(mode)?;
    }
    Ok(())
}
