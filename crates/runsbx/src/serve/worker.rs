//! One warm sandbox, as a process of its own (`runsbx pool-worker`, hidden):
//! it builds the sandbox from the pool's template with the cold call's
//! code, says it is ready, takes requests from its stdin until one fits,
//! writes that call's result to its stdout, and tears the sandbox down.
//!
//! A process per sandbox, because building one forks (libcontainer's
//! intermediate and init processes, the call's watchdog) and forking is
//! only safe from a single-threaded process; the pool's owner has threads.
//! If the owner dies, the worker's stdin ends: the sandbox is let go
//! unused, or the call running in it is ended (see [`end_if_the_pool_goes`]).
//! If the worker itself is killed, its watchdog removes it.

use std::io::{BufRead, Read, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use base64::Engine;
use clap::{CommandFactory, FromArgMatches, Parser};
use runsbx_runtime::call::{self, CallRequest, CallResult, Hold, StdinFrom, Tails};
use runsbx_runtime::StateRoot;
use serde_json::json;

use crate::call_cmd::{self, Call};

/// A request's `call` arguments, parsed as `runsbx call` parses them.
#[derive(Parser, Debug)]
#[command(name = "call", no_binary_name = true)]
struct CallLine {
    #[command(flatten)]
    call: Call,
}

/// The worker's side of the protocol with the pool (JSON Lines).
struct Control {
    config: Option<PathBuf>,
    /// The request parser, built before the sandbox is ready: clap builds
    /// a command's argument table on first use, which the caller would
    /// otherwise wait for (two thirds of a request's parse in a profile of
    /// the worker).
    parser: clap::Command,
    /// Told when the request is taken (see [`end_if_the_pool_goes`]).
    pool_watch: Option<std::sync::mpsc::Sender<()>>,
    taken: bool,
    replied: bool,
    /// The sandbox runs in a session, whose next call waits for this
    /// one's teardown.
    session: bool,
}

/// How long a used sandbox waits after its reply before it is torn down.
/// The reply still has to reach the caller (the pool's thread, then the
/// caller's own threads, a fraction of a millisecond); on a small
/// machine, the teardown and the pool's next build starting together
/// would take both cores from it. Measured on 2 cores: a warm call's
/// median from the Python client 2.7 ms with the teardown at once, 2.2 ms
/// with it 2 ms later. Nothing waits for a used sandbox but a session's
/// next call, which is not held back.
const REPLY_HEAD_START: std::time::Duration = std::time::Duration::from_millis(2);

/// Set once the call's result is being written: from then on, the end of
/// the pool's pipe is the pool letting this worker go.
static REPLYING: AtomicBool = AtomicBool::new(false);

/// Once a request is taken, the pool writes nothing more to its worker; it
/// closes the pipe only after the reply. The end of stdin before that
/// means the pool's owner died (SIGKILLed, say) and nobody waits for the
/// result: the call is ended as a cancel ends it (SIGTERM to this process,
/// which the call takes from its signalfd) and the sandbox torn down,
/// rather than left to run until its deadline.
///
/// The thread is started once the sandbox is ready, before any caller
/// waits (a thread costs a tenth of a millisecond to start; before the
/// sandbox is built, the worker must be single-threaded: an unprivileged
/// one unshares its user namespace then), with every signal
/// blocked from its first instruction (a thread inherits its creator's
/// mask), so that the SIGTERM can only reach the call's signalfd. It
/// reads stdin only once told that the request is taken ([`Hold::taken`]:
/// stdin is not read for another request any more); a worker that ends
/// without a request drops the sender, and the thread returns.
fn end_if_the_pool_goes() -> Result<std::sync::mpsc::Sender<()>> {
    use nix::sys::signal::{SigSet, SigmaskHow};
    let (taken, told) = std::sync::mpsc::channel::<()>();
    let before = SigSet::all().thread_swap_mask(SigmaskHow::SIG_BLOCK)?;
    let spawned = std::thread::Builder::new().spawn(move || {
        if told.recv().is_err() {
            return;
        }
        // The pool sends nothing more: whatever comes, wait for the end.
        let mut rest = Vec::new();
        let _ = std::io::stdin().lock().read_to_end(&mut rest);
        if !REPLYING.load(Ordering::SeqCst) {
            let _ =
                nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM);
        }
    });
    before.thread_set_mask()?;
    spawned?;
    Ok(taken)
}

impl Control {
    fn say(&self, message: &serde_json::Value) {
        self.say_line(&message.to_string());
    }

    fn say_line(&self, line: &str) {
        let mut out = std::io::stdout().lock();
        // One write, newline included: the pool reads whole lines and
        // would otherwise wake for each piece. A pool that is gone reads
        // nothing; the sandbox goes anyway.
        let _ = out.write_all(format!("{line}\n").as_bytes());
        let _ = out.flush();
    }

