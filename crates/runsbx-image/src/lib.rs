//! The local image store: one root filesystem per image name, under
//! runsbx's data directory. A sandbox mounts it read-only.
//!
//! ```text
//! <data>/images/<name>/rootfs/        the tree a sandbox runs on
//! <data>/images/<name>/image.json     name, source, created, size, config
//! <data>/images/.lock                 flock held by import, build and rm
//! <data>/images/.tmp-<name>-<pid>     an import or build in progress
//! ```
//!
//! An image appears whole or not at all: it is made in a `.tmp-` directory
//! and renamed into place; a failed import or build removes its `.tmp-`
//! directory, and one left by a killed runsbx is swept by the next import,
//! build or rm.

mod archive;
mod build;
pub mod error;
mod layer;
pub mod mountinfo;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use nix::fcntl::{Flock, FlockArg, RenameFlags};
use nix::unistd::Uid;
use serde::{Deserialize, Serialize};

pub use build::BuildOptions;
pub use error::{ImageError, Result};

/// The image `runsbx call` runs on when none is named.
pub const DEFAULT_IMAGE: &str = "python";

/// The data directory of real root, and the store every user may read.
pub const SYSTEM_DATA_DIR: &str = "/var/lib/runsbx";

const MAX_NAME_LEN: usize = 64;
const LOCK_FILE: &str = ".lock";
const TMP_PREFIX: &str = ".tmp-";
const IMAGE_JSON: &str = "image.json";

/// An image ready to run: its root filesystem and how to start it.
#[derive(Debug, Clone)]
pub struct Image {
    pub name: String,
    pub rootfs: PathBuf,
    pub config: ImageConfig,
    /// When it was built or imported: a session made on it checks that it
    /// is still the same image.
    pub created: DateTime<Utc>,
    /// A shared lock on the image for as long as this value (or a clone)
    /// lives: `image rm` refuses to delete an image a call runs on.
    _in_use: std::sync::Arc<fs::File>,
}

/// flock(2) on the image's image.json: shared while a call runs on it,
/// exclusive while `image rm` deletes it. Released when the file closes.
fn flock_image(path: &Path, op: libc::c_int) -> Option<fs::File> {
    let file = fs::File::open(path.join(IMAGE_JSON)).ok()?;
    // SAFETY: flock on a valid fd we own.
    let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), op | libc::LOCK_NB) };
    (rc == 0).then_some(file)
}

/// What the image's own config says about its process (the OCI / docker
/// image config's `Env`, `Entrypoint`, `Cmd`, `WorkingDir`, `User`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
}

/// One image of `runsbx image ls`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageInfo {
    pub name: String,
    /// Bytes of regular files in the rootfs, each hard-linked file once.
    pub size: u64,
    pub created: DateTime<Utc>,
    /// Where it came from: `debootstrap bookworm <mirror>`,
    /// `docker-archive <file>`, `oci-archive <file>`.
    pub source: String,
    /// The image's directory (its rootfs is `rootfs/` in it).
    pub path: PathBuf,
}

/// `<image>/image.json`.
#[derive(Debug, Serialize, Deserialize)]
struct ImageJson {
    name: String,
    source: String,
    created: DateTime<Utc>,
    size: u64,
    config: ImageConfig,
}

/// The image directories of one data directory, and the system store an
/// unprivileged user may also run images from.
#[derive(Debug, Clone)]
pub struct ImageStore {
    images: PathBuf,
    system: Option<PathBuf>,
    /// Whether the caller is unprivileged (not real root): decides the
    /// default data directory, whether files may be given their owners,
    /// and whether an image can be built.
    rootless: bool,
}

