//! The egress proxy of runsbx.
//!
//! A sandbox's network namespace holds only its own loopback. When a call may
//! reach the outside, the runtime makes a listening socket inside that
//! namespace (127.0.0.1:PORT there) and hands it to [`spawn`], which serves
//! it from the host side: HTTP CONNECT tunnels and plain HTTP forwarding, to
//! destinations on the allowlist whose addresses are all public, so that
//! code in the sandbox never reaches the host's loopback, its private
//! networks or a metadata service (docs/security.md, "Network and egress").
//! Every refusal is a 403 with a one-line reason for the client and a
//! [`DenyEvent`] for the call result.
//!
//! Everything is bounded: connections at once, time to send a request head,
//! idle time, bytes per connection, buffer sizes, events kept. A hostile
//! client can make the proxy refuse, never make it grow.

#![forbid(unsafe_code)]

mod addr;
mod allowlist;
mod events;
mod guard;
mod host;
mod http;
mod inspect;
mod inspect_http;
mod relay;
mod secrets;
mod server;
mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::oneshot;

pub use addr::{classify, AddressClass};
pub use allowlist::{Access, Allowlist, AllowlistError};
pub use events::{DenyEvent, DenyReason, Learned, LearnedRequest, ProxyStats};
pub use host::{Host, HostError};
pub use inspect::{inspect, InspectLimits, Inspected, InspectedRequest, RelayEnd, Verdict};
pub use secrets::Secret;
pub use tls::{SandboxCa, TlsError, UpstreamTrust};

use events::Shared;
use guard::Guard;
use server::Settings;

/// What the proxy allows and how far it goes. [`Default`] allows nothing.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Destinations the sandbox may ask for.
    pub allow: Allowlist,
    /// Resolver override, consulted before the system resolver (an
    /// /etc/hosts for the proxy). For tests and operators; empty by default.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// Destinations exempt from the address-class check because the
    /// operator named them (e.g. a test server on the host's loopback).
    /// Empty by default: a name that resolves to loopback is refused.
    pub allow_addresses: Vec<SocketAddr>,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// A connection with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// Resolving a name, and connecting to its addresses, each within this.
    pub connect_timeout: Duration,
    /// The whole request head must arrive within this (slowloris).
    pub header_timeout: Duration,
    /// Bytes per connection, both directions together.
    pub max_bytes: u64,
    /// Deny events kept; later ones are only counted.
    pub max_events: usize,
    /// TLS inspection: with it, a CONNECT to a host that the allowlist
    /// opens to some requests only is served by reading those requests
    /// (`inspect`); without it, such a tunnel is refused.
    pub inspect: Option<Arc<Inspection>>,
    /// Credentials put in place of their sentinels (see secrets.rs); a
    /// secret's host is inspected, so that its requests can be read.
    pub secrets: Vec<Secret>,
    /// Learn mode: every request let through is counted (see
    /// [`ProxyHandle::learned`]), and with inspection every tunnel is read
    /// so that its requests are known by method and path. It allows
    /// nothing more.
    pub learn: bool,
}

/// What TLS inspection needs for one sandbox: its CA (in memory, for the
/// proxy's life) and the roots upstream servers are verified against.
#[derive(Debug)]
pub struct Inspection {
    pub ca: SandboxCa,
    pub trust: UpstreamTrust,
}

impl Inspection {
    /// A new CA, and the host's trust store for upstreams
    /// (`SSL_CERT_FILE`/`SSL_CERT_DIR` when set, as OpenSSL reads them).
    pub fn new() -> Result<Self, TlsError> {
        Ok(Self {
            ca: SandboxCa::new()?,
            trust: UpstreamTrust::system()?,
        })
    }
}

impl Default for ProxyConfig {
    fn default() -> Self {
        Self {
            allow: Allowlist::default(),
            hosts: HashMap::new(),
            allow_addresses: Vec::new(),
            max_connections: 128,
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            max_bytes: 1 << 30,
            max_events: 1000,
            inspect: None,
            secrets: Vec::new(),
            learn: false,
        }
    }
}

