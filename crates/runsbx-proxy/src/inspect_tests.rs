//! Real TLS on loopback: a client that trusts only the sandbox CA, the
//! inspector, and an upstream with its own test CA that records every byte
//! it receives.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, ServerConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const UPSTREAM: &str = "upstream.test";
const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\n\r\nok";

/// A test CA and an upstream server config with a leaf for `names`.
fn upstream_pki(names: &[&str]) -> (String, Arc<ServerConfig>) {
    let ca_key = KeyPair::generate().unwrap();
    // Each test CA its own name, so that an untrusted one is unknown by
    // name and not merely a bad signature under a trusted name.
    static CAS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("upstream test CA {n}"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(params, ca_key);
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
    (ca_cert.pem(), Arc::new(config))
}

/// What the upstream does: when what it received so far satisfies a step's
/// test, it sends that step's bytes; after the last step it closes its side
/// (close_notify) and keeps reading until the proxy closes.
type Step = (fn(&[u8]) -> bool, &'static [u8]);

/// What the upstream saw: `None` when no TLS session was ever made.
type Seen = JoinHandle<Option<Vec<u8>>>;

async fn upstream(config: Arc<ServerConfig>, steps: Vec<Step>) -> (SocketAddr, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.ok()?;
        let mut tls = tokio_rustls::TlsAcceptor::from(config)
            .accept(tcp)
            .await
            .ok()?;
        let mut got = Vec::new();
        let mut steps = steps.into_iter().peekable();
        let mut buf = [0u8; 4096];
        let _ = timeout(Duration::from_secs(5), async {
            loop {
                while let Some((ready, bytes)) = steps.peek() {
                    if !ready(&got) {
                        break;
                    }
                    tls.write_all(bytes).await?;
                    tls.flush().await?;
                    steps.next();
                    if steps.peek().is_none() {
                        tls.shutdown().await?;
                    }
                }
                match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => return io::Result::Ok(()),
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        Some(got)
    });
    (addr, seen)
}

fn has_head(got: &[u8]) -> bool {
    head_end(got).is_some()
}

fn allow_all(_: &mut InspectedRequest) -> Verdict {
    Verdict::Allow
}

struct Tunnel {
    client: TcpStream,
    outcome: JoinHandle<Inspected>,
    ca: Arc<SandboxCa>,
    port: u16,
    /// What `inspect` told of refusals, in order.
    told: Arc<Mutex<Vec<Inspected>>>,
    /// The bytes `inspect` counted: from the client, from the upstream.
    counted: Arc<(AtomicU64, AtomicU64)>,
}

/// The proxy's side of a CONNECT to `host` at the upstream's port: what
/// the server does before it calls `inspect`.
async fn tunnel(
    host: Host,
    upstream: SocketAddr,
    trust: UpstreamTrust,
    check: fn(&mut InspectedRequest) -> Verdict,
    limits: InspectLimits,
) -> Tunnel {
    tunnel_telling(host, upstream, trust, check, limits, Arc::new(|_| {})).await
}

/// [`tunnel`], whose refusals are also told to `also` (from the task that
/// runs `inspect`).
async fn tunnel_telling(
    host: Host,
    upstream: SocketAddr,
    trust: UpstreamTrust,
    check: fn(&mut InspectedRequest) -> Verdict,
    limits: InspectLimits,
    also: Arc<dyn Fn(&Inspected) + Send + Sync>,
) -> Tunnel {
    let ca = Arc::new(SandboxCa::new().unwrap());
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(proxy.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = proxy.accept().await.unwrap();
    let up = TcpStream::connect(upstream).await.unwrap();
    let port = upstream.port();
    let inspector_ca = Arc::clone(&ca);
    let told = Arc::new(Mutex::new(Vec::new()));
    let teller = Arc::clone(&told);
    let counted = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
    let counters = Arc::clone(&counted);
    let outcome = tokio::spawn(async move {
        inspect(
            accepted,
            up,
            &host,
            port,
            &inspector_ca,
            &trust,
            &limits,
            &check,
            &|refusal: &Inspected| {
                also(refusal);
                teller.lock().unwrap().push(refusal.clone());
            },
            (&counters.0, &counters.1),
        )
        .await
    });
    Tunnel {
        client,
        outcome,
        ca,
        port,
        told,
        counted,
    }
}

fn trust(ca_pem: &str) -> UpstreamTrust {
    UpstreamTrust::empty()
        .unwrap()
        .with_roots_pem(ca_pem.as_bytes())
        .unwrap()
}

/// The sandbox's client: trusts only `ca_pem`.
async fn client_tls(
    tcp: TcpStream,
    ca_pem: &str,
    name: &str,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(trust(ca_pem).roots_for_tests())
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = ServerName::try_from(name.to_owned()).unwrap();
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
}

/// Send `request`, read the answer until the proxy closes.
async fn send(t: Tunnel, request: &[u8]) -> (String, Inspected) {
    let (answer, _, outcome) = send_told(t, request).await;
    (answer, outcome)
}

/// [`send`], and the refusals `inspect` had told of when the answer was
/// read.
async fn send_told(t: Tunnel, request: &[u8]) -> (String, Vec<Inspected>, Inspected) {
    let mut tls = client_tls(t.client, t.ca.certificate_pem(), UPSTREAM)
        .await
        .unwrap();
    tls.write_all(request).await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = timeout(Duration::from_secs(5), tls.read_to_end(&mut answer)).await;
    let told = t.told.lock().unwrap().clone();
    let outcome = t.outcome.await.unwrap();
    (String::from_utf8_lossy(&answer).into_owned(), told, outcome)
}

async fn seen(upstream: Seen) -> Option<String> {
    upstream
        .await
        .unwrap()
        .map(|got| String::from_utf8_lossy(&got).into_owned())
}

fn host() -> Host {
    Host::Name(UPSTREAM.into())
}

#[tokio::test]
async fn get_goes_upstream_in_origin_form_without_proxy_headers() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let port = t.port;
    let request = format!(
        "GET https://{UPSTREAM}:{port}/v1/items?q=1 HTTP/1.1\r\nHost: {UPSTREAM}:{port}\r\n\
         Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n"
    );
    let (answer, told, outcome) = send_told(t, request.as_bytes()).await;
    assert_eq!(
        answer,
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    );
    assert_eq!(told, []);
    assert_eq!(
        seen(up).await.unwrap(),
        format!(
            "GET /v1/items?q=1 HTTP/1.1\r\nHost: {UPSTREAM}:{port}\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        )
    );
    let Inspected::Forwarded {
        method,
        path,
        status,
        end,
        ..
    } = outcome
    else {
        panic!("{outcome:?}");
    };
    assert_eq!(
        (method.as_str(), path.as_str(), status, end),
        ("GET", "/v1/items?q=1", Some(200), RelayEnd::Done)
    );
}

fn read_only() -> DenyReason {
    DenyReason::RequestNotAllowed {
        rules: vec!["GET /**".into()],
    }
}

fn deny_post(req: &mut InspectedRequest) -> Verdict {
    match req.method() {
        "POST" => Verdict::Deny {
            reason: read_only(),
            message: "runsbx: POST to upstream.test is not allowed (rule read-only)".into(),
        },
        _ => Verdict::Allow,
    }
}

#[tokio::test]
async fn a_denied_request_never_reaches_the_upstream() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        deny_post,
        InspectLimits::default(),
    )
    .await;
    let request = format!(
        "POST /v1/items HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\nContent-Length: 5\r\n\r\nhello",
        t.port
    );
    let (answer, told, outcome) = send_told(t, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(answer.contains("\r\nContent-Type: text/plain"), "{answer}");
    assert!(
        answer.contains("\r\nX-Runsbx-Deny: request_not_allowed\r\n"),
        "{answer}"
    );
    assert!(answer.contains("\r\nConnection: close\r\n"), "{answer}");
    assert!(
        answer.ends_with("\r\n\r\nrunsbx: POST to upstream.test is not allowed (rule read-only)\n")
    );
    // Not one TLS byte: the upstream's handshake never completed.
    assert_eq!(seen(up).await, None);
    assert_eq!(
        outcome,
        Inspected::Denied {
            method: "POST".into(),
            path: "/v1/items".into(),
            reason: read_only(),
            message: "runsbx: POST to upstream.test is not allowed (rule read-only)".into(),
        }
    );
    // Told before the client had its answer: a call whose command exits
    // on its 403 reports the refusal.
    assert_eq!(told, [outcome]);
}

fn inject_credential(req: &mut InspectedRequest) -> Verdict {
    for (name, value) in &mut req.headers {
        if name.eq_ignore_ascii_case("authorization") && value == b"Bearer SENTINEL" {
            *value = b"Bearer real-secret".to_vec();
        }
    }
    Verdict::Allow
}

#[tokio::test]
async fn a_header_changed_by_the_check_arrives_changed() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        inject_credential,
        InspectLimits::default(),
    )
    .await;
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\nAuthorization: Bearer SENTINEL\r\n\r\n",
        t.port
    );
    let (answer, _) = send(t, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let got = seen(up).await.unwrap();
    assert!(
        got.contains("\r\nAuthorization: Bearer real-secret\r\n"),
        "{got}"
    );
    assert!(!got.contains("SENTINEL"), "{got}");
}

#[tokio::test]
async fn a_pipelined_second_request_is_not_forwarded() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        deny_post,
        InspectLimits::default(),
    )
    .await;
    let h = format!("Host: {UPSTREAM}:{}\r\n", t.port);
    // The second request is one the check would refuse.
    let request = format!(
        "GET /first HTTP/1.1\r\n{h}\r\nPOST /second HTTP/1.1\r\n{h}Content-Length: 2\r\n\r\nhi"
    );
    let (answer, outcome) = send(t, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("Connection: close"), "{answer}");
    let got = seen(up).await.unwrap();
    assert_eq!(
        got,
        format!("GET /first HTTP/1.1\r\n{h}Connection: close\r\n\r\n")
    );
    assert!(
        matches!(outcome, Inspected::Forwarded { .. }),
        "{outcome:?}"
    );
}