impl ImageStore {
    /// The store under `data_dir`, else `$RUNSBX_DATA_DIR`, else the
    /// default: /var/lib/runsbx for root, `$XDG_DATA_HOME/runsbx` or
    /// `~/.local/share/runsbx` for everyone else. Nothing is created until
    /// an image is imported or built.
    pub fn open(data_dir: Option<&Path>, rootless: bool) -> Result<Self> {
        let from_env = std::env::var_os("RUNSBX_DATA_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let (data, default) = match data_dir.map(Path::to_path_buf).or(from_env) {
            Some(dir) => (dir, false),
            None => (default_data_dir(rootless)?, true),
        };
        let data = std::path::absolute(&data)
            .map_err(|e| ImageError::io(format!("data directory {data:?}"), e))?;
        let images = data.join("images");
        let system_images = Path::new(SYSTEM_DATA_DIR).join("images");
        // An unprivileged user runs the images root built (`sudo runsbx
        // image build python`) without a copy of their own.
        let system = (default && images != system_images).then_some(system_images);
        Ok(Self {
            images,
            system,
            rootless,
        })
    }

    /// The data directory: where the images directory is, and sessions.
    pub fn data_dir(&self) -> &Path {
        self.images.parent().unwrap_or(&self.images)
    }

    /// The directory this store keeps its images in.
    pub fn dir(&self) -> &Path {
        &self.images
    }

    /// The image `name`: from this store, or else from the system store.
    pub fn resolve(&self, name: &str) -> Result<Image> {
        validate_name(name)?;
        for dir in self.search_dirs() {
            let path = dir.join(name);
            if fs::symlink_metadata(&path).is_err() {
                continue;
            }
            check_store_dir(dir)?;
            let json = read_image_json(&path)?;
            let rootfs = path.join("rootfs");
            if !fs::symlink_metadata(&rootfs).is_ok_and(|m| m.is_dir()) {
                return Err(ImageError::invalid(
                    format!("image `{name}` ({path:?})"),
                    "it has no rootfs directory; remove it with `runsbx image rm` and \
                     import or build it again",
                ));
            }
            // Held by the call for its life; refused only while `image rm`
            // deletes the image.
            let in_use = flock_image(&path, libc::LOCK_SH).ok_or_else(|| ImageError::InUse {
                name: name.to_owned(),
            })?;
            return Ok(Image {
                name: name.to_owned(),
                rootfs,
                config: json.config,
                created: json.created,
                _in_use: std::sync::Arc::new(in_use),
            });
        }
        Err(ImageError::NotFound {
            name: name.to_owned(),
            searched: self.search_dirs().map(Path::to_path_buf).collect(),
        })
    }

