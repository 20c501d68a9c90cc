//! `create`: a container's namespaces and root exist, hardened, and its
//! process waits for `start`. The order of the steps is [`build_from`].

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};
use libcontainer::syscall::syscall::SyscallType;

use crate::error::{Result, RuntimeError};
use crate::policy::{self, Policy};
use crate::sandbox::teardown::{destroy, release_host_side};
use crate::sandbox::{egress, supervisor};
use crate::state::container::{init_pid, op_err, owner, runsbx_cgroup_path, stage_key};
use crate::state::ids;
use crate::state::root::{IdLock, StateRoot};
use crate::state::{bundle, cgroup_claim};
use crate::sys::{cgroupless, netns, privilege, stage, userns};

/// What a create built: the container, the spec it runs (hardened, staged)
/// and the policy's attestation, so that nobody reads them back from disk.
pub(crate) struct Built {
    pub container: Container,
    pub spec: Spec,
    pub attestation: Vec<runsbx_policy::Layer>,
}

/// What `create` and `run` are given besides the id.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub bundle: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub preserve_fds: i32,
    pub no_pivot: bool,
    /// The operator config (`--config`); /etc/runsbx/config.toml otherwise.
    pub config: Option<PathBuf>,
}

/// Creates container `id`: its namespaces and root exist, its process waits
/// for `start`.
pub fn create(root: &StateRoot, id: &str, opts: &CreateOptions) -> Result<()> {
    userns::reexec_in_own_userns()?;
    let lock = root.lock(id)?;
    build(root, id, opts, true, &lock)?;
    Ok(())
}

pub(crate) fn build(
    root: &StateRoot,
    id: &str,
    opts: &CreateOptions,
    detach: bool,
    lock: &IdLock,
) -> Result<Built> {
    if root.container_dir(id).exists() {
        return Err(RuntimeError::Exists { id: id.to_owned() });
    }
    let source = bundle::load(&opts.bundle)?;
    bundle::check_rootfs("root.path", &source.rootfs, root.path())?;
    let policy = Policy::load(opts.config.as_deref())?;
    build_or_clean(root, id, &source, opts, detach, &policy, None, lock)
}

/// What `runsbx call` adds to a create: the container's stdio, the
/// workspace it made, and a step between hardening and building (to give
/// the workspace to the sandbox's root).
pub(crate) struct CallParts<'a> {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    pub workspace: Option<&'a Path>,
    /// The call's options the policy tightens the profile by.
    pub overrides: &'a runsbx_policy::Overrides,
    pub prepare: &'a mut dyn FnMut(&Spec) -> Result<()>,
}

/// Creates the container of a `runsbx call` from a spec made in memory
/// (`source.dir` is the call's own directory).
pub(crate) fn create_for_call(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    policy: &Policy,
    parts: CallParts<'_>,
    lock: &IdLock,
) -> Result<Built> {
    let opts = CreateOptions::default();
    build_or_clean(root, id, source, &opts, false, policy, Some(parts), lock)
}

#[allow(clippy::too_many_arguments)]
fn build_or_clean(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    opts: &CreateOptions,
    detach: bool,
    policy: &Policy,
    call: Option<CallParts<'_>>,
    _lock: &IdLock,
) -> Result<Built> {
    let result = build_from(root, id, source, opts, detach, policy, call);
    if result.is_err() {
        // libcontainer cleans up after most failures; make sure no state,
        // staged mount, id range or process outlives a failed create.
        if root.exists(id) {
            if let Ok(mut c) = Container::load(root.container_dir(id)) {
                let _ = destroy(root, &mut c);
            }
        }
        let dir = root.container_dir(id);
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let _ = release_host_side(root, id);
    }
    result
}

