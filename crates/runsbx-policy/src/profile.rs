//! The profile: what a sandbox may have. Every field has a strict default,
//! so a missing field never widens anything (fail closed).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::PolicyError;

/// The profile compiled into runsbx, used when no operator config names
/// another: the checked-in `bundles/profiles/default.toml`, which
/// [`Profile::builtin`] builds without parsing it.
pub const DEFAULT_PROFILE_TOML: &str = include_str!("../../../bundles/profiles/default.toml");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    pub name: String,
    /// Capabilities a container may keep (names such as `CAP_NET_BIND_SERVICE`).
    pub capabilities: Vec<String>,
    /// Whether OCI hooks may run.
    pub hooks: bool,
    /// Whether a namespace may be joined by path.
    pub namespace_join: bool,
    /// As root, whether an engine's rootfs that cannot be shown with its
    /// files' real owners (a kernel without idmapped overlay layers by fd,
    /// before Linux 6.13) may be bound without id shifting instead of
    /// refused. The sandbox's ids stay unprivileged either way; its files
    /// then show as owned by nobody, and files only their owner may read
    /// stay unreadable.
    pub unshifted_rootfs: bool,
    /// Whether every rootfs is read-only, even an engine's container layer
    /// whose spec asks for a writable one (the stricter choice: `apt-get
    /// install`, image builds and writes outside /tmp then fail).
    pub readonly_rootfs: bool,
    /// Whether an engine's init (`podman run --init`'s catatonit, `docker
    /// run --init`'s tini) may be bound in: a single regular file owned by
    /// root that no one else may write, read-only, at the path the engine
    /// runs as the container's process.
    pub engine_init: bool,
    /// Whether an engine's named volumes may be bound in, writable as the
    /// engine asks: a directory `<storage>/volumes/<name>/_data` of the
    /// engine storage that holds the container's own rootfs, which no other
    /// user may enter. Never `suid` or `dev`.
    pub engine_volumes: bool,
    /// Destinations at which a host bind mount is allowed (read-only).
    pub bind_mounts: Vec<PathBuf>,
    pub proc: ProcMode,
    /// Destination → size cap, for each writable tmpfs.
    pub tmpfs: BTreeMap<PathBuf, Size>,
    pub limits: Limits,
    /// Egress through runsbx's proxy; nothing when its allowlist is empty.
    pub egress: Egress,
}

/// What a container may reach through the egress proxy (see
/// crates/runsbx-proxy): allowlist entries (`name`, `name:port`,
/// `*.suffix[:port]`), resolver overrides, and destinations the operator
/// exempts from the proxy's refusal of loopback/private addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Egress {
    pub allow: Vec<String>,
    pub resolve: BTreeMap<String, String>,
    pub allow_addresses: Vec<String>,
    /// Learn mode for engines' containers: an absolute directory where
    /// each container's record of the requests its proxy let through is
    /// written as `<id>.json` when it ends, for `runsbx profile suggest`.
    /// It allows nothing more. None by default.
    pub learn: Option<PathBuf>,
}

