#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{parse_x509_certificate, X509Certificate};

fn der_of_pem(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// A handshake over an in-memory pipe: a client that trusts only `ca_pem`
/// and offers `alpn`, asking for `name`. Returns the certificate the server
/// presented and the protocol agreed, or the client's error.
async fn handshake(
    server: Arc<ServerConfig>,
    ca_pem: &str,
    name: ServerName<'static>,
    alpn: &[&[u8]],
) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    let roots = UpstreamTrust::empty()
        .unwrap()
        .with_roots_pem(ca_pem.as_bytes())
        .unwrap()
        .roots;
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let (c, s) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let mut tls = tokio_rustls::TlsAcceptor::from(server)
            .accept(s)
            .await
            .ok()?;
        let mut byte = [0u8; 1];
        tls.read_exact(&mut byte).await.ok()?;
        Some(())
    });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let result = match connector.connect(name, c).await {
        Ok(mut tls) => {
            tls.write_all(b"x").await.unwrap();
            tls.flush().await.unwrap();
            let (_, conn) = tls.get_ref();
            let cert = conn.peer_certificates().unwrap()[0].to_vec();
            Ok((cert, conn.alpn_protocol().map(<[u8]>::to_vec)))
        }
        Err(e) => Err(e.to_string()),
    };
    let _ = server.await;
    result
}

fn name(s: &str) -> ServerName<'static> {
    ServerName::try_from(s.to_owned()).unwrap()
}

fn parse(der: &[u8]) -> X509Certificate<'_> {
    parse_x509_certificate(der).unwrap().1
}

#[test]
fn ca_is_a_short_lived_ca_for_leaves_only() {
    let ca = SandboxCa::new().unwrap();
    assert!(ca
        .certificate_pem()
        .starts_with("-----BEGIN CERTIFICATE-----"));
    assert!(!ca.certificate_pem().contains("PRIVATE KEY"));
    let der = der_of_pem(ca.certificate_pem());
    let cert = parse(&der);
    let cn = cert.subject().iter_common_name().next().unwrap();
    let cn = cn.as_str().unwrap();
    assert!(cn.starts_with("runsbx sandbox CA "), "{cn}");
    assert_eq!(cn.len(), "runsbx sandbox CA ".len() + 16);
    assert_eq!(cn, ca.subject());
    let bc = cert.basic_constraints().unwrap().unwrap().value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0));
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.key_cert_sign() && ku.crl_sign());
    assert!(!ku.digital_signature());
    let validity = cert.validity();
    let now = x509_parser::time::ASN1Time::now().timestamp();
    let from = validity.not_before.timestamp();
    let to = validity.not_after.timestamp();
    assert!(
        (now - 3600 - from).abs() < 60,
        "not_before {from}, now {now}"
    );
    assert!(
        (to - now - 7 * 24 * 3600).abs() < 60,
        "not_after {to}, now {now}"
    );
    // Two CAs are two names and two keys.
    let other = SandboxCa::new().unwrap();
    assert_ne!(other.subject(), ca.subject());
    assert_ne!(other.certificate_pem(), ca.certificate_pem());
    assert!(!format!("{ca:?}").contains("PRIVATE"));
}

#[tokio::test]
async fn leaf_names_the_host_as_dns_san() {
    let ca = SandboxCa::new().unwrap();
    let host: Host = "api.example.com".parse().unwrap();
    let config = ca.server_config(&host).unwrap();
    let (der, alpn) = handshake(
        Arc::clone(&config),
        ca.certificate_pem(),
        name("api.example.com"),
        &[b"h2", b"http/1.1"],
    )
    .await
    .unwrap();
    // A client that offers h2 first still gets HTTP/1.1.
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    let cert = parse(&der);
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        san.general_names,
        vec![GeneralName::DNSName("api.example.com")]
    );
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    let ca_cert_der = der_of_pem(ca.certificate_pem());
    assert_eq!(cert.issuer(), parse(&ca_cert_der).subject());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && !eku.client_auth);
    // The leaf is good for that name only.
    let err = handshake(config, ca.certificate_pem(), name("other.example.com"), &[])
        .await
        .unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn leaf_for_an_ip_has_an_ip_san() {
    let ca = SandboxCa::new().unwrap();
    let host: Host = "192.0.2.7".parse().unwrap();
    let config = ca.server_config(&host).unwrap();
    let ip = ServerName::IpAddress("192.0.2.7".parse::<std::net::IpAddr>().unwrap().into());
    let (der, _) = handshake(Arc::clone(&config), ca.certificate_pem(), ip, &[])
        .await
        .unwrap();
    let cert = parse(&der);
    let san = cert.subject_alternative_name().unwrap().unwrap().value;
    assert_eq!(
        san.general_names,
        vec![GeneralName::IPAddress(&[192, 0, 2, 7])]
    );
    // Not as a DNS name.
    let err = handshake(config, ca.certificate_pem(), name("example.com"), &[])
        .await
        .unwrap_err();
    assert!(err.contains("not valid for name"), "{err}");
}

