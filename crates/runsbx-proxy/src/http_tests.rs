#![allow(clippy::unwrap_used)]
use super::*;

fn parse(head: &str) -> Result<Request, BadRequest> {
    parse_request(head.as_bytes())
}

fn reason(head: &str) -> String {
    parse(head).unwrap_err().reason
}

#[test]
fn connect_host_port() {
    let r = parse("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n").unwrap();
    assert_eq!(r.method, "CONNECT");
    assert_eq!(r.host, Host::Name("example.com".into()));
    assert_eq!(r.port, 443);
    assert_eq!(r.kind, Kind::Connect);
    let r = parse("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.host, Host::Ip("2001:db8::1".parse().unwrap()));
    assert_eq!(r.port, 8443);
    let r = parse("CONNECT 2130706433:443 HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.host, Host::Ip("127.0.0.1".parse().unwrap()));
}

#[test]
fn connect_needs_a_port() {
    assert_eq!(
        reason("CONNECT example.com HTTP/1.1\r\n\r\n"),
        "CONNECT needs host:port"
    );
    let bad = parse("CONNECT example.com:99999 HTTP/1.1\r\n\r\n").unwrap_err();
    assert_eq!(bad.method, "CONNECT");
    assert_eq!(bad.host, "example.com:99999");
}

#[test]
fn absolute_form() {
    let r = parse("GET http://Example.com/a/b?c=d HTTP/1.1\r\nAccept: */*\r\n\r\n").unwrap();
    assert_eq!(r.host, Host::Name("example.com".into()));
    assert_eq!(r.port, 80);
    assert_eq!(
        r.kind,
        Kind::Forward {
            path: "/a/b?c=d".into()
        }
    );
    let r = parse("POST HTTP://example.com:8080 HTTP/1.0\r\n\r\n").unwrap();
    assert_eq!(r.port, 8080);
    assert_eq!(r.kind, Kind::Forward { path: "/".into() });
    let r = parse("GET http://example.com?q HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.kind, Kind::Forward { path: "/?q".into() });
    let r = parse("GET http://[::1]:8080/x HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.host, Host::Ip("::1".parse().unwrap()));
    assert_eq!(r.port, 8080);
    let r = parse("GET http://[::ffff:127.0.0.1]/ HTTP/1.1\r\n\r\n").unwrap();
    assert_eq!(r.host, Host::Ip("::ffff:127.0.0.1".parse().unwrap()));
    assert_eq!(r.port, 80);
}

#[test]
fn not_proxy_requests() {
    for head in [
        "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
        "GET https://example.com/ HTTP/1.1\r\n\r\n",
        "GET ftp://example.com/ HTTP/1.1\r\n\r\n",
        "OPTIONS * HTTP/1.1\r\n\r\n",
    ] {
        assert!(reason(head).starts_with("not a proxy request"), "{head}");
    }
}

#[test]
fn garbage_is_refused() {
    for head in [
        "\r\n\r\n",
        "hello\r\n\r\n",
        "GET  http://a.example/ HTTP/1.1\r\n\r\n",
        "GET http://a.example/ HTTP/2\r\n\r\n",
        "GET http://a.example/ HTTP/1.1 x\r\n\r\n",
        "G(T http://a.example/ HTTP/1.1\r\n\r\n",
        "GET http://a.example/\x01 HTTP/1.1\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\nHost: a\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nHost: a\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\n folded\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nno colon\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
        "GET http://a.example/ HTTP/1.1\r\nX: a\rb\r\n\r\n",
        "GET http://user:pw@a.example/ HTTP/1.1\r\n\r\n",
        "GET http://a.example:0/ HTTP/1.1\r\n\r\n",
        "GET http://4294967296/ HTTP/1.1\r\n\r\n",
        "POST http://a.example/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "POST http://a.example/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    ] {
        assert!(parse(head).is_err(), "{head:?}");
    }
    assert!(parse_request(b"GET http://a\xff/ HTTP/1.1\r\n\r\n").is_err());
}

#[test]
fn head_end_finds_the_blank_line() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Some(18));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), None);
}

#[test]
fn forwarded_head_is_origin_form_without_hop_by_hop_headers() {
    let r = parse(concat!(
        "POST http://a.example:8080/up?x=1 HTTP/1.1\r\n",
        "Host: evil.internal\r\n",
        "Proxy-Authorization: Basic eA==\r\n",
        "Proxy-Connection: keep-alive\r\n",
        "Connection: keep-alive, X-Secret\r\n",
        "X-Secret: 1\r\n",
        "Keep-Alive: 5\r\n",
        "TE: trailers\r\n",
        "Upgrade: websocket\r\n",
        "Content-Length: 3\r\n",
        "User-Agent: t\r\n\r\n",
    ))
    .unwrap();
    let head = String::from_utf8(forward_head(&r)).unwrap();
    assert_eq!(
        head,
        concat!(
            "POST /up?x=1 HTTP/1.1\r\n",
            "Host: a.example:8080\r\n",
            "Content-Length: 3\r\n",
            "User-Agent: t\r\n",
            "Connection: close\r\n\r\n",
        )
    );
    let r = parse("GET http://[2001:db8::1]/ HTTP/1.0\r\n\r\n").unwrap();
    let head = String::from_utf8(forward_head(&r)).unwrap();
    assert_eq!(
        head,
        "GET / HTTP/1.0\r\nHost: [2001:db8::1]\r\nConnection: close\r\n\r\n"
    );
}

#[test]
fn response_head_gets_connection_close() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n";
    let out = String::from_utf8(rewrite_response_head(head).unwrap()).unwrap();
    assert_eq!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(
        rewrite_response_head(b"HTTP/1.1 100 Continue\r\n\r\n"),
        None
    );
    assert_eq!(rewrite_response_head(b"ICY 200 OK\r\n\r\n"), None);
    assert_eq!(rewrite_response_head(b"HTTP/1.1 200 OK\nA: b\n\n"), None);
}

#[test]
fn printable_strips_controls_and_bounds_length() {
    assert_eq!(printable("a\r\nb\x1b[31m c"), "ab[31mc");
    assert_eq!(printable(&"x".repeat(1000)).len(), 255);
}
