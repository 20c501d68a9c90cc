//! HTTP/1.1 inside an inspected tunnel: the one request head, its body's
//! framing, and the head sent upstream.
//!
//! Stricter than the proxy's own requests, because here the proxy decides on
//! method and path and the upstream acts on them: if the two read a request
//! differently, a checked request can carry an unchecked one. So everything
//! two parsers could read two ways is refused (RFC 9112 section 6.3 and 11.2
//! list the ways), and the body is relayed exactly as framed and no further.

use crate::host::{parse_host, split_authority, Host};
use crate::http::{
    connection_listed, is_hop_by_hop, is_tchar, parse_header, printable, strip_prefix_ignore_case,
    MAX_HEAD,
};

/// One request read inside an inspected tunnel, for the caller's check.
/// The check may change `headers` (e.g. put a credential in place of a
/// sentinel); method, path and framing are fixed by what the client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectedRequest {
    method: String,
    path: String,
    version: String,
    /// In order, as received (names as sent), `Host` included. What the
    /// check leaves here is sent upstream, except hop-by-hop headers,
    /// `Host`, `Content-Length` and `Transfer-Encoding`: the proxy writes
    /// those from the tunnel and the body it relays, so a check cannot make
    /// the head disagree with the bytes that follow.
    pub headers: Vec<(String, Vec<u8>)>,
}

impl InspectedRequest {
    pub fn method(&self) -> &str {
        &self.method
    }

    /// The origin-form target: path and query, as sent.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `HTTP/1.1` or `HTTP/1.0`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// How the request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// No body (no length given).
    None,
    /// `Content-Length` bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`, up to and including the trailers' end.
    Chunked,
}

/// Parse a complete request head read inside the tunnel to `host:port`.
pub(crate) fn parse_request(
    head: &[u8],
    host: &Host,
    port: u16,
) -> Result<(InspectedRequest, Body), String> {
    // Keep the last line's CR so that every line must end in CRLF.
    let body = head.strip_suffix(b"\n\r\n").unwrap_or(head);
    let mut lines = body.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r"));
    let Some(Some(line)) = lines.next() else {
        return Err("bare LF in the request line".into());
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return Err("request line is not ASCII".into());
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err("request line is not `METHOD /path HTTP/1.1`".into());
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err("bad method".into());
    }
    if method == "CONNECT" {
        return Err("CONNECT inside an inspected tunnel".into());
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err("only HTTP/1.1 and HTTP/1.0 are spoken inside an inspected tunnel".into());
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("bad request target".into());
    }
    let path = origin_form(target, host, port)?;
    let mut headers = Vec::new();
    for line in lines {
        let Some(line) = line else {
            return Err("bare LF in a header".into());
        };
        headers.push(parse_header(line).map_err(str::to_owned)?);
    }
    let values = |name: &str| -> Vec<&[u8]> {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
            .collect()
    };
    match values("host")[..] {
        [] => return Err("no Host header".into()),
        [value] if names_tunnel(value, host, port) => {}
        [value] => {
            let value = printable(&String::from_utf8_lossy(value));
            return Err(format!(
                "Host `{value}` is not {}, the host this tunnel was opened to",
                authority(host, port)
            ));
        }
        _ => return Err("more than one Host header".into()),
    }
    // The upstream would switch protocols after a check that saw only the
    // first request of the new one.
    if !values("upgrade").is_empty() {
        return Err("Upgrade is not relayed through inspection (no WebSocket or h2c)".into());
    }
    let body = match (
        &values("content-length")[..],
        &values("transfer-encoding")[..],
    ) {
        ([], []) => Body::None,
        ([length], []) => Body::Length(content_length(length)?),
        ([], [_]) if version == "HTTP/1.0" => {
            return Err("HTTP/1.0 request with Transfer-Encoding: its body has no length".into());
        }
        ([], [coding]) if coding.eq_ignore_ascii_case(b"chunked") => Body::Chunked,
        ([], [_]) => return Err("Transfer-Encoding other than `chunked`".into()),
        _ => return Err("ambiguous body length".into()),
    };
    let req = InspectedRequest {
        method: method.to_owned(),
        path,
        version: version.to_owned(),
        headers,
    };
    Ok((req, body))
}

/// The origin-form path of `target`: `/...` as is, or `https://authority/...`
/// when the authority is the tunnel's own.
fn origin_form(target: &str, host: &Host, port: u16) -> Result<String, String> {
    if target.starts_with('/') {
        return Ok(target.to_owned());
    }
    let Some(rest) = strip_prefix_ignore_case(target, "https://") else {
        return Err("request target is not origin-form (`/path`)".into());
    };
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (named, path) = rest.split_at(split);
    if !names_tunnel(named.as_bytes(), host, port) {
        return Err(format!(
            "request target names `{}`, not {}, the host this tunnel was opened to",
            printable(named),
            authority(host, port)
        ));
    }
    Ok(match path.as_bytes().first() {
        None => "/".to_owned(),
        Some(b'/') => path.to_owned(),
        Some(_) => format!("/{path}"),
    })
}

/// Whether `value` (a Host header or a URL authority) is `host:port`, the
/// port defaulting to 443. Any spelling of the same host matches.
fn names_tunnel(value: &[u8], host: &Host, port: u16) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        return false;
    };
    if value.contains('@') {
        return false;
    }
    let Ok((raw, bracketed, named_port)) = split_authority(value) else {
        return false;
    };
    parse_host(raw, bracketed).is_ok_and(|named| named == *host)
        && named_port.unwrap_or(443) == port
}

