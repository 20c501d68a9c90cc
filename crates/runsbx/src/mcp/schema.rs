//! The tools' arguments and results: what a client sees in the tool list
//! and validates a result against. Every result carries the outcome of the
//! tool's `runsbx call` (schema runsbx.call/v1, README.md "Tool calls"),
//! read from the JSON the call printed.

use std::collections::BTreeMap;

use rmcp::schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::runner::Finished;

/// One of the command's streams as the call captured it (the result's
/// `stdout` or `stderr`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Stream {
    /// The kept bytes: all of them, or the first and the last halves of
    /// the server's --max-output when `truncated`.
    pub data: String,
    /// `utf-8`, or `base64` when the bytes are not text.
    pub encoding: String,
    /// Every byte the command wrote to the stream.
    pub bytes: u64,
    /// Whether bytes were left out between the head and the tail.
    pub truncated: bool,
    /// How many.
    pub omitted_bytes: u64,
}

/// Why a tool did not give a result of its command.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[schemars(crate = "rmcp::schemars")]
pub struct ToolError {
    /// `bad_input` (the arguments, or a limit wider than the operator's),
    /// `not_found`, `not_executable`, `refused`, `conflict` or `failure`.
    pub kind: String,
    pub message: String,
}

impl ToolError {
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        Self {
            kind: kind.to_owned(),
            message: message.into(),
        }
    }

    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new("bad_input", message)
    }

    pub fn failure(message: impl Into<String>) -> Self {
        Self::new("failure", message)
    }
}

/// The part of a `runsbx.call/v1` result the server reads.
#[derive(Debug, Default, Deserialize)]
pub struct CallJson {
    pub status: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    #[serde(default)]
    pub timed_out: bool,
    pub duration_ms: Option<f64>,
    pub limits: Option<Value>,
    pub stdout: Option<Stream>,
    pub stderr: Option<Stream>,
    #[serde(default)]
    pub outputs: Vec<OutputJson>,
    pub egress: Option<Value>,
    pub attestation: Option<Vec<Value>>,
    pub error: Option<ToolError>,
}

/// One `--output` of a call result.
#[derive(Debug, Default, Deserialize)]
pub struct OutputJson {
    pub path: String,
    pub error: Option<String>,
}

/// What every tool returns: how its call in the sandbox went.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Outcome {
    /// The session the call ran in.
    pub session: String,
    /// `exited`, `signaled`, `timed_out`, `interrupted` (runsbx or this
    /// server was stopped) or `error` (the call was refused or failed; see
    /// `error`).
    pub status: String,
    /// The command's exit code; 128+N when signal N ended it; null on a
    /// timeout or an error.
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    /// The deadline passed and the sandbox was killed.
    pub timed_out: bool,
    pub duration_ms: Option<f64>,
    pub stdout: Option<Stream>,
    pub stderr: Option<Stream>,
    /// The limits the call ran under and whether they were hit
    /// (`timeout_ms`, `memory_bytes`, `memory_hit`, `pids`, `pids_hit`).
    pub limits: Option<Value>,
    /// The egress proxy's report: `allow`, `denied` (one event per refused
    /// connection: `host`, `port`, `reason`, `message`), counters; null
    /// when the session has no egress.
    pub egress: Option<Value>,
    /// The isolation layers in force (`layer`, `in_force`, `detail`).
    pub attestation: Option<Vec<Value>>,
    /// Set when runsbx refused or failed the call (or this server could
    /// not run it).
    pub error: Option<ToolError>,
}

impl Outcome {
    /// A tool that failed before or around its call.
    pub fn failed(session: &str, error: ToolError) -> Self {
        Self {
            session: session.to_owned(),
            status: "error".to_owned(),
            exit_code: None,
            signal: None,
            timed_out: false,
            duration_ms: None,
            stdout: None,
            stderr: None,
            limits: None,
            egress: None,
            attestation: None,
            error: Some(error),
        }
    }

    /// The outcome of a finished `runsbx call --json`, and the outputs it
    /// reported.
    pub fn of_call(session: &str, done: &Finished) -> (Self, Vec<OutputJson>) {
        let json: CallJson = match serde_json::from_slice(&done.stdout) {
            Ok(json) => json,
            Err(e) => {
                let message = format!(
                    "runsbx call printed no result ({e}); exit code {:?}: {}",
                    done.code,
                    done.message()
                );
                return (
                    Self::failed(session, ToolError::failure(message)),
                    Vec::new(),
                );
            }
        };
        let outcome = Self {
            session: session.to_owned(),
            status: json.status.unwrap_or_else(|| "error".to_owned()),
            exit_code: json.exit_code,
            signal: json.signal,
            timed_out: json.timed_out,
            duration_ms: json.duration_ms,
            stdout: json.stdout,
            stderr: json.stderr,
            limits: json.limits,
            egress: json.egress,
            attestation: json.attestation,
            error: json.error,
        };
        (outcome, json.outputs)
    }

    /// Whether the client gets it as a tool error (isError): runsbx refused
    /// or failed the call, or it was interrupted. A command that exits
    /// non-zero, is killed by a signal or times out is a result.
    pub fn is_error(&self) -> bool {
        self.error.is_some() || matches!(self.status.as_str(), "error" | "interrupted")
    }
}

