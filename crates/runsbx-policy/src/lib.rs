//! runsbx-policy: the sandbox policy as a pure function.
//!
//! `harden(spec, profile, host)` rewrites an OCI spec so that it gives the
//! container no more than the profile allows, and says what it changed and
//! which isolation layers are in force. `verify` checks the result again,
//! independently, right before launch. Nothing here performs I/O: whatever
//! depends on the host is probed by the runtime into [`HostFacts`].
#![forbid(unsafe_code)]

pub mod annotations;
pub mod bounds;
pub mod harden;
pub mod profile;
pub mod request_rule;
pub mod seccomp;
pub mod suggest;
pub mod verify;

use serde::Serialize;

pub use annotations::{EgressOverride, Overrides};
pub use harden::{
    bound_update, harden, harden_exec, harden_with, is_bind_mount, proxy_env, trust_env,
    EgressPlan, Learn, PROXY_PORT, TRUST_BUNDLE,
};
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
    /// The memory cgroup can limit swap too: the kernel keeps swap
    /// accounts (cgroup v1's `memory.memsw.*` files, cgroup v2's
    /// `memory.swap.max`). A memory limit then bounds memory and swap
    /// together; without, a sandbox on a host with swap can page out past
    /// its limit.
    pub swap_limit: bool,
    /// procfs takes `subset=pid` (Linux 5.8+).
    pub proc_subset: bool,
    /// For `runsbx call`: a directory the runtime made for this sandbox
    /// alone, a fresh tmpfs of the profile's `/workspace` size, holding the
    /// call's inputs. It is bound read-write at `/workspace` in place of the
    /// profile's tmpfs, so that inputs can be put in and outputs taken out
    /// from the host side. Never set from a spec or an annotation.
    pub call_workspace: Option<std::path::PathBuf>,
    /// For a sandbox whose maker serves its seccomp denials (`runsbx
    /// call`): the unix socket runsbx listens on, in its private state for
    /// this sandbox alone. The filter then reports each denial there (see
    /// [`seccomp::reporting`]). Never set from a spec or an annotation.
    pub seccomp_listener: Option<std::path::PathBuf>,
    /// The call runs in a session: `call_workspace` is the session's own
    /// (it persists), and a writable rootfs is the session's own layer over
    /// the image, on its own disk. Never set from a spec or an annotation.
    pub session: bool,
    /// The rootfs is an engine's per-container layer: an overlay mount whose
    /// upper directory the engine made for this container alone, inside
    /// its own storage (podman's, docker's, containerd's overlay drivers),
    /// so that writes land there and in no other host file. Probed by the
    /// runtime from mountinfo; never set from a spec or an annotation.
    pub rootfs_container_layer: bool,
    /// For a container of a Kubernetes pod: the namespaces of the pod's
    /// sandbox container the runtime verified it may join. Never set from
    /// a spec or an annotation.
    pub pod: Option<PodJoin>,
    /// Rootless, in a user namespace: the ids that namespace maps, which a
    /// sandbox may map too. `None` outside one: only `uid`/`gid`.
    pub rootless_ids: Option<RootlessIds>,
    /// Bind mounts the runtime found to be an engine's own: its init, or a
    /// named volume in its storage. Never set from a spec or an annotation.
    pub engine_binds: Vec<EngineBind>,
    /// When the sandbox's egress inspects TLS: the trust bundle the runtime
    /// made for this sandbox alone (the image's own CAs and the sandbox's
    /// inspection CA), bound read-only at [`TRUST_BUNDLE`] with the
    /// variables that point TLS clients at it. Never set from a spec or an
    /// annotation.
    pub trust_bundle: Option<std::path::PathBuf>,
}

/// A bind mount of the spec (its destination and source, as the spec
/// gives them) and what the runtime found its source to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineBind {
    pub destination: std::path::PathBuf,
    pub source: std::path::PathBuf,
    pub kind: EngineBindKind,
}

