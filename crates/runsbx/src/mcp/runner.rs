//! How `runsbx mcp` reaches the sandbox: it runs its own binary, as
//! `runsbx call --json --session NAME …` or `runsbx session …`, and reads
//! the JSON that prints. A call re-execs itself into a user namespace and
//! a private mount namespace, which a server that lives as long as its
//! client cannot do in-process; and so the sandbox has one implementation,
//! the one `runsbx call` documents.
//!
//! Calls go through a warm pool, one `runsbx serve --session NAME` child
//! per session (docs/pool.md): the session's next sandbox is made while
//! the client thinks, and the request is `runsbx call`'s own arguments.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::oneshot;

/// The stderr of a runsbx child that is kept for an error message.
const STDERR_KEPT: usize = 16 * 1024;

/// How long a call has to end after its SIGTERM before it gets SIGKILL
/// (its watchdog then removes the sandbox).
const TERM_GRACE: Duration = Duration::from_secs(10);

/// How long a session's pool has to end once it is closed (its calls in
/// flight finish first).
const POOL_CLOSE_GRACE: Duration = Duration::from_secs(60);

/// Runs runsbx's own binary with the global flags this server was given.
#[derive(Debug, Clone)]
pub struct Runner {
    exe: PathBuf,
    /// `--root DIR`, `--config FILE`: the same state and operator config
    /// as the server's.
    global: Vec<OsString>,
    /// Each session's pool, started by its first call (`None`: calls run
    /// cold, `--no-pool`).
    pools: Option<Pools>,
}

/// The sessions' pools, and the sessions that may have one: those this
/// server made (a pool holds its session between calls, so a session
/// others may use, the operator's `--session`, gets none).
#[derive(Clone, Default)]
struct Pools(Arc<tokio::sync::Mutex<PoolsOf>>);

#[derive(Default)]
struct PoolsOf {
    running: HashMap<String, Arc<Pool>>,
    allowed: std::collections::HashSet<String>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pools")
    }
}

/// A `runsbx serve --session NAME` child and the requests waiting for its
/// replies.
struct Pool {
    child: tokio::sync::Mutex<Child>,
    to: tokio::sync::Mutex<Option<ChildStdin>>,
    waiting: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    next_id: AtomicU64,
}

/// One `runsbx call` as a tool asks for it.
#[derive(Debug, Default)]
pub struct CallSpec {
    pub session: String,
    /// Flags after `call --json --session NAME`, each one argument
    /// (`--timeout=10`), so a value can never be read as another flag.
    pub flags: Vec<OsString>,
    pub command: Vec<String>,
}

/// What a runsbx child printed and how it ended.
#[derive(Debug)]
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Finished {
    /// stderr without runsbx's `runsbx: error: ` prefixes, for a message.
    pub fn message(&self) -> String {
        let text = self.stderr.trim();
        let text = text.strip_prefix("runsbx: error: ").unwrap_or(text);
        if text.is_empty() {
            format!("runsbx exited with {:?} and said nothing", self.code)
        } else {
            text.to_owned()
        }
    }
}

impl Runner {
    pub fn new(
        root: Option<PathBuf>,
        config: Option<PathBuf>,
        pooled: bool,
    ) -> std::io::Result<Self> {
        let mut global = Vec::new();
        if let Some(root) = root {
            global.extend([OsString::from("--root"), root.into_os_string()]);
        }
        if let Some(config) = config {
            global.extend([OsString::from("--config"), config.into_os_string()]);
        }
        Ok(Self {
            exe: std::env::current_exe()?,
            global,
            pools: pooled.then(Pools::default),
        })
    }

