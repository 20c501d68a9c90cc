//! `runsbx call`: one tool call in a fresh sandbox, and its result.
//!
//! The pipeline, in one runsbx process:
//! 1. check every input (image, command, durations, files) before anything
//!    is made on the host;
//! 2. move into a private mount namespace (as an unprivileged user, inside a
//!    user namespace of runsbx's own): every mount made from here on, the
//!    workspace tmpfs above all, disappears with the call even if runsbx is
//!    killed;
//! 3. mount the workspace, copy the inputs in, build the sandbox through the
//!    same policy path as `create` (hardened, verified);
//! 4. start it with stdout and stderr on pipes, read both into bounded
//!    captures until it exits, the deadline passes or runsbx is told to stop;
//! 5. kill whatever is left (its pid namespace: double-forked daemons too),
//!    read the limit events, copy the outputs out, remove everything.
//!
//! A runsbx killed with SIGKILL cannot clean up: the next call (or
//! `runsbx delete --force`) removes what it left, see [`sweep`].

mod capture;
mod events;
mod sweep;
mod workspace;

use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcontainer::oci_spec::runtime::{ProcessBuilder, RootBuilder, Spec};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::Serialize;

pub use capture::Stream;
pub use sweep::sweep;
pub use workspace::{Input, OutputFile};

use crate::error::{ErrorKind, Result, RuntimeError};
use crate::image::ImageStore;
use crate::ops::create;
use crate::policy::Policy;
use crate::sandbox::network;
use crate::sandbox::teardown;
use crate::state::container;
use crate::state::root::StateRoot;
use crate::sys::userns;
use crate::{state::bundle, sys::cgroupless, sys::netns, sys::privilege};

/// The version of the result's schema; see README.md "runsbx call".
pub const SCHEMA: &str = "runsbx.call/v1";

pub use crate::error::call_exit as exit;

/// Where the call's stdin comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdinFrom {
    /// /dev/null (the default: a tool call never reads the agent's stdin).
    Null,
    /// runsbx's own stdin (`--stdin -`).
    Inherit,
    File(PathBuf),
}

#[derive(Debug, Clone)]
pub struct CallRequest {
    /// An image of the store, by name; `None` with no `rootfs` means the
    /// default image.
    pub image: Option<String>,
    /// A root filesystem directory to use instead of an image.
    pub rootfs: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub profile: Option<String>,
    pub timeout: Duration,
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub env: Vec<(String, String)>,
    pub stdin: StdinFrom,
    pub inputs: Vec<Input>,
    pub outputs: Vec<String>,
    pub output_dir: PathBuf,
    /// Bytes kept of each of stdout and stderr.
    pub max_output: usize,
    pub max_output_file: u64,
    pub command: Vec<String>,
    /// Echo the command's output as it comes (human output).
    pub live: bool,
    /// Egress through the proxy; `None`: no way out at all.
    pub egress: Option<Egress>,
}

/// What the call may reach through its egress proxy.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    /// `--allow-host` entries: `name`, `name:port`, `*.suffix[:port]`.
    pub allow: Vec<String>,
    /// Names the proxy resolves to these addresses instead of asking DNS
    /// (`--proxy-resolve`; for tests and private resolvers).
    pub hosts: Vec<(String, std::net::IpAddr)>,
    /// Destinations exempt from the address-class check, because whoever
    /// runs runsbx marked them (`--proxy-allow-address`).
    pub allow_addresses: Vec<std::net::SocketAddr>,
}

/// The port of the egress proxy inside the sandbox (its own netns: any
/// fixed port is free there).
pub const PROXY_PORT: u16 = crate::sandbox::egress::PROXY_PORT;

/// The egress part of the result.
#[derive(Debug, Clone, Serialize)]
pub struct EgressReport {
    pub allow: Vec<String>,
    pub proxy: String,
    /// Each refusal, as the sandbox got it (403).
    pub denied: Vec<runsbx_proxy::DenyEvent>,
    pub dropped_events: u64,
    pub stats: runsbx_proxy::ProxyStats,
}

