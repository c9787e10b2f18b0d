//! HTTP egress: signed requests to customers' endpoints.
//!
//! One `reqwest` client with a connection pool per host and keep-alive,
//! never following redirects, never taking a proxy from the environment, no
//! automatic decompression, connect and total timeouts, and at most 64 KiB of
//! response body read (its SHA-256 kept). Plain `http` is refused unless the
//! development setting `allow_http_loopback` is on, and then only for
//! loopback hosts (tests and the demo).

pub mod policy;

use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use walhook_pipeline::dispatch::egress::{Egress, EgressResult, Outbound};
use walhook_pipeline::dispatch::outcome::{
    ErrorClass, classify_failure, classify_status, parse_retry_after,
};
use walhook_pipeline::time::Timestamp;

/// Egress settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressSettings {
    /// Time to establish a connection.
    #[serde(with = "walhook_pipeline::duration")]
    pub connect_timeout: Duration,
    /// Time for the whole request, response headers and the body read.
    #[serde(with = "walhook_pipeline::duration")]
    pub request_timeout: Duration,
    /// Response bytes read at most (the rest is ignored).
    pub max_response_bytes: usize,
    /// Idle connections kept per host.
    pub pool_idle_per_host: usize,
    /// Development only: allow `http://` to loopback addresses.
    pub allow_http_loopback: bool,
}

impl Default for EgressSettings {
    fn default() -> Self {
        EgressSettings {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
            max_response_bytes: 64 * 1024,
            pool_idle_per_host: 32,
            allow_http_loopback: false,
        }
    }
}

/// Characters of the response body kept as an excerpt.
const EXCERPT_CHARS: usize = 1024;

/// The reqwest-based egress.
#[derive(Debug, Clone)]
pub struct HttpEgress {
    client: reqwest::Client,
    settings: EgressSettings,
}

/// Why an egress could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the HTTP client")]
pub struct BuildError(#[source] reqwest::Error);

impl HttpEgress {
    /// A client with `settings`.
    pub fn new(settings: EgressSettings) -> Result<Self, BuildError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(settings.connect_timeout)
            .timeout(settings.request_timeout)
            .pool_max_idle_per_host(settings.pool_idle_per_host)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .build()
            .map_err(BuildError)?;
        Ok(HttpEgress { client, settings })
    }

    fn allowed(&self, url: &reqwest::Url) -> bool {
        match url.scheme() {
            "https" => true,
            "http" if self.settings.allow_http_loopback => match url.host() {
                Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
                Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
                Some(url::Host::Domain(d)) => d == "localhost",
                None => false,
            },
            _ => false,
        }
    }
}

fn classify_error(e: &reqwest::Error) -> ErrorClass {
    let text = format!("{e:?}").to_ascii_lowercase();
    if e.is_connect() {
        if e.is_timeout() {
            ErrorClass::ConnectTimeout
        } else if text.contains("dns error") || text.contains("failed to lookup") {
            ErrorClass::Dns
        } else if text.contains("certificate") || text.contains("tls") || text.contains("handshake")
        {
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

impl Egress for HttpEgress {
    async fn send(&self, request: Outbound) -> EgressResult {
        let url = match reqwest::Url::parse(&request.url) {
            Ok(u) if self.allowed(&u) => u,
            _ => return EgressResult::bare(classify_failure(ErrorClass::Blocked)),
        };
        let mut builder = self.client.post(url);
        for (name, value) in &request.headers {
            builder = builder.header(*name, value);
        }
        let response = match builder.body(request.body).send().await {
            Ok(r) => r,
            Err(e) => return EgressResult::bare(classify_failure(classify_error(&e))),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Timestamp::now().unix_seconds()));
        let mut hasher = Sha256::new();
        let mut kept: Vec<u8> = Vec::new();
        let mut read = 0usize;
        let mut stream = response.bytes_stream();
        while read < self.settings.max_response_bytes {
            match stream.next().await {
                Some(Ok(chunk)) => {
                    let take = chunk.len().min(self.settings.max_response_bytes - read);
                    hasher.update(&chunk[..take]);
                    if kept.len() < EXCERPT_CHARS * 4 {
                        kept.extend_from_slice(&chunk[..take.min(EXCERPT_CHARS * 4 - kept.len())]);
                    }
                    read += take;
                }
                // The status decides the outcome; a body cut short or too
                // slow does not change it.
                Some(Err(_)) | None => break,
            }
        }
        let excerpt: String = String::from_utf8_lossy(&kept)
            .chars()
            .take(EXCERPT_CHARS)
            .collect();
        EgressResult {
            outcome: classify_status(status, retry_after),
            response_sha256: Some(hasher.finalize().into()),
            response_excerpt: (!excerpt.is_empty()).then_some(excerpt),
        }
    }
}
