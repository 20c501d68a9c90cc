//! runsbx-runtime: every side effect of runsbx. The binary parses
//! arguments and calls one function here; this crate talks to the kernel
//! (through libcontainer and nix) and keeps the state.
//!
//! - `ops/`: the runc verbs, one file each;
//! - `call/`: `runsbx call`, one tool call in a fresh sandbox;
//! - `sandbox/`: what runs or is checked beside a live sandbox;
//! - `session/`: what persists across one agent's calls;
//! - `state/`: what is kept on disk;
//! - `sys/`: one module per kernel mechanism;
//! - `policy.rs`: the I/O around the pure policy crate;
//! - `error.rs`: one error type, one kind, the exit-code tables.

pub mod call;
pub mod error;
pub mod ops;
pub mod policy;
pub mod sandbox;
pub mod session;
pub mod state;
pub mod sys;

pub use error::{exit, ErrorKind, Result, RuntimeError};
pub use libcontainer::oci_spec;
pub use runsbx_image as image;
pub use state::root::StateRoot;

/// The version of libcontainer runsbx is built on, for `--version`.
pub const LIBCONTAINER_VERSION: &str = "0.7.0";

/// The log target of [`phase`]'s events.
pub const PHASE_TARGET: &str = "runsbx::phase";

/// Marks the end of one step of a sandbox's life: a debug event of target
/// [`PHASE_TARGET`], named by `step`, with this process's pid (a pool's
/// workers write to one log). Off unless the log filter turns it on
/// (`RUNSBX_LOG=runsbx::phase=debug`); with `--log-format json` each
/// event's time is when the step ended, to the nanosecond, which is how
/// hack/phases.py shows where a call's time goes. Disabled, it costs a
/// load and a compare.
pub fn phase(step: &'static str) {
    tracing::debug!(target: PHASE_TARGET, pid = std::process::id(), "{step}");
}
