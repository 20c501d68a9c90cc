//! A call resolved against the host before anything is made: the rootfs
//! (an image, held in use, or a directory), the command found in it, the
//! environment, stdin, egress, the spec and the policy that will harden it.
//! Every input is checked here, so that a bad one leaves nothing behind.

use std::fs::{self, File};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use libcontainer::oci_spec::runtime::{ProcessBuilder, RootBuilder, Spec};

use super::request::{CallRequest, StdinFrom};
use crate::error::{Result, RuntimeError};
use crate::policy::Policy;
use crate::session::{Session, Sessions};
use crate::state::bundle;
use crate::state::root::StateRoot;
use crate::sys::privilege;
use runsbx_image::{Image, ImageStore};
use runsbx_policy::profile::Size;
use runsbx_policy::{EgressOverride, Overrides};

/// Everything a call needs, checked; nothing exists on the host yet.
pub(crate) struct CallPlan {
    /// Holds the image's in-use lock until the call ends.
    pub image: Option<Image>,
    pub sandbox: SandboxPlan,
    /// The size of the /workspace tmpfs, from the profile.
    pub workspace_size: u64,
    /// The request, with its session's settings as its defaults.
    pub req: CallRequest,
    /// The session the call runs in, held (no other call runs in it)
    /// until the call ends. Its command is looked up once its layer over
    /// the image is mounted ([`check_command`]).
    pub session: Option<Session>,
}

/// What the sandbox is built from.
pub(crate) struct SandboxPlan {
    pub rootfs: PathBuf,
    pub stdin: OwnedFd,
    /// The call's spec, before the policy hardens it.
    pub spec: Spec,
    /// The call's options the policy tightens the profile by.
    pub overrides: Overrides,
    pub policy: Policy,
    /// A warm call's: the stub its init waits on, and the fds it
    /// inherits, held until the init is cloned (see sandbox/stub.rs).
    pub stub: Option<(crate::sandbox::stub::Stub, crate::sandbox::stub::Inherited)>,
    /// The call's `--secret`s, for its proxy.
    pub secrets: Vec<runsbx_proxy::Secret>,
    /// The socket the sandbox's seccomp denials are reported to, bound
    /// once the call's directory exists.
    pub seccomp_listener: Option<PathBuf>,
}

impl CallPlan {
    /// Checks `req` against the host; `image` gets the image's name as soon
    /// as it is known (the result names it even when a later check fails).
    pub fn resolve(
        root: &StateRoot,
        req: &CallRequest,
        image_name: &mut Option<String>,
    ) -> Result<Self> {
        let session = match &req.session {
            Some(name) => Some(Sessions::open(req.data_dir.as_deref())?.open_session(name)?),
            None => None,
        };
        let tightened;
        let req = match &session {
            Some(s) => {
                tightened = super::tighten::tighten(&s.settings, req)?;
                &tightened
            }
            None => req,
        };
        if req.command.is_empty() {
            return Err(RuntimeError::invalid(
                "runsbx call",
                "no command: give it after `--`, e.g. runsbx call -- python3 -c 'print(1)'",
            ));
        }
        check_files(req)?;
        let (rootfs, image_env, image) = match (&req.rootfs, &req.image) {
            (Some(_), Some(_)) => {
                return Err(RuntimeError::invalid(
                    "--image and --rootfs",
                    "give one or the other",
                ))
            }
            (Some(dir), None) => {
                bundle::check_rootfs("--rootfs", dir, root.path())?;
                let dir = fs::canonicalize(dir).map_err(|e| {
                    RuntimeError::invalid(format!("--rootfs {dir:?}"), format!("{e}"))
                })?;
                (dir, Vec::new(), None)
            }
            (None, name) => {
                let name = name.as_deref().unwrap_or(runsbx_image::DEFAULT_IMAGE);
                let image = ImageStore::open(req.data_dir.as_deref(), privilege::rootless())?
                    .resolve(name)?;
                *image_name = Some(image.name.clone());
                if let Some(s) = session
                    .as_ref()
                    .filter(|s| s.settings.image_created != image.created)
                {
                    return Err(RuntimeError::invalid(
                        format!("session `{}`", s.settings.name),
                        format!(
                            "was made on image `{name}` as built at {}, which has been replaced \
                             since (built at {}); its layer holds changes to the old image: \
                             remove the session and make it again",
                            s.settings.image_created, image.created
                        ),
                    ));
                }
                (image.rootfs.clone(), image.config.env.clone(), Some(image))
            }
        };
        let stdin = open_stdin(&req.stdin)?;
        let allow = match &req.egress {
            Some(egress) => runsbx_proxy::Allowlist::parse(&egress.allow)
                .map_err(|e| RuntimeError::invalid("--allow-host or --allow", e.to_string()))?,
            None => runsbx_proxy::Allowlist::default(),
        };
        check_secrets(&req.secrets, &allow)?;
        // A session's home is its workspace, which persists (`pip install
        // --user`, dotfiles).
        let home = if session.is_some() {
            "/workspace"
        } else {
            "/tmp"
        };
        let env = environment(&image_env, home, &req.env);
        if session.is_none() {
            check_command(&rootfs, &req.command[0], &env)?;
        }
        let rootless = privilege::rootless();
        if rootless
            && session.is_none()
            && pathrs::Root::open(&rootfs)
                .and_then(|r| r.resolve("/workspace"))
                .is_err()
        {
            // As root runsbx makes it; an unprivileged caller cannot write
            // into an image that is not theirs (images of the store have it).
            return Err(RuntimeError::invalid(
                format!("the rootfs {rootfs:?}"),
                "has no /workspace directory for the call to work in; create it (mkdir ROOTFS/workspace)",
            ));
        }
        // A session's rootfs is its writable layer over the image.
        let spec = call_spec(&rootfs, req, env, session.is_none(), rootless)?;
        let overrides = overrides(req)?;
        let policy = Policy::load(req.config.as_deref())?;
        let profile = policy.profile_named(overrides.profile.as_deref())?;
        let Some(workspace_size) = profile.tmpfs.get(Path::new("/workspace")).map(|s| s.0) else {
            return Err(RuntimeError::invalid(
                format!("profile `{}`", profile.name),
                "has no /workspace tmpfs, which runsbx call works in; add it under [tmpfs]",
            ));
        };
        Ok(Self {
            image,
            sandbox: SandboxPlan {
                rootfs,
                stdin,
                spec,
                overrides,
                policy,
                stub: None,
                secrets: req.secrets.clone(),
                seccomp_listener: None,
            },
            workspace_size,
            req: req.clone(),
            session,
        })
    }
}

