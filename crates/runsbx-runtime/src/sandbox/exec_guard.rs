//! What libcontainer 0.7 leaves out of `exec`: its tenant builder rebuilds
//! the process's `linux` section from the namespaces alone, so a process
//! exec'd into a container ran without the container's seccomp filter and
//! with runsbx's own rlimits. runc applies both.
//!
//! `ExecGuard` is the executor of every exec'd process: in the new process,
//! after libcontainer has joined the namespaces and dropped capabilities
//! and right before execve, it lowers the rlimits to the container's and
//! installs the container's seccomp filter.

use std::path::Path;

use libcontainer::oci_spec::runtime::{PosixRlimit, Spec};
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};

use crate::sys::seccomp::Program;

#[derive(Clone, Debug)]
pub struct ExecGuard {
    seccomp: Program,
    rlimits: Vec<PosixRlimit>,
}

impl ExecGuard {
    /// The guard for processes exec'd into the container whose effective
    /// bundle is `dir`, with spec `spec`, its filter's program compiled or
    /// read from the state root `root` (see sys/seccomp.rs); an error when
    /// its seccomp filter cannot be read.
    pub fn for_container(root: &Path, dir: &Path, spec: &Spec) -> crate::error::Result<Self> {
        let seccomp = crate::state::bundle::Effective::seccomp(dir, spec)?;
        // A call's filter reports to the call's listener, which gets the
        // init's notification fd only: here the same denials are answered
        // by the filter itself.
        let unreported = runsbx_policy::seccomp::unreported(&seccomp);
        Ok(Self {
            seccomp: Program::of(&unreported, root)?,
            rlimits: spec
                .process()
                .as_ref()
                .and_then(|p| p.rlimits().clone())
                .unwrap_or_default(),
        })
    }
}

impl Executor for ExecGuard {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // What runsbx's caller ignored is not the exec'd process's to
        // inherit (see sys/signal.rs).
        crate::sys::signal::default_dispositions();
        for rl in &self.rlimits {
            let name = serde_json::to_value(rl.typ())
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            if let Some(resource) = crate::sys::privilege::rlimit_resource(&name) {
                nix::sys::resource::setrlimit(resource, rl.soft(), rl.hard()).map_err(|e| {
                    ExecutorError::Other(format!(
                        "exec: set {name} to the container's ({}/{}): {e}",
                        rl.soft(),
                        rl.hard()
                    ))
                })?;
            }
        }
        // Installing a filter without CAP_SYS_ADMIN needs no_new_privs; a
        // sandbox's processes always have it.
        nix::sys::prctl::set_no_new_privs()
            .map_err(|e| ExecutorError::Other(format!("exec: set no_new_privs: {e}")))?;
        match self.seccomp.install() {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err(ExecutorError::Other(
                    "exec: the container's seccomp filter notifies (SCMP_ACT_NOTIFY), which runsbx does not support for exec".to_owned(),
                ))
            }
            Err(e) => {
                return Err(ExecutorError::Other(format!(
                    "exec: install the container's seccomp filter: {e}"
                )))
            }
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}
