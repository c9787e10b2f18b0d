//! Delivery bodies.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::{IntoParams, ToSchema};
use walhook_pipeline::delivery::{AttemptNote, DeliveryStatus, EndReason, LastError, OutcomeKind};
use walhook_pipeline::dispatch::outcome::ErrorClass;
use walhook_sql::deliveries::{AttemptRow, DeliveryRecord, EventRecord};

use super::{hex, names_schema, ts};

fn last_error_schema() -> utoipa::openapi::schema::Object {
    names_schema(
        "The last failure's class, or why the delivery ended without an attempt",
        &[ErrorClass::NAMES, EndReason::NAMES],
        true,
    )
}

fn outcome_schema() -> utoipa::openapi::schema::Object {
    names_schema("What the attempt came to", &[OutcomeKind::NAMES], false)
}

fn error_class_schema() -> utoipa::openapi::schema::Object {
    names_schema("Why the attempt failed", &[ErrorClass::NAMES], true)
}

fn note_schema() -> utoipa::openapi::schema::Object {
    names_schema(
        "Why the attempt is special: previous_outcome_unknown (an earlier attempt may have reached the receiver without its outcome being recorded, so a duplicate is possible), previous_in_order_failed (the endpoint orders per object and an earlier delivery of this object ended without success)",
        &[AttemptNote::NAMES],
        true,
    )
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for an attempt (first, retry, or paused while the endpoint
    /// is disabled).
    Pending,
    /// An attempt got a 2xx.
    Succeeded,
    /// A permanent failure (3xx, 4xx other than 408/429): no retries.
    Failed,
    /// Retries ran out (attempts or the 24 h deadline).
    Exhausted,
    /// Stopped (the endpoint was deleted).
    Cancelled,
}

impl From<DeliveryStatus> for Status {
    fn from(s: DeliveryStatus) -> Self {
        match s {
            DeliveryStatus::Pending => Status::Pending,
            DeliveryStatus::Succeeded => Status::Succeeded,
            DeliveryStatus::Failed => Status::Failed,
            DeliveryStatus::Exhausted => Status::Exhausted,
            DeliveryStatus::Cancelled => Status::Cancelled,
        }
    }
}

/// The filters of `GET /v1/webhook-deliveries` (all optional).
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveryQuery {
    /// One endpoint's deliveries (`ep_…`).
    #[param(value_type = Option<String>)]
    pub endpoint_id: Option<String>,
    /// One event type's.
    #[param(value_type = Option<String>)]
    pub event_type: Option<String>,
    /// In one status.
    #[param(value_type = Option<Status>)]
    pub status: Option<String>,
    /// Made at or after (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub since: Option<String>,
    /// Made before (RFC 3339).
    #[param(value_type = Option<String>, format = DateTime)]
    pub until: Option<String>,
    /// `next_cursor` of the previous page, with the same filters.
    #[param(value_type = Option<String>)]
    pub cursor: Option<String>,
    /// Page size, 1 to 250 (default 50).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 250)]
    pub limit: Option<String>,
}

/// A delivery: one event for one endpoint.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Delivery {
    /// Its id (`dlv_…`), sent as `webhook-id`: stable across retries and
    /// replays.
    pub id: String,
    /// The event (`evt_…`).
    pub event_id: String,
    /// The endpoint (`ep_…`).
    pub endpoint_id: String,
    /// The event type.
    pub event_type: String,
    /// Where it stands.
    pub status: Status,
    /// Automatic attempts made.
    pub attempt_count: i32,
    /// Manual attempts (replays) made.
    pub manual_attempt_count: i32,
    /// The next automatic attempt, while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When automatic retries stop.
    pub expires_at: DateTime<Utc>,
    /// The last attempt's HTTP status.
    pub last_http_status: Option<i32>,
    /// The last failure's class (`http_5xx`, `timeout`, `connect`, …), or
    /// why the delivery ended without an attempt (`endpoint_deleted`,
    /// `cancelled`, …).
    #[schema(schema_with = last_error_schema)]
    pub last_error_class: Option<LastError>,
    /// The endpoint's config version when the delivery was made.
    pub endpoint_config_version: i32,
    /// When the event occurred (its commit time).
    pub event_occurred_at: DateTime<Utc>,
    /// When the delivery was made.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<DeliveryRecord> for Delivery {
    fn from(r: DeliveryRecord) -> Self {
        Delivery {
            id: r.id.to_string(),
            event_id: r.event_id.to_string(),
            endpoint_id: r.endpoint_id.to_string(),
            event_type: r.event_type,
            status: r.status.into(),
            attempt_count: r.attempt_count,
            manual_attempt_count: r.manual_attempt_count,
            next_attempt_at: (r.status == DeliveryStatus::Pending).then(|| ts(r.next_attempt_at)),
            expires_at: ts(r.expires_at),
            last_http_status: r.last_http_status,
            last_error_class: r.last_error_class,
            endpoint_config_version: r.endpoint_config_version,
            event_occurred_at: ts(r.event_occurred_at),
            created_at: ts(r.created_at),
            updated_at: ts(r.updated_at),
        }
    }
}

/// A page of deliveries, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeliveryPage {
    /// The deliveries.
    pub data: Vec<Delivery>,
    /// Pass as `cursor` (with the same filters) for the next page; absent
    /// on the last page.
    pub next_cursor: Option<String>,
}

