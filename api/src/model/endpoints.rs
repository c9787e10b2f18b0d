//! Endpoint bodies.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use walhook_pipeline::dispatch::breaker::CircuitState;
use walhook_sql::endpoint_admin::{EndpointRecord, EndpointVersionRecord};

use super::{RetrySchedule, double_option, ts};
use crate::idempotency::ShownOnce;

/// The longest URL accepted.
pub const MAX_URL_LEN: usize = 2048;
/// The longest description accepted (characters).
pub const MAX_DESCRIPTION_LEN: usize = 1024;
/// The most event types one endpoint may subscribe to.
pub const MAX_EVENT_TYPES: usize = 256;
/// The highest rate limit (requests per second).
pub const MAX_RATE_LIMIT: u32 = 100_000;
/// The highest in-flight cap.
pub const MAX_IN_FLIGHT: u32 = 1_000;

fn yes() -> bool {
    true
}

/// A new endpoint.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateEndpoint {
    /// Where deliveries go: `https://` on an approved port, a public host;
    /// no user name or password.
    #[schema(example = "https://hooks.example.com/walhook", max_length = 2048)]
    pub url: String,
    /// A description for people.
    #[serde(default)]
    #[schema(max_length = 1024)]
    pub description: String,
    /// Subscribed event types from the catalog (`GET /v1/event-types`);
    /// empty means every type.
    #[serde(default)]
    #[schema(max_items = 256, example = json!(["invoice.paid"]))]
    pub event_types: Vec<String>,
    /// Requests per second at most; absent or null for no limit.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100000)]
    pub rate_limit_per_sec: Option<u32>,
    /// Concurrent requests at most; absent or null for the dispatcher's
    /// default.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_in_flight: Option<u32>,
    /// Whether it receives deliveries (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Its own retry schedule; absent fields inherit the tenant's, then
    /// the platform's.
    #[serde(default)]
    pub retry: Option<RetrySchedule>,
    /// How its deliveries are ordered (default `none`).
    #[serde(default)]
    pub ordering: Ordering,
}

/// How an endpoint's deliveries are ordered.
///
/// `none` (the default) attempts every delivery as soon as the endpoint's
/// limits allow: the fastest, and events of one object may arrive in any
/// order (retries especially). `per_object` attempts the deliveries of one
/// object (the event's `object_id`) in commit order: the next waits while
/// an earlier one is pending, retries included (head-of-line blocking,
/// bounded by the retry schedule's deadline); after an earlier one fails or
/// is exhausted, the next goes and its first attempt is noted
/// `previous_in_order_failed`. Events without an object are not ordered;
/// replays are not held back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Ordering {
    /// Any order, as fast as limits allow.
    #[default]
    None,
    /// One object's deliveries in commit order.
    PerObject,
}

impl From<Ordering> for walhook_pipeline::endpoint::DeliveryOrder {
    fn from(o: Ordering) -> Self {
        match o {
            Ordering::None => walhook_pipeline::endpoint::DeliveryOrder::Unordered,
            Ordering::PerObject => walhook_pipeline::endpoint::DeliveryOrder::PerObject,
        }
    }
}

impl Ordering {
    /// From a stored name (an unknown one reads as `none`; dispatch
    /// quarantines such an endpoint).
    pub fn from_stored(s: &str) -> Self {
        match s {
            "per_object" => Ordering::PerObject,
            _ => Ordering::None,
        }
    }
}

