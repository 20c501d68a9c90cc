//! Serving the listener: accept within the connection limit, read one
//! request head, check the destination, connect, relay.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::{timeout, timeout_at, Instant};

use runsbx_policy::request_rule::{RequestRule, Target};

use crate::allowlist::Access;
use crate::events::{DenyEvent, DenyReason, Shared};
use crate::guard::{deny_message, Guard};
use crate::http::{forward_head, head_end, parse_request, printable, Kind, Request, MAX_HEAD};
use crate::inspect::{inspect, InspectLimits, Inspected, InspectedRequest, RelayEnd, Verdict};
use crate::relay::{relay, End, Meter};
use crate::secrets;

/// The proxy's fixed settings, checked and normalised by `spawn`.
#[derive(Debug)]
pub(crate) struct Settings {
    pub guard: Guard,
    pub inspect: Option<Arc<crate::Inspection>>,
    pub secrets: Vec<crate::Secret>,
    pub learn: bool,
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub header_timeout: Duration,
    pub max_bytes: u64,
}

/// After a refusal, how long and how much the proxy keeps reading what the
/// client still sends, so that closing does not reset the connection
/// before the client has read the answer.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// Accept until `stop` fires (or its sender is dropped).
pub(crate) async fn serve(
    listener: TcpListener,
    settings: Arc<Settings>,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    // One LimitReached event per burst of refusals, not one per connection.
    let mut refusing = false;
    loop {
        let accepted = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                tracing::error!(error = %e, "egress proxy: the listener does not accept; stopping");
                break;
            }
            Err(e) => {
                // EMFILE and the like: the connection waits in the backlog.
                // Pause instead of spinning on it.
                tracing::warn!(error = %e, "egress proxy: accept failed");
                tokio::select! {
                    _ = &mut stop => break,
                    () = tokio::time::sleep(Duration::from_millis(50)) => continue,
                }
            }
        };
        shared.connections.fetch_add(1, Ordering::Relaxed);
        if shared.active.load(Ordering::Relaxed) >= settings.max_connections as u64 {
            refuse_at_limit(stream, peer, &settings, &shared, !refusing);
            refusing = true;
            continue;
        }
        refusing = false;
        shared.active.fetch_add(1, Ordering::Relaxed);
        // Made here and moved in: a task dropped before its first poll
        // (at shutdown) still gives its place back.
        let active = Active(Arc::clone(&shared));
        let settings = Arc::clone(&settings);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _active = active;
            handle(stream, peer, &settings, &shared).await;
        });
    }
    tracing::debug!("egress proxy: stopped accepting");
}

/// Counts a connection as active for as long as its task lives (including
/// when the runtime drops the task at shutdown).
struct Active(Arc<Shared>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Over the limit: answer 503 without waiting (the socket buffer is empty,
/// so the write cannot block) and close at once, so that a flood of
/// connections holds no more than the limit's worth of descriptors.
fn refuse_at_limit(
    stream: TcpStream,
    peer: SocketAddr,
    settings: &Settings,
    shared: &Shared,
    record: bool,
) {
    let detail = format!(
        "at most {} connections at once; retry later",
        settings.max_connections
    );
    let message = deny_message(&DenyReason::LimitReached, "", 0, &detail);
    let response = response(
        503,
        "Service Unavailable",
        Some(DenyReason::LimitReached.code()),
        &message,
    );
    // Counted before the client can read its answer (see `inspect`).
    if record {
        shared.record(event(peer, "", "", 0, DenyReason::LimitReached, message));
    } else {
        shared.denied.fetch_add(1, Ordering::Relaxed);
    }
    let _ = stream.try_write(&response);
}

pub(crate) enum Head {
    Complete { len: usize, filled: usize },
    TooLarge,
    Eof,
}

/// Reads a request head into `buf` (a tunnel's, inside its TLS, too).
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut [u8],
) -> io::Result<Head> {
    let mut filled = 0;
    loop {
        if filled == buf.len() {
            return Ok(Head::TooLarge);
        }
        let n = stream.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Ok(Head::Eof);
        }
        // The blank line may straddle two reads.
        let from = filled.saturating_sub(3);
        filled += n;
        if let Some(end) = head_end(&buf[from..filled]) {
            return Ok(Head::Complete {
                len: from + end,
                filled,
            });
        }
    }
}

