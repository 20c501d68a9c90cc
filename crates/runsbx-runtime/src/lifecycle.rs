//! create, start, run, kill, delete, pause, resume.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::error::LibcontainerError;
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, Spec};
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};
use crate::policy::{self, Policy};
use crate::root::{IdLock, StateRoot};
use crate::{
    bundle, cgroup_claim, cgroupless, egress, host, netns, procs, stage, supervise, supervisor,
};

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
    cgroupless::reexec_in_own_userns()?;
    let lock = root.lock(id)?;
    build(root, id, opts, true, &lock)?;
    Ok(())
}

/// Starts a created container.
pub fn start(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = load(root, id)?;
    if !container.can_start() {
        return Err(wrong_state(&container, "start"));
    }
    recheck_network(&container, "start")?;
    container.start().map_err(|e| op_err("start", id, e))
}

/// Holds the sandbox's network namespace to runsbx's promise right before
/// a process runs in it (`when`: start, exec): whatever an engine moved in
/// or configured after `create`, only `lo` is left (see netns.rs), and the
/// attestation says the check ran and what it removed. Sandboxes whose
/// network the profile let them join (not loopback-only) are left alone.
pub(crate) fn recheck_network(container: &Container, when: &str) -> Result<()> {
    let dir = container.bundle();
    let promised = bundle::Effective::report(dir).is_some_and(|r| {
        r["attestation"].as_array().is_some_and(|layers| {
            layers
                .iter()
                .any(|l| l["layer"] == "network_loopback_only" && l["in_force"] == true)
        })
    });
    if !promised {
        return Ok(());
    }
    // A hardened sandbox always has a user namespace (the policy requires
    // one), which owns its network namespace: the helper joins it first.
    let removed = netns::hold_to_loopback(init_pid(container)?, true)?;
    let detail = if removed.is_empty() {
        format!("checked at {when}: only lo")
    } else {
        tracing::warn!(
            id = container.id(),
            "removed from the sandbox's network before {when}: {}; engine networking and \
             published ports are not available in a runsbx sandbox (its network is its own \
             loopback, egress only through runsbx's proxy)",
            removed.join(", ")
        );
        format!(
            "checked at {when}: only lo, after runsbx removed {}",
            removed.join(", ")
        )
    };
    bundle::Effective::attest(
        dir,
        &runsbx_policy::Layer {
            layer: "network_rechecked",
            in_force: true,
            detail,
        },
    )
}

/// Creates and starts container `id`. Detached, returns 0 once it runs;
/// otherwise waits for it, forwarding signals, deletes it (unless `keep`)
/// and returns its exit code (128 + N when killed by signal N).
pub fn run(
    root: &StateRoot,
    id: &str,
    opts: &CreateOptions,
    detach: bool,
    keep: bool,
) -> Result<i32> {
    cgroupless::reexec_in_own_userns()?;
    let lock = root.lock(id)?;
    let mut container = build(root, id, opts, detach, &lock)?;
    let pid = init_pid(&container)?;
    // Block the signals we forward, and SIGCHLD, before the process is
    // released: one that exits at once must not be missed (youki 0.7's
    // `run` hangs on `/bin/true` for that reason). The container's process
    // was cloned during build and keeps its own, empty, mask.
    let guard = (!detach)
        .then(supervise::SignalGuard::block_all)
        .transpose()?;
    if let Err(e) = recheck_network(&container, "start")
        .and_then(|()| container.start().map_err(|e| op_err("start", id, e)))
    {
        let _ = destroy(root, &mut container);
        return Err(e);
    }
    let Some(guard) = guard else {
        return Ok(0);
    };
    // The lock is not held while the container runs: `runsbx kill`, `state`
    // and `exec` on it must work meanwhile.
    drop(lock);
    let status = guard.wait_forwarding(pid);
    // Ended by its deadline: the code `runsbx call` gives a timeout.
    let status = match supervisor::ended(root, id).as_deref() {
        Some(supervisor::TIMED_OUT) => Ok(crate::error::call_exit::TIMED_OUT),
        _ => status,
    };
    if !keep {
        let _lock = root.lock(id)?;
        if let Ok(mut container) = load(root, id) {
            destroy(root, &mut container)?;
        }
    }
    status
}