/// The call's files: its inputs exist, and outputs go into a directory
/// the caller made (runsbx creates none on the host but the outputs' own
/// subdirectories inside it).
pub(super) fn check_files(req: &CallRequest) -> Result<()> {
    if !req.outputs.is_empty() && !req.output_dir.is_dir() {
        return Err(RuntimeError::invalid(
            format!("--output-dir {:?}", req.output_dir),
            "is not an existing directory (create it first)",
        ));
    }
    // A glob that can match nothing in /workspace is the caller's mistake,
    // found before the command runs rather than as an empty result after.
    for glob in &req.outputs {
        if crate::sandbox::workspace::workspace_relative(Path::new(glob)).is_none() {
            return Err(RuntimeError::invalid(
                format!("--output {glob:?}"),
                "names no file in /workspace, the only place a call copies files out of: give \
                 a glob relative to /workspace or under /workspace/ (`*.csv`, \
                 `/workspace/out/**`), without `..`",
            ));
        }
    }
    for input in &req.inputs {
        fs::symlink_metadata(&input.host).map_err(|e| {
            RuntimeError::invalid(
                format!("--input {:?}", input.host),
                format!("{e} (give an existing file or directory)"),
            )
        })?;
    }
    Ok(())
}

/// A secret goes only to a host the call may reach: its requests are
/// inspected, and a CA for a host the sandbox cannot reach is refused.
fn check_secrets(secrets: &[runsbx_proxy::Secret], allow: &runsbx_proxy::Allowlist) -> Result<()> {
    for s in secrets {
        let ports = s.port.map_or(vec![80, 443], |p| vec![p]);
        if !ports.iter().any(|p| allow.allows(&s.host, *p)) {
            return Err(RuntimeError::invalid(
                format!("--secret {}", s.name),
                format!(
                    "its host {} is not on the call's allowlist: allow it with --allow-host or --allow",
                    s.host
                ),
            ));
        }
    }
    Ok(())
}

impl SandboxPlan {
    /// Runs the call on `rootfs` instead (a session's layer over the
    /// image), once the command is found there.
    pub fn run_on(&mut self, rootfs: PathBuf) -> Result<()> {
        let process = self.spec.process().as_ref();
        let command = process.and_then(|p| p.args().as_ref()?.first().cloned());
        let env = process.and_then(|p| p.env().clone()).unwrap_or_default();
        if let Some(command) = command {
            check_command(&rootfs, &command, &env)?;
        }
        if let Some(root) = self.spec.root_mut() {
            root.set_path(rootfs.clone());
        }
        self.rootfs = rootfs;
        Ok(())
    }
}

