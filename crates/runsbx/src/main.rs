//! runsbx: parse the command line, call one runtime function, map the
//! result to an exit code. The work is in `runsbx-runtime`.

mod call_cmd;
mod cli;
mod commands;
mod image_cmd;
mod logging;
mod mcp;
mod profile_cmd;
mod serve;
mod session_cmd;

use runsbx_runtime::image::ImageError;
use runsbx_runtime::{exit, ErrorKind, RuntimeError};

fn main() {
    runsbx_runtime::sys::signal::restore_default_sigpipe();
    let cli = parse_args();
    let logs_to_file = cli.global.log.is_some();
    let code = match run(cli) {
        Ok(code) => code,
        Err(err) => {
            // Engines read the log file (containerd takes its last error
            // line); people read stderr. `{:#}` keeps the whole cause chain.
            if logs_to_file {
                tracing::error!("{err:#}");
            }
            eprintln!("runsbx: error: {err:#}");
            err.downcast_ref::<RuntimeError>()
                .map(RuntimeError::exit_code)
                .or_else(|| {
                    err.downcast_ref::<ImageError>()
                        .map(|e| ErrorKind::of_image(e).exit_code())
                })
                .or_else(|| err.downcast_ref::<ExitWith>().map(|e| e.code))
                .unwrap_or(exit::FAILURE)
        }
    };
    std::process::exit(code);
}

/// The command line, parsed as `Cli::parse` would. clap builds the whole
/// command tree (every subcommand's arguments) to parse one, and taking it
/// apart again cost about as many instructions as the parse (165,000 of a
/// call's 1.3 million before its sandbox is made, callgrind): the tree is
/// left to the process's exit instead, as are the matches.
fn parse_args() -> cli::Cli {
    use clap::{CommandFactory, FromArgMatches};
    let command: &'static mut clap::Command = Box::leak(Box::new(cli::Cli::command()));
    let mut matches = command
        .try_get_matches_from_mut(std::env::args_os())
        .unwrap_or_else(|e| e.exit());
    let parsed = cli::Cli::from_arg_matches_mut(&mut matches);
    std::mem::forget(matches);
    parsed.unwrap_or_else(|e| e.format(command).exit())
}

/// An error that ends runsbx with the exit code of the runsbx command it
/// ran for it: `runsbx mcp` passes on its `session create`'s.
#[derive(Debug)]
pub struct ExitWith {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ExitWith {}

fn run(cli: cli::Cli) -> anyhow::Result<i32> {
    let g = &cli.global;
    logging::init(g.log.as_deref(), g.log_format.as_deref(), g.debug)?;
    commands::dispatch(cli)
}
