//! Helper processes that share runsbx's memory (CLONE_VM): the holder of a
//! new user namespace (userns.rs) and a call's watchdog (call/sweep.rs).
//!
//! A fork copies runsbx's page tables, tears the copy down again when the
//! child exits, and in between makes runsbx fault on every page it writes.
//! For a helper that only waits, that was most of its cost: 0.4-0.5 ms of
//! a cold run for the holder, about 0.75 ms of a call for the watchdog
//! (alternating rounds of 30 calls, forked against cloned). A child cloned
//! with CLONE_VM costs none of it, but it runs in runsbx's address space
//! beside runsbx's own threads, so it may only:
//!
//! - run on the stack it is given ([`Stack`]), with a guard page below;
//! - read what runsbx prepared for it and keeps until it is reaped;
//! - make raw system calls ([`syscall`]): no allocation, no libc function
//!   that touches errno or any other thread-local state (it shares the
//!   creating thread's);
//! - leave by returning (glibc's `clone` then calls `exit`) or by `execve`,
//!   which gives it an address space of its own.
//!
//! Every signal is blocked in it from its first instruction ([`spawn`]), so
//! no handler of runsbx's ever runs on its stack.

use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::unistd::Pid;

#[cfg(target_arch = "x86_64")]
#[path = "../../stub/syscall.rs"]
mod raw;

/// A raw system call; returns the result or `-errno`.
///
/// # Safety
/// The arguments must be what system call `n` takes.
pub(crate) unsafe fn syscall(n: libc::c_long, a: [usize; 6]) -> isize {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as the caller promises.
    return unsafe { raw::syscall(n as usize, a) };
    // Elsewhere through libc's syscall(), which on a failure writes errno,
    // the creating thread's: a failure's errno may then be another's (the
    // helpers treat every failure of theirs alike, and runsbx's own calls
    // read errno right after theirs).
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller promises.
    unsafe {
        match libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]) {
            -1 => -(*libc::__errno_location() as isize),
            r => r as isize,
        }
    }
}

/// Clones a child into `flags` (besides CLONE_VM and SIGCHLD) that runs
/// `body(arg)` on `stack`, with every signal blocked.
///
/// # Safety
/// `body` must keep to what the module comment allows, and `arg` and
/// `stack` must stay valid until the child is reaped or has exec'd.
pub(crate) unsafe fn spawn(
    flags: c_int,
    body: extern "C" fn(*mut c_void) -> c_int,
    arg: *mut c_void,
    stack: &Stack,
) -> nix::Result<Pid> {
    use nix::sys::signal::{SigSet, SigmaskHow};
    let before = SigSet::all().thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    // SAFETY: as the caller promises; the child starts with the mask
    // blocked above and keeps it.
    let pid = unsafe {
        libc::clone(
            body,
            stack.top(),
            libc::CLONE_VM | libc::SIGCHLD | flags,
            arg,
        )
    };
    let pid = Errno::result(pid);
    let restored = before.thread_set_mask();
    let pid = pid?;
    restored.map(|()| Pid::from_raw(pid)).inspect_err(|_| {
        // Not reachable in practice (the mask was set a moment ago). The
        // caller gets no pid to reap, so the child is killed and reaped
        // here rather than left a zombie with its stack still in use.
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
    })
}

/// A small stack for a [`spawn`]ed child, with a guard page below it.
#[derive(Debug)]
pub(crate) struct Stack {
    base: NonNull<c_void>,
}

impl Stack {
    const GUARD: usize = 4096;
    const SIZE: usize = 64 * 1024;

    pub(crate) fn new() -> nix::Result<Self> {
        // SAFETY: a fresh anonymous mapping, unmapped only by Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::GUARD + Self::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let stack = Stack {
            base: NonNull::new(base).ok_or(Errno::ENOMEM)?,
        };
        // SAFETY: the mapping's first page.
        Errno::result(unsafe {
            libc::mprotect(stack.base.as_ptr(), Self::GUARD, libc::PROT_NONE)
        })?;
        Ok(stack)
    }

    /// Where the stack starts (it grows down), 16-byte aligned.
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping.
        unsafe { self.base.as_ptr().byte_add(Self::GUARD + Self::SIZE) }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; its owner drops it only once
        // the child that used it is reaped (or has exec'd).
        unsafe { libc::munmap(self.base.as_ptr(), Self::GUARD + Self::SIZE) };
    }
}
