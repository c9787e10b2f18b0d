//! The control plane's view of deliveries: tenant-scoped listings with
//! keyset cursors, one delivery with its event and attempts, and test
//! events (replays and recovery are in [`crate::replay`]).
//!
//! Listings are ordered newest first by `(created_at, id)`; a cursor is the
//! last row's pair, so pages stay stable while new deliveries arrive (they
//! only appear on the first page).

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{DeliveryStatus, NewDelivery};
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};

use crate::{Platform, StoreError};

/// What to list.
#[derive(Debug, Clone)]
pub struct DeliveryFilter {
    /// Whose deliveries (always set: the API never lists across tenants).
    pub tenant: TenantId,
    /// One endpoint's.
    pub endpoint: Option<EndpointId>,
    /// One event type's.
    pub event_type: Option<String>,
    /// In one status.
    pub status: Option<DeliveryStatus>,
    /// Made at or after.
    pub since: Option<SystemTime>,
    /// Made before.
    pub until: Option<SystemTime>,
    /// After this keyset position (created_at, id), newest first.
    pub before: Option<(SystemTime, Uuid)>,
    /// Rows at most.
    pub limit: i64,
}

/// A delivery as the API shows it.
#[derive(Debug, Clone)]
pub struct DeliveryRecord {
    /// Its id (`webhook-id`).
    pub id: DeliveryId,
    /// Its event.
    pub event_id: EventId,
    /// Its endpoint.
    pub endpoint_id: EndpointId,
    /// The event type.
    pub event_type: String,
    /// Where it stands.
    pub status: DeliveryStatus,
    /// Automatic attempts made.
    pub attempt_count: i32,
    /// Manual attempts made.
    pub manual_attempt_count: i32,
    /// The next automatic attempt, while pending.
    pub next_attempt_at: SystemTime,
    /// When automatic retries stop.
    pub expires_at: SystemTime,
    /// The last attempt's HTTP status.
    pub last_http_status: Option<i32>,
    /// The last failure's class.
    pub last_error_class: Option<String>,
    /// The endpoint config version at fan-out.
    pub endpoint_config_version: i32,
    /// When the event occurred.
    pub event_occurred_at: SystemTime,
    /// When the delivery was made.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
}

/// An event with its exact body.
#[derive(Debug, Clone)]
pub struct EventRecord {
    /// Its id.
    pub id: EventId,
    /// Its type.
    pub event_type: String,
    /// Its schema version.
    pub schema_version: i32,
    /// The business object.
    pub object_id: Option<String>,
    /// The object's version.
    pub object_version: Option<String>,
    /// The commit time.
    pub occurred_at: SystemTime,
    /// The capture source (`walhook.api` for test events).
    pub source: String,
    /// The exact bytes sent.
    pub payload: Vec<u8>,
    /// Their SHA-256.
    pub payload_sha256: Vec<u8>,
}

/// One attempt.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    /// Its id.
    pub id: AttemptId,
    /// Its number (manual ones are numbered apart).
    pub number: i32,
    /// `auto` or `manual`.
    pub trigger: String,
    /// The endpoint config version used.
    pub endpoint_config_version: i32,
    /// When it started.
    pub started_at: SystemTime,
    /// When it finished.
    pub finished_at: SystemTime,
    /// The HTTP status, if any.
    pub http_status: Option<i32>,
    /// Milliseconds taken.
    pub latency_ms: i32,
    /// `succeeded`, `retryable`, `rejected`, `gone`.
    pub outcome: String,
    /// Why it failed.
    pub error_class: Option<String>,
    /// SHA-256 of the response body read.
    pub response_sha256: Option<Vec<u8>>,
    /// The start of the response body.
    pub response_excerpt: Option<String>,
}

const DELIVERY_COLUMNS: &str = "d.id, d.event_id, d.endpoint_id, d.event_type, d.status::text, \
    d.attempt_count, d.manual_attempt_count, d.next_attempt_at, d.expires_at, d.last_http_status, \
    d.last_error_class, d.endpoint_config_version, d.event_occurred_at, d.created_at, d.updated_at";