fn has_last_chunk(got: &[u8]) -> bool {
    got.ends_with(b"0\r\nX-Checksum: 1\r\n\r\n")
}

#[tokio::test]
async fn a_chunked_upload_arrives_whole_and_exactly() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_last_chunk, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let big = "z".repeat(40_000);
    let body = format!(
        "5\r\nhello\r\n{:x};ext=1\r\n{big}\r\n0\r\nX-Checksum: 1\r\n\r\n",
        big.len()
    );
    let head = format!(
        "POST /upload HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\nTransfer-Encoding: chunked\r\n\r\n",
        t.port
    );
    let trailing = format!("GET /smuggled HTTP/1.1\r\nHost: {UPSTREAM}\r\n\r\n");
    let (answer, outcome) = send(t, format!("{head}{body}{trailing}").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    let got = seen(up).await.unwrap();
    let want_head = head.replace(
        "Transfer-Encoding: chunked\r\n\r\n",
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(got, format!("{want_head}{body}"));
    let Inspected::Forwarded { end, status, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert_eq!((end, status), (RelayEnd::Done, Some(200)));
}

fn has_five_body_bytes(got: &[u8]) -> bool {
    head_end(got).is_some_and(|end| got.len() - end == 5)
}

#[tokio::test]
async fn expect_100_continue_works_through_inspection() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let steps: Vec<Step> = vec![
        (has_head, b"HTTP/1.1 100 Continue\r\n\r\n"),
        (has_five_body_bytes, OK),
    ];
    let (addr, up) = upstream(config, steps).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let mut tls = client_tls(t.client, t.ca.certificate_pem(), UPSTREAM)
        .await
        .unwrap();
    let head = format!(
        "PUT /x HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        t.port
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let mut interim = [0u8; 25];
    tls.read_exact(&mut interim).await.unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    tls.write_all(b"hello").await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    );
    assert!(seen(up).await.unwrap().ends_with("\r\n\r\nhello"));
    let outcome = t.outcome.await.unwrap();
    assert!(
        matches!(
            outcome,
            Inspected::Forwarded {
                status: Some(200),
                end: RelayEnd::Done,
                ..
            }
        ),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_host_header_naming_another_host_is_refused() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let (answer, told, outcome) =
        send_told(t, b"GET / HTTP/1.1\r\nHost: internal.example\r\n\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(answer.contains("X-Runsbx-Deny: bad_request"), "{answer}");
    assert!(
        answer.contains("Host `internal.example` is not"),
        "{answer}"
    );
    assert_eq!(seen(up).await, None);
    assert!(matches!(&outcome, Inspected::BadRequest(r) if r.contains("internal.example")));
    assert_eq!(told, [outcome]);
}

async fn upstream_tls_failure(
    presented: &[&str],
    trusted_pem: Option<&str>,
) -> (String, Inspected) {
    let (ca_pem, config) = upstream_pki(presented);
    let (addr, _up) = upstream(config, vec![(has_head, OK)]).await;
    let trust = trust(trusted_pem.unwrap_or(&ca_pem));
    let t = tunnel(host(), addr, trust, allow_all, InspectLimits::default()).await;
    let request = format!("GET / HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\n\r\n", t.port);
    let (answer, told, outcome) = send_told(t, request.as_bytes()).await;
    assert_eq!(told, std::slice::from_ref(&outcome), "{answer}");
    (answer, outcome)
}

#[tokio::test]
async fn an_upstream_certificate_for_another_name_is_refused() {
    let (answer, outcome) = upstream_tls_failure(&["other.test"], None).await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(answer.contains("not valid for name"), "{answer}");
    let Inspected::UpstreamTls { reason, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(reason.contains("not valid for name"), "{reason}");
}

#[tokio::test]
async fn an_upstream_from_an_untrusted_ca_is_refused() {
    let (other_pem, _) = upstream_pki(&[UPSTREAM]);
    let (answer, outcome) = upstream_tls_failure(&[UPSTREAM], Some(&other_pem)).await;
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    let Inspected::UpstreamTls { reason, .. } = outcome else {
        panic!("{outcome:?}");
    };
    assert!(reason.contains("UnknownIssuer"), "{reason}");
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_fails_its_handshake() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let stranger = SandboxCa::new().unwrap();
    let err = client_tls(t.client, stranger.certificate_pem(), UPSTREAM)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    let outcome = t.outcome.await.unwrap();
    assert!(matches!(outcome, Inspected::ClientTls(_)), "{outcome:?}");
    assert_eq!(seen(up).await, None);
}

#[tokio::test]
async fn sni_for_another_host_is_refused() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, _up) = upstream(config, vec![(has_head, OK)]).await;
    let t = tunnel(
        host(),
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    // A verifying client refuses the leaf (named for upstream.test) during
    // the handshake; the inspector's own SNI check is there for one that
    // does not verify. Either way no request is read.
    let err = client_tls(t.client, t.ca.certificate_pem(), "other.test")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not valid for name"), "{err}");
    let outcome = t.outcome.await.unwrap();
    assert!(matches!(&outcome, Inspected::ClientTls(_)), "{outcome:?}");
}

#[tokio::test]
async fn a_head_not_sent_in_time_gets_408() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let limits = InspectLimits {
        header_timeout: Duration::from_millis(300),
        ..InspectLimits::default()
    };
    let t = tunnel(host(), addr, trust(&ca_pem), allow_all, limits).await;
    let (answer, outcome) = send(t, b"GET / HTTP/1.1\r\n").await;
    assert!(
        answer.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
        "{answer}"
    );
    assert_eq!(outcome, Inspected::HeaderTimeout);
    assert_eq!(seen(up).await, None);
}

#[tokio::test]
async fn an_ip_host_is_inspected_by_its_ip() {
    let (ca_pem, config) = upstream_pki(&["127.0.0.1"]);
    let (addr, up) = upstream(config, vec![(has_head, OK)]).await;
    let ip = Host::Ip("127.0.0.1".parse().unwrap());
    let t = tunnel(
        ip,
        addr,
        trust(&ca_pem),
        allow_all,
        InspectLimits::default(),
    )
    .await;
    let mut tls = {
        let mut config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(trust(t.ca.certificate_pem()).roots_for_tests())
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let name = ServerName::IpAddress("127.0.0.1".parse::<std::net::IpAddr>().unwrap().into());
        TlsConnector::from(Arc::new(config))
            .connect(name, t.client)
            .await
            .unwrap()
    };
    let request = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n", t.port);
    tls.write_all(request.as_bytes()).await.unwrap();
    tls.flush().await.unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
    assert!(seen(up)
        .await
        .unwrap()
        .starts_with("GET / HTTP/1.1\r\nHost: 127.0.0.1:"));
}

/// The kernel's TCP state of the IPv4 loopback socket bound to `port`, as
/// /proc/net/tcp gives it ("01" established, "08" close-wait: the peer
/// closed).
fn tcp_state(port: u16) -> String {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(1) == Some(&local.as_str())).then(|| fields[3].to_owned())
        })
        .unwrap_or_else(|| panic!("no socket on 127.0.0.1:{port} in /proc/net/tcp"))
}