impl ProxyConfig {
    /// The defaults, with `allow` as the allowlist.
    pub fn new(allow: Allowlist) -> Self {
        Self {
            allow,
            ..Self::default()
        }
    }
}

#[derive(Debug, Error)]
pub enum ProxyError {
    #[error("egress proxy: {0}")]
    Config(&'static str),
    #[error("egress proxy: prepare the listener: {0}")]
    Listener(#[source] std::io::Error),
    #[error("egress proxy: build the I/O runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("egress proxy: start its thread: {0}")]
    Thread(#[source] std::io::Error),
}

pub type Result<T, E = ProxyError> = std::result::Result<T, E>;

/// A running proxy. Dropping it stops the proxy, as [`ProxyHandle::shutdown`].
#[derive(Debug)]
pub struct ProxyHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Serve `listener` on a background thread until the handle is shut down
/// or dropped. The listener may come from another network namespace (it
/// keeps the namespace it was made in); it is made non-blocking here.
pub fn spawn(listener: std::net::TcpListener, config: ProxyConfig) -> Result<ProxyHandle> {
    if config.max_connections == 0 {
        return Err(ProxyError::Config("max_connections must be at least 1"));
    }
    listener
        .set_nonblocking(true)
        .map_err(ProxyError::Listener)?;
    let local_addr = listener.local_addr().map_err(ProxyError::Listener)?;
    let settings = Arc::new(settings(config.clone()));
    let shared = Arc::new(Shared::new(config.max_events, config.learn));
    // Name resolution is the one blocking call (getaddrinfo); a few threads
    // for it are enough, and they carry a name that says whose they are
    // (15 characters: the kernel keeps no more).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(4)
        .thread_name("runsbx-proxy-ns")
        .build()
        .map_err(ProxyError::Runtime)?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::TcpListener::from_std(listener).map_err(ProxyError::Listener)?
    };
    let (stop, stopped) = oneshot::channel();
    let thread_shared = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("runsbx-proxy".into())
        .spawn(move || {
            runtime.block_on(server::serve(listener, settings, thread_shared, stopped));
            // Dropping the runtime drops every connection task and so closes
            // its sockets. A lookup stuck in getaddrinfo is not waited for.
            runtime.shutdown_timeout(Duration::from_millis(500));
        })
        .map_err(ProxyError::Thread)?;
    tracing::debug!(%local_addr, "egress proxy: serving");
    Ok(ProxyHandle {
        local_addr,
        shared,
        stop: Some(stop),
        thread: Some(thread),
    })
}

fn settings(config: ProxyConfig) -> Settings {
    let hosts = config
        .hosts
        .into_iter()
        .map(|(name, ips)| {
            let name = name.strip_suffix('.').unwrap_or(&name).to_ascii_lowercase();
            (name, ips)
        })
        .collect();
    let exempt = config
        .allow_addresses
        .iter()
        .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
        .collect();
    Settings {
        guard: Guard {
            allow: config.allow,
            hosts,
            exempt,
            resolve_timeout: config.connect_timeout,
        },
        inspect: config.inspect,
        secrets: config.secrets,
        learn: config.learn,
        max_connections: config.max_connections,
        idle_timeout: config.idle_timeout,
        connect_timeout: config.connect_timeout,
        header_timeout: config.header_timeout,
        max_bytes: config.max_bytes,
    }
}

impl ProxyHandle {
    /// The address the listener is bound to (in its own namespace).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The deny events kept so far (the first `max_events`).
    pub fn events(&self) -> Vec<DenyEvent> {
        self.shared.events()
    }

    /// Deny events that were counted but not kept.
    pub fn dropped_events(&self) -> u64 {
        self.shared
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn stats(&self) -> ProxyStats {
        self.shared.stats()
    }

    /// In learn mode, the requests let through so far; `None` otherwise.
    pub fn learned(&self) -> Option<Learned> {
        self.shared.learned()
    }

    /// Stop accepting, close every connection and the listener, and wait
    /// for the thread to end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            // The thread may have stopped on its own; nothing to tell then.
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("egress proxy: its thread panicked");
            }
        }
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        self.stop();
    }
}
