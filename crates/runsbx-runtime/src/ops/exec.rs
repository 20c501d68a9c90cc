//! exec: a new process in a running container.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::syscall::syscall::SyscallType;

use crate::error::{Result, RuntimeError};
use crate::policy::Policy;
use crate::sandbox::exec_guard::ExecGuard;
use crate::sandbox::network::recheck_network;
use crate::state::container::{init_pid, load, op_err, status_name};
use crate::state::root::StateRoot;
use crate::sys::cgroup_attach::{self, Entered, FastAttach};
use crate::sys::signal::SignalGuard;
use crate::sys::{cgroupless, privilege};

#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// A process.json; when given, `args` and the other fields add to it.
    pub process: Option<PathBuf>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub user: Option<u32>,
    pub group: Option<u32>,
    pub additional_gids: Vec<u32>,
    pub console_socket: Option<PathBuf>,
    pub detach: bool,
    pub pid_file: Option<PathBuf>,
    pub preserve_fds: i32,
    pub caps: Vec<String>,
    pub ignore_paused: bool,
    pub sub_cgroup: Option<String>,
    /// The operator config (`--config`).
    pub config: Option<PathBuf>,
}

/// Runs a process in container `id`. Detached, returns 0 once it runs;
/// otherwise its exit code (128 + N when killed by signal N).
pub fn exec(root: &StateRoot, id: &str, opts: &ExecOptions) -> Result<i32> {
    let lock = root.lock(id)?;
    let container = load(root, id)?;
    if !container.can_exec() {
        return Err(RuntimeError::WrongState {
            id: id.to_owned(),
            status: status_name(container.status()).to_owned(),
            op: "exec",
        });
    }
    let init = init_pid(&container)?;
    // Whatever an engine did to the sandbox's network since the last
    // process started, the new one gets only `lo`.
    recheck_network(&container, "exec")?;
    // Without cgroups, libcontainer's exec needs the same view as create.
    // The shadow is never unmounted: this process's mount namespace is its
    // own and ends with it (see the user namespace join below).
    let _shadow = if privilege::can_manage_cgroups() {
        None
    } else {
        let config = container
            .spec()
            .map_err(|e| op_err("read config of", id, e))?;
        Some(cgroupless::enter_for_exec(init, &config.cgroup_path)?)
    };
    // The container's seccomp filter and rlimits, which libcontainer's exec
    // would not apply (see sandbox/exec_guard.rs).
    let effective = crate::state::bundle::load(container.bundle())?;
    let guard = ExecGuard::for_container(root.path(), container.bundle(), &effective.spec)?;
    let process_file = check_process(opts, &effective, container.bundle())?;
    let cwd = opts
        .cwd
        .as_deref()
        .or(process_file.as_ref().map(|p| p.cwd.as_path()));
    let checked = check_cwd(id, init, cwd)
        .and_then(|()| check_exec_command(init, opts, process_file.as_ref(), &effective.spec, cwd));
    if let Err(e) = checked {
        if let Some(p) = &process_file {
            let _ = std::fs::remove_file(&p.file);
        }
        return Err(e);
    }
    // As root on cgroup v1 the process is forked into the sandbox's cgroups
    // (sys/cgroup_attach.rs): the mounts that needs are made here, before
    // the user namespace join, after which runsbx could not make them.
    let entered = match fast_attach(&container, &effective.spec, opts) {
        Ok(entered) => entered,
        Err(e) => {
            if let Some(p) = &process_file {
                let _ = std::fs::remove_file(&p.file);
            }
            return Err(e);
        }
    };
    // Last: once in the sandbox's user namespace, runsbx has no privilege
    // over the host's mounts, only over the sandbox's namespaces.
    join_user_namespace_of(init)?;
    let file = process_file.as_ref().map(|p| p.file.as_path());
    let pid = match &entered {
        Some(entered) => entered.build(|| libcontainer_exec(root, id, opts, guard, file)),
        None => libcontainer_exec(root, id, opts, guard, file),
    };
    // No way back to the host's mount namespace from the sandbox's user
    // namespace; this process makes no mount before it ends.
    if let Some(entered) = entered {
        entered.stay();
    }
    if let Some(f) = file {
        let _ = std::fs::remove_file(f);
    }
    let pid = pid?;
    drop(lock);
    if opts.detach {
        return Ok(0);
    }
    // Blocking after the process exists is safe: `wait_forwarding` reaps
    // before it first waits for a signal.
    SignalGuard::block_all()?.wait_forwarding(pid)
}