async fn handle(mut stream: TcpStream, peer: SocketAddr, s: &Settings, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let mut buf = vec![0u8; MAX_HEAD];
    let (len, filled) = match timeout(s.header_timeout, read_head(&mut stream, &mut buf)).await {
        Ok(Ok(Head::Complete { len, filled })) => (len, filled),
        Ok(Ok(Head::TooLarge)) => {
            let reason = format!("request head larger than {} KiB", MAX_HEAD / 1024);
            return deny(
                stream,
                peer,
                shared,
                ("", "", 0),
                DenyReason::BadRequest,
                &reason,
            )
            .await;
        }
        Ok(Ok(Head::Eof)) | Ok(Err(_)) => return,
        Err(_) => {
            tracing::debug!(%peer, "egress proxy: request head not complete in time");
            let msg = format!(
                "runsbx: request head not received within {:?}",
                s.header_timeout
            );
            return finish(stream, &response(408, "Request Timeout", None, &msg)).await;
        }
    };
    let mut req = match parse_request(&buf[..len]) {
        Ok(req) => req,
        Err(bad) => {
            let who = (bad.method.as_str(), bad.host.as_str(), bad.port);
            return deny(
                stream,
                peer,
                shared,
                who,
                DenyReason::BadRequest,
                &bad.reason,
            )
            .await;
        }
    };
    let host = req.host.to_string();
    let addrs = match s.guard.check(&req.host, req.port).await {
        Ok(addrs) => addrs,
        Err(reason) => {
            let who = (req.method.as_str(), host.as_str(), req.port);
            return deny(stream, peer, shared, who, reason, "").await;
        }
    };
    let access = s.guard.allow.access(&req.host, req.port);
    // With secrets, and in learn mode, every tunnel is read.
    let read_all = !s.secrets.is_empty() || s.learn;
    let checked = check_request(&access, &req, s.inspect.is_some(), read_all)
        .and_then(|pass| forward_secrets(&s.secrets, &mut req).map(|()| pass));
    let who = (req.method.as_str(), host.as_str(), req.port);
    let inspect = match checked {
        Ok(pass) => pass,
        Err((reason, detail)) => {
            let path = match &req.kind {
                Kind::Forward { path } => printable(path),
                Kind::Connect => String::new(),
            };
            return deny_request(stream, peer, shared, who, &path, reason, &detail).await;
        }
    };
    let mut upstream = match connect(&addrs, s.connect_timeout).await {
        Ok(upstream) => upstream,
        Err(e) => {
            shared.upstream_errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, %host, port = req.port, error = %e, "egress proxy: upstream unreachable");
            let msg = format!("runsbx: could not connect to {host}:{}: {e}", req.port);
            return finish(stream, &response(502, "Bad Gateway", None, &msg)).await;
        }
    };
    tracing::debug!(%peer, method = %req.method, %host, port = req.port, "egress proxy: connected");
    if let (Some(rules), Some(inspection)) = (inspect, &s.inspect) {
        let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
        if !matches!(
            timeout(s.idle_timeout, stream.write_all(ok)).await,
            Ok(Ok(()))
        ) {
            return;
        }
        return inspected(stream, upstream, peer, &req, &rules, inspection, s, shared).await;
    }
    match &req.kind {
        Kind::Forward { path } => {
            let path = Target::parse(path).map(|t| t.path_str().to_owned()).ok();
            shared.learn(&req.method, &host, req.port, path.as_deref(), false);
        }
        Kind::Connect => shared.learn("CONNECT", &host, req.port, None, false),
    }
    let forward = matches!(req.kind, Kind::Forward { .. });
    let started = if forward {
        let head = forward_head(&req);
        shared
            .bytes_up
            .fetch_add(head.len() as u64, Ordering::Relaxed);
        timeout(s.idle_timeout, upstream.write_all(&head)).await
    } else {
        let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
        timeout(s.idle_timeout, stream.write_all(ok)).await
    };
    if !matches!(started, Ok(Ok(()))) {
        return;
    }
    let meter = Meter::new(
        &shared.bytes_up,
        &shared.bytes_down,
        s.max_bytes,
        s.idle_timeout,
    );
    match relay(
        &mut stream,
        &mut upstream,
        &mut buf,
        len..filled,
        forward,
        &meter,
    )
    .await
    {
        End::Done => {}
        End::Idle => tracing::debug!(%peer, %host, "egress proxy: idle connection closed"),
        End::Io(e) => tracing::debug!(%peer, %host, error = %e, "egress proxy: connection ended"),
        End::Budget => {
            let detail = format!("connection closed after {} bytes", s.max_bytes);
            let message = deny_message(&DenyReason::LimitReached, "", 0, &detail);
            shared.record(event(
                peer,
                who.0,
                who.1,
                who.2,
                DenyReason::LimitReached,
                message,
            ));
        }
    }
}

