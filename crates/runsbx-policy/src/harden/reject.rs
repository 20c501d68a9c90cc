//! What a profile refuses outright, and device nodes beyond the defaults.

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
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
