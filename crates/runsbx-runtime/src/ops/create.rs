//! `create`: a container's namespaces and root exist, hardened, and its
//! process waits for `start`. The order of the steps is [`build_from`].

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, LinuxSeccomp, Spec};
use libcontainer::syscall::syscall::SyscallType;
use runsbx_policy::Overrides;

use crate::error::{Result, RuntimeError};
use crate::policy::{self, Policy};
use crate::sandbox::egress;
use crate::sandbox::seal::Seal;
use crate::sandbox::seccomp_events::Listener;
use crate::sandbox::supervisor::{self, Duties};
use crate::sandbox::teardown::destroy;
use crate::sandbox::workspace::Workspace;
use crate::state::container::{init_pid, op_err, owner, runsbx_cgroup_path, stage_key};
use crate::state::ids;
use crate::state::root::{IdLock, StateRoot};
use crate::state::{bundle, cgroup_claim};
use crate::sys::cgroup_attach::{self, FastAttach};
use crate::sys::privilege::CgroupLayout;
use crate::sys::{cgroupless, copyup, netns, privilege, stage, userns};

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

/// What one create is given besides the bundle: `create`'s and `run`'s
/// options, or a call's. The steps of [`build_from`] are the same for all.
pub(crate) struct Request<'a> {
    pub opts: &'a CreateOptions,
    /// Return once the container waits for `start` (runc's `--detach`).
    pub detach: bool,
    pub policy: &'a Policy,
    /// The caller's options, typed; `None`: the spec's `runsbx.*`
    /// annotations (engines).
    pub overrides: Option<&'a Overrides>,
    pub stdio: Stdio,
    /// A workspace of the sandbox's own, bound at /workspace in place of
    /// the profile's tmpfs and given to the sandbox's root.
    pub workspace: Option<&'a Workspace>,
    /// Where the sandbox's seccomp denials are reported (a call's
    /// listener, see sandbox/seccomp_events.rs); `None`: unreported.
    pub seccomp_listener: Option<&'a Path>,
    pub supervision: Supervision,
    /// As root, the host id range a session keeps for its calls (its own
    /// slot, which the sandbox neither records nor releases); `None`: a
    /// fresh one.
    pub id_range: Option<runsbx_policy::IdRange>,
    /// A warm sandbox's init waits for its command on this stub instead of
    /// running the spec's (see sandbox/stub.rs).
    pub stub: Option<crate::sandbox::stub::Stub>,
    /// A call's secrets, which its proxy puts in place of their sentinels
    /// (their hosts are inspected).
    pub secrets: &'a [runsbx_proxy::Secret],
}

/// Where the container's stdio goes.
pub(crate) enum Stdio {
    /// runsbx's own, or the console socket's (as runc).
    Inherited,
    /// These fds (a call's stdin, and the pipes it reads).
    Given {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
}

/// Who serves the sandbox's egress proxy and enforces its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Supervision {
    /// A supervisor process forked for the sandbox (`create`, `run`).
    Forked,
    /// The runsbx process that made it, which gets them in
    /// [`Built::duties`] (`runsbx call`).
    Caller,
}

/// What a create built: the container, the spec it runs (hardened, staged)
/// and the policy's attestation, so that nobody reads them back from disk.
pub(crate) struct Built {
    pub container: Container,
    pub spec: Spec,
    pub attestation: Vec<runsbx_policy::Layer>,
    /// The proxy and deadline, for a caller that serves them itself
    /// ([`Supervision::Caller`]); empty when a supervisor has them.
    pub duties: Duties,
    /// `linux.resources` was dropped: runsbx cannot make cgroups here.
    pub resources_dropped: bool,
    /// As root, the host id range the sandbox runs in.
    pub id_range: Option<runsbx_policy::IdRange>,
    /// With TLS inspection: the trust bundle bound into the sandbox.
    pub trust_bundle: Option<PathBuf>,
    /// With a seccomp listener and a network namespace of its own: a
    /// sock_diag socket made inside it, for the listener's hints.
    pub sock_diag: Option<std::os::fd::OwnedFd>,
    /// A network namespace of its own promised loopback only: what the
    /// network setup removed when it held it to that (see
    /// sandbox/network.rs, `start_checked`).
    pub network_checked: Option<Vec<String>>,
}

