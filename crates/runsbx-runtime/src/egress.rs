//! Egress for containers made by `create` (podman, containerd): the same
//! proxy as `runsbx call`, owned by a small supervisor process that runsbx
//! forks when it creates the container and that exits when the
//! container's init does.
//!
//! The listening socket is made inside the sandbox's network namespace by
//! runsbx itself (still single-threaded), then handed to the supervisor,
//! which starts the proxy's thread and waits on a pidfd of the init. Its
//! stdio goes to /dev/null: an engine reading runsbx's stdout must see it
//! close when `create` returns. The log file stays open (the supervisor
//! logs refusals there); closing every other fd would let a socket the
//! proxy opens take the log's fd number and receive log lines.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use libcontainer::oci_spec::runtime::Spec;
use nix::unistd::{fork, ForkResult, Pid};
use runsbx_policy::Profile;

use crate::error::{Result, RuntimeError};
use crate::netns;

/// The port of the proxy inside every sandbox (its own netns: free).
pub const PROXY_PORT: u16 = 3128;

/// The proxy's configuration for a container of `profile` whose spec
/// carries `annotations`; `None` when it gets no egress.
pub fn config_for(spec: &Spec, profile: &Profile) -> Result<Option<runsbx_proxy::ProxyConfig>> {
    let allow = runsbx_policy::annotations::egress_allow(spec.annotations().as_ref(), profile)
        .map_err(crate::policy::policy_err)?;
    if allow.is_empty() {
        return Ok(None);
    }
    let bad = |what: String, reason: String| {
        RuntimeError::invalid(format!("profile `{}`: egress {what}", profile.name), reason)
    };
    let list =
        runsbx_proxy::Allowlist::parse(&allow).map_err(|e| bad("allow".into(), e.to_string()))?;
    let mut config = runsbx_proxy::ProxyConfig::new(list);
    for (name, ip) in &profile.egress.resolve {
        let ip = ip
            .parse()
            .map_err(|e| bad(format!("resolve.{name}"), format!("{ip:?}: {e}")))?;
        config
            .hosts
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(ip);
    }
    for a in &profile.egress.allow_addresses {
        config.allow_addresses.push(
            a.parse()
                .map_err(|e| bad("allow_addresses".into(), format!("{a:?}: {e}")))?,
        );
    }
    Ok(Some(config))
}

/// Adds the proxy's variables to the container's environment.
pub fn add_proxy_env(spec: &mut Spec) {
    if let Some(process) = spec.process_mut() {
        let mut env = process.env().clone().unwrap_or_default();
        let vars = runsbx_proxy::proxy_env(PROXY_PORT);
        env.retain(|e| {
            !vars
                .iter()
                .any(|v| v.split('=').next() == e.split('=').next())
        });
        env.extend(vars);
        process.set_env(Some(env));
    }
}

/// Makes the proxy's socket in the network namespace of `init` and forks
/// the supervisor that serves it until `init` exits.
pub fn supervise(init: Pid, own_userns: bool, config: runsbx_proxy::ProxyConfig) -> Result<()> {
    let listener = netns::listen_in(init, own_userns, PROXY_PORT)?;
    let pidfd = pidfd_open(init)?;
    // SAFETY: runsbx is single-threaded here (as libcontainer requires of
    // it); the child runs only this module's code and exits with _exit.
    match unsafe { fork() }.map_err(|e| RuntimeError::sys("fork the egress supervisor", e))? {
        ForkResult::Parent { .. } => Ok(()),
        ForkResult::Child => {
            let code = serve(listener, pidfd, config);
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
    }
}

fn serve(
    listener: std::net::TcpListener,
    pidfd: OwnedFd,
    config: runsbx_proxy::ProxyConfig,
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
    let Ok(proxy) = runsbx_proxy::spawn(listener, config) else {
        return 1;
    };
    let mut fds = [nix::poll::PollFd::new(
        pidfd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    // Readable once the init has exited.
    while let Err(nix::Error::EINTR) = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE) {}
    for event in proxy.events() {
        tracing::warn!(host = %event.host, port = event.port, reason = event.reason.code(), "egress refused");
    }
    proxy.shutdown();
    0
}

fn pidfd_open(pid: Pid) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid.as_raw(), 0) };
    if fd < 0 {
        return Err(RuntimeError::sys(
            format!("pidfd_open({pid})"),
            nix::Error::last(),
        ));
    }
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
