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
//!
//! [`sibling`] is the other fork: `runsbx serve`'s zygote, single-threaded
//! for its whole life, forks each pool worker as its parent's child, and
//! that copy becomes a whole runsbx process (it leaves by `exit`).

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

/// Which process [`sibling`] returned in.
pub enum Sibling {
    /// The caller, with the new process's pid.
    Caller(Pid),
    /// The new process: a copy of the caller, its parent's child.
    New,
}

/// Forks a copy of this process that is its parent's child rather than
/// its own (`CLONE_PARENT`): the parent waits for and signals it as one of
/// its own. For `runsbx serve`'s zygote, which forks each pool worker for
/// serve.
///
/// # Safety
///
/// The caller must be single-threaded (no lock is then held by a thread
/// the copy does not have), and the copy must leave by exiting, never
/// returning into the caller's state it does not own.
pub unsafe fn sibling() -> nix::Result<Sibling> {
    // SAFETY: clone with a null stack goes on in the copy on a copy of
    // this stack, as fork(2) does; see the function's own contract.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::CLONE_PARENT | libc::SIGCHLD,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match pid {
        0 => Ok(Sibling::New),
        p if p > 0 => i32::try_from(p)
            .map(|p| Sibling::Caller(Pid::from_raw(p)))
            .map_err(|_| nix::Error::EOVERFLOW),
        _ => Err(nix::Error::last()),
    }
}

/// Runs Rust's CPU-feature detection now, in this process, so that every
/// process it forks from here on finds the answer in memory.
///
/// The detection runs once per process, at the first question (memchr asks
/// it the first time it searches: in a sandbox's init, under the rootfs
/// mounts). It is a dozen `cpuid` instructions, and on a VM each traps to
/// the hypervisor: 6 us apiece on the machines this was measured on, about
/// 60-80 us of every sandbox's build. Asked once in a process that forks
/// many (the pool's zygote), it costs nothing per sandbox.
pub fn detect_cpu_features() {
    // Any feature: the first question fills in the answers to all.
    #[cfg(target_arch = "x86_64")]
    let _ = std::arch::is_x86_feature_detected!("avx2");
}
