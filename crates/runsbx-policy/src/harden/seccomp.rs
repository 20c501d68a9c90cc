//! Seccomp: the allowlist from `crate::seccomp`, whatever the spec asked;
//! its denials reported to the runtime's listener when it gives one.

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<(), PolicyError> {
    if !cx.host.seccomp {
        return Err(PolicyError::HostMissing {
            layer: "a seccomp filter",
            hint: "this kernel has no seccomp filter support (CONFIG_SECCOMP_FILTER); \
                   `grep Seccomp /proc/self/status` shows it"
                .to_owned(),
        });
    }
    let listener = cx.host.seccomp_listener.clone();
    let linux = cx.linux();
    if !crate::seccomp::is_allowlist(linux.seccomp().as_ref(), listener.as_deref())? {
        let allowlist = crate::seccomp::for_listener(listener.as_deref())?;
        let had = linux.seccomp().is_some();
        linux.set_seccomp(Some(allowlist));
        cx.change(
            "linux.seccomp",
            if had {
                "replaced by runsbx's allowlist"
            } else {
                "runsbx's allowlist (default EPERM)"
            },
        );
    }
    cx.attest(
        "seccomp_allowlist",
        true,
        if cx.host.seccomp_listener.is_some() {
            "runsbx allowlist, default EPERM, native architecture only; denials reported"
        } else {
            "runsbx allowlist, default EPERM, native architecture only"
        },
    );
    Ok(())
}
