//! `runsbx call`: one tool call in a fresh sandbox, and its result.
//!
//! [`run`] is the order of a call, one named step after another; every
//! step that makes something on the host returns a guard that undoes it,
//! so an error at any step leaves nothing behind:
//!
//! - `request.rs`: what the caller asks (parsed and checked at the CLI);
//! - `plan.rs`: the request resolved against the host, every input checked,
//!   before anything is made;
//! - `sandbox/workspace.rs`: the /workspace tmpfs, inputs in, outputs out;
//! - the sandbox itself is built by `ops::create` through the same policy
//!   path as `runsbx create`;
//! - `sandbox/seccomp_events.rs`: the listener the sandbox's seccomp
//!   denials are reported to, bound before the sandbox is built, served
//!   from a thread once it is;
//! - `wait.rs`: the streams read into bounded captures (`capture.rs`) until
//!   the command ends, the deadline passes or runsbx is told to stop;
//! - `limit_hits.rs`: whether a limit stopped it;
//! - `result.rs`: the `runsbx.call/v1` result and its exit code.
//!
//! A runsbx killed with SIGKILL cannot clean up: the next call (or
//! `runsbx delete --force`) removes what it left, see [`sweep`].

mod capture;
mod limit_hits;
mod plan;
mod request;
mod result;
mod sweep;
mod tighten;
mod wait;
mod warm;

use std::fs::{self, File};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::mount::{mount, MsFlags};
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use crate::sandbox::workspace::{Input, OutputFile};
pub use capture::Stream;
pub use request::{CallRequest, LiveOutput, StdinFrom};
pub use result::{
    CallError, CallResult, EgressReport, LearnReport, Limits, SessionReport, Status, Tails, SCHEMA,
};
pub use runsbx_proxy::{Host as SecretHost, Secret};
pub use sweep::{abandon_call, sweep, ABANDON_CALL};
pub use warm::Hold;

use crate::error::{Result, RuntimeError};
use crate::ops::create::{self, Built, Stdio, Supervision};
use crate::sandbox::workspace::{self, Workspace};
use crate::sandbox::{network, seccomp_events, stub, teardown};
use crate::state::container;
use crate::state::root::{IdLock, StateRoot};
use crate::sys::signal::SignalGuard;
use crate::sys::{cgroupless, privilege, stage, userns};
use plan::CallPlan;

pub use crate::error::call_exit as exit;

/// Runs the call. Errors are part of the result, never lost.
pub fn call(root: &StateRoot, req: &CallRequest) -> (CallResult, Tails) {
    call_with(root, req, None)
}

/// Builds a warm sandbox from `template` and runs the one request `hold`
/// gives it that fits (see warm.rs). The result of that request goes to
/// [`Hold::reply`]; what is returned is the error of a sandbox that was
/// never handed out, or of a request that failed after it was.
pub fn warm(root: &StateRoot, template: &CallRequest, hold: &mut dyn Hold) -> (CallResult, Tails) {
    call_with(root, template, Some(hold))
}

