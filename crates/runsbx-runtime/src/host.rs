//! Facts about the host that decide how a container can be built.

use std::fs;

use nix::unistd::Uid;

/// Whether runsbx runs without real root: an unprivileged user, or uid 0
/// inside a user namespace that does not map the whole range (rootless
/// podman runs its runtime that way).
pub fn rootless() -> bool {
    !Uid::effective().is_root() || in_user_namespace()
}

/// Whether this process is in a user namespace other than the initial one.
pub fn in_user_namespace() -> bool {
    match fs::read_to_string("/proc/self/uid_map") {
        // The initial namespace maps the full 32-bit range.
        Ok(map) => !map.split_whitespace().eq(["0", "0", "4294967295"]),
        // Without /proc we cannot tell; assume the stricter case.
        Err(_) => true,
    }
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
    match get_cgroup_setup() {
        Ok(CgroupSetup::Legacy) => CgroupLayout::V1,
        Ok(CgroupSetup::Hybrid) => CgroupLayout::Hybrid,
        Ok(CgroupSetup::Unified) => CgroupLayout::V2,
        Err(_) => CgroupLayout::None,
    }
}

/// Whether this process can create cgroups for its containers. Real root
/// can on every layout; a rootless caller only on a cgroup v2 host where a
/// subtree has been delegated to it, which libcontainer 0.7 reaches only
/// through systemd (not used by runsbx), so: never.
pub fn can_manage_cgroups() -> bool {
    !rootless() && cgroup_layout() != CgroupLayout::None
}