/// Creates container `id`: its namespaces and root exist, its process waits
/// for `start`.
pub fn create(root: &StateRoot, id: &str, opts: &CreateOptions) -> Result<()> {
    userns::reexec_in_own_userns()?;
    let lock = root.lock(id)?;
    build(root, id, opts, true, &lock)?;
    Ok(())
}

/// Creates container `id` from the bundle `opts` names (`create`, `run`).
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
    let req = Request {
        opts,
        detach,
        policy: &policy,
        overrides: None,
        stdio: Stdio::Inherited,
        workspace: None,
        seccomp_listener: None,
        supervision: Supervision::Forked,
        id_range: None,
        stub: None,
        secrets: &[],
    };
    let built = build_or_clean(root, id, &source, req, lock)?;
    if built.resources_dropped {
        tracing::warn!(
            id,
            "runsbx cannot manage cgroups here (rootless on a cgroup v1 host, or no cgroup \
             hierarchy): linux.resources is not applied; the container runs under rlimits only"
        );
    }
    Ok(built)
}

/// Creates container `id` from `source`, leaving nothing of it behind if
/// that fails. A call's `source` is made in memory (`source.dir` is the
/// call's own directory).
pub(crate) fn build_or_clean(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    req: Request<'_>,
    _lock: &IdLock,
) -> Result<Built> {
    let result = build_from(root, id, source, req);
    if result.is_err() {
        // libcontainer cleans up after most failures; make sure no state,
        // staged mount, id range, process or cgroup outlives a failed
        // create. (libcontainer's own removal of the cgroup fails while
        // runsbx's building thread is still in it: sys/cgroup_attach.rs.)
        // Its processes first, which a failure after their fork may have
        // left with nothing that names them.
        crate::sandbox::teardown::kill_failed_create();
        if root.exists(id) {
            if let Ok(mut c) = Container::load(root.container_dir(id)) {
                let _ = destroy(root, &mut c);
            }
        }
        crate::sandbox::teardown::forget(root, id);
    }
    result
}

