//! One short function per command: arguments in, one runtime call, result
//! out.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use liboci_cli::{CommonCmd, StandardCmd};
use runsbx_runtime::oci_spec::runtime::LinuxResources;
use runsbx_runtime::{
    ops::{self, check, exec, features, query, spec, update},
    state::root,
    sys::signal,
    StateRoot,
};

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> Result<i32> {
    let root_path = cli.global.root.clone().unwrap_or_else(root::default_root);
    let root = || StateRoot::open(&root_path);
    match cli.command {
        Command::Call(a) => return crate::call_cmd::run(&root()?, a.0, cli.global.config.clone()),
        Command::Harden(a) => {
            let hardened = ops::harden_bundle(&a.bundle, cli.global.config.as_deref())?;
            print_json(&serde_json::json!({
                "changes": hardened.changes,
                "attestation": hardened.attestation,
                "config": hardened.spec,
            }))?;
        }
        Command::Image { cmd } => return crate::image_cmd::run(cmd),
        Command::Session { cmd } => return crate::session_cmd::run(cmd, cli.global.config.clone()),
        Command::Profile { cmd } => return crate::profile_cmd::run(cmd, cli.global.config.clone()),
        Command::Serve(a) => return crate::serve::run(a.0, &cli.global),
        Command::PoolWorker(a) => {
            return crate::serve::worker(&root()?, a.0, cli.global.config.clone())
        }
        Command::PoolZygote(a) => {
            let logs_to_file = cli.global.log.is_some();
            return crate::serve::zygote(&root()?, a.0, cli.global.config.clone(), logs_to_file);
        }
        Command::AbandonCall { id } => {
            return Ok(runsbx_runtime::call::abandon_call(&root()?, &id))
        }
        Command::Mcp(a) => {
            return crate::mcp::run(a.0, cli.global.root.clone(), cli.global.config.clone())
        }
        Command::Checkpoint(_) => return Err(checkpoint_unsupported()),
        Command::Check => {
            let findings = check::host();
            let mut out = std::io::stdout().lock();
            for f in &findings {
                writeln!(
                    out,
                    "{} {:<28} {}",
                    if f.ok { "ok  " } else { "MISS" },
                    f.name,
                    f.detail
                )?;
            }
            if findings.iter().any(|f| !f.ok && f.required) {
                return Ok(runsbx_runtime::exit::UNSUPPORTED);
            }
        }
        Command::Standard(cmd) => match cmd {
            StandardCmd::Create(a) => {
                let opts = ops::CreateOptions {
                    bundle: a.bundle,
                    pid_file: a.pid_file,
                    console_socket: a.console_socket,
                    preserve_fds: a.preserve_fds,
                    no_pivot: a.no_pivot,
                    config: cli.global.config.clone(),
                };
                ops::create(&root()?, &a.container_id, &opts)?;
            }
            StandardCmd::Start(a) => ops::start(&root()?, &a.container_id)?,
            StandardCmd::State(a) => print_json(&query::state(&root()?, &a.container_id)?)?,
            StandardCmd::Kill(a) => {
                let sig = signal::parse(&a.signal)?;
                ops::kill(&root()?, &a.container_id, sig, a.all)?;
            }
            StandardCmd::Delete(a) => ops::delete(&root()?, &a.container_id, a.force)?,
        },
        Command::Common(cmd) => match *cmd {
            CommonCmd::Run(a) => {
                let opts = ops::CreateOptions {
                    bundle: a.bundle,
                    pid_file: a.pid_file,
                    console_socket: a.console_socket,
                    preserve_fds: a.preserve_fds,
                    no_pivot: a.no_pivot,
                    config: cli.global.config.clone(),
                };
                return Ok(ops::run(
                    &root()?,
                    &a.container_id,
                    &opts,
                    a.detach,
                    a.keep,
                )?);
            }
            CommonCmd::Exec(a) => {
                let opts = exec::ExecOptions {
                    process: a.process,
                    args: a.command,
                    env: a.env,
                    cwd: a.cwd,
                    user: a.user.map(|(u, _)| u),
                    group: a.user.and_then(|(_, g)| g),
                    additional_gids: a.additional_gids,
                    console_socket: a.console_socket,
                    detach: a.detach,
                    pid_file: a.pid_file,
                    preserve_fds: a.preserve_fds,
                    caps: a.cap,
                    ignore_paused: a.ignore_paused,
                    sub_cgroup: a.cgroup,
                    config: cli.global.config.clone(),
                };
                return Ok(exec::exec(&root()?, &a.container_id, &opts)?);
            }
            CommonCmd::Ps(a) => ps(&root()?, &a.container_id, &a.format, &a.ps_options)?,
            CommonCmd::List(a) => list(&root()?, &a.format, a.quiet)?,
            CommonCmd::Pause(a) => ops::pause(&root()?, &a.container_id)?,
            CommonCmd::Resume(a) => ops::resume(&root()?, &a.container_id)?,
            CommonCmd::Events(a) => {
                anyhow::ensure!(
                    a.stats,
                    "events: only `--stats` (one snapshot) is supported; poll it for a stream"
                );
                print_json(&query::stats(&root()?, &a.container_id)?)?;
            }
            CommonCmd::Update(a) => {
                let resources = update_resources(&a)?;
                update::update(&root()?, &a.container_id, &resources)?;
            }
            CommonCmd::Features(_) => print_json(&features::features())?,
            CommonCmd::Spec(a) => {
                let dir = a.bundle.unwrap_or_else(|| PathBuf::from("."));
                spec::write(&dir, &spec::default_spec(a.rootless)?)?;
            }
            CommonCmd::Checkpointt(_) => return Err(checkpoint_unsupported()),
        },
    }
    Ok(0)
}

