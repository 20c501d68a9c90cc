//! `runsbx call`: the arguments, and the result printed as JSON or as the
//! command's own output.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use runsbx_runtime::call::{self, CallRequest, LiveOutput, StdinFrom};
use runsbx_runtime::{RuntimeError, StateRoot};

/// Run one command in a fresh sandbox and report how it went
#[derive(Args, Debug)]
pub struct Call {
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Environment variable for the command (repeatable); runsbx's own
    /// environment never reaches the sandbox
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The command's stdin: a file, or `-` for runsbx's own (default: empty)
    #[arg(long, value_name = "FILE|-")]
    pub stdin: Option<String>,
    /// A credential the command may use but never see (repeatable): its
    /// value from a file (not readable by others) or runsbx's own
    /// environment; the command gets RUNSBX_SECRET_NAME, a sentinel that the
    /// egress proxy replaces with the value in header H (default
    /// Authorization) of requests to HOST, which must be allowed
    #[arg(
        long = "secret",
        value_name = "NAME=file:PATH|env:VAR,host=HOST[:PORT][,header=H]"
    )]
    pub secrets: Vec<String>,
    /// Learn mode: the result's `learned` also lists every request the
    /// egress proxy let through (HTTPS read through the sandbox's CA), for
    /// `runsbx profile suggest`; it allows nothing more
    #[arg(long)]
    pub learn: bool,
    /// Copy a host file or directory into /workspace (repeatable)
    #[arg(long = "input", short = 'i', value_name = "HOST_PATH[:SANDBOX_PATH]")]
    pub inputs: Vec<String>,
    /// Copy files matching this glob (relative to /workspace) out afterwards (repeatable)
    #[arg(long = "output", short = 'o', value_name = "SANDBOX_GLOB")]
    pub outputs: Vec<String>,
    /// Where --output files are written (default: the current directory)
    #[arg(long, default_value = ".")]
    pub output_dir: PathBuf,
    /// Bytes kept of each of stdout and stderr (the first and last halves; at most 64M)
    #[arg(long, default_value = "1M", allow_hyphen_values = true)]
    pub max_output: String,
    /// Largest --output file copied out
    #[arg(long, default_value = "64M", allow_hyphen_values = true)]
    pub max_output_file: String,
    /// Print one JSON result (schema runsbx.call/v1) instead of the output
    #[arg(long)]
    pub json: bool,
    /// Print JSON Lines while the command runs: {"type": "stdout"|"stderr",
    /// "data", "encoding", "t_ms"} chunks as they come ({"type": "capped"}
    /// once --max-output's head is full), then the JSON result as the last line
    #[arg(long, conflicts_with = "json")]
    pub stream: bool,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What shapes a call's sandbox: `call`'s flags, and `serve`'s for the
/// sandboxes its pool keeps.
#[derive(Args, Debug, Clone)]
pub struct SandboxArgs {
    /// The image to run on (default: python; see `runsbx image ls`)
    #[arg(long, conflicts_with = "rootfs")]
    pub image: Option<String>,
    /// A root filesystem directory to run on instead of an image
    #[arg(long)]
    pub rootfs: Option<PathBuf>,
    /// Run in this session (`runsbx session create`): its /workspace and its
    /// layer over the image persist across calls; its settings are the
    /// call's defaults, which the call may only tighten
    #[arg(long, conflicts_with = "rootfs")]
    pub session: Option<String>,
    /// runsbx's data directory, where images are kept
    #[arg(long, env = "RUNSBX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// A profile the operator config makes selectable (only as strict or stricter)
    #[arg(long)]
    pub profile: Option<String>,
    /// Wall-clock deadline: the whole sandbox is killed when it passes
    /// (default: 30s, or the session's)
    #[arg(long, allow_hyphen_values = true)]
    pub timeout: Option<String>,
    /// Memory limit, no higher than the profile's (e.g. 256M)
    #[arg(long, allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Process limit, no higher than the profile's
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(u64).range(1..))]
    pub pids: Option<u64>,
    #[command(flatten)]
    pub egress: EgressArgs,
}

