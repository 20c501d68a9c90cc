//! The sessions one connection may use: its own (made at connection start
//! with the operator's settings, or the operator's `--session NAME`), and
//! those it made with create_session. A client can name no other session on
//! the host, and whatever this server made it removes when the client goes.

use std::ffi::OsString;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::runner::{Finished, Runner};
use super::schema::ToolError;
use crate::ExitWith;

/// Sessions a client may make with create_session, each with the
/// operator's disk: a bound on what one connection can hold on the host.
pub const MAX_CREATED: usize = 8;

/// How long removal waits for calls that are still ending (`session rm`
/// exits 5 while a call holds the session).
const RM_PATIENCE: Duration = Duration::from_secs(10);

/// `runsbx session` exit codes (the sessions CLI contract).
const EXIT_BAD_INPUT: i32 = 3;
const EXIT_NOT_FOUND: i32 = 4;
const EXIT_CONFLICT: i32 = 5;

#[derive(Debug)]
pub struct Sessions {
    /// The connection's own session.
    pub default: String,
    /// Whether this server made `default` (and so removes it).
    made_default: bool,
    /// `session create` flags: the operator's image, limits and allowlist.
    create_flags: Vec<OsString>,
    /// Made by create_session and not closed yet.
    created: Mutex<Vec<String>>,
}

impl Sessions {
    /// Makes the connection's session with the operator's settings, or
    /// checks that the operator's named one exists.
    pub async fn open(
        runner: &Runner,
        named: Option<String>,
        create_flags: Vec<OsString>,
    ) -> Result<Self> {
        let (default, made_default) = match named {
            Some(name) => {
                if !exists(runner, &name).await? {
                    return Err(ExitWith {
                        code: EXIT_NOT_FOUND,
                        message: format!(
                            "session {name:?} does not exist (make it with `runsbx session \
                             create {name}`, or leave --session out for a fresh one per \
                             connection)"
                        ),
                    }
                    .into());
                }
                (name, false)
            }
            None => {
                // A setting `session create` refuses ends the server with
                // that command's exit code (3: a bad value, 4: no such image).
                let made = create(runner, None, &create_flags)
                    .await
                    .map_err(|refused| ExitWith {
                        code: refused.code.unwrap_or(runsbx_runtime::exit::FAILURE),
                        message: refused.error.message,
                    })
                    .context("make the connection's session")?;
                (session_name(&made)?, true)
            }
        };
        if made_default {
            runner.allow_pool(&default).await;
        }
        tracing::info!(session = %default, made = made_default, "mcp: serving");
        Ok(Self {
            default,
            made_default,
            create_flags,
            created: Mutex::new(Vec::new()),
        })
    }

    /// The session a tool runs in: the connection's own, or one it made.
    pub fn resolve(&self, requested: Option<&str>) -> Result<String, ToolError> {
        let Some(name) = requested else {
            return Ok(self.default.clone());
        };
        if name == self.default || self.created_now().iter().any(|s| s == name) {
            return Ok(name.to_owned());
        }
        Err(ToolError::bad_input(format!(
            "session {name:?} is not one of this connection's ({}); a client uses only the \
             sessions it was given or made with create_session",
            self.names().join(", ")
        )))
    }

    /// Makes a session for the client with the operator's settings.
    pub async fn create(&self, runner: &Runner, name: Option<&str>) -> Result<Value, ToolError> {
        if let Some(name) = name {
            check_name(name)?;
        }
        if self.created_now().len() >= MAX_CREATED {
            return Err(ToolError::new(
                "refused",
                format!(
                    "this connection has {MAX_CREATED} sessions already (the most it may make); \
                     close one with close_session"
                ),
            ));
        }
        let made = create(runner, name, &self.create_flags).await?;
        let name = session_name(&made).map_err(|e| ToolError::failure(format!("{e:#}")))?;
        runner.allow_pool(&name).await;
        if let Ok(mut created) = self.created.lock() {
            created.push(name);
        }
        Ok(made)
    }

    /// Removes a session the client made.
    pub async fn close(&self, runner: &Runner, name: &str) -> Result<(), ToolError> {
        if !self.created_now().iter().any(|s| s == name) {
            return Err(ToolError::bad_input(format!(
                "session {name:?} was not made by this connection's create_session; only those \
                 can be closed (the connection's own is removed when the client disconnects)"
            )));
        }
        // The pool holds the session between calls.
        runner.close_pool(name).await;
        let done = runner
            .admin(&["session", "rm", name])
            .await
            .map_err(|e| ToolError::failure(format!("run runsbx session rm: {e}")))?;
        if done.code != Some(0) {
            return Err(admin_error(&done));
        }
        if let Ok(mut created) = self.created.lock() {
            created.retain(|s| s != name);
        }
        Ok(())
    }

