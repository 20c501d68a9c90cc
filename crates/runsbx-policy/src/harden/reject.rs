//! What a profile refuses outright, and device nodes beyond the defaults.

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    check_cgroups_path(cx)?;
    check_hidden_paths(cx)?;
    drop_docker_network_hook(cx);
    // Hooks run host programs, as the runtime's user, outside the sandbox.
    if has_hooks(&cx.spec) && !cx.profile.hooks {
        return Err(cx.refused("an OCI hook (config.json `hooks`)", "hooks = true"));
    }
    // Extra device nodes (a GPU, /dev/kvm, a disk) are host attack surface;
    // the default set (null, zero, full, random, urandom, tty, ptmx) is
    // always made by the runtime.
    let devices = cx.spec.linux().as_ref().and_then(|l| l.devices().clone());
    if devices.is_some_and(|d| !d.is_empty()) {
        cx.linux().set_devices(None);
        cx.change(
            "linux.devices",
            "extra device nodes removed: only the default devices exist in a sandbox",
        );
    }
    Ok(())
}

/// The cgroup a container lives in is removed with it, and libcgroups
/// kills every process in a cgroup before removing it: a path that names
/// the hierarchy's root (`/`, `""`, or one that `..` climbs to), or that
/// climbs out of where it points, would make runsbx kill host processes.
/// A path must name a cgroup below the root, by plain components; whether
/// it already exists (it must not: runsbx only removes a cgroup it made)
/// is for the runtime to check on the host.
fn check_cgroups_path(cx: &Cx) -> Result<(), PolicyError> {
    let Some(path) = cx
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.cgroups_path().clone())
    else {
        return Ok(());
    };
    let bad = |reason: &str| PolicyError::Invalid {
        field: "linux.cgroupsPath".to_owned(),
        reason: format!(
            "{path:?} {reason}; give a path below the cgroup root made of plain names, such \
             as /runsbx/<id>, or leave it out"
        ),
    };
    match cgroups_path_problem(&path) {
        Some(reason) => Err(bad(reason)),
        None => Ok(()),
    }
}

/// What makes `path` not a cgroup below the hierarchy's root, if anything.
pub(crate) fn cgroups_path_problem(path: &std::path::Path) -> Option<&'static str> {
    use std::path::Component;
    // Segments of the text as given: `Path::components` would drop a `.`.
    let text = path.as_os_str().as_encoded_bytes();
    if text.split(|b| *b == b'/').any(|s| s == b"." || s == b"..") {
        return Some("has `.` or `..` components");
    }
    let names = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    if names == 0 {
        return Some("names the root of the cgroup hierarchy (or runsbx's own cgroup)");
    }
    None
}

/// Masked and read-only paths are mounted over inside the container: `/`
/// itself (its whole root made read-only over the runtime's own setup) or
/// a path that climbs with `..` is refused, not handed on.
fn check_hidden_paths(cx: &Cx) -> Result<(), PolicyError> {
    let Some(linux) = cx.spec.linux().as_ref() else {
        return Ok(());
    };
    for (field, paths) in [
        ("linux.maskedPaths", linux.masked_paths()),
        ("linux.readonlyPaths", linux.readonly_paths()),
    ] {
        for path in paths.as_deref().unwrap_or_default() {
            let p = std::path::Path::new(path);
            let climbs = path.split('/').any(|s| s == "." || s == "..");
            if !p.is_absolute() || p == std::path::Path::new("/") || climbs {
                return Err(PolicyError::Invalid {
                    field: field.to_owned(),
                    reason: format!(
                        "{path:?} is not an absolute path below / without `.` or `..` (such as \
                         /proc/kcore)"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// dockerd adds a prestart hook, its own binary run as
/// `libnetwork-setkey`, to every container with a new network namespace, so
/// that libnetwork can move the interfaces of the container's docker network
/// into it. A sandbox's network is its own loopback and nothing else, so the
/// hook has nothing to do: it is removed rather than run (it would run a
/// host program outside the sandbox) or refused (docker could not run
/// anything). The match is exact: dockerd's `/proc/<pid>/exe` and that
/// first argument; any other hook is still refused below.
fn drop_docker_network_hook(cx: &mut Cx) {
    let Some(mut hooks) = cx.spec.hooks().clone() else {
        return;
    };
    let Some(prestart) = hooks.prestart().clone() else {
        return;
    };
    let kept: Vec<_> = prestart
        .iter()
        .filter(|h| !is_docker_network_hook(h))
        .cloned()
        .collect();
    if kept.len() == prestart.len() {
        return;
    }
    hooks.set_prestart((!kept.is_empty()).then_some(kept));
    cx.spec.set_hooks(Some(hooks));
    cx.change(
        "hooks.prestart",
        "dockerd's libnetwork-setkey hook removed: a sandbox joins no docker network; \
         its network namespace holds only its own loopback",
    );
}

fn is_docker_network_hook(hook: &oci_spec::runtime::Hook) -> bool {
    let path = hook.path().to_string_lossy();
    let dockerd_exe = path
        .strip_prefix("/proc/")
        .and_then(|p| p.strip_suffix("/exe"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    dockerd_exe
        && hook
            .args()
            .as_ref()
            .and_then(|a| a.first())
            .is_some_and(|a| a == "libnetwork-setkey")
}

/// Whether the spec has any OCI hook.
pub(crate) fn has_hooks(spec: &oci_spec::runtime::Spec) -> bool {
    spec.hooks().as_ref().is_some_and(|h| {
        [
            h.prestart(),
            h.create_runtime(),
            h.create_container(),
            h.start_container(),
            h.poststart(),
            h.poststop(),
        ]
        .iter()
        .any(|x| x.as_ref().is_some_and(|v| !v.is_empty()))
    })
}
