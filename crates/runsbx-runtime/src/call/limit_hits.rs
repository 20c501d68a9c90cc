//! Whether a limit stopped the call: the cgroup's event counters, read
//! before the cgroup is removed. Without a cgroup (rootless on cgroup v1)
//! the host cannot tell, and the result says so with `null`.

use std::fs;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;

use crate::sys::privilege::{self, CgroupLayout};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// (memory limit hit, pids limit hit), each `None` when unknown.
pub fn limit_hits(spec: &Spec) -> (Option<bool>, Option<bool>) {
    // As `privilege::can_manage_cgroups`, with the layout looked up once:
    // each look is several statfs calls, and the caller waits for these.
    let layout = if privilege::rootless() {
        CgroupLayout::None
    } else {
        privilege::cgroup_layout()
    };
    if layout == CgroupLayout::None {
        return (None, None);
    }
    let Some(path) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) else {
        return (None, None);
    };
    let rel = path.strip_prefix("/").unwrap_or(&path).to_path_buf();
    let file = |controller: &str, name: &str| -> PathBuf {
        match layout {
            CgroupLayout::V2 => Path::new(CGROUP_ROOT).join(&rel).join(name),
            _ => Path::new(CGROUP_ROOT)
                .join(controller)
                .join(&rel)
                .join(name),
        }
    };
    let memory = match layout {
        CgroupLayout::V2 => counter(&file("memory", "memory.events"), "oom_kill"),
        _ => counter(&file("memory", "memory.oom_control"), "oom_kill"),
    };
    let pids = counter(&file("pids", "pids.events"), "max");
    (memory.map(|n| n > 0), pids.map(|n| n > 0))
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
fn counter(path: &Path, key: &str) -> Option<u64> {
    parse_counter(&fs::read_to_string(path).ok()?, key)
}

fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(parse_counter(v1, "oom_kill"), Some(2));
        assert_eq!(parse_counter("max 0\n", "max"), Some(0));
        assert_eq!(parse_counter("low 0\n", "oom_kill"), None);
    }
}
