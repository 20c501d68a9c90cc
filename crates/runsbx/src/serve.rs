//! `runsbx serve`: a warm pool of sandboxes, and tool calls served from it.
//!
//! The pool keeps `--size` sandboxes built from one template (the image,
//! limits, profile and egress given to `serve`), each in a worker process
//! of its own (serve/worker.rs) whose sandbox waits for its command. A
//! request is the argument list of `runsbx call`; one that fits the
//! template runs in a ready sandbox, which is then torn down and replaced
//! in the background (never reused); any other runs cold, as `runsbx call`
//! itself. Either way the reply is the call's JSON result.
//!
//! The protocol (docs/pool.md) is JSON Lines, on stdin and stdout or on
//! each connection to `--socket`:
//!
//! ```text
//! -> {"id": 1, "argv": ["--json", "--", "python3", "-c", "pass"], "stdin": null}
//! <- {"id": 1, "exit_code": 0, "result": {"schema": "runsbx.call/v1", ...}, "warm": true}
//! -> {"cancel": 1}      (SIGTERM to that call: it ends `interrupted`)
//! ```
//!
//! The pool ends when stdin closes (or, with `--socket`, on SIGTERM or
//! SIGINT): every ready sandbox is let go and every worker waited for. A
//! SIGKILLed serve leaves its workers to let their sandboxes go when their
//! stdin ends. A template that a cold call refuses (exit 125: an unknown
//! image or session, a policy refusal) ends it before its first sandbox,
//! with that error and code: no retry would make the sandbox.

mod worker;
mod zygote;

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use runsbx_runtime::error::call_exit;
use serde_json::{json, Value};

pub use worker::run as worker;
pub use zygote::run as zygote;

/// Keep sandboxes ready and serve tool calls from them (JSON Lines on
/// stdin/stdout, or on a unix socket); see docs/pool.md
#[derive(Args, Debug)]
pub struct Serve {
    /// How many sandboxes are kept ready (default: 2, or 1 with --session)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub size: Option<u16>,
    /// Serve the connections to this unix socket (made 0600) instead of
    /// stdin and stdout
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Start no sandbox while the host has less memory available than this
    #[arg(long, default_value = "256M")]
    pub min_available: String,
    /// The sandboxes: as `runsbx call` makes them (a request may give its
    /// own deadline)
    #[command(flatten)]
    pub sandbox: crate::call_cmd::SandboxArgs,
}

/// How runsbx is run again: the same binary and global flags.
#[derive(Clone)]
struct Runsbx {
    exe: PathBuf,
    global: Vec<OsString>,
}

impl Runsbx {
    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.global);
        cmd
    }
}

/// A request's reply: a worker's line, or `runsbx call`'s result.
enum Reply {
    Warm(String),
    Cold(Value),
}

/// A worker whose sandbox waits for its command.
struct Worker {
    child: Proc,
    to: File,
    from: BufReader<File>,
}

/// A worker's process, serve's child either way: spawned by serve, or
/// forked by the pool's zygote (serve/zygote.rs).
enum Proc {
    Spawned(Child),
    Forked(nix::unistd::Pid),
}

impl Proc {
    fn id(&self) -> u32 {
        match self {
            Proc::Spawned(child) => child.id(),
            Proc::Forked(pid) => pid.as_raw().unsigned_abs(),
        }
    }

