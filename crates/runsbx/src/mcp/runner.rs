//! How `runsbx mcp` reaches the sandbox: it runs its own binary, as
//! `runsbx call --json --session NAME …` or `runsbx session …`, and reads
//! the JSON that prints. A call re-execs itself into a user namespace and
//! a private mount namespace, which a server that lives as long as its
//! client cannot do in-process; and so the sandbox has one implementation,
//! the one `runsbx call` documents.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

/// The stderr of a runsbx child that is kept for an error message.
const STDERR_KEPT: usize = 16 * 1024;

/// How long a call has to end after its SIGTERM before it gets SIGKILL
/// (its watchdog then removes the sandbox).
const TERM_GRACE: Duration = Duration::from_secs(10);

/// Runs runsbx's own binary with the global flags this server was given.
#[derive(Debug, Clone)]
pub struct Runner {
    exe: PathBuf,
    /// `--root DIR`, `--config FILE`: the same state and operator config
    /// as the server's.
    global: Vec<OsString>,
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
    pub fn new(root: Option<PathBuf>, config: Option<PathBuf>) -> std::io::Result<Self> {
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
        self.run(&args, false, cancel).await
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