/// How the call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Exited,
    Signaled,
    TimedOut,
    Interrupted,
    Error,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Limits {
    pub timeout_ms: u64,
    pub memory_bytes: Option<u64>,
    /// Whether the memory limit stopped (OOM-killed) a process: `null` when
    /// the host cannot tell (rootless: no cgroup).
    pub memory_hit: Option<bool>,
    pub pids: Option<i64>,
    /// Whether a fork failed at the pids limit (`null` when unknown).
    pub pids_hit: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CallError {
    /// Serialised as `bad_input`, `not_found`, `not_executable`, `refused`
    /// or `failure`.
    pub kind: ErrorKind,
    pub message: String,
}

impl CallError {
    /// A call refused before anything was made (an option that does not
    /// parse, say).
    pub fn bad_input(message: String) -> Self {
        Self {
            kind: ErrorKind::BadInput,
            message,
        }
    }
}

/// The result of one call; the JSON schema `runsbx.call/v1`.
#[derive(Debug, Clone, Serialize)]
pub struct CallResult {
    pub schema: &'static str,
    pub id: String,
    pub image: Option<String>,
    pub command: Vec<String>,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub duration_ms: f64,
    pub limits: Limits,
    pub stdout: Option<Stream>,
    pub stderr: Option<Stream>,
    pub outputs: Vec<OutputFile>,
    /// The egress proxy's allowlist, refusals and counters; `null` when the
    /// call had no egress.
    pub egress: Option<EgressReport>,
    /// The isolation layers in force, from the policy.
    pub attestation: serde_json::Value,
    pub error: Option<CallError>,
}

impl CallResult {
    /// The exit code of `runsbx call` for this result.
    pub fn exit_code(&self) -> i32 {
        match (&self.status, &self.error) {
            (Status::Exited, _) => self.exit_code.unwrap_or(exit::FAILURE),
            (Status::Signaled | Status::Interrupted, _) => self.exit_code.unwrap_or(exit::FAILURE),
            (Status::TimedOut, _) => exit::TIMED_OUT,
            (Status::Error, Some(e)) => e.kind.call_exit_code(),
            (Status::Error, None) => exit::FAILURE,
        }
    }
}

/// What the human output needs after the call: the tails of the streams
/// that were cut (the heads were written live).
pub struct Tails {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs the call. Errors are part of the result, never lost.
pub fn call(root: &StateRoot, req: &CallRequest) -> (CallResult, Tails) {
    let started = Instant::now();
    let id = new_id();
    let mut result = CallResult {
        schema: SCHEMA,
        id: id.clone(),
        image: None,
        command: req.command.clone(),
        status: Status::Error,
        exit_code: None,
        signal: None,
        timed_out: false,
        duration_ms: 0.0,
        limits: Limits {
            timeout_ms: req.timeout.as_millis() as u64,
            ..Limits::default()
        },
        stdout: None,
        stderr: None,
        outputs: Vec::new(),
        egress: None,
        attestation: serde_json::Value::Null,
        error: None,
    };
    let mut tails = Tails {
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Err(e) = run(root, req, &id, &mut result, &mut tails) {
        result.status = Status::Error;
        result.error = Some(CallError {
            kind: e.kind(),
            message: format!("{:#}", ErrorChain(&e)),
        });
    }
    result.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    (result, tails)
}

/// Prints an error with its sources, as anyhow's `{:#}` would.
struct ErrorChain<'a>(&'a RuntimeError);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// A fresh id: `call-` and 16 random hex digits.
fn new_id() -> String {
    let mut bytes = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_err()
    {
        // Unique enough without randomness: pid and time.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = ((t as u64) ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    format!("call-{:016x}", u64::from_le_bytes(bytes))
}

/// The directory of a call's own files (its workspace mount point).
fn call_dir(root: &StateRoot, id: &str) -> PathBuf {
    root.path().join("@calls").join(id)
}

fn run(
    root: &StateRoot,
    req: &CallRequest,
    id: &str,
    result: &mut CallResult,
    tails: &mut Tails,
) -> Result<()> {
    // Abandoned calls are swept before the re-exec below: an unprivileged
    // caller may see the fds of a dead call's processes only from the user
    // namespace it made that call's namespaces from.
    if userns::userns_from().is_none() {
        sweep(root);
    }
    // Unprivileged: runsbx continues in a user namespace of its own, where
    // it may mount (see cgroupless.rs). Nothing has been made yet.
    userns::reexec_in_own_userns()?;
    if req.command.is_empty() {
        return Err(RuntimeError::invalid(
            "runsbx call",
            "no command: give it after `--`, e.g. runsbx call -- python3 -c 'print(1)'",
        ));
    }
    // Everything the caller gave is checked before anything is made.
    // Outputs go into a directory the caller made: runsbx creates none on
    // the host but the outputs' own subdirectories inside it.
    if !req.outputs.is_empty() && !req.output_dir.is_dir() {
        return Err(RuntimeError::invalid(
            format!("--output-dir {:?}", req.output_dir),
            "is not an existing directory (create it first)",
        ));
    }
    // `_image` holds the image's in-use lock until the call ends.
    let (rootfs, image_env, _image) = match (&req.rootfs, &req.image) {
        (Some(_), Some(_)) => {
            return Err(RuntimeError::invalid(
                "--image and --rootfs",
                "give one or the other",
            ))
        }
        (Some(dir), None) => {
            bundle::check_rootfs("--rootfs", dir, root.path())?;
            let dir = fs::canonicalize(dir)
                .map_err(|e| RuntimeError::invalid(format!("--rootfs {dir:?}"), format!("{e}")))?;
            (dir, Vec::new(), None)
        }
        (None, name) => {
            let name = name.as_deref().unwrap_or(crate::image::DEFAULT_IMAGE);
            let image = ImageStore::open(req.data_dir.as_deref())?.resolve(name)?;
            result.image = Some(image.name.clone());
            (image.rootfs.clone(), image.config.env.clone(), Some(image))
        }
    };
    for input in &req.inputs {
        fs::symlink_metadata(&input.host).map_err(|e| {
            RuntimeError::invalid(
                format!("--input {:?}", input.host),
                format!("{e} (give an existing file or directory)"),
            )
        })?;
    }
    let stdin: OwnedFd = match &req.stdin {
        StdinFrom::Null => File::open("/dev/null")
            .map_err(|e| RuntimeError::io("open /dev/null", e))?
            .into(),
        StdinFrom::Inherit => std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| RuntimeError::io("dup stdin", e))?,
        StdinFrom::File(p) => File::open(p)
            .map_err(|e| RuntimeError::invalid(format!("--stdin {p:?}"), e.to_string()))?
            .into(),
    };
    let proxy_config = req.egress.as_ref().map(proxy_config).transpose()?;
    let mut env = environment(&image_env, &req.env);
    if proxy_config.is_some() {
        env.extend(runsbx_proxy::proxy_env(PROXY_PORT));
    }
    resolve_command(&rootfs, &req.command[0], &env)?;
    if privilege::rootless()
        && pathrs::Root::open(&rootfs)
            .and_then(|r| r.resolve("/workspace"))
            .is_err()
    {
        // As root runsbx makes it; an unprivileged caller cannot write
        // into an image that is not theirs (images of the store have it).
        return Err(RuntimeError::invalid(
            format!("the rootfs {rootfs:?}"),
            "has no /workspace directory for the call to work in; create it (mkdir ROOTFS/workspace)",
        ));
    }
    let spec = call_spec(&rootfs, req, env)?;
    let policy = Policy::load(req.config.as_deref())?;
    let profile = policy.profile_for(&spec)?;
    let Some(workspace_size) = profile.tmpfs.get(Path::new("/workspace")).map(|s| s.0) else {
        return Err(RuntimeError::invalid(
            format!("profile `{}`", profile.name),
            "has no /workspace tmpfs, which runsbx call works in; add it under [tmpfs]",
        ));
    };

    // From here on, things exist on the host: each is removed on the way out.
    let lock = root.lock(id)?;
    // Every mount from here on is seen by nobody else and dies with the call.
    cgroupless::private_mount_namespace()
        .map_err(|e| RuntimeError::sys("a private mount namespace for the call", e))?;
    let dir = call_dir(root, id);
    fs::DirBuilder::new()
        .recursive(true)
        .create(&dir)
        .map_err(|e| RuntimeError::io(format!("create {dir:?}"), e))?;
    let _dir_guard = RemoveOnDrop(dir.clone());
    let watchdog = sweep::Watchdog::spawn(root, id)?;
    let ws = workspace::Workspace::mount(&dir.join("workspace"), workspace_size)?;
    for input in &req.inputs {
        ws.copy_in(input)?;
    }
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let source = bundle::Bundle {
        dir: dir.clone(),
        spec,
        rootfs,
    };
    let mut give_workspace = |spec: &Spec| {
        let (uid, gid) = root_ids(spec);
        ws.give_to(uid, gid)
    };
    let parts = create::CallParts {
        stdin,
        stdout: out_w,
        stderr: err_w,
        workspace: Some(&ws.dir),
        prepare: &mut give_workspace,
    };
    let mut container = create::create_for_call(root, id, &source, &policy, parts, &lock)?;
    let cleanup = Cleanup {
        root,
        id,
        done: false,
    };
    let init = container::init_pid(&container)?;
    let effective = bundle::Effective::path(root, id);
    let config: Spec = fs::read_to_string(effective.join("config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| RuntimeError::invalid("the effective bundle", "config.json unreadable"))?;
    result.limits.memory_bytes = memory_limit(&config);
    result.limits.pids = config
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.pids().as_ref())
        .map(|p| p.limit());

    // Signals are taken from a signalfd from here on. The container's init
    // was cloned during create and keeps its own, empty, mask.
    let mut mask = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGPIPE,
    ] {
        mask.add(sig);
    }
    let mut old_mask = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&mask), Some(&mut old_mask))
        .map_err(|e| RuntimeError::sys("block signals", e))?;
    let _restore = RestoreMask(old_mask);
    let sfd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| RuntimeError::sys("signalfd", e))?;

    // The proxy serves a socket made inside the sandbox's network namespace
    // (its only way out); its thread starts only now, after every fork.
    let proxy = match proxy_config {
        Some(config) => {
            let listener = netns::listen_in(init, true, PROXY_PORT)?;
            Some(
                runsbx_proxy::spawn(listener, config)
                    .map_err(|e| RuntimeError::invalid("start the egress proxy", e.to_string()))?,
            )
        }
        None => None,
    };
    network::recheck_network(&container, "start")?;
    container
        .start()
        .map_err(|e| container::op_err("start", id, e))?;
    if let Some(report) = bundle::Effective::report(&effective) {
        result.attestation = report["attestation"].clone();
    }
    let live = |to_stderr: bool| -> Option<Box<dyn Write>> {
        req.live.then(|| -> Box<dyn Write> {
            if to_stderr {
                Box::new(std::io::stderr())
            } else {
                Box::new(std::io::stdout())
            }
        })
    };
    let mut out = capture::Capture::new(req.max_output, live(false));
    let mut err = capture::Capture::new(req.max_output, live(true));
    let end = supervise(
        init,
        req.timeout,
        &sfd,
        [Some(out_r), Some(err_r)],
        &mut out,
        &mut err,
    )?;

    if let (Some(proxy), Some(egress)) = (proxy, &req.egress) {
        result.egress = Some(EgressReport {
            allow: egress.allow.clone(),
            proxy: format!("127.0.0.1:{PROXY_PORT}"),
            denied: proxy.events(),
            dropped_events: proxy.dropped_events(),
            stats: proxy.stats(),
        });
        proxy.shutdown();
    }
    // The limit events are read before the cgroup goes with the container.
    let (memory_hit, pids_hit) = events::limit_hits(&config);
    result.limits.memory_hit = memory_hit;
    result.limits.pids_hit = pids_hit;
    cleanup.finish()?;
    drop(container);

    let (stdout, out_tail, _) = out.finish();
    let (stderr, err_tail, _) = err.finish();
    if stdout.truncated {
        tails.stdout = out_tail;
    }
    if stderr.truncated {
        tails.stderr = err_tail;
    }
    result.stdout = Some(stdout);
    result.stderr = Some(stderr);
    match end {
        End::Exited(code) => {
            result.status = Status::Exited;
            result.exit_code = Some(code);
        }
        End::Signaled(sig) => {
            result.status = Status::Signaled;
            result.signal = Some(sig.as_str().to_owned());
            result.exit_code = Some(128 + sig as i32);
        }
        End::TimedOut => {
            result.status = Status::TimedOut;
            result.timed_out = true;
        }
        End::Interrupted(sig) => {
            result.status = Status::Interrupted;
            result.signal = Some(sig.as_str().to_owned());
            result.exit_code = Some(128 + sig as i32);
        }
    }
    if !req.outputs.is_empty() {
        result.outputs =
            workspace::collect_outputs(&ws.dir, &req.outputs, &req.output_dir, req.max_output_file);
    }
    ws.unmount()?;
    drop(lock);
    drop(watchdog);
    Ok(())
}