/// Sends `signal` to the container's init process, or with `all` to every
/// process in it.
pub fn kill(root: &StateRoot, id: &str, signal: Signal, all: bool) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = load(root, id)?;
    let status = container.status();
    let alive = matches!(
        status,
        ContainerStatus::Created | ContainerStatus::Running | ContainerStatus::Paused
    );
    // runc allows `kill --all` of a stopped container (to reach leftovers).
    let stopped_all = all && status == ContainerStatus::Stopped;
    if !(alive || stopped_all) {
        return Err(wrong_state(&container, "kill"));
    }
    if all && !host::can_manage_cgroups() {
        // Without a cgroup the container's processes are found by their pid
        // namespace instead.
        return procs::signal_all(init_pid(&container)?, signal);
    }
    container
        .kill(signal, all)
        .map_err(|e| op_err("kill", id, e))
}

/// Deletes a stopped (or, with `force`, any) container and all its state.
pub fn delete(root: &StateRoot, id: &str, force: bool) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = match load(root, id) {
        Ok(c) => c,
        // A create killed before its state file existed, or while writing
        // it: what it made is found by what it holds, not by its state.
        Err(RuntimeError::NotFound { .. }) if force => {
            crate::reclaim::reclaim(root, id, None);
            return Ok(());
        }
        Err(e) if force => {
            tracing::warn!(id, "its state is unreadable ({e}): removing what it holds");
            crate::reclaim::reclaim(root, id, None);
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    match container.status() {
        ContainerStatus::Stopped | ContainerStatus::Created => {}
        _ if force => {}
        _ => return Err(wrong_state(&container, "delete (use --force)")),
    }
    destroy(root, &mut container)
}

pub fn pause(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    require_cgroups("pause")?;
    let mut container = load(root, id)?;
    if !container.can_pause() {
        return Err(wrong_state(&container, "pause"));
    }
    container.pause().map_err(|e| op_err("pause", id, e))
}

pub fn resume(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    require_cgroups("resume")?;
    let mut container = load(root, id)?;
    if !container.can_resume() {
        return Err(wrong_state(&container, "resume"));
    }
    container.resume().map_err(|e| op_err("resume", id, e))
}

/// Loads the state of container `id`, refreshed against its process.
pub fn load(root: &StateRoot, id: &str) -> Result<Container> {
    crate::root::validate_id(id)?;
    if !root.exists(id) {
        return Err(RuntimeError::NotFound {
            id: id.to_owned(),
            root: root.path().to_path_buf(),
        });
    }
    Container::load(root.container_dir(id)).map_err(|e| op_err("load", id, e))
}

pub(crate) fn init_pid(container: &Container) -> Result<Pid> {
    container.pid().ok_or_else(|| {
        RuntimeError::invalid(
            format!("container `{}`", container.id()),
            "its state records no process id",
        )
    })
}

fn build(
    root: &StateRoot,
    id: &str,
    opts: &CreateOptions,
    detach: bool,
    lock: &IdLock,
) -> Result<Container> {
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
) -> Result<Container> {
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
) -> Result<Container> {
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

/// The sandbox as the policy decides it: what `create` runs, and what
/// `runsbx harden` shows.
pub fn harden_bundle(bundle: &Path, config: Option<&Path>) -> Result<runsbx_policy::Hardened> {
    let source = bundle::load(bundle)?;
    let policy = Policy::load(config)?;
    // As root a real create allocates a range; the dry run shows the first.
    let range = (!host::rootless()).then_some(runsbx_policy::IdRange {
        base: policy.config.uid_base,
        size: policy.config.uid_range_size,
    });
    policy::apply(&policy, bundle::absolutize(&source), range, None, None)
}

fn build_from(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    opts: &CreateOptions,
    detach: bool,
    policy: &Policy,
    mut call: Option<CallParts<'_>>,
) -> Result<Container> {
    // A pod's container joins its sandbox's namespaces, verified here and
    // held open until it is built.
    let pod = crate::pod::verify(root, &source.spec)?;
    // As real root, the sandbox's ids are an unprivileged range of its own
    // (a pod's containers share their sandbox's).
    let range = if host::rootless() {
        None
    } else if let Some(pod) = &pod {
        Some(pod.range.ok_or_else(|| {
            RuntimeError::invalid(
                format!("pod sandbox `{}`", pod.join.sandbox),
                "its user namespace maps no id range of runsbx's",
            )
        })?)
    } else {
        let (slot, range) = policy::allocate_id_range(&policy.config, &owner(root, id))?;
        if let Err(e) = bundle::Effective::record_slot(root, id, slot) {
            policy::release_id_range(slot);
            return Err(e);
        }
        Some(range)
    };
    let workspace = call.as_ref().and_then(|c| c.workspace);
    // A call supervises its own sandbox (proxy, deadline).
    let for_call = call.is_some();
    let pod_join = pod.as_ref().map(|p| p.join.clone());
    let mut input = bundle::absolutize(source);
    // Egress from the profile (a call brings its own proxy).
    let egress = match call {
        Some(_) => None,
        None => egress::config_for(&input, &policy.profile_for(&input)?)?,
    };
    if egress.is_some() {
        egress::add_proxy_env(&mut input);
    }
    let hardened = policy::apply(policy, input, range, workspace, pod_join)?;
    let deadline = hardened.deadline.filter(|_| !for_call);
    bundle::check_cwd(source, &hardened.spec)?;
    // Said once, when the sandbox is made (not at each start or exec).
    for change in &hardened.changes {
        if change.field == "linux.namespaces.network" {
            tracing::warn!(id, "{}", change.reason);
        }
    }
    let report = serde_json::json!({
        "changes": hardened.changes,
        "attestation": hardened.attestation,
    });
    let mut spec = hardened.spec;
    host::check_rlimits(&spec)?;
    if let Some(range) = range {
        stage::prepare(&stage_key(root, id), range, &mut spec)?;
    }
    let shadow = if host::can_manage_cgroups() {
        default_cgroup_path(&mut spec, root, id);
        if let Some(cgroup) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) {
            bundle::Effective::record_cgroup(root, id, &cgroup)?;
            cgroup_claim::claim(&cgroup, &owner(root, id))?;
        }
        None
    } else {
        // A call reports this in its result instead of a log line.
        let fake = without_cgroups(&mut spec, id, call.is_none());
        Some(cgroupless::enter_for_create(&fake)?)
    };
    // Rootless, in the private mount namespace the shadow made: the image
    // as a filesystem of its own, as stage::prepare makes it as root.
    let view = match shadow {
        Some(_) if host::rootless() => {
            stage::private_view(&bundle::Effective::path(root, id), &mut spec)?
        }
        _ => None,
    };
    let new_netns = creates_netns(&spec);
    let own_userns = has_userns(&spec);
    let effective = bundle::Effective::write(root, id, &source.dir, &spec, &report)?;
    if let Some(call) = call.as_mut() {
        (call.prepare)(&spec)?;
    }
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
    let mut container = builder
        .map(|b| {
            b.as_init(&effective.dir)
                // runsbx never drives systemd; cgroupfs directly.
                .with_systemd(false)
                .with_detach(detach)
                .with_no_pivot(opts.no_pivot)
        })
        .and_then(|b| b.build())
        .map_err(|e| op_err("create", id, e))?;
    if let Some(shadow) = shadow {
        shadow.leave()?;
    }
    // The container's mount namespace holds its own copy.
    drop(view);
    effective.without_init_groups(&spec)?;
    let init = init_pid(&container)?;
    let mut proxy = None;
    if new_netns {
        netns::loopback_up(init, own_userns)?;
        // A pod's other containers share this one's network namespace and
        // its proxy.
        if let Some(config) = egress {
            proxy = Some((
                netns::listen_in(init, own_userns, egress::PROXY_PORT)?,
                config,
            ));
        }
    }
    // Inside runsbx's own user namespace the creator looks like root.
    container.set_creator(host::caller_uid());
    container
        .save()
        .map_err(|e| op_err("save state of", id, e))?;
    // Last, so that at its deadline the supervisor finds the saved state.
    supervisor::spawn(root, id, init, supervisor::Duties { proxy, deadline })?;
    Ok(container)
}

/// The name of container `id`'s staged mounts: unique across state roots.
fn stage_key(root: &StateRoot, id: &str) -> String {
    format!("{:08x}-{id}", root_hash(root))
}

/// FNV-1a of the state root's path: stable across runs, unlike std's hasher.
fn root_hash(root: &StateRoot) -> u32 {
    root.path()
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        }) as u32
}