/// runc's `checkpoint` (and liboci-cli's `checkpointt`): exit 6, before
/// the container is looked at, so that nothing is touched.
fn checkpoint_unsupported() -> anyhow::Error {
    runsbx_runtime::RuntimeError::Unsupported {
        what: "checkpoint".to_owned(),
        reason: "runsbx does not checkpoint or restore a sandbox (it never migrates one); \
                 files that must outlive a call belong in a session (`runsbx session create`)"
            .to_owned(),
    }
    .into()
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).context("write JSON to stdout")?;
    writeln!(out).context("write to stdout")?;
    Ok(())
}

fn list(root: &StateRoot, format: &str, quiet: bool) -> Result<()> {
    let states = query::list(root)?;
    let mut out = std::io::stdout().lock();
    if quiet {
        for s in &states {
            writeln!(out, "{}", s.id)?;
        }
        return Ok(());
    }
    match format {
        "json" => {
            serde_json::to_writer(&mut out, &states)?;
            writeln!(out)?;
        }
        "table" => {
            writeln!(out, "ID\tPID\tSTATUS\tBUNDLE\tCREATED\tOWNER")?;
            for s in &states {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}\t{}\t{}",
                    s.id,
                    s.pid,
                    s.status,
                    s.bundle.display(),
                    s.created,
                    s.owner
                )?;
            }
        }
        other => anyhow::bail!("list --format {other:?}: use `table` or `json`"),
    }
    Ok(())
}

fn ps(root: &StateRoot, id: &str, format: &str, options: &[String]) -> Result<()> {
    let pids = query::pids(root, id)?;
    match format {
        "json" => print_json(&pids),
        "table" => {
            // As runc: the host's ps, filtered to the container's pids.
            let args: Vec<String> = if options.is_empty() {
                vec!["-ef".to_owned()]
            } else {
                options.to_vec()
            };
            let output = std::process::Command::new("ps")
                .args(&args)
                .output()
                .context("run ps")?;
            let text = String::from_utf8_lossy(&output.stdout);
            let mut lines = text.lines();
            let header = lines.next().unwrap_or_default();
            let pid_col = header
                .split_whitespace()
                .position(|h| h == "PID")
                .context("ps output has no PID column")?;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{header}")?;
            for line in lines {
                let pid = line
                    .split_whitespace()
                    .nth(pid_col)
                    .and_then(|p| p.parse().ok());
                if pid.is_some_and(|p: i32| pids.contains(&p)) {
                    writeln!(out, "{line}")?;
                }
            }
            Ok(())
        }
        other => anyhow::bail!("ps --format {other:?}: use `table` or `json`"),
    }
}

fn update_resources(a: &liboci_cli::Update) -> Result<LinuxResources> {
    use runsbx_runtime::oci_spec::runtime::{
        LinuxCpuBuilder, LinuxMemoryBuilder, LinuxPidsBuilder, LinuxResourcesBuilder,
    };
    if let Some(path) = &a.resources {
        let text = if path.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin()).context("read resources from stdin")?
        } else {
            std::fs::read_to_string(path).with_context(|| format!("read resources {path:?}"))?
        };
        return serde_json::from_str(&text)
            .map_err(|e| {
                runsbx_runtime::RuntimeError::invalid(
                    format!("resources {path:?}"),
                    format!("not a valid linux.resources object: {e}"),
                )
            })
            .map_err(Into::into);
    }
    let mut b = LinuxResourcesBuilder::default();
    if a.memory.is_some() || a.memory_swap.is_some() || a.memory_reservation.is_some() {
        let mut m = LinuxMemoryBuilder::default();
        if let Some(v) = a.memory {
            m = m.limit(v as i64);
        }
        if let Some(v) = a.memory_swap {
            m = m.swap(v);
        }
        if let Some(v) = a.memory_reservation {
            m = m.reservation(v as i64);
        }
        b = b.memory(m.build()?);
    }
    if a.cpu_period.is_some()
        || a.cpu_quota.is_some()
        || a.cpu_share.is_some()
        || a.cpuset_cpus.is_some()
        || a.cpuset_mems.is_some()
    {
        let mut c = LinuxCpuBuilder::default();
        if let Some(v) = a.cpu_period {
            c = c.period(v);
        }
        if let Some(v) = a.cpu_quota {
            c = c.quota(v as i64);
        }
        if let Some(v) = a.cpu_share {
            c = c.shares(v);
        }
        if let Some(v) = &a.cpuset_cpus {
            c = c.cpus(v.clone());
        }
        if let Some(v) = &a.cpuset_mems {
            c = c.mems(v.clone());
        }
        b = b.cpu(c.build()?);
    }
    if let Some(limit) = a.pids_limit {
        b = b.pids(LinuxPidsBuilder::default().limit(limit).build()?);
    }
    Ok(b.build()?)
}