    fn command(&self, args: &[OsString]) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.global)
            .args(args)
            // stdout is the MCP channel: a child never writes to it.
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The backstop if this future is dropped: a SIGKILLed call
            // leaves its watchdog to remove the sandbox.
            .kill_on_drop(true);
        cmd
    }

    /// `runsbx call --json --session NAME FLAGS -- COMMAND`; SIGTERM to
    /// the call when `cancel` completes first (the call then kills its
    /// sandbox and prints its result, status `interrupted`).
    pub async fn call(
        &self,
        spec: &CallSpec,
        cancel: impl Future<Output = ()>,
    ) -> std::io::Result<Finished> {
        let mut args: Vec<OsString> = vec![
            "call".into(),
            "--json".into(),
            format!("--session={}", spec.session).into(),
        ];
        args.extend(spec.flags.iter().cloned());
        args.push("--".into());
        args.extend(spec.command.iter().map(OsString::from));
        if let Some(pools) = &self.pools {
            if let Some(pool) = self.pool(pools, &spec.session).await? {
                return pool.call(&args[1..], cancel).await;
            }
        }
        self.run(&args, false, cancel).await
    }

    /// Lets `session` (made by this server) have a pool.
    pub async fn allow_pool(&self, session: &str) {
        if let Some(pools) = &self.pools {
            pools.0.lock().await.allowed.insert(session.to_owned());
        }
    }

    /// The session's pool, started if it has none; `None` if it may have
    /// none.
    async fn pool(&self, pools: &Pools, session: &str) -> std::io::Result<Option<Arc<Pool>>> {
        let mut pools = pools.0.lock().await;
        if !pools.allowed.contains(session) {
            return Ok(None);
        }
        if let Some(pool) = pools.running.get(session) {
            if !pool.ended().await {
                return Ok(Some(pool.clone()));
            }
            // Its serve ended on its own: it died, or refused the session
            // (exit 125, said in this server's log). The session's calls
            // run cold from now on, and say themselves what is wrong.
            tracing::warn!(session, "the session's pool ended; its calls run cold");
            pools.running.remove(session);
            pools.allowed.remove(session);
            return Ok(None);
        }
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.global)
            .arg("serve")
            .arg(format!("--session={session}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Its workers' errors are this server's log lines.
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let (Some(to), Some(from)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(std::io::Error::other("runsbx serve without pipes"));
        };
        let waiting: Arc<std::sync::Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let replies = waiting.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(from).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(reply) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let Some(id) = reply.get("id").and_then(Value::as_u64) else {
                    continue;
                };
                let sender = replies.lock().ok().and_then(|mut w| w.remove(&id));
                if let Some(sender) = sender {
                    let _ = sender.send(reply);
                }
            }
            // The pool ended: whoever still waits hears so.
            if let Ok(mut w) = replies.lock() {
                w.clear();
            }
        });
        let pool = Arc::new(Pool {
            child: tokio::sync::Mutex::new(child),
            to: tokio::sync::Mutex::new(Some(to)),
            waiting,
            next_id: AtomicU64::new(1),
        });
        pools.running.insert(session.to_owned(), pool.clone());
        Ok(Some(pool))
    }

    /// Ends a session's pool (before the session is removed): its ready
    /// sandbox is let go, its calls in flight finish.
    pub async fn close_pool(&self, session: &str) {
        let Some(pools) = &self.pools else { return };
        let pool = pools.0.lock().await.running.remove(session);
        if let Some(pool) = pool {
            pool.close().await;
        }
    }

    /// Ends every session's pool.
    pub async fn close_pools(&self) {
        let Some(pools) = &self.pools else { return };
        let all: Vec<Arc<Pool>> = pools
            .0
            .lock()
            .await
            .running
            .drain()
            .map(|(_, p)| p)
            .collect();
        for pool in all {
            pool.close().await;
        }
    }

    /// A `runsbx session …` command, in a process group of its own: a
    /// client that ends this server by signalling its process group (as
    /// the MCP SDKs do) must not cut a session's creation or removal
    /// short.
    pub async fn admin<S: AsRef<OsStr>>(&self, args: &[S]) -> std::io::Result<Finished> {
        let args: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
        self.run(&args, true, std::future::pending()).await
    }

    async fn run(
        &self,
        args: &[OsString],
        own_group: bool,
        cancel: impl Future<Output = ()>,
    ) -> std::io::Result<Finished> {
        let mut cmd = self.command(args);
        if own_group {
            cmd.process_group(0);
        }
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let (Some(mut out), Some(err)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(std::io::Error::other("runsbx child without pipes"));
        };
        let ended = async {
            let mut stdout = Vec::new();
            let (status, read_out, stderr) = tokio::join!(
                child.wait(),
                out.read_to_end(&mut stdout),
                read_bounded(err, STDERR_KEPT)
            );
            read_out?;
            Ok::<_, std::io::Error>((status?, stdout, stderr?))
        };
        tokio::pin!(ended);
        let (status, stdout, stderr) = tokio::select! {
            r = &mut ended => r?,
            () = cancel => {
                if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
                }
                match tokio::time::timeout(TERM_GRACE, &mut ended).await {
                    Ok(r) => r?,
                    Err(_) => {
                        tracing::warn!("runsbx call did not end {TERM_GRACE:?} after SIGTERM");
                        return Err(std::io::Error::other("the call did not end after SIGTERM"));
                    }
                }
            }
        };
        let stderr = String::from_utf8_lossy(&stderr).into_owned();
        if !stderr.trim().is_empty() {
            tracing::debug!(stderr = %stderr.trim(), "runsbx child stderr");
        }
        Ok(Finished {
            code: status.code(),
            stdout,
            stderr,
        })
    }
}

