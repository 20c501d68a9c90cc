//! TLS for inspected tunnels: the sandbox's own certificate authority, the
//! leaf certificates it mints, and the trust the proxy puts in upstreams.
//!
//! To check a request inside HTTPS the proxy has to end the sandbox's TLS
//! itself, with a certificate the sandbox trusts. That trust is narrow on
//! purpose: each sandbox gets its own CA, made in memory when the sandbox
//! starts and gone when it ends. Its key is never written anywhere (no file,
//! no environment variable), so a sandbox that is compromised later cannot
//! find it, and what one sandbox trusts lets nobody intercept another.
//! The CA can sign only leaf certificates (path length 0) and expires after
//! a week even if something keeps it alive.
//!
//! Upstream servers are verified as any client would: the host's trust
//! store, by name (or IP), with rustls and its ring provider.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use thiserror::Error;
use time::OffsetDateTime;

use crate::host::Host;

/// Leaf configurations kept per CA. A sandbox talks to few inspected hosts;
/// the bound only stops a client that names many from growing the cache.
pub(crate) const LEAF_CACHE: usize = 256;

/// Certificates start an hour in the past, so that a sandbox whose clock
/// lags the host's a little still accepts them.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The CA's life: longer than any sandbox should run, short enough that a
/// copy of its certificate is soon worth nothing.
const CA_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// The only application protocol spoken inside an inspected tunnel: the
/// inspector reads HTTP/1.1, so a client must never negotiate h2 with it.
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("TLS: the system clock is outside what a certificate can hold")]
    Clock,
    #[error("TLS: no random bytes from the system")]
    Random,
    #[error("TLS: make a key pair: {0}")]
    Key(#[source] rcgen::Error),
    #[error("TLS: mint the certificate for `{subject}`: {source}")]
    Mint {
        subject: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("TLS: configure rustls: {0}")]
    Config(#[source] rustls::Error),
    #[error("TLS: read PEM certificates: {0}")]
    Pem(#[source] rustls::pki_types::pem::Error),
    #[error("TLS: root certificate not usable: {0}")]
    Root(#[source] rustls::Error),
    #[error("TLS: no certificate in {0}")]
    NoRoots(String),
}

/// A certificate authority that exists for one sandbox's life: its key is
/// made in memory and never written anywhere; dropping it ends it.
pub struct SandboxCa {
    subject: String,
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    not_after: OffsetDateTime,
    provider: Arc<CryptoProvider>,
    leaves: Mutex<Leaves>,
}

/// Server configurations by host, evicted oldest first.
#[derive(Default)]
struct Leaves {
    configs: HashMap<Host, Arc<ServerConfig>>,
    order: VecDeque<Host>,
}

impl fmt::Debug for SandboxCa {
    /// The subject only: nothing of the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxCa")
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl SandboxCa {
    /// A new CA: an ECDSA P-256 key, a random name, valid from an hour ago
    /// for seven days, allowed to sign leaf certificates only.
    pub fn new() -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(TlsError::Key)?;
        let subject = format!("runsbx sandbox CA {}", hex(&random::<8>(&provider)?));
        let now = now()?;
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, subject.as_str());
        params
            .distinguished_name
            .push(DnType::OrganizationName, "runsbx");
        params.serial_number = Some(serial(&provider)?);
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_LIFETIME;
        // Path length 0: what it signs can sign nothing.
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).map_err(|source| TlsError::Mint {
            subject: subject.clone(),
            source,
        })?;
        let not_after = params.not_after;
        Ok(Self {
            subject,
            cert_pem: cert.pem(),
            not_after,
            issuer: Issuer::new(params, key),
            provider,
            leaves: Mutex::new(Leaves::default()),
        })
    }

    /// The CA certificate, PEM: what the sandbox is given to trust.
    pub fn certificate_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's common name, e.g. for logs.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// A rustls server config presenting a leaf certificate for `host` (a
    /// name as a DNS SAN, an IP as an IP SAN), signed by this CA, with ALPN
    /// `http/1.1` only. Minted on first use and kept (at most
    /// [`LEAF_CACHE`] hosts, oldest evicted first).
    pub fn server_config(&self, host: &Host) -> Result<Arc<ServerConfig>, TlsError> {
        if let Some(config) = self.lock().configs.get(host) {
            return Ok(Arc::clone(config));
        }
        // Minted outside the lock; two connections racing for a new host
        // each mint one and the first stored wins.
        let config = Arc::new(self.mint(host)?);
        let mut leaves = self.lock();
        if let Some(config) = leaves.configs.get(host) {
            return Ok(Arc::clone(config));
        }
        while leaves.order.len() >= LEAF_CACHE {
            if let Some(old) = leaves.order.pop_front() {
                leaves.configs.remove(&old);
            }
        }
        leaves.order.push_back(host.clone());
        leaves.configs.insert(host.clone(), Arc::clone(&config));
        Ok(config)
    }

    /// Hosts whose configuration is kept now.
    #[cfg(test)]
    pub(crate) fn cached(&self) -> usize {
        self.lock().configs.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Leaves> {
        // The map is never left half-updated by a panic: each step is one call.
        self.leaves.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn mint(&self, host: &Host) -> Result<ServerConfig, TlsError> {
        let subject = match host {
            Host::Name(name) => name.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let fail = |source| TlsError::Mint {
            subject: subject.clone(),
            source,
        };
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(TlsError::Key)?;
        let san = match host {
            Host::Name(name) => SanType::DnsName(name.as_str().try_into().map_err(fail)?),
            Host::Ip(ip) => SanType::IpAddress(*ip),
        };
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, subject.as_str());
        params.subject_alt_names = vec![san];
        params.serial_number = Some(serial(&self.provider)?);
        params.not_before = now()? - BACKDATE;
        // Never beyond the CA: a verifier may check the whole chain's dates.
        params.not_after = self.not_after;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer).map_err(fail)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(Arc::clone(&self.provider))
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .map_err(TlsError::Config)?;
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(config)
    }
}

/// How the proxy verifies upstream servers: the host's trust store, plus
/// roots the operator adds.
#[derive(Clone)]
pub struct UpstreamTrust {
    roots: RootCertStore,
    config: Arc<ClientConfig>,
}

impl fmt::Debug for UpstreamTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTrust")
            .field("roots", &self.roots.len())
            .finish_non_exhaustive()
    }
}

