//! The container's network namespace, seen from the host side.
//!
//! libcontainer 0.7 never brings `lo` up in a new network namespace, so a
//! sandbox could not even talk to itself on 127.0.0.1. runsbx does it after
//! the container is created and before its process starts: a thread of
//! runsbx's enters the container's network namespace (runsbx's user
//! namespace is an ancestor of the container's, which gives it
//! CAP_NET_ADMIN there) and sets `lo` up. The same thread makes the
//! sockets runsbx serves from the host side: the egress proxy's listener,
//! and for a call a sock_diag socket (what listens inside, for the
//! result's hints). Nothing runs inside the container for this.
//!
//! A short-lived helper forked from runsbx, which enters the container's
//! user namespace first, holds the namespace to runsbx's promise when a
//! process is about to run in it (`start`, `exec`: another runsbx process,
//! in a user namespace of its own): an engine that was told the
//! sandbox's pid may have moved an interface in, given it an address, or
//! routed through it after `create` (root podman does so with `--uidmap`).
//! Every link but `lo` is deleted and every address but loopback's own is
//! removed; with no other link there is no route off the box. What cannot
//! be removed refuses the start.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::sched::{setns, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};

/// What [`network_up`] made inside a network namespace, for runsbx to
/// serve from the host side.
#[derive(Debug, Default)]
pub struct Inside {
    /// A TCP socket listening on 127.0.0.1:`port` (the egress proxy's).
    pub proxy: Option<std::net::TcpListener>,
    /// A sock_diag netlink socket (see sock_diag.rs): what listens in the
    /// namespace, for the seccomp listener's hints.
    pub sock_diag: Option<OwnedFd>,
    /// Asked to hold the namespace to loopback: what was removed (see
    /// [`hold_to_loopback`]).
    pub removed: Option<Vec<String>>,
}

/// Sets `lo` up in the network namespace of process `pid`; with
/// `loopback_only`, holds it to loopback as [`hold_to_loopback`] does; and
/// makes the sockets asked for inside it. Nothing stays inside the sandbox
/// but the sockets.
///
/// From a thread of runsbx's that joins only that network namespace (a
/// thread may, and the sockets it makes keep the namespace they were made
/// in): runsbx's user namespace is an ancestor of the one runsbx just made
/// for the sandbox, which gives it CAP_NET_ADMIN there; a forked helper
/// would copy runsbx's page tables and tear them down again, per sandbox.
/// Where the kernel refuses the thread (a sandbox in a user namespace
/// runsbx did not make, `own_userns`), a helper joins that user namespace
/// first.
///
/// The calling thread runs `meanwhile` while the thread works, and gets
/// what it returned back with the result.
pub fn network_up<T>(
    pid: Pid,
    own_userns: bool,
    proxy_port: Option<u16>,
    sock_diag: bool,
    loopback_only: bool,
    meanwhile: impl FnOnce() -> T,
) -> (Result<Inside>, T) {
    let ctx = |step: &str| format!("set up the network of the sandbox of pid {pid}: {step}");
    let pidfd = match crate::sys::procs::pidfd_open(pid) {
        Ok(fd) => fd,
        Err(e) => return (Err(e), meanwhile()),
    };
    let (from_thread, done) = std::thread::scope(|s| {
        let inside = s.spawn(|| match setns(&pidfd, CloneFlags::CLONE_NEWNET) {
            Ok(()) => Some(make_inside(proxy_port, sock_diag, loopback_only)),
            Err(nix::Error::EPERM) if own_userns => None,
            Err(e) => Some(Err((e as i32, "setns(CLONE_NEWNET)".to_owned()))),
        });
        let done = meanwhile();
        let inside = inside
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (inside, done)
    });
    let inside = match from_thread {
        Some(Ok(inside)) => Ok(inside),
        Some(Err((errno, step))) => Err(RuntimeError::sys(ctx(&step), nix::Error::from_raw(errno))),
        None => {
            tracing::debug!(%pid, "network setup refused to a thread: a helper joins the user namespace");
            network_up_from_helper(pid, proxy_port, sock_diag, loopback_only)
        }
    };
    (inside, done)
}

