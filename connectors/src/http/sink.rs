//! The egress sink: signed attempts out through a guarded HTTP client.
//!
//! ```text
//!  Outbound ──▶ check_url (parse once per URL, WHATWG; scheme, userinfo,
//!                  │        port, names, literals; remembered with its Target)
//!                  ├── no egress proxy: Direct (HTTP/1.1 on hyper's connection
//!                  │   API, own pool; vetted_addrs → TCP → guard_peer → TLS)
//!                  └── egress proxy: reqwest (CONNECT through the proxy;
//!                      DialGuard ──▶ VettingResolver for anything else)
//!                  ▼   no redirects, no proxy from the environment, no
//!                      decompression, connect + total timeouts
//!              status → outcome; ≤ 64 KiB of body read, SHA-256 kept
//! ```

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use sha2::{Digest, Sha256};
use walhook_pipeline::dispatch::egress::{Egress, EgressResult, Outbound};
use walhook_pipeline::dispatch::outcome::{
    ErrorClass, classify_failure, classify_status, parse_retry_after,
};
use walhook_pipeline::time::Timestamp;

use super::config::EgressSettings;
use super::dial::DialGuardLayer;
use super::direct::{Direct, POOL_IDLE_TIMEOUT, Target, TlsConfigError};
use super::observe::{EgressObserver, LogObserver};
use super::resolve::{Lookup, LookupFailed, SystemLookup, TrustedProxy, VettingResolver};
use walhook_pipeline::url_policy::{Refusal, UrlPolicy, VettedHost, check_url};

/// Bytes of the response body kept for the excerpt (before cleaning).
const EXCERPT_READ_BYTES: usize = 4096;

/// The longest excerpt stored, in bytes of cleaned text.
pub const EXCERPT_MAX_BYTES: usize = 1024;

/// URLs whose check is remembered, at most; the memory is emptied when full.
const CHECKED_URLS: usize = 4096;

/// A URL that passed [`check_url`]: what is sent, and the host as checked.
struct Checked {
    url: reqwest::Url,
    host: VettedHost,
    /// The direct path's connection target (`None` on the proxy path, or
    /// when the URL cannot be written as a request: refused).
    target: Option<Target>,
}

/// The HTTP egress: the direct client, or reqwest through an egress proxy.
#[derive(Clone)]
pub struct HttpEgress {
    /// Without an egress proxy, every request goes out here.
    direct: Option<Arc<Direct>>,
    /// The proxy path.
    client: reqwest::Client,
    settings: EgressSettings,
    policy: UrlPolicy,
    observer: Arc<dyn EgressObserver>,
    /// Endpoint URLs already checked against `policy` (which never changes
    /// while the egress lives), so that each attempt does not parse its URL
    /// again. Addresses are still vetted at every new connection.
    checked: Arc<parking_lot::RwLock<std::collections::HashMap<String, Arc<Checked>>>>,
}

impl std::fmt::Debug for HttpEgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEgress")
            .field("settings", &self.settings)
            .finish()
    }
}

