//! Serving one CONNECT tunnel to a host the operator marked for inspection:
//! end the sandbox's TLS with a certificate from its own CA, read one
//! HTTP/1.1 request, let the caller's check judge (and amend) it, and only
//! then open TLS to the upstream and relay that one request and its
//! response.
//!
//! One request per tunnel, on purpose. The upstream is told
//! `Connection: close` and the client gets `Connection: close` back, so the
//! client's next request comes on a new CONNECT and is checked again; bytes
//! the client sends after the first request's body (a pipelined request)
//! are never forwarded, since the check did not see them.
//!
//! Everything is bounded as in the rest of the proxy: the handshake and the
//! head within the header timeout, the head's size, idle time, and the
//! bytes of the exchange.

use std::io;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::time::{timeout, timeout_at, Instant};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use rustls::pki_types::ServerName;

use crate::events::DenyReason;
use crate::host::Host;
use crate::http::{head_end, printable, rewrite_response_head, MAX_HEAD};
use crate::inspect_http::{parse_request, upstream_head, Body, Chunked};
use crate::relay::{End, Meter, BUF};
use crate::server::{read_head, response, Head};
use crate::tls::{SandboxCa, UpstreamTrust};

pub use crate::inspect_http::InspectedRequest;

type ClientTls = tokio_rustls::server::TlsStream<TcpStream>;
type UpstreamTls = tokio_rustls::client::TlsStream<TcpStream>;

/// After a refusal, how long and how much the proxy keeps reading what the
/// client still sends, so that closing does not reset the connection
/// before the client has read the answer (as the proxy's own refusals do).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// Interim (1xx) responses passed on before the final one; more are
/// relayed as they are, without rewriting.
const MAX_INTERIM: usize = 8;

/// The bounds of one inspected tunnel.
#[derive(Debug, Clone)]
pub struct InspectLimits {
    /// The client's TLS handshake and its request head, together, within this.
    pub header_timeout: Duration,
    /// The TLS handshake with the upstream within this.
    pub handshake_timeout: Duration,
    /// The exchange ends when no byte arrived from either side for this long.
    pub idle_timeout: Duration,
    /// The largest request or response head read.
    pub max_head: usize,
    /// Bytes of the exchange, both directions together.
    pub max_bytes: u64,
}

impl Default for InspectLimits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_head: MAX_HEAD,
            max_bytes: 1 << 30,
        }
    }
}

/// What the check says about a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Answered 403 with `message` as the body and the reason's code in
    /// `X-Runsbx-Deny`; the reason (naming the rules) is the deny event's.
    Deny {
        reason: DenyReason,
        message: String,
    },
}

/// How an inspected tunnel ended, for the caller's events and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspected {
    /// The request went upstream and its response (or part of it) back.
    Forwarded {
        method: String,
        path: String,
        /// The final response's status, when its head was read.
        status: Option<u16>,
        end: RelayEnd,
    },
    /// The check refused; answered 403, upstream never contacted.
    Denied {
        method: String,
        path: String,
        reason: DenyReason,
        message: String,
    },
    /// The request head was refused (answered 400; 431 when too large).
    BadRequest(String),
    /// The check left a header that cannot be sent (answered 500).
    Unsendable {
        method: String,
        path: String,
        reason: String,
    },
    /// The TLS handshake with the client failed (or named another host).
    ClientTls(String),
    /// The TLS handshake with the upstream failed (answered 502).
    UpstreamTls {
        method: String,
        path: String,
        reason: String,
    },
    /// The head was not complete within the header timeout (answered 408).
    HeaderTimeout,
    /// The client closed before sending a request.
    NoRequest,
    /// Reading the client's head failed.
    Io(String),
}

/// How the relay of an allowed request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayEnd {
    /// The upstream finished its response and closed.
    Done,
    /// Nothing arrived from either side for the idle timeout.
    Idle,
    /// The byte budget is spent.
    Budget,
    /// The client closed before the end of its request body.
    ClientClosed,
    /// The chunked request body was malformed; relaying stopped before it.
    BadBody(String),
    Io(String),
}