    /// `{"result": RESULT, "exit_code": N}` (or `"failed"`), its first key
    /// first: the pool tells the kinds of line apart by it.
    fn say_result(&self, key: &str, result: &CallResult) {
        let json = serde_json::to_string(result).unwrap_or_else(|_| "null".to_owned());
        self.say_line(&format!(
            "{{\"{key}\":{json},\"exit_code\":{}}}",
            result.exit_code()
        ));
    }

    /// Parses one request line into a call request and its stdin.
    fn parse(&mut self, line: &str) -> Result<(CallRequest, Option<OwnedFd>)> {
        let msg: serde_json::Value = serde_json::from_str(line)?;
        let argv: Vec<String> = serde_json::from_value(msg["argv"].clone())?;
        let matches = self.parser.try_get_matches_from_mut(argv)?;
        let call = CallLine::from_arg_matches(&matches)?.call;
        let mut req = call_cmd::request(call, self.config.clone())?;
        let data = match msg["stdin"].as_str() {
            Some(b64) => Some(base64::engine::general_purpose::STANDARD.decode(b64)?),
            None => None,
        };
        let stdin = match (&req.stdin, data) {
            // The pool's stdin is this channel: the data came in the
            // request, and the command reads it from a file of its own.
            (StdinFrom::Inherit, data) => Some(memfd_with(&data.unwrap_or_default())?),
            (_, Some(_)) => anyhow::bail!("stdin data without --stdin=-"),
            (_, None) => None,
        };
        if stdin.is_some() {
            req.stdin = StdinFrom::Null;
        }
        Ok((req, stdin))
    }
}

impl Hold for Control {
    fn ready(&mut self) {
        // The pool may be gone when this is written, or the reply: the
        // write must fail with EPIPE rather than kill the worker with
        // SIGPIPE (or queue one, blocked while the call runs, that kills
        // it in the middle of its teardown once the call unblocks it).
        // Killed, it would leave its sandbox to its watchdog, and a
        // session to the next call before its disk is let go. Every
        // process of the sandbox exists already, with its own
        // dispositions: none inherits this.
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigIgn,
            )
        };
        if self.pool_watch.is_none() {
            match end_if_the_pool_goes() {
                Ok(taken) => self.pool_watch = Some(taken),
                // Then the end of the pool goes unnoticed until the reply:
                // the call still ends at its deadline.
                Err(e) => tracing::warn!("watch for the end of the pool: {e:#}"),
            }
        }
        self.say(&json!({"ready": true}));
    }

    fn next(&mut self) -> Option<(CallRequest, Option<OwnedFd>)> {
        let stdin = std::io::stdin();
        loop {
            let mut line = String::new();
            match stdin.lock().read_line(&mut line) {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
            match self.parse(&line) {
                Ok(r) => {
                    self.taken = true;
                    return Some(r);
                }
                // Run cold, which reports the bad input as a call does.
                Err(e) => self.say(&json!({"declined": format!("{e:#}")})),
            }
        }
    }

    fn taken(&mut self) {
        if let Some(taken) = self.pool_watch.take() {
            let _ = taken.send(());
        }
    }

    fn decline(&mut self, why: String) {
        self.taken = false;
        self.say(&json!({"declined": why}));
    }

    fn reply(&mut self, result: &CallResult, _tails: &Tails) {
        self.replied = true;
        REPLYING.store(true, Ordering::SeqCst);
        self.say_result("result", result);
        runsbx_runtime::phase("replied");
        if !self.session {
            std::thread::sleep(REPLY_HEAD_START);
        }
    }
}

/// `runsbx pool-worker [call flags] -- TEMPLATE_COMMAND`.
pub fn run(root: &StateRoot, template: Call, config: Option<PathBuf>) -> Result<i32> {
    let template = call_cmd::request(template, config.clone())?;
    let mut parser = CallLine::command();
    parser.build();
    let mut control = Control {
        config,
        parser,
        pool_watch: None,
        taken: false,
        replied: false,
        session: template.session.is_some(),
    };
    let (result, _tails) = call::warm(root, &template, &mut control);
    if !control.replied {
        REPLYING.store(true, Ordering::SeqCst);
        let key = if control.taken { "result" } else { "failed" };
        control.say_result(key, &result);
    }
    Ok(0)
}

/// An anonymous file holding `data`, opened read-only from its start (as
/// a cold call opens `--stdin FILE`).
fn memfd_with(data: &[u8]) -> Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    use std::os::fd::AsRawFd;
    let fd = memfd_create(c"runsbx-stdin", MemFdCreateFlag::MFD_CLOEXEC)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(data)?;
    let read_only = std::fs::File::open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    Ok(read_only.into())
}
