//! Removing what a `runsbx call` killed with SIGKILL left behind.
//!
//! A call holds the lock of its id for its whole life, so a call directory
//! whose lock can be taken belongs to a runsbx that is gone. What it may
//! have left depends on where it was killed: nothing but directories; a
//! container init that was cloned but whose pid was never recorded (it
//! waits on the container's notify socket for a `start` that never comes);
//! a half-written state file; a running sandbox; a cgroup; an id range.
//! Each is found without trusting the state file: the init by the socket it
//! listens on, the rest of a root sandbox by its cgroup.

use std::fs;
use std::os::unix::fs::MetadataExt;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::state::root::StateRoot;

/// Sweeps every abandoned call of `root`. Best effort: what cannot be
/// removed is logged and left for the next sweep.
pub fn sweep(root: &StateRoot) {
    let Ok(entries) = fs::read_dir(root.path().join("@calls")) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(Some(_lock)) = root.try_lock(&id) else {
            continue;
        };
        tracing::info!(id, "removing what an interrupted call left behind");
        // No user namespace to search by here: a dead call's namespace
        // number may already be a live one's. Its watchdog searched it.
        crate::sandbox::teardown::reclaim(root, &id, None);
        let _ = fs::remove_dir_all(entry.path());
    }
    // A call killed between taking its lock and making its directory left
    // only the lock file: taken and dropped, it goes (IdLock removes the
    // file of an id without a container).
    let Ok(locks) = fs::read_dir(root.path().join("@locks")) else {
        return;
    };
    for entry in locks.flatten() {
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if id.starts_with("call-") && !root.container_dir(&id).exists() {
            let _ = root.try_lock(&id);
        }
    }
}

/// A process forked at the start of a call that outlives a runsbx killed
/// with SIGKILL and removes what it left: its sandbox processes (by user
/// namespace when rootless, by cgroup and notify socket as root), its
/// state, mounts' directories and id range. A call that ends normally
/// drops it.
pub(crate) struct Watchdog {
    pid: Pid,
    disarm: std::os::fd::OwnedFd,
}

impl Watchdog {
    /// Forks the watchdog. Call it before the container is created (the
    /// process must still be single-threaded) and after the call's
    /// directory exists.
    pub(crate) fn spawn(root: &StateRoot, id: &str) -> crate::error::Result<Self> {
        use crate::error::RuntimeError;
        use std::os::fd::AsFd;
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RuntimeError::sys("pipe2 for the call's watchdog", e))?;
        let parent = nix::unistd::getpid();
        let pid = crate::sys::fork::child("the call's watchdog", &[w.as_fd()], || {
            watch(root, id, parent, r)
        })?;
        Ok(Self { pid, disarm: w })
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

fn watch(root: &StateRoot, id: &str, parent: Pid, disarm: std::os::fd::OwnedFd) -> i32 {
    use nix::sys::signal::{SigSet, SigmaskHow};
    // Out of the call's process group and session: a terminal's or a
    // supervisor's kill of the whole group (runsbx with it) must leave the
    // watchdog to clean up after runsbx.
    let _ = nix::unistd::setsid();
    // The watchdog holds nothing of the caller's: its stdout must not keep
    // a pipe open for whoever reads runsbx's output.
    if let Ok(null) = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGUSR1);
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&mask), None);
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1) };
    if nix::unistd::getppid() != parent {
        // The parent died before the death signal was armed.
        return abandon(root, id);
    }
    let Ok(sfd) = nix::sys::signalfd::SignalFd::new(&mask) else {
        return 1;
    };
    use std::os::fd::AsFd;
    let mut fds = [
        nix::poll::PollFd::new(disarm.as_fd(), nix::poll::PollFlags::POLLIN),
        nix::poll::PollFd::new(sfd.as_fd(), nix::poll::PollFlags::POLLIN),
    ];
    loop {
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {
            Ok(_) => {}
            Err(nix::Error::EINTR) => continue,
            Err(_) => return 1,
        }
        let disarmed = fds[0].revents().is_some_and(|r| !r.is_empty());
        let orphaned = fds[1].revents().is_some_and(|r| !r.is_empty());
        if disarmed && !orphaned {
            let mut byte = [0u8; 1];
            // A byte: the call is done. EOF without it: the pipe's write end
            // is gone with every process that held it, so the call is dead.
            if nix::unistd::read(std::os::fd::AsRawFd::as_raw_fd(&disarm), &mut byte) == Ok(1) {
                return 0;
            }
        }
        if orphaned || disarmed {
            return abandon(root, id);
        }
    }
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
            // The watchdog shares the call's private mount namespace: the
            // workspace tmpfs is still mounted here.
            let dir = root.path().join("@calls").join(id);
            let _ = nix::mount::umount2(&dir.join("workspace"), nix::mount::MntFlags::MNT_DETACH);
            let _ = fs::remove_dir_all(dir);
            0
        }
        Err(_) => 1,
    }
}
