//! A sandbox's limits, written by runsbx into the cgroup v1 hierarchies it
//! made for it (sys/cgroup_attach.rs), for the limits a runsbx policy sets:
//! memory, CPU quota, pids and the device rules.
//!
//! libcontainer would write them from its intermediate process, through a
//! cgroup v1 manager that first finds every controller's hierarchy again:
//! for each of twelve controllers it reads the mount table and
//! /proc/self/cgroup through a freshly verified procfs handle. That search
//! was 2.5-3.9 ms of every create on this project's 2-core test machine
//! (`perf trace`, from the intermediate naming itself to its next step), a
//! fifth of a cold call, and grows with the host's mount table. runsbx
//! knows the hierarchies already. Written here, the limits are in force
//! before the sandbox's first process exists, as libcontainer's are.
//!
//! Only what this module writes exactly as libcontainer 0.7's cgroup v1
//! manager does is written here ([`writable`]); a spec with anything else
//! (an engine's CPU shares, block I/O weights, swappiness...) keeps
//! libcontainer's manager for all of it. `fast_and_libcontainer_limits_are_the_same`
//! (crates/runsbx/tests/sandbox.rs) compares both from the host.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use libcontainer::oci_spec::runtime::{LinuxDeviceCgroup, LinuxResources};

use crate::error::{Result, RuntimeError};

/// The device rules libcontainer's cgroup managers allow after a spec's
/// own, in their order: the default device nodes (null, zero, full, tty,
/// urandom, random), mknod of any device (a user namespace refuses it
/// anyway), the console, the pts, ptmx and tun. The same set as runc's.
const DEFAULT_ALLOWED: &[&str] = &[
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 5:0 rwm",
    "c 1:9 rwm",
    "c 1:8 rwm",
    "c *:* m",
    "b *:* m",
    "c 5:1 rwm",
    "c 136:* rwm",
    "c 5:2 rwm",
    "c 10:200 rwm",
];

/// Whether [`write`] writes every limit `resources` asks for: a memory
/// limit (swap, if set, equal to it, as the policy sets it; no
/// reservation, kernel or swappiness setting, the OOM killer on), a CPU
/// quota and period (no shares, cpus, mems or realtime), a pids limit,
/// and the policy's one device rule, denying every device.
pub(crate) fn writable(resources: &LinuxResources) -> bool {
    let memory = resources.memory().as_ref().is_none_or(|m| {
        m.limit().is_some_and(|l| l > 0)
            && m.reservation().is_none()
            && m.swap().is_none_or(|swap| Some(swap) == m.limit())
            && m.kernel().is_none()
            && m.kernel_tcp().is_none()
            && m.swappiness().is_none()
            && m.disable_oom_killer() != Some(true)
            && m.use_hierarchy().is_none()
            && m.check_before_update().is_none()
    });
    let cpu = resources.cpu().as_ref().is_none_or(|c| {
        c.shares().is_none()
            && c.idle().is_none()
            && c.burst().is_none()
            && c.realtime_runtime().is_none()
            && c.realtime_period().is_none()
            && c.cpus().is_none()
            && c.mems().is_none()
            && c.quota().is_some_and(|q| q > 0)
            && c.period().is_some_and(|p| p > 0)
    });
    let devices = resources
        .devices()
        .as_ref()
        .is_some_and(|d| matches!(d.as_slice(), [rule] if denies_every_device(rule)));
    memory
        && cpu
        && devices
        && resources.block_io().is_none()
        && resources
            .hugepage_limits()
            .as_ref()
            .is_none_or(Vec::is_empty)
        && resources.network().is_none()
        && resources.rdma().as_ref().is_none_or(|r| r.is_empty())
        && resources.unified().as_ref().is_none_or(|u| u.is_empty())
}

fn denies_every_device(rule: &LinuxDeviceCgroup) -> bool {
    !rule.allow()
        && rule.major().is_none()
        && rule.minor().is_none()
        && rule.access().as_deref() == Some("rwm")
        && rule
            .typ()
            .is_none_or(|t| t == libcontainer::oci_spec::runtime::LinuxDeviceType::A)
}

