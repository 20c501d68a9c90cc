//! A container as runsbx keeps it: loading its state, its init, the names
//! of the host resources it holds, and the errors of its operations.

use std::path::{Path, PathBuf};

use libcontainer::container::{Container, ContainerStatus};
use libcontainer::error::LibcontainerError;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};
use crate::state::root::StateRoot;
use crate::sys::cgroup_attach::CGROUP_PARENT;
use crate::sys::{privilege, procs};

/// Loads the state of container `id`, refreshed against its process.
pub fn load(root: &StateRoot, id: &str) -> Result<Container> {
    crate::state::root::validate_id(id)?;
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

/// Who holds a container's host resources (id range, cgroup claim): its
/// state root and id.
pub(crate) fn owner(root: &StateRoot, id: &str) -> String {
    format!("{}\n{id}", root.path().display())
}

/// The name of container `id`'s staged mounts: unique across state roots.
pub(crate) fn stage_key(root: &StateRoot, id: &str) -> String {
    format!("{:08x}-{id}", root_hash(root))
}

/// FNV-1a of the state root's path: stable across runs, unlike std's hasher.
pub(crate) fn root_hash(root: &StateRoot) -> u32 {
    root.path()
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        }) as u32
}

/// The cgroup runsbx gives container `id` of `root` when its spec names
/// none: `/runsbx/<id>` for the default state root; with another state
/// root, whose ids may repeat the default root's, `/runsbx/<hash of the
/// state root>-<id>`.
pub(crate) fn runsbx_cgroup_path(root: &StateRoot, id: &str) -> PathBuf {
    let parent = Path::new("/").join(CGROUP_PARENT);
    if root.path() == crate::state::root::default_root() {
        parent.join(id)
    } else {
        parent.join(stage_key(root, id))
    }
}

pub(crate) fn wrong_state(container: &Container, op: &'static str) -> RuntimeError {
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

pub(crate) fn require_cgroups(op: &'static str) -> Result<()> {
    if privilege::can_manage_cgroups() {
        return Ok(());
    }
    Err(RuntimeError::unsupported(
        op,
        "needs the cgroup freezer, which runsbx cannot manage here \
         (rootless, or no cgroup hierarchy)",
    ))
}

/// Under the container's lock, sends `signal` to its init process, or with
/// `all` to every process in it: `runsbx kill`, and the supervisor at the
/// sandbox's deadline.
pub(crate) fn signal(root: &StateRoot, id: &str, signal: Signal, all: bool) -> Result<()> {
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
    if all && !privilege::can_manage_cgroups() {
        // Without a cgroup the container's processes are found by their pid
        // namespace instead.
        return procs::signal_all(init_pid(&container)?, signal);
    }
    container
        .kill(signal, all)
        .map_err(|e| op_err("kill", id, e))
}
