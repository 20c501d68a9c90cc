//! `runsbx check`: what this host lets runsbx apply, and what each finding
//! means.

use crate::policy;
use crate::sys::privilege;
use crate::sys::userns;

pub struct Finding {
    pub name: &'static str,
    pub ok: bool,
    /// Without it, runsbx refuses to run (fail closed).
    pub required: bool,
    pub detail: String,
}

pub fn host() -> Vec<Finding> {
    let facts = policy::host_facts(None);
    let cgroups = privilege::cgroup_layout();
    let mut findings = vec![
        Finding {
            name: "user namespaces",
            ok: facts.user_namespaces,
            required: true,
            detail: if facts.user_namespaces {
                "every sandbox gets its own user namespace".to_owned()
            } else {
                "needed for every sandbox: check `sysctl user.max_user_namespaces` (> 0) and `sysctl kernel.unprivileged_userns_clone` (1)".to_owned()
            },
        },
        Finding {
            name: "seccomp filters",
            ok: facts.seccomp,
            required: true,
            detail: if facts.seccomp {
                "the syscall allowlist is enforced (Seccomp: 2 inside)".to_owned()
            } else {
                "needed: the kernel lacks CONFIG_SECCOMP_FILTER".to_owned()
            },
        },
        Finding {
            name: "procfs subset=pid",
            ok: facts.proc_subset,
            required: true,
            detail: if facts.proc_subset {
                "/proc shows a sandbox only its own processes".to_owned()
            } else {
                "needs Linux 5.8+ for the default profile's minimal /proc; or use proc = \"full\"".to_owned()
            },
        },
        Finding {
            name: "cgroup limits",
            ok: facts.cgroups,
            required: false,
            detail: match (facts.cgroups, cgroups) {
                (true, layout) => format!("memory and pids limits applied ({layout:?} hierarchy)"),
                (false, privilege::CgroupLayout::None) => "no cgroup hierarchy: limits are rlimits only".to_owned(),
                (false, layout) => format!(
                    "rootless on a {layout:?} host: no cgroup can be made; limits are rlimits only, and pause/resume/update/events are unavailable"
                ),
            },
        },
        Finding {
            name: "running as",
            ok: true,
            required: false,
            detail: if facts.rootless {
                format!("rootless (uid {}): container root is you", userns::caller_uid())
            } else {
                "root: each sandbox's root is an unprivileged uid range of its own (idmapped image)".to_owned()
            },
        },
    ];
    findings.extend(rootless_ids(&facts));
    findings
}

/// Rootless: which ids a sandbox has besides container root. An image's
/// other users (`USER 1000`, `--user`) need the caller's subordinate ids.
fn rootless_ids(facts: &runsbx_policy::HostFacts) -> Option<Finding> {
    let name = "rootless ids";
    let ok = |detail: String| Finding {
        name,
        ok: true,
        required: false,
        detail,
    };
    if !facts.rootless {
        return None;
    }
    // An engine's namespace (rootless podman's): what it maps is what there is.
    if let Some(ids) = facts.rootless_ids.as_ref().filter(|ids| ids.engines) {
        let count: u64 = ids.uids.iter().map(|r| u64::from(r.size)).sum();
        return Some(ok(format!(
            "inside an engine's user namespace: {count} uids can be mapped"
        )));
    }
    let (uid, gid) = userns::userns_from().unwrap_or((facts.uid, facts.gid));
    Some(match userns::Subordinate::of(uid, gid) {
        Ok(ids) => ok(format!(
            "your subordinate ids are mapped with newuidmap/newgidmap: {}",
            ids.describe()
        )),
        Err(why) => Finding {
            name,
            ok: false,
            required: false,
            detail: format!(
                "only your own uid and gid are mapped (container root), so images with another \
                 USER cannot run: {why}"
            ),
        },
    })
}
