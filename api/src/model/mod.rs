//! The API's request and response bodies, with their OpenAPI schemas.
//!
//! Request bodies deny unknown fields (a typo is a 422 naming it, not a
//! silently ignored setting). Times are RFC 3339 in UTC; ids are the
//! prefixed text forms (`ep_…`, `dlv_…`, `evt_…`, `att_…`, `key_…`).

pub mod deliveries;
pub mod endpoints;
pub mod tenants;

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;
use walhook_pipeline::retry::RetryOverride;

/// The OpenAPI schema of a stored name (see `walhook_pipeline::stored`): a
/// string with exactly the values the domain enum has, so the document
/// cannot drift from the code.
pub(crate) fn names_schema(
    description: &str,
    names: &[&[&'static str]],
    nullable: bool,
) -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    let mut values: Vec<serde_json::Value> = names
        .iter()
        .flat_map(|n| n.iter())
        .map(|n| serde_json::Value::from(*n))
        .collect();
    let ty = if nullable {
        values.push(serde_json::Value::Null);
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::Type(Type::String)
    };
    ObjectBuilder::new()
        .schema_type(ty)
        .description(Some(description))
        .enum_values(Some(values))
        .build()
}

/// A stored time as an RFC 3339 UTC value.
pub fn ts(t: SystemTime) -> DateTime<Utc> {
    DateTime::<Utc>::from(t)
}

/// Lower-case hex of bytes (digests).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// For `PATCH` fields that may be removed: absent leaves the value, `null`
/// removes it, a value sets it.
pub fn double_option<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Changes to the retry schedule (`[retry]`) for a tenant or an endpoint.
/// Absent fields inherit: an endpoint's from its tenant, a tenant's from
/// `[retry]`. Each value must lie within the operator's `[retry.limits]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetrySchedule {
    /// Automatic attempts at most, the first included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 8)]
    pub max_attempts: Option<u32>,
    /// The first backoff ceiling, in seconds (the delay before attempt
    /// `n + 1` is uniform in `[0, min(max_delay, base_delay · 2^(n-1))]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 10)]
    pub base_delay_seconds: Option<u64>,
    /// The largest backoff ceiling, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 3600)]
    pub max_delay_seconds: Option<u64>,
    /// No automatic attempt after this many seconds from the delivery's
    /// creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, example = 86400)]
    pub deadline_seconds: Option<u64>,
}

impl From<RetrySchedule> for RetryOverride {
    fn from(r: RetrySchedule) -> Self {
        RetryOverride {
            max_attempts: r.max_attempts,
            base_delay_seconds: r.base_delay_seconds,
            max_delay_seconds: r.max_delay_seconds,
            deadline_seconds: r.deadline_seconds,
        }
    }
}

impl From<RetryOverride> for RetrySchedule {
    fn from(r: RetryOverride) -> Self {
        RetrySchedule {
            max_attempts: r.max_attempts,
            base_delay_seconds: r.base_delay_seconds,
            max_delay_seconds: r.max_delay_seconds,
            deadline_seconds: r.deadline_seconds,
        }
    }
}

/// An event type of the catalog.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventType {
    /// Its name, e.g. `invoice.paid`.
    pub name: String,
    /// The current version of its payload schema.
    pub schema_version: i32,
    /// What produces it: a capture source's name, or `walhook.api` for
    /// `webhook.test`.
    pub source: String,
    /// A description.
    pub description: String,
    /// When the catalog entry last changed.
    pub updated_at: DateTime<Utc>,
}

/// One version of an event type's payload schema.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SchemaVersion {
    /// The version (`schema_version` in payloads and the
    /// `walhook-schema-version` header).
    pub version: i32,
    /// Its JSON Schema (draft 2020-12), derived from the rule's columns and
    /// their Postgres types.
    #[schema(value_type = Object)]
    pub schema: serde_json::Value,
    /// The capture source that registered it.
    pub source: String,
    /// When it was registered (the shape was first seen).
    pub created_at: DateTime<Utc>,
}

/// An event type with every version of its schema.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventTypeDetail {
    /// The type.
    #[serde(flatten)]
    pub event_type: EventType,
    /// Every schema version, oldest first (empty for types whose payload
    /// the producer shapes: outbox and message rules, `webhook.test`).
    pub versions: Vec<SchemaVersion>,
}

/// The event-type catalog.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventTypeList {
    /// Every type, by name.
    pub data: Vec<EventType>,
}

/// One audit record: who changed what, and when.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEntry {
    /// Its id (grows with time).
    pub id: i64,
    /// The tenant it concerns.
    pub tenant_id: Option<String>,
    /// Who: `operator` or `api_key:key_…`.
    pub actor: String,
    /// What, e.g. `endpoint.created`, `endpoint.updated`,
    /// `endpoint.disabled`, `endpoint.deleted`, `endpoint.secret_rotated`,
    /// `endpoint.recovered`, `endpoint.test_sent`,
    /// `delivery.replay_requested`, `tenant.created`, `api_key.created`,
    /// `api_key.revoked`.
    pub action: String,
    /// On what: an endpoint, delivery, tenant or key id.
    pub target: Option<String>,
    /// Details: config version, changed fields, overlap, counts.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    /// When.
    pub at: DateTime<Utc>,
}

/// A page of audit records, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// The records.
    pub data: Vec<AuditEntry>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// What `/healthz` and `/readyz` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok`, or what is wrong.
    pub status: String,
}

/// One reconciliation run (`walhook reconcile`, or `[reconcile]` in
/// `walhook run`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Reconciliation {
    /// Its id (grows with time).
    pub id: i64,
    /// `command` or `scheduled`.
    pub trigger: String,
    /// The window's start (inclusive).
    pub since: DateTime<Utc>,
    /// The window's end (exclusive).
    pub until: DateTime<Utc>,
    /// The one tenant reconciled; absent for every tenant.
    pub tenant_id: Option<String>,
    /// Whether it repaired what it could.
    pub repair: bool,
    /// No gap left unrepaired (for a tenant: none of its own).
    pub clean: bool,
    /// Gaps left (for a tenant: its own).
    pub open_gaps: i64,
    /// Gaps by class, e.g. `{"missing_delivery": 2}` (operator only).
    #[schema(value_type = Object)]
    pub gap_counts: serde_json::Value,
    /// SHA-256 of the report's data: equal for two runs that found the
    /// same.
    pub data_sha256: String,
    /// When it began.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// One run: the whole report (format `walhook.reconcile.report`, see
    /// docs/reconcile.md) for the operator; for a tenant, `{funnel, gaps}`
    /// of its own, in lists too.
    #[schema(value_type = Option<Object>)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub report: Option<serde_json::Value>,
}

/// A page of reconciliation runs, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReconciliationPage {
    /// The runs.
    pub data: Vec<Reconciliation>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}