/// The order of a create. Each record is written before the resource it
/// names exists (docs/architecture.md, "What a create does").
fn build_from(
    root: &StateRoot,
    id: &str,
    source: &bundle::Bundle,
    req: Request<'_>,
) -> Result<Built> {
    // A pod's container joins its sandbox's namespaces, verified here and
    // held open until it is built.
    let pod = crate::sandbox::pod::verify(root, &source.spec)?;
    let range = match req.id_range {
        Some(range) if !privilege::rootless() => Some(range),
        _ => host_ids(root, id, req.policy, pod.as_ref())?,
    };
    let mut hardened = harden(id, source, &req, range, pod.as_ref(), None)?;
    // Request rules over HTTPS need the proxy to read the requests: a CA
    // of this sandbox's own, which its TLS clients are made to trust.
    let inspection = match &hardened.egress {
        Some(plan)
            if (egress::inspects(plan) || !req.secrets.is_empty())
                && creates_netns(&hardened.spec) =>
        {
            let dir = bundle::Effective::path(root, id);
            let inspection = egress::Inspection::prepare(&dir, &hardened.spec, plan)?;
            if let Some(made) = &inspection {
                let trust = Some(made.bundle.as_path());
                hardened = harden(id, source, &req, range, pod.as_ref(), trust)?;
            }
            inspection
        }
        _ => None,
    };
    crate::phase("hardened");
    let report = serde_json::json!({
        "changes": hardened.changes,
        "attestation": hardened.attestation,
    });
    let mut spec = hardened.spec;
    privilege::check_rlimits(&spec)?;
    let key = stage_key(root, id);
    let stage = |spec: &mut Spec| match range {
        Some(range) => stage::prepare(
            &key,
            range,
            spec,
            hardened.unshifted_rootfs,
            &hardened.engine_volumes,
        ),
        None => Ok(()),
    };
    // What needs neither the staged rootfs nor the cgroups. Where a
    // thread makes the cgroups (below), it runs once the rootfs is staged,
    // while that thread, the longer of the two by about half a
    // millisecond here, still works; elsewhere after the staging.
    let set_aside = |spec: &mut Spec| -> Result<SetAside> {
        // The filter runsbx installs itself is in no config.json
        // libcontainer reads (it would compile it again), but in the
        // effective bundle's record of it, which exec reads; it is back in
        // the spec returned.
        let sealed = seal(root, spec)?;
        let compiled_by_libcontainer = libcontainer_compiles(spec)?;
        // libcontainer's processes open /proc through pathrs, which keeps
        // one private procfs (subset=pid, detached) per process, made on
        // first use. Made here first, by this process's main thread
        // (outside the sandbox's cgroups), it is inherited: the
        // intermediate process does not mount its own, and the init's
        // copy, closed as it execs, is not the last, so the command does
        // not start by tearing a procfs down. Best effort (rootless,
        // pathrs cannot make one and libcontainer's processes open /proc
        // as before).
        let _ = pathrs::procfs::ProcfsHandle::new();
        Ok(SetAside {
            sealed,
            compiled_by_libcontainer,
        })
    };
    // Where runsbx makes the cgroups itself (as root, cgroup v1), the claim
    // is recorded first and they are made while the rootfs is staged.
    // Elsewhere the claim, or the shadow, comes after the staging: the
    // shadow's private mount namespace must not hold the staged mounts.
    let (shadow, resources_dropped, prepared, aside) = if privilege::can_manage_cgroups()
        && matches!(
            privilege::cgroup_layout(),
            CgroupLayout::V1 | CgroupLayout::Hybrid
        ) {
        let (shadow, dropped) = claim_cgroup(root, id, &mut spec)?;
        let (prepared, aside) = match cgroups_path(&spec) {
            Some(path) => {
                let resources = cgroup_attach::resources(&spec).cloned();
                let sink = bundle::Effective::path(root, id).join(SINK);
                let (prepared, staged) =
                    FastAttach::prepare_during(&path, resources.as_ref(), sink, || {
                        // Here, not in the init (memchr asks first there,
                        // on the build's path): this thread is done before
                        // the one making the cgroups.
                        crate::sys::fork::detect_cpu_features();
                        stage(&mut spec)?;
                        set_aside(&mut spec)
                    });
                let aside = staged?;
                (prepared?, Some(aside))
            }
            None => {
                stage(&mut spec)?;
                (None, None)
            }
        };
        (shadow, dropped, prepared, aside)
    } else {
        stage(&mut spec)?;
        let (shadow, dropped) = claim_cgroup(root, id, &mut spec)?;
        (shadow, dropped, None, None)
    };
    crate::phase("rootfs staged, cgroups made");
    // Rootless, in the private mount namespace the shadow made: the image
    // as a filesystem of its own, as stage::prepare makes it as root.
    let view = match shadow {
        Some(_) if privilege::rootless() => {
            stage::private_view(&bundle::Effective::path(root, id), &mut spec)?
        }
        _ => None,
    };
    // Held open until libcontainer has joined it.
    let _userns = userns::made_for(&mut spec)?;
    let SetAside {
        sealed,
        compiled_by_libcontainer,
    } = match aside {
        Some(aside) => aside,
        None => set_aside(&mut spec)?,
    };
    // The limits runsbx wrote into the cgroups it made are in no
    // config.json libcontainer reads (it would write them again), but in
    // the spec returned, which the call's result reports.
    let limits = match &prepared {
        Some(fast) if fast.wrote_limits() => spec.linux_mut().as_mut().and_then(|l| {
            let resources = l.resources().clone();
            l.set_resources(None);
            resources
        }),
        _ => None,
    };
    let effective = bundle::Effective::write(root, id, &source.dir, &spec, &report)?;
    let filter = sealed.as_ref().map(|(seccomp, _)| seccomp);
    if let Some(seccomp) = filter.or(compiled_by_libcontainer.as_ref()) {
        bundle::Effective::record_seccomp(root, id, seccomp)?;
    }
    if let Some(workspace) = req.workspace {
        workspace.give_to_root_of(&spec)?;
    }
    // Held open until the init has been cloned.
    let (executor, _inherited) = match &sealed {
        Some((_, seal)) => {
            let (seal, inherited) = seal.take(req.stub)?;
            (Executor::Seal(seal), Some(inherited))
        }
        None => (req.stub.map_or(Executor::Default, Executor::Stub), None),
    };
    let build = || {
        libcontainer_build(
            root, id, req.opts, req.detach, &effective, req.stdio, executor,
        )
    };
    let entered = prepared.map(FastAttach::enter).transpose()?.flatten();
    let mut container = match entered {
        Some(entered) => {
            let built = entered.build(build);
            entered.leave()?;
            built?
        }
        None => build()?,
    };
    crate::phase("built (libcontainer)");
    // The namespaces' holders, let go while the rootfs was staged, have
    // exited by now.
    userns::reap_released();
    // While runsbx still sees the rootfs it was built from.
    fill_tmpfs(&container, &spec, &hardened.tmpcopyup)?;
    if let Some(shadow) = shadow {
        shadow.leave()?;
    }
    // The container's mount namespace holds its own copy.
    drop(view);
    drop(_inherited);
    effective.without_init_groups(&spec)?;
    if let Some(seccomp) = sealed
        .map(|(seccomp, _)| seccomp)
        .or(compiled_by_libcontainer)
    {
        if let Some(linux) = spec.linux_mut() {
            linux.set_seccomp(Some(seccomp));
        }
    }
    if let (Some(resources), Some(linux)) = (limits, spec.linux_mut()) {
        linux.set_resources(Some(resources));
    }
    let init = init_pid(&container)?;
    let trust_bundle = inspection.as_ref().map(|i| i.bundle.clone());
    // A profile's learn directory: the container's record goes there.
    let learn = match hardened.egress.as_ref().and_then(|p| p.learn.as_ref()) {
        Some(runsbx_policy::Learn::Dir(dir)) => Some(dir.join(format!("{id}.json"))),
        _ => None,
    };
    let loopback_only = hardened
        .attestation
        .iter()
        .any(|l| l.layer == "network_loopback_only" && l.in_force);
    // The init's record and the container's state are written while a
    // thread brings the sandbox's network up in its namespace: each takes
    // a few hundred microseconds, mostly waiting for the kernel. Both are
    // done before anything else happens.
    let (inside, recorded) = network_up(
        init,
        &spec,
        hardened.egress.as_ref().map(|_| egress::PROXY_PORT),
        req.seccomp_listener.is_some(),
        loopback_only,
        || -> Result<Container> {
            bundle::Effective::record_init(root, id, init)?;
            // libcontainer saved the state with its process's euid as the
            // creator, which inside runsbx's own user namespace is root,
            // not the caller. It is saved again only then: as root nothing
            // would change, and each save truncates the state file, which
            // ext4 answers by writing it out at once (and, on a disk
            // mounted with `discard`, by discarding its block when it is
            // removed). A call of `/bin/true` as root with its state root
            // on such a disk: 3.1 -> 2.1 writes and 5 -> 4 discards
            // (/sys/block/*/stat, 100 calls); its time is the same, the
            // save having run beside the network's setup.
            let creator = userns::caller_uid();
            if container.state.creator != Some(creator) {
                container.set_creator(creator);
                container
                    .save()
                    .map_err(|e| op_err("save state of", id, e))?;
            }
            Ok(container)
        },
    );
    crate::phase("network up");
    let container = recorded?;
    let Network {
        proxy,
        sock_diag,
        network_checked,
    } = network_of(inside?, hardened.egress.as_ref(), inspection, req.secrets)?;
    let duties = Duties {
        learn,
        proxy,
        deadline: hardened.deadline,
    };
    // Last, so that at its deadline the supervisor finds the saved state.
    let duties = match req.supervision {
        Supervision::Forked => {
            supervisor::spawn(root, id, init, duties)?;
            Duties::default()
        }
        Supervision::Caller => duties,
    };
    Ok(Built {
        container,
        spec,
        attestation: hardened.attestation,
        duties,
        resources_dropped,
        id_range: range,
        trust_bundle,
        sock_diag,
        network_checked,
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

/// The policy applied to the bundle (pure: hardened and verified).
fn harden(
    id: &str,
    source: &bundle::Bundle,
    req: &Request<'_>,
    range: Option<runsbx_policy::IdRange>,
    pod: Option<&crate::sandbox::pod::Verified>,
    trust_bundle: Option<&Path>,
) -> Result<runsbx_policy::Hardened> {
    let pod_join = pod.map(|p| p.join.clone());
    let made = policy::Provisions {
        workspace: req.workspace,
        seccomp_listener: req.seccomp_listener,
        trust_bundle,
        host: None,
    };
    let hardened = harden_source(source, req.policy, range, made, pod_join, req.overrides)?;
    // Said once, when the sandbox is made (not at each start or exec).
    for change in &hardened.changes {
        if change.field == "linux.namespaces.network" {
            tracing::warn!(id, "{}", change.reason);
        }
    }
    Ok(hardened)
}

/// The policy applied to `source` and the result checked against it, as
/// every create does it; a warm sandbox's command is held to the same.
pub(crate) fn harden_source(
    source: &bundle::Bundle,
    policy: &Policy,
    range: Option<runsbx_policy::IdRange>,
    made: policy::Provisions<'_>,
    pod_join: Option<runsbx_policy::PodJoin>,
    overrides: Option<&Overrides>,
) -> Result<runsbx_policy::Hardened> {
    let input = bundle::absolutize(source);
    let hardened = policy::apply(policy, input, range, made, pod_join, overrides)?;
    bundle::check_cwd(source, &hardened.spec)?;
    bundle::check_process(source, &hardened.spec)?;
    Ok(hardened)
}

/// As root, claims the sandbox's cgroup (recorded first); where runsbx
/// cannot make cgroups, drops what needs one (and says whether it dropped
/// limits) and enters the cgroup shadow.
fn claim_cgroup(
    root: &StateRoot,
    id: &str,
    spec: &mut Spec,
) -> Result<(Option<cgroupless::Shadow>, bool)> {
    if !privilege::can_manage_cgroups() {
        let (fake, dropped) = without_cgroups(spec, id);
        return Ok((Some(cgroupless::enter_for_create(&fake)?), dropped));
    }
    default_cgroup_path(spec, root, id);
    if let Some(cgroup) = spec.linux().as_ref().and_then(|l| l.cgroups_path().clone()) {
        bundle::Effective::record_cgroup(root, id, &cgroup)?;
        cgroup_claim::claim(&cgroup, &owner(root, id))?;
    }
    Ok((None, false))
}

/// Where libcontainer's own `cgroup.procs` writes go instead (see
/// sys/cgroup_attach.rs), in the effective bundle.
pub(crate) const SINK: &str = "cgroup.procs.sink";

/// The cgroup path `spec` gives its sandbox. As root on a cgroup v1 host,
/// the sandbox's first process is forked into its cgroups there rather
/// than moved (see sys/cgroup_attach.rs).
fn cgroups_path(spec: &Spec) -> Option<PathBuf> {
    spec.linux().as_ref().and_then(|l| l.cgroups_path().clone())
}

/// libcontainer builds the container from the effective bundle: its
/// namespaces, rootfs and init, waiting for `start`.
fn libcontainer_build(
    root: &StateRoot,
    id: &str,
    opts: &CreateOptions,
    detach: bool,
    effective: &bundle::Effective,
    stdio: Stdio,
    executor: Executor,
) -> Result<Container> {
    let mut builder = ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(root.path())
        .and_then(|b| b.with_pid_file(opts.pid_file.as_ref()))
        .map(|b| {
            b.with_console_socket(opts.console_socket.as_ref())
                .with_preserved_fds(opts.preserve_fds)
        });
    if let Stdio::Given {
        stdin,
        stdout,
        stderr,
    } = stdio
    {
        builder = builder.map(|b| b.with_stdin(stdin).with_stdout(stdout).with_stderr(stderr));
    }
    match executor {
        Executor::Default => builder = builder.map(|b| b.with_executor(Plain)),
        Executor::Stub(stub) => builder = builder.map(|b| b.with_executor(stub)),
        Executor::Seal(seal) => builder = builder.map(|b| b.with_executor(seal)),
    }
    let _hooks_may_close_stdin = crate::sys::signal::SigpipeIgnored::now();
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

/// libcontainer's own executor, once the init has given every signal its
/// default action back (`default_dispositions` in sys/signal.rs).
#[derive(Clone)]
struct Plain;

impl libcontainer::workload::Executor for Plain {
    fn exec(&self, spec: &Spec) -> std::result::Result<(), libcontainer::workload::ExecutorError> {
        crate::sys::signal::default_dispositions();
        libcontainer::workload::default::DefaultExecutor {}.exec(spec)
    }

    fn validate(
        &self,
        spec: &Spec,
    ) -> std::result::Result<(), libcontainer::workload::ExecutorValidationError> {
        libcontainer::workload::default::DefaultExecutor {}.validate(spec)
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> std::result::Result<(), libcontainer::workload::ExecutorSetEnvsError> {
        libcontainer::workload::default::DefaultExecutor {}.setup_envs(envs)
    }
}

/// What the init runs last, in the sandbox.
enum Executor {
    /// libcontainer's: the spec's process.
    Default,
    /// A warm sandbox's stub (sandbox/stub.rs).
    Stub(crate::sandbox::stub::Stub),
    /// runsbx's filter installed first, then either of the above
    /// (sandbox/seal.rs).
    Seal(Seal),
}

/// A filter runsbx installs, compiled, and where its listener fd goes.
struct Sealing {
    program: crate::sys::seccomp::Program,
    listener: Option<PathBuf>,
}

impl Sealing {
    /// The init's executor, connected to the listener if the filter
    /// reports, and the fds the init inherits for it.
    fn take(
        &self,
        stub: Option<crate::sandbox::stub::Stub>,
    ) -> Result<(Seal, crate::sandbox::seal::Inherited)> {
        let report_to = match (&self.listener, self.program.notifies()) {
            (Some(path), true) => Some(Listener::connect(path)?),
            (None, true) => {
                return Err(RuntimeError::invalid(
                    "linux.seccomp",
                    "a rule notifies (SCMP_ACT_NOTIFY) but listenerPath is not set",
                ))
            }
            (_, false) => None,
        };
        Ok(Seal::new(self.program.clone(), report_to, stub))
    }
}

/// The seccomp filters of a create, put aside before its build (see
/// [`seal`] and [`libcontainer_compiles`]).
struct SetAside {
    sealed: Option<(LinuxSeccomp, Sealing)>,
    compiled_by_libcontainer: Option<LinuxSeccomp>,
}

/// Takes the filter runsbx installs itself out of `spec`, compiled (from
/// the state root's cache); `None` where libcontainer installs it (see
/// sandbox/seal.rs).
fn seal(root: &StateRoot, spec: &mut Spec) -> Result<Option<(LinuxSeccomp, Sealing)>> {
    if !crate::sandbox::seal::installs(spec) {
        return Ok(None);
    }
    let Some(seccomp) = spec
        .linux_mut()
        .as_mut()
        .and_then(|l| l.seccomp_mut().take())
    else {
        return Ok(None);
    };
    let program = crate::sys::seccomp::Program::of(&seccomp, root.path())?;
    let listener = seccomp.listener_path().clone();
    Ok(Some((seccomp, Sealing { program, listener })))
}

/// Where libcontainer installs `spec`'s filter (runsbx does not: see
/// [`seal`]), puts it in `spec` in the form libcontainer 0.7 compiles as
/// the runtime spec means it (see sys/seccomp.rs), and returns it as it
/// was: it is recorded beside the effective config.json for exec, and is
/// the spec's again once the sandbox is built.
fn libcontainer_compiles(spec: &mut Spec) -> Result<Option<LinuxSeccomp>> {
    let Some(linux) = spec.linux_mut() else {
        return Ok(None);
    };
    let Some(meant) = linux.seccomp().clone() else {
        return Ok(None);
    };
    linux.set_seccomp(Some(crate::sys::seccomp::libcontainer_operands(&meant)?));
    Ok(Some(meant))
}

/// `tmpcopyup`: each tmpfs that asked for it gets the image's content at
/// its mount point (see sys/copyup.rs).
fn fill_tmpfs(container: &Container, spec: &Spec, dests: &[PathBuf]) -> Result<()> {
    if dests.is_empty() {
        return Ok(());
    }
    let rootfs = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| RuntimeError::invalid("config.json", "has no root"))?;
    copyup::copy_up(init_pid(container)?, has_userns(spec), &rootfs, dests)
}

/// What [`network_up`] made.
struct Network {
    proxy: Option<supervisor::Proxy>,
    sock_diag: Option<std::os::fd::OwnedFd>,
    network_checked: Option<Vec<String>>,
}

/// In a new network namespace: `lo` up, held to loopback when
/// `loopback_only` (the policy's promise), the egress proxy's listening
/// socket (`proxy_port`) made inside it for the supervisor (a pod's other
/// containers share this one's network namespace and its proxy), and with
/// `sock_diag` (a call's seccomp listener) a sock_diag socket for its
/// hints; all in one helper thread, while this thread runs `meanwhile`.
fn network_up<T>(
    init: nix::unistd::Pid,
    spec: &Spec,
    proxy_port: Option<u16>,
    sock_diag: bool,
    loopback_only: bool,
    meanwhile: impl FnOnce() -> T,
) -> (Result<netns::Inside>, T) {
    if !creates_netns(spec) {
        return (Ok(netns::Inside::default()), meanwhile());
    }
    netns::network_up(
        init,
        has_userns(spec),
        proxy_port,
        sock_diag,
        loopback_only,
        meanwhile,
    )
}

/// What [`network_up`] made, with the egress proxy's configuration.
fn network_of(
    inside: netns::Inside,
    egress: Option<&runsbx_policy::EgressPlan>,
    inspection: Option<egress::Inspection>,
    secrets: &[runsbx_proxy::Secret],
) -> Result<Network> {
    let proxy = match (egress, inside.proxy) {
        (Some(plan), Some(listener)) => {
            Some((listener, egress::proxy_config(plan, inspection, secrets)?))
        }
        _ => None,
    };
    Ok(Network {
        proxy,
        sock_diag: inside.sock_diag,
        network_checked: inside.removed,
    })
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

/// What cannot be had without a cgroup is dropped; says whether limits
/// were. Returns the cgroup path libcontainer is given instead: one that
/// exists nowhere on the host (unique per container), so that its
/// `delete` never touches a real cgroup, such as a root container's with
/// the same id.
fn without_cgroups(spec: &mut Spec, id: &str) -> (PathBuf, bool) {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let fake = PathBuf::from(format!(
        "/runsbx-no-cgroup/{}/{id}-{:016x}",
        userns::caller_uid(),
        h.finish()
    ));
    let mut dropped = false;
    if let Some(linux) = spec.linux_mut() {
        linux.set_cgroups_path(Some(fake.clone()));
        dropped = linux.resources().is_some();
        linux.set_resources(None);
    }
    if let Some(mounts) = spec.mounts_mut() {
        // A cgroup mount would expose the host's hierarchy names and cannot
        // be made from a user namespace on cgroup v1.
        mounts.retain(|m| m.typ().as_deref() != Some("cgroup"));
    }
    (fake, dropped)
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
