//! runsbx-runtime: every side effect of runsbx. The binary parses
//! arguments and calls one function here; this crate talks to the kernel
//! (through libcontainer and nix) and keeps the state.

pub mod bundle;
pub mod call;
mod cgroup_claim;
mod cgroupless;
pub mod check;
pub mod egress;
pub mod error;
pub mod exec;
mod exec_guard;
pub mod features;
pub mod host;
pub mod image;
pub mod lifecycle;
mod mountinfo;
mod netns;
mod newmount;
mod pod;
pub mod policy;
mod procs;
pub mod query;
mod reclaim;
mod record;
pub mod root;
mod rtnl;
pub mod signal;
pub mod spec;
mod stage;
mod supervise;
pub mod supervisor;
pub mod update;

pub use error::{exit, ErrorKind, Result, RuntimeError};
pub use libcontainer::oci_spec;
pub use root::StateRoot;

/// The version of libcontainer runsbx is built on, for `--version`.
pub const LIBCONTAINER_VERSION: &str = "0.7.0";
