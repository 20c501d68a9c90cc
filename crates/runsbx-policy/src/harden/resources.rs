//! cgroup limits: memory and pids at or below the profile's, and a device
//! cgroup that denies every device but the defaults. Applied where the
//! host lets runsbx manage cgroups; the attestation says when not.

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxPids};

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    let limits = cx.overrides.limits(cx.profile.limits)?;
    let memory_max = i64::try_from(limits.memory.0).unwrap_or(i64::MAX);
    let linux = cx.linux();
    let before = linux.resources().clone();
    let mut resources = before.clone().unwrap_or_default();

    let mut memory = (*resources.memory()).unwrap_or_default();
    let spec_limit = memory.limit().filter(|l| *l > 0);
    let limit = spec_limit.map_or(memory_max, |l| l.min(memory_max));
    // Refused here rather than left to fail in libcontainer, with the
    // setting that asked for it named.
    if let Err(reason) = crate::profile::check_memory(u64::try_from(limit).unwrap_or(0)) {
        let field = if spec_limit == Some(limit) {
            "linux.resources.memory.limit".to_owned()
        } else if cx.overrides.memory.is_some() {
            // A call's --memory is refused where it is parsed, with its
            // flag: what reaches here is an annotation's.
            "runsbx.limits.memory".to_owned()
        } else {
            format!("limits.memory of profile `{}`", cx.profile.name)
        };
        return Err(PolicyError::Invalid { field, reason });
    }
    memory.set_limit(Some(limit));
    // A process past the limit is killed, not left hanging: the OOM killer
    // stays on (libcontainer 0.7 would not apply this field either).
    let oom_killer_off = memory.disable_oom_killer() == Some(true);
    if oom_killer_off {
        memory.set_disable_oom_killer(Some(false));
    }
    resources.set_memory(Some(memory));

    // CPU: a quota of cpu_millis per 100 ms period, or the spec's share
    // when it is lower.
    const PERIOD: u64 = 100_000;
    let max_quota = i64::try_from(limits.cpu_millis.saturating_mul(PERIOD) / 1000)
        .unwrap_or(i64::MAX)
        .max(1000);
    let mut cpu = resources.cpu().clone().unwrap_or_default();
    let spec_quota = match (cpu.quota(), cpu.period()) {
        (Some(q), Some(p)) if q > 0 && p > 0 => {
            Some(i128::from(q) * i128::from(PERIOD) / i128::from(p))
        }
        _ => None,
    };
    let quota = spec_quota.map_or(max_quota, |q| {
        i64::try_from(q).unwrap_or(i64::MAX).clamp(1000, max_quota)
    });
    cpu.set_quota(Some(quota)).set_period(Some(PERIOD));
    resources.set_cpu(Some(cpu));

    let current = resources
        .pids()
        .as_ref()
        .map(|p| p.limit())
        .filter(|l| *l > 0);
    let mut pids = LinuxPids::default();
    pids.set_limit(current.map_or(limits.pids, |l| l.min(limits.pids)));
    resources.set_pids(Some(pids));

    // Devices: every device denied, whatever the spec allowed. The runtime
    // then allows the default set after this rule (libcontainer's
    // cgroup managers always add it: null, zero, full, random, urandom,
    // tty, console, ptmx and the pts, plus mknod, which a user namespace
    // refuses anyway), the only nodes a sandbox's /dev holds (extra
    // linux.devices are removed, see reject.rs). Without a deny rule a new
    // v1 devices cgroup keeps its parent's `a *:* rwm`: a device node that
    // reached the sandbox some other way could be opened.
    let deny_all = vec![deny_every_device()];
    let devices_tightened = resources.devices().as_ref() != Some(&deny_all);
    resources.set_devices(Some(deny_all));

    if oom_killer_off {
        cx.change(
            "linux.resources.memory.disableOOMKiller",
            "the OOM killer stays on: a process past the memory limit is killed",
        );
    }
    if devices_tightened {
        cx.change(
            "linux.resources.devices",
            "every device denied but the default ones (null, zero, full, random, urandom, tty, ptmx, pts)",
        );
    }
    let linux = cx.linux();
    if before.as_ref() != Some(&resources) {
        linux.set_resources(Some(resources));
        cx.change(
            "linux.resources",
            format!(
                "memory limit {limit} bytes, pids limit {}, cpu quota {quota}us per {PERIOD}us, or lower",
                limits.pids
            ),
        );
    }
    let detail = if cx.host.cgroups {
        format!(
            "memory {limit} bytes, pids {}, cpu {quota}us per {PERIOD}us, devices: the defaults only",
            limits.pids
        )
    } else {
        "not applied: runsbx cannot manage cgroups here (rootless on cgroup v1); rlimits only"
            .to_owned()
    };
    cx.attest("cgroup_limits", cx.host.cgroups, detail);
    Ok(())
}

/// The device cgroup rule that denies read, write and mknod of every
/// device.
fn deny_every_device() -> LinuxDeviceCgroup {
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(false);
    rule.set_typ(None);
    rule.set_major(None);
    rule.set_minor(None);
    rule.set_access(Some("rwm".to_owned()));
    rule
}
