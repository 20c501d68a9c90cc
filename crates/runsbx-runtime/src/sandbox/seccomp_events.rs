//! The seccomp denials of a call's sandbox, as the kernel reports them.
//!
//! With a listener, the sandbox's filter notifies instead of failing each
//! syscall it denies (runsbx-policy's `seccomp::reporting`). Whoever
//! installs the filter sends the notification fd (SCM_RIGHTS) over a
//! connection to the listening socket: the sandbox's init, over a
//! connection runsbx made for it before it was built (sandbox/seal.rs), or
//! where libcontainer installs the filter, its main process in this runsbx
//! process, with the container state (libcontainer 0.7's seccomp
//! listener protocol). A thread of runsbx then
//! answers each notification with EPERM, the errno the filter's default
//! gives, and never lets a syscall continue: the sandbox sees exactly the
//! denial it saw without a listener. Each is recorded, bounded
//! ([`Denials`]), for the call's result and the log.
//!
//! The same thread sees each `connect` (runsbx-policy's
//! `seccomp::OBSERVED`), lets it continue unchanged, and keeps those the
//! sandbox's network will refuse for the result's hints (see connects.rs).
//!
//! If runsbx is gone, the kernel fails a notifying syscall with ENOSYS:
//! still a denial (and a connect fails: the sandbox ends with runsbx).

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use libseccomp::{notify_id_valid, ScmpNotifReq, ScmpNotifResp, ScmpNotifRespFlags};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use serde::Serialize;

use super::connects::{self, Connects};
use crate::error::{Result, RuntimeError};

/// The most distinct (syscall, process) pairs a result lists.
pub const MAX_DISTINCT: usize = 100;
/// The most notification fds one sandbox's listener takes (its init, and
/// each process exec'd into it).
const MAX_FDS: usize = 64;
/// sun_path's size, with its NUL.
const SUN_PATH: usize = 108;

/// One kind of denial: a syscall a process made, how often, and the
/// arguments of the first (the sandbox's own values).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Denial {
    pub syscall: String,
    pub process: String,
    pub args: [u64; 6],
    pub count: u64,
}

/// The seccomp part of a call's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SeccompReport {
    /// In the order first seen, at most [`MAX_DISTINCT`].
    pub denied: Vec<Denial>,
    /// Denials of pairs past the first [`MAX_DISTINCT`], not listed.
    pub dropped: u64,
}

/// Denials aggregated by (syscall, process), bounded.
#[derive(Debug, Default)]
pub struct Denials {
    report: SeccompReport,
    index: HashMap<(String, String), usize>,
}

impl Denials {
    /// Records one denial; true when it is the first of its pair (and
    /// listed).
    pub fn record(&mut self, syscall: &str, process: &str, args: [u64; 6]) -> bool {
        let key = (syscall.to_owned(), process.to_owned());
        if let Some(&i) = self.index.get(&key) {
            if let Some(d) = self.report.denied.get_mut(i) {
                d.count += 1;
            }
            return false;
        }
        if self.report.denied.len() >= MAX_DISTINCT {
            self.report.dropped += 1;
            return false;
        }
        self.index.insert(key, self.report.denied.len());
        self.report.denied.push(Denial {
            syscall: syscall.to_owned(),
            process: process.to_owned(),
            args,
            count: 1,
        });
        true
    }

    pub fn report(self) -> SeccompReport {
        self.report
    }
}

/// The listening socket, bound in the sandbox's private state directory
/// before the sandbox is built; removed when dropped.
pub(crate) struct Listener {
    path: PathBuf,
    sock: UnixListener,
}

