//! The container's network namespace, seen from the host side.
//!
//! libcontainer 0.7 never brings `lo` up in a new network namespace, so a
//! sandbox could not even talk to itself on 127.0.0.1. runsbx does it after
//! the container is created and before its process starts: a short-lived
//! helper forked from runsbx enters the container's user namespace (when it
//! has its own: that is what gives a rootless caller CAP_NET_ADMIN over the
//! network namespace) and then its network namespace, and sets `lo` up.
//! Nothing runs inside the container for this.
//!
//! The same helper holds the namespace to runsbx's promise when a process
//! is about to run in it (`start`, `exec`): an engine that was told the
//! sandbox's pid may have moved an interface in, given it an address, or
//! routed through it after `create` (root podman does so with `--uidmap`).
//! Every link but `lo` is deleted and every address but loopback's own is
//! removed; with no other link there is no route off the box. What cannot
//! be removed refuses the start.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};

/// Sets `lo` up in the network namespace of process `pid`, joining its
/// user namespace first when `own_userns` (the spec gave it one).
pub fn loopback_up(pid: Pid, own_userns: bool) -> Result<()> {
    in_namespaces_of(pid, own_userns, "bring up `lo`", &|_| set_lo_up()).map(drop)
}

/// Removes from the network namespace of `pid` every interface but `lo`
/// and every address but 127.0.0.1/8 and ::1/128, then reads it again.
/// Returns what was removed (`eth0`, `10.88.0.5/16 on lo`); an error when
/// something could not be removed or is still there.
pub fn hold_to_loopback(pid: Pid, own_userns: bool) -> Result<Vec<String>> {
    use std::io::Write;
    let what = "hold the sandbox to a loopback-only network";
    let out = in_namespaces_of(pid, own_userns, what, &|out| {
        let (code, text) = match only_loopback() {
            Ok(removed) => (0, removed.join("\n")),
            Err((errno, why)) => (errno, why),
        };
        let _ = out.write_all(text.as_bytes());
        code
    });
    Ok(String::from_utf8_lossy(&out?)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// In the helper: deletes what is not loopback's, then checks. `Err` holds
/// an errno and what failed.
fn only_loopback() -> std::result::Result<Vec<String>, (i32, String)> {
    use crate::sys::rtnl::Rtnl;
    let io = |what: String| move |e: std::io::Error| (e.raw_os_error().unwrap_or(libc::EIO), what);
    let mut rtnl = Rtnl::open().map_err(io("open a netlink socket".into()))?;
    let mut removed = Vec::new();
    for link in rtnl.links().map_err(io("list interfaces".into()))? {
        if link.loopback {
            continue;
        }
        rtnl.delete_link(link.index)
            .map_err(io(format!("delete interface `{}`", link.name)))?;
        removed.push(format!("interface {}", link.name));
    }
    for addr in rtnl.addresses().map_err(io("list addresses".into()))? {
        if addr.is_loopbacks_own() {
            continue;
        }
        let name = match addr.addr {
            Some(ip) => format!("address {ip}/{}", addr.prefix_len),
            None => format!("an address without IFA_ADDRESS on #{}", addr.index),
        };
        rtnl.delete_address(&addr)
            .map_err(io(format!("delete {name}")))?;
        removed.push(name);
    }
    // Read it again: what an engine adds concurrently is caught here.
    let links = rtnl.links().map_err(io("list interfaces".into()))?;
    let addrs = rtnl.addresses().map_err(io("list addresses".into()))?;
    if let Some(l) = links.iter().find(|l| !l.loopback) {
        return Err((
            libc::EBUSY,
            format!("interface `{}` is still there", l.name),
        ));
    }
    if let Some(a) = addrs.iter().find(|a| !a.is_loopbacks_own()) {
        return Err((
            libc::EBUSY,
            format!("address {:?}/{} is still there", a.addr, a.prefix_len),
        ));
    }
    Ok(removed)
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
    in_namespaces_of(
        pid,
        own_userns,
        "make the proxy's listening socket",
        &|_| send(),
    )?;
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
/// `pid` (and its user namespace when `own_userns`), and returns what `f`
/// wrote. `f` returns 0 or an errno; on an errno, what it wrote is the
/// error's text.
///
/// The namespaces are entered through a pidfd, not /proc/<pid>/ns: until it
/// execs, the container's init process is not dumpable and its memory
/// belongs to the initial user namespace, so a rootless caller may not open
/// its /proc/<pid>/ns files, though it owns the namespaces.
fn in_namespaces_of(
    pid: Pid,
    own_userns: bool,
    what: &str,
    f: &dyn Fn(&mut std::fs::File) -> i32,
) -> Result<Vec<u8>> {
    use std::io::Read;
    let ctx = |step: &str| format!("{what} in the network namespace of pid {pid}: {step}");
    let pidfd = crate::sys::procs::pidfd_open(pid)?;
    let flags = if own_userns {
        CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET
    } else {
        CloneFlags::CLONE_NEWNET
    };
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| RuntimeError::sys(ctx("pipe"), e))?;

    let child = crate::sys::fork::child("a helper", &[read.as_fd()], || {
        let mut out = std::fs::File::from(write);
        let code = match setns(&pidfd, flags) {
            // 128 + errno tells the parent which step failed and why.
            Err(e) => 128 + (e as i32).clamp(1, 127),
            Ok(()) => match f(&mut out) {
                0 => 0,
                errno => errno.clamp(1, 99),
            },
        };
        drop(out);
        code
    })
    .map_err(|e| match e {
        RuntimeError::Sys { source, .. } => RuntimeError::sys(ctx("fork"), source),
        e => e,
    })?;
    let mut said = Vec::new();
    // The helper's text is small; EOF comes when it exits.
    let _ = std::fs::File::from(read).read_to_end(&mut said);
    let told = || String::from_utf8_lossy(&said).into_owned();
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => return Ok(said),
            Ok(WaitStatus::Exited(_, code)) if code > 128 => {
                return Err(RuntimeError::sys(
                    ctx(&format!("setns({flags:?})")),
                    nix::Error::from_raw(code - 128),
                ))
            }
            Ok(WaitStatus::Exited(_, errno)) => {
                let step = if said.is_empty() {
                    "in the namespace".to_owned()
                } else {
                    told()
                };
                return Err(RuntimeError::sys(ctx(&step), nix::Error::from_raw(errno)));
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