impl Pool {
    /// One call (`runsbx call`'s arguments after `call`) through the pool;
    /// when `cancel` completes first the call gets SIGTERM, as a cold
    /// call would.
    async fn call(
        &self,
        args: &[OsString],
        cancel: impl Future<Output = ()>,
    ) -> std::io::Result<Finished> {
        let argv: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, reply) = oneshot::channel();
        if let Ok(mut w) = self.waiting.lock() {
            w.insert(id, sender);
        }
        self.send(&json!({"id": id, "argv": argv, "stdin": null}))
            .await?;
        tokio::pin!(reply);
        let reply = tokio::select! {
            r = &mut reply => r,
            () = cancel => {
                self.send(&json!({"cancel": id})).await?;
                match tokio::time::timeout(TERM_GRACE, &mut reply).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::warn!("a pooled call did not end {TERM_GRACE:?} after SIGTERM");
                        return Err(std::io::Error::other("the call did not end after SIGTERM"));
                    }
                }
            }
        };
        let reply = reply.map_err(|_| std::io::Error::other("runsbx serve ended"))?;
        if let Some(error) = reply.get("error") {
            return Err(std::io::Error::other(format!("runsbx serve: {error}")));
        }
        let mut stdout = serde_json::to_vec(&reply["result"])?;
        stdout.push(b'\n');
        Ok(Finished {
            code: reply
                .get("exit_code")
                .and_then(Value::as_i64)
                .and_then(|c| i32::try_from(c).ok()),
            stdout,
            stderr: reply
                .get("stderr")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    }

    /// Whether its serve has exited (it is then reaped).
    async fn ended(&self) -> bool {
        matches!(self.child.lock().await.try_wait(), Ok(Some(_)))
    }

    async fn send(&self, message: &Value) -> std::io::Result<()> {
        let mut to = self.to.lock().await;
        let Some(to) = to.as_mut() else {
            return Err(std::io::Error::other("the session's pool is closed"));
        };
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        to.write_all(&line).await?;
        to.flush().await
    }

    async fn close(&self) {
        // Its stdin closed: serve lets its sandbox go, answers what it
        // runs, and ends.
        drop(self.to.lock().await.take());
        let mut child = self.child.lock().await;
        if tokio::time::timeout(POOL_CLOSE_GRACE, child.wait())
            .await
            .is_err()
        {
            tracing::warn!("a session's pool did not end {POOL_CLOSE_GRACE:?} after it was closed");
            let _ = child.kill().await;
        }
    }
}

/// Reads `r` to its end and keeps the last `keep` bytes.
async fn read_bounded(mut r: impl AsyncRead + Unpin, keep: usize) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            return Ok(kept);
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > keep {
            kept.drain(..kept.len() - keep);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn stderr_keeps_its_end() {
        let data = vec![b'x'; 20_000];
        let kept = read_bounded(&data[..], 100).await.unwrap();
        assert_eq!(kept.len(), 100);
    }
}