impl UpstreamTrust {
    /// The host's trust store: `SSL_CERT_FILE` / `SSL_CERT_DIR` when set,
    /// else the distribution's bundle (via rustls-native-certs). Fails when
    /// it holds no usable certificate, rather than trusting nothing quietly.
    pub fn system() -> Result<Self, TlsError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _unusable) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            let why = match found.errors.first() {
                Some(e) => format!("the host's trust store ({e})"),
                None => {
                    "the host's trust store (hint: install ca-certificates, or set SSL_CERT_FILE)"
                        .to_owned()
                }
            };
            return Err(TlsError::NoRoots(why));
        }
        Self::from_roots(roots)
    }

    /// Trusts nothing until roots are added with [`Self::with_roots_pem`]:
    /// for an operator who names every root, and for tests.
    pub fn empty() -> Result<Self, TlsError> {
        Self::from_roots(RootCertStore::empty())
    }

    /// These roots as well (PEM, one or more certificates).
    pub fn with_roots_pem(mut self, pem: &[u8]) -> Result<Self, TlsError> {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            self.roots
                .add(cert.map_err(TlsError::Pem)?)
                .map_err(TlsError::Root)?;
            added += 1;
        }
        if added == 0 {
            return Err(TlsError::NoRoots("the PEM given".to_owned()));
        }
        Self::from_roots(self.roots)
    }

    /// Roots trusted.
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// The roots, for tests that build their own clients.
    #[cfg(test)]
    pub(crate) fn roots_for_tests(&self) -> RootCertStore {
        self.roots.clone()
    }

    pub(crate) fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.config)
    }

    fn from_roots(roots: RootCertStore) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_root_certificates(roots.clone())
            .with_no_client_auth();
        // Offered so that a server that speaks h2 does not pick it.
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        Ok(Self {
            roots,
            config: Arc::new(config),
        })
    }
}

fn now() -> Result<OffsetDateTime, TlsError> {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| TlsError::Clock)?
        .as_secs();
    let secs = i64::try_from(secs).map_err(|_| TlsError::Clock)?;
    OffsetDateTime::from_unix_timestamp(secs).map_err(|_| TlsError::Clock)
}

fn random<const N: usize>(provider: &CryptoProvider) -> Result<[u8; N], TlsError> {
    let mut bytes = [0u8; N];
    provider
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| TlsError::Random)?;
    Ok(bytes)
}

/// A random positive serial of 16 bytes (RFC 5280 allows up to 20).
fn serial(provider: &CryptoProvider) -> Result<SerialNumber, TlsError> {
    let mut bytes = random::<16>(provider)?;
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    Ok(SerialNumber::from_slice(&bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