impl SandboxArgs {
    /// The flags again, each one argument (`--memory=256M`), as `call`
    /// parses them.
    pub fn to_flags(&self) -> Vec<String> {
        let mut flags = Vec::new();
        let mut one = |flag: &str, value: Option<String>| {
            if let Some(v) = value {
                flags.push(format!("--{flag}={v}"));
            }
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        one("image", self.image.clone());
        one("rootfs", path(&self.rootfs));
        one("session", self.session.clone());
        one("data-dir", path(&self.data_dir));
        one("profile", self.profile.clone());
        one("timeout", self.timeout.clone());
        one("memory", self.memory.clone());
        one("pids", self.pids.map(|p| p.to_string()));
        let e = &self.egress;
        flags.extend(e.allow_host.iter().map(|h| format!("--allow-host={h}")));
        flags.extend(e.allow.iter().map(|r| format!("--allow={r}")));
        flags.extend(
            e.proxy_resolve
                .iter()
                .map(|r| format!("--proxy-resolve={r}")),
        );
        flags.extend(
            e.proxy_allow_address
                .iter()
                .map(|a| format!("--proxy-allow-address={a}")),
        );
        flags
    }
}

/// Runs the call; returns runsbx's exit code.
pub fn run(root: &StateRoot, args: Call, config: Option<PathBuf>) -> Result<i32> {
    // A stream ends with the result, as --json prints it.
    let json = args.json || args.stream;
    let req = match request(args, config) {
        Ok(req) => req,
        Err(e) => {
            // Refused before anything ran: the same error shape as a
            // refusal inside the call.
            let message = format!("{e:#}");
            let error = call::CallError::bad_input(message);
            if json {
                print_json(&serde_json::json!({
                    "schema": call::SCHEMA,
                    "status": "error",
                    "error": error,
                }))?;
            } else {
                eprintln!("runsbx: call: {}", error.message);
            }
            return Ok(error.kind.call_exit_code());
        }
    };
    let (result, tails) = call::call(root, &req);
    if json {
        print_json(&result)?;
        return Ok(result.exit_code());
    }
    // The heads went out live; what was cut, then the tails.
    for (stream, tail, name) in [
        (&result.stdout, &tails.stdout, "stdout"),
        (&result.stderr, &tails.stderr, "stderr"),
    ] {
        let Some(s) = stream.as_ref().filter(|s| s.truncated) else {
            continue;
        };
        eprintln!(
            "\nrunsbx: {name} truncated: {} of {} bytes omitted (--max-output)",
            s.omitted_bytes, s.bytes
        );
        if name == "stdout" {
            std::io::stdout().write_all(tail)?;
        } else {
            std::io::stderr().write_all(tail)?;
        }
    }
    for o in &result.outputs {
        if let Some(e) = &o.error {
            eprintln!("runsbx: output {}: {e}", o.path);
        }
    }
    if let Some(e) = &result.error {
        eprintln!("runsbx: call: {}", e.message);
    }
    if result.timed_out {
        eprintln!(
            "runsbx: call: timed out after {} ms; the sandbox was killed",
            result.limits.timeout_ms
        );
    }
    if result.limits.memory_hit == Some(true) {
        eprintln!("runsbx: call: the memory limit was hit (a process was OOM-killed)");
    }
    if result.limits.pids_hit == Some(true) {
        eprintln!("runsbx: call: the pids limit was hit (a fork failed)");
    }
    std::io::stdout().flush()?;
    Ok(result.exit_code())
}

pub(crate) fn request(args: Call, config: Option<PathBuf>) -> Result<CallRequest> {
    let sandbox = args.sandbox;
    let size = |flag: &str, text: &str| -> Result<u64> {
        runsbx_policy::profile::parse_size(text)
            .map_err(|e| anyhow::anyhow!("--{flag} {text:?}: {e}"))
    };
    let max_output = size("max-output", &args.max_output)?;
    CallRequest::check_max_output(max_output)?;
    let max_output_file = size("max-output-file", &args.max_output_file)?;
    if let Some(m) = &sandbox.memory {
        size("memory", m)?;
    }
    let secrets = args
        .secrets
        .iter()
        .map(|s| parse_secret(s))
        .collect::<Result<Vec<_>>>()?;
    let mut env: Vec<(String, String)> = args
        .env
        .iter()
        .map(|e| parse_env(e))
        .collect::<Result<_, _>>()?;
    for (i, s) in secrets.iter().enumerate() {
        let var = format!("{SECRET_PREFIX}{}", s.name);
        if secrets[..i].iter().any(|o| o.name == s.name) {
            anyhow::bail!(
                "--secret {}: given twice; give each secret one name",
                s.name
            );
        }
        if env.iter().any(|(k, _)| *k == var) {
            anyhow::bail!(
                "--secret {}: --env sets {var} too; leave it to the secret",
                s.name
            );
        }
        env.push((var, s.sentinel.clone()));
    }
    Ok(CallRequest {
        image: sandbox.image,
        rootfs: sandbox.rootfs,
        session: sandbox.session,
        data_dir: sandbox.data_dir,
        config,
        profile: sandbox.profile,
        timeout: sandbox.timeout.as_deref().map(parse_duration).transpose()?,
        memory: sandbox.memory,
        pids: sandbox.pids,
        env,
        secrets,
        learn: args.learn,
        stdin: match args.stdin.as_deref() {
            None => StdinFrom::Null,
            Some("-") => StdinFrom::Inherit,
            Some(p) => StdinFrom::File(PathBuf::from(p)),
        },
        inputs: args
            .inputs
            .iter()
            .map(|i| call::Input::parse(i))
            .collect::<Result<_, _>>()?,
        outputs: args.outputs,
        output_dir: args.output_dir,
        max_output: usize::try_from(max_output)?,
        max_output_file,
        egress: sandbox.egress.plan()?,
        command: args.command,
        live: match (args.json, args.stream) {
            (_, true) => LiveOutput::Stream,
            (true, false) => LiveOutput::Quiet,
            (false, false) => LiveOutput::Echo,
        },
    })
}

/// Parses a duration: `30s`, `1.5s`, `500ms`, `2m`, `1h`, or plain seconds.
/// A bad one is invalid input (`--timeout` is each command's deadline).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, RuntimeError> {
    runsbx_policy::profile::parse_duration(text)
        .map_err(|reason| RuntimeError::invalid(format!("--timeout {text:?}"), reason))
}