    fn kill(&mut self) {
        match self {
            Proc::Spawned(child) => {
                let _ = child.kill();
            }
            // Not waited for yet, so the pid is still this worker's.
            Proc::Forked(pid) => {
                let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
    }

    /// Waits for the worker to exit (once: afterwards its pid may be
    /// another process's).
    fn wait(self) {
        match self {
            Proc::Spawned(mut child) => {
                let _ = child.wait();
            }
            Proc::Forked(pid) => {
                while let Err(nix::Error::EINTR) = nix::sys::wait::waitpid(pid, None) {}
            }
        }
    }
}

struct State {
    ready: VecDeque<Worker>,
    starting: usize,
    /// Workers tearing their sandbox down (they exit when done).
    ending: usize,
    /// Requests being served (a session's pool makes no sandbox
    /// meanwhile: it would wait for the session, or take it from a cold
    /// call into it).
    serving: usize,
    /// Workers that failed in a row before they were ready.
    failures: u32,
    /// What the last of them said: a failure in the same row that says
    /// it again is not logged again.
    reported: Option<String>,
    /// Whether any sandbox has been ready.
    ever_ready: bool,
    /// Why the pool ended before its first sandbox: the template is
    /// refused (see [`Pool::failed`]).
    refused: Option<String>,
    closing: bool,
}

struct Pool {
    runsbx: Runsbx,
    /// What forks the workers, when serve runs as root (else, or once it
    /// is gone, each is spawned).
    zygote: Option<zygote::Zygote>,
    /// `pool-worker` and the template's call flags.
    worker_args: Vec<String>,
    size: usize,
    /// The pool keeps a session's sandbox (which holds the session).
    session: bool,
    min_available: u64,
    state: Mutex<State>,
    changed: Condvar,
    /// Ends the pool (as the end of stdin or a signal does).
    end: mpsc::Sender<()>,
}

pub fn run(args: Serve, flags: &crate::cli::Global) -> Result<i32> {
    let (root, config) = (flags.root.clone(), flags.config.clone());
    // serve's own settings, and its socket, before anything is started: a
    // bad one is bad input (exit 125, as settings a cold call refuses).
    let settings = check(&args).and_then(|(size, min_available)| {
        let listener = args.socket.as_deref().map(Socket::listen).transpose()?;
        Ok((size, min_available, listener))
    });
    let (size, min_available, listener) = match settings {
        Ok(s) => s,
        Err(e) => {
            eprintln!("runsbx: error: {e:#}");
            return Ok(call_exit::BAD_INPUT);
        }
    };
    // What killed calls and pools left, swept once here rather than by
    // each sandbox's worker (see `run` in runsbx-runtime's call/mod.rs).
    let state = root
        .clone()
        .unwrap_or_else(runsbx_runtime::state::root::default_root);
    runsbx_runtime::call::sweep(&runsbx_runtime::StateRoot::open(&state)?);
    let mut global: Vec<OsString> = Vec::new();
    if let Some(r) = root {
        global.extend(["--root".into(), r.into()]);
    }
    if let Some(c) = config {
        global.extend(["--config".into(), c.into()]);
    }
    // The workers log where and as serve does.
    if let Some(log) = &flags.log {
        global.extend(["--log".into(), log.into()]);
    }
    if let Some(format) = &flags.log_format {
        global.extend(["--log-format".into(), format.into()]);
    }
    if flags.debug {
        global.push("--debug".into());
    }
    let runsbx = Runsbx {
        exe: std::env::current_exe().context("find runsbx's own binary")?,
        global,
    };
    let (end_tx, end_rx) = mpsc::channel::<()>();
    let worker_args = worker_args(&args);
    // Root only (see serve/zygote.rs).
    let zygote = if runsbx_runtime::sys::privilege::can_manage_cgroups() {
        match zygote::Zygote::start(runsbx.command(), &worker_args) {
            Ok(z) => Some(z),
            Err(e) => {
                tracing::warn!("start the pool's zygote (each worker is spawned instead): {e:#}");
                None
            }
        }
    } else {
        None
    };
    let pool = Arc::new(Pool {
        runsbx,
        zygote,
        worker_args,
        size: usize::from(size),
        session: args.sandbox.session.is_some(),
        min_available,
        state: Mutex::new(State {
            ready: VecDeque::new(),
            starting: 0,
            ending: 0,
            serving: 0,
            failures: 0,
            reported: None,
            ever_ready: false,
            refused: None,
            closing: false,
        }),
        changed: Condvar::new(),
        end: end_tx.clone(),
    });
    // The signals that end the pool are taken by one thread; every other
    // thread (and what it spawns: std resets the mask in children) has
    // them blocked.
    let mut signals = nix::sys::signal::SigSet::empty();
    for s in [
        nix::sys::signal::Signal::SIGTERM,
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGHUP,
    ] {
        signals.add(s);
    }
    signals.thread_block()?;
    {
        let end = end_tx.clone();
        std::thread::spawn(move || {
            let _ = signals.wait();
            let _ = end.send(());
        });
    }
    // The first sandboxes are on their way before the first request is
    // read (a request finds them starting, and waits for one).
    if memory_available() >= pool.min_available {
        let mut s = pool.lock();
        s.starting = pool.size;
        drop(s);
        for _ in 0..pool.size {
            let pool = pool.clone();
            std::thread::spawn(move || pool.start_worker());
        }
    }
    {
        let pool = pool.clone();
        std::thread::spawn(move || pool.fill());
    }
    match &listener {
        None => {
            let pool = pool.clone();
            std::thread::spawn(move || {
                let out: Arc<Mutex<Box<dyn Write + Send>>> =
                    Arc::new(Mutex::new(Box::new(std::io::stdout())));
                serve_lines(&pool, std::io::stdin().lock(), out);
                // The owner is gone (or done): so is the pool.
                let _ = end_tx.send(());
            });
        }
        Some(socket) => {
            let listener = socket.listener.try_clone().context("share the socket")?;
            let pool = pool.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let pool = pool.clone();
                    std::thread::spawn(move || serve_connection(&pool, conn));
                }
            });
        }
    }
    let _ = end_rx.recv();
    pool.close();
    drop(listener);
    let refused = pool.lock().refused.take();
    match refused {
        Some(why) => {
            eprintln!("runsbx: error: {why}");
            Ok(call_exit::BAD_INPUT)
        }
        None => Ok(0),
    }
}