/// The order of a create. Each record is written before the resource it
/// names exists (docs/architecture.md, "What a create does").
fn build_from(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    opts: &CreateOptions,
    detach: bool,
    policy: &Policy,
    mut call: Option<CallParts<'_>>,
) -> Result<Built> {
    // A pod's container joins its sandbox's namespaces, verified here and
    // held open until it is built.
    let pod = crate::sandbox::pod::verify(root, &source.spec)?;
    let range = host_ids(root, id, policy, pod.as_ref())?;
    let (hardened, egress) = harden(id, source, policy, range, pod.as_ref(), call.as_ref())?;
    let report = serde_json::json!({
        "changes": hardened.changes,
        "attestation": hardened.attestation,
    });
    // A call supervises its own sandbox (proxy, deadline).
    let deadline = hardened.deadline.filter(|_| call.is_none());
    let attestation = hardened.attestation;
    let mut spec = hardened.spec;
    privilege::check_rlimits(&spec)?;
    if let Some(range) = range {
        stage::prepare(&stage_key(root, id), range, &mut spec)?;
    }
    let shadow = claim_cgroup(root, id, &mut spec, call.is_none())?;
    // Rootless, in the private mount namespace the shadow made: the image
    // as a filesystem of its own, as stage::prepare makes it as root.
    let view = match shadow {
        Some(_) if privilege::rootless() => {
            stage::private_view(&bundle::Effective::path(root, id), &mut spec)?
        }
        _ => None,
    };
    let effective = bundle::Effective::write(root, id, &source.dir, &spec, &report)?;
    if let Some(call) = call.as_mut() {
        (call.prepare)(&spec)?;
    }
    let mut container = libcontainer_build(root, id, opts, detach, &effective, call)?;
    if let Some(shadow) = shadow {
        shadow.leave()?;
    }
    // The container's mount namespace holds its own copy.
    drop(view);
    effective.without_init_groups(&spec)?;
    let init = init_pid(&container)?;
    let proxy = network_up(init, &spec, egress)?;
    // Inside runsbx's own user namespace the creator looks like root.
    container.set_creator(userns::caller_uid());
    container
        .save()
        .map_err(|e| op_err("save state of", id, e))?;
    // Last, so that at its deadline the supervisor finds the saved state.
    supervisor::spawn(root, id, init, supervisor::Duties { proxy, deadline })?;
    Ok(Built {
        container,
        spec,
        attestation,
    })
}

/// As real root, the sandbox's ids are an unprivileged range of its own,
/// recorded before anything else (a pod's containers share their
/// sandbox's); rootless, the caller's own.
fn host_ids(
    root: &StateRoot,
    id: &str,
    policy: &Policy,
    pod: Option<&crate::sandbox::pod::Verified>,
) -> Result<Option<runsbx_policy::IdRange>> {
    if privilege::rootless() {
        return Ok(None);
    }
    if let Some(pod) = pod {
        return pod.range.map(Some).ok_or_else(|| {
            RuntimeError::invalid(
                format!("pod sandbox `{}`", pod.join.sandbox),
                "its user namespace maps no id range of runsbx's",
            )
        });
    }
    let (slot, range) = ids::allocate_id_range(&policy.config, &owner(root, id))?;
    if let Err(e) = bundle::Effective::record_slot(root, id, slot) {
        ids::release_id_range(slot);
        return Err(e);
    }
    Ok(Some(range))
}

/// The policy applied to the bundle (pure: hardened and verified), with
/// the egress the profile gives a container (a call brings its own proxy).
fn harden(
    id: &str,
    source: &bundle::Bundle,
    policy: &Policy,
    range: Option<runsbx_policy::IdRange>,
    pod: Option<&crate::sandbox::pod::Verified>,
    call: Option<&CallParts<'_>>,
) -> Result<(runsbx_policy::Hardened, Option<runsbx_proxy::ProxyConfig>)> {
    let mut input = bundle::absolutize(source);
    let egress = match call {
        Some(_) => None,
        None => egress::config_for(&input, &policy.profile_for(&input)?)?,
    };
    if egress.is_some() {
        egress::add_proxy_env(&mut input);
    }
    let workspace = call.and_then(|c| c.workspace);
    let pod_join = pod.map(|p| p.join.clone());
    let overrides = call.map(|c| c.overrides);
    let hardened = policy::apply(policy, input, range, workspace, pod_join, overrides)?;
    bundle::check_cwd(source, &hardened.spec)?;
    // Said once, when the sandbox is made (not at each start or exec).
    for change in &hardened.changes {
        if change.field == "linux.namespaces.network" {
            tracing::warn!(id, "{}", change.reason);
        }
    }
    Ok((hardened, egress))
}

/// As root, claims the sandbox's cgroup (recorded first); where runsbx
/// cannot make cgroups, drops what needs one (`warn`: say so in the log; a
/// call says it in its result) and enters the cgroup shadow.
fn claim_cgroup(
    root: &StateRoot,
    id: &str,
    spec: &mut Spec,
    warn: bool,
) -> Result<Option<cgroupless::Shadow>> {
    if !privilege::can_manage_cgroups() {
        let fake = without_cgroups(spec, id, warn);
        return cgroupless::enter_for_create(&fake).map(Some);
    }
    default_cgroup_path(spec, root, id);
    if let Some(cgroup) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) {
        bundle::Effective::record_cgroup(root, id, &cgroup)?;
        cgroup_claim::claim(&cgroup, &owner(root, id))?;
    }
    Ok(None)
}

