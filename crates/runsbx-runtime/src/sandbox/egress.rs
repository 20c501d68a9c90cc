//! Egress for containers made by `create` (podman, containerd): the same
//! proxy as `runsbx call`, configured from the profile and annotations,
//! and served by the container's supervisor (see supervisor.rs).

use libcontainer::oci_spec::runtime::Spec;
use runsbx_policy::Profile;

use crate::error::{Result, RuntimeError};

/// The port of the proxy inside every sandbox (its own netns: free).
pub const PROXY_PORT: u16 = 3128;

/// The proxy's configuration for a container of `profile` whose spec
/// carries `annotations`; `None` when it gets no egress.
pub fn config_for(spec: &Spec, profile: &Profile) -> Result<Option<runsbx_proxy::ProxyConfig>> {
    let allow = runsbx_policy::annotations::egress_allow(spec.annotations().as_ref(), profile)
        .map_err(crate::policy::policy_err)?;
    if allow.is_empty() {
        return Ok(None);
    }
    let bad = |what: String, reason: String| {
        RuntimeError::invalid(format!("profile `{}`: egress {what}", profile.name), reason)
    };
    let list =
        runsbx_proxy::Allowlist::parse(&allow).map_err(|e| bad("allow".into(), e.to_string()))?;
    let mut config = runsbx_proxy::ProxyConfig::new(list);
    for (name, ip) in &profile.egress.resolve {
        let ip = ip
            .parse()
            .map_err(|e| bad(format!("resolve.{name}"), format!("{ip:?}: {e}")))?;
        config
            .hosts
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(ip);
    }
    for a in &profile.egress.allow_addresses {
        config.allow_addresses.push(
            a.parse()
                .map_err(|e| bad("allow_addresses".into(), format!("{a:?}: {e}")))?,
        );
    }
    Ok(Some(config))
}

/// Adds the proxy's variables to the container's environment.
pub fn add_proxy_env(spec: &mut Spec) {
    if let Some(process) = spec.process_mut() {
        let mut env = process.env().clone().unwrap_or_default();
        let vars = runsbx_proxy::proxy_env(PROXY_PORT);
        env.retain(|e| {
            !vars
                .iter()
                .any(|v| v.split('=').next() == e.split('=').next())
        });
        env.extend(vars);
        process.set_env(Some(env));
    }
}
