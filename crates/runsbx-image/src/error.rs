//! Errors of the image store. The runtime wraps them in its own error and
//! gives each its kind and exit code.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "image `{name}` not found (searched {}); `runsbx image ls` lists the images; \
         make one with `sudo runsbx image build python` or `runsbx image import FILE --name {name}`",
        .searched.iter().map(|d| format!("{d:?}")).collect::<Vec<_>>().join(", ")
    )]
    NotFound {
        name: String,
        searched: Vec<PathBuf>,
    },

    #[error("image `{name}` already exists at {path:?} (pass --replace to replace it, or `runsbx image rm {name}` first)")]
    Exists { name: String, path: PathBuf },

    #[error("image `{name}` is in use: a call runs on it, or `image rm` is deleting it (try again when it has ended)")]
    InUse { name: String },

    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },

    #[error("{what}: {reason}")]
    Unsupported { what: String, reason: String },

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

impl ImageError {
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
        Self::Invalid {
            what: what.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;