/// Writes `resources` (which [`writable`] accepted) into the sandbox's
/// cgroups: `dir_of(controller)` is its cgroup directory in the hierarchy
/// holding that controller, `None` where none is mounted (libcontainer's
/// manager skips those too).
pub(crate) fn write<'a>(
    resources: &LinuxResources,
    dir_of: impl Fn(&str) -> Option<&'a Path>,
) -> Result<()> {
    if let Some(dir) = dir_of("devices") {
        // The deny rule first: a new v1 devices cgroup starts with its
        // parent's rules, `a *:* rwm` at the root.
        put(dir, "devices.deny", "a *:* rwm")?;
        put_each(dir, "devices.allow", DEFAULT_ALLOWED)?;
    }
    if let (Some(cpu), Some(dir)) = (resources.cpu(), dir_of("cpu")) {
        // The period before the quota, which the kernel checks against it.
        if let Some(period) = cpu.period() {
            put(dir, "cpu.cfs_period_us", &period.to_string())?;
        }
        if let Some(quota) = cpu.quota() {
            put(dir, "cpu.cfs_quota_us", &quota.to_string())?;
        }
    }
    if let (Some(memory), Some(dir)) = (resources.memory(), dir_of("memory")) {
        if let Some(limit) = memory.limit() {
            put(dir, "memory.limit_in_bytes", &limit.to_string())?;
        }
        // Memory and swap together, after the memory alone: the kernel
        // keeps the total at or above it (libcontainer's order for a new
        // cgroup, whose total starts unlimited).
        if let Some(swap) = memory.swap() {
            put(dir, "memory.memsw.limit_in_bytes", &swap.to_string())?;
        }
        // The OOM killer on: a process past the limit is killed, not left
        // waiting (the policy never turns it off).
        put(dir, "memory.oom_control", "0")?;
    }
    if let (Some(pids), Some(dir)) = (resources.pids(), dir_of("pids")) {
        put(dir, "pids.max", &pids.limit().to_string())?;
    }
    Ok(())
}

/// One write of `value` to the cgroup file `dir/file`, which must exist.
fn put(dir: &Path, file: &str, value: &str) -> Result<()> {
    put_each(dir, file, &[value])
}

/// One write of each of `values`, in order, to the cgroup file `dir/file`,
/// opened once: the kernel reads each write as one value (a v1 device
/// rule is one rule per write), so twelve rules cost one open, not twelve.
fn put_each(dir: &Path, file: &str, values: &[&str]) -> Result<()> {
    let path = dir.join(file);
    let io = |value: &str, e| RuntimeError::io(format!("write {value:?} to {}", path.display()), e);
    let mut f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|e| io(values.first().copied().unwrap_or_default(), e))?;
    for value in values {
        f.write_all(value.as_bytes()).map_err(|e| io(value, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{json, Value};

    fn writable_json(json: &Value) -> bool {
        writable(&serde_json::from_value(json.clone()).unwrap())
    }

    /// `v` with the value at `path` (object keys, made where missing)
    /// replaced.
    fn with(mut v: Value, path: &[&str], value: Value) -> Value {
        let mut at = &mut v;
        for key in path {
            at = &mut at[*key];
        }
        *at = value;
        v
    }

    #[test]
    fn only_what_libcontainer_would_write_alike_is_written_here() {
        let policy = json!({
            "devices": [{"allow": false, "access": "rwm"}],
            "memory": {"limit": 536870912, "swap": 536870912},
            "cpu": {"quota": 100000, "period": 100000},
            "pids": {"limit": 256},
        });
        assert!(writable_json(&policy));
        // A kernel without swap accounts: the policy sets no swap.
        assert!(writable_json(&with(
            policy.clone(),
            &["memory", "swap"],
            Value::Null
        )));
        assert!(writable_json(&with(
            policy.clone(),
            &["devices"],
            json!([{"allow": false, "type": "a", "access": "rwm"}])
        )));
        for (path, value) in [
            (&["devices"][..], json!([])),
            (&["devices"], Value::Null),
            (
                &["devices"],
                json!([{"allow": false, "access": "rwm"}, {"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]),
            ),
            (
                &["devices"],
                json!([{"allow": false, "type": "c", "access": "rwm"}]),
            ),
            (&["memory", "swap"], json!(1073741824)),
            (&["memory", "swap"], json!(-1)),
            (&["memory", "limit"], json!(-1)),
            (&["memory", "reservation"], json!(1024)),
            (&["memory", "disableOOMKiller"], json!(true)),
            (&["cpu", "shares"], json!(1024)),
            (&["cpu", "cpus"], json!("0")),
            (&["cpu", "quota"], json!(-1)),
            (&["blockIO"], json!({"weight": 10})),
            (
                &["hugepageLimits"],
                json!([{"pageSize": "2MB", "limit": 1}]),
            ),
            (&["network"], json!({"classID": 1})),
            (&["unified"], json!({"memory.high": "1"})),
        ] {
            let r = with(policy.clone(), path, value);
            assert!(!writable_json(&r), "{path:?}: {r}");
        }
    }
}