/// Whether the entries for the destination let this request through:
/// every request when one allows it whole (`Ok(None)`); else a forwarded
/// request whose method and path one of them allows, or a tunnel whose one
/// request the proxy will read and check against `rules`
/// (`Ok(Some(rules))`), when it inspects TLS. Without inspection a
/// tunnel's requests cannot be read, so a destination open to some
/// requests only is not tunnelled.
fn check_request<'a>(
    access: &Access<'a>,
    req: &Request,
    inspects: bool,
    read_all: bool,
) -> Result<Option<Vec<&'a RequestRule>>, (DenyReason, String)> {
    let rules = match access {
        // With secrets every tunnel is read: a secret's host to put the
        // secret in, every other so that no sentinel leaves unseen. In
        // learn mode, to learn its requests. Every request passes (no
        // rules), its sentinels judged.
        Access::Open if read_all && inspects && req.kind == Kind::Connect => {
            return Ok(Some(Vec::new()))
        }
        Access::Requests(rules) => rules,
        _ => return Ok(None),
    };
    match &req.kind {
        Kind::Connect if inspects => Ok(Some(rules.clone())),
        Kind::Connect => Err(refusal(
            rules,
            "a CONNECT tunnel's requests cannot be checked against method and path rules \
             without TLS inspection; allow the host whole to tunnel to it"
                .to_owned(),
        )),
        Kind::Forward { path } => match judge(rules, &req.method, path) {
            Ok(()) => Ok(None),
            Err(detail) => Err(refusal(rules, detail)),
        },
    }
}

/// A forwarded request's sentinels judged and its secrets put in (see
/// secrets.rs); a tunnel's are judged inside it, when it is inspected.
fn forward_secrets(
    secrets: &[crate::Secret],
    req: &mut Request,
) -> Result<(), (DenyReason, String)> {
    match &req.kind {
        Kind::Forward { path } => {
            secrets::apply(secrets, &req.host, req.port, path, &mut req.headers)
        }
        Kind::Connect => Ok(()),
    }
}

/// Whether one of `rules` allows `method` on `path` (a request target).
fn judge(rules: &[&RequestRule], method: &str, path: &str) -> Result<(), String> {
    match Target::parse(path) {
        Err(reason) => Err(reason.to_owned()),
        Ok(target) if rules.iter().any(|rule| rule.allows(method, &target)) => Ok(()),
        Ok(_) => Err(format!("{method} {} is not allowed", printable(path))),
    }
}

fn refusal(rules: &[&RequestRule], detail: String) -> (DenyReason, String) {
    let rules = rules.iter().map(ToString::to_string).collect();
    (DenyReason::RequestNotAllowed { rules }, detail)
}

/// Serves a tunnel to a host some rules open: its one request is read and
/// judged by them (see inspect.rs), and what became of it is counted and,
/// for a refusal, recorded.
#[allow(clippy::too_many_arguments)]
async fn inspected(
    stream: TcpStream,
    upstream: TcpStream,
    peer: SocketAddr,
    req: &Request,
    rules: &[&RequestRule],
    inspection: &crate::Inspection,
    s: &Settings,
    shared: &Shared,
) {
    let host = req.host.to_string();
    let limits = InspectLimits {
        header_timeout: s.header_timeout,
        handshake_timeout: s.connect_timeout,
        idle_timeout: s.idle_timeout,
        max_head: MAX_HEAD,
        max_bytes: s.max_bytes,
    };
    // No rules: a secret's host open whole, read to put the secret in.
    let check = |r: &mut InspectedRequest| {
        let path = r.path().to_owned();
        let judged = secrets::apply(&s.secrets, &req.host, req.port, &path, &mut r.headers)
            .and_then(|()| match rules.is_empty() {
                true => Ok(()),
                false => judge(rules, r.method(), &path).map_err(|detail| refusal(rules, detail)),
            });
        match judged {
            Ok(()) => {
                let learned = Target::parse(&path).map(|t| t.path_str().to_owned()).ok();
                shared.learn(r.method(), &host, req.port, learned.as_deref(), true);
                Verdict::Allow
            }
            Err((reason, detail)) => {
                let message = deny_message(&reason, &host, req.port, &detail);
                Verdict::Deny { reason, message }
            }
        }
    };
    let record = |method: &str, path: &str, reason: DenyReason, message: String| {
        let mut event = event(peer, method, &host, req.port, reason, message);
        event.path = path.to_owned();
        shared.record(event);
    };
    // Recorded before the sandbox reads its answer (see `inspect`).
    let refused = |outcome: &Inspected| match outcome {
        Inspected::Denied {
            method,
            path,
            reason,
            message,
        } => record(method, path, reason.clone(), message.clone()),
        Inspected::BadRequest(detail) => {
            let message = deny_message(&DenyReason::BadRequest, &host, req.port, detail);
            record("", "", DenyReason::BadRequest, message);
        }
        Inspected::UpstreamTls { reason: detail, .. } => {
            shared.upstream_errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(%peer, %host, port = req.port, error = %detail, "egress proxy: upstream TLS failed");
        }
        Inspected::Forwarded {
            method,
            path,
            end: RelayEnd::Budget,
            ..
        } => {
            let detail = format!("connection closed after {} bytes", s.max_bytes);
            let message = deny_message(&DenyReason::LimitReached, "", 0, &detail);
            record(method, path, DenyReason::LimitReached, message);
        }
        _ => {}
    };
    let outcome = inspect(
        stream,
        upstream,
        &req.host,
        req.port,
        &inspection.ca,
        &inspection.trust,
        &limits,
        &check,
        &refused,
        (&shared.bytes_up, &shared.bytes_down),
    )
    .await;
    match outcome {
        // Counted as they went, and recorded by `refused` before the
        // sandbox was answered or its connection closed.
        Inspected::Forwarded { .. }
        | Inspected::Denied { .. }
        | Inspected::BadRequest(_)
        | Inspected::UpstreamTls { .. } => {}
        // The sandbox's client refused the proxy's certificate (it does
        // not use the trust bundle runsbx gave it) or went away: nothing
        // was sent anywhere.
        Inspected::ClientTls(detail) => {
            tracing::info!(%peer, %host, port = req.port, error = %detail, "egress proxy: the sandbox's TLS client ended the inspected tunnel");
        }
        other => tracing::debug!(%peer, %host, "egress proxy: inspected tunnel ended: {other:?}"),
    }
}

