//! A warm call: the sandbox is built and started from a template request
//! before the command is known, its init a stub that waits (see
//! sandbox/stub.rs); the request that comes later runs in it only if a
//! cold call of that request would have built the very same sandbox.
//!
//! [`Fitter`] decides that. It resolves the request exactly as a cold call
//! does (environment, command lookup, spec, overrides) and hardens it with
//! the same policy, id range and workspace; the hardened spec must equal
//! the template's in everything but the command and its environment. The
//! request's own hardening gives the command, the environment, the
//! deadline and the attestation the result reports, so a warm result is a
//! cold one's. Anything else (another image, limit, profile or egress, a
//! stream) is declined, and the pool runs that request cold.

use std::path::PathBuf;
use std::time::Duration;

use libcontainer::oci_spec::runtime::Spec;
use runsbx_policy::{HostFacts, IdRange, Layer};

use super::request::{CallRequest, LiveOutput, StdinFrom};
use super::{plan, tighten, CallResult, Tails};
use crate::error::{Result, RuntimeError};
use crate::ops::create;
use crate::policy::Policy;
use crate::sandbox::workspace::Workspace;
use crate::session::Settings;
use crate::state::bundle::Bundle;

/// What a warm sandbox is made from, kept to hold its requests to.
pub(super) struct Made {
    pub rootfs: PathBuf,
    pub image_env: Vec<String>,
    pub policy: Policy,
    pub session: Option<Settings>,
    /// The listener its seccomp denials are reported to.
    pub seccomp_listener: Option<PathBuf>,
}

/// The owner of a warm sandbox (a pool): it is told when the sandbox
/// waits, gives it one request, and gets the result before the sandbox is
/// torn down.
pub trait Hold {
    /// The sandbox waits for its command.
    fn ready(&mut self);
    /// The next request, with the stdin it brings (`None`: the request's
    /// own `stdin`); `None` when the sandbox is no longer wanted.
    fn next(&mut self) -> Option<(CallRequest, Option<std::os::fd::OwnedFd>)>;
    /// The last request does not fit this sandbox (it is run cold).
    fn decline(&mut self, why: String);
    /// The last request fit, and its command runs: nothing more is asked
    /// of the owner until [`Hold::reply`]. Called with the call's signals
    /// blocked.
    fn taken(&mut self) {}
    /// The result of the request this sandbox ran, before its teardown.
    fn reply(&mut self, result: &CallResult, tails: &Tails);
}

/// A request, fitted to the warm sandbox: what its stub execs, and what a
/// cold call of it would have reported.
pub(super) struct Fitted {
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub deadline: Option<Duration>,
    pub attestation: Vec<Layer>,
}

/// What a request is checked against.
pub(super) struct Fitter {
    template: CallRequest,
    rootfs: PathBuf,
    image_env: Vec<String>,
    policy: Policy,
    range: Option<IdRange>,
    seccomp_listener: Option<PathBuf>,
    /// The session the template runs in: its settings are every
    /// request's defaults, as they are a cold call's.
    session: Option<Settings>,
    /// The template's hardened spec, without its command.
    spec: Spec,
    /// The trust bundle of the sandbox's TLS inspection, if it has one:
    /// requests are hardened with it, as the sandbox was.
    trust_bundle: Option<PathBuf>,
    /// The host's facts, read once: this process's privileges and the
    /// kernel's features do not change while its sandbox waits.
    host: HostFacts,
}

impl Fitter {
    /// The template's image (its rootfs and environment), policy and
    /// session, and the id range its sandbox was built in.
    pub fn new(
        template: &CallRequest,
        made: Made,
        range: Option<IdRange>,
        trust_bundle: Option<PathBuf>,
        ws: &Workspace,
    ) -> Result<Self> {
        let mut fitter = Self {
            trust_bundle,
            template: template.clone(),
            rootfs: made.rootfs,
            image_env: made.image_env,
            policy: made.policy,
            range,
            seccomp_listener: made.seccomp_listener,
            session: made.session,
            spec: Spec::default(),
            host: crate::policy::host_facts(range),
        };
        fitter.spec = without_command(fitter.harden(template, ws)?.spec);
        Ok(fitter)
    }

