//! The pool's worker factory (`runsbx pool-zygote`, hidden): one process,
//! started once per pool, that forks each worker instead of the pool
//! running runsbx again for it.
//!
//! A worker spawned by serve pays for a whole process start before it
//! does any work: the exec, glibc's start-up (whose `cpuid` instructions
//! trap to a hypervisor, about half a millisecond on the VMs this was
//! measured on), the binary relocating itself, the command line parsed
//! again. A fork of a process that has done all of that once costs a
//! fraction of it. serve itself cannot fork (it has threads; see
//! serve/worker.rs), so this process does: it is single-threaded for its
//! whole life and does nothing but wait for serve's next request.
//!
//! serve sends one byte and two fds (SCM_RIGHTS): the read end of the
//! worker's stdin and the write end of its stdout. The zygote forks with
//! `CLONE_PARENT`, so that the worker is serve's child, waited for and
//! signalled as a spawned one is, and answers with the worker's pid (4
//! bytes, native order; a negative errno if the fork failed). The child
//! puts the two fds on its stdin and stdout and runs `pool-worker` with the
//! arguments the zygote was given; the zygote closes its copies before it
//! answers, so that the worker's pipes end with the worker and serve.
//! The zygote exits when serve's end of the socket closes (serve exits,
//! or is killed).
//!
//! Only for a pool run by real root. An unprivileged worker re-executes
//! runsbx in a user namespace of its own (`reexec_in_own_userns`), with its
//! own command line, which a fork of the zygote does not have; and a
//! zygote that made that namespace once and forked its workers inside it
//! would break what a rootless call's watchdog relies on: that every
//! process in its user namespace is its own call's, to be killed when
//! that call's runsbx dies (`sandbox::teardown::reclaim`). Tried: one
//! killed worker's watchdog then killed the other workers and their
//! watchdogs, and a SIGKILLed pool left a call's state behind.
//!
//! Every worker of one pool starts from the zygote's memory, so they share
//! its address-space layout and its stack-protector value instead of each
//! having its own. That is an allowance: a worker never runs sandboxed
//! code in its address space (the command is exec'd, in namespaces of its
//! own), and what a worker reads from its sandbox (output, seccomp
//! notifications) is parsed by safe Rust.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::Result;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use nix::unistd::Pid;
use runsbx_runtime::sys::fork::{self, Sibling};
use runsbx_runtime::StateRoot;

use crate::call_cmd::Call;

/// serve's side: the zygote and the socket to it.
pub(super) struct Zygote {
    sock: Mutex<UnixStream>,
    child: Mutex<Child>,
    /// Its socket failed (the zygote died): it is not asked again.
    broken: AtomicBool,
}

/// A worker the zygote forked: its pid, and serve's ends of its pipes.
pub(super) struct Forked {
    pub pid: Pid,
    pub to: File,
    pub from: File,
}