impl Listener {
    /// Binds `seccomp.sock` in `dir` (the call's own directory), mode
    /// 0600. `None` when the path would not fit a socket address: the
    /// call then runs without reports (its denials are still EPERM).
    pub fn bind(dir: &Path) -> Result<Option<Self>> {
        let path = dir.join("seccomp.sock");
        if path.as_os_str().len() >= SUN_PATH {
            tracing::warn!(
                "seccomp denials are not reported: the socket path {path:?} is longer than a \
                 unix socket address allows; give runsbx a shorter --root"
            );
            return Ok(None);
        }
        let sock = UnixListener::bind(&path)
            .map_err(|e| RuntimeError::io(format!("bind the seccomp listener at {path:?}"), e))?;
        let listener = Self { path, sock };
        // Only runsbx connects (its libcontainer main process); the
        // directory is runsbx's own, the mode says so again.
        std::fs::set_permissions(&listener.path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| RuntimeError::io(format!("chmod {:?}", listener.path), e))?;
        listener
            .sock
            .set_nonblocking(true)
            .map_err(|e| RuntimeError::io("make the seccomp listener non-blocking", e))?;
        Ok(Some(listener))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A connection to the listener, for the init that installs the
    /// filter to send its fd over (close-on-exec).
    pub fn connect(path: &Path) -> Result<OwnedFd> {
        UnixStream::connect(path).map(OwnedFd::from).map_err(|e| {
            RuntimeError::io(format!("connect to the seccomp listener at {path:?}"), e)
        })
    }

    /// Serves the sandbox's notifications from a thread, until
    /// [`Serving::finish`]. Call it once the sandbox is built (after every
    /// fork); a connection made or an fd sent meanwhile waits in the
    /// socket.
    /// `sock_diag`, a sock_diag socket in the sandbox's network namespace,
    /// tells which of its loopback ports are taken (for the hints).
    pub fn serve(self, id: &str, sock_diag: Option<OwnedFd>) -> Result<Serving> {
        let (stop_r, stop_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| RuntimeError::sys("pipe2 for the seccomp listener", e))?;
        let id = id.to_owned();
        let sock = self
            .sock
            .try_clone()
            .map_err(|e| RuntimeError::io("dup the seccomp listener", e))?;
        let (seen_tx, seen) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("runsbx-seccomp".to_owned())
            .spawn(move || {
                let seen = serve(&id, &sock, &stop_r, sock_diag.as_ref());
                let _ = seen_tx.send(seen);
            })
            .map_err(|e| RuntimeError::io("start the seccomp listener's thread", e))?;
        Ok(Serving {
            listener: self,
            stop: Some(stop_w),
            seen,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the listener's thread saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub denials: Denials,
    pub connects: Connects,
}

/// The listener's thread; stopped (and the socket removed) when dropped.
pub(crate) struct Serving {
    listener: Listener,
    stop: Option<OwnedFd>,
    /// What the thread saw, sent once it has answered the last
    /// notification; the thread's own end (closing the sandbox's
    /// notification fds, unmapping its stack) comes after, and is waited
    /// for only when this is dropped: a warm call's reply is written
    /// between the two (the end took 0.19 ms of a traced warm call).
    seen: std::sync::mpsc::Receiver<Seen>,
    thread: Option<JoinHandle<()>>,
}

impl Serving {
    /// Tells the thread to stop once it has answered what is pending,
    /// without waiting for it: the caller reads the rest of its result
    /// meanwhile.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = nix::unistd::write(&stop, b"s");
        }
    }

    /// Stops the thread once it has answered what is pending; what it saw.
    /// The thread ends, and the socket is removed, when this is dropped.
    pub fn finish(&mut self) -> Seen {
        self.stop();
        // Nothing comes if the thread panicked: reported when dropped.
        self.seen.recv().unwrap_or_default()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(path = ?self.listener.path, "the seccomp listener's thread panicked");
            }
        }
    }
}

