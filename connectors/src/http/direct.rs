//! The direct path: HTTP/1.1 on hyper's connection API with walhook's own
//! pool, for endpoints reached without an egress proxy (the hot path).
//!
//! ```text
//!  Target (built once per checked URL: origin, Host, request target, SNI)
//!     │
//!     ▼
//!  pool: idle connections per origin ──hit──▶ send on it
//!     │ miss (or the pooled connection closed before the request left)
//!     ▼
//!  vetted_addrs (name → policy → observer) ──▶ TCP, one address after the
//!  other within the connect timeout ──▶ guard_peer on the socket's peer
//!  ──▶ TLS under the URL's name (https) ──▶ hyper HTTP/1.1 handshake
//!     │
//!     ▼
//!  response; after its body was read to the end, the connection goes back
//!  to the pool (at most `pool_idle_per_host` per origin, 90 s idle)
//! ```
//!
//! Why not reqwest here: per request it parses the URL into a URI again,
//! clones its client, runs a tower stack (timeouts, retries, redirects) and
//! a generic pool, which together cost more of a delivery than sending it;
//! every one of those decisions is already made once per endpoint URL
//! (docs/performance.md). The rules are the same as reqwest's path: the
//! same resolver check, the same peer check, no redirects, no
//! decompression, no retries except of a request that never left (a pooled
//! connection found closed), and the egress proxy path stays on reqwest.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Uri};
use http_body_util::Full;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_util::either::Either;
use walhook_pipeline::dispatch::outcome::ErrorClass;

use super::dial::guard_peer;
use super::observe::EgressObserver;
use super::resolve::{Lookup, Vetting, vetted_addrs};
use walhook_pipeline::url_policy::{UrlPolicy, VettedHost, VettedUrl};

/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How often the pool drops expired idle connections of every origin.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The connection a request goes out on: where, and under which names.
#[derive(Debug)]
pub struct Target {
    origin: Arc<Origin>,
    /// What the connection dials: a name to vet, or a checked literal.
    host: VettedHost,
    /// The TLS name (https only).
    sni: Option<ServerName<'static>>,
    /// The `Host` header: the URL's host, and its port when not the default.
    authority: HeaderValue,
    /// The request target in origin form (path and query).
    path: Uri,
}

/// Connections are shared by requests with the same scheme, host (as the
/// URL writes it) and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

impl Target {
    /// The target of a URL that passed the policy; `None` when the URL
    /// cannot be written as an HTTP/1.1 request (never for a URL the WHATWG
    /// parser serialised, but the request is refused rather than guessed).
    pub fn new(vetted: &VettedUrl) -> Option<Target> {
        let url = &vetted.url;
        let https = url.scheme() == "https";
        let host = url.host_str()?.to_owned();
        let authority = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        };
        let sni = if https {
            Some(match &vetted.host {
                VettedHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
                VettedHost::Name(name) => ServerName::try_from(name.clone()).ok()?,
            })
        } else {
            None
        };
        Some(Target {
            origin: Arc::new(Origin {
                https,
                host,
                port: vetted.port,
            }),
            host: vetted.host.clone(),
            sni,
            authority: HeaderValue::try_from(authority).ok()?,
            path: Uri::try_from(path).ok()?,
        })
    }

    /// The `Host` header.
    pub fn authority(&self) -> &HeaderValue {
        &self.authority
    }

    /// The request target (path and query).
    pub fn path(&self) -> &Uri {
        &self.path
    }
}

/// A connection lent to one request.
pub struct Lease {
    sender: SendRequest<Full<Bytes>>,
    origin: Arc<Origin>,
}

impl Lease {
    /// Waits until the connection can take another request (its last
    /// response was read to the end); `false` when it closed instead.
    pub async fn ready(&mut self) -> bool {
        self.sender.ready().await.is_ok()
    }
}

struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: Instant,
}

#[derive(Default)]
struct Pool {
    idle: HashMap<Arc<Origin>, Vec<Idle>>,
}

impl Pool {
    /// Drops every connection idle for `timeout` or longer, or closed by
    /// its peer (which ends its connection task).
    fn sweep(&mut self, now: Instant, timeout: Duration) {
        self.idle.retain(|_, list| {
            list.retain(|c| usable(c, now, timeout));
            !list.is_empty()
        });
    }
}