/// The worker's command line: the template as `call` flags.
fn worker_args(args: &Serve) -> Vec<String> {
    let mut a = vec!["pool-worker".to_owned(), "--json".to_owned()];
    a.extend(args.sandbox.to_flags());
    // The template's command: a placeholder the image must have (a
    // request's own command replaces it).
    a.extend(["--".to_owned(), "true".to_owned()]);
    a
}

/// serve's own settings: the pool's size and `--min-available` in bytes.
fn check(args: &Serve) -> Result<(u16, u64)> {
    let min_available = runsbx_policy::profile::parse_size(&args.min_available)
        .map_err(|e| anyhow::anyhow!("--min-available {:?}: {e}", args.min_available))?;
    if let Some(t) = &args.sandbox.timeout {
        crate::call_cmd::parse_duration(t)?;
    }
    let size = match (args.size, &args.sandbox.session) {
        (Some(n), Some(_)) if n > 1 => anyhow::bail!(
            "--size {n} with --session: a session's calls run one at a time, so its pool \
             holds one sandbox (leave --size out)"
        ),
        (Some(n), _) => n,
        (None, Some(_)) => 1,
        (None, None) => 2,
    };
    Ok((size, min_available))
}

/// The socket serve listens on, removed when dropped if it is still the
/// one serve made.
struct Socket {
    listener: UnixListener,
    path: PathBuf,
    /// Its device and inode, to tell it from what may replace it.
    made: (u64, u64),
}

impl Socket {
    /// Made 0600 (only its owner may run calls through it). Only a stale
    /// socket (nobody listening) is replaced: anything else at the path
    /// is someone's file, and is refused, never removed.
    fn listen(path: &Path) -> Result<Self> {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => {
                if UnixStream::connect(path).is_ok() {
                    anyhow::bail!(
                        "--socket {path:?}: another runsbx serve listens there; stop it or give \
                         another path"
                    );
                }
                std::fs::remove_file(path)
                    .with_context(|| format!("--socket {path:?}: remove the stale socket"))?;
            }
            Ok(_) => anyhow::bail!(
                "--socket {path:?}: exists and is not a socket; give a path where nothing is \
                 (runsbx serve replaces only a socket nobody listens on)"
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("--socket {path:?}: {e}"),
        }
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
        let listener = UnixListener::bind(path);
        nix::sys::stat::umask(old);
        let listener = listener.with_context(|| format!("--socket {path:?}: listen"))?;
        let m = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(path);
                anyhow::bail!("--socket {path:?}: stat the socket: {e}");
            }
        };
        // Removed when dropped, from here on.
        let socket = Self {
            listener,
            path: path.to_owned(),
            made: (m.dev(), m.ino()),
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("--socket {path:?}: make it 0600"))?;
        Ok(socket)
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        use std::os::unix::fs::MetadataExt;
        let ours =
            std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.made);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

fn serve_connection(pool: &Arc<Pool>, conn: UnixStream) {
    let Ok(write) = conn.try_clone() else {
        return;
    };
    let out: Arc<Mutex<Box<dyn Write + Send>>> = Arc::new(Mutex::new(Box::new(write)));
    serve_lines(pool, BufReader::new(conn), out);
}

