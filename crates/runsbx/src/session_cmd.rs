//! `runsbx session`: sessions whose files persist across calls.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use runsbx_runtime::session::{NewSession, Sessions, Settings};
use runsbx_runtime::sys::userns;
use runsbx_runtime::RuntimeError;

#[derive(Subcommand, Debug)]
pub enum SessionCmd {
    /// Make a session: `runsbx call --session NAME` runs in it
    Create(Box<Create>),
    /// List the sessions
    Ls {
        /// Print a JSON array (schema runsbx.session/v1 objects)
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: Store,
    },
    /// Write a session (settings, workspace, layer) to a tar file
    Export {
        name: String,
        /// The tar file to write (must not exist)
        file: PathBuf,
        #[command(flatten)]
        store: Store,
    },
    /// Make a session from a tar file `session export` wrote
    Import {
        /// The tar file
        file: PathBuf,
        /// The new session's name (default: the exported one's)
        name: Option<String>,
        #[command(flatten)]
        store: Store,
    },
    /// Remove sessions and everything in them (refused while a call runs in one)
    Rm {
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
        #[command(flatten)]
        store: Store,
    },
}

#[derive(Args, Debug)]
pub struct Create {
    /// The session's name (default: `s-` and 12 random hex digits)
    pub name: Option<String>,
    /// The image its calls run on (default: python)
    #[arg(long)]
    pub image: Option<String>,
    /// The bound on what its calls may write, layer and workspace together
    /// (enforced as root: a full disk is ENOSPC inside)
    #[arg(long, default_value = "1G", allow_hyphen_values = true)]
    pub disk: String,
    /// Memory limit of each call (the profile's at most)
    #[arg(long, allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Process limit of each call
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub pids: Option<u64>,
    /// Deadline of each call (default 30s, or the profile's if shorter)
    #[arg(long, allow_hyphen_values = true)]
    pub timeout: Option<String>,
    // Its calls' egress (each call may name a subset of it).
    #[command(flatten)]
    pub egress: crate::call_cmd::EgressArgs,
    /// A profile the operator config makes selectable
    #[arg(long)]
    pub profile: Option<String>,
    /// Print the session as JSON (schema runsbx.session/v1)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: Store,
}

#[derive(Args, Debug)]
pub struct Store {
    /// runsbx's data directory, where images and sessions are kept
    /// (default: /var/lib/runsbx as root, ~/.local/share/runsbx otherwise)
    #[arg(long, env = "RUNSBX_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

impl Store {
    fn open(&self) -> Result<Sessions> {
        Ok(Sessions::open(self.data_dir.as_deref())?)
    }
}

pub fn run(cmd: SessionCmd, config: Option<PathBuf>) -> Result<i32> {
    // Rootless, a session's files belong to the ids of runsbx's own user
    // namespace (the caller's subordinate ones): only there can runsbx
    // remove them.
    userns::reexec_in_own_userns()?;
    match cmd {
        SessionCmd::Create(c) => {
            let new = new_session(&c, config)?;
            let settings = c.store.open()?.create(&new)?;
            let mut out = std::io::stdout().lock();
            if c.json {
                crate::call_cmd::print_json(&settings)?;
            } else {
                writeln!(out, "{}", settings.name).context("write to stdout")?;
            }
        }
        SessionCmd::Ls { json, store } => list(&store.open()?.list()?, json)?,
        SessionCmd::Export { name, file, store } => {
            store.open()?.export(&name, &file, config.as_deref())?;
        }
        SessionCmd::Import { file, name, store } => {
            let settings = store
                .open()?
                .import(&file, name.as_deref(), config.as_deref())?;
            writeln!(std::io::stdout(), "{}", settings.name).context("write to stdout")?;
        }
        SessionCmd::Rm { names, store } => {
            let sessions = store.open()?;
            let mut code = 0;
            for name in &names {
                match sessions.remove(name) {
                    Ok(()) => writeln!(std::io::stdout(), "{name}").context("write to stdout")?,
                    Err(e) => {
                        if code == 0 {
                            code = e.exit_code();
                        }
                        eprintln!("runsbx: error: {:#}", anyhow::Error::from(e));
                    }
                }
            }
            return Ok(code);
        }
    }
    Ok(0)
}

/// The session's settings from its options; a bad one is invalid input
/// (exit 3), as every other refusal of `session create` is.
fn new_session(c: &Create, config: Option<PathBuf>) -> Result<NewSession> {
    let size = |flag: &str, text: &str| {
        runsbx_policy::profile::parse_size(text)
            .map_err(|e| RuntimeError::invalid(format!("--{flag} {text:?}"), e))
    };
    Ok(NewSession {
        name: c.name.clone(),
        image: c.image.clone(),
        disk: Some(size("disk", &c.disk)?),
        memory: c.memory.as_deref().map(|m| size("memory", m)).transpose()?,
        pids: c.pids,
        timeout: c
            .timeout
            .as_deref()
            .map(crate::call_cmd::parse_duration)
            .transpose()?,
        egress: c.egress.plan()?,
        profile: c.profile.clone(),
        data_dir: c.store.data_dir.clone(),
        config,
    })
}

fn list(sessions: &[Settings], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, sessions).context("write JSON to stdout")?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:<12} {:>8}  {:<20}  IN USE",
        "NAME", "IMAGE", "DISK", "CREATED"
    )?;
    for s in sessions {
        let enforced = if s.disk.enforced { "" } else { "*" };
        writeln!(
            out,
            "{:<24} {:<12} {:>7}{enforced}  {:<20}  {}",
            s.name,
            s.image,
            format!("{}M", s.disk.limit_bytes >> 20),
            s.created.format("%Y-%m-%d %H:%M:%S"),
            if s.in_use { "yes" } else { "no" }
        )?;
    }
    if sessions.iter().any(|s| !s.disk.enforced) {
        writeln!(out, "* the disk bound is not enforced (rootless)")?;
    }
    Ok(())
}
