//! Proxy request heads: `CONNECT host:port` and absolute-form requests
//! (`GET http://host[:port]/path HTTP/1.1`), parsed strictly.
//!
//! Strict, because the proxy stands between a hostile client and servers it
//! does not know: anything two parsers could read two ways (bare LF, folded
//! headers, two body lengths, credentials in the URL) is refused rather than
//! guessed at. Sizes are bounded by the caller's buffer ([`MAX_HEAD`]).

use crate::host::{parse_host, split_authority, Host};

/// The largest request or response head the proxy reads.
pub(crate) const MAX_HEAD: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A tunnel: bytes flow both ways after `200 Connection established`.
    Connect,
    /// One forwarded request; `path` is the origin-form target.
    Forward { path: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    pub host: Host,
    pub port: u16,
    pub kind: Kind,
    pub version: String,
    /// In order, as received (names as sent).
    pub headers: Vec<(String, Vec<u8>)>,
}

/// A head that is not a proxy request, with what could be read of it for
/// the deny event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRequest {
    pub method: String,
    pub host: String,
    pub port: u16,
    pub reason: String,
}

/// The length of the head (through the blank line) once `buf` holds one.
pub(crate) fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Parse a complete request head (as delimited by [`head_end`]).
pub(crate) fn parse_request(head: &[u8]) -> Result<Request, BadRequest> {
    let mut bad = BadRequest {
        method: String::new(),
        host: String::new(),
        port: 0,
        reason: String::new(),
    };
    let fail = |mut bad: BadRequest, reason: &str| {
        bad.reason = reason.to_owned();
        Err(bad)
    };
    // Keep the last line's CR so that every line must end in CRLF.
    let body = head.strip_suffix(b"\n\r\n").unwrap_or(head);
    let mut lines = body.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r"));
    let Some(Some(line)) = lines.next() else {
        return fail(bad, "bare LF in the request line");
    };
    let Ok(line) = std::str::from_utf8(line) else {
        return fail(bad, "request line is not ASCII");
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return fail(bad, "request line is not `METHOD target HTTP/1.x`");
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return fail(bad, "bad method");
    }
    bad.method = method.to_owned();
    bad.host = printable(target);
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return fail(bad, "only HTTP/1.0 and HTTP/1.1 are spoken");
    }
    if target.is_empty() || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return fail(bad, "bad request target");
    }
    let (authority, kind) = if method == "CONNECT" {
        (target, Kind::Connect)
    } else if let Some(rest) = strip_prefix_ignore_case(target, "http://") {
        let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let path = match path.as_bytes().first() {
            None => "/".to_owned(),
            Some(b'/') => path.to_owned(),
            Some(_) => format!("/{path}"),
        };
        (authority, Kind::Forward { path })
    } else {
        return fail(
            bad,
            "not a proxy request: use CONNECT host:port or an absolute http:// URL",
        );
    };
    if authority.contains('@') {
        return fail(bad, "credentials in the request target");
    }
    bad.host = printable(authority);
    let (raw_host, bracketed, port) = match split_authority(authority) {
        Ok(parts) => parts,
        Err(e) => return fail(bad, &e.to_string()),
    };
    bad.host = printable(raw_host);
    let port = match (port, &kind) {
        (Some(port), _) => port,
        (None, Kind::Forward { .. }) => 80,
        (None, Kind::Connect) => return fail(bad, "CONNECT needs host:port"),
    };
    bad.port = port;
    let host = match parse_host(raw_host, bracketed) {
        Ok(host) => host,
        Err(e) => return fail(bad, &e.to_string()),
    };
    let mut headers = Vec::new();
    for line in lines {
        let Some(line) = line else {
            return fail(bad, "bare LF in a header");
        };
        match parse_header(line) {
            Ok(header) => headers.push(header),
            Err(reason) => return fail(bad, reason),
        }
    }
    let count = |name: &str| {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    };
    // Two ways to frame the body are how requests get smuggled.
    if count("content-length") > 1
        || (count("content-length") > 0 && count("transfer-encoding") > 0)
    {
        return fail(bad, "ambiguous body length");
    }
    Ok(Request {
        method: method.to_owned(),
        host,
        port,
        kind,
        version: version.to_owned(),
        headers,
    })
}

