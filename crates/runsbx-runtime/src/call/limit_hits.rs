//! Whether a limit stopped the call: the cgroup's event counters, read
//! before the cgroup is removed. Without a cgroup (rootless on cgroup v1)
//! the host cannot tell, and the result says so with `null`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::Spec;

use crate::sys::privilege::{self, CgroupLayout};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Where a sandbox's limit events are counted: found and opened before its
/// command runs (the lookup is several statfs calls, each open a walk
/// through cgroupfs), read once it has ended.
pub struct Counters {
    /// The memory and pids files, each `None` when the host cannot tell.
    memory: Option<File>,
    pids: Option<File>,
}

impl Counters {
    pub fn of(spec: &Spec) -> Self {
        // As `privilege::can_manage_cgroups`, with the layout looked up once.
        let layout = if privilege::rootless() {
            CgroupLayout::None
        } else {
            privilege::cgroup_layout()
        };
        let path = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone());
        let (Some(path), false) = (path, layout == CgroupLayout::None) else {
            return Self {
                memory: None,
                pids: None,
            };
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
            CgroupLayout::V2 => file("memory", "memory.events"),
            _ => file("memory", "memory.oom_control"),
        };
        Self {
            memory: File::open(memory).ok(),
            pids: File::open(file("pids", "pids.events")).ok(),
        }
    }

    /// (memory limit hit, pids limit hit), each `None` when unknown.
    pub fn read(&self) -> (Option<bool>, Option<bool>) {
        let memory = self.memory.as_ref().and_then(|f| counter(f, "oom_kill"));
        let pids = self.pids.as_ref().and_then(|f| counter(f, "max"));
        (memory.map(|n| n > 0), pids.map(|n| n > 0))
    }
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines),
/// read from its start: a cgroup file is generated anew for each read
/// from offset 0.
fn counter(file: &File, key: &str) -> Option<u64> {
    let mut buf = [0u8; 4096];
    let n = file.read_at(&mut buf, 0).ok()?;
    parse_counter(std::str::from_utf8(&buf[..n]).ok()?, key)
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