impl EngineBind {
    /// Whether `m` is this bind: the same destination and source (another
    /// bind at the same destination is not vouched for).
    pub fn is(&self, m: &oci_spec::runtime::Mount) -> bool {
        self.destination == *m.destination() && m.source().as_ref() == Some(&self.source)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineBindKind {
    /// A single regular file owned by root (rootless: by the caller) that
    /// no one else may write: a system binary such as an engine's init.
    SystemFile,
    /// A directory `<storage>/volumes/<name>/_data` of the engine storage
    /// that holds the container's rootfs, where no other user may enter.
    Volume,
}

/// The ids of the user namespace a rootless runsbx runs in: the caller's
/// own and, where the system's `newuidmap`/`newgidmap` gave them (rootless
/// podman's namespace, or runsbx's own), the caller's subordinate ids from
/// `/etc/subuid` and `/etc/subgid`. Each is an unprivileged host id that
/// the caller already owns; host root is never among them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RootlessIds {
    /// Ranges of that namespace's own uids and gids (`base` is an id as
    /// runsbx sees it).
    pub uids: Vec<IdRange>,
    pub gids: Vec<IdRange>,
    /// The namespace is an engine's (rootless podman runs its runtime in
    /// its own), so a spec's id mappings name its ids and are kept when
    /// they fit in it (`--userns keep-id`). Otherwise runsbx made it, a
    /// spec's mappings name host ids, and the sandbox gets the whole of it.
    pub engines: bool,
}

/// What the runtime verified about the pod a container belongs to: each
/// namespace path the spec names is a namespace of the pod's live sandbox
/// container in runsbx's own state root, and none is the host's. The
/// runtime holds each namespace open while the container is created and
/// gives the path it is held at (`pinned`), so that what is joined is what
/// was verified, even if the sandbox's pid is reused meanwhile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodJoin {
    /// The pod sandbox container's id.
    pub sandbox: String,
    pub namespaces: Vec<PodNamespace>,
    /// The sandbox's user namespace (joined by every container of the
    /// pod, so that its other namespaces can be joined) and its mappings.
    pub user_namespace: std::path::PathBuf,
    pub uid_mappings: Vec<oci_spec::runtime::LinuxIdMapping>,
    pub gid_mappings: Vec<oci_spec::runtime::LinuxIdMapping>,
}

/// One verified namespace of a pod's sandbox container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodNamespace {
    pub typ: oci_spec::runtime::LinuxNamespaceType,
    /// The path as the spec gives it.
    pub path: std::path::PathBuf,
    /// Where the runtime holds that namespace open.
    pub pinned: std::path::PathBuf,
}

/// The annotations by which containerd's CRI plugin and CRI-O mark a pod's
/// sandbox (pause) container.
pub fn is_pod_sandbox(spec: &oci_spec::runtime::Spec) -> bool {
    spec.annotations().as_ref().is_some_and(|a| {
        a.get("io.kubernetes.cri.container-type")
            .or_else(|| a.get("io.kubernetes.cri-o.ContainerType"))
            .is_some_and(|t| t == "sandbox")
    })
}

/// A range of ids: `size` ids from `base` (host ids, unless said).
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
    /// When the runtime kills the whole sandbox, counted from create.
    pub deadline: Option<std::time::Duration>,
    /// What the sandbox's egress proxy lets through; `None`: no egress.
    pub egress: Option<EgressPlan>,
    /// As root, an engine's rootfs may be bound without id shifting where
    /// the kernel cannot show it with its owners (the profile's
    /// `unshifted_rootfs`).
    pub unshifted_rootfs: bool,
    /// tmpfs mounts that asked for `tmpcopyup` (the option is removed from
    /// the spec): the runtime copies the image's content at each of these
    /// destinations into the new tmpfs before the process starts.
    pub tmpcopyup: Vec<std::path::PathBuf>,
    /// The bind mounts that are the engine's named volumes (destinations):
    /// as root the runtime binds them idmapped into the sandbox's range,
    /// so that what the engine's root owns is container root's.
    pub engine_volumes: Vec<std::path::PathBuf>,
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