pub(crate) fn parse_header(line: &[u8]) -> Result<(String, Vec<u8>), &'static str> {
    if line.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
        return Err("folded header line");
    }
    let colon = line
        .iter()
        .position(|b| *b == b':')
        .ok_or("header without `:`")?;
    let (name, value) = line.split_at(colon);
    if name.is_empty() || !name.iter().copied().all(is_tchar) {
        return Err("bad header name");
    }
    let value = value[1..].trim_ascii();
    if value.iter().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
        return Err("control character in a header value");
    }
    // `name` is all tchar, hence ASCII.
    let name = String::from_utf8_lossy(name).into_owned();
    Ok((name, value.to_vec()))
}

/// Headers that belong to the client-proxy hop and must not travel on:
/// RFC 9110 section 7.6.1, plus the proxy's own credentials. `Host` is
/// rewritten from the URL so the two cannot disagree.
pub(crate) fn is_hop_by_hop(name: &str, listed: &[String]) -> bool {
    let lower = name.to_ascii_lowercase();
    matches!(
        lower.as_str(),
        "connection" | "keep-alive" | "te" | "upgrade" | "host"
    ) || lower.starts_with("proxy-")
        || listed.contains(&lower)
}

/// Header names a `Connection` header marks as hop-by-hop.
pub(crate) fn connection_listed(headers: &[(String, Vec<u8>)]) -> Vec<String> {
    headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(|b| *b == b','))
        .map(|token| String::from_utf8_lossy(token.trim_ascii()).to_ascii_lowercase())
        .collect()
}

/// The head sent upstream for a forwarded request: origin-form target,
/// `Host` from the URL, no hop-by-hop headers, `Connection: close`.
pub(crate) fn forward_head(req: &Request) -> Vec<u8> {
    let Kind::Forward { path } = &req.kind else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(MAX_HEAD);
    out.extend_from_slice(format!("{} {path} {}\r\n", req.method, req.version).as_bytes());
    let host = match req.port {
        80 => req.host.to_string(),
        port => format!("{}:{port}", req.host),
    };
    out.extend_from_slice(format!("Host: {host}\r\n").as_bytes());
    let listed = connection_listed(&req.headers);
    for (name, value) in &req.headers {
        if !is_hop_by_hop(name, &listed) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The response head to send the client in place of `head`: hop-by-hop
/// headers dropped, `Connection: close` added. `None` leaves it as it is:
/// an interim (1xx) response, or one this parser does not follow (the bytes
/// then pass unchanged; the proxy still closes after the response).
pub(crate) fn rewrite_response_head(head: &[u8]) -> Option<Vec<u8>> {
    let body = head.strip_suffix(b"\n\r\n")?;
    let mut lines = body.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r"));
    let status = lines.next()??;
    if !status.starts_with(b"HTTP/1.") || status.get(9) == Some(&b'1') {
        return None;
    }
    let mut headers = Vec::new();
    for line in lines {
        headers.push(parse_header(line?).ok()?);
    }
    let listed = connection_listed(&headers);
    let mut out = Vec::with_capacity(head.len() + 19);
    out.extend_from_slice(status);
    out.extend_from_slice(b"\r\n");
    for (name, value) in &headers {
        if name.eq_ignore_ascii_case("host") || !is_hop_by_hop(name, &listed) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Some(out)
}

/// RFC 9110 token characters.
pub(crate) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(crate) fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// What of a client's string may go into an event or a message: printable
/// ASCII, at most 255 characters.
pub(crate) fn printable(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(255)
        .collect()
}

#[cfg(test)]
#[path = "http_tests.rs"]
mod tests;