/// The thread: accepts connections, takes the fd each brings when it
/// comes, answers every notification, until `stop` is readable; then
/// answers what is still pending and returns.
fn serve(id: &str, sock: &UnixListener, stop: &OwnedFd, sock_diag: Option<&OwnedFd>) -> Seen {
    let mut seen = Seen::default();
    // Connections whose fd has not come yet: runsbx's own init connects
    // before it is built and sends its fd only once it installs the filter
    // (sandbox/seal.rs).
    let mut conns: Vec<UnixStream> = Vec::new();
    let mut fds: Vec<OwnedFd> = Vec::new();
    loop {
        let mut polled: Vec<PollFd> = [stop.as_fd(), sock.as_fd()]
            .into_iter()
            .chain(conns.iter().map(|c| c.as_fd()))
            .chain(fds.iter().map(|f| f.as_fd()))
            .map(|fd| PollFd::new(fd, PollFlags::POLLIN))
            .collect();
        if let Err(e) = poll(&mut polled, PollTimeout::NONE) {
            if e == nix::errno::Errno::EINTR {
                continue;
            }
            tracing::error!(id, "seccomp listener: poll: {e}");
            break;
        }
        let ready: Vec<PollFlags> = polled
            .iter()
            .map(|p| p.revents().unwrap_or(PollFlags::empty()))
            .collect();
        drop(polled);
        let stopping = !ready[0].is_empty();
        let (conns_ready, fds_ready) = ready[2..].split_at(conns.len());
        let mut gone = Vec::new();
        for (i, flags) in fds_ready.iter().enumerate() {
            if flags.contains(PollFlags::POLLIN) {
                answer(id, fds[i].as_raw_fd(), sock_diag, &mut seen);
            } else if flags
                .intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
            {
                // No process of the sandbox is left under this filter.
                gone.push(i);
            }
        }
        for i in gone.into_iter().rev() {
            fds.remove(i);
        }
        // A connection that said something (or closed) has said all it
        // will: its fd, if it brought one, is taken.
        let said: Vec<bool> = conns_ready.iter().map(|f| !f.is_empty()).collect();
        let mut i = 0;
        conns.retain(|conn| {
            let keep = !said[i];
            i += 1;
            if !keep {
                take_fds(id, conn, &mut fds);
            }
            keep
        });
        if ready[1].contains(PollFlags::POLLIN) {
            accept(id, sock, &mut conns);
        }
        if stopping {
            // The sandbox's command is over: whatever a connection sent
            // is in its socket by now.
            for conn in &conns {
                take_fds(id, conn, &mut fds);
            }
            drain(id, &fds, sock_diag, &mut seen);
            break;
        }
    }
    seen
}

/// Answers what is pending now, without waiting.
fn drain(id: &str, fds: &[OwnedFd], sock_diag: Option<&OwnedFd>, seen: &mut Seen) {
    loop {
        let mut polled: Vec<PollFd> = fds
            .iter()
            .map(|f| PollFd::new(f.as_fd(), PollFlags::POLLIN))
            .collect();
        if !matches!(poll(&mut polled, PollTimeout::ZERO), Ok(n) if n > 0) {
            return;
        }
        let ready: Vec<bool> = polled
            .iter()
            .map(|p| p.revents().is_some_and(|r| r.contains(PollFlags::POLLIN)))
            .collect();
        if !ready.iter().any(|r| *r) {
            return;
        }
        for (fd, ready) in fds.iter().zip(ready) {
            if ready {
                answer(id, fd.as_raw_fd(), sock_diag, seen);
            }
        }
    }
}

/// Accepts each pending connection, to be read when it is readable.
fn accept(id: &str, sock: &UnixListener, conns: &mut Vec<UnixStream>) {
    while let Ok((conn, _)) = sock.accept() {
        if conns.len() >= MAX_FDS || conn.set_nonblocking(true).is_err() {
            // Dropping it: the fd it would bring is never answered, and
            // that process's denials become ENOSYS, still denials.
            tracing::warn!(id, "seccomp listener: a connection dropped");
            continue;
        }
        conns.push(conn);
    }
}

/// Takes the fd a connection brought, if it has come (the state JSON that
/// comes with it is not needed: the sandbox is known).
fn take_fds(id: &str, conn: &UnixStream, fds: &mut Vec<OwnedFd>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let Ok(msg) = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    ) else {
        return;
    };
    let Ok(cmsgs) = msg.cmsgs() else { return };
    for c in cmsgs {
        if let ControlMessageOwned::ScmRights(received) = c {
            for fd in received {
                // SAFETY: received just now, owned by nobody else.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                if fds.len() < MAX_FDS {
                    fds.push(fd);
                } else {
                    // Dropping it: that process's denials become
                    // ENOSYS, still denials.
                    tracing::warn!(id, "seccomp listener: more than {MAX_FDS} fds; one dropped");
                }
            }
        }
    }
}

