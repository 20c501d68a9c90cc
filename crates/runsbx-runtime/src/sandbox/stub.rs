//! The waiting stub of a warm sandbox: the container's init, built and
//! started like any other (namespaces, rootfs, /proc, cgroup, rlimits,
//! capabilities dropped, no_new_privs, seccomp filter installed), that
//! waits for its command instead of running the spec's.
//!
//! [`Stub`] is libcontainer's executor for such an init: its last step,
//! run in the init after every hardening step. It reads one command from a
//! socket whose other end runsbx keeps ([`Link`]): the arguments, the
//! environment and the stdin fd (SCM_RIGHTS), and execs it as the default
//! executor execs a spec's (the environment replaced, then `execvp`). The socket is close-on-exec, so runsbx
//! reads EOF when the exec succeeded and the reason when it failed. Nothing
//! else ever reaches the stub: it is the only process in the sandbox, and
//! it takes one command, once.

use std::ffi::CString;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};

use crate::error::{Result, RuntimeError};

/// The largest command (arguments and environment) a stub takes: the
/// kernel's own limit on what execve passes is smaller.
const MAX_COMMAND: usize = 8 << 20;

/// The executor of a warm sandbox's init: waits on `fd` for its command.
#[derive(Clone, Debug)]
pub(crate) struct Stub {
    fd: RawFd,
}

/// runsbx's end of a stub's socket.
pub(crate) struct Link {
    sock: UnixStream,
}

/// A new stub and the link to it. The stub's end must stay open until
/// the init has been cloned, then be dropped ([`Pair::stub_end`]).
pub(crate) struct Pair {
    pub stub: Stub,
    pub link: Link,
    pub stub_end: OwnedFd,
}

impl Pair {
    pub fn new() -> Result<Self> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::Stream,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| RuntimeError::sys("socketpair for a warm sandbox's stub", e))?;
        Ok(Self {
            stub: Stub {
                fd: theirs.as_raw_fd(),
            },
            link: Link {
                sock: UnixStream::from(ours),
            },
            stub_end: theirs,
        })
    }
}

impl Link {
    /// Gives the stub its command; returns once it has exec'd it (or with
    /// why it could not).
    pub fn exec(&mut self, args: &[String], env: &[String], stdin: BorrowedFd<'_>) -> Result<()> {
        let payload = encode(args, env);
        if payload.len() > MAX_COMMAND {
            return Err(RuntimeError::invalid(
                "the command",
                format!("its arguments and environment exceed {MAX_COMMAND} bytes"),
            ));
        }
        let len = (payload.len() as u32).to_le_bytes();
        let fds = [stdin.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let sent = sendmsg::<()>(
            self.sock.as_raw_fd(),
            &[IoSlice::new(&len)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| RuntimeError::sys("send the command to the warm sandbox", e))?;
        if sent != len.len() {
            return Err(RuntimeError::invalid(
                "the warm sandbox",
                "took part of the command's header",
            ));
        }
        self.sock
            .write_all(&payload)
            .map_err(|e| RuntimeError::io("send the command to the warm sandbox", e))?;
        // EOF: the socket closed with the exec. Anything else: the reason.
        let mut said = Vec::new();
        self.sock
            .read_to_end(&mut said)
            .map_err(|e| RuntimeError::io("hear from the warm sandbox", e))?;
        if said.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::invalid(
            format!(
                "the command {:?}",
                args.first().map(String::as_str).unwrap_or("")
            ),
            String::from_utf8_lossy(&said).into_owned(),
        ))
    }
}

impl Executor for Stub {
    fn exec(&self, _spec: &Spec) -> std::result::Result<(), ExecutorError> {
        // SAFETY: the fd is the stub's end of the socket, open in this
        // process (libcontainer marks it close-on-exec, never closes it);
        // nothing else in the init uses it.
        let mut sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(self.fd) });
        // The init still holds what it inherited from runsbx, all of it
        // close-on-exec (libcontainer marked it so). Closed now rather than
        // at the exec: the stub waits holding only its stdio and socket,
        // and the cost of the closing (the last reference to a detached
        // mount ends that mount, which waits for an RCU grace period) is
        // paid before the command is known, not while its caller waits.
        close_all_but_stdio_and(self.fd);
        let (args, env) = match receive(&mut sock) {
            Ok(Some(command)) => command,
            // The pool let the sandbox go: nothing runs.
            Ok(None) => return Err(ExecutorError::Other("no command came".to_owned())),
            Err(e) => return Err(fail(&mut sock, format!("receive the command: {e}"))),
        };
        // As the default executor: the environment replaced by the
        // command's (its PATH is the one searched), then execvp.
        for (key, _) in std::env::vars_os() {
            // SAFETY: the init is single-threaded.
            unsafe { std::env::remove_var(key) };
        }
        for kv in &env {
            if let Some((k, v)) = kv.split_once('=') {
                // SAFETY: as above.
                unsafe { std::env::set_var(k, v) };
            }
        }
        let argv: Vec<CString> = match args.iter().map(|a| CString::new(a.as_bytes())).collect() {
            Ok(argv) => argv,
            Err(e) => {
                return Err(fail(
                    &mut sock,
                    format!("an argument holds a NUL byte: {e}"),
                ))
            }
        };
        let Err(e) = nix::unistd::execvp(&argv[0], &argv);
        Err(fail(&mut sock, format!("exec {:?}: {e}", args[0])))
    }

    /// The command is checked when it comes (the spec's is a placeholder).
    fn validate(&self, _spec: &Spec) -> std::result::Result<(), ExecutorValidationError> {
        Ok(())
    }

    /// The command's environment comes with it.
    fn setup_envs(
        &self,
        _envs: std::collections::HashMap<String, String>,
    ) -> std::result::Result<(), ExecutorSetEnvsError> {
        Ok(())
    }
}

