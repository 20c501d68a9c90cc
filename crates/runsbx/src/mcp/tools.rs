//! The MCP tools. Each one is a `runsbx call --json --session NAME` (see
//! runner.rs) and returns that call's outcome as structured content, with
//! what the tool adds (a file's content, a listing). A client's arguments
//! can only tighten: the session carries the operator's image, limits and
//! allowlist, and the call refuses anything wider (exit 125, returned as a
//! tool error with runsbx's message).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::schema_for_output;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{watch, RwLock};

use super::runner::{CallSpec, Runner};
use super::schema::{
    CloseSession, CreateSession, Encoding, Entry, ListFiles, ListOutcome, Outcome, OutputJson,
    ReadFile, ReadOutcome, RunCommand, RunPython, SessionOutcome, Tighten, ToolError, WriteFile,
    WriteOutcome,
};
use super::sessions::Sessions;

/// The listing script list_files runs in the sandbox with python3.
const LIST_FILES_PY: &str = include_str!("list_files.py");

/// list_files' deepest descent.
const MAX_DEPTH: u32 = 8;

/// What every tool needs, shared by the tasks serving the client.
#[derive(Debug)]
pub struct Ctx {
    pub runner: Runner,
    pub sessions: Sessions,
    /// The operator's --max-output, as given (passed to every call).
    pub max_output: String,
    /// The same in bytes: also the largest file read_file returns.
    pub max_output_bytes: u64,
    /// Becomes true when the server stops: running calls get SIGTERM.
    pub shutdown: watch::Receiver<bool>,
    /// Held shared by every running call: the server's end takes it
    /// exclusively to wait for them.
    pub running: RwLock<()>,
}

#[derive(Debug, Clone)]
pub struct Server {
    ctx: Arc<Ctx>,
    tool_router: ToolRouter<Self>,
}

/// What the listing script prints.
#[derive(Debug, Deserialize)]
struct Listing {
    path: Option<String>,
    #[serde(default)]
    entries: Vec<Entry>,
    #[serde(default)]
    truncated: bool,
    error: Option<String>,
}

#[tool_router]
impl Server {
    pub fn new(ctx: Ctx, session_tools: bool) -> Self {
        let mut tool_router = Self::tool_router();
        if !session_tools {
            tool_router.remove_route("create_session");
            tool_router.remove_route("close_session");
        }
        Self {
            ctx: Arc::new(ctx),
            tool_router,
        }
    }

    /// What the tools share, for the server's shutdown.
    pub fn ctx(&self) -> Arc<Ctx> {
        self.ctx.clone()
    }

