//! `verify`: checks a hardened spec again, independently of how `harden`
//! got there, right before launch. Each check is an invariant of the
//! sandbox; a failure means a bug, and the container does not start.

use std::path::Path;

use oci_spec::runtime::Spec;

use crate::harden::{
    engine_bind_in, is_bind_mount, ENGINE_FILES, REQUIRED_NAMESPACES, WORKSPACE, WORKSPACE_OPTIONS,
};
use crate::profile::Limits;
use crate::{EngineBindKind, HostFacts, PolicyError, Profile};

/// Whether `path` is where the runtime holds a namespace of type `typ` of
/// the container's pod sandbox, verified (see [`crate::PodJoin`]).
fn pod_verified(host: &HostFacts, typ: oci_spec::runtime::LinuxNamespaceType, path: &Path) -> bool {
    host.pod.as_ref().is_some_and(|pod| {
        (typ == oci_spec::runtime::LinuxNamespaceType::User && path == pod.user_namespace)
            || pod
                .namespaces
                .iter()
                .any(|n| n.typ == typ && n.pinned == path)
    })
}

pub fn verify(spec: &Spec, profile: &Profile, host: &HostFacts) -> Result<(), PolicyError> {
    let fail = |what: String| Err(PolicyError::Verify(what));
    let Some(linux) = spec.linux() else {
        return fail("no linux section".into());
    };
    let Some(process) = spec.process() else {
        return fail("no process".into());
    };

    let namespaces = linux.namespaces().clone().unwrap_or_default();
    for typ in REQUIRED_NAMESPACES {
        match namespaces.iter().find(|ns| ns.typ() == *typ) {
            None => return fail(format!("no {typ:?} namespace")),
            Some(ns) => match ns.path() {
                Some(path) if !profile.namespace_join && !pod_verified(host, *typ, path) => {
                    return fail(format!("{typ:?} namespace is joined by path"))
                }
                _ => {}
            },
        }
    }
    if let Some(pod) = &host.pod {
        // A pod's container is in its sandbox's user namespace, with its
        // mappings, and nowhere else.
        let user = namespaces
            .iter()
            .find(|ns| ns.typ() == oci_spec::runtime::LinuxNamespaceType::User);
        if user.and_then(|ns| ns.path().as_ref()) != Some(&pod.user_namespace)
            || linux.uid_mappings().as_ref() != Some(&pod.uid_mappings)
            || linux.gid_mappings().as_ref() != Some(&pod.gid_mappings)
        {
            return fail(format!(
                "not in the user namespace of pod sandbox `{}`",
                pod.sandbox
            ));
        }
    }
    let ids = host.rootless_ids.clone().unwrap_or_default();
    for (map, own, ranges) in [
        (linux.uid_mappings(), host.uid, &ids.uids),
        (linux.gid_mappings(), host.gid, &ids.gids),
    ] {
        let Some(map) = map.as_ref().filter(|m| !m.is_empty()) else {
            return fail("the user namespace has no id mappings".into());
        };
        if host.pod.is_none() {
            if let Some(m) = map.iter().find(|m| !is_the_sandboxs(host, m, own, ranges)) {
                return fail(format!(
                    "id mapping {} {} {} maps ids that are not this sandbox's",
                    m.container_id(),
                    m.host_id(),
                    m.size()
                ));
            }
        }
    }
    if process.no_new_privileges() != Some(true) {
        return fail("no_new_privileges is not set".into());
    }
    let allowed: Vec<String> = profile.capabilities.clone();
    if let Some(caps) = process.capabilities() {
        for set in [
            caps.bounding(),
            caps.effective(),
            caps.permitted(),
            caps.inheritable(),
            caps.ambient(),
        ] {
            for cap in set.iter().flatten() {
                if !allowed.contains(&cap.to_string()) {
                    return fail(format!("capability {cap} is not in the profile"));
                }
            }
        }
    }
    // Exactly the allowlist, or, where the runtime listens, the same
    // allowlist reporting to that listener and no other.
    let listener = host.seccomp_listener.as_deref();
    if !crate::seccomp::is_allowlist(linux.seccomp().as_ref(), listener)? {
        return fail("the seccomp allowlist is not in place".into());
    }
    let writable_ok = !profile.readonly_rootfs && host.rootfs_container_layer;
    if spec.root().as_ref().and_then(|r| r.readonly()) != Some(true) && !writable_ok {
        return fail("the image is not read-only".into());
    }
    for m in spec.mounts().iter().flatten() {
        let dest = m.destination();
        if is_bind_mount(m) && dest == Path::new(WORKSPACE) && host.call_workspace.is_some() {
            // The call's own tmpfs: exactly that source, never suid or dev.
            let options = m.options().clone().unwrap_or_default();
            if m.source() != &host.call_workspace
                || !WORKSPACE_OPTIONS
                    .iter()
                    .all(|o| options.iter().any(|x| x == o))
            {
                return fail(format!(
                    "the bind at {dest:?} is not the call's own workspace"
                ));
            }
        } else if is_bind_mount(m)
            && crate::harden::is_trust_bundle(host, &dest.display().to_string())
        {
            // The runtime's trust bundle: exactly that file, read-only.
            let options = m.options().clone().unwrap_or_default();
            if m.source() != &host.trust_bundle
                || !crate::harden::TRUST_OPTIONS
                    .iter()
                    .all(|o| options.iter().any(|x| x == o))
            {
                return fail(format!(
                    "the bind at {dest:?} is not the sandbox's trust bundle"
                ));
            }
        } else if is_bind_mount(m) {
            let options = m.options().clone().unwrap_or_default();
            let has = |o: &str| options.iter().any(|x| x == o);
            let allowed = match engine_bind_in(spec, profile, host, m) {
                Some(EngineBindKind::Volume) => has("nosuid") && has("nodev"),
                Some(EngineBindKind::SystemFile) => has("ro") && has("nosuid") && has("nodev"),
                None => {
                    (ENGINE_FILES.iter().any(|f| Path::new(f) == dest)
                        || profile.bind_mounts.iter().any(|b| b == dest))
                        && has("ro")
                }
            };
            if !allowed {
                return fail(format!(
                    "bind mount at {dest:?} is not an allowed read-only one"
                ));
            }
        }
        if matches!(m.typ().as_deref(), Some("sysfs" | "cgroup" | "cgroup2")) {
            return fail(format!("{:?} mount at {dest:?}", m.typ()));
        }
    }
    let proc_ok = spec.mounts().iter().flatten().any(|m| {
        m.destination() == Path::new("/proc")
            && m.typ().as_deref() == Some("proc")
            && (profile.proc == crate::profile::ProcMode::Full
                || m.options().iter().flatten().any(|o| o == "subset=pid"))
    });
    if !proc_ok {
        return fail("/proc is not the profile's fresh procfs".into());
    }
    if crate::harden::has_hooks(spec) && !profile.hooks {
        return fail("hooks are present".into());
    }
    if linux.devices().as_ref().is_some_and(|d| !d.is_empty()) {
        return fail("extra device nodes are present".into());
    }
    // The cgroup is removed with the sandbox, every process in it killed
    // first: it must be one below the hierarchy's root, by plain names.
    if let Some(path) = linux.cgroups_path() {
        if let Some(reason) = crate::harden::cgroups_path_problem(path) {
            return fail(format!("the cgroups path {path:?} {reason}"));
        }
    }
    if let Some(what) = rlimits_past(process, &profile.limits) {
        return fail(what);
    }
    if let Some(what) = resources_past(linux, &profile.limits, host) {
        return fail(what);
    }
    Ok(())
}

