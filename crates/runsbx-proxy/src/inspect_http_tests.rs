#![allow(clippy::unwrap_used)]
use super::*;

fn host() -> Host {
    Host::Name("api.example.com".into())
}

fn parse(head: &str) -> Result<(InspectedRequest, Body), String> {
    parse_request(head.as_bytes(), &host(), 443)
}

fn reason(head: &str) -> String {
    parse(head).unwrap_err()
}

#[test]
fn origin_form_requests() {
    let (req, body) = parse("GET /v1/x?y=1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n").unwrap();
    assert_eq!(req.method(), "GET");
    assert_eq!(req.path(), "/v1/x?y=1");
    assert_eq!(req.version(), "HTTP/1.1");
    assert_eq!(req.header("HOST"), Some(&b"api.example.com"[..]));
    assert_eq!(body, Body::None);
    // Any spelling of the tunnel's host and port.
    let (_, body) =
        parse("POST / HTTP/1.1\r\nHost: API.example.com.:443\r\nContent-Length: 12\r\n\r\n")
            .unwrap();
    assert_eq!(body, Body::Length(12));
    let (_, body) =
        parse("POST / HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: Chunked\r\n\r\n")
            .unwrap();
    assert_eq!(body, Body::Chunked);
    // Absolute form naming the tunnel's own authority.
    let (req, _) =
        parse("GET https://api.example.com/a HTTP/1.1\r\nHost: api.example.com\r\n\r\n").unwrap();
    assert_eq!(req.path(), "/a");
    let (req, _) =
        parse("GET https://api.example.com?q HTTP/1.1\r\nHost: api.example.com\r\n\r\n").unwrap();
    assert_eq!(req.path(), "/?q");
    // Another port: the Host header must carry it.
    let r = parse_request(
        b"GET / HTTP/1.1\r\nHost: api.example.com:8443\r\n\r\n",
        &host(),
        8443,
    );
    assert!(r.is_ok());
    let r = parse_request(
        b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
        &host(),
        8443,
    );
    assert!(r.unwrap_err().contains("api.example.com:8443"));
}

#[test]
fn domain_fronting_is_refused() {
    for head in [
        "GET / HTTP/1.1\r\nHost: evil.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.example.com:444\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: user@api.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.example.com\r\n\r\n",
        "GET / HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.0\r\n\r\n",
        "GET https://evil.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
        "GET https://api.example.com/ HTTP/1.1\r\nHost: evil.example.com\r\n\r\n",
        "GET https://x@api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
    ] {
        assert!(parse(head).is_err(), "{head:?}");
    }
    assert_eq!(
        reason("GET / HTTP/1.1\r\nHost: evil.example.com\r\n\r\n"),
        "Host `evil.example.com` is not api.example.com, the host this tunnel was opened to"
    );
}

#[test]
fn ambiguous_heads_are_refused() {
    let h = "Host: api.example.com\r\n";
    for (head, why) in [
        (format!("GET / HTTP/1.1\n{h}\r\n"), "bare LF"),
        ("GET / HTTP/1.1\r\nHost: api.example.com\n\r\n".to_owned(), "bare LF"),
        (format!("GET / HTTP/1.1\r\n{h} folded\r\n\r\n"), "folded"),
        (format!("GET http://api.example.com/ HTTP/1.1\r\n{h}\r\n"), "origin-form"),
        (format!("GET * HTTP/1.1\r\n{h}\r\n"), "origin-form"),
        (format!("CONNECT api.example.com:443 HTTP/1.1\r\n{h}\r\n"), "CONNECT"),
        (format!("GET / HTTP/2\r\n{h}\r\n"), "only HTTP/1.1"),
        (format!("PRI * HTTP/2.0\r\n{h}\r\n"), "only HTTP/1.1"),
        (format!("GET  / HTTP/1.1\r\n{h}\r\n"), "request line"),
        (format!("POST / HTTP/1.1\r\n{h}Content-Length: 1\r\nContent-Length: 1\r\n\r\n"), "ambiguous"),
        (format!("POST / HTTP/1.1\r\n{h}Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"), "ambiguous"),
        (format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), "ambiguous"),
        (format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: gzip, chunked\r\n\r\n"), "other than `chunked`"),
        (format!("POST / HTTP/1.1\r\n{h}Content-Length: +1\r\n\r\n"), "Content-Length"),
        (format!("POST / HTTP/1.1\r\n{h}Content-Length: 1, 1\r\n\r\n"), "Content-Length"),
        (format!("POST / HTTP/1.1\r\n{h}Content-Length: 99999999999999999999\r\n\r\n"), "Content-Length"),
        (format!("POST / HTTP/1.0\r\n{h}Transfer-Encoding: chunked\r\n\r\n"), "HTTP/1.0"),
        (format!("GET / HTTP/1.1\r\n{h}Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n"), "Upgrade"),
        (format!("GET / HTTP/1.1\r\n{h}Upgrade: h2c\r\n\r\n"), "Upgrade"),
    ] {
        let got = parse(&head).unwrap_err();
        assert!(got.contains(why), "{head:?}: {got}");
    }
}

