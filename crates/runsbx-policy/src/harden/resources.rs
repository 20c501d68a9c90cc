//! cgroup limits: memory and pids at or below the profile's. Applied where
//! the host lets runsbx manage cgroups; the attestation says when not.

use oci_spec::runtime::LinuxPids;

use super::Cx;
use crate::annotations;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    let limits = annotations::requested_limits(cx.spec.annotations().as_ref(), cx.profile.limits)?;
    let memory_max = i64::try_from(limits.memory.0).unwrap_or(i64::MAX);
    let linux = cx.linux();
    let before = linux.resources().clone();
    let mut resources = before.clone().unwrap_or_default();

    let mut memory = (*resources.memory()).unwrap_or_default();
    let limit = memory
        .limit()
        .filter(|l| *l > 0)
        .map_or(memory_max, |l| l.min(memory_max));
    memory.set_limit(Some(limit));
    resources.set_memory(Some(memory));

    let current = resources
        .pids()
        .as_ref()
        .map(|p| p.limit())
        .filter(|l| *l > 0);
    let mut pids = LinuxPids::default();
    pids.set_limit(current.map_or(limits.pids, |l| l.min(limits.pids)));
    resources.set_pids(Some(pids));

    if before.as_ref() != Some(&resources) {
        linux.set_resources(Some(resources));
        cx.change(
            "linux.resources",
            format!(
                "memory limit {} bytes, pids limit {}, or lower",
                limit, limits.pids
            ),
        );
    }
    let detail = if cx.host.cgroups {
        format!("memory {limit} bytes, pids {}", limits.pids)
    } else {
        "not applied: runsbx cannot manage cgroups here (rootless on cgroup v1); rlimits only"
            .to_owned()
    };
    cx.attest("cgroup_limits", cx.host.cgroups, detail);
    Ok(())
}