/// A change to an endpoint: absent fields stay as they are. Every change
/// makes a new config version.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PatchEndpoint {
    /// A new URL (checked like at creation).
    #[schema(max_length = 2048)]
    pub url: Option<String>,
    /// A new description.
    #[schema(max_length = 1024)]
    pub description: Option<String>,
    /// New subscriptions (replacing the old; empty means every type).
    #[schema(max_items = 256)]
    pub event_types: Option<Vec<String>>,
    /// Enable or disable (disabled endpoints get no new deliveries; pending
    /// ones wait).
    pub enabled: Option<bool>,
    /// A new rate limit; null removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100000)]
    pub rate_limit_per_sec: Option<Option<u32>>,
    /// A new in-flight cap; null removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1000)]
    pub max_in_flight: Option<Option<u32>>,
    /// A new retry schedule (replacing the old); null removes it.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<RetrySchedule>)]
    pub retry: Option<Option<RetrySchedule>>,
    /// A new ordering (applies to deliveries taken after the change).
    pub ordering: Option<Ordering>,
}

/// An endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Endpoint {
    /// Its id (`ep_…`).
    pub id: String,
    /// Where deliveries go.
    pub url: String,
    /// A description.
    pub description: String,
    /// Subscribed types; empty means every type.
    pub event_types: Vec<String>,
    /// Whether it gets new deliveries.
    pub enabled: bool,
    /// Why it is disabled.
    pub disabled_reason: Option<String>,
    /// Requests per second at most.
    pub rate_limit_per_sec: Option<i32>,
    /// Concurrent requests at most.
    pub max_in_flight: Option<i32>,
    /// The current config version (deliveries record the one they were
    /// made with).
    pub config_version: i32,
    /// The current signing secret's version.
    pub secret_version: i32,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// Its own retry schedule, if it has one (absent fields inherit the
    /// tenant's, then the platform's).
    pub retry: Option<RetrySchedule>,
    /// How its deliveries are ordered.
    pub ordering: Ordering,
    /// Its ownership check.
    pub verification: Verification,
}

/// Whether an endpoint proved that its URL wants these webhooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VerificationState {
    /// It answered the ownership proof (or was created without the
    /// requirement).
    Verified,
    /// It has not proven the current challenge: its deliveries are made
    /// and wait; nothing is sent to it.
    Pending,
}

/// An endpoint's ownership check: walhook sends a signed
/// `webhook.verification` request with a `challenge`; the endpoint passes by
/// answering 2xx with `{"proof": "…"}`, the base64 HMAC-SHA256 of
/// `"walhook-verification.v1." + challenge` under its secret (an echo of the
/// challenge does not pass).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Verification {
    /// Verified or pending.
    pub state: VerificationState,
    /// When the current check was asked for.
    pub requested_at: Option<DateTime<Utc>>,
    /// When it passed.
    pub verified_at: Option<DateTime<Utc>>,
    /// Why the latest try of the current check failed (retried every
    /// minute; `POST …/verify` sends a new one at once).
    pub last_error: Option<String>,
    /// When that try was made.
    pub last_checked_at: Option<DateTime<Utc>>,
}

impl From<EndpointRecord> for Endpoint {
    fn from(r: EndpointRecord) -> Self {
        Endpoint {
            id: r.id.to_string(),
            url: r.url,
            description: r.description,
            event_types: r.event_types,
            enabled: r.enabled,
            disabled_reason: r.disabled_reason,
            rate_limit_per_sec: r.rate_limit_per_sec,
            max_in_flight: r.max_in_flight,
            config_version: r.config_version,
            secret_version: r.secret_version,
            created_at: ts(r.created_at),
            updated_at: ts(r.updated_at),
            retry: r.retry.map(RetrySchedule::from),
            ordering: Ordering::from_stored(&r.ordering),
            verification: Verification {
                state: if r.verification.pending {
                    VerificationState::Pending
                } else {
                    VerificationState::Verified
                },
                requested_at: r.verification.requested_at.map(ts),
                verified_at: r.verification.verified_at.map(ts),
                last_error: r.verification.last_error,
                last_checked_at: r.verification.last_checked_at.map(ts),
            },
        }
    }
}