    /// Run a shell command in a fresh sandbox on the session's /workspace.
    #[tool(
        description = "Run a shell command (`sh -c`) in a fresh sandbox whose /workspace (and \
                       home, and what pip installs) persist in this connection's session. No \
                       network except the hosts the operator allows. Returns exit_code, \
                       stdout, stderr (capped; `truncated` says so), timed_out, the egress \
                       proxy's denials and the isolation layers in force. A non-zero exit is \
                       a result, not an error.",
        output_schema = schema_for_output::<Outcome>()
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunCommand>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = match self.ctx.sessions.resolve(args.session.as_deref()) {
            Ok(session) => {
                let spec = CallSpec {
                    flags: self.flags(&args.limits, &args.env),
                    session,
                    command: vec!["sh".into(), "-c".into(), args.command],
                };
                self.call(&spec, &context).await.0
            }
            Err(e) => Outcome::failed(&self.ctx.sessions.default, e),
        };
        reply(&outcome, outcome.is_error())
    }

    /// Run Python code in a fresh sandbox on the session's /workspace.
    #[tool(
        description = "Run Python code with the image's python3 in a fresh sandbox on this \
                       connection's session (/workspace persists). Returns exit_code, stdout, \
                       stderr (capped), timed_out, egress denials and the isolation layers. \
                       Print what you want to see.",
        output_schema = schema_for_output::<Outcome>()
    )]
    async fn run_python(
        &self,
        Parameters(args): Parameters<RunPython>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.run_python_outcome(args, &context).await;
        reply(&outcome, outcome.is_error())
    }

    /// Write a file into the session's /workspace.
    #[tool(
        description = "Write a file into /workspace of this connection's session (replacing \
                       it if it exists). Content is UTF-8 text, or base64 with encoding \
                       \"base64\".",
        output_schema = schema_for_output::<WriteOutcome>()
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteFile>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.write_file_outcome(args, &context).await;
        reply(&outcome, outcome.call.is_error())
    }

    /// Read a file from the session's /workspace.
    #[tool(
        description = "Read a regular file under /workspace of this connection's session. \
                       Text comes back as it is (encoding \"utf-8\"), anything else as base64. \
                       Files larger than the server's --max-output are refused; read a part \
                       with run_command.",
        output_schema = schema_for_output::<ReadOutcome>()
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadFile>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.read_file_outcome(args, &context).await;
        reply(&outcome, outcome.call.is_error())
    }

    /// List a directory in the session's sandbox.
    #[tool(
        description = "List a directory in this connection's sandbox (default /workspace): \
                       each entry's path, type (file, dir, symlink, other) and size, down to \
                       `depth` levels. Runs python3 in the sandbox.",
        output_schema = schema_for_output::<ListOutcome>()
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListFiles>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let outcome = self.list_files_outcome(args, &context).await;
        reply(&outcome, outcome.call.is_error())
    }

    /// Make another session for this connection.
    #[tool(
        description = "Make another session (its own /workspace, home and installed \
                       packages) with the operator's image, limits and allowlist. Pass its \
                       name as `session` to the other tools. It is removed by close_session \
                       or when this client disconnects.",
        output_schema = schema_for_output::<SessionOutcome>()
    )]
    async fn create_session(&self, Parameters(args): Parameters<CreateSession>) -> CallToolResult {
        let ctx = &self.ctx;
        let outcome = match ctx.sessions.create(&ctx.runner, args.name.as_deref()).await {
            Ok(details) => SessionOutcome {
                session: details
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                details: Some(details),
                closed: false,
                error: None,
            },
            Err(e) => SessionOutcome {
                session: args.name.unwrap_or_default(),
                details: None,
                closed: false,
                error: Some(e),
            },
        };
        reply(&outcome, outcome.error.is_some())
    }

    /// Remove a session this connection made.
    #[tool(
        description = "Remove a session this connection made with create_session, and every \
                       file in it.",
        output_schema = schema_for_output::<SessionOutcome>()
    )]
    async fn close_session(&self, Parameters(args): Parameters<CloseSession>) -> CallToolResult {
        let ctx = &self.ctx;
        let error = ctx.sessions.close(&ctx.runner, &args.name).await.err();
        let outcome = SessionOutcome {
            session: args.name,
            details: None,
            closed: error.is_none(),
            error,
        };
        reply(&outcome, outcome.error.is_some())
    }
}