fn usable(c: &Idle, now: Instant, timeout: Duration) -> bool {
    !c.sender.is_closed() && now.duration_since(c.since) < timeout
}

/// The direct HTTP/1.1 client.
pub struct Direct {
    lookup: Arc<dyn Lookup>,
    policy: UrlPolicy,
    observer: Arc<dyn EgressObserver>,
    tls: tokio_rustls::TlsConnector,
    connect_timeout: Duration,
    idle_per_origin: usize,
    /// [`POOL_IDLE_TIMEOUT`] and [`SWEEP_EVERY`] (shorter in tests).
    idle_timeout: Duration,
    sweep_every: Duration,
    pool: Mutex<Pool>,
}

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the egress TLS configuration: {0}")]
pub struct TlsConfigError(String);

impl Direct {
    /// A client dialling names through `lookup` under `policy`, trusting
    /// the web PKI roots and `extra_roots`.
    pub fn new(
        lookup: Arc<dyn Lookup>,
        policy: UrlPolicy,
        observer: Arc<dyn EgressObserver>,
        extra_roots: &[CertificateDer<'static>],
        connect_timeout: Duration,
        idle_per_origin: usize,
    ) -> Result<Direct, TlsConfigError> {
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        for root in extra_roots {
            roots
                .add(root.clone())
                .map_err(|e| TlsConfigError(format!("a root certificate was refused: {e}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsConfigError(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Direct {
            lookup,
            policy,
            observer,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            connect_timeout,
            idle_per_origin,
            idle_timeout: POOL_IDLE_TIMEOUT,
            sweep_every: SWEEP_EVERY,
            pool: Mutex::default(),
        })
    }

    /// The same client, closing idle connections after `timeout` and
    /// sweeping every `every` (tests cannot wait 90 s).
    #[cfg(test)]
    pub(crate) fn idle_timing(mut self, timeout: Duration, every: Duration) -> Direct {
        self.idle_timeout = timeout;
        self.sweep_every = every;
        self
    }

    /// Sweeps the pool every [`SWEEP_EVERY`] while `this` lives, so that
    /// connections of endpoints no longer sent to are closed after
    /// [`POOL_IDLE_TIMEOUT`] (without a tokio runtime there is nothing to
    /// sweep for: nothing can send).
    pub fn start_sweeping(this: &Arc<Direct>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(this);
        let every = this.sweep_every;
        // Nothing in the loop can fail; it ends when the client is dropped.
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(direct) = pool.upgrade() else {
                    return;
                };
                direct
                    .pool
                    .lock()
                    .sweep(Instant::now(), direct.idle_timeout);
            }
        });
    }

