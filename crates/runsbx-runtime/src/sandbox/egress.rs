//! Egress: the policy plans what a sandbox may reach (see
//! runsbx-policy's harden/egress.rs); here the plan becomes the proxy's
//! configuration. The proxy is served inside the sandbox's network
//! namespace by its supervisor (`create`) or by `runsbx call` itself.

use runsbx_policy::{EgressPlan, Profile};

use crate::error::{Result, RuntimeError};

pub use runsbx_policy::PROXY_PORT;

/// The proxy's configuration for `plan`.
pub fn proxy_config(plan: &EgressPlan) -> Result<runsbx_proxy::ProxyConfig> {
    let allow = runsbx_proxy::Allowlist::parse(&plan.allow)
        .map_err(|e| RuntimeError::invalid("the egress allowlist", e.to_string()))?;
    let mut config = runsbx_proxy::ProxyConfig::new(allow);
    config.hosts = plan.resolve.clone().into_iter().collect();
    config.allow_addresses = plan.allow_addresses.clone();
    Ok(config)
}

/// Checks the syntax of a profile's egress allowlist when it is loaded,
/// so that a bad entry is reported against the profile, before anything
/// is made.
pub fn check_profile(profile: &Profile, origin: &str) -> Result<()> {
    runsbx_proxy::Allowlist::parse(&profile.egress.allow)
        .map(drop)
        .map_err(|e| {
            RuntimeError::invalid(
                format!("profile `{}` ({origin}): egress allow", profile.name),
                e.to_string(),
            )
        })
}