/// A new endpoint and its signing secret, shown only this once.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedEndpoint {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// The signing secret (`whsec_…`): verify webhooks with it. `null` when
    /// this response is an idempotent replay (`secret_withheld`): secrets
    /// are shown once and never stored in plaintext.
    #[schema(required = true)]
    pub secret: Option<String>,
    /// `true` when `secret` is `null` because this is a replay of a request
    /// with the same `Idempotency-Key`; `note` says how to get a secret.
    pub secret_withheld: bool,
    /// Why the secret is missing and what to do (replays only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl CreatedEndpoint {
    /// The response that shows `secret`.
    pub fn new(endpoint: Endpoint, secret: String) -> Self {
        CreatedEndpoint {
            endpoint,
            secret: Some(secret),
            secret_withheld: false,
            note: None,
        }
    }
}

impl ShownOnce for CreatedEndpoint {
    fn withheld(&self) -> Self {
        let note = format!(
            "the signing secret is shown only in the first response to this Idempotency-Key; \
             get a new one with POST /v1/webhook-endpoints/{}/rotate-secret",
            self.endpoint.id
        );
        CreatedEndpoint {
            endpoint: self.endpoint.clone(),
            secret: None,
            secret_withheld: true,
            note: Some(note),
        }
    }
}

impl std::fmt::Debug for CreatedEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedEndpoint")
            .field("endpoint", &self.endpoint)
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("secret_withheld", &self.secret_withheld)
            .finish()
    }
}

/// A page of endpoints, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EndpointPage {
    /// The endpoints.
    pub data: Vec<Endpoint>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// One config version of an endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EndpointVersion {
    /// The version.
    pub version: i32,
    /// The URL.
    pub url: String,
    /// The description.
    pub description: String,
    /// The subscriptions.
    pub event_types: Vec<String>,
    /// Enabled or not.
    pub enabled: bool,
    /// The rate limit.
    pub rate_limit_per_sec: Option<i32>,
    /// The in-flight cap.
    pub max_in_flight: Option<i32>,
    /// When this version was made.
    pub changed_at: DateTime<Utc>,
    /// Who made it.
    pub changed_by: String,
    /// The version of the newest signing secret in force from this version
    /// on (a secret rotation makes a new config version); absent for
    /// versions recorded before walhook kept it.
    pub secret_version: Option<i32>,
    /// Its own retry schedule then, if it had one.
    pub retry: Option<RetrySchedule>,
    /// The ordering then.
    pub ordering: Ordering,
}

impl From<EndpointVersionRecord> for EndpointVersion {
    fn from(r: EndpointVersionRecord) -> Self {
        EndpointVersion {
            version: r.version,
            url: r.url,
            description: r.description,
            event_types: r.event_types,
            enabled: r.enabled,
            rate_limit_per_sec: r.rate_limit_per_sec,
            max_in_flight: r.max_in_flight,
            changed_at: ts(r.changed_at),
            changed_by: r.changed_by,
            secret_version: r.secret_version,
            retry: r.retry.map(RetrySchedule::from),
            ordering: Ordering::from_stored(&r.ordering),
        }
    }
}

/// Every config version of an endpoint, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EndpointVersionList {
    /// The versions.
    pub data: Vec<EndpointVersion>,
}

/// An endpoint's attempts hour by hour, and its circuit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EndpointStats {
    /// The endpoint.
    pub endpoint_id: String,
    /// Attempts over the window (automatic and manual).
    pub attempts: i64,
    /// Of them, answered 2xx.
    pub succeeded: i64,
    /// `succeeded / attempts`; null without attempts.
    pub success_rate: Option<f64>,
    /// Every hour of the window (UTC), oldest first, the current
    /// (unfinished) hour last; hours without attempts count 0.
    pub hours: Vec<HourStats>,
    /// The endpoint's circuit breaker, as dispatch last recorded it.
    pub circuit: Circuit,
}

/// One hour of an endpoint's attempts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HourStats {
    /// The hour's start.
    pub hour: DateTime<Utc>,
    /// Attempts started in the hour.
    pub attempts: i64,
    /// Of them, answered 2xx.
    pub succeeded: i64,
}

