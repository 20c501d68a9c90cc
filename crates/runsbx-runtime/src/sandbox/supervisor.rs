//! The supervisor of a container made by `create` (podman, containerd,
//! docker, `runsbx run`): a small process runsbx forks when it creates the
//! container, that serves the sandbox's egress proxy and enforces its
//! deadline, and that exits when the container's init does. `runsbx call`
//! does both in its own process instead.
//!
//! The egress proxy's listening socket is made inside the sandbox's network
//! namespace by runsbx itself (still single-threaded) and handed over. The
//! supervisor's stdio goes to /dev/null: an engine reading runsbx's stdout
//! must see it close when `create` returns. The log file stays open (the
//! supervisor logs refusals and the deadline there); closing every other
//! fd would let a socket the proxy opens take the log's fd number and
//! receive log lines.
//!
//! At the deadline it records why the container ended (see [`ended`]) and
//! kills every process of the sandbox, as `runsbx kill --all KILL` does.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::Result;
use crate::state::root::StateRoot;

/// The file in a container's state directory that says why runsbx ended
/// it, when it did.
const ENDED_FILE: &str = "runsbx-ended";

/// Why runsbx ended a container, for `runsbx state` and `run`.
pub const TIMED_OUT: &str = "timed_out";

/// The egress proxy's listening socket, made in the sandbox's network
/// namespace, and what it is to serve.
pub(crate) type Proxy = (std::net::TcpListener, runsbx_proxy::ProxyConfig);

/// What one container's supervisor does.
#[derive(Default)]
pub(crate) struct Duties {
    /// The egress proxy.
    pub proxy: Option<Proxy>,
    /// How long the sandbox may live, from now.
    pub deadline: Option<Duration>,
    /// Learn mode: where the proxy's record goes when the container ends
    /// (a profile's `[egress] learn` directory, `<id>.json`).
    pub learn: Option<PathBuf>,
}

/// Forks the supervisor of container `id`, whose init is `init`. Returns
/// at once; nothing is forked when there is nothing to do.
pub(crate) fn spawn(root: &StateRoot, id: &str, init: Pid, duties: Duties) -> Result<()> {
    if duties.proxy.is_none() && duties.deadline.is_none() {
        return Ok(());
    }
    let pidfd = crate::sys::procs::pidfd_open(init)?;
    let deadline = duties.deadline.map(|d| Instant::now() + d);
    let root = root.clone();
    crate::sys::fork::child("the sandbox's supervisor", &[], || {
        serve(&root, id, pidfd, duties.proxy, deadline, duties.learn)
    })?;
    Ok(())
}

fn serve(
    root: &StateRoot,
    id: &str,
    pidfd: OwnedFd,
    proxy: Option<Proxy>,
    deadline: Option<Instant>,
    learn: Option<PathBuf>,
) -> i32 {
    let _ = nix::unistd::setsid();
    // stdio to /dev/null (see the module's comment).
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..3 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    let proxy = match proxy {
        Some((listener, config)) => match runsbx_proxy::spawn(listener, config) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!(id, "start the egress proxy: {e}; killing the sandbox");
                kill_sandbox(root, id);
                return 1;
            }
        },
        None => None,
    };
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    // The pidfd is readable once the init has exited.
    loop {
        let timeout = match deadline {
            Some(at) => {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    record_ended(root, id, TIMED_OUT);
                    tracing::warn!(id, "the sandbox's deadline passed: killing it");
                    kill_sandbox(root, id);
                    break;
                }
                // poll's timeout is in whole milliseconds, rounded up so
                // that the loop does not spin just before the deadline.
                let ms = left.as_millis().saturating_add(1).min(i32::MAX as u128) as i32;
                nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX)
            }
            None => nix::poll::PollTimeout::NONE,
        };
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) | Err(_) => break,
        }
    }
    if let Some(proxy) = proxy {
        for event in proxy.events() {
            tracing::warn!(host = %event.host, port = event.port, reason = event.reason.code(), "egress refused");
        }
        if let Some(path) = learn {
            if let Err(e) = write_learned(&path, id, &proxy) {
                tracing::error!(id, "learn mode: write {path:?}: {e}");
            }
        }
        proxy.shutdown();
    }
    0
}

/// Writes learn mode's record of container `id`, whole or not at all (a
/// file beside it, renamed over), for `runsbx profile suggest`: the
/// requests its proxy let through and those it refused.
fn write_learned(
    path: &std::path::Path,
    id: &str,
    proxy: &runsbx_proxy::ProxyHandle,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let learned = proxy.learned().unwrap_or_default();
    let record = serde_json::json!({
        "schema": LEARN_SCHEMA,
        "id": id,
        "learned": learned,
        "egress": { "denied": proxy.events() },
    });
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let part = path.with_file_name(format!(".{name}.part"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&part)?;
    let written = serde_json::to_vec_pretty(&record)
        .map_err(std::io::Error::other)
        .and_then(|json| file.write_all(&json))
        .and_then(|()| file.sync_all())
        .and_then(|()| std::fs::rename(&part, path));
    if written.is_err() {
        // A half-written record is no record: nothing is left behind.
        let _ = std::fs::remove_file(&part);
    }
    written?;
    tracing::info!(id, "learn mode: wrote {path:?}");
    Ok(())
}

/// The schema of a container's learn record.
pub const LEARN_SCHEMA: &str = "runsbx.learn/v1";

/// Kills every process of container `id`; the engine (or `run`) reaps the
/// init and deletes the container as after any other end.
fn kill_sandbox(root: &StateRoot, id: &str) {
    if let Err(e) = crate::state::container::signal(root, id, Signal::SIGKILL, true) {
        tracing::error!(id, "kill the sandbox at its deadline: {e}");
    }
}

fn ended_path(root: &StateRoot, id: &str) -> PathBuf {
    root.container_dir(id).join(ENDED_FILE)
}

/// The state annotation that says why runsbx ended a container.
pub const ENDED_ANNOTATION: &str = "runsbx.ended";

fn record_ended(root: &StateRoot, id: &str, why: &str) {
    let path = ended_path(root, id);
    let tmp = path.with_extension("tmp");
    if let Err(e) = std::fs::write(&tmp, why).and_then(|()| std::fs::rename(&tmp, &path)) {
        tracing::error!(id, "record why the sandbox ended in {path:?}: {e}");
    }
}

/// Why runsbx ended container `id` ([`TIMED_OUT`]), if it did.
pub fn ended(root: &StateRoot, id: &str) -> Option<String> {
    ended_in(&root.container_dir(id))
}

/// The same, from the container's state directory.
pub fn ended_in(container_dir: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(container_dir.join(ENDED_FILE)).ok()
}
