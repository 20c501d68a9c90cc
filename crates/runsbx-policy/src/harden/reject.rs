//! What a profile refuses outright, and device nodes beyond the defaults.

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    // Hooks run host programs, as the runtime's user, outside the sandbox.
    if let Some(hooks) = cx.spec.hooks() {
        let any = [
            hooks.prestart(),
            hooks.create_runtime(),
            hooks.create_container(),
            hooks.start_container(),
            hooks.poststart(),
            hooks.poststop(),
        ]
        .iter()
        .any(|h| h.as_ref().is_some_and(|v| !v.is_empty()));
        if any && !cx.profile.hooks {
            return Err(cx.refused("an OCI hook (config.json `hooks`)", "hooks = true"));
        }
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