/// Serve one CONNECT tunnel to an inspected host. Called once the proxy has
/// answered `200 Connection established` on `client` and connected
/// `upstream` to an address it vetted for `host:port`.
///
/// `refused` is told of a refusal (`Denied`, `BadRequest`), a failed
/// upstream (`UpstreamTls`) or a spent budget (`Forwarded`, ending
/// `Budget`) before the client is answered or its connection closed: a
/// sandbox that reads its 403 (or its end of file) and exits at once ends
/// its call, whose result must already count it. For the same reason the
/// bytes relayed are counted as they go, into `counted` (from the client,
/// the request head as sent upstream; from the upstream; in the clear).
#[allow(clippy::too_many_arguments)]
pub async fn inspect(
    client: TcpStream,
    upstream: TcpStream,
    host: &Host,
    port: u16,
    ca: &SandboxCa,
    trust: &UpstreamTrust,
    limits: &InspectLimits,
    check: &(dyn Fn(&mut InspectedRequest) -> Verdict + Send + Sync),
    refused: &(dyn Fn(&Inspected) + Send + Sync),
    counted: (&AtomicU64, &AtomicU64),
) -> Inspected {
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let deadline = Instant::now() + limits.header_timeout;
    let mut tls = match accept(client, host, ca, deadline, limits).await {
        Ok(tls) => tls,
        Err(reason) => return Inspected::ClientTls(reason),
    };
    let mut buf = vec![0u8; limits.max_head];
    let (len, filled) = match timeout_at(deadline, read_head(&mut tls, &mut buf)).await {
        Ok(Ok(Head::Complete { len, filled })) => (len, filled),
        Ok(Ok(Head::TooLarge)) => {
            let reason = format!("request head larger than {} bytes", limits.max_head);
            let msg = format!("runsbx: {reason}");
            let answer = response(
                431,
                "Request Header Fields Too Large",
                Some("bad_request"),
                &msg,
            );
            let outcome = Inspected::BadRequest(reason);
            refused(&outcome);
            finish(tls, &answer).await;
            return outcome;
        }
        Ok(Ok(Head::Eof)) => return Inspected::NoRequest,
        Ok(Err(e)) => return Inspected::Io(e.to_string()),
        Err(_) => {
            let msg = format!(
                "runsbx: request head not received within {:?}",
                limits.header_timeout
            );
            finish(tls, &response(408, "Request Timeout", None, &msg)).await;
            return Inspected::HeaderTimeout;
        }
    };
    let (mut req, body) = match parse_request(&buf[..len], host, port) {
        Ok(parsed) => parsed,
        Err(reason) => {
            let msg = format!("runsbx: bad request inside the tunnel to {host}: {reason}");
            let outcome = Inspected::BadRequest(reason);
            refused(&outcome);
            finish(
                tls,
                &response(400, "Bad Request", Some("bad_request"), &msg),
            )
            .await;
            return outcome;
        }
    };
    let method = req.method().to_owned();
    let path = printable(req.path());
    if let Verdict::Deny { reason, message } = check(&mut req) {
        // The upstream TCP connection is dropped unused: it has seen no byte.
        drop(upstream);
        let answer = response(403, "Forbidden", Some(reason.code()), &message);
        let outcome = Inspected::Denied {
            method,
            path,
            reason,
            message,
        };
        refused(&outcome);
        finish(tls, &answer).await;
        return outcome;
    }
    let head = match upstream_head(&req, body, host, port) {
        Ok(head) => head,
        Err(reason) => {
            let msg = format!("runsbx: {reason}");
            finish(tls, &response(500, "Internal Server Error", None, &msg)).await;
            return Inspected::Unsendable {
                method,
                path,
                reason,
            };
        }
    };
    let up = match connect(upstream, host, trust, limits).await {
        Ok(up) => up,
        Err(reason) => {
            let msg = format!("runsbx: TLS to {host}:{port} failed: {reason}");
            let outcome = Inspected::UpstreamTls {
                method,
                path,
                reason,
            };
            refused(&outcome);
            finish(tls, &response(502, "Bad Gateway", None, &msg)).await;
            return outcome;
        }
    };
    let meter = Meter::new(counted.0, counted.1, limits.max_bytes, limits.idle_timeout);
    let mut status = None;
    let (end, client) =
        exchange(tls, up, &head, &buf[len..filled], body, &meter, &mut status).await;
    let spent = end == RelayEnd::Budget;
    let outcome = Inspected::Forwarded {
        method,
        path,
        status,
        end,
    };
    if spent {
        refused(&outcome);
    }
    // Only now may the client see its connection end.
    drop(client);
    outcome
}