/// The first rlimit the profile sets that is missing or above it. A
/// call's or an annotation's limits only lower the profile's, so the
/// profile's are the ceiling.
fn rlimits_past(process: &oci_spec::runtime::Process, limits: &Limits) -> Option<String> {
    let rlimits = process.rlimits().clone().unwrap_or_default();
    crate::harden::rlimits_of(limits)
        .into_iter()
        .find_map(|(typ, max)| match rlimits.iter().find(|r| r.typ() == typ) {
            None => Some(format!("the rlimit {typ:?} is not set")),
            Some(r) if r.hard() > max || r.soft() > r.hard() => Some(format!(
                "the rlimit {typ:?} ({} soft, {} hard) is above the profile's {max}",
                r.soft(),
                r.hard()
            )),
            Some(_) => None,
        })
}

/// What of the cgroup limits is missing or past the profile's: memory
/// (and swap with it, where the kernel keeps swap accounts), pids, the
/// CPU quota (and no real-time time), no raw cgroup v2 files, and the
/// device rule that denies every device. They are checked whether or not
/// runsbx manages cgroups here: where it cannot, it drops the whole
/// cgroup after this, never one limit of it.
fn resources_past(
    linux: &oci_spec::runtime::Linux,
    limits: &Limits,
    host: &HostFacts,
) -> Option<String> {
    let Some(resources) = linux.resources() else {
        return Some("linux.resources is not set".into());
    };
    let memory_max = i64::try_from(limits.memory.0).unwrap_or(i64::MAX);
    let memory = resources.memory().unwrap_or_default();
    let limit = match memory.limit() {
        Some(l) if l > 0 && l <= memory_max => l,
        other => {
            return Some(format!(
                "the memory limit {other:?} is not within the profile's {memory_max} bytes"
            ))
        }
    };
    if host.cgroups {
        let swap = host.swap_limit.then_some(limit);
        if memory.swap() != swap {
            return Some(format!(
                "memory and swap ({:?} bytes) are not held to the memory limit ({swap:?})",
                memory.swap()
            ));
        }
    }
    if memory.disable_oom_killer() == Some(true) {
        return Some("the OOM killer is disabled".into());
    }
    match resources.pids().as_ref().map(|p| p.limit()) {
        Some(l) if l > 0 && l <= limits.pids => {}
        other => {
            return Some(format!(
                "the pids limit {other:?} is not within the profile's {}",
                limits.pids
            ))
        }
    }
    // The profile's quota per period, compared across periods.
    let cpu = resources.cpu().clone().unwrap_or_default();
    let max = i128::from(crate::harden::max_quota(limits));
    let period = i128::from(crate::harden::CPU_PERIOD);
    match (cpu.quota(), cpu.period()) {
        (Some(q), Some(p)) if q > 0 && p > 0 && i128::from(q) * period <= max * i128::from(p) => {}
        (q, p) => {
            return Some(format!(
                "the cpu quota {q:?} per {p:?}us is past the profile's {} thousandths of a CPU",
                limits.cpu_millis
            ))
        }
    }
    if cpu.realtime_runtime().is_some() || cpu.realtime_period().is_some() {
        return Some("the sandbox is given real-time CPU time".into());
    }
    if resources.unified().as_ref().is_some_and(|u| !u.is_empty()) {
        return Some("raw cgroup v2 files (linux.resources.unified) are set".into());
    }
    if resources.devices().as_deref() != Some(&[crate::harden::deny_every_device()][..]) {
        return Some("the device rules do not deny every device".into());
    }
    None
}

/// Whether every host id `m` maps is one the sandbox may have: as root,
/// in its own range; rootless, the caller's own id or one of the `ranges`
/// its user namespace maps (the caller's subordinate ids). Never host root.
fn is_the_sandboxs(
    host: &HostFacts,
    m: &oci_spec::runtime::LinuxIdMapping,
    own: u32,
    ranges: &[crate::IdRange],
) -> bool {
    let within = |base: u32, size: u32| {
        m.host_id() >= base
            && u64::from(m.host_id()) + u64::from(m.size()) <= u64::from(base) + u64::from(size)
    };
    match host.id_range {
        Some(range) => within(range.base, range.size),
        None => host.rootless && (within(own, 1) || ranges.iter().any(|r| within(r.base, r.size))),
    }
}