    /// Sends `request` to `target`: on a pooled connection when one is
    /// idle, else on a new one. A request that a pooled connection closed
    /// before taking goes out once more on a new connection (it never
    /// left); any other failure is the attempt's.
    pub async fn exchange(
        &self,
        target: &Target,
        mut request: http::Request<Full<Bytes>>,
    ) -> Result<(http::Response<hyper::body::Incoming>, Lease), ErrorClass> {
        if let Some(mut lease) = self.checkout(&target.origin) {
            match lease.sender.try_send_request(request).await {
                Ok(response) => return Ok((response, lease)),
                Err(mut e) => match e.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(ErrorClass::Reset),
                },
            }
        }
        let mut lease = self.connect(target).await?;
        match lease.sender.send_request(request).await {
            Ok(response) => Ok((response, lease)),
            Err(_) => Err(ErrorClass::Reset),
        }
    }

    /// Returns a connection whose last response was read to the end.
    pub fn checkin(&self, lease: Lease) {
        if self.idle_per_origin == 0 || lease.sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut pool = self.pool.lock();
        let list = pool.idle.entry(lease.origin).or_default();
        if list.len() < self.idle_per_origin {
            list.push(Idle {
                sender: lease.sender,
                since: now,
            });
        }
    }

    /// Idle connections in the pool, of every origin.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> usize {
        self.pool.lock().idle.values().map(Vec::len).sum()
    }

    fn checkout(&self, origin: &Arc<Origin>) -> Option<Lease> {
        let now = Instant::now();
        let mut pool = self.pool.lock();
        let list = pool.idle.get_mut(&**origin)?;
        while let Some(idle) = list.pop() {
            if usable(&idle, now, self.idle_timeout) {
                return Some(Lease {
                    sender: idle.sender,
                    origin: origin.clone(),
                });
            }
        }
        None
    }

    /// A new connection to `target`, within the connect timeout (name
    /// resolution, TCP and TLS).
    async fn connect(&self, target: &Target) -> Result<Lease, ErrorClass> {
        match tokio::time::timeout(self.connect_timeout, self.dial(target)).await {
            Ok(result) => result,
            Err(_) => Err(ErrorClass::ConnectTimeout),
        }
    }

    #[allow(clippy::disallowed_methods)] // bare spawn: a connection's driver
    async fn dial(&self, target: &Target) -> Result<Lease, ErrorClass> {
        let addrs = match &target.host {
            // Approved by the caller, as the URL check let it through.
            VettedHost::Ip(ip) => vec![*ip],
            VettedHost::Name(name) => {
                match vetted_addrs(&*self.lookup, name, &self.policy, &*self.observer).await {
                    Ok(addrs) => addrs,
                    Err(Vetting::Lookup(_)) => return Err(ErrorClass::Dns),
                    Err(Vetting::Refused(_)) => return Err(ErrorClass::Blocked),
                }
            }
        };
        let tcp = tcp_connect(&addrs, target.origin.port, self.connect_timeout).await?;
        let peer = tcp.peer_addr().map_err(|_| ErrorClass::Connect)?;
        // The second wall: whatever the socket reached must pass too.
        guard_peer(peer, &self.policy, &*self.observer).map_err(|_| ErrorClass::Blocked)?;
        let _ = tcp.set_nodelay(true);
        let io = match &target.sni {
            Some(name) => Either::Right(
                self.tls
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|_| ErrorClass::Tls)?,
            ),
            None => Either::Left(tcp),
        };
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|_| ErrorClass::Connect)?;
        tokio::spawn(async move {
            // Ends when the peer closes or every sender was dropped; an
            // error here already failed (or will fail) the request on it.
            let _ = connection.await;
        });
        Ok(Lease {
            sender,
            origin: target.origin.clone(),
        })
    }
}

/// A TCP connection to the first of `addrs` that answers, each address
/// given an equal share of `budget` (so that one silent address does not
/// use up the time of the others).
async fn tcp_connect(
    addrs: &[IpAddr],
    port: u16,
    budget: Duration,
) -> Result<TcpStream, ErrorClass> {
    let share = budget / u32::try_from(addrs.len().max(1)).unwrap_or(u32::MAX);
    let mut failure = ErrorClass::Connect;
    for ip in addrs {
        match tokio::time::timeout(share, TcpStream::connect(SocketAddr::new(*ip, port))).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(_)) => failure = ErrorClass::Connect,
            Err(_) => failure = ErrorClass::ConnectTimeout,
        }
    }
    Err(failure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use walhook_pipeline::url_policy::check_url;

    fn target(url: &str) -> Target {
        let policy = UrlPolicy {
            allowed_ports: vec![443, 8443],
            allow_http_loopback: true,
        };
        Target::new(&check_url(url, &policy).unwrap()).unwrap()
    }

    #[test]
    fn the_host_header_and_request_target_are_the_urls() {
        let t = target("https://Hooks.Example.COM.:8443/in/x?y=1&z=%20#frag");
        assert_eq!(t.authority(), "hooks.example.com.:8443");
        assert_eq!(t.path(), "/in/x?y=1&z=%20");
        assert_eq!(
            t.sni,
            Some(ServerName::try_from("hooks.example.com").unwrap())
        );
        let t = target("https://hooks.example.com:443");
        assert_eq!(t.authority(), "hooks.example.com");
        assert_eq!(t.path(), "/");
        let t = target("http://[::1]:8080/a");
        assert_eq!(t.authority(), "[::1]:8080");
        assert_eq!(t.sni, None);
        assert_ne!(
            target("http://127.0.0.1:8080/").origin,
            target("http://127.0.0.1:8081/").origin
        );
    }
}