/// Why an egress could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A setting is invalid.
    #[error("{0}")]
    Settings(String),
    /// A root certificate could not be read.
    #[error("cannot read a root certificate")]
    Certificate(#[source] reqwest::Error),
    /// reqwest refused the configuration.
    #[error("cannot build the HTTP client")]
    Client(#[source] reqwest::Error),
    /// The direct path's TLS configuration could not be built.
    #[error(transparent)]
    Tls(#[from] TlsConfigError),
}

/// Builds an [`HttpEgress`] with a lookup, an observer or extra root
/// certificates other than the defaults (tests, `walhook check-url`).
pub struct EgressBuilder {
    settings: EgressSettings,
    lookup: Arc<dyn Lookup>,
    observer: Arc<dyn EgressObserver>,
    /// Extra trusted roots, for both clients.
    roots: Vec<CertificateDer<'static>>,
}

impl EgressBuilder {
    /// Names are looked up with `lookup` (the system resolver by default).
    pub fn lookup(mut self, lookup: Arc<dyn Lookup>) -> Self {
        self.lookup = lookup;
        self
    }

    /// `observer` sees every vetted address and every new connection.
    pub fn observer(mut self, observer: Arc<dyn EgressObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Trusts the PEM certificate `pem` as a root, besides the built-in
    /// web PKI roots (a private CA; tests).
    pub fn root_certificate_pem(mut self, pem: &[u8]) -> Result<Self, BuildError> {
        for der in CertificateDer::pem_slice_iter(pem) {
            self.roots.push(der.map_err(|e| {
                BuildError::Settings(format!("cannot read a root certificate: {e}"))
            })?);
        }
        Ok(self)
    }

    /// The egress.
    pub fn build(self) -> Result<HttpEgress, BuildError> {
        let settings = self.settings;
        settings.validate().map_err(BuildError::Settings)?;
        let policy = settings.url_policy();
        if settings.allow_http_loopback {
            tracing::warn!(
                "[egress].allow_http_loopback is ON: endpoints may use plain http to loopback and \
                 resolve to loopback addresses. This is a development setting; never enable it in production"
            );
        }
        let mut proxy = TrustedProxy::default();
        let mut builder = reqwest::Client::builder()
            // Nothing from the environment: HTTPS_PROXY and friends would
            // route customer traffic somewhere the policy never saw.
            .no_proxy();
        if let Some(p) = &settings.proxy {
            let url = p.parsed().map_err(BuildError::Settings)?;
            match url.host() {
                Some(url::Host::Ipv4(ip)) => proxy.addrs.get_mut().push(ip.into()),
                Some(url::Host::Ipv6(ip)) => proxy.addrs.get_mut().push(ip.into()),
                Some(url::Host::Domain(d)) => {
                    proxy.host = Some(d.trim_end_matches('.').to_ascii_lowercase());
                }
                None => {}
            }
            let p = reqwest::Proxy::all(url.as_str())
                .map_err(BuildError::Client)?
                .no_proxy(None);
            builder = builder.proxy(p);
        }
        let proxy = Arc::new(proxy);
        let direct = match settings.proxy {
            Some(_) => None,
            None => {
                let direct = Arc::new(Direct::new(
                    self.lookup.clone(),
                    policy.clone(),
                    self.observer.clone(),
                    &self.roots,
                    settings.connect_timeout,
                    settings.pool_idle_per_host,
                )?);
                Direct::start_sweeping(&direct);
                Some(direct)
            }
        };
        let resolver = VettingResolver::new(
            self.lookup,
            policy.clone(),
            self.observer.clone(),
            proxy.clone(),
        );
        builder = builder
            .redirect(reqwest::redirect::Policy::none())
            // One attempt is one request: reqwest's own retries of refused
            // streams are off (and with them the copy of every request
            // they would keep).
            .retry(reqwest::retry::never().max_retries_per_request(0))
            .referer(false)
            .no_gzip()
            .no_brotli()
            .no_zstd()
            .no_deflate()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.request_timeout)
            .pool_max_idle_per_host(settings.pool_idle_per_host)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .tcp_nodelay(true)
            .dns_resolver(Arc::new(resolver))
            .connector_layer(DialGuardLayer::new(
                policy.clone(),
                self.observer.clone(),
                proxy,
            ));
        for root in &self.roots {
            builder = builder.add_root_certificate(
                reqwest::Certificate::from_der(root).map_err(BuildError::Certificate)?,
            );
        }
        let client = builder.build().map_err(BuildError::Client)?;
        Ok(HttpEgress {
            direct,
            client,
            settings,
            policy,
            observer: self.observer,
            checked: Default::default(),
        })
    }
}

impl HttpEgress {
    /// A client with `settings`, the system resolver and logging observer.
    pub fn new(settings: EgressSettings) -> Result<Self, BuildError> {
        Self::builder(settings).build()
    }

    /// A builder starting from `settings`.
    pub fn builder(settings: EgressSettings) -> EgressBuilder {
        EgressBuilder {
            settings,
            lookup: Arc::new(SystemLookup),
            observer: Arc::new(LogObserver),
            roots: Vec::new(),
        }
    }

    /// The URL and address policy applied.
    pub fn policy(&self) -> &UrlPolicy {
        &self.policy
    }

    /// `text` checked against the policy, remembered when it passes.
    fn check(&self, text: &str) -> Result<Arc<Checked>, Refusal> {
        if let Some(c) = self.checked.read().get(text) {
            return Ok(c.clone());
        }
        let vetted = check_url(text, &self.policy)?;
        let target = self.direct.as_ref().and_then(|_| Target::new(&vetted));
        let checked = Arc::new(Checked {
            url: vetted.url,
            host: vetted.host,
            target,
        });
        let mut memory = self.checked.write();
        if memory.len() >= CHECKED_URLS {
            memory.clear();
        }
        memory.insert(text.to_owned(), checked.clone());
        Ok(checked)
    }
}

/// Whether an error of type `T` is somewhere in `e`'s chain of sources,
/// including inside an `io::Error` (whose `source` skips the error it
/// wraps: TLS failures arrive as `io::Error`s around a `rustls::Error`).
fn found_in<T: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(e);
    while let Some(err) = current {
        if err.is::<T>() {
            return true;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<T>())
        {
            return true;
        }
        current = err.source();
    }
    false
}

/// The class of a failure on the proxy path, from the types in the error's
/// chain (never from its text).
fn classify_error(e: &reqwest::Error) -> ErrorClass {
    if found_in::<Refusal>(e) {
        return ErrorClass::Blocked;
    }
    if e.is_connect() {
        if e.is_timeout() {
            ErrorClass::ConnectTimeout
        } else if found_in::<LookupFailed>(e) {
            ErrorClass::Dns
        } else if found_in::<rustls::Error>(e) {
            ErrorClass::Tls
        } else {
            ErrorClass::Connect
        }
    } else if e.is_timeout() {
        ErrorClass::Timeout
    } else {
        ErrorClass::Reset
    }
}

fn blocked() -> EgressResult {
    EgressResult::bare(classify_failure(ErrorClass::Blocked))
}

/// The stored form of a response body's first bytes: see
/// [`walhook_pipeline::sanitize`].
pub fn response_excerpt(body: &[u8]) -> String {
    walhook_pipeline::sanitize::clean_text(
        body,
        walhook_pipeline::sanitize::Lines::Keep,
        EXCERPT_MAX_BYTES,
    )
}

/// What the outcome needs of a receiver's response head: its status and
/// its `Retry-After`, read once the head has arrived (hyper parsed the
/// status line and headers and refused what HTTP/1.1 does not allow, a
/// `Content-Length` that is not a number included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// The first `Retry-After`, as a delay from `now_unix` (saturating: see
    /// [`parse_retry_after`]); `None` when absent or not a delay.
    pub retry_after: Option<std::time::Duration>,
}

