//! Removing what a `runsbx call` killed with SIGKILL left behind.
//!
//! A call holds the lock of its id for its whole life, so a call's lock
//! file that can be locked belongs to a runsbx that is gone. What it may
//! have left depends on where it was killed: nothing but records; a
//! container init that was cloned but whose pid was never recorded (it
//! waits on the container's notify socket for a `start` that never comes);
//! a half-written state file; a running sandbox; a cgroup; an id range.
//! Each is found without trusting the state file: the init by the socket it
//! listens on, the rest of a root sandbox by its cgroup.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::raw::{c_char, c_int, c_void};
use std::os::unix::fs::MetadataExt;

use nix::unistd::Pid;

use crate::state::root::StateRoot;
use crate::sys::vm_child;

/// Sweeps every abandoned call of `root`. Best effort: what cannot be
/// removed is logged and left for the next sweep.
///
/// A call is found by its lock file (`@locks/call-…`), the first thing it
/// makes and the last it removes; its own directory is in a tmpfs that only
/// its mount namespace saw, gone with it. An `@calls/<id>` directory on the
/// host is an older runsbx's, removed with its call.
pub fn sweep(root: &StateRoot) {
    let Ok(locks) = fs::read_dir(root.path().join("@locks")) else {
        return;
    };
    for entry in locks.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !id.starts_with("call-") {
            continue;
        }
        // Held: a live call. Otherwise what the call made, whenever it was
        // killed, goes by its records (an id slot, too, whose record was
        // never written); and once the lock is dropped, its file (IdLock
        // removes the file of an id without a container).
        let Ok(Some(_lock)) = root.try_lock(&id) else {
            continue;
        };
        tracing::info!(id, "removing what an interrupted call left behind");
        // No user namespace to search by here: a dead call's namespace
        // number may already be a live one's. Its watchdog searched it.
        crate::sandbox::teardown::reclaim(root, &id, None);
        let _ = crate::sys::beneath::remove_tree(&root.path().join("@calls").join(&id));
    }
}

/// A process started with a call that outlives a runsbx killed with
/// SIGKILL and removes what it left: its sandbox processes (by user
/// namespace when rootless, by cgroup and notify socket as root), its
/// state, mounts' directories and id range. A call that ends normally
/// drops it.
///
/// It shares the call's memory until it is needed (sys/vm_child.rs): a
/// forked watchdog cost each call about 0.75 ms (alternating rounds of 30
/// calls of `/bin/true`, forked against cloned: 14.13 against 13.37 ms). It waits
/// with raw system calls only; when the call's runsbx dies it execs
/// runsbx again (`runsbx --root ROOT abandon-call ID`, hidden), in the
/// call's user and mount namespaces, to do the cleanup ([`abandon`]).
pub(crate) struct Watchdog {
    pid: Pid,
    disarm: OwnedFd,
    /// What the watchdog reads; kept until it is reaped.
    _plan: Box<Plan>,
    _stack: vm_child::Stack,
}

/// Everything the watchdog needs, made before it is cloned: it may not
/// allocate. The pointers point into `_strings` and `_pointers`.
struct Plan {
    parent: libc::pid_t,
    disarm_r: c_int,
    disarm_w: c_int,
    /// {SIGUSR1}, as the kernel's 64-bit signal set.
    usr1: u64,
    exe: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    _strings: Vec<CString>,
    _pointers: [Vec<*const c_char>; 2],
}

