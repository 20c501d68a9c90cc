//! Signals: names and numbers as `kill` takes them, and waiting for a
//! foreground container (reap, forward signals, its exit code).

use std::str::FromStr;

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};

/// Parses `KILL`, `SIGKILL`, `kill` or `9`.
pub fn parse(text: &str) -> Result<Signal> {
    let bad = || {
        RuntimeError::invalid(
            format!("signal {text:?}"),
            "not a signal (use a name such as TERM or SIGKILL, or a number 1-31)",
        )
    };
    if let Ok(n) = text.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| bad());
    }
    let upper = text.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    Signal::from_str(&name).map_err(|_| bad())
}

/// Gives SIGPIPE back its default action. Rust's runtime ignores it at
/// startup, and an ignored signal stays ignored across fork and exec: every
/// container runsbx starts would inherit that, and `yes | head` in a
/// sandbox would spin on EPIPE forever instead of ending. Called first
/// thing in main, before any container exists (a sandbox's processes get
/// every default back anyway: [`default_dispositions`]).
pub fn restore_default_sigpipe() {
    // SAFETY: setting a signal's disposition to its default installs no
    // handler.
    let _ =
        unsafe { nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
}

/// Gives every signal its default action back, as a process that starts
/// in a sandbox must find them. An ignored signal stays ignored across
/// fork and exec, so whatever runsbx's caller ignored (a shell's
/// background job ignores SIGINT and SIGQUIT, `nohup` SIGHUP), and SIGPIPE
/// while libcontainer builds ([`SigpipeIgnored`]), would reach the
/// sandbox's processes; a handled signal goes back to its default at exec
/// anyway. Called in the init and in an exec'd process, last thing before
/// the exec, and before the seccomp filter.
pub fn default_dispositions() {
    /// The kernel's `struct sigaction` (x86_64 and aarch64 alike): glibc
    /// refuses its own two signals (32 and 33) to sigaction(3), and an
    /// ignored one is inherited like any other.
    #[repr(C)]
    struct KernelSigaction {
        handler: libc::sighandler_t,
        flags: libc::c_ulong,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for signal in 1..=libc::SIGRTMAX() {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction with a default disposition installs no
        // handler; the init and an exec'd process are single-threaded here.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                &default as *const KernelSigaction,
                std::ptr::null_mut::<KernelSigaction>(),
                std::mem::size_of::<u64>(),
            )
        };
    }
}

/// SIGPIPE ignored until dropped, when its default action is back.
///
/// While libcontainer builds a sandbox: it writes the container's state to
/// each hook's stdin, and a hook may end without reading it (`/bin/false`
/// does). libcontainer takes the EPIPE in stride, but with SIGPIPE's
/// default action runsbx would die in the middle of the create, with
/// nothing cleaned up. The processes libcontainer clones meanwhile inherit
/// the ignored signal; the init gives every signal its default action back
/// before it execs ([`default_dispositions`], in every executor runsbx
/// hands libcontainer, `ops/create.rs`), and libcontainer starts hooks
/// through `std::process::Command`, which restores SIGPIPE's.
pub struct SigpipeIgnored(());

impl SigpipeIgnored {
    /// SIGPIPE ignored from now on.
    pub fn now() -> Self {
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe {
            nix::sys::signal::signal(Signal::SIGPIPE, nix::sys::signal::SigHandler::SigIgn)
        };
        Self(())
    }
}

impl Drop for SigpipeIgnored {
    fn drop(&mut self) {
        restore_default_sigpipe();
    }
}

/// Signals blocked (to be taken with sigwait or a signalfd) while a
/// foreground container or a call runs; the old mask is restored when
/// dropped.
pub struct SignalGuard {
    set: SigSet,
    old: SigSet,
}

impl SignalGuard {
    /// Blocks `signals`, to be taken from a signalfd on [`Self::set`].
    pub fn block(signals: &[Signal]) -> Result<Self> {
        let mut set = SigSet::empty();
        for sig in signals {
            set.add(*sig);
        }
        Self::block_set(set)
    }

    /// Blocks every signal but the synchronous fault signals.
    pub fn block_all() -> Result<Self> {
        let mut set = SigSet::all();
        for sig in [
            Signal::SIGSEGV,
            Signal::SIGBUS,
            Signal::SIGFPE,
            Signal::SIGILL,
            Signal::SIGTRAP,
        ] {
            set.remove(sig);
        }
        Self::block_set(set)
    }

    fn block_set(set: SigSet) -> Result<Self> {
        let mut old = SigSet::empty();
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))
            .map_err(|e| RuntimeError::sys("block signals", e))?;
        Ok(Self { set, old })
    }

    /// The signals this guard blocks.
    pub fn set(&self) -> &SigSet {
        &self.set
    }

    /// Waits for `init` to end and returns its exit code, or 128 + N when
    /// signal N ended it. Every other signal runsbx receives meanwhile is
    /// passed to `init`, as runc does; other children are reaped.
    pub fn wait_forwarding(self, init: Pid) -> Result<i32> {
        loop {
            if let Some(ended) = reap(init)? {
                return Ok(ended.code());
            }
            let sig = self
                .set
                .wait()
                .map_err(|e| RuntimeError::sys("sigwait", e))?;
            match sig {
                Signal::SIGCHLD => {}
                // Terminal resizes concern a tty runsbx does not own here.
                Signal::SIGWINCH => {}
                sig => {
                    tracing::debug!(%sig, %init, "forwarding signal");
                    if let Err(e) = nix::sys::signal::kill(init, sig) {
                        tracing::warn!(%sig, %init, "forward signal: {e}");
                    }
                }
            }
        }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.old), None);
    }
}

/// How a container's init ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(Signal),
}

impl Ended {
    /// Its exit code as a shell gives it: 128 + N for signal N.
    pub fn code(self) -> i32 {
        match self {
            Self::Exited(code) => code,
            Self::Signaled(sig) => 128 + sig as i32,
        }
    }
}

/// Reaps every exited child; returns how `init` ended once it is among
/// them.
pub fn reap(init: Pid) -> Result<Option<Ended>> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == init => {
                return Ok(Some(Ended::Exited(code)))
            }
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == init => {
                return Ok(Some(Ended::Signaled(sig)))
            }
            Ok(WaitStatus::StillAlive) | Err(nix::Error::ECHILD) => return Ok(None),
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("waitpid", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_numbers() {
        for (text, sig) in [
            ("KILL", Signal::SIGKILL),
            ("SIGKILL", Signal::SIGKILL),
            ("kill", Signal::SIGKILL),
            ("9", Signal::SIGKILL),
            ("TERM", Signal::SIGTERM),
            ("15", Signal::SIGTERM),
            ("SIGUSR1", Signal::SIGUSR1),
        ] {
            assert_eq!(parse(text).ok(), Some(sig), "{text}");
        }
        for text in ["", "0", "65", "-1", "FOO", "SIG"] {
            assert!(parse(text).is_err(), "{text:?} was accepted");
        }
    }
}
