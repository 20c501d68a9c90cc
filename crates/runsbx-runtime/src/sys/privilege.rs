//! Facts about the host that decide how a container can be built.
//!
//! One operation asks them a dozen times or more (a `run` asked whether it
//! is in a user namespace 17 times, each an open and two reads of
//! /proc/self/uid_map), and they change only when the process moves: into
//! another user namespace, or under a mount that hides the cgroup
//! hierarchies. So each is looked up once and kept, and the few places in
//! runsbx that move a process call [`moved`], which makes the next
//! question look again. Forked children inherit the answers with the
//! namespaces they describe.

use std::fs;
use std::sync::atomic::{AtomicU8, Ordering};

use nix::unistd::Uid;

/// Not looked up yet (or looked up before the process moved).
const UNKNOWN: u8 = 0;

static IN_USER_NAMESPACE: AtomicU8 = AtomicU8::new(UNKNOWN);
static CGROUP_LAYOUT: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Forgets the answers below: this process just entered another user
/// namespace, or mounted over the cgroup hierarchies.
pub fn moved() {
    IN_USER_NAMESPACE.store(UNKNOWN, Ordering::Relaxed);
    CGROUP_LAYOUT.store(UNKNOWN, Ordering::Relaxed);
}

/// The answer kept in `cell`, or `look_up`'s, then kept. Two threads asking
/// at once both look; they find the same.
fn kept(cell: &AtomicU8, look_up: impl FnOnce() -> u8) -> u8 {
    match cell.load(Ordering::Relaxed) {
        UNKNOWN => {
            let found = look_up();
            cell.store(found, Ordering::Relaxed);
            found
        }
        found => found,
    }
}

/// Whether runsbx runs without real root: an unprivileged user, or uid 0
/// inside a user namespace that does not map the whole range (rootless
/// podman runs its runtime that way).
pub fn rootless() -> bool {
    !Uid::effective().is_root() || in_user_namespace()
}

/// Whether this process is in a user namespace other than the initial one.
pub fn in_user_namespace() -> bool {
    const NO: u8 = 1;
    const YES: u8 = 2;
    let look_up = || match fs::read_to_string("/proc/self/uid_map") {
        // The initial namespace maps the full 32-bit range.
        Ok(map) if map.split_whitespace().eq(["0", "0", "4294967295"]) => NO,
        Ok(_) => YES,
        // Without /proc we cannot tell; assume the stricter case.
        Err(_) => YES,
    };
    kept(&IN_USER_NAMESPACE, look_up) == YES
}

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupLayout {
    V1,
    Hybrid,
    V2,
    None,
}

pub fn cgroup_layout() -> CgroupLayout {
    use libcgroups::common::{get_cgroup_setup, CgroupSetup};
    let look_up = || match get_cgroup_setup() {
        Ok(CgroupSetup::Legacy) => 1,
        Ok(CgroupSetup::Hybrid) => 2,
        Ok(CgroupSetup::Unified) => 3,
        Err(_) => 4,
    };
    match kept(&CGROUP_LAYOUT, look_up) {
        1 => CgroupLayout::V1,
        2 => CgroupLayout::Hybrid,
        3 => CgroupLayout::V2,
        _ => CgroupLayout::None,
    }
}

/// Whether this process can create cgroups for its containers. Real root
/// can on every layout; a rootless caller only on a cgroup v2 host where a
/// subtree has been delegated to it, which libcontainer 0.7 reaches only
/// through systemd (not used by runsbx), so: never.
pub fn can_manage_cgroups() -> bool {
    !rootless() && cgroup_layout() != CgroupLayout::None
}

/// Refuses rlimits the container could not be given: raising a hard limit
/// needs CAP_SYS_RESOURCE in the initial user namespace, which a rootless
/// runsbx, a container in a user namespace, or a host whose bounding set
/// lacks it (as on these CI machines) does not have. libcontainer would
/// fail inside the container's setup with a bare EPERM instead.
pub fn check_rlimits(spec: &libcontainer::oci_spec::runtime::Spec) -> crate::error::Result<()> {
    use caps::{CapSet, Capability};
    let Some(rlimits) = spec.process().as_ref().and_then(|p| p.rlimits().as_ref()) else {
        return Ok(());
    };
    let userns = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|nss| {
            nss.iter()
                .any(|ns| ns.typ() == libcontainer::oci_spec::runtime::LinuxNamespaceType::User)
        });
    let privileged = !rootless()
        && !userns
        && caps::has_cap(None, CapSet::Effective, Capability::CAP_SYS_RESOURCE).unwrap_or(false);
    if privileged {
        return Ok(());
    }
    for rl in rlimits {
        let name = serde_json::to_value(rl.typ())
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let Some(resource) = rlimit_resource(&name) else {
            continue;
        };
        let Ok((_, hard)) = nix::sys::resource::getrlimit(resource) else {
            continue;
        };
        if rl.hard() > hard || rl.soft() > rl.hard() {
            return Err(crate::error::RuntimeError::invalid(
                format!(
                    "process.rlimits {name} (soft {}, hard {})",
                    rl.soft(),
                    rl.hard()
                ),
                format!(
                    "exceeds this host's hard limit {hard}, and raising it needs \
                     CAP_SYS_RESOURCE, which runsbx does not have here; lower it \
                     (podman: `default_ulimits` in containers.conf, e.g. \
                     \"{}={hard}:{hard}\")",
                    name.trim_start_matches("RLIMIT_").to_ascii_lowercase()
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn rlimit_resource(name: &str) -> Option<nix::sys::resource::Resource> {
    use nix::sys::resource::Resource::*;
    Some(match name {
        "RLIMIT_AS" => RLIMIT_AS,
        "RLIMIT_CORE" => RLIMIT_CORE,
        "RLIMIT_CPU" => RLIMIT_CPU,
        "RLIMIT_DATA" => RLIMIT_DATA,
        "RLIMIT_FSIZE" => RLIMIT_FSIZE,
        "RLIMIT_LOCKS" => RLIMIT_LOCKS,
        "RLIMIT_MEMLOCK" => RLIMIT_MEMLOCK,
        "RLIMIT_MSGQUEUE" => RLIMIT_MSGQUEUE,
        "RLIMIT_NICE" => RLIMIT_NICE,
        "RLIMIT_NOFILE" => RLIMIT_NOFILE,
        "RLIMIT_NPROC" => RLIMIT_NPROC,
        "RLIMIT_RSS" => RLIMIT_RSS,
        "RLIMIT_RTPRIO" => RLIMIT_RTPRIO,
        "RLIMIT_RTTIME" => RLIMIT_RTTIME,
        "RLIMIT_SIGPENDING" => RLIMIT_SIGPENDING,
        "RLIMIT_STACK" => RLIMIT_STACK,
        _ => return None,
    })
}
