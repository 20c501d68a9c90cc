//! Sessions: what persists across an agent's tool calls.
//!
//! A session is a directory of runsbx's data directory
//! (`sessions/<name>/`, 0700) holding its settings (`session.json`), a lock
//! file, and its storage: the writable layer over its image (`upper/`,
//! with overlayfs's `work/`) and its `workspace/`. Every call into it is a
//! fresh sandbox (new processes, network, /tmp) whose rootfs is the
//! image under that layer and whose /workspace is the session's
//! (`storage.rs`); calls are serialised by the lock.
//!
//! As root the storage is an ext4 filesystem in `disk.img`, of the size
//! `--disk` gives, mounted per call in the call's private mount namespace:
//! a full disk is ENOSPC inside, never on the host. The session also keeps
//! one host id range for its whole life (its files keep their owners, and
//! no other sandbox gets those ids). Rootless, runsbx cannot mount a
//! filesystem image: the storage is plain directories and the bound is
//! reported as not enforced.

mod archive;
mod storage;

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::call::CallRequest;
use crate::error::{Result, RuntimeError};
use crate::policy::Policy;
use crate::state::ids;
use crate::sys::{loopdev, privilege};
use runsbx_image::ImageStore;
use runsbx_policy::profile::{Size, Timeout};
use runsbx_policy::IdRange;

pub use storage::Storage;

/// The schema of a session's JSON (`session create --json`, `session ls`).
pub const SCHEMA: &str = "runsbx.session/v1";

const SETTINGS: &str = "session.json";
const LOCK: &str = "lock";
const DISK: &str = "disk.img";
/// Rootless: the directory holding the storage.
const FS_DIR: &str = "fs";
const UPPER: &str = "upper";
const WORK: &str = "work";
const WORKSPACE: &str = "workspace";
/// The longest session name.
const MAX_NAME_LEN: usize = 64;
/// The disk of a session made without `--disk`: sparse, so it costs the
/// host only what is written.
pub const DEFAULT_DISK: u64 = 1 << 30;
/// The smallest disk: ext4's own structures need a few MiB.
const MIN_DISK: u64 = 16 << 20;

/// A session's settings: the defaults its calls may only tighten.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub schema: String,
    pub name: String,
    pub image: String,
    /// When the image was built: a replaced image is refused, since the
    /// session's layer was written over the old one.
    pub image_created: DateTime<Utc>,
    pub created: DateTime<Utc>,
    pub disk: DiskBound,
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    pub timeout_ms: u64,
    pub allow_hosts: Vec<String>,
    #[serde(default)]
    pub proxy_resolve: BTreeMap<String, Vec<IpAddr>>,
    #[serde(default)]
    pub proxy_allow_addresses: Vec<SocketAddr>,
    pub profile: Option<String>,
    /// As root, the slot of the host id range the session keeps.
    pub id_slot: Option<u32>,
    /// Whether a call holds the session now (`session ls`).
    #[serde(default, skip_deserializing)]
    pub in_use: bool,
}

/// The bound on a session's storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskBound {
    pub limit_bytes: u64,
    pub enforced: bool,
    /// Why it is not, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What `session create` is asked.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub name: Option<String>,
    pub image: Option<String>,
    pub disk: Option<u64>,
    pub memory: Option<u64>,
    pub pids: Option<u64>,
    /// `None`: a call's default deadline, or the profile's if shorter.
    pub timeout: Option<Duration>,
    pub egress: Option<runsbx_policy::EgressPlan>,
    pub profile: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
}

/// The sessions of one data directory.
#[derive(Debug)]
pub struct Sessions {
    dir: PathBuf,
    data_dir: Option<PathBuf>,
}

impl Sessions {
    /// The sessions under `data_dir` (default: the image store's data
    /// directory). Nothing is created until a session is.
    pub fn open(data_dir: Option<&Path>) -> Result<Self> {
        let store = ImageStore::open(data_dir, privilege::rootless())?;
        Ok(Self {
            dir: store.data_dir().join("sessions"),
            data_dir: data_dir.map(Path::to_path_buf),
        })
    }