/// Parses `KEY=VALUE` for `--env`.
fn parse_env(arg: &str) -> Result<(String, String)> {
    match arg.split_once('=') {
        Some((k, v))
            if !k.is_empty()
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                && !k.starts_with(|c: char| c.is_ascii_digit()) =>
        {
            Ok((k.to_owned(), v.to_owned()))
        }
        _ => anyhow::bail!("--env {arg:?}: use KEY=VALUE with a KEY of letters, digits and _"),
    }
}

/// The variable that holds a secret's sentinel in the sandbox.
const SECRET_PREFIX: &str = "RUNSBX_SECRET_";

/// `NAME=file:PATH|env:VAR,host=HOST[:PORT][,header=H]`: the value read
/// now, into runsbx's memory only; a sentinel made for it.
fn parse_secret(arg: &str) -> Result<call::Secret> {
    let bad = |why: String| anyhow::anyhow!("--secret {arg:?}: {why}");
    let mut parts = arg.split(',');
    let (name, source) = parts
        .next()
        .and_then(|p| p.split_once('='))
        .ok_or_else(|| bad("write NAME=file:PATH or NAME=env:VAR, then ,host=HOST".into()))?;
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        || name.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(bad(format!(
            "the name {name:?} must be upper-case letters, digits and _ (it becomes {SECRET_PREFIX}{name})"
        )));
    }
    let (mut host, mut header) = (None, "Authorization".to_owned());
    for part in parts {
        match part.split_once('=') {
            Some(("host", h)) => host = Some(h.to_owned()),
            Some(("header", h))
                if !h.is_empty()
                    && h.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) =>
            {
                header = h.to_owned()
            }
            Some(("header", h)) => return Err(bad(format!("{h:?} is not a header name"))),
            _ => {
                return Err(bad(format!(
                    "{part:?}: only host=HOST[:PORT] and header=NAME follow"
                )))
            }
        }
    }
    let host = host.ok_or_else(|| bad("name the one host it goes to: ,host=HOST".into()))?;
    let (host, port) = match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => match p.parse::<u16>() {
            Ok(p) if p > 0 => (h.to_owned(), Some(p)),
            _ => (host.clone(), None),
        },
        _ => (host.clone(), None),
    };
    let host: call::SecretHost = host
        .parse()
        .map_err(|e| bad(format!("host {host:?}: {e}")))?;
    let value = match source.split_once(':') {
        Some(("file", path)) => secret_file(path).map_err(bad)?,
        Some(("env", var)) => std::env::var(var)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or_else(|| bad(format!("runsbx's environment has no {var}")))?,
        _ => return Err(bad("the value comes from file:PATH or env:VAR".into())),
    };
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(bad(
            "the value holds a line break or NUL, which no header may".into(),
        ));
    }
    Ok(call::Secret {
        sentinel: format!("runsbx-secret-{name}-{}", random_hex()?),
        name: name.to_owned(),
        value,
        host,
        port,
        header,
    })
}