/// Requests one connection may have in flight (each in a thread, and when
/// it runs cold a process); further lines wait.
const MAX_IN_FLIGHT: usize = 64;

/// A connection's requests, by id: a `{"cancel": ID}` line sends SIGTERM
/// to the process running one (the call kills its sandbox and reports
/// `interrupted`, as `runsbx call` does on SIGTERM); one that has no
/// process yet gets it as soon as it has one.
type Running = Arc<Mutex<HashMap<String, Run>>>;

#[derive(Clone, Copy)]
enum Run {
    /// Waiting for a sandbox.
    Pending,
    /// Cancelled: every process that takes it up gets SIGTERM (a worker
    /// that got it is never handed out again).
    Cancelled,
    /// Run by this process (a worker, or a cold `runsbx call`).
    By(u32),
}

fn cancel(running: &Running, key: &str) {
    let mut running = lock(running);
    match running.get(key).copied() {
        Some(Run::Pending) => {
            running.insert(key.to_owned(), Run::Cancelled);
        }
        Some(Run::By(pid)) => {
            terminate(pid);
            running.insert(key.to_owned(), Run::Cancelled);
        }
        Some(Run::Cancelled) | None => {}
    }
}

fn terminate(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
}

/// A request's entry in [`Running`], removed when it is answered.
struct RunningAs<'a> {
    running: &'a Running,
    key: String,
}

impl<'a> RunningAs<'a> {
    fn pending(running: &'a Running, key: &str) -> Self {
        lock(running).insert(key.to_owned(), Run::Pending);
        Self {
            running,
            key: key.to_owned(),
        }
    }

    /// The entry [`Pool::send_at_once`] made.
    fn recorded(running: &'a Running, key: &str) -> Self {
        Self {
            running,
            key: key.to_owned(),
        }
    }

    fn cancelled(&self) -> bool {
        matches!(lock(self.running).get(&self.key), Some(Run::Cancelled))
    }

    /// The request runs in process `pid` (again Pending when `None`).
    fn run_by(&self, pid: Option<u32>) {
        let mut running = lock(self.running);
        let cancelled = matches!(running.get(&self.key), Some(Run::Cancelled));
        match pid {
            Some(pid) if cancelled => terminate(pid),
            Some(pid) => {
                running.insert(self.key.clone(), Run::By(pid));
            }
            None if cancelled => {}
            None => {
                running.insert(self.key.clone(), Run::Pending);
            }
        }
    }
}

impl Drop for RunningAs<'_> {
    fn drop(&mut self) {
        lock(self.running).remove(&self.key);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves each request line in a thread of its own; returns at EOF once
/// every request has its reply.
fn serve_lines(pool: &Arc<Pool>, input: impl BufRead, out: Arc<Mutex<Box<dyn Write + Send>>>) {
    let running: Running = Arc::default();
    let mut lanes = Lanes::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let msg: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(e) => {
                let error = format!("the request is not JSON: {e}");
                write_line(&out, &json!({"id": null, "error": error}).to_string());
                continue;
            }
        };
        if let Some(id) = msg.get("cancel") {
            cancel(&running, &id.to_string());
            continue;
        }
        // Counted before it is handed on, so that the pool, once it is
        // closing, ends only after answering it; a request read once it
        // is closing is not served.
        if !pool.begin() {
            break;
        }
        // A ready sandbox gets the request from this thread: waking a
        // request thread first would delay its command by that wake-up.
        // Not past the requests in flight: this one would run meanwhile.
        let sent = if lanes.has_room() {
            pool.send_at_once(&msg, &running)
        } else {
            None
        };
        let pool = pool.clone();
        let out = out.clone();
        let running = running.clone();
        lanes.run(Box::new(move || {
            pool.serve(&msg, &running, sent, &|reply| write_line(&out, reply));
        }));
    }
    lanes.finish();
}

type Job = Box<dyn FnOnce() + Send>;

