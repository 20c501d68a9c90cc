//! The deadline: a wall-clock limit, counted from create, after which the
//! runtime kills the whole sandbox. The profile's, or a shorter one from a
//! `runsbx.timeout` annotation; the runtime's supervisor enforces it.

use std::time::Duration;

use super::Cx;
use crate::PolicyError;

pub(super) fn apply(cx: &mut Cx) -> Result<Option<Duration>, PolicyError> {
    let limits = cx.overrides.limits(cx.profile.limits)?;
    let deadline = limits.timeout.map(|t| t.0);
    match deadline {
        Some(d) => cx.attest(
            "deadline",
            true,
            format!(
                "the whole sandbox is killed {}ms after it is created",
                d.as_millis()
            ),
        ),
        None => cx.attest(
            "deadline",
            false,
            "none: neither the profile (limits.timeout) nor a runsbx.timeout annotation sets one",
        ),
    }
    Ok(deadline)
}
