//! The command line: runc's commands and global flags, as container
//! engines pass them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
    Call(Box<crate::call_cmd::Call>),
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
    Mcp(Box<crate::mcp::Mcp>),
    Serve(Box<crate::serve::Serve>),
    /// One warm sandbox of `runsbx serve`'s pool (internal)
    #[command(hide = true)]
    PoolWorker(Box<crate::call_cmd::Call>),
    #[command(flatten)]
    Standard(liboci_cli::StandardCmd),
    #[command(flatten)]
    Common(Box<liboci_cli::CommonCmd>),
}

#[derive(Args, Debug)]
pub struct Harden {
    /// The bundle directory (with config.json)
    #[arg(long, short, default_value = ".")]
    pub bundle: PathBuf,
}