/// Closes every fd above stderr but `keep`. Best effort: what is left
/// open is close-on-exec and goes at the exec anyway.
fn close_all_but_stdio_and(keep: RawFd) {
    let close_range = |first: RawFd, last: libc::c_uint| {
        if first as libc::c_uint <= last {
            // SAFETY: close_range takes plain integers; no fd in the range
            // is used by this process again (the init runs only this
            // executor from here on).
            unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, last, 0) };
        }
    };
    close_range(3, (keep as libc::c_uint).saturating_sub(1));
    close_range((keep + 1).max(3), libc::c_uint::MAX);
}

/// Tells runsbx why the command did not run; the error for libcontainer.
fn fail(sock: &mut UnixStream, why: String) -> ExecutorError {
    let _ = sock.write_all(why.as_bytes());
    ExecutorError::Other(why)
}

/// Reads one command: `None` when the socket closed before one came.
fn receive(sock: &mut UnixStream) -> std::io::Result<Option<(Vec<String>, Vec<String>)>> {
    let mut len = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut len)];
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let got = msg.bytes;
    let mut stdin = None;
    for c in msg.cmsgs().map_err(std::io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: received just now, owned by nobody else.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                stdin.get_or_insert(fd);
            }
        }
    }
    if got == 0 {
        return Ok(None);
    }
    if got < 4 {
        sock.read_exact(&mut len[got..])?;
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_COMMAND {
        return Err(std::io::Error::other("the command is too large"));
    }
    let mut payload = vec![0u8; len];
    sock.read_exact(&mut payload)?;
    let stdin = stdin.ok_or_else(|| std::io::Error::other("no stdin came with the command"))?;
    nix::unistd::dup2(stdin.as_raw_fd(), 0).map_err(std::io::Error::from)?;
    drop(stdin);
    decode(&payload)
        .map(Some)
        .ok_or_else(|| std::io::Error::other("the command is malformed"))
}

/// Arguments and environment: each a count, then each string as its
/// length and bytes (little-endian u32s).
fn encode(args: &[String], env: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for list in [args, env] {
        out.extend((list.len() as u32).to_le_bytes());
        for s in list {
            out.extend((s.len() as u32).to_le_bytes());
            out.extend(s.as_bytes());
        }
    }
    out
}

fn decode(mut buf: &[u8]) -> Option<(Vec<String>, Vec<String>)> {
    fn u32_of(buf: &mut &[u8]) -> Option<usize> {
        let (n, rest) = buf.split_first_chunk::<4>()?;
        *buf = rest;
        Some(u32::from_le_bytes(*n) as usize)
    }
    let mut lists = [Vec::new(), Vec::new()];
    for list in &mut lists {
        let count = u32_of(&mut buf)?;
        for _ in 0..count {
            let len = u32_of(&mut buf)?;
            if len > buf.len() {
                return None;
            }
            let (s, rest) = buf.split_at(len);
            list.push(String::from_utf8(s.to_vec()).ok()?);
            buf = rest;
        }
    }
    let [args, env] = lists;
    (buf.is_empty() && !args.is_empty()).then_some((args, env))
}

impl AsFd for Link {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn commands_round_trip() {
        let args = vec![
            "python3".to_owned(),
            "-c".to_owned(),
            "print('é')".to_owned(),
        ];
        let env = vec!["PATH=/bin".to_owned(), "EMPTY=".to_owned()];
        assert_eq!(decode(&encode(&args, &env)), Some((args, env)));
    }

    #[test]
    fn malformed_commands_are_refused() {
        let good = encode(&["true".to_owned()], &[]);
        assert!(decode(&good[..good.len() - 1]).is_none(), "truncated");
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long).is_none(), "trailing bytes");
        assert!(
            decode(&encode(&[], &["A=b".to_owned()])).is_none(),
            "no arguments"
        );
        let mut huge = 1u32.to_le_bytes().to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        assert!(decode(&huge).is_none(), "length past the end");
    }
}