#[tokio::test]
async fn a_client_that_speaks_only_h2_is_refused() {
    let ca = SandboxCa::new().unwrap();
    let host: Host = "example.com".parse().unwrap();
    let config = ca.server_config(&host).unwrap();
    let err = handshake(config, ca.certificate_pem(), name("example.com"), &[b"h2"])
        .await
        .unwrap_err();
    assert!(err.contains("NoApplicationProtocol"), "{err}");
}

#[tokio::test]
async fn another_sandboxs_ca_is_not_trusted() {
    let ca = SandboxCa::new().unwrap();
    let other = SandboxCa::new().unwrap();
    let host: Host = "example.com".parse().unwrap();
    let err = handshake(
        ca.server_config(&host).unwrap(),
        other.certificate_pem(),
        name("example.com"),
        &[],
    )
    .await
    .unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
}

#[test]
fn leaves_are_cached_and_the_cache_is_bounded() {
    let ca = SandboxCa::new().unwrap();
    let first: Host = "h0.example".parse().unwrap();
    let a = ca.server_config(&first).unwrap();
    let b = ca.server_config(&first).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    for i in 1..=LEAF_CACHE {
        ca.server_config(&format!("h{i}.example").parse().unwrap())
            .unwrap();
    }
    assert_eq!(ca.cached(), LEAF_CACHE);
    // The oldest went first; asking again mints anew.
    let c = ca.server_config(&first).unwrap();
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(ca.cached(), LEAF_CACHE);
}

/// Set in the child run of `the_ca_writes_no_file`.
const CHILD: &str = "RUNSBX_TLS_TEST_CHILD";

/// The CA's key must exist nowhere but in memory. The test runs itself in a
/// child whose working directory, HOME and TMPDIR are an empty directory,
/// has it make a CA and leaves, and finds the directory still empty.
#[test]
fn the_ca_writes_no_file() {
    if std::env::var_os(CHILD).is_some() {
        let ca = SandboxCa::new().unwrap();
        for host in ["example.com", "192.0.2.1", "[2001:db8::1]"] {
            ca.server_config(&host.parse().unwrap()).unwrap();
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tls::tests::the_ca_writes_no_file",
            "--test-threads=1",
        ])
        .current_dir(dir.path())
        .env(CHILD, "1")
        .env("HOME", dir.path())
        .env("TMPDIR", dir.path())
        .env("XDG_CACHE_HOME", dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn roots_must_be_pem_certificates() {
    let trust = UpstreamTrust::empty().unwrap();
    assert!(trust.is_empty());
    assert!(matches!(
        trust.clone().with_roots_pem(b"not pem"),
        Err(TlsError::NoRoots(_))
    ));
    let ca = SandboxCa::new().unwrap();
    let trust = trust
        .with_roots_pem(ca.certificate_pem().as_bytes())
        .unwrap();
    assert_eq!(trust.len(), 1);
    let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    assert!(trust.with_roots_pem(broken.as_bytes()).is_err());
}

#[test]
fn system_trust_store() {
    match UpstreamTrust::system() {
        Ok(trust) => assert!(!trust.is_empty()),
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no system trust store under CI: {e}"
            );
            eprintln!("SKIP system_trust_store: {e}");
        }
    }
}