impl Zygote {
    /// Starts the zygote for workers run with `worker_args` (`pool-worker`
    /// and the template's call flags) by `command`.
    pub fn start(mut command: std::process::Command, worker_args: &[String]) -> Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        let child = command
            .arg("pool-zygote")
            .args(worker_args.iter().skip(1))
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        Ok(Self {
            sock: Mutex::new(ours),
            child: Mutex::new(child),
            broken: AtomicBool::new(false),
        })
    }

    /// A new worker, forked by the zygote; `None` once the zygote is gone
    /// (the call that found it gone gets the error).
    pub fn fork_worker(&self) -> Option<std::io::Result<Forked>> {
        if self.broken.load(Ordering::SeqCst) {
            return None;
        }
        let pipes = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).and_then(|stdin| {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map(|stdout| (stdin, stdout))
        });
        let ((stdin_r, stdin_w), (stdout_r, stdout_w)) = match pipes {
            Ok(p) => p,
            Err(e) => return Some(Err(e.into())),
        };
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let fds = [stdin_r.as_raw_fd(), stdout_w.as_raw_fd()];
        let asked = sendmsg::<UnixAddr>(
            sock.as_raw_fd(),
            &[IoSlice::new(&[1])],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(std::io::Error::from)
        .and_then(|_| {
            let mut answer = [0u8; 4];
            (&*sock)
                .read_exact(&mut answer)
                .map(|()| i32::from_ne_bytes(answer))
        });
        drop(sock);
        let pid = match asked {
            Ok(pid) => pid,
            Err(e) => {
                // The zygote is gone (or its socket is unusable): never
                // asked again.
                if self.broken.swap(true, Ordering::SeqCst) {
                    return None;
                }
                let how = self.end();
                return Some(Err(std::io::Error::other(format!(
                    "the zygote is gone ({how}): {e}"
                ))));
            }
        };
        if pid <= 0 {
            // A fork the zygote could not make, this time.
            let errno = std::io::Error::from_raw_os_error(-pid);
            return Some(Err(std::io::Error::other(format!("fork: {errno}"))));
        }
        Some(Ok(Forked {
            pid: Pid::from_raw(pid),
            to: File::from(stdin_w),
            from: File::from(stdout_r),
        }))
    }

    /// Ends the zygote (the end of its socket) and waits for it; how it
    /// ended.
    pub fn end(&self) -> String {
        let sock = self.sock.lock().unwrap_or_else(|e| e.into_inner());
        let _ = sock.shutdown(std::net::Shutdown::Both);
        drop(sock);
        match self.child.lock().unwrap_or_else(|e| e.into_inner()).wait() {
            Ok(status) => status.to_string(),
            Err(e) => format!("not waited for: {e}"),
        }
    }
}

/// `runsbx pool-zygote [call flags] -- TEMPLATE_COMMAND`: forks a
/// `pool-worker` with these arguments for each request on stdin.
pub fn run(
    root: &StateRoot,
    template: Call,
    config: Option<PathBuf>,
    logs_to_file: bool,
) -> Result<i32> {
    if !runsbx_runtime::sys::privilege::can_manage_cgroups() {
        anyhow::bail!("pool-zygote: only a pool run by root forks its workers");
    }
    // Once here rather than in every sandbox's init.
    runsbx_runtime::sys::fork::detect_cpu_features();
    loop {
        let Some([stdin, stdout]) = next_request()? else {
            return Ok(0);
        };
        // SAFETY: this process never has a second thread (see the module
        // comment), and the new process leaves by exit.
        let answer = match unsafe { fork::sibling() } {
            Ok(Sibling::New) => {
                runsbx_runtime::phase("forked");
                let code = match be_worker(stdin, stdout) {
                    Ok(()) => crate::serve::worker(root, template, config),
                    Err(e) => Err(e),
                };
                std::process::exit(crate::exit_code(code, logs_to_file));
            }
            Ok(Sibling::Caller(pid)) => pid.as_raw(),
            Err(errno) => -(errno as i32),
        };
        drop((stdin, stdout));
        let mut control = control();
        if control.write_all(&answer.to_ne_bytes()).is_err() {
            // serve is gone: so is the pool.
            return Ok(0);
        }
    }
}

/// serve's socket, this process's stdin. Never closed here: the process
/// exits when serve's end closes.
fn control() -> std::mem::ManuallyDrop<File> {
    // SAFETY: fd 0 is open for this process's whole life; ManuallyDrop
    // never closes it.
    std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(0) })
}

/// The next request's two fds (`None`: serve is gone).
fn next_request() -> Result<Option<[OwnedFd; 2]>> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let msg = loop {
        match recvmsg::<UnixAddr>(0, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::Error::EINTR) => continue,
            other => break other?,
        }
    };
    if msg.bytes == 0 {
        return Ok(None);
    }
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just gave this process these fds.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    match <[OwnedFd; 2]>::try_from(fds) {
        Ok(pair) => Ok(Some(pair)),
        Err(_) => anyhow::bail!("pool-zygote: a request without its two fds"),
    }
}

/// In the forked child: the worker's pipes become its stdin and stdout
/// (serve's socket, this process's stdin until now, is closed by it).
fn be_worker(stdin: OwnedFd, stdout: OwnedFd) -> Result<()> {
    nix::unistd::dup2(stdin.as_raw_fd(), 0)?;
    nix::unistd::dup2(stdout.as_raw_fd(), 1)?;
    Ok(())
}