/// A secret file's value (one trailing line break dropped), refused when
/// others may read it: a credential others can read is already leaked.
fn secret_file(path: &str) -> std::result::Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("{path}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{path} is not a file"));
    }
    if meta.permissions().mode() & 0o004 != 0 {
        return Err(format!(
            "{path} is readable by every user: chmod o-r {path}"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let value = text.strip_suffix('\n').unwrap_or(&text);
    let value = value.strip_suffix('\r').unwrap_or(value);
    if value.is_empty() {
        return Err(format!("{path} is empty"));
    }
    Ok(value.to_owned())
}

/// 16 random bytes as hex, for a sentinel no one can guess.
fn random_hex() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The egress flags of `call` and `session create`.
#[derive(Args, Debug, Clone)]
pub struct EgressArgs {
    /// Let the command reach this host through the egress proxy (repeatable):
    /// NAME, NAME:PORT, *.SUFFIX[:PORT]; ports 80 and 443 when none is given
    #[arg(long = "allow-host", value_name = "NAME[:PORT]")]
    pub allow_host: Vec<String>,
    /// Let the command make these requests only (repeatable): "GET,HEAD
    /// NAME[:PORT]/PATH", where `*` in PATH stands within a segment and
    /// `**` across; plain HTTP is checked request by request, and HTTPS to
    /// a host allowed only this way is refused (its requests cannot be read)
    #[arg(long = "allow", value_name = "METHODS NAME[:PORT]/PATH")]
    pub allow: Vec<String>,
    /// Make the proxy resolve NAME to IP instead of asking DNS (repeatable)
    #[arg(long = "proxy-resolve", value_name = "NAME=IP")]
    pub proxy_resolve: Vec<String>,
    /// Exempt this destination from the proxy's refusal of loopback, private
    /// and link-local addresses (repeatable; for a service you run on purpose)
    #[arg(long = "proxy-allow-address", value_name = "IP:PORT")]
    pub proxy_allow_address: Vec<std::net::SocketAddr>,
}

impl EgressArgs {
    /// The egress these options ask for (a bad option is invalid input):
    /// on when any host is allowed; the overrides alone open nothing.
    pub fn plan(&self) -> Result<Option<runsbx_policy::EgressPlan>, RuntimeError> {
        use runsbx_policy::request_rule::Entry;
        // One list for the proxy; each flag keeps to its own form so that
        // a typo never widens a request rule into a whole host.
        for host in &self.allow_host {
            if Entry::parse(host).is_ok_and(|e| e.rule.is_some()) {
                return Err(RuntimeError::invalid(
                    format!("--allow-host {host:?}"),
                    "names methods or a path: use --allow for that",
                ));
            }
        }
        for rule in &self.allow {
            match Entry::parse(rule) {
                Err(reason) => {
                    return Err(RuntimeError::invalid(format!("--allow {rule:?}"), reason))
                }
                Ok(e) if e.rule.is_none() => {
                    return Err(RuntimeError::invalid(
                        format!("--allow {rule:?}"),
                        "names no method or path: write \"METHODS NAME[:PORT]/PATH\", \
                         or allow the host whole with --allow-host",
                    ))
                }
                Ok(_) => {}
            }
        }
        egress(
            self.allow_host.iter().chain(&self.allow).cloned().collect(),
            &self.proxy_resolve,
            self.proxy_allow_address.clone(),
        )
    }
}

fn egress(
    allow: Vec<String>,
    resolve: &[String],
    allow_addresses: Vec<std::net::SocketAddr>,
) -> Result<Option<runsbx_policy::EgressPlan>, RuntimeError> {
    if allow.is_empty() {
        if !resolve.is_empty() || !allow_addresses.is_empty() {
            return Err(RuntimeError::invalid(
                "--proxy-resolve and --proxy-allow-address",
                "need --allow-host or --allow",
            ));
        }
        return Ok(None);
    }
    let mut plan = runsbx_policy::EgressPlan {
        allow,
        allow_addresses,
        ..Default::default()
    };
    for r in resolve {
        let (name, ip) = r.split_once('=').ok_or_else(|| {
            RuntimeError::invalid(format!("--proxy-resolve {r:?}"), "use NAME=IP")
        })?;
        let ip = ip.parse().map_err(|e: std::net::AddrParseError| {
            RuntimeError::invalid(format!("--proxy-resolve {r:?}"), e.to_string())
        })?;
        plan.resolve
            .entry(name.to_ascii_lowercase())
            .or_default()
            .push(ip);
    }
    Ok(Some(plan))
}

pub(crate) fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, value)?;
    writeln!(out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        for bad in ["", "0", "-1s", "abc", "5x", "1e9", "nan", "8d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_args() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        for bad in ["A", "=x", "1A=x", "A-B=x"] {
            assert!(parse_env(bad).is_err(), "{bad}");
        }
    }
}