/// The exec'd process gets no more than the container's own: capabilities
/// only from the profile, no_new_privs always, ids the sandbox maps (from
/// `--user`, `--group`, `--additional-gids` or a `--process` file, which
/// comes back hardened, as a file to hand libcontainer).
fn check_process(
    opts: &ExecOptions,
    effective: &crate::state::bundle::Bundle,
    bundle: &Path,
) -> Result<Option<ProcessFile>> {
    let policy = Policy::load(opts.config.as_deref())?;
    let profile = policy.profile_for(&effective.spec)?;
    if let Some(cap) = opts.caps.iter().find(|c| !profile.capabilities.contains(c)) {
        return Err(RuntimeError::Policy(runsbx_policy::PolicyError::Refused {
            what: format!("exec --cap {cap}"),
            profile: profile.name.clone(),
            key: format!("capabilities = [{cap:?}]"),
        }));
    }
    if opts.user.is_some() || opts.group.is_some() || !opts.additional_gids.is_empty() {
        let mut process = effective.spec.process().clone().unwrap_or_default();
        let mut user = process.user().clone();
        if let Some(uid) = opts.user {
            user.set_uid(uid);
        }
        if let Some(gid) = opts.group {
            user.set_gid(gid);
        }
        if !opts.additional_gids.is_empty() {
            user.set_additional_gids(Some(opts.additional_gids.clone()));
        }
        process.set_user(user);
        let host = crate::policy::host_facts(None);
        runsbx_policy::harden_exec(&effective.spec, process, &profile, &host)
            .map_err(RuntimeError::Policy)?;
    }
    opts.process
        .as_ref()
        .map(|path| harden_process_file(path, effective, &profile, bundle))
        .transpose()
}

/// `exec --cwd` names a directory the container has, looked up in its own
/// view (its root and mounts, through `/proc/<init>/root`), so that a
/// missing one is said plainly rather than as libcontainer's failed chdir.
/// Where that view cannot be opened the kernel's chdir decides.
fn check_cwd(id: &str, init: nix::unistd::Pid, cwd: Option<&Path>) -> Result<()> {
    let Some(cwd) = cwd else {
        return Ok(());
    };
    let Some(root) = container_view(init) else {
        return Ok(());
    };
    match root.resolve(cwd) {
        Ok(handle)
            if nix::sys::stat::fstat(handle.as_fd().as_raw_fd())
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR) =>
        {
            Ok(())
        }
        Ok(_) => Err(RuntimeError::invalid(
            format!("exec: working directory {cwd:?}"),
            format!("is not a directory in container `{id}` (chdir: not a directory); give one that exists in it"),
        )),
        Err(_) => Err(RuntimeError::invalid(
            format!("exec: working directory {cwd:?}"),
            format!("does not exist in container `{id}` (chdir: no such file or directory); give one that exists in it"),
        )),
    }
}

/// The container's own view (its root and mounts), through
/// `/proc/<init>/root`; `None` where it cannot be opened.
fn container_view(init: nix::unistd::Pid) -> Option<pathrs::Root> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
        .open(format!("/proc/{init}/root"))
    {
        Ok(dir) => Some(pathrs::Root::from_fd(dir)),
        Err(e) => {
            tracing::debug!(error = %e, "exec: the container's root cannot be opened");
            None
        }
    }
}

/// The exec'd command is looked up in the container's own view as the
/// kernel will (its `PATH`, its working directory), so that a missing one
/// or one that is not executable is said as a create says it, in the words
/// engines read as runc's (podman and docker: 127 and 126), rather than as
/// libcontainer's failed exec (podman: 255). Where the view cannot be
/// opened the kernel's exec decides.
fn check_exec_command(
    init: nix::unistd::Pid,
    opts: &ExecOptions,
    process_file: Option<&ProcessFile>,
    spec: &libcontainer::oci_spec::runtime::Spec,
    cwd: Option<&Path>,
) -> Result<()> {
    let process = spec.process().as_ref();
    let (args, env) = match process_file {
        Some(p) => (&p.args, p.env.clone()),
        None => (
            &opts.args,
            process.and_then(|p| p.env().clone()).unwrap_or_default(),
        ),
    };
    let Some(command) = args.first() else {
        return Ok(());
    };
    // The PATH the process gets: `exec --env`'s over the process's own.
    let path = opts
        .env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| format!("PATH={v}"))
        .or_else(|| env.into_iter().rev().find(|kv| kv.starts_with("PATH=")));
    let cwd = cwd
        .or(process.map(|p| p.cwd().as_path()))
        .unwrap_or(Path::new("/"));
    let Some(root) = container_view(init) else {
        return Ok(());
    };
    let env: Vec<String> = path.into_iter().collect();
    crate::state::bundle::check_command_in(&root, command, &env, cwd, &[])
}

