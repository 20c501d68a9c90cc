//! The waiting stub of a warm sandbox: the container's init, built and
//! started like any other (namespaces, rootfs, /proc, cgroup, rlimits,
//! capabilities dropped, no_new_privs, seccomp filter installed), that
//! waits for its command instead of running the spec's.
//!
//! [`Stub`] is libcontainer's executor for such an init: its last step,
//! run in the init after every hardening step. It reads one command from a
//! socket whose other end runsbx keeps ([`Link`]): the arguments, the
//! environment and the stdin fd (SCM_RIGHTS), and execs it as the default
//! executor execs a spec's (the environment replaced, then `execvp`). The
//! socket is close-on-exec, so runsbx reads EOF when the exec succeeded
//! and the reason when it failed. Nothing else ever reaches the stub: it is
//! the only process in the sandbox, and it takes one command, once.
//!
//! The init is a fork of runsbx, and the command's exec would first tear
//! down that whole address space (thousands of pages: about half a
//! millisecond of CPU, while the caller waits). So the stub first execs
//! runsbx-stub (stub/main.rs, built by build.rs and embedded), a
//! few-page static program that waits and execs the same way, from a
//! sealed memfd: that teardown is paid before the command is asked for.
//! Where that cannot be (no such program for this architecture, a kernel
//! that refuses to exec a memfd, a seccomp profile without `execveat`),
//! the stub waits in the init as it is.

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

/// runsbx-stub, for this architecture (empty where there is none).
const WAITER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/runsbx-stub"));

/// The executor of a warm sandbox's init: waits on `fd` for its command,
/// in runsbx-stub exec'd from `waiter` if it can.
#[derive(Clone, Debug)]
pub(crate) struct Stub {
    fd: RawFd,
    waiter: Option<RawFd>,
}

/// runsbx's end of a stub's socket.
pub(crate) struct Link {
    sock: UnixStream,
}

/// The fds a stub's init inherits from runsbx: its end of the socket and
/// runsbx-stub's memfd. runsbx holds them until the init has been cloned.
pub(crate) struct Inherited {
    _socket: OwnedFd,
    _waiter: Option<OwnedFd>,
}

/// A new stub and the link to it. The stub's fds must stay open until the
/// init has been cloned, then be dropped ([`Pair::inherited`]).
pub(crate) struct Pair {
    pub stub: Stub,
    pub link: Link,
    pub inherited: Inherited,
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
        let waiter = waiter_memfd()?;
        Ok(Self {
            stub: Stub {
                fd: theirs.as_raw_fd(),
                waiter: waiter.as_ref().map(AsRawFd::as_raw_fd),
            },
            link: Link {
                sock: UnixStream::from(ours),
            },
            inherited: Inherited {
                _socket: theirs,
                _waiter: waiter,
            },
        })
    }
}