    /// Removes every session this server made, waiting for calls that are
    /// still ending. The operator's named session stays.
    pub async fn remove_all(&self, runner: &Runner) -> Result<()> {
        // Each pool holds its session between calls.
        runner.close_pools().await;
        let mut names = self.created_now();
        if self.made_default {
            names.push(self.default.clone());
        }
        let mut failed = Vec::new();
        for name in names {
            if let Err(e) = remove_patiently(runner, &name).await {
                tracing::error!("mcp: remove session {name:?}: {e:#}");
                failed.push(name);
            }
        }
        if !failed.is_empty() {
            bail!(
                "could not remove session(s) {} (remove with `runsbx session rm`)",
                failed.join(", ")
            );
        }
        Ok(())
    }

    fn created_now(&self) -> Vec<String> {
        self.created.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn names(&self) -> Vec<String> {
        let mut names = vec![self.default.clone()];
        names.extend(self.created_now());
        names
    }
}

/// Session names as the sessions contract has them:
/// `[A-Za-z0-9][A-Za-z0-9_.-]{0,63}`. Checked here too so that a client's
/// name can never be read as a flag.
fn check_name(name: &str) -> Result<(), ToolError> {
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(ToolError::bad_input(format!(
            "session name {name:?}: use a letter or digit, then up to 63 letters, digits, `_`, \
             `.` or `-`"
        )))
    }
}

/// A `runsbx session create` that made nothing.
struct CreateFailed {
    /// Its exit code; `None` when it did not run or exit.
    code: Option<i32>,
    error: ToolError,
}

impl From<CreateFailed> for ToolError {
    fn from(failed: CreateFailed) -> Self {
        failed.error
    }
}

async fn create(
    runner: &Runner,
    name: Option<&str>,
    flags: &[OsString],
) -> Result<Value, CreateFailed> {
    let mut args: Vec<OsString> = ["session", "create", "--json"].map(OsString::from).to_vec();
    args.extend(flags.iter().cloned());
    args.extend(name.map(OsString::from));
    let done = runner.admin(&args).await.map_err(|e| CreateFailed {
        code: None,
        error: ToolError::failure(format!("run runsbx session create: {e}")),
    })?;
    if done.code != Some(0) {
        return Err(CreateFailed {
            code: done.code,
            error: admin_error(&done),
        });
    }
    serde_json::from_slice(&done.stdout).map_err(|e| CreateFailed {
        code: None,
        error: ToolError::failure(format!(
            "runsbx session create printed no session object: {e}"
        )),
    })
}

fn session_name(made: &Value) -> Result<String> {
    made.get("name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .context("runsbx session create printed an object without a name")
}

async fn exists(runner: &Runner, name: &str) -> Result<bool> {
    let done = runner
        .admin(&["session", "ls", "--json"])
        .await
        .context("run runsbx session ls")?;
    if done.code != Some(0) {
        bail!("runsbx session ls: {}", done.message());
    }
    let list: Vec<Value> =
        serde_json::from_slice(&done.stdout).context("runsbx session ls --json printed no list")?;
    Ok(list
        .iter()
        .any(|s| s.get("name").and_then(Value::as_str) == Some(name)))
}

/// `session rm NAME`, again while a call that is ending still holds it.
async fn remove_patiently(runner: &Runner, name: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + RM_PATIENCE;
    loop {
        let done = runner.admin(&["session", "rm", name]).await?;
        match done.code {
            Some(0) | Some(EXIT_NOT_FOUND) => return Ok(()),
            Some(EXIT_CONFLICT) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => bail!("{}", done.message()),
        }
    }
}

fn admin_error(done: &Finished) -> ToolError {
    let kind = match done.code {
        Some(EXIT_BAD_INPUT) => "bad_input",
        Some(EXIT_NOT_FOUND) => "not_found",
        Some(EXIT_CONFLICT) => "conflict",
        _ => "failure",
    };
    ToolError::new(kind, done.message())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_never_flags() {
        for ok in ["a", "s-0123456789ab", "Work_1.x-y", &"a".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-x",
            "--image=evil",
            ".x",
            "a b",
            "a/b",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
