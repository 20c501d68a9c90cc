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
    let cli = cli::parse();
    let logs_to_file = cli.global.log.is_some();
    std::process::exit(exit_code(run(cli), logs_to_file));
}

/// The exit code for a command's outcome, its error (if any) reported.
pub fn exit_code(outcome: anyhow::Result<i32>, logs_to_file: bool) -> i32 {
    match outcome {
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
    }
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
    runsbx_runtime::phase("process up");
    commands::dispatch(cli)
}
