//! `runsbx profile`: profiles written from what sandboxes did.
//! `suggest` reads learn mode's records (`runsbx call --learn --json`
//! results, or the `<id>.json` a profile's `[egress] learn` directory
//! gets) and prints the narrowest profile that would have let them
//! through (see runsbx-policy's suggest.rs).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Subcommand;
use runsbx_policy::suggest::{self, Observations, Seen};
use runsbx_runtime::policy::Policy;
use runsbx_runtime::RuntimeError;
use serde::Deserialize;

#[derive(Subcommand, Debug)]
pub enum ProfileCmd {
    /// Print the narrowest profile that would have allowed what learn mode
    /// saw: the operator's profile with an egress allowlist of exactly the
    /// requests in the records, each with its reason
    Suggest {
        /// Learn mode's records: `runsbx call --learn --json` results, or
        /// the files a profile's `[egress] learn` directory holds
        #[arg(required = true, value_name = "RECORD.json")]
        records: Vec<PathBuf>,
        /// The suggested profile's name
        #[arg(long, default_value = "suggested")]
        name: String,
        /// Write it to this file, which must not exist (default: stdout)
        #[arg(long, short)]
        output: Option<PathBuf>,
    },
}

pub fn run(cmd: ProfileCmd, config: Option<PathBuf>) -> Result<i32> {
    match cmd {
        ProfileCmd::Suggest {
            records,
            name,
            output,
        } => {
            let mut obs = Observations::default();
            for path in &records {
                read_record(path, &mut obs)?;
            }
            let base = Policy::load(config.as_deref())?.profile;
            let text = suggest::render(&base, &name, &obs)
                .map_err(|e| RuntimeError::invalid("runsbx profile suggest", e.to_string()))?;
            match output {
                None => std::io::stdout().write_all(text.as_bytes())?,
                Some(path) => write_new(&path, &text)?,
            }
            Ok(0)
        }
    }
}

/// The parts of a record that the suggestion reads; both kinds have them.
#[derive(Deserialize)]
struct Record {
    id: Option<String>,
    learned: Option<Learned>,
    egress: Option<Egress>,
    seccomp: Option<Seccomp>,
}

#[derive(Deserialize)]
struct Learned {
    requests: Vec<Request>,
    #[serde(default)]
    dropped: u64,
    #[serde(default)]
    resolve: BTreeMap<String, Vec<IpAddr>>,
    #[serde(default)]
    allow_addresses: Vec<SocketAddr>,
}

#[derive(Deserialize)]
struct Request {
    method: String,
    host: String,
    port: u16,
    path: Option<String>,
    count: u64,
}

#[derive(Deserialize)]
struct Egress {
    #[serde(default)]
    denied: Vec<Denied>,
}

#[derive(Deserialize)]
struct Denied {
    method: String,
    host: String,
    port: u16,
    #[serde(default)]
    path: String,
    reason: DenyReason,
}

#[derive(Deserialize)]
struct DenyReason {
    code: String,
}

#[derive(Deserialize)]
struct Seccomp {
    #[serde(default)]
    denied: Vec<SyscallDenied>,
}

#[derive(Deserialize)]
struct SyscallDenied {
    syscall: String,
    process: String,
    count: u64,
}

/// Adds what the record at `path` saw to `obs`.
fn read_record(path: &Path, obs: &mut Observations) -> Result<()> {
    let bad = |reason: String| RuntimeError::invalid(format!("record {path:?}"), reason);
    let text = std::fs::read(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    let record: Record = serde_json::from_slice(&text)
        .map_err(|e| bad(format!("is not a call result or learn record ({e})")))?;
    let Some(learned) = record.learned else {
        return Err(bad(
            "has no `learned` part: it is not from learn mode; run the call again with --learn"
                .to_owned(),
        )
        .into());
    };
    let source = match &record.id {
        Some(id) => format!("{} (`{id}`)", path.display()),
        None => path.display().to_string(),
    };
    if learned.dropped > 0 {
        // Fail closed: what was not kept is not allowed.
        eprintln!(
            "runsbx: warning: {source}: {} distinct requests past the record's bound were not kept, \
             and are not allowed by the suggestion",
            learned.dropped
        );
    }
    obs.seen.extend(learned.requests.into_iter().map(|r| Seen {
        method: r.method,
        host: r.host,
        port: r.port,
        path: r.path,
        count: r.count,
    }));
    for (name, ips) in learned.resolve {
        obs.resolve.entry(name).or_insert(ips);
    }
    for a in learned.allow_addresses {
        if !obs.allow_addresses.contains(&a) {
            obs.allow_addresses.push(a);
        }
    }
    for d in record.egress.map(|e| e.denied).unwrap_or_default() {
        obs.refused.push(format!(
            "{} {}:{}{}: {}",
            d.method, d.host, d.port, d.path, d.reason.code
        ));
    }
    for d in record.seccomp.map(|s| s.denied).unwrap_or_default() {
        let times = if d.count == 1 { "time" } else { "times" };
        obs.syscalls.push(format!(
            "{} by {}, {} {times}",
            d.syscall, d.process, d.count
        ));
    }
    obs.sources.push(source);
    Ok(())
}

/// Writes `text` to `path`, which must not exist.
fn write_new(path: &Path, text: &str) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| {
            RuntimeError::invalid(
                format!("--output {path:?}"),
                format!("{e} (name a file that does not exist yet)"),
            )
        })?;
    file.write_all(text.as_bytes())?;
    Ok(())
}
