//! Waiting for a foreground container: reap, forward signals, exit code.

use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Result, RuntimeError};

/// Signals blocked (to be taken with sigwait) while a foreground container
/// runs; restored when dropped.
pub struct SignalGuard {
    set: SigSet,
    old: SigSet,
}

impl SignalGuard {
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
        let mut old = SigSet::empty();
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old))
            .map_err(|e| RuntimeError::sys("block signals", e))?;
        Ok(Self { set, old })
    }

    /// Waits for `init` to end and returns its exit code, or 128 + N when
    /// signal N ended it. Every other signal runsbx receives meanwhile is
    /// passed to `init`, as runc does; other children are reaped.
    pub fn wait_forwarding(self, init: Pid) -> Result<i32> {
        loop {
            if let Some(code) = reap(init)? {
                return Ok(code);
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

/// Reaps every exited child; returns the exit code of `init` once it is
/// among them.
fn reap(init: Pid) -> Result<Option<i32>> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == init => return Ok(Some(code)),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == init => {
                return Ok(Some(128 + sig as i32))
            }
            Ok(WaitStatus::StillAlive) | Err(nix::Error::ECHILD) => return Ok(None),
            Ok(_) => continue,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("waitpid", e)),
        }
    }
}
