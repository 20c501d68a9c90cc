//! `harden`: the sandbox as the policy decides it, without making it.

use std::path::Path;

use crate::error::Result;
use crate::policy::{self, Policy};
use crate::state::bundle;
use crate::sys::privilege;

/// The sandbox as the policy decides it: what `create` runs, and what
/// `runsbx harden` shows.
pub fn harden_bundle(bundle: &Path, config: Option<&Path>) -> Result<runsbx_policy::Hardened> {
    // Rootless, in the user namespace create would run in, so that the
    // mappings shown are the ones a create gets.
    crate::sys::userns::reexec_in_own_userns()?;
    let source = bundle::load(bundle)?;
    let policy = Policy::load(config)?;
    // As root a real create allocates a range; the dry run shows the first.
    let range = (!privilege::rootless()).then_some(runsbx_policy::IdRange {
        base: policy.config.uid_base,
        size: policy.config.uid_range_size,
    });
    policy::apply(
        &policy,
        bundle::absolutize(&source),
        range,
        policy::Provisions::default(),
        None,
        None,
    )
}