/// What the client is told at initialization.
const INSTRUCTIONS: &str = "runsbx: each tool call runs in a fresh sandbox (its own processes, \
    network and /tmp) on this connection's session, whose /workspace, home and installed \
    packages persist between calls. Commands run in /workspace. There is no network except \
    hosts the operator allowed (through a proxy; refusals are listed in `egress.denied`). \
    Limits are the operator's; a tool argument may only lower them.";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("runsbx", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

impl Server {
    /// The call flags every tool passes, and the tightening a client asked
    /// for. Each is one argument (`--memory=…`), so a value is never read
    /// as a flag.
    fn flags(&self, limits: &Tighten, env: &BTreeMap<String, String>) -> Vec<OsString> {
        let mut flags = vec![OsString::from(format!(
            "--max-output={}",
            self.ctx.max_output
        ))];
        if let Some(t) = limits.timeout_seconds {
            // Plain seconds; runsbx refuses a value that is not a positive
            // duration, and one longer than the session's.
            flags.push(format!("--timeout={t}").into());
        }
        if let Some(m) = &limits.memory {
            flags.push(format!("--memory={m}").into());
        }
        if let Some(p) = limits.pids {
            flags.push(format!("--pids={p}").into());
        }
        for (k, v) in env {
            flags.push(format!("--env={k}={v}").into());
        }
        flags
    }

    /// Runs the call; SIGTERM to it when the client cancels the request or
    /// the server stops.
    async fn call(
        &self,
        spec: &CallSpec,
        context: &RequestContext<RoleServer>,
    ) -> (Outcome, Vec<OutputJson>) {
        let _running = self.ctx.running.read().await;
        if *self.ctx.shutdown.borrow() {
            let e = ToolError::new("refused", "the server is stopping");
            return (Outcome::failed(&spec.session, e), Vec::new());
        }
        let ct = context.ct.clone();
        let mut shutdown = self.ctx.shutdown.clone();
        let cancel = async move {
            tokio::select! {
                () = ct.cancelled() => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        };
        match self.ctx.runner.call(spec, cancel).await {
            Ok(done) => Outcome::of_call(&spec.session, &done),
            Err(e) => (
                Outcome::failed(
                    &spec.session,
                    ToolError::failure(format!("run runsbx call: {e}")),
                ),
                Vec::new(),
            ),
        }
    }

    async fn run_python_outcome(
        &self,
        args: RunPython,
        context: &RequestContext<RoleServer>,
    ) -> Outcome {
        let session = match self.ctx.sessions.resolve(args.session.as_deref()) {
            Ok(s) => s,
            Err(e) => return Outcome::failed(&self.ctx.sessions.default, e),
        };
        let staged = match Staged::new("program.py", args.code.as_bytes()) {
            Ok(s) => s,
            Err(e) => return Outcome::failed(&session, e),
        };
        let mut flags = self.flags(&args.limits, &args.env);
        flags.push(prefixed("--stdin=", &staged.file));
        let spec = CallSpec {
            session,
            flags,
            command: vec!["python3".into(), "-".into()],
        };
        self.call(&spec, context).await.0
    }

    async fn write_file_outcome(
        &self,
        args: WriteFile,
        context: &RequestContext<RoleServer>,
    ) -> WriteOutcome {
        let fail = |session: &str, path: &str, e: ToolError| WriteOutcome {
            path: path.to_owned(),
            bytes: 0,
            call: Outcome::failed(session, e),
        };
        let session = match self.ctx.sessions.resolve(args.session.as_deref()) {
            Ok(s) => s,
            Err(e) => return fail(&self.ctx.sessions.default, &args.path, e),
        };
        let rel = match in_workspace(&args.path) {
            Ok(rel) => rel,
            Err(e) => return fail(&session, &args.path, e),
        };
        let content = match args.encoding {
            Encoding::Utf8 => args.content.into_bytes(),
            Encoding::Base64 => {
                match base64::engine::general_purpose::STANDARD.decode(args.content.as_bytes()) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        let e = ToolError::bad_input(format!("content is not valid base64: {e}"));
                        return fail(&session, &rel, e);
                    }
                }
            }
        };
        let staged = match Staged::new("content", &content) {
            Ok(s) => s,
            Err(e) => return fail(&session, &rel, e),
        };
        let mut flags = self.flags(&Tighten::default(), &BTreeMap::new());
        let mut input = OsString::from("--input=");
        input.push(staged.file.as_os_str());
        input.push(":");
        input.push(&rel);
        flags.push(input);
        let spec = CallSpec {
            session,
            flags,
            command: vec!["true".into()],
        };
        let (call, _) = self.call(&spec, context).await;
        WriteOutcome {
            path: rel,
            bytes: if call.is_error() {
                0
            } else {
                content.len() as u64
            },
            call,
        }
    }

    async fn read_file_outcome(
        &self,
        args: ReadFile,
        context: &RequestContext<RoleServer>,
    ) -> ReadOutcome {
        let fail = |session: &str, path: &str, e: ToolError| ReadOutcome {
            path: path.to_owned(),
            content: None,
            encoding: None,
            bytes: None,
            call: Outcome::failed(session, e),
        };
        let session = match self.ctx.sessions.resolve(args.session.as_deref()) {
            Ok(s) => s,
            Err(e) => return fail(&self.ctx.sessions.default, &args.path, e),
        };
        let rel = match in_workspace(&args.path) {
            Ok(rel) => rel,
            Err(e) => return fail(&session, &args.path, e),
        };
        if rel.contains(['*', '?']) {
            let e = ToolError::bad_input(format!(
                "{rel:?}: read_file takes one file's path, not a pattern (`*`, `?`); read such \
                 a name with run_command"
            ));
            return fail(&session, &rel, e);
        }
        let out_dir = match private_dir() {
            Ok(d) => d,
            Err(e) => return fail(&session, &rel, e),
        };
        let mut flags = self.flags(&Tighten::default(), &BTreeMap::new());
        flags.push(format!("--output={rel}").into());
        flags.push(prefixed("--output-dir=", out_dir.path()));
        flags.push(format!("--max-output-file={}", self.ctx.max_output).into());
        let spec = CallSpec {
            session,
            flags,
            command: vec!["true".into()],
        };
        let (mut call, outputs) = self.call(&spec, context).await;
        let mut read = ReadOutcome {
            path: rel.clone(),
            content: None,
            encoding: None,
            bytes: None,
            call: call.clone(),
        };
        if call.is_error() {
            return read;
        }
        let Some(output) = outputs.iter().find(|o| o.path == rel) else {
            call.error = Some(ToolError::failure(format!(
                "runsbx call reported nothing of --output {rel:?}"
            )));
            read.call = call;
            return read;
        };
        if let Some(e) = &output.error {
            let kind = if e.starts_with("no such file") {
                "not_found"
            } else {
                "refused"
            };
            call.error = Some(ToolError::new(kind, format!("/workspace/{rel}: {e}")));
            read.call = call;
            return read;
        }
        // The copy is where runsbx puts `rel` under the directory we gave.
        match tokio::fs::read(out_dir.path().join(&rel)).await {
            Ok(bytes) => {
                read.bytes = Some(bytes.len() as u64);
                let (content, encoding) = match String::from_utf8(bytes) {
                    Ok(text) => (text, "utf-8"),
                    Err(e) => (
                        base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
                        "base64",
                    ),
                };
                read.content = Some(content);
                read.encoding = Some(encoding.to_owned());
            }
            Err(e) => {
                read.call.error = Some(ToolError::failure(format!(
                    "read the copy of /workspace/{rel}: {e}"
                )));
            }
        }
        read
    }

    async fn list_files_outcome(
        &self,
        args: ListFiles,
        context: &RequestContext<RoleServer>,
    ) -> ListOutcome {
        let path = args.path.unwrap_or_else(|| ".".to_owned());
        let fail = |session: &str, e: ToolError| ListOutcome {
            path: path.clone(),
            entries: Vec::new(),
            truncated: false,
            call: Outcome::failed(session, e),
        };
        let session = match self.ctx.sessions.resolve(args.session.as_deref()) {
            Ok(s) => s,
            Err(e) => return fail(&self.ctx.sessions.default, e),
        };
        let depth = args.depth.unwrap_or(1);
        if !(1..=MAX_DEPTH).contains(&depth) {
            let e = ToolError::bad_input(format!("depth {depth}: use 1 to {MAX_DEPTH}"));
            return fail(&session, e);
        }
        let staged = match Staged::new("list_files.py", LIST_FILES_PY.as_bytes()) {
            Ok(s) => s,
            Err(e) => return fail(&session, e),
        };
        let mut flags = self.flags(&Tighten::default(), &BTreeMap::new());
        flags.push(prefixed("--stdin=", &staged.file));
        // The listing must reach us whole: it stops short of the capture.
        let budget = self.ctx.max_output_bytes.saturating_sub(1024).max(512);
        let spec = CallSpec {
            session,
            flags,
            command: vec![
                "python3".into(),
                "-".into(),
                path.clone(),
                depth.to_string(),
                budget.to_string(),
            ],
        };
        let (mut call, _) = self.call(&spec, context).await;
        let listed = listing(&call);
        // The listing is in `entries`; stdout was its JSON.
        call.stdout = None;
        match listed {
            Ok(l) => ListOutcome {
                path: l.path.unwrap_or(path),
                entries: l.entries,
                truncated: l.truncated,
                call,
            },
            Err(e) => {
                if call.error.is_none() {
                    call.error = Some(e);
                }
                ListOutcome {
                    path,
                    entries: Vec::new(),
                    truncated: false,
                    call,
                }
            }
        }
    }
}