    /// Makes a session; nothing of it is left when this fails.
    pub fn create(&self, new: &NewSession) -> Result<Settings> {
        let name = match &new.name {
            Some(n) => {
                validate_name(n)?;
                n.clone()
            }
            None => generated_name(),
        };
        let image_name = new.image.as_deref().unwrap_or(runsbx_image::DEFAULT_IMAGE);
        let image = ImageStore::open(self.data_dir.as_deref(), privilege::rootless())?
            .resolve(image_name)?;
        let limit = new.disk.unwrap_or(DEFAULT_DISK);
        if limit < MIN_DISK {
            return Err(RuntimeError::invalid(
                format!("--disk {}", Size(limit)),
                format!(
                    "is too small: a session's disk needs at least {}M",
                    MIN_DISK >> 20
                ),
            ));
        }
        if let Some(bytes) = new.memory {
            runsbx_policy::profile::check_memory_option(bytes)
                .map_err(|e| RuntimeError::invalid("--memory", e))?;
        }
        if let Some(egress) = &new.egress {
            runsbx_proxy::Allowlist::parse(&egress.allow)
                .map_err(|e| RuntimeError::invalid("--allow-host or --allow", e.to_string()))?;
        }
        let policy = Policy::load(new.config.as_deref())?;
        // The profile must exist (and be selectable) now, not at the first call.
        let profile = policy.profile_named(new.profile.as_deref())?;
        check_within_profile(new, &profile)?;
        let timeout = new.timeout.unwrap_or(match profile.limits.timeout {
            Some(Timeout(max)) => max.min(CallRequest::DEFAULT_TIMEOUT),
            None => CallRequest::DEFAULT_TIMEOUT,
        });

        make_private_dir(&self.dir)?;
        let dir = self.dir.join(&name);
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(RuntimeError::Conflict {
                    what: format!("session `{name}`"),
                    reason: "exists already (`runsbx session rm` it, or pick another name)"
                        .to_owned(),
                })
            }
            Err(e) => return Err(RuntimeError::io(format!("create {dir:?}"), e)),
        }
        let mut made = Made {
            dir: dir.clone(),
            slot: None,
            done: false,
        };
        let egress = new.egress.clone().unwrap_or_default();
        let mut settings = Settings {
            schema: SCHEMA.to_owned(),
            name: name.clone(),
            image: image.name.clone(),
            image_created: image.created,
            created: Utc::now(),
            disk: DiskBound {
                limit_bytes: limit,
                enforced: false,
                reason: None,
            },
            memory_bytes: new.memory,
            pids: new.pids,
            timeout_ms: timeout.as_millis() as u64,
            allow_hosts: egress.allow,
            proxy_resolve: egress.resolve,
            proxy_allow_addresses: egress.allow_addresses,
            profile: new.profile.clone(),
            id_slot: None,
            in_use: false,
        };
        File::create(dir.join(LOCK))
            .map_err(|e| RuntimeError::io("create the session's lock", e))?;
        if privilege::rootless() {
            let fs_dir = dir.join(FS_DIR);
            // The layer's top directory is the rootfs's `/`: 0755, as an
            // image's; `fs/` closes it to others.
            for (d, mode) in [
                (fs_dir.clone(), 0o700),
                (fs_dir.join(UPPER), 0o755),
                (fs_dir.join(WORK), 0o700),
                (fs_dir.join(WORKSPACE), 0o700),
            ] {
                fs::DirBuilder::new()
                    .mode(mode)
                    .create(&d)
                    .map_err(|e| RuntimeError::io(format!("create {d:?}"), e))?;
                fs::set_permissions(&d, fs::Permissions::from_mode(mode))
                    .map_err(|e| RuntimeError::io(format!("chmod {d:?}"), e))?;
            }
            settings.disk.reason = Some(
                "rootless: runsbx cannot mount a filesystem image without root, so the \
                 session's files are bounded only by the free space of the host"
                    .to_owned(),
            );
        } else {
            let (slot, range) = ids::allocate_id_range(&policy.config, &owner(&dir))?;
            made.slot = Some(slot);
            settings.id_slot = Some(slot);
            make_disk(&dir, limit, range)?;
            settings.disk.enforced = true;
        }
        write_settings(&dir, &settings)?;
        made.done = true;
        Ok(settings)
    }

    /// Every session, with whether a call holds it now.
    pub fn list(&self) -> Result<Vec<Settings>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RuntimeError::io(format!("read {:?}", self.dir), e)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let dir = entry.path();
            // A session being made has no settings yet.
            let Ok(mut settings) = read_settings(&dir) else {
                continue;
            };
            settings.in_use = lock(&dir, false).is_err();
            out.push(settings);
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Opens session `name` for a call: waits until no other call holds
    /// it, and holds it until the returned value is dropped.
    pub fn open_session(&self, name: &str) -> Result<Session> {
        validate_name(name)?;
        let dir = self.session_dir(name)?;
        let lock = lock(&dir, true)?;
        let settings = read_settings(&dir)?;
        Ok(Session {
            settings,
            dir,
            _lock: lock,
        })
    }

    /// Removes session `name`: refused while a call holds it.
    pub fn remove(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let dir = self.session_dir(name)?;
        let in_use = || RuntimeError::Conflict {
            what: format!("session `{name}`"),
            reason: "is in use by a call; remove it once the call has ended".to_owned(),
        };
        let _lock = lock(&dir, false).map_err(|_| in_use())?;
        if !privilege::rootless() && !loopdev::attached_to(&dir.join(DISK)).is_empty() {
            return Err(in_use());
        }
        let slot = read_settings(&dir).ok().and_then(|s| s.id_slot);
        // std's remove_dir_all never follows a symlink out of the tree.
        fs::remove_dir_all(&dir).map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))?;
        if let Some(slot) = slot {
            ids::release_id_range_of(slot, &owner(&dir));
        }
        Ok(())
    }

    /// The directory of an existing session: a real directory, not a link
    /// someone put in its place.
    fn session_dir(&self, name: &str) -> Result<PathBuf> {
        let dir = self.dir.join(name);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() && m.uid() == nix::unistd::Uid::effective().as_raw() => Ok(dir),
            Ok(_) => Err(RuntimeError::invalid(
                format!("session `{name}` ({dir:?})"),
                "is not a directory runsbx made (a link or another user's); remove it",
            )),
            Err(_) => Err(RuntimeError::SessionNotFound {
                name: name.to_owned(),
                dir: self.dir.clone(),
            }),
        }
    }
}