/// Deletes the call's container (killing what is left of it) when dropped,
/// unless [`Cleanup::finish`] did it already.
struct Cleanup<'a> {
    root: &'a StateRoot,
    id: &'a str,
    done: bool,
}

impl Cleanup<'_> {
    fn finish(mut self) -> Result<()> {
        self.done = true;
        remove_container(self.root, self.id)
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = remove_container(self.root, self.id) {
                tracing::error!(id = self.id, "clean up the call's sandbox: {e}");
            }
        }
    }
}

fn remove_container(root: &StateRoot, id: &str) -> Result<()> {
    match container::load(root, id) {
        Ok(mut c) => teardown::destroy(root, &mut c),
        Err(RuntimeError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

struct RestoreMask(SigSet);

impl Drop for RestoreMask {
    fn drop(&mut self) {
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&self.0), None);
    }
}

enum End {
    Exited(i32),
    Signaled(Signal),
    TimedOut,
    Interrupted(Signal),
}

/// How long the streams are read after the sandbox's init has exited: the
/// kernel kills the rest of its pid namespace, and their pipe ends close.
const DRAIN: Duration = Duration::from_secs(2);

/// Reads both streams until the init process exits (and the pipes close),
/// the deadline passes, or runsbx is told to stop.
fn supervise(
    init: Pid,
    timeout: Duration,
    sfd: &SignalFd,
    mut streams: [Option<OwnedFd>; 2],
    out: &mut capture::Capture,
    err: &mut capture::Capture,
) -> Result<End> {
    let deadline = Instant::now() + timeout;
    let mut end: Option<End> = None;
    let mut drain_until: Option<Instant> = None;
    let mut buf = vec![0u8; 64 * 1024];
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
            match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
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
            if let Some(status) = reap(init)? {
                if end.is_none() {
                    end = Some(status);
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

/// Reaps exited children; the init's status once it is among them.
fn reap(init: Pid) -> Result<Option<End>> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == init => return Ok(Some(End::Exited(code))),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == init => {
                return Ok(Some(End::Signaled(sig)))
            }
            Ok(WaitStatus::StillAlive) | Err(nix::Error::ECHILD) => return Ok(None),
            Ok(_) | Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(RuntimeError::sys("waitpid", e)),
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    // The read end stays with runsbx (close-on-exec); libcontainer dups the
    // write end onto the init's fd 1 or 2.
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe2", e))
}

/// The host ids (in runsbx's user namespace) of the sandbox's root.
fn root_ids(spec: &Spec) -> (u32, u32) {
    let find = |maps: &Option<Vec<libcontainer::oci_spec::runtime::LinuxIdMapping>>| {
        maps.iter()
            .flatten()
            .find(|m| m.container_id() == 0)
            .map(|m| m.host_id())
    };
    let linux = spec.linux().as_ref();
    let uid = linux.and_then(|l| find(l.uid_mappings())).unwrap_or(0);
    let gid = linux.and_then(|l| find(l.gid_mappings())).unwrap_or(0);
    (uid, gid)
}

fn memory_limit(spec: &Spec) -> Option<u64> {
    spec.linux()
        .as_ref()?
        .resources()
        .as_ref()?
        .memory()
        .as_ref()?
        .limit()
        .and_then(|l| u64::try_from(l).ok())
}

/// The command's environment: the image's, then the caller's `--env`
/// (later wins). Never runsbx's own.
fn environment(image: &[String], extra: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_owned(), v.to_owned()));
    };
    set(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    set("HOME", "/tmp");
    for kv in image {
        if let Some((k, v)) = kv.split_once('=') {
            set(k, v);
        }
    }
    for (k, v) in extra {
        set(k, v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn proxy_config(egress: &Egress) -> Result<runsbx_proxy::ProxyConfig> {
    let allow = runsbx_proxy::Allowlist::parse(&egress.allow)
        .map_err(|e| RuntimeError::invalid("--allow-host", e.to_string()))?;
    let mut config = runsbx_proxy::ProxyConfig::new(allow);
    for (name, ip) in &egress.hosts {
        config
            .hosts
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(*ip);
    }
    config.allow_addresses = egress.allow_addresses.clone();
    Ok(config)
}

/// Parses a size such as `1M`, `512K`, `2G` or a number of bytes.
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    runsbx_policy::profile::parse_size(text)
}

/// Parses `KEY=VALUE` for `--env`.
pub fn parse_env(arg: &str) -> Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v))
            if !k.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            Ok((k.to_owned(), v.to_owned()))
        }
        _ => Err(RuntimeError::invalid(
            format!("--env {arg:?}"),
            "use KEY=VALUE with a KEY of letters, digits and _",
        )),
    }
}