/// For a running container whose cgroups runsbx manages (and no `--cgroup`
/// sub-cgroup): the exec'd process forked into them (sys/cgroup_attach.rs).
/// Never for a paused one: the thread that forks it would join a frozen
/// cgroup.
fn fast_attach(
    container: &Container,
    spec: &libcontainer::oci_spec::runtime::Spec,
    opts: &ExecOptions,
) -> Result<Option<Entered>> {
    if !privilege::can_manage_cgroups()
        || opts.sub_cgroup.is_some()
        || container.status() != ContainerStatus::Running
    {
        return Ok(None);
    }
    let config = container
        .spec()
        .map_err(|e| op_err("read config of", container.id(), e))?;
    let sink = container.bundle().join(crate::ops::create::SINK);
    FastAttach::prepare(
        &config.cgroup_path,
        cgroup_attach::resources(spec),
        sink,
        false,
    )?
    .map(FastAttach::enter)
    .transpose()
    .map(Option::flatten)
}

/// libcontainer's tenant builder starts the process in the container's
/// namespaces, through `guard`.
fn libcontainer_exec(
    root: &StateRoot,
    id: &str,
    opts: &ExecOptions,
    guard: ExecGuard,
    process_file: Option<&Path>,
) -> Result<nix::unistd::Pid> {
    ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_executor(guard)
        .with_root_path(root.path())
        .and_then(|b| b.with_pid_file(opts.pid_file.as_ref()))
        .and_then(|b| {
            b.with_console_socket(opts.console_socket.as_ref())
                .with_preserved_fds(opts.preserve_fds)
                .validate_id()
        })
        .and_then(|b| {
            b.as_tenant()
                .with_detach(opts.detach)
                .with_cwd(opts.cwd.as_ref())
                .with_env(opts.env.iter().cloned().collect::<HashMap<_, _>>())
                .with_process(process_file)
                .with_no_new_privs(true)
                .with_container_args(opts.args.clone())
                .with_additional_gids(opts.additional_gids.clone())
                .with_user(opts.user)
                .with_group(opts.group)
                .with_capabilities(opts.caps.clone())
                .with_ignore_paused(opts.ignore_paused)
                .with_sub_cgroup(opts.sub_cgroup.clone())
                .build()
        })
        .map_err(|e| op_err("exec in", id, e))
}

/// Moves this process into the user namespace of the container's `init`,
/// so that the process libcontainer clones from it for the exec starts
/// there, as the init did: its ids are the sandbox's mapping (the sandbox's
/// own host range as root, never host root), and its capabilities, even
/// before libcontainer drops them, reach only the sandbox's namespaces.
/// libcontainer 0.7's tenant builder joins every namespace of the init but
/// this one, and joining it must come first.
///
/// runsbx keeps its host credentials (its files and the state root stay
/// reachable as their owner) but loses its capabilities over the host, so
/// this comes after everything that needs them.
fn join_user_namespace_of(init: nix::unistd::Pid) -> Result<()> {
    use nix::sched::{setns, CloneFlags};
    let pidfd = crate::sys::procs::pidfd_open(init)?;
    let joined = setns(&pidfd, CloneFlags::CLONE_NEWUSER);
    // Inside, runsbx is rootless: what it knew of its namespace is stale.
    privilege::moved();
    joined.map_err(|e| match e {
        // The kernel's answer for joining the user namespace one is in.
        nix::Error::EINVAL => RuntimeError::invalid(
            format!("exec into the container of pid {init}"),
            "its init is in runsbx's own user namespace, not a sandbox's; refusing to exec",
        ),
        e => RuntimeError::sys(
            format!("exec: join the user namespace of the container's init (pid {init})"),
            e,
        ),
    })
}

/// A hardened `exec --process` file, and the working directory it names.
struct ProcessFile {
    file: PathBuf,
    cwd: PathBuf,
    args: Vec<String>,
    env: Vec<String>,
}

/// The process.json given to `exec --process`, hardened, written next to
/// the container's effective config.
fn harden_process_file(
    path: &Path,
    effective: &crate::state::bundle::Bundle,
    profile: &runsbx_policy::Profile,
    effective_dir: &Path,
) -> Result<ProcessFile> {
    let bad = |reason: String| RuntimeError::invalid(format!("exec --process {path:?}"), reason);
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let process =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a valid OCI process: {e}")))?;
    let host = crate::policy::host_facts(None);
    let hardened = runsbx_policy::harden_exec(&effective.spec, process, profile, &host)
        .map_err(RuntimeError::Policy)?;
    let out = effective_dir.join(format!("exec-process-{}.json", std::process::id()));
    let json = serde_json::to_vec(&hardened).map_err(|e| bad(e.to_string()))?;
    std::fs::write(&out, json).map_err(|e| RuntimeError::io(format!("write {out:?}"), e))?;
    Ok(ProcessFile {
        file: out,
        cwd: hardened.cwd().clone(),
        args: hardened.args().clone().unwrap_or_default(),
        env: hardened.env().clone().unwrap_or_default(),
    })
}