/// Refuse with the status the reason calls for, and record the event.
async fn deny(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    (method, host, port): (&str, &str, u16),
    reason: DenyReason,
    detail: &str,
) {
    deny_request(
        stream,
        peer,
        shared,
        (method, host, port),
        "",
        reason,
        detail,
    )
    .await;
}

/// [`deny`], for a request whose target (`path`) was read.
async fn deny_request(
    stream: TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    (method, host, port): (&str, &str, u16),
    path: &str,
    reason: DenyReason,
    detail: &str,
) {
    let message = deny_message(&reason, host, port, detail);
    let (status, text) = match reason {
        DenyReason::BadRequest => (400, "Bad Request"),
        DenyReason::LimitReached => (503, "Service Unavailable"),
        _ => (403, "Forbidden"),
    };
    let bytes = response(status, text, Some(reason.code()), &message);
    let mut event = event(peer, method, host, port, reason, message);
    event.path = path.to_owned();
    shared.record(event);
    finish(stream, &bytes).await;
}

fn event(
    peer: SocketAddr,
    method: &str,
    host: &str,
    port: u16,
    reason: DenyReason,
    message: String,
) -> DenyEvent {
    DenyEvent {
        time: Utc::now(),
        client: peer,
        method: method.to_owned(),
        host: host.to_owned(),
        port,
        path: String::new(),
        reason,
        message,
    }
}

/// An answer from the proxy itself: `X-Runsbx-Deny` names a refusal's
/// reason, the body says it in a sentence.
pub(crate) fn response(status: u16, text: &str, deny: Option<&str>, message: &str) -> Vec<u8> {
    let body = format!("{message}\n");
    let deny = deny
        .map(|code| format!("X-Runsbx-Deny: {code}\r\n"))
        .unwrap_or_default();
    format!(
        "HTTP/1.1 {status} {text}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n{deny}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Send a final answer and close: write, half-close, then read and drop
/// what the client still sends for a short while (bounded), so that the
/// close is a FIN after the answer and not a reset that may destroy it.
async fn finish(mut stream: TcpStream, bytes: &[u8]) {
    let _ = timeout(LINGER, async {
        stream.write_all(bytes).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        io::Result::Ok(())
    })
    .await;
}

/// Connect to the first address that answers, all within `limit`.
async fn connect(addrs: &[SocketAddr], limit: Duration) -> io::Result<TcpStream> {
    let deadline = Instant::now() + limit;
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address to connect to");
    for addr in addrs {
        match timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Ok(Err(e)) => last = e,
            Err(_) => {
                let msg = format!("no connection within {limit:?}");
                return Err(io::Error::new(io::ErrorKind::TimedOut, msg));
            }
        }
    }
    Err(last)
}