/// `host` or `host:port` (when not 443), as a Host header says it.
pub(crate) fn authority(host: &Host, port: u16) -> String {
    match port {
        443 => host.to_string(),
        port => format!("{host}:{port}"),
    }
}

fn content_length(value: &[u8]) -> Result<u64, String> {
    // Digits only: no sign, no list (`5, 5`), at most what a u64 holds.
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err("bad Content-Length".into());
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "bad Content-Length".into())
}

/// The head sent upstream: origin form, `Host` from the tunnel, the check's
/// headers without hop-by-hop ones, the framing of the body the proxy
/// relays, `Connection: close`. `Err` when the check left a header that
/// cannot be sent.
pub(crate) fn upstream_head(
    req: &InspectedRequest,
    body: Body,
    host: &Host,
    port: u16,
) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(format!("{} {} {}\r\n", req.method, req.path, req.version).as_bytes());
    out.extend_from_slice(format!("Host: {}\r\n", authority(host, port)).as_bytes());
    let listed = connection_listed(&req.headers);
    for (name, value) in &req.headers {
        let framing = name.eq_ignore_ascii_case("content-length")
            || name.eq_ignore_ascii_case("transfer-encoding");
        if framing || is_hop_by_hop(name, &listed) {
            continue;
        }
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(format!(
                "the check left a bad header name `{}`",
                printable(name)
            ));
        }
        if value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            return Err(format!("the check left a control character in `{name}`"));
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    match body {
        Body::None => {}
        Body::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Body::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    if out.len() > MAX_HEAD {
        return Err(format!(
            "the head after the check is larger than {} KiB",
            MAX_HEAD / 1024
        ));
    }
    Ok(out)
}

/// The longest chunk-size line (with extensions) and trailer section read.
const MAX_CHUNK_LINE: usize = 4096;

/// Finds where a chunked body ends, byte by byte as it arrives, so that the
/// proxy forwards the encoding as it is and stops at its last byte. Strict:
/// CRLF line ends only, hex sizes that fit in a u64, data exactly as long
/// as its size says, trailers that are well-formed header lines.
#[derive(Debug)]
pub(crate) struct Chunked {
    state: State,
    /// Bytes of the current size line, or of the trailer section so far.
    line_len: usize,
    /// The current trailer line.
    trailer: Vec<u8>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size { digits: u8, value: u64 },
    Extension { value: u64 },
    SizeLf { value: u64 },
    Data { left: u64 },
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    Done,
}

impl Chunked {
    pub fn new() -> Self {
        Self {
            state: State::Size {
                digits: 0,
                value: 0,
            },
            line_len: 0,
            trailer: Vec::new(),
        }
    }

    /// Whether the body is complete.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Take `input`; returns how many of its bytes belong to the body (all
    /// of them, unless the body ends within `input`).
    pub fn feed(&mut self, input: &[u8]) -> Result<usize, &'static str> {
        let mut i = 0;
        while i < input.len() {
            if let State::Data { left } = self.state {
                let take = left.min((input.len() - i) as u64);
                i += take as usize;
                self.state = match left - take {
                    0 => State::DataCr,
                    left => State::Data { left },
                };
                continue;
            }
            let b = input[i];
            i += 1;
            self.state = self.step(b)?;
            if self.state == State::Done {
                return Ok(i);
            }
        }
        Ok(i)
    }

    fn step(&mut self, b: u8) -> Result<State, &'static str> {
        let line = |s: &mut Self| {
            s.line_len += 1;
            if s.line_len > MAX_CHUNK_LINE {
                return Err("chunk-size line or trailers too long");
            }
            Ok(())
        };
        Ok(match self.state {
            State::Size { digits, value } => {
                line(self)?;
                match b {
                    b'\r' | b';' if digits == 0 => return Err("chunk size without digits"),
                    b'\r' => State::SizeLf { value },
                    b';' => State::Extension { value },
                    _ => {
                        let digit = (b as char).to_digit(16).ok_or("bad chunk size")?;
                        if digits == 16 {
                            return Err("chunk size too large");
                        }
                        State::Size {
                            digits: digits + 1,
                            value: value << 4 | u64::from(digit),
                        }
                    }
                }
            }
            State::Extension { value } => {
                line(self)?;
                match b {
                    b'\r' => State::SizeLf { value },
                    b'\t' | b' '..=b'~' => State::Extension { value },
                    _ => return Err("control character in a chunk extension"),
                }
            }
            State::SizeLf { value } => match b {
                b'\n' if value == 0 => {
                    self.line_len = 0;
                    State::Trailer
                }
                b'\n' => {
                    self.line_len = 0;
                    State::Data { left: value }
                }
                _ => return Err("CR without LF after a chunk size"),
            },
            // Handled in `feed`; only reached with `left == 0`.
            State::Data { .. } => State::DataCr,
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size {
                digits: 0,
                value: 0,
            },
            State::DataCr | State::DataLf => return Err("chunk data longer than its size"),
            State::Trailer => {
                line(self)?;
                match b {
                    b'\r' => State::TrailerLf,
                    b'\n' => return Err("bare LF in the trailers"),
                    _ => {
                        self.trailer.push(b);
                        State::Trailer
                    }
                }
            }
            State::TrailerLf if b == b'\n' => {
                if self.trailer.is_empty() {
                    State::Done
                } else {
                    parse_header(&self.trailer)?;
                    self.trailer.clear();
                    State::Trailer
                }
            }
            State::TrailerLf => return Err("CR without LF in the trailers"),
            State::Done => State::Done,
        })
    }
}

#[cfg(test)]
#[path = "inspect_http_tests.rs"]
mod tests;
