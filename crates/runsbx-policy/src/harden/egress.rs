//! Egress: the sandbox's network namespace holds only its loopback, so its
//! one way out is runsbx's allowlist proxy, which the runtime serves inside
//! that namespace on [`PROXY_PORT`]. What it lets through is the profile's
//! `[egress]`, narrowed by a `runsbx.egress.allow` annotation, or a
//! `runsbx call`'s own (see [`EgressOverride::Call`]). With an allowlist,
//! the process's environment points its HTTP clients at the proxy.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use oci_spec::runtime::LinuxNamespaceType;
use serde::{Deserialize, Serialize};

use super::Cx;
use crate::annotations::{EgressOverride, EGRESS_ALLOW};
use crate::PolicyError;

/// The port of the proxy on the sandbox's own loopback (its own network
/// namespace: the port is always free).
pub const PROXY_PORT: u16 = 3128;

/// What a sandbox may reach through its egress proxy. The policy decides
/// it; the runtime serves it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EgressPlan {
    /// Allowlist entries: `name`, `name:port`, `*.suffix[:port]`.
    pub allow: Vec<String>,
    /// Names the proxy resolves to these addresses instead of asking DNS.
    pub resolve: BTreeMap<String, Vec<IpAddr>>,
    /// Destinations exempt from the proxy's refusal of loopback and
    /// private addresses, because whoever runs runsbx marked them.
    pub allow_addresses: Vec<SocketAddr>,
    /// Learn mode: the proxy records every request it lets through, and
    /// reads every tunnel it can, so that a narrower allowlist can be
    /// written from what was seen (`runsbx profile suggest`). It allows
    /// nothing more. `None`: not learning.
    pub learn: Option<Learn>,
}

/// Where learn mode's record goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Learn {
    /// Into the call's result (`runsbx call --learn`).
    Result,
    /// `<dir>/<container id>.json`, written when the container ends (a
    /// profile's `[egress] learn`, for engines' containers).
    Dir(PathBuf),
}

/// The environment that points a sandbox's HTTP clients at the proxy. Both
/// spellings, because curl and others read only the lower-case
/// `http_proxy`. `NO_PROXY` keeps the sandbox's own loopback direct: it is
/// the sandbox's own, and the proxy would refuse it anyway.
pub fn proxy_env() -> Vec<String> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1";
    vec![
        format!("HTTP_PROXY={url}"),
        format!("HTTPS_PROXY={url}"),
        format!("http_proxy={url}"),
        format!("https_proxy={url}"),
        format!("NO_PROXY={no_proxy}"),
        format!("no_proxy={no_proxy}"),
    ]
}

/// The environment that points a sandbox's TLS clients at its trust
/// bundle when the proxy inspects TLS: OpenSSL and what builds on it
/// (`SSL_CERT_FILE`), Python's requests and pip (which carry their own CA
/// list otherwise), curl, git, and Node (which adds to its own list).
pub fn trust_env() -> Vec<String> {
    [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "CURL_CA_BUNDLE",
        "GIT_SSL_CAINFO",
        "NODE_EXTRA_CA_CERTS",
    ]
    .iter()
    .map(|var| format!("{var}={}", super::TRUST_BUNDLE))
    .collect()
}

pub(super) fn apply(cx: &mut Cx) -> Result<Option<EgressPlan>, PolicyError> {
    let plan = plan(cx)?.filter(|p| !p.allow.is_empty());
    let joined = network_joined(cx);
    if plan.is_some() {
        add_proxy_env(cx);
        if cx.host.trust_bundle.is_some() {
            set_env(cx, trust_env(), "TLS clients trust the sandbox's own bundle, which holds the CA of the proxy's inspection".to_owned());
        }
    }
    match (&plan, joined) {
        (_, Joined::Path) => cx.attest(
            "egress",
            false,
            "the network namespace is joined by path, as the profile allows: its routes are that namespace's",
        ),
        (Some(p), joined) => {
            let served = if joined == Joined::Pod {
                "its pod sandbox's proxy"
            } else {
                "runsbx's proxy"
            };
            cx.attest(
                "egress",
                true,
                format!(
                    "only through {served}, to: {} (every connection checked and logged)",
                    p.allow.join(", ")
                ),
            );
        }
        (None, _) => cx.attest(
            "egress",
            true,
            "none: no egress allowlist, nothing outside the sandbox is reachable",
        ),
    }
    Ok(plan)
}