/// A session held by one call.
#[derive(Debug)]
pub struct Session {
    pub settings: Settings,
    dir: PathBuf,
    _lock: File,
}

impl Session {
    /// As root, the host id range the session keeps, checked against the
    /// slot file that reserves it.
    pub fn id_range(&self, config: &runsbx_policy::OperatorConfig) -> Result<Option<IdRange>> {
        let Some(slot) = self.settings.id_slot else {
            return Ok(None);
        };
        ids::range_of(config, slot, &owner(&self.dir)).map(Some)
    }

    pub fn name(&self) -> &str {
        &self.settings.name
    }
}

/// Removes a half-made session when creating it fails.
struct Made {
    dir: PathBuf,
    slot: Option<u32>,
    done: bool,
}

impl Drop for Made {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(slot) = self.slot {
            ids::release_id_range_of(slot, &owner(&self.dir));
        }
    }
}

/// Who an id slot belongs to: the session, by its directory.
fn owner(dir: &Path) -> String {
    format!("session:{}", dir.display())
}

/// A session's limits are its calls' defaults, and no call gets more than
/// its profile's (a call's own may only lower them): a higher one would be
/// recorded and shown by `session ls` but never applied, so it is refused
/// where it is given.
fn check_within_profile(new: &NewSession, profile: &runsbx_policy::Profile) -> Result<()> {
    let limits = &profile.limits;
    let more = |option: String, most: String, key: &str| {
        RuntimeError::invalid(
            option,
            format!(
                "is more than the {most} profile `{}` allows, which is all its calls would \
                 get: give at most that (an operator raises `{key}` in the profile)",
                profile.name
            ),
        )
    };
    if let Some(bytes) = new.memory.filter(|b| *b > limits.memory.0) {
        return Err(more(
            format!("--memory {}", Size(bytes)),
            limits.memory.to_string(),
            "[limits] memory",
        ));
    }
    if let Some(pids) = new
        .pids
        .filter(|p| i64::try_from(*p).map_or(true, |p| p > limits.pids))
    {
        return Err(more(
            format!("--pids {pids}"),
            limits.pids.to_string(),
            "[limits] pids",
        ));
    }
    let longer = |timeout: &Duration| limits.timeout.filter(|Timeout(max)| timeout > max);
    if let Some((timeout, Timeout(max))) = new.timeout.and_then(|t| Some((t, longer(&t)?))) {
        return Err(more(
            format!("--timeout {}ms", timeout.as_millis()),
            format!("{}ms", max.as_millis()),
            "[limits] timeout",
        ));
    }
    Ok(())
}

pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::invalid(
            format!("session name {name:?}"),
            format!(
                "use 1-{MAX_NAME_LEN} characters from [A-Za-z0-9_.-], starting with a letter or digit"
            ),
        ))
    }
}

/// `s-` and 12 random hex digits.
fn generated_name() -> String {
    let mut bytes = [0u8; 6];
    let _ = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("s-{hex}")
}