/// The client's handshake, with the leaf for `host`. A client that names
/// another host in its SNI is refused: the tunnel is to `host` only.
async fn accept(
    client: TcpStream,
    host: &Host,
    ca: &SandboxCa,
    deadline: Instant,
    limits: &InspectLimits,
) -> Result<ClientTls, String> {
    let config = ca
        .server_config(host)
        .map_err(|e| format!("no certificate for {host}: {e}"))?;
    let tls = match timeout_at(deadline, TlsAcceptor::from(config).accept(client)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => {
            return Err(format!(
                "no TLS handshake within {:?}",
                limits.header_timeout
            ))
        }
    };
    if let Some(sni) = tls.get_ref().1.server_name() {
        if sni.parse::<Host>().as_ref() != Ok(host) {
            return Err(format!(
                "the client asked for `{}` in a tunnel to {host}",
                printable(sni)
            ));
        }
    }
    Ok(tls)
}

/// TLS to the upstream, verified for `host` against `trust`.
async fn connect(
    upstream: TcpStream,
    host: &Host,
    trust: &UpstreamTrust,
    limits: &InspectLimits,
) -> Result<UpstreamTls, String> {
    let name = match host {
        Host::Name(name) => ServerName::try_from(name.clone()).map_err(|e| e.to_string())?,
        Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
    };
    let connector = TlsConnector::from(trust.client_config());
    match timeout(limits.handshake_timeout, connector.connect(name, upstream)).await {
        Ok(Ok(tls)) => Ok(tls),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "no TLS handshake within {:?}",
            limits.handshake_timeout
        )),
    }
}

/// Send the head, then relay the framed body up and the response down at
/// once (so `Expect: 100-continue` works), until the upstream has answered
/// and closed, the idle timeout, the budget or an error. A relay that did
/// not end `Done` returns the client's connection open, for the caller to
/// close once it has recorded why.
async fn exchange(
    client: ClientTls,
    upstream: UpstreamTls,
    head: &[u8],
    pending: &[u8],
    body: Body,
    meter: &Meter<'_>,
    status: &mut Option<u16>,
) -> (RelayEnd, Option<ClientTls>) {
    let (mut client_r, mut client_w) = tokio::io::split(client);
    let (mut up_r, mut up_w) = tokio::io::split(upstream);
    let result = {
        let up = async {
            meter.count(head.len(), meter.up)?;
            write(&mut up_w, head).await?;
            send_body(&mut client_r, &mut up_w, pending, body, meter).await
        };
        let down = relay_response(&mut up_r, &mut client_w, meter, status);
        let both = async {
            tokio::pin!(up, down);
            let mut up_done = false;
            loop {
                tokio::select! {
                    res = &mut up, if !up_done => {
                        res?;
                        up_done = true;
                    }
                    res = &mut down => return res,
                }
            }
        };
        tokio::select! {
            res = both => res,
            () = meter.idle_expired() => Err(RelayEnd::Idle),
        }
    };
    let client = client_r.unsplit(client_w);
    if let Err(end) = result {
        return (end, Some(client));
    }
    // The response is through and the client has its close_notify. What it
    // still sends is read and dropped for a moment, so that closing is a
    // FIN, not a reset that could destroy the response in flight.
    linger(client.into_inner().0).await;
    (RelayEnd::Done, None)
}

impl From<End> for RelayEnd {
    fn from(end: End) -> Self {
        match end {
            End::Done => Self::Done,
            End::Idle => Self::Idle,
            End::Budget => Self::Budget,
            End::Io(e) => Self::Io(e.to_string()),
        }
    }
}

/// Exactly the body `body` frames: the bytes already read after the head
/// first, then from the client, and nothing after the body's last byte.
async fn send_body(
    r: &mut ReadHalf<ClientTls>,
    w: &mut WriteHalf<UpstreamTls>,
    pending: &[u8],
    body: Body,
    meter: &Meter<'_>,
) -> Result<(), RelayEnd> {
    let mut buf = vec![0u8; BUF];
    match body {
        Body::None => Ok(()),
        Body::Length(length) => {
            let mut left = length;
            let take = pending
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            meter.count(take, meter.up)?;
            write(w, &pending[..take]).await?;
            left -= take as u64;
            while left > 0 {
                let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                let n = read(r, &mut buf[..want]).await?;
                meter.count(n, meter.up)?;
                write(w, &buf[..n]).await?;
                left -= n as u64;
            }
            Ok(())
        }
        Body::Chunked => {
            let mut chunked = Chunked::new();
            let n = chunked.feed(pending).map_err(bad_body)?;
            meter.count(n, meter.up)?;
            write(w, &pending[..n]).await?;
            while !chunked.done() {
                let read = read(r, &mut buf).await?;
                meter.count(read, meter.up)?;
                let n = chunked.feed(&buf[..read]).map_err(bad_body)?;
                write(w, &buf[..n]).await?;
            }
            Ok(())
        }
    }
}

