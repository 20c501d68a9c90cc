//! Applying runsbx-policy: load the operator config and profile, probe the
//! host into `HostFacts`, allocate the sandbox's id range, then harden and
//! verify. The policy itself is pure; this is the I/O around it.

use std::fs;
use std::path::Path;

use libcontainer::oci_spec::runtime::Spec;
use nix::unistd::{Gid, Uid};
use runsbx_policy::{
    annotations::{self, ProfileAsker},
    harden, harden_with, verify, Hardened, HostFacts, IdRange, OperatorConfig, Overrides, Profile,
};

use crate::error::{Result, RuntimeError};
use crate::sys::privilege;

/// The operator config read when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "/etc/runsbx/config.toml";

/// The operator config and the profile it picks.
#[derive(Debug, Clone)]
pub struct Policy {
    pub config: OperatorConfig,
    pub profile: Profile,
}

impl Policy {
    /// Loads `path`, or the default config when it exists, or built-in
    /// defaults.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        let (text, origin) = match path {
            Some(p) => (
                fs::read_to_string(p)
                    .map_err(|e| RuntimeError::io(format!("read --config {p:?}"), e))?,
                p.display().to_string(),
            ),
            None => match fs::read_to_string(DEFAULT_CONFIG) {
                Ok(text) => (text, DEFAULT_CONFIG.to_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    (String::new(), "built-in defaults".to_owned())
                }
                Err(e) => return Err(RuntimeError::io(format!("read {DEFAULT_CONFIG}"), e)),
            },
        };
        let config = OperatorConfig::from_toml(&text, &origin)?;
        let profile = load_profile(&config, &config.profile)?;
        Ok(Self { config, profile })
    }

    /// The profile for a spec: the operator's, or a stricter one its
    /// `runsbx.profile` annotation picks.
    pub fn profile_for(&self, spec: &Spec) -> Result<Profile> {
        let requested = spec
            .annotations()
            .as_ref()
            .and_then(|a| a.get(annotations::PROFILE));
        self.choose(requested.map(String::as_str), ProfileAsker::Annotation)
    }

    /// The operator's profile, or the stricter selectable one a caller's
    /// `--profile` names.
    pub fn profile_named(&self, requested: Option<&str>) -> Result<Profile> {
        self.choose(requested, ProfileAsker::Flag)
    }

    fn choose(&self, requested: Option<&str>, asker: ProfileAsker) -> Result<Profile> {
        annotations::choose_profile(
            requested,
            asker,
            &self.config,
            self.profile.clone(),
            |name| load_profile(&self.config, name),
        )
    }
}

fn load_profile(config: &OperatorConfig, name: &str) -> Result<Profile> {
    if name == "default" {
        return Ok(Profile::builtin()?);
    }
    let (profile, path) = read_profile(config, name)?;
    crate::sandbox::egress::check_profile(&profile, &path.display().to_string())?;
    Ok(profile)
}

fn read_profile(config: &OperatorConfig, name: &str) -> Result<(Profile, std::path::PathBuf)> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !valid {
        return Err(RuntimeError::invalid(
            format!("profile name {name:?}"),
            "use letters, digits, - and _",
        ));
    }
    let path = config.profiles_dir.join(format!("{name}.toml"));
    let text = fs::read_to_string(&path).map_err(|e| {
        RuntimeError::io(
            format!("read profile `{name}` at {path:?} (profiles_dir in the operator config)"),
            e,
        )
    })?;
    let profile = Profile::from_toml(&text, &path.display().to_string())?;
    Ok((profile, path))
}

/// What this host gives, as the policy needs to know it.
pub fn host_facts(id_range: Option<IdRange>) -> HostFacts {
    let cgroups = privilege::can_manage_cgroups();
    HostFacts {
        rootless: privilege::rootless(),
        uid: Uid::effective().as_raw(),
        gid: Gid::effective().as_raw(),
        id_range,
        user_namespaces: user_namespaces_enabled(),
        // Built with libcontainer's libseccomp feature; the kernel side:
        seccomp: fs::read_to_string("/proc/self/status").is_ok_and(|s| s.contains("\nSeccomp:")),
        cgroups,
        swap_limit: cgroups && crate::sys::cgroup_attach::swap_accounting(),
        proc_subset: kernel_at_least(5, 8),
        call_workspace: None,
        seccomp_listener: None,
        session: false,
        rootfs_container_layer: false,
        pod: None,
        rootless_ids: crate::sys::userns::rootless_ids(),
        trust_bundle: None,
        engine_binds: Vec::new(),
    }
}

fn user_namespaces_enabled() -> bool {
    let read = |p: &str| {
        fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    read("/proc/sys/user/max_user_namespaces").is_some_and(|n| n > 0)
        && (!privilege::rootless()
            || privilege::in_user_namespace()
            || read("/proc/sys/kernel/unprivileged_userns_clone").is_none_or(|v| v == 1))
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(uname) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uname.release().to_string_lossy().into_owned();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// What the runtime made for one sandbox that its hardened spec binds or
/// points at; all `None` for an engine's container.
#[derive(Default, Clone, Copy)]
pub struct Provisions<'a> {
    /// A call's workspace, bound at /workspace.
    pub workspace: Option<&'a crate::sandbox::workspace::Workspace>,
    /// Where a call's seccomp denials are reported.
    pub seccomp_listener: Option<&'a Path>,
    /// The trust bundle of its TLS inspection.
    pub trust_bundle: Option<&'a Path>,
    /// The host's facts ([`host_facts`]), when the caller has them already:
    /// a warm sandbox checks each request against the host it was built
    /// on, in the same process, and reading them costs a dozen files.
    pub host: Option<&'a HostFacts>,
}

/// Hardens and verifies `spec` for container `id`, tightened by its
/// annotations or, for a call, by the typed `overrides` of its options,
/// with what the runtime `made` for it.
pub fn apply(
    policy: &Policy,
    spec: Spec,
    id_range: Option<IdRange>,
    made: Provisions<'_>,
    pod: Option<runsbx_policy::PodJoin>,
    overrides: Option<&Overrides>,
) -> Result<Hardened> {
    let call_workspace = made.workspace;
    let host = HostFacts {
        call_workspace: call_workspace.map(|w| w.dir.clone()),
        trust_bundle: made.trust_bundle.map(Path::to_path_buf),
        seccomp_listener: made.seccomp_listener.map(Path::to_path_buf),
        session: call_workspace.is_some_and(|w| w.is_session()),
        // Only a rootfs the spec asks to write needs the probe (a read of
        // mountinfo): a call's, and most, are read-only anyway.
        rootfs_container_layer: spec.root().as_ref().and_then(|r| r.readonly()) != Some(true)
            && crate::sys::layers::is_container_layer(&spec),
        pod,
        engine_binds: crate::sandbox::engine_binds::of(&spec),
        id_range,
        ..match made.host {
            Some(host) => host.clone(),
            None => host_facts(id_range),
        }
    };
    let (hardened, profile) = match overrides {
        Some(overrides) => {
            let profile = policy.profile_named(overrides.profile.as_deref())?;
            let hardened = harden_with(spec, &profile, &host, overrides);
            (hardened, profile)
        }
        None => {
            let profile = policy.profile_for(&spec)?;
            (harden(spec, &profile, &host), profile)
        }
    };
    let hardened = hardened?;
    verify(&hardened.spec, &profile, &host)?;
    Ok(hardened)
}