/// An event with its exact body.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Event {
    /// Its id (`evt_…`).
    pub id: String,
    /// Its type.
    #[serde(rename = "type")]
    pub event_type: String,
    /// The version of its payload schema.
    pub schema_version: i32,
    /// The business object.
    pub object_id: Option<String>,
    /// The object's version.
    pub object_version: Option<String>,
    /// When it occurred (commit time).
    pub occurred_at: DateTime<Utc>,
    /// What produced it (a capture source, or `walhook.api`).
    pub source: String,
    /// The body every attempt sends, byte for byte.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    /// SHA-256 of the body, hex.
    pub payload_sha256: String,
}

impl From<EventRecord> for Event {
    fn from(r: EventRecord) -> Self {
        let text = String::from_utf8_lossy(&r.payload).into_owned();
        let payload = RawValue::from_string(text.clone()).unwrap_or_else(|_| {
            // Bodies are canonical JSON; this only guards against a damaged row.
            RawValue::from_string(serde_json::Value::String(text).to_string())
                .expect("a JSON string is JSON")
        });
        Event {
            id: r.id.to_string(),
            event_type: r.event_type,
            schema_version: r.schema_version,
            object_id: r.object_id,
            object_version: r.object_version,
            occurred_at: ts(r.occurred_at),
            source: r.source,
            payload,
            payload_sha256: hex(&r.payload_sha256),
        }
    }
}

/// What started an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// The automatic schedule.
    Auto,
    /// A replay (API or recovery).
    Manual,
}

/// One HTTP try.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Attempt {
    /// Its id (`att_…`).
    pub id: String,
    /// Its number.
    pub number: i32,
    /// What started it.
    pub trigger: Trigger,
    /// The endpoint config version it used.
    pub endpoint_config_version: i32,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// When its outcome was known.
    pub finished_at: DateTime<Utc>,
    /// The HTTP status, when a response came.
    pub http_status: Option<i32>,
    /// Milliseconds taken.
    pub latency_ms: i32,
    /// What it came to.
    #[schema(schema_with = outcome_schema)]
    pub outcome: OutcomeKind,
    /// Why it failed.
    #[schema(schema_with = error_class_schema)]
    pub error_class: Option<ErrorClass>,
    /// SHA-256 of the response body read, hex.
    pub response_sha256: Option<String>,
    /// The start of the response body.
    pub response_excerpt: Option<String>,
    /// The versions of the endpoint's secrets that signed it, newest first
    /// (more than one during a rotation overlap); absent for attempts
    /// recorded before walhook kept them.
    pub secret_versions: Option<Vec<i32>>,
    /// Why the attempt is special, when it is:
    /// `previous_outcome_unknown` (an earlier attempt may have reached the
    /// receiver without its outcome being recorded, so a duplicate is
    /// possible), `previous_in_order_failed` (the endpoint orders per
    /// object, and an earlier delivery of this object ended without
    /// success: this one went without it).
    #[schema(schema_with = note_schema)]
    pub note: Option<AttemptNote>,
}

impl From<AttemptRow> for Attempt {
    fn from(r: AttemptRow) -> Self {
        Attempt {
            id: r.id.to_string(),
            number: r.number,
            trigger: match r.trigger {
                walhook_pipeline::delivery::Trigger::Manual => Trigger::Manual,
                walhook_pipeline::delivery::Trigger::Auto => Trigger::Auto,
            },
            endpoint_config_version: r.endpoint_config_version,
            started_at: ts(r.started_at),
            finished_at: ts(r.finished_at),
            http_status: r.http_status,
            latency_ms: r.latency_ms,
            outcome: r.outcome,
            error_class: r.error_class,
            response_sha256: r.response_sha256.as_deref().map(hex),
            response_excerpt: r.response_excerpt,
            secret_versions: r.secret_versions,
            note: r.note,
        }
    }
}

/// A delivery with its event and attempts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryDetail {
    /// The delivery.
    pub delivery: Delivery,
    /// Its event and exact body.
    pub event: Event,
    /// Every attempt, in the order they started.
    pub attempts: Vec<Attempt>,
}

/// A replay on its way.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplayAccepted {
    /// The request's id; the dispatcher makes one manual attempt (same
    /// `webhook-id`, same bytes, current secrets) within a sweep interval.
    pub replay_request_id: i64,
    /// The delivery.
    pub delivery_id: String,
}

/// One header of a request, as it went out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SentHeader {
    /// Its name, lower-case.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// The HTTP request one attempt sent, rebuilt from what walhook stores
/// (the event's bytes, the endpoint's URL in the attempt's config version,
/// the secrets of the versions that signed it, the attempt's number and
/// start time) by the same code that built it for the dispatcher: the
/// same bytes and headers, and a signature that verifies.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SentRequest {
    /// The attempt (`att_…`).
    pub attempt_id: String,
    /// Its number (`walhook-attempt`).
    pub number: i32,
    /// Always `POST`.
    pub method: String,
    /// The URL it went to (the endpoint's URL in the attempt's config
    /// version).
    pub url: String,
    /// Every header, in the order they were written; `host`, `accept` and
    /// `content-length` are the ones the HTTP client adds.
    pub headers: Vec<SentHeader>,
    /// The body, byte for byte (the event's stored bytes, UTF-8 JSON).
    pub body: String,
    /// SHA-256 of the body, hex.
    pub body_sha256: String,
    /// The versions of the endpoint's secrets that signed it, newest first.
    pub secret_versions: Option<Vec<i32>>,
    /// Why `webhook-signature` is missing from `headers`, when it is: the
    /// attempt predates the record of its secret versions, or a secret no
    /// longer opens.
    pub signature_unavailable: Option<String>,
}

/// The requests of a delivery's attempts, in the order they started.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SentRequestList {
    /// One per attempt.
    pub data: Vec<SentRequest>,
}
