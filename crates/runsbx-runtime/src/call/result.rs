//! The result of a call, the JSON schema `runsbx.call/v1` (README.md,
//! "Tool calls"), and how the way it ended becomes an exit code.

use libcontainer::oci_spec::runtime::Spec;
use nix::sys::signal::Signal;
use serde::Serialize;

use super::capture::{Capture, Stream};
use super::exit;
use super::request::CallRequest;
use super::wait::End;
use crate::error::ErrorKind;
use crate::sandbox::workspace::OutputFile;

/// The version of the result's schema; see README.md "runsbx call".
pub const SCHEMA: &str = "runsbx.call/v1";

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

impl EgressReport {
    pub(crate) fn of(
        proxy: &runsbx_proxy::ProxyHandle,
        egress: &runsbx_policy::EgressPlan,
    ) -> Self {
        Self {
            allow: egress.allow.clone(),
            proxy: format!("127.0.0.1:{}", runsbx_policy::PROXY_PORT),
            denied: proxy.events(),
            dropped_events: proxy.dropped_events(),
            stats: proxy.stats(),
        }
    }
}

/// Learn mode's part of the result (`--learn`): what a narrower profile
/// would have to allow, for `runsbx profile suggest`. The egress settings
/// the call ran with are repeated so that the record stands alone.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LearnReport {
    /// Each distinct request the proxy let through, with its count.
    pub requests: Vec<runsbx_proxy::LearnedRequest>,
    /// Distinct requests past the bound, counted only.
    pub dropped: u64,
    /// The call's resolver overrides (`--proxy-resolve`).
    pub resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// The call's exempt destinations (`--proxy-allow-address`).
    pub allow_addresses: Vec<std::net::SocketAddr>,
}

impl LearnReport {
    /// From the call's proxy; empty when it had none (no egress: nothing
    /// went out to learn).
    pub(crate) fn of(
        proxy: Option<&runsbx_proxy::ProxyHandle>,
        egress: Option<&runsbx_policy::EgressPlan>,
    ) -> Self {
        let learned = proxy.and_then(|p| p.learned()).unwrap_or_default();
        Self {
            requests: learned.requests,
            dropped: learned.dropped,
            resolve: egress.map(|e| e.resolve.clone()).unwrap_or_default(),
            allow_addresses: egress
                .map(|e| e.allow_addresses.clone())
                .unwrap_or_default(),
        }
    }
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
    /// The syscalls the seccomp filter denied, by syscall and process;
    /// `null` when the call had no listener for them.
    pub seccomp: Option<crate::sandbox::seccomp_events::SeccompReport>,
    /// The connects the sandbox's own network refused, each explained;
    /// `null` when the call had no listener to see them.
    pub hints: Option<crate::sandbox::connects::Hints>,
    /// In learn mode, what went out; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learned: Option<LearnReport>,
    /// The isolation layers in force, from the policy.
    pub attestation: Option<Vec<runsbx_policy::Layer>>,
    /// The session the call ran in, and the bound on its disk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionReport>,
    pub error: Option<CallError>,
}

/// A session call's part of the result.
#[derive(Debug, Clone, Serialize)]
pub struct SessionReport {
    pub name: String,
    pub disk: crate::session::DiskBound,
}

/// What the human output needs after the call: the tails of the streams
/// that were cut (the heads were written live).
pub struct Tails {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
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

impl CallResult {
    /// The exit code of `runsbx call` for this result.
    pub fn exit_code(&self) -> i32 {
        match (&self.status, &self.error) {
            (Status::Exited | Status::Signaled | Status::Interrupted, _) => {
                self.exit_code.unwrap_or(exit::FAILURE)
            }
            (Status::TimedOut, _) => exit::TIMED_OUT,
            (Status::Error, Some(e)) => e.kind.call_exit_code(),
            (Status::Error, None) => exit::FAILURE,
        }
    }

    /// The result of a call that has not run yet.
    pub(crate) fn new(id: &str, req: &CallRequest) -> Self {
        Self {
            schema: SCHEMA,
            id: id.to_owned(),
            image: None,
            command: req.command.clone(),
            status: Status::Error,
            exit_code: None,
            signal: None,
            timed_out: false,
            duration_ms: 0.0,
            limits: Limits {
                timeout_ms: req.timeout().as_millis() as u64,
                ..Limits::default()
            },
            stdout: None,
            stderr: None,
            outputs: Vec::new(),
            egress: None,
            seccomp: None,
            hints: None,
            learned: None,
            attestation: None,
            session: None,
            error: None,
        }
    }

    /// Records both streams; for the human output, the tails of those
    /// that were cut (their heads were written live).
    pub(crate) fn record_streams(&mut self, out: Capture, err: Capture, tails: &mut Tails) {
        let (stdout, out_tail) = out.finish();
        let (stderr, err_tail) = err.finish();
        if stdout.truncated {
            tails.stdout = out_tail;
        }
        if stderr.truncated {
            tails.stderr = err_tail;
        }
        self.stdout = Some(stdout);
        self.stderr = Some(stderr);
    }

    /// Records how the command ended.
    pub(crate) fn record_end(&mut self, end: End) {
        let signaled = |result: &mut Self, sig: Signal| {
            result.signal = Some(sig.as_str().to_owned());
            result.exit_code = Some(128 + sig as i32);
        };
        match end {
            End::Exited(code) => {
                self.status = Status::Exited;
                self.exit_code = Some(code);
            }
            End::Signaled(sig) => {
                self.status = Status::Signaled;
                signaled(self, sig);
            }
            End::TimedOut => {
                self.status = Status::TimedOut;
                self.timed_out = true;
            }
            End::Interrupted(sig) => {
                self.status = Status::Interrupted;
                signaled(self, sig);
            }
        }
    }

    /// The limits the sandbox was given (from its hardened spec).
    pub(crate) fn record_limits(&mut self, spec: &Spec) {
        self.limits.memory_bytes = memory_limit(spec);
        self.limits.pids = spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.pids().as_ref())
            .map(|p| p.limit());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
            seccomp: None,
            hints: None,
            learned: None,
            attestation: None,
            session: None,
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
