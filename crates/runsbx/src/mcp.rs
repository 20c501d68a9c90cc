//! `runsbx mcp`: an MCP server on stdio that gives one client the sandbox
//! as tools (docs/mcp.md). The operator's flags decide the image, limits
//! and allowlist of the connection's session; a client's arguments can only
//! tighten them. The order of a connection's life:
//!
//! 1. make the session (`runsbx session create --json`), or check the
//!    operator's `--session NAME`;
//! 2. serve the tools until the client closes stdin or the server gets
//!    SIGTERM, SIGINT or SIGHUP;
//! 3. SIGTERM to every call still running (each kills its sandbox);
//! 4. remove the sessions this server made.

mod runner;
mod schema;
mod sessions;
mod tools;

use std::ffi::OsString;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::ServiceExt;
use runsbx_runtime::RuntimeError;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{watch, Notify, RwLock};

/// How long the server's end waits for its running calls after their
/// SIGTERM (each kills its sandbox and prints its result at once).
const CALLS_GRACE: Duration = Duration::from_secs(10);

/// Serve the sandbox to an MCP client over stdio
#[derive(Args, Debug)]
pub struct Mcp {
    /// The image the connection's session runs on (default: python)
    #[arg(long)]
    pub image: Option<String>,
    /// Memory limit of every call (e.g. 512M); a client may only lower it
    #[arg(long, allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Process limit of every call; a client may only lower it
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub pids: Option<u64>,
    /// Deadline of every call (default 30s); a client may only shorten it
    #[arg(long, allow_hyphen_values = true)]
    pub timeout: Option<String>,
    /// Size of the session's writable space (default 1G)
    #[arg(long, allow_hyphen_values = true)]
    pub disk: Option<String>,
    /// A host the sandbox may reach through the egress proxy (repeatable):
    /// NAME, NAME:PORT, *.SUFFIX[:PORT]
    #[arg(long = "allow-host", value_name = "NAME[:PORT]")]
    pub allow_host: Vec<String>,
    /// Only these requests (repeatable): "GET,HEAD NAME[:PORT]/PATH", as
    /// `runsbx call --allow`
    #[arg(long = "allow", value_name = "METHODS NAME[:PORT]/PATH")]
    pub allow: Vec<String>,
    /// Make the proxy resolve NAME to IP (repeatable; needs --allow-host)
    #[arg(long = "proxy-resolve", value_name = "NAME=IP")]
    pub proxy_resolve: Vec<String>,
    /// Exempt this destination from the proxy's address checks (repeatable;
    /// needs --allow-host)
    #[arg(long = "proxy-allow-address", value_name = "IP:PORT")]
    pub proxy_allow_address: Vec<String>,
    /// Serve this existing session, with its own image and limits, and keep
    /// it (default: a fresh session per connection, removed at its end)
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with_all = [
            "image", "memory", "pids", "timeout", "disk", "allow_host", "allow", "proxy_resolve",
            "proxy_allow_address", "allow_session_tools",
        ]
    )]
    pub session: Option<String>,
    /// Offer the create_session and close_session tools (at most 8 sessions
    /// per connection, each with these settings, removed at its end)
    #[arg(long)]
    pub allow_session_tools: bool,
    /// Bytes kept of each of a call's stdout and stderr, and the largest
    /// file read_file returns
    #[arg(long, default_value = "1M", allow_hyphen_values = true)]
    pub max_output: String,
    /// Run every call cold, instead of in the next sandbox of the session's
    /// pool (`runsbx serve --session`, made between calls; docs/pool.md)
    #[arg(long)]
    pub no_pool: bool,
}

impl Mcp {
    /// `runsbx session create` flags for the operator's settings.
    fn create_flags(&self) -> Vec<OsString> {
        let mut flags = Vec::new();
        let mut one =
            |flag: &str, value: &str| flags.push(OsString::from(format!("--{flag}={value}")));
        for (flag, value) in [
            ("image", &self.image),
            ("memory", &self.memory),
            ("timeout", &self.timeout),
            ("disk", &self.disk),
        ] {
            if let Some(v) = value {
                one(flag, v);
            }
        }
        if let Some(p) = self.pids {
            one("pids", &p.to_string());
        }
        for h in &self.allow_host {
            one("allow-host", h);
        }
        for r in &self.allow {
            one("allow", r);
        }
        for r in &self.proxy_resolve {
            one("proxy-resolve", r);
        }
        for a in &self.proxy_allow_address {
            one("proxy-allow-address", a);
        }
        flags
    }
}

