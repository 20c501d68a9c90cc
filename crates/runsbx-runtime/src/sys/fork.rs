//! The one way runsbx forks a helper of its own (the supervisor, a helper
//! that enters a sandbox's network namespace). Helpers that only wait (the
//! holder of a new user namespace, a call's watchdog) are cloned sharing
//! runsbx's memory instead (vm_child.rs).
//!
//! libcontainer requires runsbx to be single-threaded while it builds a
//! container, and runsbx forks only then, so the child may run ordinary
//! code. It never returns into runsbx: it runs its body and leaves with
//! `_exit`, skipping the destructors and atexit handlers that belong to the
//! parent's state (a lock, a mount guard, a temporary directory).

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::unistd::{fork, ForkResult, Pid};

use crate::error::{Result, RuntimeError};

/// Forks a child that first closes `close_in_child` (the parent's ends of
/// its pipes: a read that waits for EOF must not wait on the child's own
/// copy), then runs `body` and exits with its code. Returns the child's
/// pid in the parent, which closes its own copies of the child's ends.
pub fn child(
    what: &str,
    close_in_child: &[BorrowedFd<'_>],
    body: impl FnOnce() -> i32,
) -> Result<Pid> {
    // SAFETY: runsbx is single-threaded whenever it forks (see the module
    // comment); the child runs `body` and leaves with _exit.
    match unsafe { fork() }.map_err(|e| RuntimeError::sys(format!("fork {what}"), e))? {
        ForkResult::Parent { child } => Ok(child),
        ForkResult::Child => {
            for fd in close_in_child {
                // SAFETY: the parent's copies stay open in the parent; the
                // child's OwnedFds are never dropped (it leaves by _exit).
                unsafe { libc::close(fd.as_raw_fd()) };
            }
            let code = body();
            // SAFETY: see the module comment.
            unsafe { libc::_exit(code) }
        }
    }
}
