//! Errors of the runtime crate, each mapped to a documented exit code.

use std::path::PathBuf;

use libcontainer::error::LibcontainerError;

/// What went wrong, in the terms a caller acts on. Every [`RuntimeError`]
/// has one; it decides both exit codes, and it is the `kind` of a call's
/// error object (`runsbx.call/v1`), where every refusal before the command
/// ran is `bad_input`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum ErrorKind {
    /// An input was invalid: a container id, a bundle, config.json, an
    /// option, a signal.
    #[serde(rename = "bad_input")]
    BadInput,
    /// No container has that id, or no image that name.
    #[serde(rename = "bad_input")]
    Missing,
    /// The container or image exists already, or is in the wrong state.
    #[serde(rename = "bad_input")]
    Conflict,
    /// What this host or mode cannot give (a cgroup, rootless on v1).
    #[serde(rename = "bad_input")]
    Unsupported,
    /// The sandbox policy refuses what the spec asks for; the message names
    /// the profile key that would allow it.
    #[serde(rename = "refused")]
    Refused,
    /// The command is not in the image.
    #[serde(rename = "not_found")]
    CommandNotFound,
    /// The command is in the image but cannot be executed.
    #[serde(rename = "not_executable")]
    CommandNotExecutable,
    /// The operation failed on the host (a syscall, libcontainer, the
    /// kernel).
    #[serde(rename = "failure")]
    Failure,
}

impl ErrorKind {
    /// runsbx's exit code, runc-style (the table in README.md, "Exit
    /// codes"). `run` and `exec` in the foreground return the container's
    /// own exit code instead; these are for when runsbx got no further.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Failure => exit::FAILURE,
            Self::BadInput | Self::CommandNotExecutable => exit::INVALID_INPUT,
            Self::Missing | Self::CommandNotFound => exit::NOT_FOUND,
            Self::Conflict => exit::CONFLICT,
            Self::Unsupported => exit::UNSUPPORTED,
            Self::Refused => exit::REFUSED,
        }
    }

    /// `runsbx call`'s exit code when the call did not run its command to
    /// an end (README.md, "Tool calls").
    pub fn call_exit_code(self) -> i32 {
        match self {
            Self::Failure => call_exit::FAILURE,
            Self::BadInput | Self::Missing | Self::Conflict | Self::Unsupported | Self::Refused => {
                call_exit::BAD_INPUT
            }
            Self::CommandNotExecutable => call_exit::NOT_EXECUTABLE,
            Self::CommandNotFound => call_exit::NOT_FOUND,
        }
    }
}

impl ErrorKind {
    /// The kind of an error of the image store.
    pub fn of_image(e: &runsbx_image::ImageError) -> Self {
        use runsbx_image::ImageError;
        match e {
            ImageError::NotFound { .. } => Self::Missing,
            ImageError::Exists { .. } | ImageError::InUse { .. } => Self::Conflict,
            ImageError::Invalid { .. } => Self::BadInput,
            ImageError::Unsupported { .. } => Self::Unsupported,
            ImageError::Io { .. } | ImageError::Sys { .. } => Self::Failure,
        }
    }
}

/// Exit codes of `runsbx` for failures of the runtime itself.
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

/// The exit codes of `runsbx call` for what is not the command's own exit
/// (which is passed through, 128 + N for signal N).
pub mod call_exit {
    /// The runtime failed on the host while running the call.
    pub const FAILURE: i32 = 123;
    /// The deadline passed; the sandbox was killed.
    pub const TIMED_OUT: i32 = 124;
    /// The call was refused before it ran: a bad option, an unknown image,
    /// a missing input, a policy refusal.
    pub const BAD_INPUT: i32 = 125;
    /// The command exists in the image but cannot be executed.
    pub const NOT_EXECUTABLE: i32 = 126;
    /// The command does not exist in the image.
    pub const NOT_FOUND: i32 = 127;
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("invalid container id `{id}`: {reason} (use 1-{max} characters from [A-Za-z0-9_+.-], not `.` or `..`)")]
    InvalidId {
        id: String,
        reason: String,
        max: usize,
    },

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

    #[error(transparent)]
    Image(#[from] runsbx_image::ImageError),

    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },

    #[error("session `{name}` does not exist (in {dir:?}; `runsbx session ls` shows the sessions there, `runsbx session create {name}` makes it)")]
    SessionNotFound { name: String, dir: PathBuf },

    /// A session exists already, or is in use.
    #[error("{what}: {reason}")]
    Conflict { what: String, reason: String },

    #[error(transparent)]
    Policy(runsbx_policy::PolicyError),

    #[error("command `{command}`: executable file not found in $PATH of the image (searched {searched}); give a path, or use an image that has it")]
    CommandNotFound { command: String, searched: String },

    #[error(
        "command `{command}` is not an executable file in the image ({path:?}): permission denied"
    )]
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

impl From<runsbx_policy::PolicyError> for RuntimeError {
    fn from(e: runsbx_policy::PolicyError) -> Self {
        Self::Policy(e)
    }
}

impl RuntimeError {
    /// What went wrong, for the exit code and a call's error object.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidId { .. } | Self::Bundle { .. } | Self::InvalidArgument { .. } => {
                ErrorKind::BadInput
            }
            Self::NotFound { .. } | Self::SessionNotFound { .. } => ErrorKind::Missing,
            Self::Exists { .. } | Self::WrongState { .. } | Self::Conflict { .. } => {
                ErrorKind::Conflict
            }
            Self::Image(e) => ErrorKind::of_image(e),
            Self::CommandNotFound { .. } => ErrorKind::CommandNotFound,
            Self::CommandNotExecutable { .. } => ErrorKind::CommandNotExecutable,
            Self::Unsupported { .. } => ErrorKind::Unsupported,
            Self::Policy(e) => match e {
                runsbx_policy::PolicyError::Refused { .. } => ErrorKind::Refused,
                runsbx_policy::PolicyError::HostMissing { .. } => ErrorKind::Unsupported,
                runsbx_policy::PolicyError::Verify(_) | runsbx_policy::PolicyError::Internal(_) => {
                    ErrorKind::Failure
                }
                _ => ErrorKind::BadInput,
            },
            Self::Container { .. } | Self::Io { .. } | Self::Sys { .. } => ErrorKind::Failure,
        }
    }

    /// runsbx's exit code for this error.
    pub fn exit_code(&self) -> i32 {
        self.kind().exit_code()
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

    /// Bad input (exit code 3; a call's 125), with the object named.
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidArgument {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