/// The command must be in the rootfs. Inputs land in /workspace, which is
/// not in the image: a command there is checked by the kernel at exec
/// time.
pub(super) fn check_command(rootfs: &Path, command: &str, env: &[String]) -> Result<()> {
    bundle::check_command(
        rootfs,
        command,
        env,
        Path::new("/workspace"),
        &[Path::new("/workspace")],
    )
}

pub(super) fn open_stdin(from: &StdinFrom) -> Result<OwnedFd> {
    Ok(match from {
        StdinFrom::Null => File::open("/dev/null")
            .map_err(|e| RuntimeError::io("open /dev/null", e))?
            .into(),
        StdinFrom::Inherit => std::io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| RuntimeError::io("dup stdin", e))?,
        StdinFrom::File(p) => {
            let bad = |reason: String| RuntimeError::invalid(format!("--stdin {p:?}"), reason);
            let file = File::open(p).map_err(|e| bad(e.to_string()))?;
            // A directory opens, and its reader would only get EISDIR.
            if file.metadata().map_err(|e| bad(e.to_string()))?.is_dir() {
                return Err(bad(
                    "is a directory: give a file, or - for runsbx's own stdin".to_owned(),
                ));
            }
            file.into()
        }
    })
}

/// The command's environment: the image's, then the caller's `--env`
/// (later wins); `HOME` is `home` unless one of them sets it. Never
/// runsbx's own.
pub(super) fn environment(image: &[String], home: &str, extra: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_owned(), v.to_owned()));
    };
    set(
        "PATH",
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    );
    set("HOME", home);
    for kv in image {
        if let Some((k, v)) = kv.split_once('=') {
            set(k, v);
        }
    }
    for (k, v) in extra {
        set(k, v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub(super) fn call_spec(
    rootfs: &Path,
    req: &CallRequest,
    env: Vec<String>,
    read_only: bool,
    rootless: bool,
) -> Result<Spec> {
    let invalid = |e: libcontainer::oci_spec::OciSpecError| {
        RuntimeError::invalid("build the call's spec", e.to_string())
    };
    let mut spec = crate::ops::spec::default_spec(rootless)?;
    let process = ProcessBuilder::default()
        .args(req.command.clone())
        .env(env)
        .cwd("/workspace")
        .terminal(false)
        .build()
        .map_err(invalid)?;
    spec.set_process(Some(process));
    spec.set_root(Some(
        RootBuilder::default()
            .path(rootfs.to_path_buf())
            .readonly(read_only)
            .build()
            .map_err(invalid)?,
    ));
    Ok(spec)
}

/// The call's options as the policy takes them: typed, each only
/// tightening the profile. The deadline is held to the profile's and
/// attested; the call enforces it itself.
pub(super) fn overrides(req: &CallRequest) -> Result<Overrides> {
    let memory = req
        .memory
        .as_deref()
        .map(|m| {
            runsbx_policy::profile::parse_size(m)
                .and_then(|bytes| {
                    runsbx_policy::profile::check_memory_option(bytes).map(|()| Size(bytes))
                })
                .map_err(|e| RuntimeError::invalid(format!("--memory {m:?}"), e))
        })
        .transpose()?;
    let pids = req
        .pids
        .map(|p| {
            i64::try_from(p).map_err(|_| RuntimeError::invalid(format!("--pids {p}"), "too large"))
        })
        .transpose()?;
    Ok(Overrides {
        profile: req.profile.clone(),
        timeout: req
            .timeout
            .map(|t| (t, format!("--timeout {}ms", t.as_millis()))),
        default_timeout: Some(CallRequest::DEFAULT_TIMEOUT),
        memory,
        pids,
        egress: Some(EgressOverride::Call(runsbx_policy::EgressPlan {
            learn: req.learn.then_some(runsbx_policy::Learn::Result),
            ..req.egress.clone().unwrap_or_default()
        })),
        ..Overrides::default()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn environment_is_image_then_caller_never_runsbx() {
        std::env::set_var("RUNSBX_TEST_SECRET", "x");
        let env = environment(
            &["PATH=/opt/bin".to_owned(), "LANG=C.UTF-8".to_owned()],
            "/tmp",
            &[("LANG".to_owned(), "en".to_owned())],
        );
        assert!(env.contains(&"PATH=/opt/bin".to_owned()));
        assert!(env.contains(&"LANG=en".to_owned()));
        assert!(env.contains(&"HOME=/tmp".to_owned()));
        assert!(!env.iter().any(|e| e.contains("RUNSBX_TEST_SECRET")));
    }
}