fn delivery_row(r: &tokio_postgres::Row) -> DeliveryRecord {
    let status: String = r.get(4);
    DeliveryRecord {
        id: DeliveryId(*r.get::<_, Uuid>(0).as_bytes()),
        event_id: EventId(*r.get::<_, Uuid>(1).as_bytes()),
        endpoint_id: EndpointId(*r.get::<_, Uuid>(2).as_bytes()),
        event_type: r.get(3),
        status: DeliveryStatus::parse(&status).unwrap_or(DeliveryStatus::Pending),
        attempt_count: r.get(5),
        manual_attempt_count: r.get(6),
        next_attempt_at: r.get(7),
        expires_at: r.get(8),
        last_http_status: r.get(9),
        last_error_class: r.get(10),
        endpoint_config_version: r.get(11),
        event_occurred_at: r.get(12),
        created_at: r.get(13),
        updated_at: r.get(14),
    }
}

impl Platform {
    /// Deliveries matching `f`, newest first.
    pub async fn list_deliveries(
        &self,
        f: &DeliveryFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        // Built from the filters given, so that each query can use the
        // (tenant|endpoint, created_at, id) indexes.
        let mut sql =
            format!("SELECT {DELIVERY_COLUMNS} FROM walhook.deliveries d WHERE d.tenant_id = $1");
        let endpoint = f.endpoint.map(|e| Uuid::from_bytes(e.0));
        let status = f.status.map(DeliveryStatus::as_str);
        let (before_at, before_id) = f.before.unzip();
        let tenant = f.tenant.as_str();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&tenant];
        let mut n = 1;
        let mut push = |cond: &str, sql: &mut String| {
            n += 1;
            sql.push_str(&cond.replace('?', &format!("${n}")));
        };
        if let Some(e) = &endpoint {
            push(" AND d.endpoint_id = ?", &mut sql);
            params.push(e);
        }
        if let Some(t) = &f.event_type {
            push(" AND d.event_type = ?", &mut sql);
            params.push(t);
        }
        if let Some(s) = &status {
            push(" AND d.status = ?::text::walhook.delivery_status", &mut sql);
            params.push(s);
        }
        if let Some(t) = &f.since {
            push(" AND d.created_at >= ?", &mut sql);
            params.push(t);
        }
        if let Some(t) = &f.until {
            push(" AND d.created_at < ?", &mut sql);
            params.push(t);
        }
        if let (Some(at), Some(id)) = (&before_at, &before_id) {
            push(" AND (d.created_at, d.id) < (?", &mut sql);
            params.push(at);
            push(", ?)", &mut sql);
            params.push(id);
        }
        push(" ORDER BY d.created_at DESC, d.id DESC LIMIT ?", &mut sql);
        params.push(&f.limit);
        let client = self.client().await?;
        let rows = client
            .query(&sql, &params)
            .await
            .map_err(StoreError::query("list deliveries"))?;
        Ok(rows.iter().map(delivery_row).collect())
    }

    /// Delivery `id` of `tenant`.
    pub async fn delivery_of_tenant(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM walhook.deliveries d WHERE d.id = $1 AND d.tenant_id = $2"
                ),
                &[&Uuid::from_bytes(id.0), &tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("read a delivery"))?;
        Ok(row.as_ref().map(delivery_row))
    }

    /// The event of `delivery` (found in its day partition).
    pub async fn event_of(
        &self,
        delivery: &DeliveryRecord,
    ) -> Result<Option<EventRecord>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT id, event_type, schema_version, object_id, object_version, occurred_at, source, \
                        payload, payload_sha256 \
                 FROM walhook.events WHERE id = $1 AND occurred_at = $2",
                &[&Uuid::from_bytes(delivery.event_id.0), &delivery.event_occurred_at],
            )
            .await
            .map_err(StoreError::query("read an event"))?;
        Ok(row.map(|r| EventRecord {
            id: EventId(*r.get::<_, Uuid>(0).as_bytes()),
            event_type: r.get(1),
            schema_version: r.get(2),
            object_id: r.get(3),
            object_version: r.get(4),
            occurred_at: r.get(5),
            source: r.get(6),
            payload: r.get(7),
            payload_sha256: r.get(8),
        }))
    }

    /// The attempts of delivery `id`, in the order they started.
    pub async fn attempts_of(&self, id: DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, number, trigger::text, endpoint_config_version, started_at, finished_at, \
                        http_status, latency_ms, outcome, error_class, response_sha256, response_excerpt \
                 FROM walhook.attempts WHERE delivery_id = $1 ORDER BY started_at, number",
                &[&Uuid::from_bytes(id.0)],
            )
            .await
            .map_err(StoreError::query("read attempts"))?;
        Ok(rows
            .iter()
            .map(|r| AttemptRow {
                id: AttemptId(*r.get::<_, Uuid>(0).as_bytes()),
                number: r.get(1),
                trigger: r.get(2),
                endpoint_config_version: r.get(3),
                started_at: r.get(4),
                finished_at: r.get(5),
                http_status: r.get(6),
                latency_ms: r.get(7),
                outcome: r.get(8),
                error_class: r.get(9),
                response_sha256: r.get(10),
                response_excerpt: r.get(11),
            })
            .collect())
    }

    /// Stores a test event and its one delivery in one transaction, with an
    /// audit record. The delivery is pending, due now and unleased, so the
    /// dispatcher's sweep claims and sends it like any other.
    pub async fn insert_test_delivery(
        &self,
        event: &Event,
        delivery: &NewDelivery,
        actor: &str,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        self.ensure_partitions(&client, "events", std::iter::once(event.occurred_at))
            .await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        tx.execute(
            "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version, \
                                         occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::pg_lsn, $10, $11, $12)",
            &[
                &Uuid::from_bytes(event.id.0),
                &event.tenant_id.as_str(),
                &event.event_type.as_str(),
                &(event.schema_version as i32),
                &event.object_id,
                &event.object_version,
                &event.occurred_at.to_system_time(),
                &&*event.source,
                &event.key.commit_lsn.to_string(),
                &(event.key.tx_ordinal as i32),
                &event.payload.as_ref(),
                &event.payload_hash.as_slice(),
            ],
        )
        .await
        .map_err(StoreError::query("store a test event"))?;
        tx.execute(
            "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at, \
                                             endpoint_config_version, next_attempt_at, expires_at, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $8, $8)",
            &[
                &Uuid::from_bytes(delivery.id.0),
                &Uuid::from_bytes(delivery.event_id.0),
                &Uuid::from_bytes(delivery.endpoint_id.0),
                &delivery.tenant_id.as_str(),
                &delivery.event_type.as_str(),
                &delivery.event_occurred_at.to_system_time(),
                &delivery.endpoint_config_version,
                &delivery.created_at.to_system_time(),
                &delivery.expires_at.to_system_time(),
            ],
        )
        .await
        .map_err(StoreError::query("store a test delivery"))?;
        tx.execute(
            "INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at) \
             VALUES ($1, $2, $3, $3)",
            &[
                &Uuid::from_bytes(delivery.id.0),
                &Uuid::from_bytes(delivery.endpoint_id.0),
                &delivery.created_at.to_system_time(),
            ],
        )
        .await
        .map_err(StoreError::query("schedule a test delivery"))?;
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.test_sent', $3, jsonb_build_object('delivery_id', $4::text, 'event_id', $5::text))",
            &[
                &delivery.tenant_id.as_str(),
                &actor,
                &delivery.endpoint_id.to_string(),
                &delivery.id.to_string(),
                &event.id.to_string(),
            ],
        )
        .await
        .map_err(StoreError::query("audit a test event"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("commit a test event"))?;
        Ok(())
    }
}