impl Default for Profile {
    fn default() -> Self {
        Self {
            name: "unnamed".to_owned(),
            capabilities: Vec::new(),
            hooks: false,
            namespace_join: false,
            unshifted_rootfs: false,
            readonly_rootfs: false,
            engine_init: false,
            engine_volumes: false,
            bind_mounts: Vec::new(),
            proc: ProcMode::Minimal,
            tmpfs: BTreeMap::new(),
            limits: Limits::default(),
            egress: Egress::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcMode {
    /// procfs with `subset=pid`: the sandbox's processes and nothing global.
    Minimal,
    /// All of procfs, with containerd's masked and read-only paths.
    Full,
}

/// Limits; a missing one takes the strict default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub nofile: u64,
    pub nproc: u64,
    pub fsize: Size,
    pub cpu_seconds: u64,
    pub core: Size,
    pub memory: Size,
    pub pids: i64,
    /// CPU time per second of wall time, in thousandths of a CPU (cgroup
    /// cpu quota over a 100 ms period).
    pub cpu_millis: u64,
    /// Wall-clock deadline, counted from create: when it passes, the
    /// runtime kills the whole sandbox. None by default, the one limit
    /// without a finite default: an engine's container may be a long-lived
    /// service (a pod's), and `runsbx call` brings its own (`--timeout`).
    /// A `runsbx.timeout` annotation may only shorten it.
    pub timeout: Option<Timeout>,
}

/// A duration, written as `30s`, `500ms`, `2m`, `1h` or a number of seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "TimeoutRepr", into = "String")]
pub struct Timeout(pub std::time::Duration);

#[derive(Deserialize)]
#[serde(untagged)]
enum TimeoutRepr {
    Seconds(u64),
    Text(String),
}

impl TryFrom<TimeoutRepr> for Timeout {
    type Error = String;
    fn try_from(r: TimeoutRepr) -> Result<Self, String> {
        match r {
            TimeoutRepr::Seconds(n) => parse_duration(&n.to_string())
                .map(Timeout)
                .map_err(|e| format!("{n} {e}")),
            TimeoutRepr::Text(t) => parse_duration(&t)
                .map(Timeout)
                .map_err(|e| format!("{t:?} {e}")),
        }
    }
}

impl From<Timeout> for String {
    fn from(t: Timeout) -> String {
        format!("{}ms", t.0.as_millis())
    }
}

/// The longest duration runsbx takes: a week.
const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// Parses `30s`, `500ms`, `2m`, `1h`, or a number of seconds (`1.5`):
/// positive, at most a week.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || {
        "is not a duration (use a positive number with ms, s, m or h, at most a week: 30s, \
         500ms, 2m)"
            .to_owned()
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    if !secs.is_finite() || secs <= 0.0 || secs > MAX_DURATION.as_secs_f64() {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            nofile: 256,
            nproc: 128,
            fsize: Size(64 << 20),
            cpu_seconds: 60,
            core: Size(0),
            memory: Size(256 << 20),
            pids: 64,
            cpu_millis: 500,
            timeout: None,
        }
    }
}

impl Limits {
    /// Each limit the lower of the two.
    pub fn min(self, other: Limits) -> Limits {
        Limits {
            nofile: self.nofile.min(other.nofile),
            nproc: self.nproc.min(other.nproc),
            fsize: Size(self.fsize.0.min(other.fsize.0)),
            cpu_seconds: self.cpu_seconds.min(other.cpu_seconds),
            core: Size(self.core.0.min(other.core.0)),
            memory: Size(self.memory.0.min(other.memory.0)),
            pids: self.pids.min(other.pids),
            cpu_millis: self.cpu_millis.min(other.cpu_millis),
            // None is no deadline: the other's, if it has one.
            timeout: match (self.timeout, other.timeout) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

/// A size in bytes, written as a number or with a K, M or G suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "SizeRepr", into = "u64")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Self, String> {
        match r {
            SizeRepr::Bytes(n) => Ok(Size(n)),
            SizeRepr::Text(t) => parse_size(&t).map(Size),
        }
    }
}

impl From<Size> for u64 {
    fn from(s: Size) -> u64 {
        s.0
    }
}

/// As a person would write it: the largest of G, M and K that divides it
/// exactly, or bytes (`10M`, `1536K`, `1000`); [`parse_size`] reads it back.
impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = [(30, 'G'), (20, 'M'), (10, 'K')]
            .into_iter()
            .find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1 << shift));
        match unit {
            Some((shift, suffix)) => write!(f, "{}{suffix}", self.0 >> shift),
            None => write!(f, "{}", self.0),
        }
    }
}

/// Parses `512`, `64K`, `64M`, `1G` (powers of 1024).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{text:?} is not a size (use bytes, or a number with K, M or G)"))
}

/// The lowest memory limit a sandbox is given. The kernel refuses a limit
/// below what the cgroup already holds, and a sandbox's own processes hold
/// 0.4-0.6 MiB when libcontainer sets it (measured on cgroup v1), before
/// any command runs: a lower limit fails every create with libcontainer's
/// message. 4 MiB leaves that room several times over and still runs a
/// static program; `python3 -c pass` needs about 4 MiB.
pub const MIN_MEMORY: u64 = 4 << 20;

/// Why `bytes` cannot be a sandbox's memory limit, if it cannot.
pub fn check_memory(bytes: u64) -> Result<(), String> {
    if bytes >= MIN_MEMORY {
        return Ok(());
    }
    Err(format!(
        "{bytes} bytes is below {MIN_MEMORY} (4M), the least memory a sandbox is given: its \
         own processes hold about 0.5M before its command starts"
    ))
}

