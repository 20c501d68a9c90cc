//! The container's network namespace, seen from the host side.
//!
//! libcontainer 0.7 never brings `lo` up in a new network namespace, so a
//! sandbox could not even talk to itself on 127.0.0.1. runsbx does it after
//! the container is created and before its process starts: a short-lived
//! helper forked from runsbx enters the container's user namespace (when it
//! has its own: that is what gives a rootless caller CAP_NET_ADMIN over the
//! network namespace) and then its network namespace, and sets `lo` up.
//! Nothing runs inside the container for this.

use std::os::fd::{FromRawFd, OwnedFd};

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use crate::error::{Result, RuntimeError};

/// Sets `lo` up in the network namespace of process `pid`, joining its
/// user namespace first when `own_userns` (the spec gave it one).
pub fn loopback_up(pid: Pid, own_userns: bool) -> Result<()> {
    in_namespaces_of(pid, own_userns, "bring up `lo`", &set_lo_up)
}

/// A TCP socket listening on 127.0.0.1:`port` inside the network namespace
/// of process `pid`, served from the host side (the egress proxy). The
/// helper that made it passes it back over a socketpair (SCM_RIGHTS);
/// nothing stays inside the sandbox but the socket.
pub fn listen_in(pid: Pid, own_userns: bool, port: u16) -> Result<std::net::TcpListener> {
    use nix::sys::socket::{
        recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
        SockFlag, SockType,
    };
    use std::os::fd::AsRawFd;
    let ctx =
        |step: &str| format!("listen on 127.0.0.1:{port} in the sandbox of pid {pid}: {step}");
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys(ctx("socketpair"), e))?;
    let send = || -> i32 {
        let listener = match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => l,
            Err(e) => return e.raw_os_error().unwrap_or(libc::EIO),
        };
        let fds = [listener.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(b"L")];
        match sendmsg::<()>(theirs.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
            Ok(_) => 0,
            Err(e) => e as i32,
        }
    };
    in_namespaces_of(pid, own_userns, "make the proxy's listening socket", &send)?;
    drop(theirs);
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys(ctx("recvmsg"), e))?;
    for cmsg in msg
        .cmsgs()
        .map_err(|e| RuntimeError::sys(ctx("cmsgs"), e))?
    {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            if let Some(fd) = fds.first() {
                // SAFETY: the kernel just installed this fd in our table.
                return Ok(std::net::TcpListener::from(unsafe {
                    OwnedFd::from_raw_fd(*fd)
                }));
            }
        }
    }
    Err(RuntimeError::invalid(ctx("helper"), "sent no socket"))
}

/// Runs `f` in a child process that has joined the network namespace of
/// `pid` (and its user namespace when `own_userns`). `f` returns 0 or an
/// errno.
///
/// The namespaces are entered through a pidfd, not /proc/<pid>/ns: until it
/// execs, the container's init process is not dumpable and its memory
/// belongs to the initial user namespace, so a rootless caller may not open
/// its /proc/<pid>/ns files, though it owns the namespaces.
fn in_namespaces_of(pid: Pid, own_userns: bool, what: &str, f: &dyn Fn() -> i32) -> Result<()> {
    let ctx = |step: &str| format!("{what} in the network namespace of pid {pid}: {step}");
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(RuntimeError::sys(ctx("pidfd_open"), nix::Error::last()));
    }
    // SAFETY: the kernel just returned this fd to us.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let flags = if own_userns {
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET
    } else {
        CloneFlags::CLONE_NEWNET
    };

    // SAFETY: runsbx is single-threaded when it calls this (libcontainer
    // requires it too), so the child may run arbitrary code; it only makes
    // syscalls and exits with _exit.
    match unsafe { fork() }.map_err(|e| RuntimeError::sys(ctx("fork"), e))? {
        ForkResult::Child => {
            let code = match setns(&pidfd, flags) {
                // 128 + errno tells the parent which step failed and why.
                Err(e) => 128 + (e as i32).clamp(1, 127),
                Ok(()) => match f() {
                    0 => 0,
                    errno => errno.clamp(1, 99),
                },
            };
            // SAFETY: _exit skips atexit handlers and destructors that belong
            // to the parent's state.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => loop {
            match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, 0)) => return Ok(()),
                Ok(WaitStatus::Exited(_, code)) if code > 128 => {
                    return Err(RuntimeError::sys(
                        ctx(&format!("setns({flags:?})")),
                        nix::Error::from_raw(code - 128),
                    ))
                }
                Ok(WaitStatus::Exited(_, errno)) => {
                    return Err(RuntimeError::sys(
                        ctx("in the namespace"),
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
