//! `harden`: one module per kernel concern, applied in the order below.

mod egress;
mod mounts;
mod namespaces;
mod proc;
mod process;
mod reject;
mod resources;
mod seccomp;
mod supervision;
mod userns;

use oci_spec::runtime::Spec;

pub use egress::{proxy_env, trust_env, EgressPlan, Learn, PROXY_PORT};
pub use mounts::is_bind as is_bind_mount;
pub use mounts::TRUST_BUNDLE;
pub(crate) use mounts::{
    engine_bind_in, is_trust_bundle, ENGINE_FILES, TRUST_OPTIONS, WORKSPACE, WORKSPACE_OPTIONS,
};
pub(crate) use namespaces::REQUIRED as REQUIRED_NAMESPACES;
pub(crate) use process::rlimits_of;
pub(crate) use reject::{cgroups_path_problem, has_hooks};
pub use resources::bound_update;
pub(crate) use resources::{deny_every_device, max_quota, PERIOD as CPU_PERIOD};

use crate::annotations::Overrides;
use crate::{Change, Hardened, HostFacts, Layer, PolicyError, Profile};

/// Rewrites `spec` so that it gives the container no more than `profile`
/// allows on this host, tightened by the spec's `runsbx.*` annotations. It
/// never widens: running it on its own output changes nothing.
pub fn harden(spec: Spec, profile: &Profile, host: &HostFacts) -> Result<Hardened, PolicyError> {
    crate::bounds::check(&spec)?; // sizes, before any work in proportion to them
    let overrides = Overrides::from_annotations(spec.annotations().as_ref())?;
    apply_all(spec, profile, host, overrides)
}

/// [`harden`], tightened by `overrides` given typed (a `runsbx call`'s
/// options) instead of read from the spec's annotations.
pub fn harden_with(
    spec: Spec,
    profile: &Profile,
    host: &HostFacts,
    overrides: &Overrides,
) -> Result<Hardened, PolicyError> {
    crate::bounds::check(&spec)?; // sizes, before any work in proportion to them
    apply_all(spec, profile, host, overrides.clone())
}

/// The order of containment.
fn apply_all(
    spec: Spec,
    profile: &Profile,
    host: &HostFacts,
    overrides: Overrides,
) -> Result<Hardened, PolicyError> {
    let mut cx = Cx::new(spec, profile, host, overrides);
    reject::apply(&mut cx)?; // cgroup path, hooks, extra devices
    namespaces::apply(&mut cx)?; // every namespace new; no joins; loopback-only network
    let egress = egress::apply(&mut cx)?; // out only through the allowlist proxy
    userns::apply(&mut cx)?; // container root = caller (rootless) or an unprivileged range
    mounts::apply(&mut cx)?; // read-only image, capped tmpfs, no host binds
    proc::apply(&mut cx)?; // fresh procfs, subset=pid, masked paths
    process::apply(&mut cx)?; // no capabilities, no_new_privs, rlimits
    seccomp::apply(&mut cx)?; // the allowlist
    resources::apply(&mut cx)?; // cgroup memory and pids limits
    let deadline = supervision::apply(&mut cx)?; // the wall-clock deadline
    Ok(Hardened {
        spec: cx.spec,
        changes: cx.changes,
        attestation: cx.attestation,
        deadline,
        egress,
        unshifted_rootfs: profile.unshifted_rootfs,
        tmpcopyup: cx.tmpcopyup,
        engine_volumes: cx.engine_volumes,
    })
}

/// Hardens a process exec'd into a container whose (hardened) spec is
/// `container`: the same capabilities, no_new_privileges and rlimits as the
/// container's own process, and a user its namespace maps.
pub fn harden_exec(
    container: &Spec,
    process: oci_spec::runtime::Process,
    profile: &Profile,
    host: &HostFacts,
) -> Result<oci_spec::runtime::Process, PolicyError> {
    crate::bounds::check_process(&process)?;
    let overrides = Overrides::from_annotations(container.annotations().as_ref())?;
    let mut spec = container.clone();
    spec.set_process(Some(process));
    let mut cx = Cx::new(spec, profile, host, overrides);
    process::apply(&mut cx)?;
    userns::check_mapped(&cx)?;
    cx.spec
        .process()
        .clone()
        .ok_or_else(|| PolicyError::Internal("process vanished".to_owned()))
}

/// The state one hardening pass works on.
pub(crate) struct Cx<'a> {
    pub spec: Spec,
    pub profile: &'a Profile,
    pub host: &'a HostFacts,
    /// What the caller asked beyond the spec, only to tighten.
    pub overrides: Overrides,
    pub changes: Vec<Change>,
    pub attestation: Vec<Layer>,
    /// tmpfs destinations to fill with the image's content.
    pub tmpcopyup: Vec<std::path::PathBuf>,
    /// Destinations of the engine's named volumes the profile allowed.
    pub engine_volumes: Vec<std::path::PathBuf>,
}

impl<'a> Cx<'a> {
    fn new(spec: Spec, profile: &'a Profile, host: &'a HostFacts, overrides: Overrides) -> Self {
        Self {
            spec,
            profile,
            host,
            overrides,
            changes: Vec::new(),
            attestation: Vec::new(),
            tmpcopyup: Vec::new(),
            engine_volumes: Vec::new(),
        }
    }

    pub fn change(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.changes.push(Change {
            field: field.into(),
            reason: reason.into(),
        });
    }

    pub fn attest(&mut self, layer: &'static str, in_force: bool, detail: impl Into<String>) {
        self.attestation.push(Layer {
            layer,
            in_force,
            detail: detail.into(),
        });
    }

    pub fn refused(&self, what: impl Into<String>, key: impl Into<String>) -> PolicyError {
        PolicyError::Refused {
            what: what.into(),
            profile: self.profile.name.clone(),
            key: key.into(),
        }
    }

    /// The spec's `linux` section, created when missing.
    pub fn linux(&mut self) -> &mut oci_spec::runtime::Linux {
        self.spec.linux_mut().get_or_insert_with(Default::default)
    }
}

#[cfg(test)]
pub(crate) mod tests;