/// Receives one notification and answers it: a denial is recorded and
/// answered with EPERM, an observed syscall is read and continues.
fn answer(id: &str, fd: RawFd, sock_diag: Option<&OwnedFd>, seen: &mut Seen) {
    // ENOENT: the process went away (killed) before it was received.
    let Ok(req) = ScmpNotifReq::receive(fd) else {
        return;
    };
    // Read at once: the pid (in runsbx's pid namespace) is that process's
    // only while its syscall waits for this answer.
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", req.pid))
        .map(|s| s.trim_end().to_owned())
        .unwrap_or_default();
    let syscall = req
        .data
        .syscall
        .get_name_by_arch(req.data.arch)
        .unwrap_or_else(|_| format!("#{}", req.data.syscall.as_raw_syscall()));
    if runsbx_policy::seccomp::OBSERVED.contains(&syscall.as_str()) {
        return observe(id, fd, &req, comm, sock_diag, &mut seen.connects);
    }
    // Still waiting: then the pid was that process's when comm was read.
    let process = match notify_id_valid(fd, req.id) {
        Ok(()) if !comm.is_empty() => comm,
        _ => "?".to_owned(),
    };
    // Always a denial, with the errno the filter's default gives; never
    // SECCOMP_USER_NOTIF_FLAG_CONTINUE.
    let resp = ScmpNotifResp::new_error(req.id, -libc::EPERM, ScmpNotifRespFlags::empty());
    if let Err(e) = resp.respond(fd) {
        // The process is gone (ENOENT), or its syscall was interrupted.
        tracing::debug!(id, "seccomp listener: answer {syscall}: {e}");
    }
    if seen.denials.record(&syscall, &process, req.data.args) {
        tracing::info!(
            id,
            syscall,
            process,
            args = ?req.data.args,
            "seccomp denied {syscall} to {process} (EPERM)"
        );
    }
}

/// A connect, which the allowlist allows: read where it goes, then let it
/// continue whatever was read (see connects.rs).
fn observe(
    id: &str,
    fd: RawFd,
    req: &ScmpNotifReq,
    comm: String,
    sock_diag: Option<&OwnedFd>,
    connects: &mut Connects,
) {
    let refused = connects::observe(req.pid, req.data.args, comm, sock_diag);
    // Still waiting: then everything read was that process's.
    let valid = notify_id_valid(fd, req.id).is_ok();
    let resp = ScmpNotifResp::new_continue(req.id, ScmpNotifRespFlags::empty());
    if let Err(e) = resp.respond(fd) {
        tracing::debug!(id, "seccomp listener: let connect continue: {e}");
    }
    let Some(refused) = refused.filter(|_| valid) else {
        return;
    };
    let (to, process) = (refused.destination, refused.process.clone());
    if connects.record(refused) {
        tracing::info!(
            id,
            %to,
            process,
            "the sandbox's network refuses {process}'s connect to {to}"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn denials_are_aggregated_by_syscall_and_process_and_bounded() {
        let mut d = Denials::default();
        assert!(d.record("mount", "python3", [1, 2, 3, 4, 5, 6]));
        assert!(!d.record("mount", "python3", [9; 6]));
        assert!(d.record("mount", "sh", [0; 6]));
        assert!(d.record("ptrace", "python3", [0; 6]));
        for i in 0..(MAX_DISTINCT + 10) {
            d.record(&format!("s{i}"), "p", [0; 6]);
        }
        // Repeats of a listed pair are still counted once the list is full.
        d.record("mount", "python3", [0; 6]);
        let r = d.report();
        assert_eq!(r.denied.len(), MAX_DISTINCT);
        assert_eq!(r.denied[0].count, 3);
        assert_eq!(
            r.denied[0].args,
            [1, 2, 3, 4, 5, 6],
            "the first's arguments"
        );
        assert_eq!(r.denied[1].process, "sh");
        assert_eq!(r.dropped, 13);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["denied"][0]["syscall"], "mount");
        assert_eq!(json["dropped"], 13);
    }

    #[test]
    fn the_socket_is_private_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let listener = Listener::bind(dir.path()).unwrap().unwrap();
        let path = listener.path().to_owned();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mut serving = listener.serve("t", None).unwrap();
        assert_eq!(serving.finish().denials.report(), SeccompReport::default());
        // Kept until the serving is dropped (after the call's reply).
        assert!(path.exists());
        drop(serving);
        assert!(!path.exists());
    }
}
