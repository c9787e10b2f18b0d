//! The boundary to HTTP: a signed request out, an outcome back.

use std::future::Future;

use bytes::Bytes;

use super::outcome::AttemptOutcome;
use crate::delivery::DeliveryJob;
use crate::signing::{VersionedSecret, signature_header};

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// The endpoint URL.
    pub url: String,
    /// Headers, lower-case names.
    pub headers: Vec<(&'static str, String)>,
    /// The exact event bytes.
    pub body: Bytes,
}

impl Outbound {
    /// The value of header `name` (lower case), if set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the egress saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressResult {
    /// The classified outcome.
    pub outcome: AttemptOutcome,
    /// SHA-256 of the response body read (at most 64 KiB).
    pub response_sha256: Option<[u8; 32]>,
    /// The start of the response body as text.
    pub response_excerpt: Option<String>,
}

impl EgressResult {
    /// A result without a response body.
    pub fn bare(outcome: AttemptOutcome) -> Self {
        EgressResult {
            outcome,
            response_sha256: None,
            response_excerpt: None,
        }
    }
}

/// Sends requests. Never fails: transport trouble is an outcome.
pub trait Egress: Send + Sync + 'static {
    /// Sends `request` and classifies what came back.
    fn send(&self, request: Outbound) -> impl Future<Output = EgressResult> + Send;
}

/// The `User-Agent` of every request.
pub const USER_AGENT: &str = concat!("walhook/", env!("CARGO_PKG_VERSION"));

/// Builds the signed request for attempt `number` of `job`.
pub fn build_request(
    job: &DeliveryJob,
    url: &str,
    secrets: &[VersionedSecret],
    number: u32,
    unix_seconds: i64,
) -> Outbound {
    signed(
        url,
        job.delivery_id.to_string(),
        secrets,
        unix_seconds,
        job.payload.clone(),
        [
            ("walhook-event-id", job.event_id.to_string()),
            ("walhook-event-type", job.event_type.to_string()),
            (
                "walhook-event-occurred-at",
                job.event_occurred_at.to_string(),
            ),
            ("walhook-schema-version", job.schema_version.to_string()),
            ("walhook-attempt", number.to_string()),
        ],
    )
}

/// A JSON `body` for `url`, signed under `msg_id` (Standard Webhooks
/// headers) with every secret in `secrets`, and walhook's own `extra`
/// headers.
pub fn signed<const N: usize>(
    url: &str,
    msg_id: String,
    secrets: &[VersionedSecret],
    unix_seconds: i64,
    body: Bytes,
    extra: [(&'static str, String); N],
) -> Outbound {
    let signature = signature_header(secrets, &msg_id, unix_seconds, &body);
    let mut headers = Vec::with_capacity(5 + N);
    headers.extend([
        ("content-type", "application/json".into()),
        ("user-agent", USER_AGENT.into()),
        ("webhook-id", msg_id),
        ("webhook-timestamp", unix_seconds.to_string()),
        ("webhook-signature", signature),
    ]);
    headers.extend(extra);
    Outbound {
        url: url.to_owned(),
        headers,
        body,
    }
}