fn call_with(
    root: &StateRoot,
    req: &CallRequest,
    hold: Option<&mut dyn Hold>,
) -> (CallResult, Tails) {
    let started = Instant::now();
    let id = new_id();
    let mut result = CallResult::new(&id, req);
    let mut tails = Tails {
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Err(e) = run(root, req, &id, &mut result, &mut tails, hold) {
        result.status = Status::Error;
        result.error = Some(CallError {
            kind: e.kind(),
            message: format!("{:#}", ErrorChain(&e)),
        });
    }
    if result.duration_ms == 0.0 {
        result.duration_ms = started.elapsed().as_secs_f64() * 1000.0;
    }
    (result, tails)
}

/// The order of a call.
fn run(
    root: &StateRoot,
    req: &CallRequest,
    id: &str,
    result: &mut CallResult,
    tails: &mut Tails,
    mut hold: Option<&mut dyn Hold>,
) -> Result<()> {
    // Abandoned calls are swept before the re-exec: an unprivileged caller
    // may see the fds of a dead call's processes only from the user
    // namespace it made that call's namespaces from. A pool's sandboxes
    // leave it to the pool, which sweeps once as it starts (a sweep tries
    // the lock of every call in the state root: per sandbox, 1.5% of a
    // busy pool's CPU).
    if userns::userns_from().is_none() && hold.is_none() {
        sweep(root);
    }
    // Unprivileged, runsbx continues in a user namespace of its own, where
    // it may mount (see sys/cgroupless.rs). Nothing has been made yet.
    userns::reexec_in_own_userns()?;
    let CallPlan {
        image,
        mut sandbox,
        workspace_size,
        req,
        session,
    } = CallPlan::resolve(root, req, &mut result.image)?;
    crate::phase("resolved");
    let req = &req;
    // A session's deadline, when the call gave none.
    result.limits.timeout_ms = req.timeout().as_millis() as u64;
    // As root, a session's calls run in the host id range it keeps.
    let range = match &session {
        Some(s) => {
            result.session = Some(SessionReport {
                name: s.name().to_owned(),
                disk: s.settings.disk.clone(),
            });
            s.id_range(&sandbox.policy.config)?
        }
        None => None,
    };

    // From here on, things exist on the host; each guard removes its own.
    let lock = root.lock(id)?;
    // Every mount from here on is seen by nobody else and dies with the call.
    cgroupless::private_mount_namespace()
        .map_err(|e| RuntimeError::sys("a private mount namespace for the call", e))?;
    // As root, its rootfs and binds are staged for its ids (sys/stage.rs)
    // in this namespace only.
    if !privilege::rootless() {
        stage::private_root()?;
        if session.is_none() {
            stage::leave_to_namespace();
        }
    }
    crate::phase("namespaced");
    let dir = CallDir::create(root, id)?;
    let watchdog = sweep::Watchdog::spawn(root, id)?;
    let (_storage, ws) = match &session {
        Some(s) => {
            let owner = range.map(|r| (r.base, r.base));
            let (storage, ws) = s.mount(&dir.path, &sandbox.rootfs, owner)?;
            sandbox.run_on(storage.rootfs.clone())?;
            (Some(storage), ws)
        }
        None => (
            None,
            Workspace::mount(&dir.path.join("workspace"), workspace_size)?,
        ),
    };
    crate::phase("workspace mounted");
    for input in &req.inputs {
        ws.copy_in(input)?;
    }
    // A benchmark switch (hack/seccomp-bench.sh), not a setting: without
    // the listener, denials are EPERM from the filter, unreported.
    let listener = match std::env::var_os("RUNSBX_BENCH_NO_SECCOMP_LISTENER") {
        Some(_) => None,
        None => seccomp_events::Listener::bind(&dir.path)?,
    };
    sandbox.seccomp_listener = listener.as_ref().map(|l| l.path().to_owned());
    // A warm sandbox: its init is a stub, its requests are held to the
    // template's (the image and policy it was built from).
    let template = match hold {
        Some(_) => {
            let pair = stub::Pair::new()?;
            sandbox.stub = Some((pair.stub, pair.inherited));
            let made = warm::Made {
                rootfs: sandbox.rootfs.clone(),
                image_env: image
                    .as_ref()
                    .map(|i| i.config.env.clone())
                    .unwrap_or_default(),
                policy: sandbox.policy.clone(),
                session: session.as_ref().map(|s| s.settings.clone()),
                seccomp_listener: sandbox.seccomp_listener.clone(),
            };
            Some((pair.link, made))
        }
        None => None,
    };
    let (mut sandbox, streams) = Sandbox::create(root, id, &dir.path, &ws, &lock, sandbox, range)?;
    let (fitter, mut link) = match template {
        Some((link, made)) => {
            let range = sandbox.built.id_range;
            let trust = sandbox.built.trust_bundle.clone();
            let fitter = warm::Fitter::new(req, made, range, trust, &ws)?;
            (Some(fitter), Some(link))
        }
        None => (None, None),
    };
    crate::phase("created");
    result.record_limits(&sandbox.built.spec);
    // The container's init was cloned during create and keeps its own,
    // empty, signal mask; runsbx takes its signals from a signalfd now.
    let signals = SignalGuard::block(&wait::SIGNALS)?;
    let sfd = SignalFd::with_flags(
        signals.set(),
        SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK,
    )
    .map_err(|e| RuntimeError::sys("signalfd", e))?;
    let init = container::init_pid(&sandbox.built.container)?;
    let linger = fitter.as_ref().map(|_| Linger::hold(init));
    let proxy = start_proxy(sandbox.built.duties.proxy.take())?;
    // Its thread too starts only now. Until it runs, libcontainer's
    // connection waits in the socket, and a denied syscall of the init
    // waits for its answer (the init makes none before its command).
    let sock_diag = sandbox.built.sock_diag.take();
    let mut seccomp = listener.map(|l| l.serve(id, sock_diag)).transpose()?;
    result.attestation = Some(sandbox.start()?);
    crate::phase("command started");
    // The policy's deadline: the call's --timeout, which the profile may
    // refuse but not lengthen, or its default cut to the profile's.
    let mut deadline = sandbox.built.duties.deadline.unwrap_or(req.timeout());
    result.limits.timeout_ms = deadline.as_millis() as u64;
    // Made before a warm sandbox is handed out, not while its caller waits:
    // the buffer the outputs are read through (its pages touched), and
    // where the limit events will be read.
    let mut read_buf = wait::read_buffer();
    let limit_counters = limit_hits::Counters::of(&sandbox.built.spec);
    let taken;
    let mut taken_at = Instant::now();
    let req = match (hold.as_deref_mut(), &fitter, &mut link) {
        (Some(hold), Some(fitter), Some(link)) => {
            (taken, deadline) = hand_out(hold, fitter, link, &ws, &sandbox.built, result)?;
            // The caller waited from when its request was taken.
            taken_at = Instant::now();
            &taken
        }
        _ => req,
    };
    // A stream's chunks are timed from the command's start.
    let started = Instant::now();
    let writers = LiveWriters::new(req.live);
    let mut out = capture::Capture::new(req.max_output, writers.sink(req, false, started));
    let mut err = capture::Capture::new(req.max_output, writers.sink(req, true, started));
    let end = wait::until_end(
        init,
        deadline,
        &sfd,
        streams,
        &mut out,
        &mut err,
        &mut read_buf,
    )?;
    crate::phase("command ended");

    // Once the sandbox's processes are gone (or the deadline passed: then
    // those still waiting get ENOSYS, and the teardown kills them). The
    // listener's thread answers what is pending while the limit events are
    // read (before the cgroup goes with the container).
    if let Some(s) = seccomp.as_mut() {
        s.stop();
    }
    (result.limits.memory_hit, result.limits.pids_hit) = limit_counters.read();
    if let Some(seen) = seccomp.as_mut().map(seccomp_events::Serving::finish) {
        result.seccomp = Some(seen.denials.report());
        result.hints = Some(seen.connects.hints(proxy.is_some()));
    }
    if req.learn {
        result.learned = Some(LearnReport::of(proxy.as_ref(), req.egress.as_ref()));
    }
    if let (Some(proxy), Some(egress)) = (proxy, &req.egress) {
        result.egress = Some(EgressReport::of(&proxy, egress));
        proxy.shutdown();
    }
    result.record_streams(out, err, tails);
    // Before the result is printed, what went out live is all written.
    writers.finish();
    // The outputs are read once nothing of the sandbox can write them:
    // once its init was reaped (the kernel ends the rest of a pid
    // namespace before that), or else after the teardown. A pool's caller
    // then gets the result without waiting for the teardown.
    let settled = end.reaped();
    result.record_end(end);
    let mut hold = hold;
    let mut deliver = |result: &mut CallResult, tails: &Tails| {
        if !req.outputs.is_empty() {
            result.outputs = workspace::collect_outputs(
                &ws.dir,
                &req.outputs,
                &req.output_dir,
                req.max_output_file,
            );
        }
        if let Some(hold) = hold.take() {
            result.duration_ms = taken_at.elapsed().as_secs_f64() * 1000.0;
            hold.reply(result, tails);
        }
    };
    if settled {
        deliver(result, tails);
    }
    // Its socket is removed once the caller has its result.
    drop(seccomp);
    drop(linger);
    sandbox.remove(settled)?;
    crate::phase("removed");
    if !settled {
        deliver(result, tails);
    }
    // A call's own workspace goes with its mount namespace, as its stage
    // does; a session's is unmounted before the next call may take it.
    if session.is_some() {
        ws.unmount()?;
    } else {
        ws.leave_to_namespace();
        dir.leave_to_namespace();
    }
    drop(lock);
    drop(watchdog);
    crate::phase("done");
    Ok(())
}

/// Hands the warm sandbox out: the first request that fits it gets its
/// files and stdin, and its stub execs the command. The result reports
/// that request, its deadline (returned) and the attestation a cold call
/// of it would have had.
fn hand_out(
    hold: &mut dyn Hold,
    fitter: &warm::Fitter,
    link: &mut stub::Link,
    ws: &Workspace,
    built: &create::Built,
    result: &mut CallResult,
) -> Result<(CallRequest, std::time::Duration)> {
    let (req, fitted, stdin) = take(hold, fitter, ws)?;
    result.command = req.command.clone();
    result.limits.timeout_ms = req.timeout().as_millis() as u64;
    // The request's own attestation, then what the start re-checked.
    let started = result.attestation.take().unwrap_or_default();
    let mut attestation = fitted.attestation;
    attestation.extend(started.into_iter().skip(built.attestation.len()));
    result.attestation = Some(attestation);
    for input in &req.inputs {
        ws.copy_in(input)?;
    }
    if !req.inputs.is_empty() {
        ws.give_to_root_of(&built.spec)?;
    }
    let stdin = match stdin {
        Some(fd) => fd,
        None => plan::open_stdin(&req.stdin)?,
    };
    link.exec(&fitted.args, &fitted.env, stdin.as_fd())?;
    crate::phase("command execed");
    // Told once the command runs: what the owner does then (a thread of
    // its own, say) overlaps the command instead of delaying it.
    hold.taken();
    let deadline = fitted.deadline.unwrap_or(req.timeout());
    result.limits.timeout_ms = deadline.as_millis() as u64;
    Ok((req, deadline))
}

/// The first request `hold` gives that fits the warm sandbox; those that
/// do not are declined (the pool runs them cold).
fn take(
    hold: &mut dyn Hold,
    fitter: &warm::Fitter,
    ws: &Workspace,
) -> Result<(CallRequest, warm::Fitted, Option<OwnedFd>)> {
    crate::phase("ready");
    hold.ready();
    loop {
        let Some((req, stdin)) = hold.next() else {
            return Err(RuntimeError::invalid(
                "the warm sandbox",
                "was let go before a request came",
            ));
        };
        crate::phase("request read");
        match fitter.fit(req, ws) {
            Ok((req, fitted)) => {
                crate::phase("fitted");
                return Ok((req, fitted, stdin));
            }
            Err(why) => hold.decline(why),
        }
    }
}

/// The call's sandbox, built; deleted (whatever is left of it killed) when
/// dropped, unless [`Sandbox::remove`] did it already.
struct Sandbox<'a> {
    built: Built,
    root: &'a StateRoot,
    id: &'a str,
    removed: bool,
}