/// Parses a duration: `30s`, `1.5s`, `500ms`, `2m`, `1h`, or plain seconds.
pub fn parse_duration(text: &str) -> Result<Duration> {
    runsbx_policy::profile::parse_duration(text)
        .map_err(|reason| RuntimeError::invalid(format!("--timeout {text:?}"), reason))
}

/// Checks that the command exists in the image and can be executed,
/// resolving it inside the rootfs (symlinks included) as the kernel would
/// inside the sandbox.
fn resolve_command(rootfs: &Path, command: &str, env: &[String]) -> Result<()> {
    let root = pathrs::Root::open(rootfs)
        .map_err(|e| RuntimeError::invalid(format!("the rootfs {rootfs:?}"), e.to_string()))?;
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/bin:/bin");
    let candidates: Vec<PathBuf> = if command.contains('/') {
        let p = Path::new(command);
        vec![if p.is_absolute() {
            p.to_path_buf()
        } else {
            Path::new("/workspace").join(p)
        }]
    } else {
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| Path::new(d).join(command))
            .collect()
    };
    let mut not_executable = None;
    for candidate in &candidates {
        // Inputs land in /workspace, which is not in the image: a command
        // there is checked by the kernel at exec time.
        if candidate.starts_with("/workspace") {
            return Ok(());
        }
        let Ok(handle) = root.resolve(candidate) else {
            continue;
        };
        let Ok(stat) = nix::sys::stat::fstat(handle.as_fd().as_raw_fd()) else {
            continue;
        };
        let is_file = stat.st_mode & libc::S_IFMT == libc::S_IFREG;
        if is_file && stat.st_mode & 0o111 != 0 {
            return Ok(());
        }
        not_executable.get_or_insert_with(|| candidate.clone());
    }
    match not_executable {
        Some(p) => Err(RuntimeError::CommandNotExecutable {
            command: command.to_owned(),
            path: p,
        }),
        None => Err(RuntimeError::CommandNotFound {
            command: command.to_owned(),
            searched: path.to_owned(),
        }),
    }
}

