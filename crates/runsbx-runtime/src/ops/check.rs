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
    vec![
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
    ]
}
