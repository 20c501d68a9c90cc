//! The sandbox's network, held to its promise each time a process enters.

use libcontainer::container::Container;

use crate::error::Result;
use crate::state::bundle;
use crate::state::container::init_pid;
use crate::sys::netns;

/// Holds the sandbox's network namespace to runsbx's promise right before
/// a process runs in it (`when`: start, exec): whatever an engine moved in
/// or configured after `create`, only `lo` is left (see sys/netns.rs), and the
/// attestation says the check ran and what it removed. Sandboxes whose
/// network the profile let them join (not loopback-only) are left alone.
/// Returns the attested layer, if the check ran.
pub(crate) fn recheck_network(
    container: &Container,
    when: &str,
) -> Result<Option<runsbx_policy::Layer>> {
    if !promised(container.bundle()) {
        return Ok(None);
    }
    // A hardened sandbox always has a user namespace (the policy requires
    // one), which owns its network namespace: the helper joins it first.
    let removed = netns::hold_to_loopback(init_pid(container)?, true)?;
    attest(container, when, &removed).map(Some)
}

/// Starts a sandbox that this runsbx process made (`run`, a call), held
/// to its network promise as [`recheck_network`] at `start` would hold
/// it. `checked`, what create's network setup removed when it held the
/// namespace to loopback (`Built::network_checked`), stands for the check,
/// since no other process can have entered the sandbox in between; its
/// layer is then recorded once the command runs, beside it rather than
/// before it (the record is a report, not a gate: an `exec` meanwhile
/// finds the promise in the create's attestation and checks again).
/// `None`: checked again now, before the start. Returns the attested
/// layer, if a check ran.
pub(crate) fn start_checked(
    container: &mut Container,
    checked: Option<&[String]>,
    start: impl FnOnce(&mut Container) -> Result<()>,
) -> Result<Option<runsbx_policy::Layer>> {
    let Some(removed) = checked else {
        let layer = recheck_network(container, "start")?;
        start(container)?;
        return Ok(layer);
    };
    start(container)?;
    attest(container, "start", removed).map(Some)
}

/// Whether the sandbox whose effective bundle is `dir` was promised a
/// loopback-only network.
fn promised(dir: &std::path::Path) -> bool {
    bundle::Effective::report(dir).is_some_and(|r| {
        r["attestation"].as_array().is_some_and(|layers| {
            layers
                .iter()
                .any(|l| l["layer"] == "network_loopback_only" && l["in_force"] == true)
        })
    })
}

/// The layer that says the network was held to loopback before `when`,
/// and what that removed, recorded with the sandbox's attestation.
fn attest(container: &Container, when: &str, removed: &[String]) -> Result<runsbx_policy::Layer> {
    let detail = if removed.is_empty() {
        format!("checked at {when}: only lo")
    } else {
        tracing::warn!(
            id = container.id(),
            "removed from the sandbox's network before {when}: {}; engine networking and \
             published ports are not available in a runsbx sandbox (its network is its own \
             loopback, egress only through runsbx's proxy)",
            removed.join(", ")
        );
        format!(
            "checked at {when}: only lo, after runsbx removed {}",
            removed.join(", ")
        )
    };
    let layer = runsbx_policy::Layer {
        layer: "network_rechecked",
        in_force: true,
        detail,
    };
    bundle::Effective::attest(container.bundle(), &layer)?;
    Ok(layer)
}