impl<'a> Sandbox<'a> {
    /// Hardens `spec` and builds the sandbox, its stdout and stderr on
    /// pipes whose read ends are returned; it serves its proxy itself.
    fn create(
        root: &'a StateRoot,
        id: &'a str,
        dir: &Path,
        ws: &Workspace,
        lock: &IdLock,
        mut plan: plan::SandboxPlan,
        id_range: Option<runsbx_policy::IdRange>,
    ) -> Result<(Self, [Option<OwnedFd>; 2])> {
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let stub = plan.stub.take();
        let source = crate::state::bundle::Bundle {
            dir: dir.to_owned(),
            spec: plan.spec,
            rootfs: plan.rootfs,
        };
        let req = create::Request {
            opts: &create::CreateOptions::default(),
            detach: false,
            policy: &plan.policy,
            overrides: Some(&plan.overrides),
            stdio: Stdio::Given {
                stdin: plan.stdin,
                stdout: out_w,
                stderr: err_w,
            },
            workspace: Some(ws),
            seccomp_listener: plan.seccomp_listener.as_deref(),
            supervision: Supervision::Caller,
            id_range,
            stub: stub.as_ref().map(|(s, _)| s.clone()),
            secrets: &plan.secrets,
        };
        let built = create::build_or_clean(root, id, &source, req, lock)?;
        // The init holds its own copies of the stub's fds now.
        drop(stub);
        let sandbox = Self {
            built,
            root,
            id,
            removed: false,
        };
        Ok((sandbox, [Some(out_r), Some(err_r)]))
    }