fn bad_body(reason: &str) -> RelayEnd {
    RelayEnd::BadBody(reason.to_owned())
}

/// A read of the request body: EOF before its end is the client's doing.
async fn read(r: &mut ReadHalf<ClientTls>, buf: &mut [u8]) -> Result<usize, RelayEnd> {
    match r.read(buf).await {
        Ok(0) => Err(RelayEnd::ClientClosed),
        Ok(n) => Ok(n),
        Err(e) => Err(RelayEnd::Io(e.to_string())),
    }
}

async fn write<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> Result<(), RelayEnd> {
    if bytes.is_empty() {
        return Ok(());
    }
    // Flushed at once: rustls holds records until asked to write them.
    w.write_all(bytes)
        .await
        .map_err(|e| RelayEnd::Io(e.to_string()))?;
    w.flush().await.map_err(|e| RelayEnd::Io(e.to_string()))
}

/// Upstream to client until the upstream closes: interim responses as they
/// are, the final head with `Connection: close` (its status kept in
/// `status`), then the rest. An upstream that ends without close_notify
/// may have been cut short; the client then gets no close_notify either.
async fn relay_response<R, W>(
    r: &mut R,
    w: &mut W,
    meter: &Meter<'_>,
    status: &mut Option<u16>,
) -> Result<(), RelayEnd>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF.max(MAX_HEAD)];
    let mut filled = 0;
    for _ in 0..=MAX_INTERIM {
        let mut eof = false;
        while filled < buf.len() && head_end(&buf[..filled]).is_none() {
            let n = read_upstream(r, &mut buf[filled..]).await?;
            if n == 0 {
                eof = true;
                break;
            }
            meter.count(n, meter.down)?;
            filled += n;
        }
        let Some(end) = head_end(&buf[..filled]) else {
            // Too large, or cut short: passed on as it is.
            write(w, &buf[..filled]).await?;
            if eof {
                return close(w).await;
            }
            filled = 0;
            break;
        };
        let code = status_code(&buf[..end]);
        if code.is_some_and(|c| (100..200).contains(&c) && c != 101) {
            write(w, &buf[..end]).await?;
            buf.copy_within(end..filled, 0);
            filled -= end;
            continue;
        }
        *status = code;
        match rewrite_response_head(&buf[..end]) {
            Some(head) => write(w, &head).await?,
            None => write(w, &buf[..end]).await?,
        }
        write(w, &buf[end..filled]).await?;
        filled = 0;
        break;
    }
    write(w, &buf[..filled]).await?;
    loop {
        let n = read_upstream(r, &mut buf).await?;
        if n == 0 {
            return close(w).await;
        }
        meter.count(n, meter.down)?;
        write(w, &buf[..n]).await?;
    }
}

async fn read_upstream<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> Result<usize, RelayEnd> {
    r.read(buf).await.map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => {
            RelayEnd::Io("the upstream closed without TLS close_notify".to_owned())
        }
        _ => RelayEnd::Io(e.to_string()),
    })
}

/// close_notify to the client, then FIN.
async fn close<W: AsyncWrite + Unpin>(w: &mut W) -> Result<(), RelayEnd> {
    w.shutdown().await.map_err(|e| RelayEnd::Io(e.to_string()))
}

/// The status code of a response head (`HTTP/1.x NNN ...`).
fn status_code(head: &[u8]) -> Option<u16> {
    let code = head.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// Send a final answer over TLS and close cleanly: the answer, close_notify,
/// FIN, then a bounded linger.
async fn finish(mut tls: ClientTls, bytes: &[u8]) {
    let sent = timeout(LINGER, async {
        tls.write_all(bytes).await?;
        tls.shutdown().await
    })
    .await;
    if matches!(sent, Ok(Ok(()))) {
        linger(tls.into_inner().0).await;
    }
}

/// Read and drop what the client still sends, for a moment and a bounded
/// number of bytes, until it closes.
async fn linger(mut tcp: TcpStream) {
    let _ = timeout(LINGER, async {
        let mut sink = [0u8; 1024];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match tcp.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        io::Result::Ok(())
    })
    .await;
}

#[cfg(test)]
#[path = "inspect_tests.rs"]
mod tests;