/// A connection's request threads. Each serves one request at a time and
/// then waits for the next: starting a thread costs about a tenth of a
/// millisecond, which a warm call would otherwise wait for.
struct Lanes {
    jobs: mpsc::Sender<Job>,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    counts: Arc<(Mutex<LaneCounts>, Condvar)>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct LaneCounts {
    /// Threads waiting for a request that no request has been given to.
    idle: usize,
    /// Requests given out and not yet answered.
    busy: usize,
}

impl Lanes {
    fn new() -> Self {
        let (jobs, queue) = mpsc::channel();
        Self {
            jobs,
            queue: Arc::new(Mutex::new(queue)),
            counts: Arc::default(),
            threads: Vec::new(),
        }
    }

    /// Whether [`Lanes::run`] would start a job without waiting (only the
    /// connection's reading thread gives jobs: it stays so until then).
    fn has_room(&self) -> bool {
        lock(&self.counts.0).busy < MAX_IN_FLIGHT
    }

    /// Gives `job` to a waiting thread, or to a new one; with
    /// [`MAX_IN_FLIGHT`] requests unanswered, first waits for one to end.
    fn run(&mut self, job: Job) {
        let (counts, ended) = &*self.counts;
        let mut c = lock(counts);
        while c.busy >= MAX_IN_FLIGHT {
            c = ended.wait(c).unwrap_or_else(|e| e.into_inner());
        }
        c.busy += 1;
        let waiting = c.idle > 0;
        if waiting {
            // That thread is this job's: no other job is given to it.
            c.idle -= 1;
        }
        drop(c);
        if !waiting {
            let queue = self.queue.clone();
            let counts = self.counts.clone();
            self.threads
                .push(std::thread::spawn(move || Self::lane(&queue, &counts)));
        }
        let _ = self.jobs.send(job);
    }

    fn lane(queue: &Mutex<mpsc::Receiver<Job>>, counts: &(Mutex<LaneCounts>, Condvar)) {
        loop {
            let job = lock(queue).recv();
            let Ok(job) = job else { return };
            // A request that panics is its own loss, not the connection's.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let mut c = lock(&counts.0);
            c.busy -= 1;
            c.idle += 1;
            drop(c);
            counts.1.notify_all();
        }
    }

    /// Waits until every request has its reply.
    fn finish(self) {
        drop(self.jobs);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A request's `argv`, if it is an array of strings; else what is wrong
/// with the request.
fn request_argv(msg: &Value) -> Result<&[Value], &'static str> {
    match msg.get("argv") {
        _ if !msg.is_object() => Err(
            "the request is not a JSON object: one is {\"id\": 1, \"argv\": [\"--\", \"true\"]}",
        ),
        None => Err("the request has no \"argv\" (an array of strings: runsbx call's arguments)"),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => Ok(a),
        Some(_) => {
            Err("the request's \"argv\" is not an array of strings (runsbx call's arguments)")
        }
    }
}

/// Gives a worker its request, in one write: the pipe is unbuffered, and
/// the worker would wake for each piece serde writes.
fn ask(w: &mut Worker, argv: &[Value], stdin: &Value) -> std::io::Result<()> {
    let mut request = json!({"argv": argv, "stdin": stdin}).to_string();
    request.push('\n');
    w.to.write_all(request.as_bytes())
}

/// One write, newline included: the reader wakes once, for a whole line.
fn write_line(out: &Mutex<Box<dyn Write + Send>>, line: &str) {
    let line = format!("{line}\n");
    let mut out = lock(out);
    let _ = out.write_all(line.as_bytes());
    let _ = out.flush();
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a request as being served; false once the pool is closing.
    fn begin(&self) -> bool {
        let mut s = self.lock();
        if s.closing {
            return false;
        }
        s.serving += 1;
        true
    }

    /// A request given to a ready worker at once, if one is ready and the
    /// request has its arguments: it is recorded as run by that worker
    /// (for a cancel) when this returns.
    fn send_at_once(&self, msg: &Value, running: &Running) -> Option<Worker> {
        let argv = request_argv(msg).ok()?;
        let stdin = msg.get("stdin").unwrap_or(&Value::Null);
        let mut w = {
            let mut s = self.lock();
            if s.closing {
                return None;
            }
            s.ready.pop_front()?
        };
        self.changed.notify_all();
        let key = msg.get("id").unwrap_or(&Value::Null).to_string();
        lock(running).insert(key, Run::By(w.child.id()));
        // A worker that cannot be written to is dead: `warm` finds no
        // reply, and lets it go.
        let _ = ask(&mut w, argv, stdin);
        Some(w)
    }

    /// One request (counted by [`Pool::begin`]) to its reply, which goes
    /// to `send` before the used worker is let go and the pool told: on a
    /// small machine that work would take the cores the caller needs to
    /// read its reply. `sent`: the worker [`Pool::send_at_once`] gave the
    /// request to.
    fn serve(
        self: &Arc<Self>,
        msg: &Value,
        running: &Running,
        sent: Option<Worker>,
        send: &dyn Fn(&str),
    ) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let key = id.to_string();
        let argv = match request_argv(msg) {
            Ok(argv) => argv,
            Err(why) => {
                send(&json!({"id": id, "error": why}).to_string());
                self.lock().serving -= 1;
                self.changed.notify_all();
                return;
            }
        };
        let stdin = msg.get("stdin").cloned().unwrap_or(Value::Null);
        let run = match sent {
            Some(_) => RunningAs::recorded(running, &key),
            None => RunningAs::pending(running, &key),
        };
        let (reply, used) = match self.warm(argv, &stdin, &run, sent) {
            Some((line, used)) => (Reply::Warm(line), Some(used)),
            None => (Reply::Cold(self.cold(argv, &stdin, &run)), None),
        };
        drop(run);
        {
            let mut s = self.lock();
            s.serving -= 1;
            // A session's next sandbox is started now, before the reply
            // goes out, so that the next request waits for it.
            let wanted = s.ready.len() + s.starting < self.size;
            if self.session && s.serving == 0 && wanted && s.failures == 0 && !s.closing {
                s.starting += 1;
                let pool = self.clone();
                std::thread::spawn(move || pool.start_worker());
            }
        }
        let id = serde_json::to_string(&id).unwrap_or_else(|_| "null".to_owned());
        send(&match reply {
            // `{"result": ..., "exit_code": N}` from the worker, as it is.
            Reply::Warm(line) => format!(
                "{{\"id\":{id},\"warm\":true,{}",
                line.trim_end()[1..].trim_start()
            ),
            Reply::Cold(mut v) => {
                v["warm"] = Value::Bool(false);
                format!("{{\"id\":{id},{}", v.to_string()[1..].trim_start())
            }
        });
        // The sandbox ran a command (or failed to): never again.
        if let Some(used) = used {
            self.reap(used);
        }
        self.changed.notify_all();
    }

