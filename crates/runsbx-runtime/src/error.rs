//! Errors of the runtime crate, each mapped to a documented exit code.

use std::path::PathBuf;

use libcontainer::error::LibcontainerError;

/// Exit codes of `runsbx` for failures of the runtime itself.
///
/// `run` and `exec` in the foreground return the container's own exit code
/// instead (128 + N when it was killed by signal N); these are what runsbx
/// returns when it could not get that far. They are listed in README.md.
pub mod exit {
    /// The operation failed on the host (a syscall, libcontainer, the kernel).
    pub const FAILURE: i32 = 1;
    /// The command line could not be parsed (clap's own code).
    pub const USAGE: i32 = 2;
    /// An input was invalid: a container id, a bundle, config.json, a signal.
    pub const INVALID_INPUT: i32 = 3;
    /// No container has that id, or no image that name.
    pub const NOT_FOUND: i32 = 4;
    /// The container or image exists already, or the container is in the
    /// wrong state for the operation.
    pub const CONFLICT: i32 = 5;
    /// The operation needs what this host or mode cannot give (a cgroup,
    /// when rootless on cgroup v1).
    pub const UNSUPPORTED: i32 = 6;
    /// The sandbox policy refuses what the spec asks for (a host bind
    /// mount, a hook, joining a namespace): the message names the profile
    /// key that would allow it.
    pub const REFUSED: i32 = 7;
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid container id `{id}`: {reason} (use 1-{max} characters from [A-Za-z0-9_+.-], not `.` or `..`)", max = crate::root::MAX_ID_LEN)]
    InvalidId { id: String, reason: String },

    #[error("bundle {bundle:?}: {reason}")]
    Bundle { bundle: PathBuf, reason: String },

    #[error("{what}: {reason}")]
    InvalidArgument { what: String, reason: String },

    // "does not exist" is the phrase engines (podman, containerd's go-runc)
    // match to treat a container as already gone.
    #[error("container `{id}` does not exist (state root {root:?}; `runsbx list` shows the containers there)")]
    NotFound { id: String, root: PathBuf },

    #[error("container `{id}` already exists (delete it first: `runsbx delete --force {id}`)")]
    Exists { id: String },

    // "container not running" is matched by engines for kill/exec on a
    // container that has exited; keep it in the message.
    #[error(
        "container `{id}` is {status}: cannot {op} (container not running or in the wrong state)"
    )]
    WrongState {
        id: String,
        status: String,
        op: &'static str,
    },

    #[error(
        "image `{name}` not found (searched {}); `runsbx image ls` lists the images; \
         make one with `sudo runsbx image build python` or `runsbx image import FILE --name {name}`",
        crate::image::display_dirs(.searched)
    )]
    ImageNotFound {
        name: String,
        searched: Vec<PathBuf>,
    },

    #[error("image `{name}` already exists at {path:?} (pass --replace to replace it, or `runsbx image rm {name}` first)")]
    ImageExists { name: String, path: PathBuf },

    #[error("image `{name}` is in use: a call runs on it, or `image rm` is deleting it (try again when it has ended)")]
    ImageInUse { name: String },

    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },

    #[error(transparent)]
    Policy(runsbx_policy::PolicyError),

    #[error("command `{command}` not found in the image (searched PATH={searched}); give a path, or use an image that has it")]
    CommandNotFound { command: String, searched: String },

    #[error("command `{command}` is not an executable file in the image ({path:?})")]
    CommandNotExecutable { command: String, path: PathBuf },

    #[error("{op} container `{id}`")]
    Container {
        op: &'static str,
        id: String,
        // Boxed: libcontainer's error is large, and every Result here carries it.
        #[source]
        source: Box<LibcontainerError>,
    },

    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{context}")]
    Sys {
        context: String,
        #[source]
        source: nix::Error,
    },
}

impl RuntimeError {
    /// The process exit code that stands for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::InvalidId { .. } | Self::Bundle { .. } | Self::InvalidArgument { .. } => {
                exit::INVALID_INPUT
            }
            Self::NotFound { .. } | Self::ImageNotFound { .. } => exit::NOT_FOUND,
            Self::Exists { .. }
            | Self::WrongState { .. }
            | Self::ImageExists { .. }
            | Self::ImageInUse { .. } => exit::CONFLICT,
            Self::CommandNotFound { .. } => exit::NOT_FOUND,
            Self::CommandNotExecutable { .. } => exit::INVALID_INPUT,
            Self::Unsupported { .. } => exit::UNSUPPORTED,
            Self::Policy(e) => match e {
                runsbx_policy::PolicyError::Refused { .. } => exit::REFUSED,
                runsbx_policy::PolicyError::HostMissing { .. } => exit::UNSUPPORTED,
                runsbx_policy::PolicyError::Verify(_) | runsbx_policy::PolicyError::Internal(_) => {
                    exit::FAILURE
                }
                _ => exit::INVALID_INPUT,
            },
            Self::Container { .. } | Self::Io { .. } | Self::Sys { .. } => exit::FAILURE,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn sys(context: impl Into<String>, source: nix::Error) -> Self {
        Self::Sys {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unsupported {
            what: what.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
