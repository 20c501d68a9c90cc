//! Egress: the policy plans what a sandbox may reach (see
//! runsbx-policy's harden/egress.rs); here the plan becomes the proxy's
//! configuration. The proxy is served inside the sandbox's network
//! namespace by its supervisor (`create`) or by `runsbx call` itself.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use libcontainer::oci_spec::runtime::Spec;
use runsbx_policy::request_rule::Entry;
use runsbx_policy::{EgressPlan, Profile};

use crate::error::{Result, RuntimeError};

pub use runsbx_policy::PROXY_PORT;

/// The proxy's configuration for `plan`, inspecting TLS with
/// `inspection` when the plan needs it.
pub fn proxy_config(
    plan: &EgressPlan,
    inspection: Option<Inspection>,
    secrets: &[runsbx_proxy::Secret],
) -> Result<runsbx_proxy::ProxyConfig> {
    let allow = runsbx_proxy::Allowlist::parse(&plan.allow)
        .map_err(|e| RuntimeError::invalid("the egress allowlist", e.to_string()))?;
    let mut config = runsbx_proxy::ProxyConfig::new(allow);
    config.hosts = plan.resolve.clone().into_iter().collect();
    config.allow_addresses = plan.allow_addresses.clone();
    config.inspect = inspection.map(|i| i.tls);
    config.secrets = secrets.to_vec();
    config.learn = plan.learn.is_some();
    Ok(config)
}

/// Whether the proxy must read HTTPS requests: when `plan` lets some host
/// through for some requests only, and in learn mode, to learn them.
pub fn inspects(plan: &EgressPlan) -> bool {
    plan.learn.is_some()
        || plan
            .allow
            .iter()
            .any(|e| Entry::parse(e).is_ok_and(|e| e.rule.is_some()))
}

/// TLS inspection, made for one sandbox: the CA the proxy mints its
/// certificates with (its key only in memory, ending with the proxy) and
/// the trust bundle the sandbox gets: the image's own CAs and this CA.
pub struct Inspection {
    pub tls: Arc<runsbx_proxy::Inspection>,
    /// The bundle, in the sandbox's private state (`dir`).
    pub bundle: PathBuf,
}

impl Inspection {
    /// Reads the image's CA bundle (from the rootfs of the hardened
    /// `spec`), makes the CA and the upstream trust, and writes the
    /// sandbox's bundle into `dir`. `None` for an image without a bundle
    /// (busybox, distroless): its TLS clients trust nothing to add a CA
    /// to, so nothing is inspected, and the proxy refuses the HTTPS of
    /// hosts that rules narrow while it still judges their plain HTTP.
    pub fn prepare(dir: &Path, spec: &Spec, plan: &EgressPlan) -> Result<Option<Self>> {
        let image_cas = match image_bundle(spec) {
            Ok(cas) => cas,
            Err(reason) => {
                let rules: Vec<&str> = plan
                    .allow
                    .iter()
                    .filter(|e| Entry::parse(e).is_ok_and(|e| e.rule.is_some()))
                    .map(String::as_str)
                    .collect();
                tracing::warn!(
                    "{reason}: HTTPS is not inspected, so the proxy refuses the tunnels of hosts \
                     that rules narrow ({}) and cannot put secrets in HTTPS requests; install \
                     ca-certificates in the image to have them inspected",
                    rules.join("; ")
                );
                return Ok(None);
            }
        };
        let tls_err = |e: runsbx_proxy::TlsError| {
            RuntimeError::invalid("the egress proxy's TLS inspection", e.to_string())
        };
        let tls = runsbx_proxy::Inspection::new().map_err(tls_err)?;
        let mut bundle = image_cas;
        if !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(tls.ca.certificate_pem().as_bytes());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| RuntimeError::io(format!("create {dir:?}"), e))?;
        let path = dir.join(TRUST_FILE);
        // Certificates only, no key: readable by the sandbox's ids.
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&path)
            .and_then(|mut f| f.write_all(&bundle))
            .map_err(|e| {
                RuntimeError::io(format!("write the sandbox's trust bundle {path:?}"), e)
            })?;
        Ok(Some(Self {
            tls: Arc::new(tls),
            bundle: path,
        }))
    }
}

/// The trust bundle's file name in the sandbox's state.
const TRUST_FILE: &str = "trust.pem";

/// The CA bundle of the image at `spec`'s rootfs, read without following
/// a link (an image's link could name a host file).
fn image_bundle(spec: &Spec) -> std::result::Result<Vec<u8>, String> {
    let rootfs = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or("the spec has no root")?;
    let dir = fs::File::open(&rootfs).map_err(|e| format!("its rootfs {rootfs:?}: {e}"))?;
    let rel = runsbx_policy::TRUST_BUNDLE.trim_start_matches('/');
    let fd = crate::sys::beneath::open(dir.as_fd(), Path::new(rel), libc::O_RDONLY)
        .map_err(|e| format!("the image has no {} ({e})", runsbx_policy::TRUST_BUNDLE))?;
    let mut file = fs::File::from(fd);
    let mut out = Vec::new();
    // A bundle of every public CA is about 200 KiB; 16 MiB is no bundle.
    (&mut file)
        .take(16 << 20)
        .read_to_end(&mut out)
        .map_err(|e| format!("{}: {e}", runsbx_policy::TRUST_BUNDLE))?;
    Ok(out)
}

/// Checks the syntax of a profile's egress allowlist when it is loaded,
/// so that a bad entry is reported against the profile, before anything
/// is made.
pub fn check_profile(profile: &Profile, origin: &str) -> Result<()> {
    runsbx_proxy::Allowlist::parse(&profile.egress.allow).map_err(|e| {
        RuntimeError::invalid(
            format!("profile `{}` ({origin}): egress allow", profile.name),
            e.to_string(),
        )
    })?;
    match &profile.egress.learn {
        Some(dir) if !dir.is_absolute() => Err(RuntimeError::invalid(
            format!(
                "profile `{}` ({origin}): egress learn {dir:?}",
                profile.name
            ),
            "is not an absolute path: name the directory learn records are written to",
        )),
        _ => Ok(()),
    }
}