    /// The request in a ready sandbox (`sent`: the worker that has it
    /// already), with the worker that ran it (for the caller to let go);
    /// `None` if none can take it.
    fn warm(
        self: &Arc<Self>,
        argv: &[Value],
        stdin: &Value,
        run: &RunningAs<'_>,
        sent: Option<Worker>,
    ) -> Option<(String, Worker)> {
        let (mut w, asked) = match sent {
            Some(w) => (w, true),
            None => {
                let mut w = self.take()?;
                run.run_by(Some(w.child.id()));
                let asked = ask(&mut w, argv, stdin).is_ok();
                (w, asked)
            }
        };
        let mut line = String::new();
        let answered = asked && matches!(w.from.read_line(&mut line), Ok(n) if n > 0);
        // The worker is done with the request: a late cancel must not
        // reach it while it tears its sandbox down.
        let cancelled = run.cancelled();
        run.run_by(None);
        if !answered {
            // The worker died: its watchdog removes its sandbox.
            self.reap(w);
            return None;
        }
        if line.starts_with("{\"declined\"") {
            let why: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            tracing::debug!("run cold: {}", why["declined"].as_str().unwrap_or_default());
            if self.session || cancelled {
                // The warm sandbox holds the session (the cold call would
                // wait for it forever), or it got the request's SIGTERM:
                // it goes, and another is made.
                self.reap(w);
            } else {
                self.give_back(w);
            }
            return None;
        }
        if !line.starts_with("{\"result\"") {
            // It failed to run it: never again.
            self.reap(w);
            return None;
        }
        // The worker's own reply, passed on as it is (one JSON object).
        Some((line, w))
    }