/// Removes what container `id` holds outside its state directory: staged
/// mounts, its id range, the effective bundle.
pub(crate) fn release_host_side(root: &StateRoot, id: &str) -> Result<()> {
    if !host::rootless() {
        stage::remove(&stage_key(root, id))?;
    }
    if let Some(slot) = bundle::Effective::slot(root, id) {
        policy::release_id_range(slot);
    }
    if let Some(cgroup) = bundle::Effective::cgroup(root, id) {
        cgroup_claim::release(&cgroup, &owner(root, id));
    }
    bundle::Effective::remove(root, id)
}

/// Who holds a container's host resources (id range, cgroup claim): its
/// state root and id.
pub(crate) fn owner(root: &StateRoot, id: &str) -> String {
    format!("{}\n{id}", root.path().display())
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

/// The cgroup runsbx gives container `id` of `root` when its spec names
/// none: `/runsbx/<id>` for the default state root; with another state
/// root, whose ids may repeat the default root's, `/runsbx/<hash of the
/// state root>-<id>`.
pub(crate) fn runsbx_cgroup_path(root: &StateRoot, id: &str) -> PathBuf {
    if root.path() == crate::root::default_root() {
        PathBuf::from(format!("/runsbx/{id}"))
    } else {
        PathBuf::from(format!("/runsbx/{}", stage_key(root, id)))
    }
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
        host::caller_uid(),
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

/// Kills every process of the container and removes its state.
pub(crate) fn destroy(root: &StateRoot, container: &mut Container) -> Result<()> {
    let id = container.id().to_owned();
    // A create killed while libcontainer's state still said "creating"
    // recorded no process, though its init may wait on the notify socket:
    // found by what it holds.
    if container.pid().is_none() || container.status() == ContainerStatus::Creating {
        crate::reclaim::kill_all(root, &id, None);
    }
    let config = match container.spec() {
        Ok(config) => config,
        Err(e) => {
            // A create killed while libcontainer wrote its own config of
            // the container: libcontainer cannot delete what it cannot
            // read. runsbx kills by what the container holds and releases
            // by its own records (the claimed cgroup among them).
            tracing::warn!(
                id,
                "its libcontainer config is unreadable ({e}): removing what it holds"
            );
            if let Some(pid) = container.pid() {
                let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            }
            crate::reclaim::kill_all(root, &id, None);
            crate::reclaim::forget(root, &id);
            return Ok(());
        }
    };
    if host::can_manage_cgroups() {
        let cgroup = config.cgroup_path;
        if !cgroup_claim::is_ours(&cgroup, &owner(root, &id)) {
            // libcontainer would kill every process in it and remove it.
            tracing::warn!(
                id,
                ?cgroup,
                "runsbx holds no claim on this cgroup (it did not make it): leaving it alone"
            );
            if let Some(pid) = container.pid() {
                procs::kill_and_wait(pid)?;
            }
            let dir = root.container_dir(&id);
            std::fs::remove_dir_all(&dir)
                .or_else(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(e),
                })
                .map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))?;
            return release_host_side(root, &id);
        }
    }
    if !host::can_manage_cgroups() {
        // libcontainer kills through the cgroup, which does not exist here:
        // kill by pid namespace and wait for the init process to be gone.
        if let Some(pid) = container.pid() {
            procs::kill_and_wait(pid)?;
        }
        container.set_status(ContainerStatus::Stopped);
    }
    // libcgroups cannot remove a cgroup ("could not delete", EBUSY) until
    // the killed processes have left it: retried for up to a second.
    let mut tries = 0;
    loop {
        match container.delete(true) {
            Ok(()) => break,
            Err(_) if tries < 50 && root.container_dir(&id).exists() => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(op_err("delete", &id, e)),
        }
    }
    release_host_side(root, &id)
}

fn require_cgroups(op: &'static str) -> Result<()> {
    if host::can_manage_cgroups() {
        return Ok(());
    }
    Err(RuntimeError::unsupported(
        op,
        "needs the cgroup freezer, which runsbx cannot manage here \
         (rootless, or no cgroup hierarchy)",
    ))
}

fn wrong_state(container: &Container, op: &'static str) -> RuntimeError {
    RuntimeError::WrongState {
        id: container.id().to_owned(),
        status: status_name(container.status()).to_owned(),
        op,
    }
}

pub(crate) fn status_name(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Creating => "creating",
        ContainerStatus::Created => "created",
        ContainerStatus::Running => "running",
        ContainerStatus::Stopped => "stopped",
        ContainerStatus::Paused => "paused",
    }
}

pub(crate) fn op_err(op: &'static str, id: &str, source: LibcontainerError) -> RuntimeError {
    if let LibcontainerError::Exist = source {
        return RuntimeError::Exists { id: id.to_owned() };
    }
    RuntimeError::Container {
        op,
        id: id.to_owned(),
        source: Box::new(source),
    }
}
