//! Real servers on 127.0.0.1 and a small client, for the proxy tests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use runsbx_proxy::{spawn, Allowlist, ProxyConfig, ProxyHandle};

/// A server thread; counts the connections it accepts.
pub struct Server {
    pub addr: SocketAddr,
    pub accepts: Arc<AtomicUsize>,
    /// Request heads received (HTTP server only).
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
    pub fn accepted(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

fn serve(handler: fn(TcpStream, &Mutex<Vec<String>>)) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepts = Arc::new(AtomicUsize::new(0));
    let heads = Arc::new(Mutex::new(Vec::new()));
    let (a, h) = (Arc::clone(&accepts), Arc::clone(&heads));
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            a.fetch_add(1, Ordering::SeqCst);
            let h = Arc::clone(&h);
            thread::spawn(move || handler(stream, &h));
        }
    });
    Server {
        addr,
        accepts,
        heads,
    }
}

/// Answers `hello` to a GET, and the body's length to anything with a body.
pub fn http_server() -> Server {
    serve(|mut stream, heads| {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .unwrap_or(0);
        heads.lock().unwrap().push(head);
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).unwrap();
        let reply = if length == 0 {
            "hello".to_owned()
        } else {
            format!("got {length}")
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n{reply}",
            reply.len()
        );
        let _ = stream.write_all(response.as_bytes());
    })
}

/// Echoes every byte back.
pub fn echo_server() -> Server {
    serve(|mut stream, _| {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stream.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// A proxy on an ephemeral 127.0.0.1 port.
pub fn proxy(config: ProxyConfig) -> ProxyHandle {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    spawn(listener, config).unwrap()
}

/// The usual test set-up: `allowed.test` is 127.0.0.1 and allowed at `port`,
/// and 127.0.0.1:`port` is exempt from the address-class check.
pub fn config_for(port: u16) -> ProxyConfig {
    let mut config = ProxyConfig::new(Allowlist::parse([format!("allowed.test:{port}")]).unwrap());
    config.hosts = HashMap::from([(
        "allowed.test".to_owned(),
        vec!["127.0.0.1".parse().unwrap()],
    )]);
    config.allow_addresses = vec![SocketAddr::from(([127, 0, 0, 1], port))];
    config
}

pub fn connect(proxy: &ProxyHandle) -> TcpStream {
    let stream = TcpStream::connect(proxy.local_addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// A response: status code, head, body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

pub fn parse_response(raw: &[u8]) -> Response {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Response {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// Send `raw` as one request and read the whole answer (until close).
pub fn request(proxy: &ProxyHandle, raw: &str) -> Response {
    let mut stream = connect(proxy);
    stream.write_all(raw.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    parse_response(&out)
}

/// Send a CONNECT and read the proxy's answer head only; the stream is left
/// at the start of the tunnel.
pub fn open_tunnel(proxy: &ProxyHandle, target: &str) -> (Response, TcpStream) {
    let mut stream = connect(proxy);
    write!(
        stream,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    let mut response = parse_response(&head);
    if response.status != 200 {
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
        response.body = String::from_utf8_lossy(&rest).into_owned();
    }
    (response, stream)
}

/// Open descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}
