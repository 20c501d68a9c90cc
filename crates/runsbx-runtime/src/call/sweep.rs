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
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::root::StateRoot;
use crate::{host, lifecycle, policy};

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
        reclaim(root, &id, None);
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

fn reclaim(root: &StateRoot, id: &str, userns: Option<u64>) {
    // Every process first, found without the state file, which may be
    // missing, half-written, or name only the init: by user namespace
    // (rootless), by the notify socket a waiting init listens on, and by
    // cgroup (as root). libcontainer's intermediate process joins the
    // cgroup by itself shortly after it is cloned, so the search goes on
    // until it has come up empty several times in a row.
    let mut quiet = 0;
    for _ in 0..200 {
        if kill_processes(root, id, userns) == 0 {
            quiet += 1;
            if quiet == 5 {
                break;
            }
        } else {
            quiet = 0;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if host::can_manage_cgroups() {
        remove_cgroup(&lifecycle::runsbx_cgroup_path(root, id));
    }
    let dir = root.container_dir(id);
    // Then the state, through libcontainer when it loads.
    if let Ok(mut c) = lifecycle::load(root, id) {
        if let Err(e) = lifecycle::destroy(root, &mut c) {
            tracing::debug!(id, "delete the interrupted call's sandbox: {e}");
        }
    }
    let _ = fs::remove_dir_all(&dir);
    release_orphan_slot(root, id);
    if let Err(e) = lifecycle::release_host_side(root, id) {
        tracing::warn!(id, "release the interrupted call's host resources: {e}");
    }
}

/// Processes whose user namespace is `ino` or a descendant of it.
fn in_user_namespace(ino: u64) -> Vec<Pid> {
    let mut found = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(mut ns) = fs::File::open(proc_entry.path().join("ns/user")) else {
            continue;
        };
        // Walk up to the initial namespace (NS_GET_PARENT fails there).
        for _ in 0..32 {
            if ns.metadata().is_ok_and(|m| m.ino() == ino) {
                found.push(Pid::from_raw(pid));
                break;
            }
            match crate::cgroupless::parent_ns(&ns) {
                Ok(parent) => ns = fs::File::from(parent),
                Err(_) => break,
            }
        }
    }
    found
}

/// Processes holding the unix socket bound at `path` (found through
/// /proc/net/unix and every process's fds).
fn socket_holders(path: &Path) -> Vec<Pid> {
    let Ok(table) = fs::read_to_string("/proc/net/unix") else {
        return Vec::new();
    };
    let wanted = path.as_os_str().to_string_lossy();
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() >= 8 && fields[7] == wanted).then(|| format!("socket:[{}]", fields[6]))
        })
        .collect();
    if inodes.is_empty() {
        return Vec::new();
    }
    let mut holders = Vec::new();
    for proc_entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = proc_entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(fds) = fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
        });
        if holds {
            holders.push(Pid::from_raw(pid));
        }
    }
    holders
}

/// SIGKILLs every process of call `id` found right now (and, given a user
/// namespace, every process in it or below it); how many.
fn kill_processes(root: &StateRoot, id: &str, userns: Option<u64>) -> usize {
    let mut pids = Vec::new();
    if let Some(userns) = userns {
        pids.extend(in_user_namespace(userns));
    }
    pids.extend(socket_holders(&root.container_dir(id).join("notify.sock")));
    if host::can_manage_cgroups() {
        pids.extend(cgroup_procs(&lifecycle::runsbx_cgroup_path(root, id)));
    }
    let me = Pid::this();
    pids.retain(|p| *p != me);
    for pid in &pids {
        tracing::info!(id, %pid, "killing a process of the interrupted call");
        let _ = kill(*pid, Signal::SIGKILL);
    }
    pids.len()
}

/// The container's cgroup directories: in each v1 hierarchy, or the
/// unified one, where it exists.
fn cgroup_dirs(path: &Path) -> Vec<PathBuf> {
    let rel = path.strip_prefix("/").unwrap_or(path);
    let mut dirs: Vec<PathBuf> = vec![Path::new("/sys/fs/cgroup").join(rel)];
    for entry in fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        dirs.push(entry.path().join(rel));
    }
    dirs.retain(|d| d.join("cgroup.procs").is_file());
    dirs
}

fn cgroup_procs(path: &Path) -> Vec<Pid> {
    let mut pids: Vec<Pid> = cgroup_dirs(path)
        .iter()
        .flat_map(|d| {
            fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .map(Pid::from_raw)
                .collect::<Vec<_>>()
        })
        .collect();
    pids.sort();
    pids.dedup();
    pids
}

fn remove_cgroup(path: &Path) {
    for d in cgroup_dirs(path) {
        // Killed processes leave the cgroup once they are fully gone.
        for _ in 0..100 {
            match fs::remove_dir(&d) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(5))
                }
                _ => break,
            }
        }
    }
}

/// An id range allocated to `id` whose slot was never recorded (killed
/// between the two steps): found by its owner line in the allocation file.
fn release_orphan_slot(root: &StateRoot, id: &str) {
    if host::rootless() {
        return;
    }
    let owner = format!("{}\n{id}", root.path().display());
    for entry in fs::read_dir(policy::ID_DIR).into_iter().flatten().flatten() {
        // Allocation files are tiny; anything else is not one of ours.
        if entry.metadata().is_ok_and(|m| m.size() > 4096) {
            continue;
        }
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        // An empty file: its allocator was killed between creating it and
        // writing its owner (one write, right after); after a while it is
        // nobody's.
        let stale_empty = text.is_empty()
            && entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| {
                t.elapsed().unwrap_or_default() > std::time::Duration::from_secs(10)
            });
        if text == owner || stale_empty {
            let _ = fs::remove_file(entry.path());
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
    pub(crate) fn spawn(root: &StateRoot, id: &str) -> crate::Result<Self> {
        use crate::error::RuntimeError;
        use nix::unistd::{fork, ForkResult};
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RuntimeError::sys("pipe2 for the call's watchdog", e))?;
        let parent = nix::unistd::getpid();
        // SAFETY: runsbx is single-threaded here (no proxy, no container
        // yet); the child only makes syscalls and exits.
        match unsafe { fork() }.map_err(|e| RuntimeError::sys("fork the call's watchdog", e))? {
            ForkResult::Parent { child } => {
                drop(r);
                Ok(Self {
                    pid: child,
                    disarm: w,
                })
            }
            ForkResult::Child => {
                drop(w);
                let code = watch(root, id, parent, r);
                // SAFETY: leaving the forked child without running the
                // parent's destructors or atexit handlers.
                unsafe { libc::_exit(code) }
            }
        }
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
    let userns = crate::cgroupless::userns_from()
        .and_then(|_| fs::metadata("/proc/self/ns/user").ok())
        .map(|m| m.ino());
    match root.lock(id) {
        Ok(_lock) => {
            reclaim(root, id, userns);
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