/// Limits a call may tighten (never widen) for itself.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct Tighten {
    /// Seconds before the sandbox is killed; at most the operator's
    /// timeout (a longer one is refused).
    pub timeout_seconds: Option<f64>,
    /// Memory limit such as "256M"; at most the operator's.
    pub memory: Option<String>,
    /// Process limit; at most the operator's.
    #[schemars(range(min = 1))]
    pub pids: Option<u64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RunCommand {
    /// A shell command line, run as `sh -c COMMAND` in /workspace.
    pub command: String,
    /// Environment variables for the command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(flatten)]
    pub limits: Tighten,
    /// A session this connection made with create_session (default: the
    /// connection's own).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct RunPython {
    /// Python source, run by the image's python3 in /workspace (read from
    /// stdin, so of any length).
    pub code: String,
    /// Environment variables for the program.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(flatten)]
    pub limits: Tighten,
    /// A session this connection made with create_session (default: the
    /// connection's own).
    pub session: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub enum Encoding {
    #[default]
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "base64")]
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteFile {
    /// Where, under /workspace (relative to it, or absolute under it);
    /// missing directories are made.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// How `content` is encoded: "utf-8" (default) or "base64".
    #[serde(default)]
    pub encoding: Encoding,
    /// A session this connection made with create_session (default: the
    /// connection's own).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadFile {
    /// A regular file under /workspace (relative to it, or absolute under
    /// it); symbolic links are refused.
    pub path: String,
    /// A session this connection made with create_session (default: the
    /// connection's own).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListFiles {
    /// The directory to list (default: /workspace; relative paths are
    /// relative to it).
    pub path: Option<String>,
    /// How many levels to descend: 1 (default) lists the directory's own
    /// entries; at most 8.
    #[schemars(range(min = 1, max = 8))]
    pub depth: Option<u32>,
    /// A session this connection made with create_session (default: the
    /// connection's own).
    pub session: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CreateSession {
    /// The new session's name (default: a generated `s-…`): a letter or
    /// digit, then up to 63 letters, digits, `_`, `.` or `-`.
    pub name: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct CloseSession {
    /// A session this connection made with create_session.
    pub name: String,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct WriteOutcome {
    /// The file, relative to /workspace.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
    #[serde(flatten)]
    pub call: Outcome,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ReadOutcome {
    /// The file, relative to /workspace.
    pub path: String,
    /// The file's content; null when it could not be read (see `error`).
    pub content: Option<String>,
    /// `utf-8`, or `base64` when the file is not text.
    pub encoding: Option<String>,
    /// The file's size.
    pub bytes: Option<u64>,
    #[serde(flatten)]
    pub call: Outcome,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[schemars(crate = "rmcp::schemars")]
pub struct Entry {
    /// Relative to the listed directory.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes (of the link itself for a symlink).
    pub size: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct ListOutcome {
    /// The directory listed, as the sandbox names it.
    pub path: String,
    /// In name order, each directory followed by its own entries.
    pub entries: Vec<Entry>,
    /// Whether entries were left out to keep the listing under the
    /// server's --max-output.
    pub truncated: bool,
    #[serde(flatten)]
    pub call: Outcome,
}

#[derive(Debug, Serialize, JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
pub struct SessionOutcome {
    /// The session's name: give it as `session` to the other tools.
    pub session: String,
    /// `runsbx session create --json`'s object (schema runsbx.session/v1):
    /// image, disk, limits, allowlist; null for close_session.
    pub details: Option<Value>,
    /// Whether close_session removed it.
    pub closed: bool,
    pub error: Option<ToolError>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn finished(code: i32, stdout: &str, stderr: &str) -> Finished {
        Finished {
            code: Some(code),
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.to_owned(),
        }
    }

    #[test]
    fn a_non_zero_exit_is_a_result() {
        let out = r#"{"schema":"runsbx.call/v1","status":"exited","exit_code":3,"signal":null,
            "timed_out":false,"duration_ms":40.5,"limits":{"timeout_ms":30000},
            "stdout":{"data":"hi\n","encoding":"utf-8","bytes":3,"truncated":false,
                      "omitted_bytes":0,"head_bytes":3},
            "stderr":{"data":"","encoding":"utf-8","bytes":0,"truncated":false,
                      "omitted_bytes":0,"head_bytes":0},
            "outputs":[],"egress":null,"attestation":[{"layer":"seccomp","in_force":true}],
            "error":null}"#;
        let (o, _) = Outcome::of_call("s", &finished(3, out, ""));
        assert_eq!(o.exit_code, Some(3));
        assert_eq!(o.stdout.as_ref().unwrap().data, "hi\n");
        assert_eq!(o.attestation.as_ref().unwrap().len(), 1);
        assert!(!o.is_error());
    }

    #[test]
    fn a_refusal_is_a_tool_error_with_its_message() {
        let out = r#"{"schema":"runsbx.call/v1","status":"error",
            "error":{"kind":"bad_input","message":"--timeout 60s: wider than the session's 30s"}}"#;
        let (o, _) = Outcome::of_call("s", &finished(125, out, ""));
        assert!(o.is_error());
        let e = o.error.unwrap();
        assert_eq!(e.kind, "bad_input");
        assert!(e.message.contains("wider"), "{}", e.message);
    }

    #[test]
    fn no_result_is_a_failure_that_quotes_stderr() {
        let (o, _) = Outcome::of_call("s", &finished(1, "", "runsbx: error: boom\n"));
        assert!(o.is_error());
        let e = o.error.unwrap();
        assert_eq!(e.kind, "failure");
        assert!(e.message.ends_with(": boom"), "{}", e.message);
    }

    #[test]
    fn a_timeout_is_a_result() {
        let out = r#"{"status":"timed_out","exit_code":null,"timed_out":true}"#;
        let (o, _) = Outcome::of_call("s", &finished(124, out, ""));
        assert!(o.timed_out);
        assert!(!o.is_error());
    }
}