    /// The request fitted (with its session's defaults), or why it does
    /// not fit.
    pub fn fit(
        &self,
        req: CallRequest,
        ws: &Workspace,
    ) -> std::result::Result<(CallRequest, Fitted), String> {
        let req = match &self.session {
            Some(settings) if req.session.as_ref() == Some(&settings.name) => {
                tighten::tighten(settings, &req).map_err(|e| e.to_string())?
            }
            _ => req,
        };
        self.same_sandbox_asked(&req)?;
        let hardened = self.harden(&req, ws).map_err(|e| e.to_string())?;
        let process = hardened.spec.process().as_ref();
        let args = process.and_then(|p| p.args().clone()).unwrap_or_default();
        let env = process.and_then(|p| p.env().clone()).unwrap_or_default();
        if without_command(hardened.spec) != self.spec {
            return Err("its hardened spec differs from the warm sandbox's".to_owned());
        }
        let fitted = Fitted {
            args,
            env,
            deadline: hardened.deadline,
            attestation: hardened.attestation,
        };
        Ok((req, fitted))
    }

    /// The request, resolved and hardened as a cold call of it would be.
    fn harden(&self, req: &CallRequest, ws: &Workspace) -> Result<runsbx_policy::Hardened> {
        if req.command.is_empty() {
            return Err(RuntimeError::invalid("runsbx call", "no command"));
        }
        plan::check_files(req)?;
        // As CallPlan resolves it: a session's home is its workspace, its
        // rootfs its writable layer over the image.
        let home = if self.session.is_some() {
            "/workspace"
        } else {
            "/tmp"
        };
        let env = plan::environment(&self.image_env, home, &req.env);
        plan::check_command(&self.rootfs, &req.command[0], &env)?;
        let read_only = self.session.is_none();
        let source = Bundle {
            dir: ws.dir.clone(),
            spec: plan::call_spec(&self.rootfs, req, env, read_only, self.host.rootless)?,
            rootfs: self.rootfs.clone(),
        };
        let overrides = plan::overrides(req)?;
        let made = crate::policy::Provisions {
            workspace: Some(ws),
            seccomp_listener: self.seccomp_listener.as_deref(),
            trust_bundle: self.trust_bundle.as_deref(),
            host: Some(&self.host),
        };
        create::harden_source(
            &source,
            &self.policy,
            self.range,
            made,
            None,
            Some(&overrides),
        )
    }

    /// The settings that shape a sandbox are the template's; what differs
    /// may only be the command, its environment, stdin, files, deadline
    /// and output caps.
    fn same_sandbox_asked(&self, req: &CallRequest) -> std::result::Result<(), String> {
        let t = &self.template;
        let differs = |what: &str| Err(format!("its {what} differs from the warm sandbox's"));
        if req.session != t.session {
            return differs("session");
        }
        if req.live != LiveOutput::Quiet {
            return Err("it streams its output".to_owned());
        }
        if req.image != t.image || req.rootfs != t.rootfs {
            return differs("image");
        }
        if req.data_dir != t.data_dir {
            return differs("data directory");
        }
        if req.config != t.config || req.profile != t.profile {
            return differs("profile");
        }
        if req.memory != t.memory {
            return differs("memory limit");
        }
        if req.pids != t.pids {
            return differs("pids limit");
        }
        if req.egress != t.egress {
            return differs("egress");
        }
        if !req.secrets.is_empty() {
            // A secret lives in the proxy of the sandbox it was given to;
            // the warm sandbox's proxy was made without it.
            return Err(
                "it carries secrets (--secret), which a sandbox's proxy gets when it is made"
                    .to_owned(),
            );
        }
        if req.learn {
            // Learning is the proxy's, set when the sandbox is made.
            return Err(
                "it learns (--learn), which a sandbox's proxy is set to when it is made".to_owned(),
            );
        }
        if req.stdin == StdinFrom::Inherit {
            // A pool's own stdin is its control channel.
            return Err("it reads runsbx's stdin".to_owned());
        }
        Ok(())
    }
}

/// The spec without what a warm sandbox's stub is given later.
fn without_command(mut spec: Spec) -> Spec {
    if let Some(p) = spec.process_mut() {
        p.set_args(None);
        p.set_env(None);
    }
    spec
}
