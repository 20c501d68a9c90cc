//! What a caller asks of `runsbx call`: validated at the edge (the CLI's
//! value parsers), with no effect on the host yet.

use std::path::PathBuf;
use std::time::Duration;

use crate::sandbox::workspace::Input;

/// Where the call's stdin comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdinFrom {
    /// /dev/null (the default: a tool call never reads the agent's stdin).
    Null,
    /// runsbx's own stdin (`--stdin -`).
    Inherit,
    File(PathBuf),
}

/// Where the head of the command's output goes while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveOutput {
    /// Nowhere: only in the result (`--json`).
    Quiet,
    /// To runsbx's own stdout and stderr (human output).
    Echo,
    /// As JSON Lines on runsbx's stdout, chunk by chunk (`--stream`).
    Stream,
}

#[derive(Debug, Clone)]
pub struct CallRequest {
    /// An image of the store, by name; `None` with no `rootfs` means the
    /// default image.
    pub image: Option<String>,
    /// A root filesystem directory to use instead of an image.
    pub rootfs: Option<PathBuf>,
    /// A session whose workspace and writable layer the call runs with
    /// (its settings are the call's defaults, which it may only tighten).
    pub session: Option<String>,
    pub data_dir: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub profile: Option<String>,
    /// The deadline; `None`: the session's, or [`Self::DEFAULT_TIMEOUT`].
    pub timeout: Option<Duration>,
    pub memory: Option<String>,
    pub pids: Option<u64>,
    pub env: Vec<(String, String)>,
    pub stdin: StdinFrom,
    pub inputs: Vec<Input>,
    pub outputs: Vec<String>,
    pub output_dir: PathBuf,
    /// Bytes kept of each of stdout and stderr.
    pub max_output: usize,
    pub max_output_file: u64,
    pub command: Vec<String>,
    /// What is done with the command's output as it comes.
    pub live: LiveOutput,
    /// Egress through the proxy (`--allow-host` and its companions);
    /// `None`: no way out at all, whatever the profile allows.
    pub egress: Option<runsbx_policy::EgressPlan>,
    /// Credentials the proxy puts in place of their sentinels (`--secret`);
    /// their values never enter the sandbox. Their sentinels are in `env`.
    pub secrets: Vec<runsbx_proxy::Secret>,
    /// Learn mode (`--learn`): the result also reports every request the
    /// proxy let through, for `runsbx profile suggest`.
    pub learn: bool,
}

impl CallRequest {
    /// The deadline of a call that gives none, outside a session.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// The most of each of stdout and stderr a call may keep. What is kept
    /// is held in runsbx's memory (which no sandbox limit bounds) and then
    /// written out as one JSON string: with `--max-output 100G` a command
    /// printing `yes` for 3 s grew runsbx to 6 GB and its result came 40 s
    /// after the deadline; at 64M, 236 MB and 1.3 s. More output than this
    /// belongs in a file, copied out with `--output`.
    pub const MAX_OUTPUT_CAP: u64 = 64 << 20;

    /// Refuses a `--max-output` of more than [`Self::MAX_OUTPUT_CAP`].
    pub fn check_max_output(bytes: u64) -> Result<(), crate::RuntimeError> {
        if bytes <= Self::MAX_OUTPUT_CAP {
            return Ok(());
        }
        Err(crate::RuntimeError::invalid(
            format!("--max-output {}", runsbx_policy::profile::Size(bytes)),
            format!(
                "is more than the {} of each stream a call may keep in memory; have the command \
                 write a file in /workspace and copy it out with --output",
                runsbx_policy::profile::Size(Self::MAX_OUTPUT_CAP)
            ),
        ))
    }

    /// The call's deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(Self::DEFAULT_TIMEOUT)
    }
}
