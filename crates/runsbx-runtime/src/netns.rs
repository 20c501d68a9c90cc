//! The container's network namespace, seen from the host side.
//!
//! libcontainer 0.7 never brings `lo` up in a new network namespace, so a
//! sandbox could not even talk to itself on 127.0.0.1. runsbx does it after
//! the container is created and before its process starts: a short-lived
//! helper forked from runsbx enters the container's user namespace (when it
//! has its own: that is what gives a rootless caller CAP_NET_ADMIN over the
//! network namespace) and then its network namespace, and sets `lo` up.
//! Nothing runs inside the container for this.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::error::{Result, RuntimeError};

/// Sets `lo` up in the network namespace of process `pid`.
pub fn loopback_up(pid: Pid) -> Result<()> {
    in_namespaces_of(pid, "bring up `lo`", set_lo_up)
}

/// Whether process `pid` has a network namespace of its own (not ours).
pub fn has_own_netns(pid: Pid) -> Result<bool> {
    Ok(!same_ns(pid, "net")?)
}

fn same_ns(pid: Pid, kind: &str) -> Result<bool> {
    let theirs = format!("/proc/{pid}/ns/{kind}");
    let ours = format!("/proc/self/ns/{kind}");
    let a = std::fs::metadata(&theirs).map_err(|e| RuntimeError::io(format!("stat {theirs}"), e))?;
    let b = std::fs::metadata(&ours).map_err(|e| RuntimeError::io(format!("stat {ours}"), e))?;
    Ok(a.ino() == b.ino() && a.dev() == b.dev())
}

/// Runs `f` in a child process that has joined the user (if different from
/// ours) and network namespaces of `pid`. `f` returns 0 or an errno.
fn in_namespaces_of(pid: Pid, what: &str, f: fn() -> i32) -> Result<()> {
    let ctx = |step: &str| format!("{what} in the network namespace of pid {pid}: {step}");
    let open = |kind: &str| {
        let path = format!("/proc/{pid}/ns/{kind}");
        File::open(&path).map_err(|e| RuntimeError::io(ctx(&format!("open {path}")), e))
    };
    let userns = if same_ns(pid, "user")? {
        None
    } else {
        Some(open("user")?)
    };
    let netns = open("net")?;

    // SAFETY: runsbx is single-threaded when it calls this (libcontainer
    // requires it too), so the child may run arbitrary code; it only makes
    // syscalls and exits with _exit.
    match unsafe { fork() }.map_err(|e| RuntimeError::sys(ctx("fork"), e))? {
        ForkResult::Child => {
            let code = (|| {
                if let Some(userns) = &userns {
                    if setns(userns.as_fd(), CloneFlags::CLONE_NEWUSER).is_err() {
                        return 101;
                    }
                }
                if setns(netns.as_fd(), CloneFlags::CLONE_NEWNET).is_err() {
                    return 102;
                }
                match f() {
                    0 => 0,
                    errno => errno.clamp(1, 99),
                }
            })();
            // SAFETY: _exit skips atexit handlers and destructors that belong
            // to the parent's state.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => loop {
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => return Ok(()),
                Ok(WaitStatus::Exited(_, 101)) => {
                    return Err(RuntimeError::invalid(
                        ctx("setns(CLONE_NEWUSER)"),
                        "refused (is this runsbx the owner of the container's user namespace?)",
                    ))
                }
                Ok(WaitStatus::Exited(_, 102)) => {
                    return Err(RuntimeError::invalid(
                        ctx("setns(CLONE_NEWNET)"),
                        "refused (no CAP_SYS_ADMIN over the container's network namespace)",
                    ))
                }
                Ok(WaitStatus::Exited(_, errno)) => {
                    return Err(RuntimeError::sys(
                        ctx("ioctl(SIOCSIFFLAGS)"),
                        nix::Error::from_raw(errno),
                    ))
                }
                Ok(other) => {
                    return Err(RuntimeError::invalid(
                        ctx("helper"),
                        format!("ended unexpectedly: {other:?}"),
                    ))
                }
                Err(nix::Error::EINTR) => continue,
                Err(e) => return Err(RuntimeError::sys(ctx("waitpid"), e)),
            }
        },
    }
}

/// `ip link set lo up`, with the two ioctls it comes down to.
fn set_lo_up() -> i32 {
    // SAFETY: plain syscalls on a zeroed ifreq and an fd we own.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return *libc::__errno_location();
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) < 0 {
            return *libc::__errno_location();
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) < 0 {
            return *libc::__errno_location();
        }
        libc::close(fd);
    }
    0
}