/// [`check_memory`] of an option a person typed: the refusal says how to
/// write it.
pub fn check_memory_option(bytes: u64) -> Result<(), String> {
    check_memory(bytes).map_err(|e| {
        format!("{e}; give at least 4M (a number without K, M or G is bytes: 512M, 2G)")
    })
}

impl Profile {
    /// Parses a profile; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let profile: Self = toml::from_str(text).map_err(|e| PolicyError::Profile {
            origin: origin.to_owned(),
            reason: e.to_string(),
        })?;
        // The cgroup takes 0 or less as no limit at all, which a profile
        // cannot ask for.
        if profile.limits.pids < 1 {
            return Err(PolicyError::Profile {
                origin: origin.to_owned(),
                reason: format!(
                    "limits.pids = {}: a sandbox's pids limit is at least 1 (it cannot be \
                     turned off); give the most processes its sandboxes may have",
                    profile.limits.pids
                ),
            });
        }
        Ok(profile)
    }

    /// The built-in default profile: `bundles/profiles/default.toml`,
    /// written out here rather than parsed from that text, since every
    /// call and `run` of a default sandbox starts from it and the parse
    /// (the TOML parser's code paged in first) took about 0.1 ms of each.
    /// A test holds the two equal.
    pub fn builtin() -> Result<Self, PolicyError> {
        let tmpfs = [
            ("/tmp", 64 << 20),
            ("/workspace", 256 << 20),
            ("/dev/shm", 64 << 20),
        ];
        Ok(Self {
            name: "default".to_owned(),
            capabilities: Vec::new(),
            hooks: false,
            namespace_join: false,
            unshifted_rootfs: false,
            readonly_rootfs: false,
            engine_init: true,
            engine_volumes: true,
            bind_mounts: Vec::new(),
            proc: ProcMode::Minimal,
            tmpfs: tmpfs
                .into_iter()
                .map(|(dest, size)| (PathBuf::from(dest), Size(size)))
                .collect(),
            limits: Limits {
                nofile: 1024,
                nproc: 512,
                fsize: Size(1 << 30),
                cpu_seconds: 600,
                core: Size(0),
                memory: Size(512 << 20),
                pids: 256,
                cpu_millis: 1000,
                timeout: None,
            },
            egress: Egress::default(),
        })
    }

    /// Whether `self` allows nothing `other` does not (so an annotation may
    /// pick it in place of `other`).
    pub fn at_least_as_strict_as(&self, other: &Profile) -> bool {
        let caps = self
            .capabilities
            .iter()
            .all(|c| other.capabilities.contains(c));
        let binds = self
            .bind_mounts
            .iter()
            .all(|b| other.bind_mounts.contains(b));
        let tmpfs = self
            .tmpfs
            .iter()
            .all(|(dest, size)| other.tmpfs.get(dest).is_some_and(|o| size <= o));
        let proc = self.proc == ProcMode::Minimal || other.proc == ProcMode::Full;
        let egress = self
            .egress
            .allow
            .iter()
            .all(|a| other.egress.allow.contains(a))
            && self
                .egress
                .allow_addresses
                .iter()
                .all(|a| other.egress.allow_addresses.contains(a))
            && self
                .egress
                .resolve
                .iter()
                .all(|(k, v)| other.egress.resolve.get(k) == Some(v));
        caps && binds
            && egress
            && tmpfs
            && proc
            && (!self.hooks || other.hooks)
            && (!self.namespace_join || other.namespace_join)
            && (!self.unshifted_rootfs || other.unshifted_rootfs)
            && (self.readonly_rootfs || !other.readonly_rootfs)
            && (!self.engine_init || other.engine_init)
            && (!self.engine_volumes || other.engine_volumes)
            && self.limits.min(other.limits) == self.limits
    }
}