/// runsbx-stub in a memfd sealed against any change, executable; `None`
/// where there is no such program, or the kernel will not exec a memfd
/// (vm.memfd_noexec = 2).
fn waiter_memfd() -> Result<Option<OwnedFd>> {
    if WAITER.is_empty() {
        return Ok(None);
    }
    let name = c"runsbx-stub";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: memfd_create takes a NUL-terminated name and flags; the fd
    // it returns is owned here.
    let open = |flags| unsafe { libc::memfd_create(name.as_ptr(), flags) };
    // MFD_EXEC: executable even where memfds are not by default
    // (vm.memfd_noexec = 1); kernels before 6.3 do not know the flag, and
    // make every memfd executable.
    let mut fd = open(flags | libc::MFD_EXEC);
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        fd = open(flags);
    }
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EACCES) => Ok(None),
            _ => Err(RuntimeError::io("memfd_create for runsbx-stub", e)),
        };
    }
    // SAFETY: a new fd, owned by nobody else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(WAITER)
        .map_err(|e| RuntimeError::io("write runsbx-stub to its memfd", e))?;
    // Nothing in the sandbox may change what its init execs: no write,
    // no resize, no change of mode, no new seal.
    let seals = libc::F_SEAL_WRITE
        | libc::F_SEAL_SHRINK
        | libc::F_SEAL_GROW
        | libc::F_SEAL_EXEC
        | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on an fd this function owns.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
        let e = std::io::Error::last_os_error();
        // Kernels before 6.3 do not know F_SEAL_EXEC: then only the mode
        // may still change. That harms nothing: the memfd is this
        // sandbox's alone, and once its command runs no fd of or link to
        // it is left in the sandbox.
        let without_exec = seals & !libc::F_SEAL_EXEC;
        // SAFETY: as above.
        if e.raw_os_error() != Some(libc::EINVAL)
            || unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, without_exec) } < 0
        {
            return Err(RuntimeError::io(
                "seal runsbx-stub's memfd",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(Some(file.into()))
}

impl Link {
    /// Gives the stub its command; returns once it has exec'd it (or with
    /// why it could not).
    pub fn exec(&mut self, args: &[String], env: &[String], stdin: BorrowedFd<'_>) -> Result<()> {
        let command = || {
            format!(
                "the command {:?}",
                args.first().map(String::as_str).unwrap_or("")
            )
        };
        if let Some(nul) = args.iter().chain(env).find(|s| s.contains('\0')) {
            return Err(RuntimeError::invalid(
                command(),
                format!("{nul:?} holds a NUL byte, which no command can be given"),
            ));
        }
        let payload = encode(args, &environment(env));
        if payload.len() > MAX_COMMAND {
            return Err(RuntimeError::invalid(
                "the command",
                format!("its arguments and environment exceed {MAX_COMMAND} bytes"),
            ));
        }
        // The header, the fd and the command in one message: the stub,
        // woken by the header, finds the rest waiting instead of being
        // woken again for it, or running on the sender's CPU before the
        // rest is written (through `runsbx serve`, warm calls of
        // `/bin/true`, three alternating rounds of 40: p50 2.84, 2.93,
        // 2.70 ms with two writes, 2.80, 2.77, 2.64 with one).
        let mut message = Vec::with_capacity(4 + payload.len());
        message.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        message.extend_from_slice(&payload);
        let fds = [stdin.as_raw_fd()];
        let cmsg = [ControlMessage::ScmRights(&fds)];
        let sent = sendmsg::<()>(
            self.sock.as_raw_fd(),
            &[IoSlice::new(&message)],
            &cmsg,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| RuntimeError::sys("send the command to the warm sandbox", e))?;
        if sent == 0 {
            return Err(RuntimeError::invalid(
                "the warm sandbox",
                "took none of the command",
            ));
        }
        // The send blocks until all of it is queued, a command larger than
        // the socket's buffer while the stub reads; what a signal cut
        // short is sent here.
        self.sock
            .write_all(&message[sent..])
            .map_err(|e| RuntimeError::io("send the command to the warm sandbox", e))?;
        // EOF: the socket closed with the exec. Anything else: the reason.
        let mut said = Vec::new();
        self.sock
            .read_to_end(&mut said)
            .map_err(|e| RuntimeError::io("hear from the warm sandbox", e))?;
        if said.is_empty() {
            return Ok(());
        }
        // runsbx-stub says an exec's errno as a zero byte and an i32.
        let why = match said[..] {
            [0, a, b, c, d] => format!(
                "exec {:?}: {}",
                args.first().map(String::as_str).unwrap_or(""),
                nix::errno::Errno::from_raw(i32::from_le_bytes([a, b, c, d]))
            ),
            _ => String::from_utf8_lossy(&said).into_owned(),
        };
        Err(RuntimeError::invalid(command(), why))
    }
}

/// The environment as the init sets it before a spec's exec: `KEY=VALUE`
/// entries only, each key once, where it first came, with its last value.
/// Both stubs are given it so, whichever execs the command.
fn environment(env: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(env.len());
    let mut at = std::collections::HashMap::with_capacity(env.len());
    for kv in env {
        let Some((key, _)) = kv.split_once('=').filter(|(k, _)| !k.is_empty()) else {
            continue;
        };
        match at.get(key) {
            Some(&i) => out[i] = kv.clone(),
            None => {
                at.insert(key, out.len());
                out.push(kv.clone());
            }
        }
    }
    out
}

impl Executor for Stub {
    fn exec(&self, _spec: &Spec) -> std::result::Result<(), ExecutorError> {
        // Its command, and runsbx-stub it execs first, would inherit
        // ignored signals (see sys/signal.rs).
        crate::sys::signal::default_dispositions();
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
        close_all_but_stdio_and(&[Some(self.fd), self.waiter]);
        if let Some(waiter) = self.waiter {
            exec_waiter(waiter, &sock);
        }
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

/// Execs runsbx-stub from its memfd, given the socket (made inheritable
/// for it); returns only if the exec failed, the socket close-on-exec
/// again.
fn exec_waiter(waiter: RawFd, sock: &UnixStream) {
    use nix::fcntl::{fcntl, FcntlArg, FdFlag};
    let fd = sock.as_raw_fd();
    let Ok(fd_arg) = CString::new(fd.to_string()) else {
        return;
    };
    let argv = [c"runsbx-stub", fd_arg.as_c_str()];
    if fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).is_err() {
        return;
    }
    let env: [&std::ffi::CStr; 0] = [];
    let _ = nix::unistd::execveat(
        Some(waiter),
        c"",
        &argv,
        &env,
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    );
    let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
}

/// Closes every fd above stderr but those in `keep`. Best effort: what is
/// left open is close-on-exec and goes at the exec anyway. It allocates
/// nothing (it runs in a forked child).
fn close_all_but_stdio_and(keep: &[Option<RawFd>]) {
    let close_range = |first: libc::c_uint, last: libc::c_uint| {
        // SAFETY: close_range takes plain integers; no fd in the range is
        // used by this process again (the init runs only this executor
        // from here on).
        unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    };
    let mut first: libc::c_uint = 3;
    loop {
        let next = keep
            .iter()
            .flatten()
            .map(|&fd| fd as libc::c_uint)
            .filter(|&fd| fd >= first)
            .min();
        let Some(next) = next else {
            close_range(first, libc::c_uint::MAX);
            return;
        };
        if first < next {
            close_range(first, next - 1);
        }
        first = next + 1;
    }
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
    #![allow(clippy::unwrap_used, clippy::expect_used)]
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
    fn the_environment_is_given_as_the_init_sets_it() {
        let env: Vec<String> = ["A=1", "NOVALUE", "=x", "B=2", "A=3", "C=a=b"]
            .map(String::from)
            .to_vec();
        assert_eq!(environment(&env), ["A=3", "B=2", "C=a=b"]);
    }

    #[test]
    fn only_the_named_fds_stay_open() {
        use std::os::fd::IntoRawFd;
        let null = || std::fs::File::open("/dev/null").unwrap().into_raw_fd();
        let (keep, gone) = ([null(), null(), null()], null());
        let (r, w) = nix::unistd::pipe().unwrap();
        // In a child, which allocates nothing: the test harness's threads
        // may hold the allocator's lock at the fork.
        // SAFETY: the child only makes system calls and exits.
        match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                close_all_but_stdio_and(&[Some(keep[2]), None, Some(keep[0]), Some(w.as_raw_fd())]);
                let open = |fd: RawFd| nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok();
                let ok = open(keep[0])
                    && open(keep[2])
                    && !open(keep[1])
                    && !open(gone)
                    && open(w.as_raw_fd())
                    && !open(r.as_raw_fd());
                let _ = nix::unistd::write(&w, &[u8::from(ok)]);
                // SAFETY: ends the child without running the harness's code.
                unsafe { libc::_exit(0) };
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(w);
                let mut said = [0u8; 1];
                assert_eq!(nix::unistd::read(r.as_raw_fd(), &mut said).unwrap(), 1);
                nix::sys::wait::waitpid(child, None).unwrap();
                assert_eq!(
                    said,
                    [1],
                    "an fd was closed that was to stay, or the reverse"
                );
                for fd in keep.into_iter().chain([gone]) {
                    // SAFETY: opened above, owned by this test.
                    drop(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
        }
    }

    /// Runs runsbx-stub from its memfd, as a warm sandbox's init execs it
    /// (here in a plain child), gives it `args`, `env` and `stdin` through
    /// a [`Link`], and returns what the link said and the command's stdout.
    fn through_the_stub(args: &[&str], env: &[&str], stdin: &[u8]) -> (Result<()>, String) {
        let Pair {
            stub,
            mut link,
            inherited,
        } = Pair::new().unwrap();
        let waiter = stub.waiter.expect("runsbx-stub has a memfd");
        let (out_r, out_w) = nix::unistd::pipe().unwrap();
        let (in_r, in_w) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&in_w, stdin).unwrap();
        drop(in_w);
        // Everything the child needs is made before the fork: the test
        // harness's threads may hold the allocator's lock at the fork.
        let fd_arg = CString::new(stub.fd.to_string()).unwrap();
        let argv = [c"runsbx-stub".as_ptr(), fd_arg.as_ptr(), std::ptr::null()];
        let envp = [std::ptr::null::<libc::c_char>()];
        // SAFETY: the child makes only system calls, then execs or exits.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => unsafe {
                libc::dup2(out_w.as_raw_fd(), 1);
                libc::fcntl(stub.fd, libc::F_SETFD, 0);
                libc::syscall(
                    libc::SYS_execveat,
                    waiter,
                    c"".as_ptr(),
                    argv.as_ptr(),
                    envp.as_ptr(),
                    libc::AT_EMPTY_PATH,
                );
                libc::_exit(99)
            },
            nix::unistd::ForkResult::Parent { child } => child,
        };
        drop(out_w);
        drop(inherited);
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let env: Vec<String> = env.iter().map(|e| e.to_string()).collect();
        let said = link.exec(&args, &env, in_r.as_fd());
        drop(link);
        let mut out = String::new();
        std::fs::File::from(out_r).read_to_string(&mut out).unwrap();
        nix::sys::wait::waitpid(child, None).unwrap();
        (said, out)
    }

    /// Whether this architecture has no runsbx-stub: said as a SKIP, which
    /// fails under CI.
    fn no_stub_here() -> bool {
        if !WAITER.is_empty() {
            return false;
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "no runsbx-stub is built for this architecture"
        );
        eprintln!("SKIP no runsbx-stub is built for this architecture");
        true
    }

    #[test]
    fn the_embedded_stub_runs_the_command_it_is_given() {
        if no_stub_here() {
            return;
        }
        let script = "read x; echo \"$x-$A-$0-$1\"; ls -l /proc/self/fd | grep -c socket:";
        let (said, out) = through_the_stub(
            &["sh", "-c", script, "zero", "one"],
            &["PATH=/nonexistent:/usr/bin:/bin", "A=first", "A=b"],
            b"hi\n",
        );
        said.unwrap();
        // stdin, the environment (one A, its last value), PATH searched past
        // a missing directory, the arguments; and no socket, the stub's
        // closed with the exec.
        assert_eq!(out, "hi-b-zero-one\n0\n");
    }

    #[test]
    fn the_embedded_stub_reports_a_failed_exec() {
        if no_stub_here() {
            return;
        }
        let (said, out) = through_the_stub(&["no-such-command"], &["PATH=/usr/bin:/bin"], b"");
        let message = said.unwrap_err().to_string();
        assert!(
            message.contains("exec \"no-such-command\": ENOENT"),
            "{message}"
        );
        assert_eq!(out, "");
        let (said, _) = through_the_stub(&["/etc"], &[], b"");
        let message = said.unwrap_err().to_string();
        assert!(message.contains("exec \"/etc\": EACCES"), "{message}");
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
