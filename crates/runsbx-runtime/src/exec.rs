//! exec: a new process in a running container.

use std::collections::HashMap;
use std::path::PathBuf;

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::syscall::syscall::SyscallType;

use crate::error::Result;
use crate::exec_guard::ExecGuard;
use crate::lifecycle::{load, op_err};
use crate::root::StateRoot;
use crate::supervise::SignalGuard;
use crate::{cgroupless, host};

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
    pub tty: bool,
    pub console_socket: Option<PathBuf>,
    pub detach: bool,
    pub pid_file: Option<PathBuf>,
    pub preserve_fds: i32,
    pub no_new_privs: bool,
    pub caps: Vec<String>,
    pub ignore_paused: bool,
    pub sub_cgroup: Option<String>,
}

/// Runs a process in container `id`. Detached, returns 0 once it runs;
/// otherwise its exit code (128 + N when killed by signal N).
pub fn exec(root: &StateRoot, id: &str, opts: &ExecOptions) -> Result<i32> {
    let lock = root.lock(id)?;
    let container = load(root, id)?;
    if !container.can_exec() {
        return Err(crate::error::RuntimeError::WrongState {
            id: id.to_owned(),
            status: crate::lifecycle::status_name(container.status()).to_owned(),
            op: "exec",
        });
    }
    // Without cgroups, libcontainer's exec needs the same view as create.
    let shadow = if host::can_manage_cgroups() {
        None
    } else {
        let init = crate::lifecycle::init_pid(&container)?;
        let config = container
            .spec()
            .map_err(|e| op_err("read config of", id, e))?;
        Some(cgroupless::enter_for_exec(init, &config.cgroup_path)?)
    };
    // The container's seccomp filter and rlimits, which libcontainer's exec
    // would not apply (see exec_guard.rs).
    let effective = crate::bundle::load(container.bundle())?;
    let guard = ExecGuard::for_container(&effective.spec);
    let pid = ContainerBuilder::new(id.to_owned(), SyscallType::default())
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
                .with_process(opts.process.as_ref())
                .with_no_new_privs(opts.no_new_privs)
                .with_container_args(opts.args.clone())
                .with_additional_gids(opts.additional_gids.clone())
                .with_user(opts.user)
                .with_group(opts.group)
                .with_capabilities(opts.caps.clone())
                .with_ignore_paused(opts.ignore_paused)
                .with_sub_cgroup(opts.sub_cgroup.clone())
                .build()
        })
        .map_err(|e| op_err("exec in", id, e))?;
    if let Some(shadow) = shadow {
        shadow.leave()?;
    }
    drop(lock);
    if opts.detach {
        return Ok(0);
    }
    // Blocking after the process exists is safe: `wait_forwarding` reaps
    // before it first waits for a signal.
    SignalGuard::block_all()?.wait_forwarding(pid)
}
