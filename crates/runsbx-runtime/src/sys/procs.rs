//! Finding and signalling a container's processes without a cgroup.
//!
//! As root runsbx puts every container in a cgroup and libcontainer finds
//! its processes there. Rootless on a cgroup v1 host there is no cgroup to
//! use; every runsbx container has its own pid namespace, so its processes
//! are the ones whose pid namespace is the init process's.

use std::fs;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};

/// How long to wait for a killed container's init process to disappear.
const KILL_WAIT: Duration = Duration::from_secs(10);

fn pidns_of(pid: i32) -> Option<(u64, u64)> {
    let meta = fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    Some((meta.dev(), meta.ino()))
}

/// The host pids of every process in the pid namespace of `init`; just
/// `init` when it shares our pid namespace (never the host's processes).
pub fn pids_in_namespace_of(init: Pid) -> Result<Vec<Pid>> {
    let Some(target) = pidns_of(init.as_raw()) else {
        // Not readable: a created container's init before it execs (not
        // dumpable, see netns.rs). Nothing else can run in it yet.
        return Ok(vec![init]);
    };
    if pidns_of(std::process::id() as i32) == Some(target) {
        return Ok(vec![init]);
    }
    let entries =
        fs::read_dir("/proc").map_err(|e| RuntimeError::io("read /proc".to_owned(), e))?;
    let mut pids: Vec<Pid> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| pidns_of(*pid) == Some(target))
        .map(Pid::from_raw)
        .collect();
    pids.sort();
    Ok(pids)
}

/// Sends `signal` to every process of the container whose init is `init`.
pub fn signal_all(init: Pid, signal: Signal) -> Result<()> {
    for pid in pids_in_namespace_of(init)? {
        match kill(pid, signal) {
            Ok(()) | Err(nix::Error::ESRCH) => {}
            Err(e) => {
                return Err(RuntimeError::sys(format!("kill({pid}, {signal})"), e));
            }
        }
    }
    Ok(())
}

/// SIGKILLs the container and waits until its init process is gone (or a
/// zombie for its parent to reap). The kernel kills the rest of the pid
/// namespace when its init dies.
pub fn kill_and_wait(init: Pid) -> Result<()> {
    match kill(init, Signal::SIGKILL) {
        Ok(()) | Err(nix::Error::ESRCH) => {}
        Err(e) => return Err(RuntimeError::sys(format!("kill({init}, SIGKILL)"), e)),
    }
    signal_all(init, Signal::SIGKILL)?;
    let deadline = Instant::now() + KILL_WAIT;
    while alive(init) {
        if Instant::now() > deadline {
            return Err(RuntimeError::invalid(
                format!("container process {init}"),
                format!("still alive {}s after SIGKILL", KILL_WAIT.as_secs()),
            ));
        }
        sleep(Duration::from_millis(2));
    }
    Ok(())
}

/// When `pid` started (clock ticks after boot, `/proc/<pid>/stat` field
/// 22): with the pid, it names one process across pid reuse, and an exec
/// keeps it.
pub fn start_time(pid: Pid) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields from the third (the state) on follow the parenthesised name.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// Whether `pid` exists and is neither a zombie nor dead.
pub fn alive(pid: Pid) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the field after the parenthesised command name.
        Ok(stat) => match stat.rsplit_once(')') {
            Some((_, rest)) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        },
        Err(_) => false,
    }
}

/// This process's children, with their names (`/proc/<pid>/comm`).
pub fn children() -> Vec<(Pid, String)> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: the name may hold spaces and parentheses.
        let (Some((head, rest)), Some(open)) = (stat.rsplit_once(')'), stat.find('(')) else {
            continue;
        };
        if rest.split_whitespace().nth(1) == Some(me.as_str()) {
            found.push((Pid::from_raw(pid), head[open + 1..].to_owned()));
        }
    }
    found
}

/// A pidfd for `pid`: it keeps naming that process even if the pid is
/// reused, and `setns` accepts it for the process's namespaces.
pub(crate) fn pidfd_open(pid: Pid) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(RuntimeError::sys(
            format!("pidfd_open({pid})"),
            nix::Error::last(),
        ));
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_names_one_process() -> std::io::Result<()> {
        let me = start_time(Pid::this());
        assert!(me.is_some());
        assert_eq!(start_time(Pid::this()), me);
        // A child started later has a later (or, within a tick, the same)
        // start time; a pid that does not exist has none.
        let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
        let theirs = start_time(Pid::from_raw(child.id() as i32));
        let _ = child.kill();
        let _ = child.wait();
        assert!(theirs >= me, "{theirs:?} < {me:?}");
        assert_eq!(start_time(Pid::from_raw(i32::MAX)), None);
        Ok(())
    }

    #[test]
    fn children_are_found_with_their_names() -> std::io::Result<()> {
        let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
        let found = children();
        let _ = child.kill();
        let _ = child.wait();
        let pid = Pid::from_raw(child.id() as i32);
        assert!(found.contains(&(pid, "sleep".to_owned())), "{found:?}");
        assert!(!found.iter().any(|(p, _)| *p == Pid::this()), "{found:?}");
        Ok(())
    }
}
