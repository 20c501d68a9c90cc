//! The command line: runc's commands and global flags, as container
//! engines pass them.

use std::path::PathBuf;

use clap::{ArgMatches, Args, FromArgMatches, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "runsbx",
    about = "A sandbox runtime for AI agents' tool calls (an OCI runtime, runc-compatible)",
    version = concat!(env!("CARGO_PKG_VERSION"), "\nspec: ", "1.2.1", "\nlibcontainer: 0.7.0"),
    propagate_version = false
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Global flags of runc that engines pass.
#[derive(Args, Debug)]
pub struct Global {
    /// Directory for container state (default: /run/runsbx as root,
    /// $XDG_RUNTIME_DIR/runsbx otherwise)
    #[arg(long, global = true)]
    pub root: Option<PathBuf>,
    /// Write logs to this file instead of stderr
    #[arg(long, global = true)]
    pub log: Option<PathBuf>,
    /// Log format: text or json
    #[arg(long, global = true)]
    pub log_format: Option<String>,
    /// Log at debug level
    #[arg(long, global = true)]
    pub debug: bool,
    /// Accepted for compatibility; runsbx manages cgroups directly, never
    /// through systemd
    #[arg(long, global = true)]
    pub systemd_cgroup: bool,
    /// The operator config: default profile and selectable profiles
    /// (default: /etc/runsbx/config.toml when it exists)
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    /// Accepted for compatibility (runc's --rootless=auto); runsbx detects it
    #[arg(long, num_args = 0..=1, default_missing_value = "auto")]
    pub rootless: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one command in a fresh sandbox (a tool call) and report how it went
    Call(Box<Deferred<crate::call_cmd::Call>>),
    /// Print the hardened config.json a bundle would run with, what was
    /// changed and why, and the isolation layers in force (a dry run)
    Harden(Harden),
    /// Diagnose this host: which isolation layers runsbx can apply here
    Check,
    /// Manage the local images runsbx call runs on
    Image {
        #[command(subcommand)]
        cmd: crate::image_cmd::ImageCmd,
    },
    /// Manage sessions: files that persist across calls
    Session {
        #[command(subcommand)]
        cmd: crate::session_cmd::SessionCmd,
    },
    /// Profiles from what sandboxes did (`suggest`, from learn mode)
    Profile {
        #[command(subcommand)]
        cmd: crate::profile_cmd::ProfileCmd,
    },
    /// Serve the sandbox to an MCP client over stdio (docs/mcp.md)
    Mcp(Box<Deferred<crate::mcp::Mcp>>),
    /// Keep sandboxes ready and serve tool calls from them (JSON Lines on
    /// stdin/stdout, or on a unix socket); see docs/pool.md
    Serve(Box<Deferred<crate::serve::Serve>>),
    /// One warm sandbox of `runsbx serve`'s pool (internal)
    #[command(hide = true)]
    PoolWorker(Box<Deferred<crate::call_cmd::Call>>),
    /// Forks `runsbx serve`'s pool workers (internal; serve/zygote.rs)
    #[command(hide = true)]
    PoolZygote(Box<Deferred<crate::call_cmd::Call>>),
    /// A call's watchdog, cleaning up after the call's runsbx died
    /// (internal; runsbx_runtime::call::ABANDON_CALL)
    #[command(hide = true)]
    AbandonCall { id: String },
    #[command(flatten)]
    Standard(liboci_cli::StandardCmd),
    #[command(flatten)]
    Common(Box<liboci_cli::CommonCmd>),
    /// Checkpoint a running container: not supported, a sandbox is never
    /// migrated (exit 6)
    Checkpoint(Checkpoint),
}

/// runc's `checkpoint`, under its own name: liboci-cli 0.7 spells it
/// `checkpointt`, which is still accepted but not listed (see [`parse`]).
#[derive(Args, Debug)]
pub struct Checkpoint {
    /// runc's options and the container id, whatever they are
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

/// The command line, parsed as [`Parser::parse`] does (exiting with
/// clap's message on an error), with liboci-cli's `checkpointt` hidden:
/// clap would otherwise list it and suggest it to whoever typed runc's
/// `checkpoint`.
pub fn parse() -> Cli {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    if cmd.find_subcommand("checkpointt").is_some() {
        cmd = cmd.mut_subcommand("checkpointt", |c| c.hide(true));
    }
    let mut matches = cmd.get_matches();
    Cli::from_arg_matches_mut(&mut matches).unwrap_or_else(|e| {
        e.format(&mut <Cli as clap::CommandFactory>::command())
            .exit()
    })
}

#[derive(Args, Debug)]
pub struct Harden {
    /// The bundle directory (with config.json)
    #[arg(long, short, default_value = ".")]
    pub bundle: PathBuf,
}

/// A subcommand's arguments, added to the command line only when that
/// subcommand is the one given (clap's `Command::defer`). Every run of
/// runsbx parses its command line, engines run it several times per
/// container, and building the arguments of `call` (twice: `pool-worker`
/// takes them too), `serve` and `mcp` was most of clap's work each time.
#[derive(Debug)]
pub struct Deferred<T>(pub T);

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_args))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_args_for_update))
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: FromArgMatches> FromArgMatches for Deferred<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Deferred)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

/// `augment` applied to `cmd`, whose description (the variant's doc
/// comment, which `runsbx --help` lists) stays: the arguments' struct has
/// its own, and deferred it would otherwise come last and win.
fn keeping_about(cmd: clap::Command, augment: fn(clap::Command) -> clap::Command) -> clap::Command {
    let about = cmd.get_about().cloned();
    let long_about = cmd.get_long_about().cloned();
    let cmd = augment(cmd);
    let Some(about) = about else {
        return cmd;
    };
    let cmd = cmd.about(about);
    match long_about {
        Some(long_about) => cmd.long_about(long_about),
        None => cmd.long_about(None::<&str>),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn deferred_subcommands_parse_and_keep_their_descriptions() {
        // clap's own checks, over every subcommand's arguments (deferred
        // ones are built for it).
        Cli::command().debug_assert();
        let about = |name: &str, built: bool| {
            let mut cmd = Cli::command();
            if built {
                cmd.build();
            }
            let sub = cmd.find_subcommand(name).unwrap();
            sub.get_about().map(ToString::to_string)
        };
        // What `runsbx --help` lists (nothing built) and `runsbx call
        // --help` shows (built): the variant's description, not its
        // arguments' struct's.
        for built in [false, true] {
            assert_eq!(
                about("call", built).as_deref(),
                Some("Run one command in a fresh sandbox (a tool call) and report how it went")
            );
            assert!(about("serve", built).is_some_and(|a| a.starts_with("Keep sandboxes ready")));
        }
        let cli = Cli::try_parse_from(["runsbx", "call", "--image", "img", "--", "true"]).unwrap();
        let call = match cli.command {
            Command::Call(call) => call.0,
            other => unreachable!("not a call: {other:?}"),
        };
        assert_eq!(call.sandbox.image.as_deref(), Some("img"));
        assert_eq!(call.command, ["true"]);
        // The name a call's watchdog execs runsbx with.
        let cli = Cli::try_parse_from([
            "runsbx",
            "--root",
            "/r",
            runsbx_runtime::call::ABANDON_CALL,
            "call-1",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::AbandonCall { id } if id == "call-1"));
        let err = Cli::try_parse_from(["runsbx", "serve", "--size", "0"]).unwrap_err();
        assert!(err.to_string().contains("--size"), "{err}");
    }
}