/// libcontainer builds the container from the effective bundle: its
/// namespaces, rootfs and init, waiting for `start`.
fn libcontainer_build(
    root: &StateRoot,
    id: &str,
    opts: &CreateOptions,
    detach: bool,
    effective: &bundle::Effective,
    call: Option<CallParts<'_>>,
) -> Result<Container> {
    let mut builder = ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(root.path())
        .and_then(|b| b.with_pid_file(opts.pid_file.as_ref()))
        .map(|b| {
            b.with_console_socket(opts.console_socket.as_ref())
                .with_preserved_fds(opts.preserve_fds)
        });
    if let Some(call) = call {
        builder = builder.map(|b| {
            b.with_stdin(call.stdin)
                .with_stdout(call.stdout)
                .with_stderr(call.stderr)
        });
    }
    builder
        .map(|b| {
            b.as_init(&effective.dir)
                // runsbx never drives systemd; cgroupfs directly.
                .with_systemd(false)
                .with_detach(detach)
                .with_no_pivot(opts.no_pivot)
        })
        .and_then(|b| b.build())
        .map_err(|e| op_err("create", id, e))
}

/// In a new network namespace: `lo` up, and the egress proxy's listening
/// socket made inside it for the supervisor (a pod's other containers
/// share this one's network namespace and its proxy).
fn network_up(
    init: nix::unistd::Pid,
    spec: &Spec,
    egress: Option<runsbx_proxy::ProxyConfig>,
) -> Result<Option<(std::net::TcpListener, runsbx_proxy::ProxyConfig)>> {
    if !creates_netns(spec) {
        return Ok(None);
    }
    let own_userns = has_userns(spec);
    netns::loopback_up(init, own_userns)?;
    let Some(config) = egress else {
        return Ok(None);
    };
    Ok(Some((
        netns::listen_in(init, own_userns, egress::PROXY_PORT)?,
        config,
    )))
}

/// Gives a spec without a cgroup path runsbx's (libcontainer's own default
/// is a systemd-style name).
fn default_cgroup_path(spec: &mut Spec, root: &StateRoot, id: &str) {
    let Some(linux) = spec.linux_mut() else {
        return;
    };
    if linux.cgroups_path().is_some() {
        return;
    }
    linux.set_cgroups_path(Some(runsbx_cgroup_path(root, id)));
}

/// What cannot be had without a cgroup is dropped, and said so. Returns
/// the cgroup path libcontainer is given instead: one that exists nowhere
/// on the host (unique per container), so that its `delete` never touches
/// a real cgroup, such as a root container's with the same id.
fn without_cgroups(spec: &mut Spec, id: &str, warn: bool) -> PathBuf {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let fake = PathBuf::from(format!(
        "/runsbx-no-cgroup/{}/{id}-{:016x}",
        userns::caller_uid(),
        h.finish()
    ));
    if let Some(linux) = spec.linux_mut() {
        linux.set_cgroups_path(Some(fake.clone()));
        if warn && linux.resources().is_some() {
            tracing::warn!(
                id,
                "runsbx cannot manage cgroups here (rootless on a cgroup v1 host, or no cgroup \
                 hierarchy): linux.resources is not applied; the container runs under rlimits only"
            );
        }
        linux.set_resources(None);
    }
    if let Some(mounts) = spec.mounts_mut() {
        // A cgroup mount would expose the host's hierarchy names and cannot
        // be made from a user namespace on cgroup v1.
        mounts.retain(|m| m.typ().as_deref() != Some("cgroup"));
    }
    fake
}

/// Whether the spec asks for a new network namespace (not one to join).
fn creates_netns(spec: &Spec) -> bool {
    namespace(spec, LinuxNamespaceType::Network).is_some_and(|path| path.is_none())
}

/// Whether the container is in a user namespace other than ours.
fn has_userns(spec: &Spec) -> bool {
    namespace(spec, LinuxNamespaceType::User).is_some()
}

/// `Some(path)` when the spec lists a namespace of this type.
fn namespace(spec: &Spec, typ: LinuxNamespaceType) -> Option<Option<PathBuf>> {
    spec.linux()
        .as_ref()?
        .namespaces()
        .as_ref()?
        .iter()
        .find(|ns| ns.typ() == typ)
        .map(|ns| ns.path().clone())
}