    /// Starts the command, held to the network promise; returns the
    /// attestation, the network's check included.
    fn start(&mut self) -> Result<Vec<runsbx_policy::Layer>> {
        let mut attestation = self.built.attestation.clone();
        let id = self.id;
        attestation.extend(network::start_checked(
            &mut self.built.container,
            self.built.network_checked.as_deref(),
            |c| c.start().map_err(|e| container::op_err("start", id, e)),
        )?);
        Ok(attestation)
    }

    /// Removes the sandbox; `reaped`: its init was reaped (the call saw
    /// it end), so none of its processes is left.
    fn remove(mut self, reaped: bool) -> Result<()> {
        self.removed = true;
        if !reaped {
            return remove_container(self.root, self.id);
        }
        match container::load(self.root, self.id) {
            Ok(mut c) => teardown::destroy_reaped(self.root, &mut c),
            Err(RuntimeError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        if !self.removed {
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

/// A warm sandbox's mount and network namespaces, held open by runsbx
/// until its caller has the result. The init is the last process in them:
/// without this, its exit would unmount the sandbox's whole mount tree
/// (waiting for an RCU grace period) before the kernel reports the exit,
/// while the caller waits for its reply. Dropped before the teardown, which
/// then pays for it. Best effort: a namespace that cannot be opened is
/// simply torn down at the exit, as a cold call's is.
struct Linger {
    _namespaces: Vec<File>,
}

impl Linger {
    fn hold(init: nix::unistd::Pid) -> Self {
        let open = |ns: &str| File::open(format!("/proc/{init}/ns/{ns}")).ok();
        Self {
            _namespaces: ["mnt", "net"].into_iter().filter_map(open).collect(),
        }
    }
}

/// The directory of a call's own files (its workspace mount point, its
/// seccomp listener's socket), removed when dropped unless it was left to
/// the call's mount namespace.
struct CallDir {
    path: PathBuf,
    left: bool,
}

impl CallDir {
    /// Made in a tmpfs over `<root>/@calls` that only the call's private
    /// mount namespace sees: nothing of it is written to the state root's
    /// filesystem (a disk, where /run is not a tmpfs), and it goes with the
    /// namespace even if runsbx and its watchdog are killed.
    fn create(root: &StateRoot, id: &str) -> Result<Self> {
        let calls = root.path().join("@calls");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&calls)
            .map_err(|e| RuntimeError::io(format!("create {calls:?}"), e))?;
        mount(
            Some("runsbx-calls"),
            &calls,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("mode=0700,size=1m"),
        )
        .map_err(|e| {
            RuntimeError::sys(format!("mount the call's private tmpfs on {calls:?}"), e)
        })?;
        let dir = calls.join(id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| RuntimeError::io(format!("create {dir:?}"), e))?;
        Ok(Self {
            path: dir,
            left: false,
        })
    }

    /// Left with the workspace still mounted in it, to go with the
    /// namespace as its tmpfs does: its removal would stop at that mount
    /// point (`remove_tree` never crosses one).
    fn leave_to_namespace(mut self) {
        self.left = true;
    }
}

impl Drop for CallDir {
    fn drop(&mut self) {
        if self.left {
            return;
        }
        // A session's storage is unmounted from it already; if it was not,
        // its files must not be deleted through it.
        let _ = crate::sys::beneath::remove_tree(&self.path);
    }
}

/// The egress proxy, serving the socket made inside the sandbox's network
/// namespace (its only way out); its thread starts only now, after every
/// fork.
fn start_proxy(
    proxy: Option<(std::net::TcpListener, runsbx_proxy::ProxyConfig)>,
) -> Result<Option<runsbx_proxy::ProxyHandle>> {
    let Some((listener, config)) = proxy else {
        return Ok(None);
    };
    runsbx_proxy::spawn(listener, config)
        .map(Some)
        .map_err(|e| RuntimeError::invalid("start the egress proxy", e.to_string()))
}

/// The threads that write the command's output out as it comes (see
/// [`capture::Background`], each started with its first bytes): runsbx's
/// stdout, and its stderr for echoed human output.
struct LiveWriters {
    stdout: Option<capture::Background>,
    stderr: Option<capture::Background>,
}

impl LiveWriters {
    fn new(live: LiveOutput) -> Self {
        use capture::Background;
        let stdout = || Some(Background::new(std::io::stdout(), "runsbx-stdout"));
        match live {
            LiveOutput::Quiet => Self {
                stdout: None,
                stderr: None,
            },
            LiveOutput::Echo => Self {
                stdout: stdout(),
                stderr: Some(Background::new(std::io::stderr(), "runsbx-stderr")),
            },
            LiveOutput::Stream => Self {
                stdout: stdout(),
                stderr: None,
            },
        }
    }

    /// Where the command's stdout (or stderr) goes as it comes; a
    /// stream's times count from `started`, when the command started.
    fn sink(
        &self,
        req: &CallRequest,
        stderr: bool,
        started: Instant,
    ) -> Option<Box<dyn capture::Live>> {
        use capture::{Echo, JsonLines};
        let kind = if stderr { "stderr" } else { "stdout" };
        match req.live {
            LiveOutput::Quiet => None,
            LiveOutput::Echo => {
                let to = if stderr { &self.stderr } else { &self.stdout };
                Some(Box::new(Echo(to.as_ref()?.writer())))
            }
            // Both streams as lines on runsbx's stdout.
            LiveOutput::Stream => Some(Box::new(JsonLines::new(
                kind,
                started,
                self.stdout.as_ref()?.writer(),
            ))),
        }
    }

    /// Waits until everything is written. A writer whose thread could not
    /// be started is said once, as a warning: the call still ends and is
    /// torn down as usual, and its result keeps what the command printed.
    fn finish(self) {
        for w in [self.stdout, self.stderr].into_iter().flatten() {
            if let Err(e) = w.finish() {
                tracing::warn!(
                    "the command's output was not all passed on as it came: \
                     start a thread for it: {e}"
                );
            }
        }
    }
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

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    // The read end stays with runsbx (close-on-exec); libcontainer dups the
    // write end onto the init's fd 1 or 2.
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe2", e))
}