    /// The request as `runsbx call` of its arguments.
    fn cold(&self, argv: &[Value], stdin: &Value, run: &RunningAs<'_>) -> Value {
        let args: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        let data = match stdin.as_str() {
            Some(b64) => {
                use base64::Engine;
                match base64::engine::general_purpose::STANDARD.decode(b64) {
                    Ok(d) => Some(d),
                    Err(e) => return json!({"error": format!("\"stdin\" is not base64: {e}")}),
                }
            }
            None => None,
        };
        let mut cmd = self.runsbx.command();
        cmd.arg("call")
            .args(&args)
            .stdin(if data.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The call ends with the pool, as a warm one does: this thread
        // waits for it until it ends, so it dies first only with `runsbx
        // serve`, and the call then gets SIGTERM (a cancel) rather than
        // running on to its deadline for nobody.
        let pool = nix::unistd::getpid();
        // SAFETY: between fork and exec the closure only makes two system
        // calls, which allocate nothing and take no lock.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
                if nix::unistd::getppid() != pool {
                    // The pool died before the signal was armed.
                    return Err(std::io::Error::from(nix::errno::Errno::ESRCH));
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return json!({"error": format!("run runsbx call: {e}")}),
        };
        run.run_by(Some(child.id()));
        if let (Some(mut pipe), Some(data)) = (child.stdin.take(), data) {
            std::thread::spawn(move || {
                let _ = pipe.write_all(&data);
            });
        }
        let out = match child.wait_with_output() {
            Ok(o) => o,
            Err(e) => return json!({"error": format!("wait for runsbx call: {e}")}),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let result = text
            .lines()
            .last()
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null);
        json!({
            "exit_code": out.status.code(),
            "result": result,
            "stderr": String::from_utf8_lossy(&out.stderr),
            "warm": false,
        })
    }

    /// A ready worker, waiting while one is being made; `None` when none
    /// will be (the pool is closing, or cannot make one).
    fn take(&self) -> Option<Worker> {
        let mut s = self.lock();
        loop {
            if s.closing {
                return None;
            }
            if let Some(w) = s.ready.pop_front() {
                drop(s);
                self.changed.notify_all();
                return Some(w);
            }
            // None is coming: a session's pool makes its next one once
            // this request is served.
            if s.starting == 0 && (s.failures > 0 || self.session) {
                return None;
            }
            let (next, timeout) = self
                .changed
                .wait_timeout(s, Duration::from_secs(30))
                .unwrap_or_else(|e| e.into_inner());
            s = next;
            if timeout.timed_out() && s.ready.is_empty() {
                return None;
            }
        }
    }

    fn give_back(self: &Arc<Self>, w: Worker) {
        let mut s = self.lock();
        if s.closing {
            drop(s);
            self.reap(w);
            return;
        }
        s.ready.push_front(w);
        drop(s);
        self.changed.notify_all();
    }

    /// Lets a worker go (closing its stdin lets an unused sandbox go) and
    /// waits for it in the background.
    fn reap(self: &Arc<Self>, w: Worker) {
        let Worker { child, to, from } = w;
        drop(to);
        drop(from);
        self.lock().ending += 1;
        let pool = self.clone();
        std::thread::spawn(move || {
            child.wait();
            pool.lock().ending -= 1;
            pool.changed.notify_all();
        });
    }

    /// Keeps `size` sandboxes ready or starting, while memory allows.
    fn fill(self: Arc<Self>) {
        let mut s = self.lock();
        // After a failure, the next try waits (1 s more per failure in a
        // row, up to 30 s).
        let mut retry_at = Instant::now();
        loop {
            if s.closing {
                return;
            }
            let now = Instant::now();
            // While a request is served and a sandbox is still ready for
            // the next, the next sandbox waits: on a small machine its build
            // would take the cores from the request's own processes. A long
            // request keeps the pool one short meanwhile, never empty: once
            // the last ready sandbox is taken, the builds start.
            let paused = s.serving > 0 && (self.session || !s.ready.is_empty());
            let wanted = s.ready.len() + s.starting < self.size && !paused;
            let wait = if !wanted || memory_available() < self.min_available {
                Duration::from_secs(1)
            } else if s.failures > 0 && now < retry_at {
                retry_at - now
            } else {
                retry_at = now + Duration::from_secs(u64::from(s.failures.min(29) + 1));
                s.starting += 1;
                drop(s);
                let pool = self.clone();
                std::thread::spawn(move || pool.start_worker());
                s = self.lock();
                continue;
            };
            s = self
                .changed
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// A new worker process: forked by the zygote, or spawned where there
    /// is none (or it failed: it is not asked again).
    fn new_worker(&self) -> std::io::Result<(Proc, Option<File>, Option<File>)> {
        match self.zygote.as_ref().and_then(zygote::Zygote::fork_worker) {
            Some(Ok(f)) => return Ok((Proc::Forked(f.pid), Some(f.to), Some(f.from))),
            Some(Err(e)) => {
                tracing::warn!("the pool's zygote could not fork a worker (spawned instead): {e}")
            }
            None => {}
        }
        let mut child = self
            .runsbx
            .command()
            .args(&self.worker_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let to = child
            .stdin
            .take()
            .map(|p| File::from(std::os::fd::OwnedFd::from(p)));
        let from = child
            .stdout
            .take()
            .map(|p| File::from(std::os::fd::OwnedFd::from(p)));
        Ok((Proc::Spawned(child), to, from))
    }

    /// Starts a worker and waits until its sandbox is ready (or failed).
    fn start_worker(self: Arc<Self>) {
        let ready = match self.new_worker() {
            Ok((mut child, to, from)) => match (to, from.map(BufReader::new)) {
                (Some(to), Some(mut from)) => {
                    let mut line = String::new();
                    let _ = from.read_line(&mut line);
                    let said: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    if said.get("ready").is_some() {
                        Ok(Worker { child, to, from })
                    } else {
                        child.wait();
                        Err(Failed::from_worker(&said))
                    }
                }
                _ => {
                    child.kill();
                    child.wait();
                    Err(Failed::other("the worker has no pipes"))
                }
            },
            Err(e) => Err(Failed::other(&format!("start a pool worker: {e}"))),
        };
        let mut s = self.lock();
        s.starting -= 1;
        match ready {
            Ok(w) if !s.closing => {
                s.failures = 0;
                s.reported = None;
                s.ever_ready = true;
                s.ready.push_back(w);
            }
            Ok(w) => {
                drop(s);
                self.reap(w);
                s = self.lock();
            }
            Err(failed) => {
                s.failures += 1;
                self.failed(&mut s, failed);
            }
        }
        drop(s);
        self.changed.notify_all();
    }

    /// A worker's sandbox could not be made. Before any was, a refusal
    /// (a cold call's exit 125: an unknown image or session, a policy
    /// refusal, no host id range left) ends the pool with it: every
    /// sandbox of the pool is made the same way, and a person (or the
    /// client) must change what it was given. Anything else is logged
    /// once per row of failures (again if it changes), and retried.
    fn failed(&self, s: &mut State, failed: Failed) {
        if s.refused.is_some() {
            // The pool is ending with the reason the others gave.
            return;
        }
        if !s.ever_ready && failed.code == Some(call_exit::BAD_INPUT) {
            s.refused = Some(failed.message);
            s.closing = true;
            let _ = self.end.send(());
            return;
        }
        if s.reported.as_deref() != Some(failed.message.as_str()) {
            tracing::error!("a pool sandbox could not be made: {}", failed.message);
            s.reported = Some(failed.message);
        }
    }

    /// Ends the pool: no new sandbox, every ready one let go, every
    /// request answered and every worker waited for.
    fn close(self: &Arc<Self>) {
        let ready: Vec<Worker> = {
            let mut s = self.lock();
            s.closing = true;
            s.ready.drain(..).collect()
        };
        self.changed.notify_all();
        for w in ready {
            self.reap(w);
        }
        let mut s = self.lock();
        while s.starting > 0 || s.ending > 0 || s.serving > 0 {
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(s);
        if let Some(z) = &self.zygote {
            let _ = z.end();
        }
    }
}

/// Why a worker's sandbox could not be made.
struct Failed {
    message: String,
    /// The cold call's exit code for it (README.md, "Tool calls").
    code: Option<i32>,
}

impl Failed {
    /// From the worker's `{"failed": RESULT, "exit_code": N}`.
    fn from_worker(said: &Value) -> Self {
        let message = said
            .pointer("/failed/error/message")
            .and_then(Value::as_str)
            .unwrap_or("the worker ended before its sandbox was ready");
        Self {
            message: message.to_owned(),
            code: said
                .get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok()),
        }
    }

    fn other(message: &str) -> Self {
        Self {
            message: message.to_owned(),
            code: None,
        }
    }
}

/// MemAvailable from /proc/meminfo, in bytes (unknown: plenty).
fn memory_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb * 1024)
}