/// A response past the byte budget: the relay ends `Budget`, and the caller
/// is told before the client can see its connection end (a sandbox that
/// exits on its end of file ends its call, whose result must count the
/// `limit_reached`). When told, the proxy must not have closed the
/// connection yet: the client's socket is still established, not in
/// close-wait (on loopback, the proxy's close reaches it at once).
#[tokio::test]
async fn a_spent_budget_is_told_before_the_client_sees_the_end() {
    let (ca_pem, config) = upstream_pki(&[UPSTREAM]);
    let body = "x".repeat(100_000);
    let big = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let big: &'static [u8] = Box::leak(big.into_bytes().into_boxed_slice());
    let (addr, _up) = upstream(config, vec![(has_head, big)]).await;
    let limits = InspectLimits {
        max_bytes: 10_000,
        ..InspectLimits::default()
    };
    // The client's port, and its socket's state each time `inspect` told.
    let client_port = Arc::new(std::sync::atomic::AtomicU16::new(0));
    let states_when_told = Arc::new(Mutex::new(Vec::new()));
    let also: Arc<dyn Fn(&Inspected) + Send + Sync> = {
        let (port, states) = (Arc::clone(&client_port), Arc::clone(&states_when_told));
        Arc::new(move |_| {
            let state = tcp_state(port.load(Ordering::SeqCst));
            states.lock().unwrap().push(state);
        })
    };
    let t = tunnel_telling(host(), addr, trust(&ca_pem), allow_all, limits, also).await;
    client_port.store(t.client.local_addr().unwrap().port(), Ordering::SeqCst);
    let counted = Arc::clone(&t.counted);
    let request = format!("GET /big HTTP/1.1\r\nHost: {UPSTREAM}:{}\r\n\r\n", t.port);
    let (answer, told, outcome) = send_told(t, request.as_bytes()).await;
    // What was relayed before the budget was spent, at most (here none:
    // the first read from the upstream is past it).
    assert!(
        answer.len() <= 10_000,
        "{} bytes came through",
        answer.len()
    );
    let budget = |o: &Inspected| {
        matches!(
            o,
            Inspected::Forwarded {
                end: RelayEnd::Budget,
                ..
            }
        )
    };
    assert!(budget(&outcome), "{outcome:?}");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(budget(&told[0]), "{told:?}");
    assert_eq!(
        *states_when_told.lock().unwrap(),
        ["01"],
        "established when told"
    );
    // Counted as relayed: the budget and the read that went past it.
    let (up, down) = (
        counted.0.load(Ordering::SeqCst),
        counted.1.load(Ordering::SeqCst),
    );
    assert!(up > 0 && up + down > 10_000, "up {up}, down {down}");
}