impl ResponseHead {
    /// Reads `status` and `headers` as they came from the receiver, at
    /// `now_unix` (Unix seconds). Never panics, whatever the values.
    pub fn read(status: http::StatusCode, headers: &http::HeaderMap, now_unix: i64) -> Self {
        ResponseHead {
            status: status.as_u16(),
            retry_after: headers
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, now_unix)),
        }
    }

    fn now(status: http::StatusCode, headers: &http::HeaderMap) -> Self {
        Self::read(status, headers, Timestamp::now().unix_seconds())
    }
}

/// What is kept of a response body: its SHA-256 and its first bytes, up to
/// a limit on the bytes read (`[egress].max_response_bytes`), whatever the
/// receiver declared in `Content-Length`: the count is ours, so no size a
/// receiver writes enters any arithmetic.
#[derive(Debug, Clone)]
pub struct BodyTap {
    hasher: Sha256,
    kept: Vec<u8>,
    read: usize,
    limit: usize,
}

impl BodyTap {
    /// A tap that reads at most `limit` bytes.
    pub fn new(limit: usize) -> Self {
        BodyTap {
            hasher: Sha256::new(),
            kept: Vec::new(),
            read: 0,
            limit,
        }
    }

    /// Takes `chunk`, cut at the limit; `false` once the limit is reached.
    pub fn take(&mut self, chunk: &[u8]) -> bool {
        let take = chunk.len().min(self.limit.saturating_sub(self.read));
        self.hasher.update(&chunk[..take]);
        if self.kept.len() < EXCERPT_READ_BYTES {
            self.kept
                .extend_from_slice(&chunk[..take.min(EXCERPT_READ_BYTES - self.kept.len())]);
        }
        self.read = self.read.saturating_add(take);
        self.read < self.limit
    }

    /// Bytes taken so far (never more than the limit).
    pub fn read(&self) -> usize {
        self.read
    }

