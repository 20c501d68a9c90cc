//! cgroup limits: memory (swap included) and pids at or below the
//! profile's, and a device cgroup that denies every device but the
//! defaults. Applied where the host lets runsbx manage cgroups; the
//! attestation says when not. [`bound_update`] holds an update to the
//! same limits.

use oci_spec::runtime::{LinuxDeviceCgroup, LinuxPids, LinuxResources};

use super::Cx;
use crate::profile::Limits;
use crate::PolicyError;

/// The CPU quota's period, in microseconds.
pub(crate) const PERIOD: u64 = 100_000;

/// The most CPU time per [`PERIOD`] `limits` give: `cpu_millis`
/// thousandths of a CPU, and never below 1 ms (the kernel's least quota).
pub(crate) fn max_quota(limits: &Limits) -> i64 {
    i64::try_from(limits.cpu_millis.saturating_mul(PERIOD) / 1000)
        .unwrap_or(i64::MAX)
        .max(1000)
}

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
    // Swap counts against the limit: memory and swap together at most
    // `limit` (the spec's `swap` is that total). Without it a sandbox on a
    // host with swap pages out past its limit instead of being stopped at
    // it. An engine's larger total (podman's `--memory-swap`, twice the
    // memory by default) is cut to the limit; a kernel that keeps no swap
    // accounts has no such setting, and the attestation says so. (Where
    // runsbx manages no cgroups, no limit is applied at all.)
    let swap = cx.host.swap_limit.then_some(limit);
    let swap_changed = cx.host.cgroups && memory.swap().is_some() && memory.swap() != swap;
    if cx.host.cgroups {
        memory.set_swap(swap);
    }
    // A process past the limit is killed, not left hanging: the OOM killer
    // stays on (libcontainer 0.7 would not apply this field either).
    let oom_killer_off = memory.disable_oom_killer() == Some(true);
    if oom_killer_off {
        memory.set_disable_oom_killer(Some(false));
    }
    resources.set_memory(Some(memory));

    // CPU: a quota of cpu_millis per 100 ms period, or the spec's share
    // when it is lower.
    let max_quota = max_quota(&limits);
    let mut cpu = resources.cpu().clone().unwrap_or_default();
    // No real-time CPU time (an update cannot give any either): the
    // sandbox has no CAP_SYS_NICE to use it, and a budget taken from the
    // parent's is one the host's own real-time tasks lose.
    let realtime = cpu.realtime_runtime().is_some() || cpu.realtime_period().is_some();
    cpu.set_realtime_runtime(None).set_realtime_period(None);
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

    // Raw cgroup v2 files: on a v2 host the runtime writes them after the
    // limits above, so `memory.max: max` or `pids.max: max` would undo
    // them. A sandbox's limits are the ones named here.
    let unified = resources.unified().as_ref().is_some_and(|u| !u.is_empty());
    resources.set_unified(None);

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

    if swap_changed {
        cx.change(
            "linux.resources.memory.swap",
            match swap {
                Some(total) => format!("memory and swap together at most {total} bytes"),
                None => "left out: this kernel keeps no swap accounts".to_owned(),
            },
        );
    }
    if realtime {
        cx.change(
            "linux.resources.cpu.realtimeRuntime",
            "left out: a sandbox gets no real-time CPU time",
        );
    }
    if unified {
        cx.change(
            "linux.resources.unified",
            "left out: raw cgroup v2 files would undo the limits; a sandbox's limits are memory, swap, pids and CPU by name",
        );
    }
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
        let swap = match swap {
            Some(_) => "swap included",
            None => "swap not limited: the kernel keeps no swap accounts",
        };
        format!(
            "memory {limit} bytes ({swap}), pids {}, cpu {quota}us per {PERIOD}us, devices: the defaults only",
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
pub(crate) fn deny_every_device() -> LinuxDeviceCgroup {
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(false);
    rule.set_typ(None);
    rule.set_major(None);
    rule.set_minor(None);
    rule.set_access(Some("rwm".to_owned()));
    rule
}

/// The cgroup resources an update (`runsbx update`, which engines run for
/// `docker update` and the like) asks for, held to the same limits as the
/// sandbox's create: `ceiling` (its profile's, lowered by its
/// annotations). A limit may be lowered, or raised back up to the
/// ceiling, never past it or to unlimited; swap counts in the memory limit
/// as it does at create. What the create's policy decides alone (the
/// device rules, the OOM killer, real-time CPU time, raw cgroup v2 files)
/// is refused, naming the field.
pub fn bound_update(
    mut requested: LinuxResources,
    ceiling: &crate::profile::Limits,
    profile: &str,
    host: &crate::HostFacts,
) -> Result<LinuxResources, PolicyError> {
    let refuse = |field: &str, reason: String| PolicyError::Invalid {
        field: format!("linux.resources.{field}"),
        reason,
    };
    // Past the limit the create held the sandbox to: the profile's key
    // that sets it is named (an update may lower a limit, or raise it
    // back up to that).
    let past = |field: &str, asked: String, max: String, key: &str| PolicyError::Refused {
        what: format!("linux.resources.{field} {asked} (past the sandbox's {max})"),
        profile: profile.to_owned(),
        key: key.to_owned(),
    };
    // How a refused value reads: below 0 (for pids, 0 too) is no limit.
    let shown = |unlimited: bool, value: String| {
        if unlimited {
            "unlimited".to_owned()
        } else {
            value
        }
    };
    if requested.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(refuse(
            "devices",
            "a sandbox's device rules are its policy's (every device denied but the defaults)"
                .to_owned(),
        ));
    }
    if requested.unified().as_ref().is_some_and(|u| !u.is_empty()) {
        return Err(refuse(
            "unified",
            "raw cgroup files are not updated: give the limits by name".to_owned(),
        ));
    }
    if let Some(mut memory) = *requested.memory() {
        let max = i64::try_from(ceiling.memory.0).unwrap_or(i64::MAX);
        if memory.disable_oom_killer() == Some(true) {
            return Err(refuse(
                "memory.disableOOMKiller",
                "the OOM killer stays on: a process past the memory limit is killed".to_owned(),
            ));
        }
        if memory.kernel().is_some() || memory.kernel_tcp().is_some() {
            return Err(refuse(
                "memory.kernel",
                "kernel memory is counted in the memory limit, not limited apart".to_owned(),
            ));
        }
        // 0 leaves the limit as it is, as runc's update takes it (and
        // libcontainer's v1 manager; its v2 one would write 0): left out.
        match memory.limit().filter(|l| *l != 0) {
            Some(limit) if limit < 0 || limit > max => {
                return Err(past(
                    "memory.limit",
                    shown(limit < 0, format!("{limit} bytes")),
                    format!("memory limit of {max} bytes"),
                    "limits.memory",
                ));
            }
            Some(limit) => {
                let bytes = u64::try_from(limit).unwrap_or(0);
                crate::profile::check_memory(bytes).map_err(|r| refuse("memory.limit", r))?;
                memory.set_swap(host.swap_limit.then_some(limit));
            }
            // A swap total alone is refused: it stays what the limit made
            // it.
            None if memory.swap().is_some_and(|swap| swap != 0) => {
                return Err(refuse(
                    "memory.swap",
                    "swap counts in the memory limit: give the memory limit instead".to_owned(),
                ))
            }
            None => {
                memory.set_limit(None).set_swap(None);
            }
        }
        if let Some(reservation) = memory.reservation().filter(|r| *r > max) {
            return Err(past(
                "memory.reservation",
                format!("{reservation} bytes"),
                format!("memory limit of {max} bytes"),
                "limits.memory",
            ));
        }
        requested.set_memory(Some(memory));
    }
    if let Some(pids) = requested.pids() {
        let limit = pids.limit();
        if limit <= 0 || limit > ceiling.pids {
            return Err(past(
                "pids.limit",
                shown(limit <= 0, limit.to_string()),
                format!("pids limit of {}", ceiling.pids),
                "limits.pids",
            ));
        }
    }
    if let Some(cpu) = requested.cpu() {
        if cpu.realtime_runtime().is_some() || cpu.realtime_period().is_some() {
            return Err(refuse(
                "cpu.realtimeRuntime",
                "a sandbox gets no real-time CPU time".to_owned(),
            ));
        }
        // The most a create gives, so that an update never refuses it.
        let max = max_quota(ceiling);
        // A quota of 0 leaves it as it is, as for the memory limit (and is
        // left out).
        match (cpu.quota().filter(|q| *q != 0), cpu.period()) {
            (Some(quota), period) => {
                // Per the period given, or the sandbox's own.
                let period = period.unwrap_or(PERIOD).max(1);
                let per_period = i128::from(quota) * i128::from(PERIOD) / i128::from(period);
                if quota < 0 || per_period > i128::from(max) {
                    return Err(past(
                        "cpu.quota",
                        shown(quota < 0, format!("{quota}us per {period}us")),
                        format!("cpu quota of {max}us per {PERIOD}us"),
                        "limits.cpu_millis",
                    ));
                }
            }
            // A period alone would stretch the quota over a shorter one.
            (None, Some(_)) => {
                return Err(refuse(
                    "cpu.period",
                    "a period changes what the quota allows: give the quota with it".to_owned(),
                ))
            }
            (None, None) => {}
        }
        if cpu.quota() == Some(0) {
            let mut cpu = cpu.clone();
            cpu.set_quota(None);
            requested.set_cpu(Some(cpu));
        }
    }
    Ok(requested)
}
