//! runsbx-policy: the sandbox policy as a pure function.
//!
//! `harden(spec, profile, host)` rewrites an OCI spec so that it gives the
//! container no more than the profile allows, and says what it changed and
//! which isolation layers are in force. `verify` checks the result again,
//! independently, right before launch. Nothing here performs I/O: whatever
//! depends on the host is probed by the runtime into [`HostFacts`].
#![forbid(unsafe_code)]

pub mod annotations;
pub mod harden;
pub mod profile;
pub mod seccomp;
pub mod verify;

use serde::Serialize;

pub use harden::{harden, harden_exec, is_bind_mount};
pub use profile::{OperatorConfig, Profile};
pub use verify::verify;

/// What the runtime found out about the host before hardening.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// runsbx runs without real root (an unprivileged user, or inside a
    /// user namespace such as rootless podman's).
    pub rootless: bool,
    /// The ids runsbx runs as, in its current user namespace.
    pub uid: u32,
    pub gid: u32,
    /// As real root: the host id range allocated to this sandbox.
    pub id_range: Option<IdRange>,
    /// The kernel lets runsbx create user namespaces.
    pub user_namespaces: bool,
    /// The kernel has seccomp filters.
    pub seccomp: bool,
    /// runsbx can put the container in a cgroup and apply limits there.
    pub cgroups: bool,
    /// procfs takes `subset=pid` (Linux 5.8+).
    pub proc_subset: bool,
    /// For `runsbx call`: a directory the runtime made for this sandbox
    /// alone, a fresh tmpfs of the profile's `/workspace` size, holding the
    /// call's inputs. It is bound read-write at `/workspace` in place of the
    /// profile's tmpfs, so that inputs can be put in and outputs taken out
    /// from the host side. Never set from a spec or an annotation.
    pub call_workspace: Option<std::path::PathBuf>,
}

/// A range of host ids: `size` ids from `base`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct IdRange {
    pub base: u32,
    pub size: u32,
}

/// One rewrite of the spec, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub field: String,
    pub reason: String,
}

/// One isolation layer, and whether it is in force for this container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layer {
    pub layer: &'static str,
    pub in_force: bool,
    pub detail: String,
}

/// The hardened spec, what was changed, and the layers in force.
#[derive(Debug, Clone)]
pub struct Hardened {
    pub spec: oci_spec::runtime::Spec,
    pub changes: Vec<Change>,
    pub attestation: Vec<Layer>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("{what} is refused by profile `{profile}` (a profile allows it with `{key}`)")]
    Refused {
        what: String,
        profile: String,
        key: String,
    },
    #[error("{layer} is required but this host cannot provide it: {hint}")]
    HostMissing { layer: &'static str, hint: String },
    #[error("profile {origin}: {reason}")]
    Profile { origin: String, reason: String },
    #[error("annotation {key}={value:?}: {reason}")]
    Annotation {
        key: String,
        value: String,
        reason: String,
    },
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("hardened spec fails verification: {0}")]
    Verify(String),
    #[error("internal policy error: {0}")]
    Internal(String),
}