    /// The attempt's result for a response with `head`: the status
    /// decides the outcome (a body cut short or too slow does not change
    /// it).
    pub fn result(self, head: ResponseHead) -> EgressResult {
        let ResponseHead {
            status,
            retry_after,
        } = head;
        // The receiver chose these bytes: NUL, invalid UTF-8 and control
        // characters are made storable here, where they enter, so that no
        // response can fail the recorder (Postgres text refuses NUL).
        let excerpt = response_excerpt(&self.kept);
        EgressResult {
            outcome: classify_status(status, retry_after),
            response_sha256: Some(self.hasher.finalize().into()),
            response_excerpt: (!excerpt.is_empty()).then_some(excerpt),
        }
    }
}

impl HttpEgress {
    /// The hot path: `body` with `headers` to `target` on the direct client.
    async fn send_direct(
        &self,
        direct: &Direct,
        target: &Target,
        mut headers: http::HeaderMap,
        body: Bytes,
    ) -> EgressResult {
        let deadline = tokio::time::Instant::now() + self.settings.request_timeout;
        headers.insert(http::header::HOST, target.authority().clone());
        headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
        let mut request = http::Request::new(Full::new(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = target.path().clone();
        *request.headers_mut() = headers;
        let (response, mut lease) =
            match tokio::time::timeout_at(deadline, direct.exchange(target, request)).await {
                Ok(Ok(exchanged)) => exchanged,
                Ok(Err(class)) => return EgressResult::bare(classify_failure(class)),
                Err(_) => return EgressResult::bare(classify_failure(ErrorClass::Timeout)),
            };
        let (parts, mut body) = response.into_parts();
        let head = ResponseHead::now(parts.status, &parts.headers);
        let mut tap = BodyTap::new(self.settings.max_response_bytes);
        let complete = loop {
            match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref()
                        && !tap.take(data)
                    {
                        break false;
                    }
                }
                Ok(None) => break true,
                Ok(Some(Err(_))) | Err(_) => break false,
            }
        };
        drop(body);
        // Only a connection whose response was read to the end can carry
        // another request; any other is closed by dropping it.
        if complete && tokio::time::timeout_at(deadline, lease.ready()).await == Ok(true) {
            direct.checkin(lease);
        }
        tap.result(head)
    }

    /// Through the egress proxy, on reqwest.
    async fn send_proxied(
        &self,
        vetted: &Checked,
        headers: http::HeaderMap,
        body: Bytes,
    ) -> EgressResult {
        let builder = self.client.post(vetted.url.clone()).headers(headers);
        let response = match builder.body(body).send().await {
            Ok(r) => r,
            Err(e) => return EgressResult::bare(classify_failure(classify_error(&e))),
        };
        let head = ResponseHead::now(response.status(), response.headers());
        let mut tap = BodyTap::new(self.settings.max_response_bytes);
        let mut stream = response.bytes_stream();
        while let Some(Ok(chunk)) = stream.next().await {
            if !tap.take(&chunk) {
                break;
            }
        }
        tap.result(head)
    }
}

impl Egress for HttpEgress {
    async fn send(&self, request: Outbound) -> EgressResult {
        let vetted = match self.check(&request.url) {
            Ok(v) => v,
            Err(refusal) => {
                // The detail may quote the URL, which may carry a customer's
                // token: log the class only.
                tracing::warn!(
                    reason = refusal.reason.as_str(),
                    "egress refused an endpoint URL"
                );
                return blocked();
            }
        };
        if let VettedHost::Ip(ip) = vetted.host
            && !self.observer.approve(&ip.to_string(), &[ip])
        {
            return blocked();
        }
        let mut headers = http::HeaderMap::with_capacity(request.headers.len() + 2);
        for (name, value) in request.headers {
            match http::HeaderValue::try_from(value) {
                Ok(v) => {
                    headers.insert(http::HeaderName::from_static(name), v);
                }
                // Our own values (ids, numbers, signatures) are always
                // valid header text; refuse rather than send without one.
                Err(_) => return blocked(),
            }
        }
        match (&self.direct, &vetted.target) {
            (Some(direct), Some(target)) => {
                self.send_direct(direct, target, headers, request.body)
                    .await
            }
            (Some(_), None) => {
                tracing::warn!(
                    "egress refused an endpoint URL that cannot be written as a request"
                );
                blocked()
            }
            (None, _) => self.send_proxied(&vetted, headers, request.body).await,
        }
    }
}
