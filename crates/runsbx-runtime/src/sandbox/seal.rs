//! The sandbox's seccomp filter, installed by runsbx in the init (see
//! sys/seccomp.rs for why runsbx compiles it rather than libcontainer).
//!
//! [`Seal`] is libcontainer's executor for the init of a sandbox whose
//! filter runsbx installs. It runs in the init after every other step of
//! libcontainer's (namespaces, rootfs, capabilities dropped,
//! no_new_privs) and after `start`: it installs the filter, sends a
//! reporting filter's listener fd to the call's listener, then hands over
//! to the default executor, which execs the command, or to a warm
//! sandbox's stub, which waits for it under the filter.
//!
//! libcontainer installs a spec's filter before the init waits for
//! `start`. The only code that runs in the sandbox between the two points
//! is libcontainer's own and, after `start`, the spec's `startContainer`
//! hooks: a spec with such hooks keeps libcontainer's installation (see
//! [`installs`]), so nothing the sandbox's image holds ever runs without
//! the filter.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use libcontainer::oci_spec::runtime::Spec;
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::sandbox::stub::Stub;
use crate::sys::seccomp::Program;

/// Whether runsbx installs `spec`'s filter itself: it has one, and no
/// `startContainer` hook would run in the sandbox between libcontainer's
/// point of installing it and runsbx's.
pub(crate) fn installs(spec: &Spec) -> bool {
    let has_filter = spec.linux().as_ref().is_some_and(|l| l.seccomp().is_some());
    let start_hooks = spec
        .hooks()
        .as_ref()
        .and_then(|h| h.start_container().as_ref())
        .is_some_and(|h| !h.is_empty());
    has_filter && !start_hooks
}

/// The executor of an init whose filter runsbx installs.
#[derive(Clone, Debug)]
pub(crate) struct Seal {
    program: Program,
    /// Connected to the call's seccomp listener (inherited from runsbx,
    /// close-on-exec): where a reporting filter's fd goes.
    report_to: Option<RawFd>,
    /// A warm sandbox's stub, which waits for the command; `None`: the
    /// spec's process.
    stub: Option<Stub>,
}

/// The fds the init inherits for its [`Seal`], held by runsbx until the
/// init has been cloned.
pub(crate) struct Inherited {
    _report_to: Option<OwnedFd>,
}

impl Seal {
    pub fn new(
        program: Program,
        report_to: Option<OwnedFd>,
        stub: Option<Stub>,
    ) -> (Self, Inherited) {
        let seal = Self {
            program,
            report_to: report_to.as_ref().map(AsRawFd::as_raw_fd),
            stub,
        };
        (
            seal,
            Inherited {
                _report_to: report_to,
            },
        )
    }

    fn install(&self) -> Result<(), ExecutorError> {
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            ExecutorError::Other(format!("install the sandbox's seccomp filter: {what}: {e}"))
        };
        // The policy gives every sandbox no_new_privs (libcontainer set
        // it already); seccomp(2) without CAP_SYS_ADMIN needs it.
        nix::sys::prctl::set_no_new_privs().map_err(|e| fail("set no_new_privs", &e))?;
        let listener = self
            .program
            .install()
            .map_err(|e| fail("seccomp(SECCOMP_SET_MODE_FILTER)", &e))?;
        let Some(listener) = listener else {
            return Ok(());
        };
        let Some(sock) = self.report_to else {
            // A filter that notifies with nobody to answer would hang its
            // first denied syscall.
            return Err(fail("its listener", &"no socket to send it to"));
        };
        // SAFETY: the fd was inherited from runsbx for this and is open in
        // the init until it execs (close-on-exec).
        let sock = unsafe { BorrowedFd::borrow_raw(sock) };
        let fds = [listener.as_raw_fd()];
        sendmsg::<()>(
            sock.as_raw_fd(),
            &[std::io::IoSlice::new(b"{}")],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| fail("send its listener fd", &e))?;
        Ok(())
    }
}

impl Executor for Seal {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        crate::sys::signal::default_dispositions();
        self.install()?;
        match &self.stub {
            Some(stub) => stub.exec(spec),
            None => DefaultExecutor {}.exec(spec),
        }
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        match &self.stub {
            Some(stub) => stub.validate(spec),
            None => DefaultExecutor {}.validate(spec),
        }
    }

    fn setup_envs(
        &self,
        envs: std::collections::HashMap<String, String>,
    ) -> Result<(), ExecutorSetEnvsError> {
        match &self.stub {
            Some(stub) => stub.setup_envs(envs),
            None => DefaultExecutor {}.setup_envs(envs),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use libcontainer::oci_spec::runtime::{HookBuilder, HooksBuilder, LinuxBuilder};

    fn spec(seccomp: bool, start_hook: bool) -> Spec {
        let mut linux = LinuxBuilder::default().build().unwrap();
        if seccomp {
            linux.set_seccomp(Some(runsbx_policy::seccomp::allowlist().unwrap()));
        }
        let mut spec = Spec::default();
        spec.set_linux(Some(linux));
        if start_hook {
            let hook = HookBuilder::default().path("/bin/hook").build().unwrap();
            spec.set_hooks(Some(
                HooksBuilder::default()
                    .start_container(vec![hook])
                    .build()
                    .unwrap(),
            ));
        }
        spec
    }

    /// A startContainer hook runs in the sandbox after `start`, before
    /// runsbx's executor: its spec keeps libcontainer's installation,
    /// which comes before `start`.
    #[test]
    fn a_start_container_hook_keeps_libcontainers_installation() {
        assert!(installs(&spec(true, false)));
        assert!(!installs(&spec(true, true)));
        assert!(!installs(&spec(false, false)));
    }
}
