//! Waiting for a call's command: both streams read into bounded captures
//! until the sandbox's init exits (and the pipes close), the deadline
//! passes, or runsbx is told to stop.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::unistd::Pid;

use super::capture;
use crate::error::{Result, RuntimeError};
use crate::sys::signal::{reap, Ended};

/// The signals a call takes from its signalfd: its children, and what
/// ends it (Ctrl-C, SIGTERM, a closed terminal or pipe).
pub(crate) const SIGNALS: [Signal; 6] = [
    Signal::SIGCHLD,
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGPIPE,
];

pub(crate) enum End {
    Exited(i32),
    Signaled(Signal),
    TimedOut,
    Interrupted(Signal),
}

impl End {
    /// Whether the sandbox's init was reaped (it ended by itself). A
    /// killed sandbox's may not have been when the streams closed.
    pub(crate) fn reaped(&self) -> bool {
        matches!(self, End::Exited(_) | End::Signaled(_))
    }
}

/// How long the streams are read after the sandbox's init has exited: the
/// kernel kills the rest of its pid namespace, and their pipe ends close.
const DRAIN: Duration = Duration::from_secs(2);

/// The buffer the streams are read through: a pipe's default capacity.
pub(crate) fn read_buffer() -> Vec<u8> {
    vec![0u8; 64 * 1024]
}

/// Reads both streams (through `buf`, from [`read_buffer`]) until the init
/// process exits (and the pipes close), the deadline passes, or runsbx is
/// told to stop (a signal on `sfd`).
pub(crate) fn until_end(
    init: Pid,
    timeout: Duration,
    sfd: &SignalFd,
    mut streams: [Option<OwnedFd>; 2],
    out: &mut capture::Capture,
    err: &mut capture::Capture,
    buf: &mut [u8],
) -> Result<End> {
    let deadline = Instant::now() + timeout;
    let mut end: Option<End> = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        if end.is_some() && streams.iter().all(Option::is_none) {
            break;
        }
        let now = Instant::now();
        if let Some(until) = drain_until {
            if now >= until {
                break;
            }
        } else if now >= deadline {
            end = Some(End::TimedOut);
            kill_sandbox(init);
        }
        let wait_until = drain_until.unwrap_or(deadline);
        let left = wait_until.saturating_duration_since(now);
        let ms = u16::try_from(left.as_millis().clamp(1, 10_000)).unwrap_or(10_000);
        let mut fds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
        let open: Vec<usize> = (0..2).filter(|i| streams[*i].is_some()).collect();
        for i in &open {
            if let Some(fd) = streams[*i].as_ref() {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
            }
        }
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(_) | Err(nix::Error::EINTR) => {}
            Err(e) => return Err(RuntimeError::sys("poll", e)),
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        for (slot, i) in open.iter().enumerate() {
            if !ready[slot + 1] {
                continue;
            }
            let Some(fd) = streams[*i].as_ref() else {
                continue;
            };
            match nix::unistd::read(fd.as_raw_fd(), buf) {
                Ok(0) => streams[*i] = None,
                Ok(n) => {
                    if *i == 0 {
                        out.push(&buf[..n]);
                    } else {
                        err.push(&buf[..n]);
                    }
                }
                Err(nix::Error::EAGAIN | nix::Error::EINTR) => {}
                Err(_) => streams[*i] = None,
            }
        }
        if ready[0] {
            while let Ok(Some(info)) = sfd.read_signal() {
                let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
                    continue;
                };
                match sig {
                    Signal::SIGCHLD | Signal::SIGPIPE => {}
                    sig => {
                        if end.is_none() {
                            end = Some(End::Interrupted(sig));
                        }
                        // Once reaped, the pid may be another process's.
                        if drain_until.is_none() {
                            kill_sandbox(init);
                        }
                    }
                }
            }
        }
        if drain_until.is_none() {
            if let Some(ended) = reap(init)? {
                if end.is_none() {
                    end = Some(match ended {
                        Ended::Exited(code) => End::Exited(code),
                        Ended::Signaled(sig) => End::Signaled(sig),
                    });
                }
                drain_until = Some(Instant::now() + DRAIN);
            }
        }
    }
    // Not reaped yet (the streams closed first): killed, so that nothing of
    // the sandbox outlives the call. A reaped init's pid may already be
    // another process's, and its pid namespace is gone with it anyway.
    if drain_until.is_none() {
        kill_sandbox(init);
    }
    end.ok_or_else(|| RuntimeError::invalid("the call", "ended without a status"))
}

fn kill_sandbox(init: Pid) {
    // Killing a pid namespace's init kills every process in it.
    let _ = nix::sys::signal::kill(init, Signal::SIGKILL);
}
