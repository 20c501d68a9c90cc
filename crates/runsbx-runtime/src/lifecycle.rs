//! create, start, run, kill, delete, pause, resume.

use std::path::PathBuf;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::error::LibcontainerError;
use libcontainer::syscall::syscall::SyscallType;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};
use crate::root::{IdLock, StateRoot};
use crate::{bundle, host, netns, procs, supervise};

/// What `create` and `run` are given besides the id.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub bundle: PathBuf,
    pub pid_file: Option<PathBuf>,
    pub console_socket: Option<PathBuf>,
    pub preserve_fds: i32,
    pub no_pivot: bool,
}

/// Creates container `id`: its namespaces and root exist, its process waits
/// for `start`.
pub fn create(root: &StateRoot, id: &str, opts: &CreateOptions) -> Result<()> {
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
    container.start().map_err(|e| op_err("start", id, e))
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
    if let Err(e) = container.start() {
        let _ = destroy(&mut container);
        return Err(op_err("start", id, e));
    }
    let Some(guard) = guard else {
        return Ok(0);
    };
    // The lock is not held while the container runs: `runsbx kill`, `state`
    // and `exec` on it must work meanwhile.
    drop(lock);
    let status = guard.wait_forwarding(pid);
    if !keep {
        let _lock = root.lock(id)?;
        if let Ok(mut container) = load(root, id) {
            destroy(&mut container)?;
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
    if !alive && !(all && status == ContainerStatus::Stopped) {
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
        Err(RuntimeError::NotFound { .. }) if force => {
            // Half-created state without a state file is removed too.
            let dir = root.container_dir(id);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)
                    .map_err(|e| RuntimeError::io(format!("remove {dir:?}"), e))?;
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    match container.status() {
        ContainerStatus::Stopped | ContainerStatus::Created => {}
        _ if force => {}
        _ => return Err(wrong_state(&container, "delete (use --force)")),
    }
    destroy(&mut container)
}

pub fn pause(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = load(root, id)?;
    if !container.can_pause() {
        return Err(wrong_state(&container, "pause"));
    }
    require_cgroups("pause")?;
    container.pause().map_err(|e| op_err("pause", id, e))
}

pub fn resume(root: &StateRoot, id: &str) -> Result<()> {
    let _lock = root.lock(id)?;
    let mut container = load(root, id)?;
    if !container.can_resume() {
        return Err(wrong_state(&container, "resume"));
    }
    require_cgroups("resume")?;
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
    _lock: &IdLock,
) -> Result<Container> {
    if root.container_dir(id).exists() {
        return Err(RuntimeError::Exists { id: id.to_owned() });
    }
    let bundle = bundle::load(&opts.bundle)?;
    if !host::can_manage_cgroups() {
        if bundle.spec.linux().as_ref().and_then(|l| l.resources().as_ref()).is_some() {
            tracing::warn!(
                id,
                "cgroups cannot be managed here (rootless, or no cgroup hierarchy): \
                 linux.resources is not applied; rely on rlimits"
            );
        }
    }
    let built = ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_root_path(root.path())
        .and_then(|b| b.with_pid_file(opts.pid_file.as_ref()))
        .map(|b| {
            b.with_console_socket(opts.console_socket.as_ref())
                .with_preserved_fds(opts.preserve_fds)
                .as_init(&bundle.dir)
                // runsbx never drives systemd; cgroupfs directly.
                .with_systemd(false)
                .with_detach(detach)
                .with_no_pivot(opts.no_pivot)
        })
        .and_then(|b| b.build());
    let mut container = match built {
        Ok(container) => container,
        Err(e) => {
            // libcontainer cleans up after most failures; make sure no state
            // directory or process outlives a failed create.
            if let Ok(mut c) = Container::load(root.container_dir(id)) {
                let _ = destroy(&mut c);
            }
            let dir = root.container_dir(id);
            if dir.exists() {
                let _ = std::fs::remove_dir_all(&dir);
            }
            return Err(op_err("create", id, e));
        }
    };
    if let Err(e) = prepare_network(&container) {
        let _ = destroy(&mut container);
        return Err(e);
    }
    Ok(container)
}

/// Sets `lo` up when the container got a network namespace of its own.
fn prepare_network(container: &Container) -> Result<()> {
    let pid = init_pid(container)?;
    if netns::has_own_netns(pid)? {
        netns::loopback_up(pid)?;
    }
    Ok(())
}

/// Kills every process of the container and removes its state.
fn destroy(container: &mut Container) -> Result<()> {
    let id = container.id().to_owned();
    if !host::can_manage_cgroups() {
        // libcontainer kills through the cgroup, which does not exist here:
        // kill by pid namespace and wait for the init process to be gone.
        if let Some(pid) = container.pid() {
            procs::kill_and_wait(pid)?;
        }
        container.set_status(ContainerStatus::Stopped);
    }
    container
        .delete(true)
        .map_err(|e| op_err("delete", &id, e))
}

fn require_cgroups(op: &'static str) -> Result<()> {
    if host::can_manage_cgroups() {
        return Ok(());
    }
    Err(RuntimeError::invalid(
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
        source,
    }
}