    /// Every image this store can run, by name; an image of this store
    /// hides one of the same name in the system store.
    pub fn list(&self) -> Result<Vec<ImageInfo>> {
        let mut infos: Vec<ImageInfo> = Vec::new();
        for dir in self.search_dirs() {
            let entries = match fs::read_dir(dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ImageError::io(format!("read image store {dir:?}"), e)),
            };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if validate_name(&name).is_err() || infos.iter().any(|i| i.name == name) {
                    continue;
                }
                match read_image_json(&entry.path()) {
                    Ok(json) => infos.push(ImageInfo {
                        name,
                        size: json.size,
                        created: json.created,
                        source: json.source,
                        path: entry.path(),
                    }),
                    Err(e) => tracing::warn!("skipping image `{name}`: {e}"),
                }
            }
        }
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(infos)
    }

    /// Removes image `name` from this store.
    pub fn remove(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let path = self.images.join(name);
        // No store yet: nothing to remove, and nothing to create for it.
        let _lock = if self.images.is_dir() {
            Some(self.lock()?)
        } else {
            None
        };
        if fs::symlink_metadata(&path).is_err() {
            if let Some(system) = self.system.as_ref().filter(|s| s.join(name).exists()) {
                return Err(ImageError::invalid(
                    format!("remove image `{name}`"),
                    format!(
                        "it is in the system store {system:?}, not in yours {:?}; \
                         remove it as root: `sudo runsbx image rm {name}`",
                        self.images
                    ),
                ));
            }
            return Err(ImageError::NotFound {
                name: name.to_owned(),
                searched: vec![self.images.clone()],
            });
        }
        // Exclusive until the image is gone: no call starts on it meanwhile.
        let _deleting = match fs::symlink_metadata(path.join(IMAGE_JSON)) {
            Ok(_) => Some(
                flock_image(&path, libc::LOCK_EX).ok_or_else(|| ImageError::InUse {
                    name: name.to_owned(),
                })?,
            ),
            Err(_) => None,
        };
        sweep_stale(&self.images);
        // Out of its name first, so that no one resolves a half-deleted image.
        let doomed = self.images.join(tmp_name(name));
        remove_tree(&doomed)?;
        fs::rename(&path, &doomed)
            .map_err(|e| ImageError::io(format!("remove image `{name}` ({path:?})"), e))?;
        remove_tree(&doomed)
    }

    /// Imports a docker-archive or oci-archive (`podman save`, `docker
    /// save`) as image `name` (default: the name the archive carries).
    /// An existing image of that name is kept unless `replace`.
    pub fn import(&self, archive: &Path, name: Option<&str>, replace: bool) -> Result<ImageInfo> {
        if let Some(name) = name {
            validate_name(name)?;
        }
        // Read and check the archive before touching the store.
        let opened =
            archive::Archive::open(archive, || self.prepare().map(|()| self.images.clone()))?;
        let name = match name {
            Some(name) => name.to_owned(),
            None => opened.default_name()?,
        };
        self.prepare()?;
        let _lock = self.lock()?;
        sweep_stale(&self.images);
        self.refuse_existing(&name, replace)?;
        let staging = Staging::create(&self.images, &name)?;
        let config = opened.unpack(&staging.rootfs(), self.rootless)?;
        staging.commit(opened.source(), config, replace)
    }

    /// Builds the image of a recipe (only `python`: Debian with python3, by
    /// debootstrap; needs root).
    pub fn build(&self, recipe: &str, opts: &BuildOptions) -> Result<ImageInfo> {
        validate_name(recipe)?;
        let plan = build::plan(recipe, opts, self.rootless)?;
        self.prepare()?;
        let _lock = self.lock()?;
        sweep_stale(&self.images);
        self.refuse_existing(recipe, opts.replace)?;
        let staging = Staging::create(&self.images, recipe)?;
        let config = build::run(&plan, &staging.rootfs())?;
        staging.commit(plan.source(), config, opts.replace)
    }

    /// This store's directory, then the system store's.
    fn search_dirs(&self) -> impl Iterator<Item = &Path> {
        std::iter::once(self.images.as_path()).chain(self.system.as_deref())
    }

    /// Creates the store's directories (0755) and checks they are ours.
    fn prepare(&self) -> Result<()> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&self.images)
            .map_err(|e| {
                ImageError::io(
                    format!(
                        "create image store {:?} (pass a writable --data-dir)",
                        self.images
                    ),
                    e,
                )
            })?;
        let meta = fs::symlink_metadata(&self.images)
            .map_err(|e| ImageError::io(format!("image store {:?}", self.images), e))?;
        if meta.uid() != Uid::effective().as_raw() {
            return Err(ImageError::invalid(
                format!("image store {:?}", self.images),
                format!(
                    "it is owned by uid {}, not by us (uid {}); pass --data-dir",
                    meta.uid(),
                    Uid::effective()
                ),
            ));
        }
        check_store_dir(&self.images)
    }

    /// Takes the store's lock, waiting for any other import, build or rm.
    /// A `flock`: nothing in these commands forks a process that keeps
    /// the fd (std opens it close-on-exec).
    fn lock(&self) -> Result<Flock<File>> {
        let path = self.images.join(LOCK_FILE);
        let ctx = || format!("lock image store ({path:?})");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| ImageError::io(ctx(), e))?;
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| ImageError::sys(ctx(), e))
    }

    fn refuse_existing(&self, name: &str, replace: bool) -> Result<()> {
        let path = self.images.join(name);
        if !replace && fs::symlink_metadata(&path).is_ok() {
            return Err(ImageError::Exists {
                name: name.to_owned(),
                path,
            });
        }
        Ok(())
    }
}

/// Checks an image name: it becomes a directory name and a CLI argument.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || (i > 0 && matches!(b, b'.' | b'_' | b'-'))
        });
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(MAX_NAME_LEN + 8).collect();
    Err(ImageError::invalid(
        format!("image name {shown:?}"),
        format!(
            "use 1-{MAX_NAME_LEN} characters from [a-z0-9._-], starting with a letter or digit"
        ),
    ))
}