/// Runs the server until the client goes; returns runsbx's exit code.
pub fn run(args: Mcp, root: Option<PathBuf>, config: Option<PathBuf>) -> Result<i32> {
    let max_output_bytes = runsbx_policy::profile::parse_size(&args.max_output)
        .map_err(|e| RuntimeError::invalid(format!("--max-output {:?}", args.max_output), e))?;
    runsbx_runtime::call::CallRequest::check_max_output(max_output_bytes)?;
    // A client that goes away mid-reply must not kill the server with
    // SIGPIPE before it removes the session: writes fail with EPIPE
    // instead. Each runsbx child restores the default for itself.
    // SAFETY: setting a signal's disposition to SIG_IGN has no handler to
    // race with.
    unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    }
    .context("ignore SIGPIPE")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let runner =
        runner::Runner::new(root, config, !args.no_pool).context("find runsbx's own binary")?;
    let result = rt.block_on(serve(args, runner, max_output_bytes));
    // A blocking read of stdin may still be pending; nothing is left to do.
    rt.shutdown_background();
    result.map(|()| 0)
}

async fn serve(args: Mcp, runner: runner::Runner, max_output_bytes: u64) -> Result<()> {
    // Installed first: a signal that comes while the session is being made
    // ends the server right after, and the session is removed.
    let mut term = signal(SignalKind::terminate()).context("handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("handle SIGINT")?;
    let mut hup = signal(SignalKind::hangup()).context("handle SIGHUP")?;

    let create_flags = args.create_flags();
    let sessions = sessions::Sessions::open(&runner, args.session.clone(), create_flags).await?;
    let (stop, shutdown) = watch::channel(false);
    let server = tools::Server::new(
        tools::Ctx {
            runner: runner.clone(),
            sessions,
            max_output: args.max_output.clone(),
            max_output_bytes,
            shutdown,
            running: RwLock::new(()),
        },
        args.allow_session_tools,
    );
    let ctx = server.ctx();

    let eof = Arc::new(Notify::new());
    let stdin = EofNotice {
        inner: tokio::io::stdin(),
        eof: eof.clone(),
    };
    let transport = AsyncRwTransport::new_server(stdin, tokio::io::stdout());
    let ended = async {
        let service = server
            .serve(transport)
            .await
            .context("MCP initialization")?;
        let quit = service.waiting().await;
        tracing::info!(?quit, "mcp: the client closed the connection");
        anyhow::Ok(())
    };
    let served = tokio::select! {
        r = ended => r,
        () = eof.notified() => {
            tracing::info!("mcp: stdin closed");
            Ok(())
        }
        _ = term.recv() => { tracing::info!("mcp: SIGTERM"); Ok(()) }
        _ = int.recv() => { tracing::info!("mcp: SIGINT"); Ok(()) }
        _ = hup.recv() => { tracing::info!("mcp: SIGHUP"); Ok(()) }
    };
    // Calls still running get SIGTERM, and a while to print their results.
    let _ = stop.send(true);
    if tokio::time::timeout(CALLS_GRACE, ctx.running.write())
        .await
        .is_err()
    {
        tracing::warn!("mcp: calls still running {CALLS_GRACE:?} after SIGTERM");
    }
    let removed = ctx.sessions.remove_all(&ctx.runner).await;
    served.and(removed)
}

/// stdin, telling when it reaches its end: the client is gone, so the
/// server stops at once rather than after the SDK's drain of replies that
/// no one will read.
struct EofNotice<R> {
    inner: R,
    eof: Arc<Notify>,
}

impl<R: AsyncRead + Unpin> AsyncRead for EofNotice<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            if buf.filled().len() == before && buf.remaining() > 0 {
                self.eof.notify_one();
            }
        }
        polled
    }
}