fn call_spec(rootfs: &Path, req: &CallRequest, env: Vec<String>) -> Result<Spec> {
    let invalid = |e: libcontainer::oci_spec::OciSpecError| {
        RuntimeError::invalid("build the call's spec", e.to_string())
    };
    let mut spec = crate::ops::spec::default_spec(privilege::rootless())?;
    let process = ProcessBuilder::default()
        .args(req.command.clone())
        .env(env)
        .cwd("/workspace")
        .terminal(false)
        .build()
        .map_err(invalid)?;
    spec.set_process(Some(process));
    spec.set_root(Some(
        RootBuilder::default()
            .path(rootfs.to_path_buf())
            .readonly(true)
            .build()
            .map_err(invalid)?,
    ));
    let mut annotations = std::collections::HashMap::new();
    if let Some(m) = &req.memory {
        annotations.insert("runsbx.limits.memory".to_owned(), m.clone());
    }
    if let Some(p) = req.pids {
        annotations.insert("runsbx.limits.pids".to_owned(), p.to_string());
    }
    if let Some(p) = &req.profile {
        annotations.insert(runsbx_policy::annotations::PROFILE.to_owned(), p.clone());
    }
    // The policy holds the call's deadline to the profile's and attests it;
    // the call enforces it itself.
    annotations.insert(
        runsbx_policy::annotations::TIMEOUT.to_owned(),
        format!("{}ms", req.timeout.as_millis()),
    );
    spec.set_annotations(Some(annotations));
    Ok(spec)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        for bad in ["", "0", "-1s", "abc", "5x", "1e9", "nan", "8d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn environment_is_image_then_caller_never_runsbx() {
        std::env::set_var("RUNSBX_TEST_SECRET", "x");
        let env = environment(
            &["PATH=/opt/bin".to_owned(), "LANG=C.UTF-8".to_owned()],
            &[("LANG".to_owned(), "en".to_owned())],
        );
        assert!(env.contains(&"PATH=/opt/bin".to_owned()));
        assert!(env.contains(&"LANG=en".to_owned()));
        assert!(env.contains(&"HOME=/tmp".to_owned()));
        assert!(!env.iter().any(|e| e.contains("RUNSBX_TEST_SECRET")));
    }

    #[test]
    fn env_args() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        for bad in ["A", "=x", "1A=x", "A-B=x"] {
            assert!(parse_env(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exit_codes_of_results() {
        let mut r = CallResult {
            schema: SCHEMA,
            id: "x".into(),
            image: None,
            command: vec![],
            status: Status::Exited,
            exit_code: Some(3),
            signal: None,
            timed_out: false,
            duration_ms: 0.0,
            limits: Limits::default(),
            stdout: None,
            stderr: None,
            outputs: vec![],
            egress: None,
            attestation: serde_json::Value::Null,
            error: None,
        };
        assert_eq!(r.exit_code(), 3);
        r.status = Status::TimedOut;
        assert_eq!(r.exit_code(), exit::TIMED_OUT);
        r.status = Status::Error;
        r.error = Some(CallError {
            kind: ErrorKind::CommandNotFound,
            message: String::new(),
        });
        assert_eq!(r.exit_code(), exit::NOT_FOUND);
        // The error object's kind is one of the five the schema documents.
        let kinds = [
            (ErrorKind::BadInput, "bad_input", exit::BAD_INPUT),
            (ErrorKind::Missing, "bad_input", exit::BAD_INPUT),
            (ErrorKind::Conflict, "bad_input", exit::BAD_INPUT),
            (ErrorKind::Unsupported, "bad_input", exit::BAD_INPUT),
            (ErrorKind::Refused, "refused", exit::BAD_INPUT),
            (ErrorKind::CommandNotFound, "not_found", exit::NOT_FOUND),
            (
                ErrorKind::CommandNotExecutable,
                "not_executable",
                exit::NOT_EXECUTABLE,
            ),
            (ErrorKind::Failure, "failure", exit::FAILURE),
        ];
        for (kind, name, code) in kinds {
            assert_eq!(serde_json::to_value(kind).unwrap(), name);
            r.error = Some(CallError {
                kind,
                message: String::new(),
            });
            assert_eq!(r.exit_code(), code, "{kind:?}");
        }
    }
}