#[test]
fn the_upstream_head_is_origin_form_with_the_proxys_framing() {
    let (mut req, body) = parse(concat!(
        "POST https://api.example.com/up HTTP/1.1\r\n",
        "Host: API.EXAMPLE.COM\r\n",
        "Proxy-Authorization: Basic eA==\r\n",
        "Connection: keep-alive, X-Hop\r\n",
        "X-Hop: 1\r\n",
        "Keep-Alive: 5\r\n",
        "TE: trailers\r\n",
        "Content-Length: 3\r\n",
        "Authorization: Bearer SENTINEL\r\n\r\n",
    ))
    .unwrap();
    // A check that changes the credential, and tries to change the framing.
    for (name, value) in &mut req.headers {
        if name.eq_ignore_ascii_case("authorization") {
            *value = b"Bearer real".to_vec();
        }
        if name.eq_ignore_ascii_case("content-length") {
            *value = b"0".to_vec();
        }
    }
    req.headers
        .push(("Transfer-Encoding".into(), b"chunked".to_vec()));
    let head = upstream_head(&req, body, &host(), 443).unwrap();
    assert_eq!(
        String::from_utf8(head).unwrap(),
        concat!(
            "POST /up HTTP/1.1\r\n",
            "Host: api.example.com\r\n",
            "Authorization: Bearer real\r\n",
            "Content-Length: 3\r\n",
            "Connection: close\r\n\r\n",
        )
    );
    req.headers
        .push(("X-Bad".into(), b"a\r\nX-Smuggled: 1".to_vec()));
    assert!(upstream_head(&req, body, &host(), 443).is_err());
    req.headers.pop();
    req.headers.push(("Bad Name".into(), b"1".to_vec()));
    assert!(upstream_head(&req, body, &host(), 443).is_err());
    let (req, body) = parse_request(
        b"GET / HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n",
        &"::1".parse().unwrap(),
        8443,
    )
    .unwrap();
    let head = upstream_head(&req, body, &"::1".parse().unwrap(), 8443).unwrap();
    assert_eq!(
        String::from_utf8(head).unwrap(),
        "GET / HTTP/1.1\r\nHost: [::1]:8443\r\nConnection: close\r\n\r\n"
    );
}

/// Feed `input` in pieces of `step` bytes; the body's length, or the error.
fn chunked_len(input: &[u8], step: usize) -> Result<Option<usize>, &'static str> {
    let mut c = Chunked::new();
    let mut total = 0;
    for piece in input.chunks(step) {
        let n = c.feed(piece)?;
        total += n;
        if c.done() {
            return Ok(Some(total));
        }
        assert_eq!(n, piece.len());
    }
    Ok(None)
}

#[test]
fn chunked_bodies_end_exactly_at_their_last_byte() {
    let body =
        b"5\r\nhello\r\n1a;name=\"v\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Sum: 1\r\n\r\n";
    let mut input = body.to_vec();
    input.extend_from_slice(b"GET /next HTTP/1.1\r\n\r\n");
    for step in 1..=input.len() {
        assert_eq!(
            chunked_len(&input, step),
            Ok(Some(body.len())),
            "step {step}"
        );
    }
    assert_eq!(chunked_len(b"0\r\n\r\nrest", 100), Ok(Some(5)));
    assert_eq!(chunked_len(b"00A\r\n0123456789\r\n", 100), Ok(None));
    assert_eq!(chunked_len(b"ffffffffffffffff\r\n", 100), Ok(None));
}

#[test]
fn malformed_chunked_bodies_are_refused() {
    for bad in [
        &b"\r\n"[..],
        b"x\r\n",
        b"5\nhello\r\n",
        b"5\r\nhello\n",
        b"5\r\nhelloX\r\n",
        b"-5\r\n",
        b"0x5\r\n",
        b" 5\r\n",
        b"5 \r\n",
        b";ext\r\n",
        b"5;a\x01\r\n",
        b"10000000000000000\r\n",
        b"0\r\nX-Sum: 1\n\r\n",
        b"0\r\n folded: 1\r\n\r\n",
        b"0\r\nno colon\r\n\r\n",
        b"0\r\n\n",
    ] {
        assert!(
            chunked_len(bad, 1).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
        assert!(
            chunked_len(bad, 100).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
    assert!(chunked_len(long.as_bytes(), 100).is_err());
}