/// The default data directory of the caller.
pub fn default_data_dir(rootless: bool) -> Result<PathBuf> {
    if !rootless {
        return Ok(PathBuf::from(SYSTEM_DATA_DIR));
    }
    let env_dir = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    if let Some(xdg) = env_dir("XDG_DATA_HOME") {
        return Ok(xdg.join("runsbx"));
    }
    let home = env_dir("HOME").or_else(|| {
        nix::unistd::User::from_uid(Uid::effective())
            .ok()
            .flatten()
            .map(|u| u.dir)
    });
    match home {
        Some(home) => Ok(home.join(".local/share/runsbx")),
        None => Err(ImageError::invalid(
            "image store",
            "no $XDG_DATA_HOME, $HOME or home directory to keep images in; pass --data-dir",
        )),
    }
}

/// Refuses a store others could have planted images in.
fn check_store_dir(dir: &Path) -> Result<()> {
    let meta =
        fs::symlink_metadata(dir).map_err(|e| ImageError::io(format!("image store {dir:?}"), e))?;
    if !meta.is_dir() {
        return Err(ImageError::invalid(
            format!("image store {dir:?}"),
            "it is not a directory",
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(ImageError::invalid(
            format!("image store {dir:?}"),
            format!(
                "it is writable by others (mode {:o}); chmod go-w it",
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

fn read_image_json(image_dir: &Path) -> Result<ImageJson> {
    let path = image_dir.join(IMAGE_JSON);
    let broken = |reason: String| {
        ImageError::invalid(
            format!("image {image_dir:?}"),
            format!("{reason}; remove it with `runsbx image rm` and import or build it again"),
        )
    };
    let text = fs::read_to_string(&path).map_err(|e| broken(format!("read {IMAGE_JSON}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| broken(format!("{IMAGE_JSON}: {e}")))
}

fn tmp_name(name: &str) -> String {
    format!("{TMP_PREFIX}{name}-{}", std::process::id())
}

/// Removes the `.tmp-` directories of runsbx processes that died before
/// they could (killed during an import or build). Called under the lock,
/// so no live import is writing there; the pid check guards a store whose
/// lock another machine's runsbx cannot see (a shared filesystem).
fn sweep_stale(images: &Path) {
    let Ok(entries) = fs::read_dir(images) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TMP_PREFIX)) else {
            continue;
        };
        let pid = rest.rsplit('-').next().and_then(|p| p.parse::<i32>().ok());
        let dead = pid.is_some_and(|pid| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) == Err(nix::Error::ESRCH)
        });
        if dead {
            tracing::info!("removing {:?}, left by a runsbx that died", entry.path());
            if let Err(e) = remove_tree(&entry.path()) {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// Removes a directory tree that is no one else's: first whatever is still
/// mounted in it (debootstrap mounts /proc and /sys in its target, and a
/// killed debootstrap leaves them), then the files, making directories
/// writable when a rootless caller cannot otherwise delete from them.
pub(crate) fn remove_tree(path: &Path) -> Result<()> {
    crate::mountinfo::unmount_under(path)?;
    let ctx = || format!("remove {path:?}");
    match fs::remove_dir_all(path) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() != io::ErrorKind::PermissionDenied => {
            return Err(ImageError::io(ctx(), e))
        }
        Err(_) => {}
    }
    make_dirs_writable(path);
    fs::remove_dir_all(path).map_err(|e| ImageError::io(ctx(), e))
}

fn make_dirs_writable(dir: &Path) {
    let Ok(meta) = fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        make_dirs_writable(&entry.path());
    }
}

/// An image being made in `.tmp-<name>-<pid>`: removed when dropped,
/// unless committed into place.
struct Staging {
    images: PathBuf,
    name: String,
    dir: PathBuf,
    committed: bool,
}

impl Staging {
    fn create(images: &Path, name: &str) -> Result<Self> {
        let dir = images.join(tmp_name(name));
        // Our own pid: anything there is from an earlier process that had it.
        remove_tree(&dir)?;
        let staging = Self {
            images: images.to_path_buf(),
            name: name.to_owned(),
            dir,
            committed: false,
        };
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&staging.dir)
            .map_err(|e| ImageError::io(format!("create {:?}", staging.dir), e))?;
        fs::DirBuilder::new()
            .mode(0o755)
            .create(staging.rootfs())
            .map_err(|e| ImageError::io(format!("create {:?}", staging.rootfs()), e))?;
        Ok(staging)
    }

    fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// Writes image.json and renames the image into place: with `replace`,
    /// exchanged with the old one in one step (RENAME_EXCHANGE), so that
    /// the name never points at nothing or at a half-made tree.
    fn commit(mut self, source: String, config: ImageConfig, replace: bool) -> Result<ImageInfo> {
        let rootfs = self.rootfs();
        // The staging directory's mode is umask-dependent; the rootfs is
        // the container's `/`.
        fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
            .map_err(|e| ImageError::io(format!("chmod {rootfs:?}"), e))?;
        make_mount_points(&rootfs)?;
        let json = ImageJson {
            name: self.name.clone(),
            source,
            created: Utc::now(),
            size: tree_size(&rootfs),
            config,
        };
        let text = serde_json::to_vec_pretty(&json)
            .map_err(|e| ImageError::invalid("image.json", e.to_string()))?;
        let json_path = self.dir.join(IMAGE_JSON);
        fs::write(&json_path, text)
            .map_err(|e| ImageError::io(format!("write {json_path:?}"), e))?;

        let dest = self.images.join(&self.name);
        // The image replaced is deleted afterwards: not while a call runs on it.
        let in_use = || ImageError::InUse {
            name: self.name.clone(),
        };
        let _replacing = if replace && fs::symlink_metadata(dest.join(IMAGE_JSON)).is_ok() {
            Some(flock_image(&dest, libc::LOCK_EX).ok_or_else(in_use)?)
        } else {
            None
        };
        let flags = if replace && fs::symlink_metadata(&dest).is_ok() {
            RenameFlags::RENAME_EXCHANGE
        } else {
            RenameFlags::RENAME_NOREPLACE
        };
        nix::fcntl::renameat2(None, &self.dir, None, &dest, flags).map_err(|e| match e {
            nix::Error::EEXIST => ImageError::Exists {
                name: self.name.clone(),
                path: dest.clone(),
            },
            e => ImageError::sys(format!("rename {:?} to {dest:?}", self.dir), e),
        })?;
        if flags == RenameFlags::RENAME_NOREPLACE {
            self.committed = true;
        } else {
            // The staging name now holds the old image; Drop removes it.
            progress(&format!("replaced the old image `{}`", self.name));
        }
        Ok(ImageInfo {
            name: json.name,
            size: json.size,
            created: json.created,
            source: json.source,
            path: dest,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            if let Err(e) = remove_tree(&self.dir) {
                tracing::warn!("{e:#}");
            }
        }
    }
}

/// Bytes of the regular files under `root`, each inode once.
fn tree_size(root: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                total += meta.len();
            }
        }
    }
    total
}

/// A progress line on stderr: imports and builds take seconds to minutes.
fn progress(msg: &str) {
    eprintln!("runsbx: {msg}");
}

#[cfg(test)]
mod tests;

/// Where a sandbox mounts its own filesystems. The image is read-only and,
/// for an unprivileged caller, owned by someone else: the mount points must
/// exist before any sandbox runs on it. Made inside the root (a symlink in
/// the image cannot send them elsewhere).
const MOUNT_POINTS: &[&str] = &["/proc", "/dev", "/sys", "/tmp", "/workspace"];

fn make_mount_points(rootfs: &Path) -> Result<()> {
    let root = pathrs::Root::open(rootfs)
        .map_err(|e| ImageError::invalid(format!("open the rootfs {rootfs:?}"), e.to_string()))?;
    for dir in MOUNT_POINTS {
        if root.resolve(dir).is_ok() {
            continue;
        }
        root.mkdir_all(dir, &fs::Permissions::from_mode(0o755))
            .map_err(|e| {
                ImageError::invalid(format!("create {dir} in the image"), e.to_string())
            })?;
    }
    Ok(())
}