fn circuit_state_schema() -> utoipa::openapi::schema::Object {
    super::names_schema(
        "closed (sending), open (holding deliveries until open_until), half_open (one probe decides)",
        &[CircuitState::NAMES],
        false,
    )
}

/// A circuit breaker's state.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Circuit {
    /// `closed` (sending), `open` (holding deliveries until `open_until`),
    /// `half_open` (one probe decides).
    #[schema(schema_with = circuit_state_schema)]
    pub state: CircuitState,
    /// Failed attempts in a row.
    pub consecutive_failures: i32,
    /// The first failure of the current run of failures.
    pub failing_since: Option<DateTime<Utc>>,
    /// When the circuit last opened.
    pub opened_at: Option<DateTime<Utc>>,
    /// Until when an open circuit holds deliveries (then a probe goes).
    pub open_until: Option<DateTime<Utc>>,
}

impl Circuit {
    /// The circuit recorded for an endpoint, or closed when none is.
    pub fn from_row(row: Option<walhook_sql::tallies::CircuitRow>) -> Self {
        match row {
            Some(c) => Circuit {
                state: c.state,
                consecutive_failures: c.consecutive_failures,
                failing_since: c.failing_since.map(ts),
                opened_at: c.opened_at.map(ts),
                open_until: c.open_until.map(ts),
            },
            None => Circuit {
                state: CircuitState::Closed,
                consecutive_failures: 0,
                failing_since: None,
                opened_at: None,
                open_until: None,
            },
        }
    }
}

/// A secret rotation.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// How long the previous secrets keep signing, in seconds (default
    /// 86400, at most 604800; 0 retires them at once, for a leaked secret).
    #[schema(minimum = 0, maximum = 604800)]
    pub overlap_seconds: Option<u64>,
}

/// A new signing secret, shown only this once.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct RotatedSecret {
    /// The new secret (`whsec_…`). `null` when this response is an
    /// idempotent replay (`secret_withheld`): secrets are shown once.
    #[schema(required = true)]
    pub secret: Option<String>,
    /// `true` when `secret` is `null` because this is a replay of a request
    /// with the same `Idempotency-Key`; `note` says how to get a secret.
    pub secret_withheld: bool,
    /// Why the secret is missing and what to do (replays only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Its version.
    pub secret_version: i32,
    /// The endpoint config version the rotation made (every rotation is a
    /// new version, listed under `/versions`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_version: Option<i32>,
    /// Until when the previous secrets also sign (each request carries one
    /// signature per active secret).
    pub previous_secrets_expire_at: DateTime<Utc>,
}

impl ShownOnce for RotatedSecret {
    fn withheld(&self) -> Self {
        RotatedSecret {
            secret: None,
            secret_withheld: true,
            note: Some(
                "the new secret is shown only in the first response to this Idempotency-Key; \
                 rotate again (with a new key) to get one you can see"
                    .into(),
            ),
            ..self.clone()
        }
    }
}

impl std::fmt::Debug for RotatedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatedSecret")
            .field("secret", &self.secret.as_ref().map(|_| "***"))
            .field("secret_withheld", &self.secret_withheld)
            .field("secret_version", &self.secret_version)
            .finish_non_exhaustive()
    }
}

/// Replay the failures of an endpoint.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecoverEndpoint {
    /// Deliveries made at or after this time.
    pub since: DateTime<Utc>,
    /// And before this time (default: now).
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
}

/// What a recovery asked for.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RecoverAccepted {
    /// Failed or exhausted deliveries that will get a manual attempt
    /// (those with one already queued are not counted again).
    pub replay_request_count: i64,
    /// The window's start.
    pub since: DateTime<Utc>,
    /// The window's end, when given.
    pub until: Option<DateTime<Utc>>,
}

/// A test event on its way.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TestAccepted {
    /// The `webhook.test` event (`evt_…`).
    pub event_id: String,
    /// Its delivery (`dlv_…`, the `webhook-id` the endpoint receives).
    pub delivery_id: String,
}