/// The directory of all sessions: created 0700, and refused when it is
/// open to others (a session's files are the caller's alone).
fn make_private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| RuntimeError::io(format!("create {dir:?}"), e))?;
    let md = fs::symlink_metadata(dir).map_err(|e| RuntimeError::io(format!("stat {dir:?}"), e))?;
    if !md.is_dir() || md.uid() != nix::unistd::Uid::effective().as_raw() || md.mode() & 0o077 != 0
    {
        return Err(RuntimeError::invalid(
            format!("the sessions directory {dir:?}"),
            "must be a directory of yours that only you can enter (chmod 0700 it)",
        ));
    }
    Ok(())
}

/// The session's disk: a sparse file of `limit` bytes holding an ext4
/// filesystem whose root only root may enter, with the layer (owned by
/// container root as overlayfs's idmapped upper layer stores it: 0) and
/// the workspace (owned by the session's range, bound as it is).
fn make_disk(dir: &Path, limit: u64, range: IdRange) -> Result<()> {
    let skel = dir.join("skel");
    let ctx = |what: &str| format!("make the session's disk: {what}");
    for (d, mode) in [
        (&skel, 0o700),
        (&skel.join(UPPER), 0o755),
        (&skel.join(WORK), 0o700),
    ] {
        fs::DirBuilder::new()
            .mode(mode)
            .create(d)
            .map_err(|e| RuntimeError::io(ctx(&format!("create {d:?}")), e))?;
        fs::set_permissions(d, fs::Permissions::from_mode(mode))
            .map_err(|e| RuntimeError::io(ctx(&format!("chmod {d:?}")), e))?;
    }
    let ws = skel.join(WORKSPACE);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&ws)
        .map_err(|e| RuntimeError::io(ctx("create the workspace"), e))?;
    std::os::unix::fs::chown(&ws, Some(range.base), Some(range.base))
        .map_err(|e| RuntimeError::io(ctx("chown the workspace"), e))?;
    let image = dir.join(DISK);
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&image)
        .map_err(|e| RuntimeError::io(ctx(&format!("create {image:?}")), e))?;
    file.set_len(limit)
        .map_err(|e| RuntimeError::io(ctx(&format!("size {image:?}")), e))?;
    drop(file);
    let mkfs = find_mkfs().ok_or_else(|| {
        RuntimeError::unsupported(
            "make the session's disk",
            "mkfs.ext4 is not installed (apt-get install e2fsprogs)",
        )
    })?;
    // No blocks reserved for root: the whole disk is the session's.
    let out = Command::new(&mkfs)
        .args(["-q", "-F", "-m", "0", "-L", "runsbx-session", "-d"])
        .arg(&skel)
        .arg(&image)
        .output()
        .map_err(|e| RuntimeError::io(ctx(&format!("run {mkfs:?}")), e))?;
    let _ = fs::remove_dir_all(&skel);
    if !out.status.success() {
        return Err(RuntimeError::unsupported(
            ctx(&format!("{mkfs:?} {image:?}")),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

fn find_mkfs() -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join("mkfs.ext4"))
        .find(|p| p.is_file())
}

/// Takes the session's lock: waiting for it, or failing at once when
/// another call holds it.
fn lock(dir: &Path, wait: bool) -> Result<File> {
    let path = dir.join(LOCK);
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(|e| RuntimeError::io(format!("open the session's lock {path:?}"), e))?;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on an fd we own.
        let rc = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), op) };
        if rc == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(RuntimeError::io(format!("lock {path:?}"), e));
        }
    }
}

fn read_settings(dir: &Path) -> Result<Settings> {
    let path = dir.join(SETTINGS);
    let mut text = String::new();
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|f| f.take(1 << 20).read_to_string(&mut text))
        .map_err(|e| RuntimeError::io(format!("read {path:?}"), e))?;
    serde_json::from_str(&text).map_err(|e| {
        RuntimeError::invalid(format!("the session's settings {path:?}"), e.to_string())
    })
}

/// Written whole or not at all: a new file renamed over the old.
fn write_settings(dir: &Path, settings: &Settings) -> Result<()> {
    let path = dir.join(SETTINGS);
    let tmp = dir.join(format!(".{SETTINGS}.new"));
    let json = serde_json::to_vec_pretty(settings)
        .map_err(|e| RuntimeError::invalid("the session's settings", e.to_string()))?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| RuntimeError::io(format!("create {tmp:?}"), e))?;
    f.write_all(&json)
        .and_then(|()| f.sync_all())
        .map_err(|e| RuntimeError::io(format!("write {tmp:?}"), e))?;
    fs::rename(&tmp, &path).map_err(|e| RuntimeError::io(format!("rename to {path:?}"), e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "s-0123456789ab", "my.session_1", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "-a", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        let g = generated_name();
        assert!(validate_name(&g).is_ok() && g.len() == 14, "{g}");
    }
}