impl Watchdog {
    /// Starts the watchdog, after the call's directory exists and before
    /// its container is created.
    pub(crate) fn spawn(root: &StateRoot, id: &str) -> crate::error::Result<Self> {
        use crate::error::RuntimeError;
        let ctx = "start the call's watchdog";
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RuntimeError::sys(ctx, e))?;
        let cstring = |bytes: Vec<u8>| {
            CString::new(bytes).map_err(|e| RuntimeError::invalid(ctx, format!("a NUL in {e}")))
        };
        let args = [
            b"runsbx".to_vec(),
            b"--root".to_vec(),
            root.path().as_os_str().as_encoded_bytes().to_vec(),
            ABANDON_CALL.as_bytes().to_vec(),
            id.as_bytes().to_vec(),
        ];
        let env = std::env::vars_os().map(|(k, v)| {
            let mut kv = k.into_encoded_bytes();
            kv.push(b'=');
            kv.extend(v.into_encoded_bytes());
            kv
        });
        let strings = std::iter::once(b"/proc/self/exe".to_vec())
            .chain(args)
            .chain(env)
            .map(cstring)
            .collect::<crate::error::Result<Vec<_>>>()?;
        let null_terminated = |s: &[CString]| {
            s.iter()
                .map(|c| c.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        // Pointers to the strings' own buffers, which moving the vectors
        // does not move.
        let argv = null_terminated(&strings[1..6]);
        let envp = null_terminated(&strings[6..]);
        let plan = Box::new(Plan {
            parent: nix::unistd::getpid().as_raw(),
            disarm_r: r.as_raw_fd(),
            disarm_w: w.as_raw_fd(),
            usr1: 1 << (libc::SIGUSR1 - 1),
            exe: strings[0].as_ptr(),
            argv: argv.as_ptr(),
            envp: envp.as_ptr(),
            _strings: strings,
            _pointers: [argv, envp],
        });
        let stack = vm_child::Stack::new().map_err(|e| RuntimeError::sys(ctx, e))?;
        let arg = std::ptr::from_ref::<Plan>(&plan).cast_mut().cast();
        // SAFETY: `watch` keeps to sys/vm_child.rs's rules and only reads
        // `plan`, which lives with `stack` until the watchdog is reaped
        // (Drop) or, if runsbx dies first, as long as the watchdog does.
        let pid = unsafe { vm_child::spawn(0, watch, arg, &stack) }
            .map_err(|e| RuntimeError::sys(ctx, e))?;
        drop(r);
        Ok(Self {
            pid,
            disarm: w,
            _plan: plan,
            _stack: stack,
        })
    }
}

impl Drop for Watchdog {
    /// The call cleaned up after itself (or is returning an error, having
    /// removed what it made): the watchdog exits.
    fn drop(&mut self) {
        let _ = nix::unistd::write(&self.disarm, b"d");
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

/// The watchdog's hidden subcommand: `runsbx --root ROOT abandon-call ID`.
pub const ABANDON_CALL: &str = "abandon-call";

/// The watchdog, in the call's memory: out of the call's session, its
/// stdio on /dev/null, told of runsbx's death by SIGUSR1 (read from a
/// signalfd: every signal is blocked), and told a call is done by a byte
/// on its pipe. Raw system calls only (sys/vm_child.rs).
extern "C" fn watch(plan: *mut c_void) -> c_int {
    use libc::{SYS_close, SYS_dup2, SYS_getppid, SYS_open, SYS_poll, SYS_prctl, SYS_read};
    // SAFETY: the plan outlives this child (Watchdog::spawn); every call
    // below is given what it takes.
    unsafe {
        let plan = &*plan.cast::<Plan>();
        let sys = vm_child::syscall;
        // Its copy of the pipe's write end: the pipe must reach EOF when
        // runsbx's goes.
        sys(SYS_close, [plan.disarm_w as usize, 0, 0, 0, 0, 0]);
        // Out of the call's process group and session: a terminal's or a
        // supervisor's kill of the whole group (runsbx with it) must leave
        // the watchdog to clean up after runsbx.
        sys(libc::SYS_setsid, [0; 6]);
        // The watchdog holds nothing of the caller's: its stdout must not
        // keep a pipe open for whoever reads runsbx's output.
        let null = sys(
            SYS_open,
            [
                c"/dev/null".as_ptr() as usize,
                libc::O_RDWR as usize,
                0,
                0,
                0,
                0,
            ],
        );
        if null >= 0 {
            for fd in 0..3 {
                sys(SYS_dup2, [null as usize, fd, 0, 0, 0, 0]);
            }
            if null > 2 {
                sys(SYS_close, [null as usize, 0, 0, 0, 0, 0]);
            }
        }
        let usr1 = libc::SIGUSR1 as usize;
        sys(
            SYS_prctl,
            [libc::PR_SET_PDEATHSIG as usize, usr1, 0, 0, 0, 0],
        );
        if sys(SYS_getppid, [0; 6]) != plan.parent as isize {
            // runsbx died before the death signal was armed.
            return abandon_by_exec(plan);
        }
        let sfd = sys(
            libc::SYS_signalfd4,
            [
                usize::MAX, // -1: a new signalfd
                std::ptr::addr_of!(plan.usr1) as usize,
                std::mem::size_of::<u64>(),
                libc::SFD_CLOEXEC as usize,
                0,
                0,
            ],
        );
        if sfd < 0 {
            return 1;
        }
        let mut fds = [
            libc::pollfd {
                fd: plan.disarm_r,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sfd as c_int,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        loop {
            let n = sys(
                SYS_poll,
                [fds.as_mut_ptr() as usize, 2, usize::MAX, 0, 0, 0],
            );
            if n == -(libc::EINTR as isize) {
                continue;
            }
            if n < 0 {
                return 1;
            }
            let disarmed = fds[0].revents != 0;
            let orphaned = fds[1].revents != 0;
            if disarmed && !orphaned {
                let mut byte = 0u8;
                // A byte: the call is done. EOF without it: the pipe's
                // write end is gone with every process that held it, so
                // the call is dead.
                let into = std::ptr::addr_of_mut!(byte) as usize;
                if sys(SYS_read, [plan.disarm_r as usize, into, 1, 0, 0, 0]) == 1 {
                    return 0;
                }
            }
            if orphaned || disarmed {
                return abandon_by_exec(plan);
            }
        }
    }
}

/// Becomes `runsbx --root ROOT abandon-call ID`, which runs [`abandon`].
///
/// # Safety
/// In the watchdog only, with its plan.
unsafe fn abandon_by_exec(plan: &Plan) -> c_int {
    // SAFETY: the plan's strings and null-terminated arrays.
    unsafe {
        vm_child::syscall(
            libc::SYS_execve,
            [
                plan.exe as usize,
                plan.argv as usize,
                plan.envp as usize,
                0,
                0,
                0,
            ],
        );
    }
    1
}

/// `runsbx abandon-call`: the watchdog, exec'd after its call's runsbx
/// died, then [`abandon`]. Exec kept its mask, every signal blocked, and
/// the death signal pending: that one is ignored (which discards it), the
/// others unblocked again.
pub fn abandon_call(root: &StateRoot, id: &str) -> i32 {
    use nix::sys::signal::{signal, SigHandler, SigSet, Signal};
    // SAFETY: SIG_IGN, no handler.
    let _ = unsafe { signal(Signal::SIGUSR1, SigHandler::SigIgn) };
    let _ = SigSet::empty().thread_set_mask();
    abandon(root, id)
}

/// The call's runsbx is gone: kill what it made and reclaim its state
/// (rootless, this watchdog is in the call's own user namespace, which
/// `reclaim` empties, sparing only the watchdog).
fn abandon(root: &StateRoot, id: &str) -> i32 {
    // Rootless, everything the call made is in this watchdog's own user
    // namespace (alive: its number cannot have been reused) or below it.
    let userns = crate::sys::userns::userns_from()
        .and_then(|_| fs::metadata("/proc/self/ns/user").ok())
        .map(|m| m.ino());
    match root.lock(id) {
        Ok(_lock) => {
            crate::sandbox::teardown::reclaim(root, id, userns);
            // The watchdog shares the call's private mount namespace: what
            // the call mounted in its directory is still mounted here (its
            // workspace; a session's disk and its overlay over the image,
            // which removing the directory through them would empty).
            let dir = root.path().join("@calls").join(id);
            if let Err(e) = runsbx_image::mountinfo::unmount_under(&dir) {
                tracing::warn!(id, "unmount the interrupted call's storage: {e}");
            }
            let _ = crate::sys::beneath::remove_tree(&dir);
            0
        }
        Err(_) => 1,
    }
}
