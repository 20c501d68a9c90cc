//! Moving bytes between the sandbox and an upstream, within bounds.
//!
//! Each direction has its own fixed buffer and runs on its own, so a peer
//! that stops reading stalls only its direction. One idle clock covers both:
//! the connection ends when no byte has arrived from either side for
//! `idle_timeout`. One byte budget covers both directions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::http::{head_end, rewrite_response_head, MAX_HEAD};

/// The per-direction buffer size.
pub(crate) const BUF: usize = 16 * 1024;

/// How a relay ended.
#[derive(Debug)]
pub(crate) enum End {
    /// Both sides closed.
    Done,
    /// Nothing arrived from either side for the idle timeout.
    Idle,
    /// The connection's byte budget is spent.
    Budget,
    Io(std::io::Error),
}

/// The bounds and counters of one connection.
pub(crate) struct Meter<'a> {
    pub up: &'a AtomicU64,
    pub down: &'a AtomicU64,
    pub max_bytes: u64,
    pub idle: Duration,
    used: AtomicU64,
    start: Instant,
    /// Milliseconds from `start` to the last byte read.
    last: AtomicU64,
}

impl<'a> Meter<'a> {
    pub fn new(up: &'a AtomicU64, down: &'a AtomicU64, max_bytes: u64, idle: Duration) -> Self {
        Self {
            up,
            down,
            max_bytes,
            idle,
            used: AtomicU64::new(0),
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    /// Account `n` bytes read in one direction; `Err` when over budget.
    pub(crate) fn count(&self, n: usize, counter: &AtomicU64) -> Result<(), End> {
        let n = n as u64;
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        counter.fetch_add(n, Ordering::Relaxed);
        let elapsed = self.start.elapsed().as_millis();
        self.last.store(
            u64::try_from(elapsed).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        if used > self.max_bytes {
            return Err(End::Budget);
        }
        Ok(())
    }

    /// Resolves once nothing was read for the idle timeout.
    pub(crate) async fn idle_expired(&self) {
        loop {
            let last = Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = self.start + last + self.idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Relay between `client` and `upstream` until both close, the idle timeout,
/// the budget or an error. `pending` is what the client sent after its
/// request head (sent upstream first); `buf` is reused for that direction.
/// With `rewrite_response`, the first response head is passed through
/// [`rewrite_response_head`].
pub(crate) async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    buf: &mut [u8],
    pending: std::ops::Range<usize>,
    rewrite_response: bool,
    meter: &Meter<'_>,
) -> End {
    let (client_r, client_w) = client.split();
    let (up_r, up_w) = upstream.split();
    let up = client_to_upstream(client_r, up_w, buf, pending, meter);
    let down = async {
        let mut down_buf = vec![0u8; BUF.max(MAX_HEAD)];
        if rewrite_response {
            pump_response(up_r, client_w, &mut down_buf, meter).await
        } else {
            pump(up_r, client_w, &mut down_buf, meter, meter.down).await
        }
    };
    let exchange = async {
        if rewrite_response {
            // One request per connection: once the response is through, the
            // exchange is over, even if the client keeps its side open.
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
        } else {
            // A tunnel lives until both sides have closed (half-close is
            // part of some protocols).
            tokio::try_join!(up, down).map(|_| ())
        }
    };
    tokio::select! {
        res = exchange => match res {
            Ok(()) => End::Done,
            Err(end) => end,
        },
        () = meter.idle_expired() => End::Idle,
    }
}

/// The client-to-upstream direction: the bytes already read (`buf[pending]`),
/// then the rest.
async fn client_to_upstream<R, W>(
    r: R,
    mut w: W,
    buf: &mut [u8],
    pending: std::ops::Range<usize>,
    meter: &Meter<'_>,
) -> Result<(), End>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    if let Some(pending) = buf.get(pending).filter(|p| !p.is_empty()) {
        meter.count(pending.len(), meter.up)?;
        w.write_all(pending).await.map_err(End::Io)?;
    }
    pump(r, w, buf, meter, meter.up).await
}

/// Copy until EOF, then pass the EOF on (half-close).
async fn pump<R, W>(
    mut r: R,
    mut w: W,
    buf: &mut [u8],
    meter: &Meter<'_>,
    counter: &AtomicU64,
) -> Result<(), End>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let n = r.read(buf).await.map_err(End::Io)?;
        if n == 0 {
            // The peer may already be gone; its half is closed either way.
            let _ = w.shutdown().await;
            return Ok(());
        }
        meter.count(n, counter)?;
        w.write_all(&buf[..n]).await.map_err(End::Io)?;
    }
}

/// Upstream to client for a forwarded request: the response head is read
/// (within `buf`), rewritten to `Connection: close`, then the rest copied.
async fn pump_response<R, W>(
    mut r: R,
    mut w: W,
    buf: &mut [u8],
    meter: &Meter<'_>,
) -> Result<(), End>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut filled = 0;
    let mut eof = false;
    while filled < buf.len() && head_end(&buf[..filled]).is_none() {
        let n = r.read(&mut buf[filled..]).await.map_err(End::Io)?;
        if n == 0 {
            eof = true;
            break;
        }
        meter.count(n, meter.down)?;
        filled += n;
    }
    let got = &buf[..filled];
    match head_end(got).and_then(|end| Some((rewrite_response_head(&got[..end])?, end))) {
        Some((head, end)) => {
            w.write_all(&head).await.map_err(End::Io)?;
            w.write_all(&got[end..]).await.map_err(End::Io)?;
        }
        None => w.write_all(got).await.map_err(End::Io)?,
    }
    if eof {
        let _ = w.shutdown().await;
        return Ok(());
    }
    pump(r, w, buf, meter, meter.down).await
}
