//! `run`: create and start, then wait in the foreground.

use crate::error::Result;
use crate::ops::create::{build, CreateOptions};
use crate::sandbox::network::start_checked;
use crate::sandbox::supervisor;
use crate::sandbox::teardown::{destroy, destroy_reaped};
use crate::state::container::{init_pid, load, op_err};
use crate::state::root::StateRoot;
use crate::sys::{signal, userns};

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
    userns::reexec_in_own_userns()?;
    let lock = root.lock(id)?;
    let built = build(root, id, opts, detach, &lock)?;
    let checked = built.network_checked;
    let mut container = built.container;
    let pid = init_pid(&container)?;
    // Block the signals we forward, and SIGCHLD, before the process is
    // released: one that exits at once must not be missed (youki 0.7's
    // `run` hangs on `/bin/true` for that reason). The container's process
    // was cloned during build and keeps its own, empty, mask.
    let guard = (!detach).then(signal::SignalGuard::block_all).transpose()?;
    if let Err(e) = start_checked(&mut container, checked.as_deref(), |c| {
        c.start().map_err(|e| op_err("start", id, e))
    }) {
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
    let reaped = status.is_ok();
    // Ended by its deadline: the code `runsbx call` gives a timeout.
    let status = match supervisor::ended(root, id).as_deref() {
        Some(supervisor::TIMED_OUT) => Ok(crate::error::call_exit::TIMED_OUT),
        _ => status,
    };
    if !keep {
        let _lock = root.lock(id)?;
        if let Ok(mut container) = load(root, id) {
            if reaped {
                // No process of its pid namespace is left: the teardown a
                // call uses, without the cgroup manager libcontainer's
                // delete would build.
                destroy_reaped(root, &mut container)?;
            } else {
                destroy(root, &mut container)?;
            }
        }
    }
    status
}