/// In the sandbox's network namespace: `lo` up, the namespace held to
/// loopback when asked, and the sockets made. `Err` holds an errno and
/// what failed.
fn make_inside(
    proxy_port: Option<u16>,
    sock_diag: bool,
    loopback_only: bool,
) -> std::result::Result<Inside, (i32, String)> {
    let errno = set_lo_up();
    if errno != 0 {
        return Err((errno, "bring up `lo`".to_owned()));
    }
    let removed = match loopback_only {
        true => Some(only_loopback()?),
        false => None,
    };
    let proxy = match proxy_port {
        Some(port) => Some(
            std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                (
                    e.raw_os_error().unwrap_or(libc::EIO),
                    format!("listen on 127.0.0.1:{port} for the egress proxy"),
                )
            })?,
        ),
        None => None,
    };
    let sock_diag = match sock_diag {
        true => Some(crate::sys::sock_diag::socket().map_err(|e| {
            (
                e.raw_os_error().unwrap_or(libc::EIO),
                "make a sock_diag socket".to_owned(),
            )
        })?),
        false => None,
    };
    Ok(Inside {
        proxy,
        sock_diag,
        removed,
    })
}

/// [`network_up`] from a forked helper that joins the sandbox's user
/// namespace, then its network namespace, and passes the sockets back over
/// a socketpair (SCM_RIGHTS).
fn network_up_from_helper(
    pid: Pid,
    proxy_port: Option<u16>,
    sock_diag: bool,
    loopback_only: bool,
) -> Result<Inside> {
    use nix::sys::socket::{
        recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
        SockFlag, SockType,
    };
    use std::os::fd::AsRawFd;
    let ctx = |step: &str| format!("set up the network of the sandbox of pid {pid}: {step}");
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| RuntimeError::sys(ctx("socketpair"), e))?;
    let make = |out: &mut std::fs::File| -> i32 {
        use std::io::Write;
        let inside = match make_inside(proxy_port, sock_diag, loopback_only) {
            Ok(inside) => inside,
            Err((errno, why)) => {
                let _ = out.write_all(why.as_bytes());
                return errno;
            }
        };
        // What was removed is what the helper says when it succeeds; its
        // error, the only thing when it fails.
        let removed = inside.removed.unwrap_or_default().join("\n");
        let mut fds = Vec::new();
        // Each socket's tag, in the order of `fds`.
        let mut tags = Vec::new();
        if let Some(listener) = &inside.proxy {
            fds.push(listener.as_raw_fd());
            tags.push(b'L');
        }
        if let Some(diag) = &inside.sock_diag {
            fds.push(diag.as_raw_fd());
            tags.push(b'D');
        }
        if fds.is_empty() {
            let _ = out.write_all(removed.as_bytes());
            return 0;
        }
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(&tags)];
        match sendmsg::<()>(theirs.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
            Ok(_) => {
                let _ = out.write_all(removed.as_bytes());
                0
            }
            Err(e) => {
                let _ = out.write_all(b"pass the sockets back");
                e as i32
            }
        }
    };
    let said = in_namespaces_of(pid, true, "set up the network", &make)?;
    drop(theirs);
    let mut inside = Inside {
        removed: loopback_only.then(|| lines(&said)),
        ..Inside::default()
    };
    if proxy_port.is_none() && !sock_diag {
        return Ok(inside);
    }
    let mut tags = [0u8; 2];
    let mut iov = [std::io::IoSliceMut::new(&mut tags)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 2]);
    let msg = recvmsg::<()>(
        ours.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(|e| RuntimeError::sys(ctx("recvmsg"), e))?;
    let mut received = Vec::new();
    for cmsg in msg
        .cmsgs()
        .map_err(|e| RuntimeError::sys(ctx("cmsgs"), e))?
    {
        if let ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: the kernel just installed these fds in our table.
            received.extend(
                fds.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let count = msg.bytes;
    for (tag, fd) in tags[..count].iter().zip(received) {
        match tag {
            b'L' => inside.proxy = Some(std::net::TcpListener::from(fd)),
            b'D' => inside.sock_diag = Some(fd),
            _ => {}
        }
    }
    if proxy_port.is_some() && inside.proxy.is_none() || sock_diag && inside.sock_diag.is_none() {
        return Err(RuntimeError::invalid(ctx("helper"), "sent no socket"));
    }
    Ok(inside)
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
    Ok(lines(&out?))
}

/// A helper's text, one item a line.
fn lines(said: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(said)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
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
            Ok(()) => {
                crate::sys::privilege::moved();
                match f(&mut out) {
                    0 => 0,
                    errno => errno.clamp(1, 99),
                }
            }
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

/// `ip link set lo up`, with the two ioctls it comes down to; 0 or an
/// errno.
fn set_lo_up() -> i32 {
    // SAFETY: socket(2) returns a new fd or -1.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return nix::Error::last() as i32;
    }
    // SAFETY: the kernel just returned this fd to us; closed when dropped.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain ioctls on a zeroed ifreq naming `lo`, and an fd we own.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return nix::Error::last() as i32;
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return nix::Error::last() as i32;
        }
    }
    0
}