/// The listing in a list_files call's stdout.
fn listing(call: &Outcome) -> Result<Listing, ToolError> {
    if call.is_error() {
        return Err(ToolError::failure("the listing did not run"));
    }
    match call.exit_code {
        Some(0) => {}
        Some(127) => {
            return Err(ToolError::new(
                "not_found",
                "list_files runs python3 in the sandbox, and the image has none; use \
                 run_command with ls or find",
            ))
        }
        code => {
            let stderr = call.stderr.as_ref().map(|s| s.data.trim()).unwrap_or("");
            return Err(ToolError::failure(format!(
                "the listing exited with {code:?} (timed out: {}): {stderr}",
                call.timed_out
            )));
        }
    }
    let stdout = call.stdout.as_ref().map(|s| s.data.as_str()).unwrap_or("");
    let listed: Listing = serde_json::from_str(stdout).map_err(|e| {
        ToolError::failure(format!(
            "the listing is not JSON ({e}); it may exceed the server's --max-output"
        ))
    })?;
    if let Some(e) = listed.error {
        let kind = if e.contains("No such file") {
            "not_found"
        } else {
            "refused"
        };
        return Err(ToolError::new(kind, e));
    }
    Ok(listed)
}

/// `path` relative to /workspace, as runsbx's --input and --output take it.
fn in_workspace(path: &str) -> Result<String, ToolError> {
    runsbx_runtime::sandbox::workspace::workspace_relative(Path::new(path))
        .and_then(|rel| rel.to_str().map(str::to_owned))
        .ok_or_else(|| {
            ToolError::bad_input(format!(
                "{path:?}: give a file under /workspace (relative to it, or absolute under it; \
                 no `..`)"
            ))
        })
}