/// The plan before it is known to allow anything.
fn plan(cx: &Cx) -> Result<Option<EgressPlan>, PolicyError> {
    let profile = &cx.profile.egress;
    let learn = profile.learn.clone().map(Learn::Dir);
    let allow = match &cx.overrides.egress {
        // A call's egress is its caller's: see `EgressOverride::Call`.
        Some(EgressOverride::Call(plan)) => return Ok(Some(plan.clone())),
        Some(EgressOverride::Narrow(kept)) => {
            if let Some(wider) = kept.iter().find(|e| !profile.allow.contains(e)) {
                return Err(PolicyError::Annotation {
                    key: EGRESS_ALLOW.to_owned(),
                    value: kept.join(","),
                    reason: format!(
                        "{wider:?} is not in the egress allowlist of profile `{}` (annotations only narrow it)",
                        cx.profile.name
                    ),
                });
            }
            kept.clone()
        }
        None => profile.allow.clone(),
    };
    if allow.is_empty() {
        return Ok(None);
    }
    let bad = |what: String, reason: String| PolicyError::Profile {
        origin: format!("`{}`", cx.profile.name),
        reason: format!("egress {what}: {reason}"),
    };
    let mut resolve: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for (name, ip) in &profile.resolve {
        let ip = ip
            .parse()
            .map_err(|e| bad(format!("resolve.{name}"), format!("{ip:?}: {e}")))?;
        resolve
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(ip);
    }
    let allow_addresses = profile
        .allow_addresses
        .iter()
        .map(|a| {
            a.parse()
                .map_err(|e| bad("allow_addresses".into(), format!("{a:?}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    Ok(Some(EgressPlan {
        allow,
        resolve,
        allow_addresses,
        learn,
    }))
}

/// The proxy's variables, in place of any the spec sets by those names.
fn add_proxy_env(cx: &mut Cx) {
    let reason = format!(
        "HTTP(S)_PROXY point at the egress proxy on the sandbox's loopback (port {PROXY_PORT})"
    );
    set_env(cx, proxy_env(), reason);
}

/// Sets `vars` in the process's environment, in place of any it had.
fn set_env(cx: &mut Cx, vars: Vec<String>, reason: String) {
    let Some(process) = cx.spec.process_mut() else {
        return;
    };
    let mut env = process.env().clone().unwrap_or_default();
    let before = env.clone();
    env.retain(|e| {
        !vars
            .iter()
            .any(|v| v.split('=').next() == e.split('=').next())
    });
    env.extend(vars);
    if env != before {
        process.set_env(Some(env));
        cx.change("process.env", reason);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Joined {
    /// A network namespace of the sandbox's own (made by the runtime).
    No,
    /// Its pod sandbox container's, verified by the runtime.
    Pod,
    /// One the profile let the spec join by path.
    Path,
}

fn network_joined(cx: &Cx) -> Joined {
    let path = cx
        .spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|n| n.iter().find(|ns| ns.typ() == LinuxNamespaceType::Network))
        .and_then(|ns| ns.path().clone());
    let Some(path) = path else {
        return Joined::No;
    };
    let pod = cx.host.pod.as_ref().is_some_and(|pod| {
        pod.namespaces.iter().any(|ns| {
            ns.typ == LinuxNamespaceType::Network && (ns.path == path || ns.pinned == path)
        })
    });
    if pod {
        Joined::Pod
    } else {
        Joined::Path
    }
}