/// The operator's config (`/etc/runsbx/config.toml`): which profile applies
/// and which ones annotations may choose among.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperatorConfig {
    /// The profile every container gets: a name in `profiles_dir`, or
    /// `default` for the built-in one.
    pub profile: String,
    /// Where named profiles live, as `<name>.toml`.
    pub profiles_dir: PathBuf,
    /// Profiles a `runsbx.profile` annotation may pick (each must be at least
    /// as strict as `profile`).
    pub selectable: Vec<String>,
    /// As root, each sandbox's users map to a range of `uid_range_size`
    /// host ids from `uid_base` up, one range per live sandbox.
    pub uid_base: u32,
    pub uid_range_size: u32,
    pub uid_ranges: u32,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        Self {
            profile: "default".to_owned(),
            profiles_dir: PathBuf::from("/etc/runsbx/profiles"),
            selectable: Vec::new(),
            uid_base: 1_000_000_000,
            uid_range_size: 65_536,
            uid_ranges: 4_096,
        }
    }
}

impl OperatorConfig {
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, PolicyError> {
        let config: Self = toml::from_str(text).map_err(|e| PolicyError::Profile {
            origin: origin.to_owned(),
            reason: e.to_string(),
        })?;
        // The ranges must stay clear of host root and fit in 32 bits.
        let end = u64::from(config.uid_base)
            + u64::from(config.uid_range_size) * u64::from(config.uid_ranges);
        if config.uid_base == 0 || config.uid_range_size == 0 || end > u64::from(u32::MAX) {
            return Err(PolicyError::Profile {
                origin: origin.to_owned(),
                reason: "uid_base must be > 0 and uid_base + uid_range_size * uid_ranges must fit in 32 bits".to_owned(),
            });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999999G").is_err());
        for (bytes, text) in [(10 << 20, "10M"), (1536 << 10, "1536K"), (3 << 30, "3G")] {
            assert_eq!(Size(bytes).to_string(), text);
            assert_eq!(parse_size(text), Ok(bytes));
        }
        assert_eq!(Size(1000).to_string(), "1000");
        assert_eq!(Size(0).to_string(), "0");
    }

    #[test]
    fn builtin_profile_is_the_checked_in_default() -> Result<(), PolicyError> {
        assert_eq!(
            Profile::builtin()?,
            Profile::from_toml(DEFAULT_PROFILE_TOML, "bundles/profiles/default.toml")?,
            "Profile::builtin and bundles/profiles/default.toml differ: change both"
        );
        Ok(())
    }

    #[test]
    fn builtin_profile_parses_and_is_strict() -> Result<(), PolicyError> {
        let p = Profile::builtin()?;
        assert_eq!(p.name, "default");
        assert!(p.capabilities.is_empty());
        assert!(!p.hooks && !p.namespace_join && p.bind_mounts.is_empty());
        assert_eq!(p.proc, ProcMode::Minimal);
        assert_eq!(p.tmpfs.get(&PathBuf::from("/tmp")), Some(&Size(64 << 20)));
        assert_eq!(p.limits.core, Size(0));
        Ok(())
    }

    #[test]
    fn missing_fields_are_strict() -> Result<(), PolicyError> {
        let p = Profile::from_toml("name = \"x\"", "test")?;
        assert!(p.capabilities.is_empty() && !p.hooks && p.bind_mounts.is_empty());
        assert!(p.tmpfs.is_empty());
        assert_eq!(p.limits, Limits::default());
        Ok(())
    }

    #[test]
    fn a_pids_limit_cannot_be_turned_off() {
        for pids in ["0", "-1"] {
            let text = format!("name = \"x\"\n[limits]\npids = {pids}");
            let err = match Profile::from_toml(&text, "test") {
                Err(e) => e.to_string(),
                Ok(p) => format!("accepted: {:?}", p.limits),
            };
            assert!(
                err.contains("limits.pids") && err.contains("at least 1"),
                "{err}"
            );
        }
        assert_eq!(
            Profile::from_toml("name = \"x\"\n[limits]\npids = 1", "test").map(|p| p.limits.pids),
            Ok(1)
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = Profile::from_toml("name = \"x\"\nallow_everything = true", "test");
        assert!(matches!(err, Err(PolicyError::Profile { .. })));
    }

    #[test]
    fn strictness_order() -> Result<(), PolicyError> {
        let default = Profile::builtin()?;
        let offline = Profile::from_toml(
            include_str!("../../../bundles/profiles/offline.toml"),
            "offline",
        )?;
        assert!(offline.at_least_as_strict_as(&default));
        assert!(!default.at_least_as_strict_as(&offline));
        let mut wider = default.clone();
        wider.capabilities.push("CAP_SYS_ADMIN".to_owned());
        assert!(!wider.at_least_as_strict_as(&default));
        Ok(())
    }
}