fn prefixed(flag: &str, path: &Path) -> OsString {
    let mut arg = OsString::from(flag);
    arg.push(path.as_os_str());
    arg
}

/// A private temporary directory (mode 0700).
fn private_dir() -> Result<tempfile::TempDir, ToolError> {
    tempfile::Builder::new()
        .prefix("runsbx-mcp-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|e| ToolError::failure(format!("make a temporary directory: {e}")))
}

/// Bytes handed to a call as a host file: mode 0600 in a 0700 directory,
/// removed when dropped.
struct Staged {
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl Staged {
    fn new(name: &str, bytes: &[u8]) -> Result<Self, ToolError> {
        let dir = private_dir()?;
        let file = dir.path().join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| f.write_all(bytes))
            .map_err(|e| ToolError::failure(format!("stage {file:?}: {e}")))?;
        Ok(Self { _dir: dir, file })
    }
}

/// A tool result with `value` as its structured content (and, as the MCP
/// specification suggests for older clients, as JSON text).
fn reply<T: Serialize>(value: &T, is_error: bool) -> CallToolResult {
    match serde_json::to_value(value) {
        Ok(v) if is_error => CallToolResult::structured_error(v),
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
            "runsbx mcp: serialise the result: {e}"
        ))]),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_stay_in_the_workspace() {
        assert_eq!(in_workspace("a/b.txt").unwrap(), "a/b.txt");
        assert_eq!(in_workspace("/workspace/a").unwrap(), "a");
        assert_eq!(in_workspace("./a").unwrap(), "a");
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "/workspace", "."] {
            assert!(in_workspace(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_listing_is_read_from_stdout() {
        let mut call = Outcome::failed("s", ToolError::failure("x"));
        call.error = None;
        call.status = "exited".into();
        call.exit_code = Some(0);
        call.stdout = Some(super::super::schema::Stream {
            data: r#"{"path":"/workspace","entries":[{"path":"a","type":"file","size":3}],"truncated":false}"#.into(),
            encoding: "utf-8".into(),
            bytes: 0,
            truncated: false,
            omitted_bytes: 0,
        });
        let l = listing(&call).unwrap();
        assert_eq!(l.entries.len(), 1);
        assert_eq!(l.entries[0].kind, "file");

        call.exit_code = Some(127);
        assert_eq!(listing(&call).unwrap_err().kind, "not_found");
    }

    #[test]
    fn staged_files_are_private() {
        let s = Staged::new("f", b"x").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&s.file), 0o600);
        assert_eq!(mode(s.file.parent().unwrap()), 0o700);
    }
}
