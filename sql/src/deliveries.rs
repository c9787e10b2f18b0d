//! The control plane's view of deliveries: tenant-scoped listings with
//! keyset cursors, one delivery with its event and attempts, and test
//! events (replays and recovery are in [`crate::replay`]).
//!
//! Listings are ordered newest first by `(created_at, id)`; a cursor is the
//! last row's pair, so pages stay stable while new deliveries arrive (they
//! only appear on the first page).

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{
    AttemptNote, DeliveryStatus, LastError, NewDelivery, OutcomeKind, Trigger,
};
use walhook_pipeline::dispatch::outcome::ErrorClass;
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};

use crate::{Platform, StoreError, stored, stored_opt};

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
    /// The last failure's class, or why it ended without an attempt.
    pub last_error_class: Option<LastError>,
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

/// A delivery of the hot store with its event and attempts, as one
/// snapshot showed them.
#[derive(Debug, Clone)]
pub struct HotHistory {
    /// The delivery.
    pub delivery: DeliveryRecord,
    /// Its event, while the hot store has it.
    pub event: Option<EventRecord>,
    /// Its attempts, in the order they started.
    pub attempts: Vec<AttemptRow>,
}

/// One attempt.
#[derive(Debug, Clone)]
pub struct AttemptRow {
    /// Its id.
    pub id: AttemptId,
    /// Its number (manual ones are numbered apart).
    pub number: i32,
    /// What started it.
    pub trigger: Trigger,
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
    /// What it came to.
    pub outcome: OutcomeKind,
    /// Why it failed.
    pub error_class: Option<ErrorClass>,
    /// SHA-256 of the response body read.
    pub response_sha256: Option<Vec<u8>>,
    /// The start of the response body.
    pub response_excerpt: Option<String>,
    /// The versions of the secrets that signed it, newest first (`None`
    /// for attempts recorded before walhook kept them).
    pub secret_versions: Option<Vec<i32>>,
    /// Why the attempt is special, when it is.
    pub note: Option<AttemptNote>,
}

const DELIVERY_COLUMNS: &str = "d.id, d.event_id, d.endpoint_id, d.event_type, d.status::text, \
    d.attempt_count, d.manual_attempt_count, d.next_attempt_at, d.expires_at, d.last_http_status, \
    d.last_error_class, d.endpoint_config_version, d.event_occurred_at, d.created_at, d.updated_at";

/// The same columns for a delivery fan-out planned that has no row yet
/// (`x` is a row of the plan's `unnest`): pending, no attempt, due since it
/// was planned.
const PLANNED_COLUMNS: &str = "x.id, f.event_id, x.ep, f.event_type, 'pending'::text, 0, 0, \
    f.created_at, f.expires_at, NULL::int4, NULL::text, x.ver, f.event_occurred_at, f.created_at, f.created_at";

/// The deliveries of fan-out plans that have no row yet, as `x(id, ep,
/// ver)` beside their plan `f`.
const PLANNED_FROM: &str = "walhook.fanouts f \
    CROSS JOIN LATERAL unnest(f.delivery_ids, f.endpoint_ids, f.config_versions) AS x(id, ep, ver)";

fn delivery_row(r: &tokio_postgres::Row) -> Result<DeliveryRecord, StoreError> {
    let id = DeliveryId(*r.get::<_, Uuid>(0).as_bytes());
    Ok(DeliveryRecord {
        id,
        event_id: EventId(*r.get::<_, Uuid>(1).as_bytes()),
        endpoint_id: EndpointId(*r.get::<_, Uuid>(2).as_bytes()),
        event_type: r.get(3),
        status: stored(r.get(4), "delivery", id)?,
        attempt_count: r.get(5),
        manual_attempt_count: r.get(6),
        next_attempt_at: r.get(7),
        expires_at: r.get(8),
        last_http_status: r.get(9),
        last_error_class: stored_opt(r.get(10), "delivery", id)?,
        endpoint_config_version: r.get(11),
        event_occurred_at: r.get(12),
        created_at: r.get(13),
        updated_at: r.get(14),
    })
}

impl Platform {
    /// Whether endpoint `id` is `tenant`'s, deleted or not (its history
    /// stays listable): a listing filtered by another tenant's endpoint is
    /// answered 404 before anything is read.
    pub async fn endpoint_is_tenants(
        &self,
        tenant: &TenantId,
        id: EndpointId,
    ) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(client
            .query_opt(
                "SELECT 1 FROM walhook.endpoints WHERE id = $1 AND tenant_id = $2",
                &[&Uuid::from_bytes(id.0), &tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("look up an endpoint of the tenant"))?
            .is_some())
    }

    /// Deliveries matching `f`, newest first: those with a row, and those
    /// fan-out planned that have none yet (pending, not attempted).
    pub async fn list_deliveries(
        &self,
        f: &DeliveryFilter,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        // Built from the filters given, so that the rows' branch can use the
        // (tenant|endpoint, created_at, id) indexes; the plans' branch is
        // small (deliveries waiting for their first attempt).
        let endpoint = f.endpoint.map(|e| Uuid::from_bytes(e.0));
        let status = f.status.map(DeliveryStatus::as_str);
        let (before_at, before_id) = f.before.unzip();
        let tenant = f.tenant.as_str();
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&tenant];
        let mut rows_where = String::from("d.tenant_id = $1");
        let mut plans_where = String::from(
            "f.tenant_id = $1 AND (SELECT true FROM walhook.deliveries r WHERE r.id = x.id) IS NULL",
        );
        // The placeholder of the next parameter pushed.
        let mut n = 1;
        let mut next = || {
            n += 1;
            format!("${n}")
        };
        if let Some(e) = &endpoint {
            let p = next();
            params.push(e);
            rows_where.push_str(&format!(" AND d.endpoint_id = {p}"));
            plans_where.push_str(&format!(" AND x.ep = {p}"));
        }
        if let Some(t) = &f.event_type {
            let p = next();
            params.push(t);
            rows_where.push_str(&format!(" AND d.event_type = {p}"));
            plans_where.push_str(&format!(" AND f.event_type = {p}"));
        }
        // Planned deliveries are pending: a filter on another status
        // leaves them out.
        let plans = status.is_none_or(|s| s == "pending");
        if let Some(s) = &status {
            let p = next();
            params.push(s);
            rows_where.push_str(&format!(
                " AND d.status = {p}::text::walhook.delivery_status"
            ));
        }
        if let Some(t) = &f.since {
            let p = next();
            params.push(t);
            rows_where.push_str(&format!(" AND d.created_at >= {p}"));
            plans_where.push_str(&format!(" AND f.created_at >= {p}"));
        }
        if let Some(t) = &f.until {
            let p = next();
            params.push(t);
            rows_where.push_str(&format!(" AND d.created_at < {p}"));
            plans_where.push_str(&format!(" AND f.created_at < {p}"));
        }
        if let (Some(at), Some(id)) = (&before_at, &before_id) {
            let pa = next();
            params.push(at);
            let pi = next();
            params.push(id);
            rows_where.push_str(&format!(" AND (d.created_at, d.id) < ({pa}, {pi})"));
            plans_where.push_str(&format!(" AND (f.created_at, x.id) < ({pa}, {pi})"));
        }
        let pl = next();
        params.push(&f.limit);
        let rows_part = format!(
            "SELECT {DELIVERY_COLUMNS} FROM walhook.deliveries d WHERE {rows_where} \
             ORDER BY d.created_at DESC, d.id DESC LIMIT {pl}"
        );
        let sql = if plans {
            format!(
                "SELECT * FROM (({rows_part}) UNION ALL \
                   (SELECT {PLANNED_COLUMNS} FROM {PLANNED_FROM} WHERE {plans_where} \
                    ORDER BY f.created_at DESC, x.id DESC LIMIT {pl})) AS d (id, event_id, endpoint_id, \
                   event_type, status, attempt_count, manual_attempt_count, next_attempt_at, expires_at, \
                   last_http_status, last_error_class, endpoint_config_version, event_occurred_at, \
                   created_at, updated_at) \
                 ORDER BY created_at DESC, id DESC LIMIT {pl}"
            )
        } else {
            rows_part
        };
        // Prepared once per connection and filter combination (a bounded
        // set): a listing costs Postgres no parse and no fresh plan.
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&sql)
            .await
            .map_err(StoreError::query("prepare the delivery listing"))?;
        let rows = client
            .query(&stmt, &params)
            .await
            .map_err(StoreError::query("list deliveries"))?;
        rows.iter().map(delivery_row).collect()
    }

    /// Delivery `id` of `tenant`.
    pub async fn delivery_of_tenant(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        self.delivery_on(&self.client().await?, tenant, id).await
    }

    /// [`Self::delivery_of_tenant`] on `client`: its row, or its plan.
    async fn delivery_on(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let row = client
            .query_opt(
                &format!(
                    "SELECT {DELIVERY_COLUMNS} FROM walhook.deliveries d WHERE d.id = $1 AND d.tenant_id = $2"
                ),
                &[&Uuid::from_bytes(id.0), &tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("read a delivery"))?;
        if let Some(row) = row {
            return delivery_row(&row).map(Some);
        }
        self.planned_delivery(client, tenant, id).await
    }

    /// Delivery `id` of `tenant` while it has no row (fan-out planned it;
    /// its first attempt has not been recorded): found through its plan,
    /// whose event id shares the delivery id's first 8 bytes.
    async fn planned_delivery(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let mut low = [0u8; 16];
        let mut high = [0xffu8; 16];
        low[..8].copy_from_slice(&id.0[..8]);
        high[..8].copy_from_slice(&id.0[..8]);
        let row = client
            .query_opt(
                &format!(
                    "SELECT {PLANNED_COLUMNS} FROM {PLANNED_FROM} \
                     WHERE f.event_id BETWEEN $3 AND $4 AND f.tenant_id = $2 AND x.id = $1"
                ),
                &[
                    &Uuid::from_bytes(id.0),
                    &tenant.as_str(),
                    &Uuid::from_bytes(low),
                    &Uuid::from_bytes(high),
                ],
            )
            .await
            .map_err(StoreError::query("read a planned delivery"))?;
        row.as_ref().map(delivery_row).transpose()
    }

    /// Whether delivery `id` of `tenant` is planned and has no row yet.
    pub async fn is_planned(&self, tenant: &TenantId, id: DeliveryId) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(self.planned_delivery(&client, tenant, id).await?.is_some())
    }

    /// The event of `delivery` (found in its day partition).
    pub async fn event_of(
        &self,
        delivery: &DeliveryRecord,
    ) -> Result<Option<EventRecord>, StoreError> {
        event_on(&self.client().await?, delivery).await
    }

    /// The attempts of delivery `id`, in the order they started.
    pub async fn attempts_of(&self, id: DeliveryId) -> Result<Vec<AttemptRow>, StoreError> {
        attempts_on(&self.client().await?, id).await
    }

    /// Delivery `id` of `tenant` (a row, or a plan), its event and its
    /// attempts, read in one snapshot: the attempts listed are those its
    /// counts and status describe, even while an attempt is being recorded.
    /// `None` when the hot store has no such delivery.
    pub async fn hot_history(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<HotHistory>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(StoreError::query("begin reading a delivery's history"))?;
        let history = match self.delivery_on(&tx, tenant, id).await? {
            Some(delivery) => Some(HotHistory {
                event: event_on(&tx, &delivery).await?,
                attempts: attempts_on(&tx, id).await?,
                delivery,
            }),
            None => None,
        };
        crate::commit!(tx, client)
            .map_err(StoreError::query("end reading a delivery's history"))?;
        Ok(history)
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
        self.ensure_partitions(&client, "deliveries", std::iter::once(delivery.created_at))
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
        crate::commit!(tx, client).map_err(StoreError::query("commit a test event"))?;
        Ok(())
    }
}

/// The event of `delivery`, read on `client`.
async fn event_on(
    client: &impl deadpool_postgres::GenericClient,
    delivery: &DeliveryRecord,
) -> Result<Option<EventRecord>, StoreError> {
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

/// The attempts of delivery `id` in the order they started, read on
/// `client`.
async fn attempts_on(
    client: &impl deadpool_postgres::GenericClient,
    id: DeliveryId,
) -> Result<Vec<AttemptRow>, StoreError> {
    let rows = client
        .query(
            "SELECT id, number, trigger::text, endpoint_config_version, started_at, finished_at, \
                    http_status, latency_ms, outcome, error_class, response_sha256, response_excerpt, \
                    secret_versions, note \
             FROM walhook.attempts WHERE delivery_id = $1 ORDER BY started_at, number",
            &[&Uuid::from_bytes(id.0)],
        )
        .await
        .map_err(StoreError::query("read attempts"))?;
    rows.iter()
        .map(|r| {
            let id = AttemptId(*r.get::<_, Uuid>(0).as_bytes());
            Ok(AttemptRow {
                id,
                number: r.get(1),
                trigger: stored(r.get(2), "attempt", id)?,
                endpoint_config_version: r.get(3),
                started_at: r.get(4),
                finished_at: r.get(5),
                http_status: r.get(6),
                latency_ms: r.get(7),
                outcome: stored(r.get(8), "attempt", id)?,
                error_class: stored_opt(r.get(9), "attempt", id)?,
                response_sha256: r.get(10),
                response_excerpt: r.get(11),
                secret_versions: r.get(12),
                note: stored_opt(r.get(13), "attempt", id)?,
            })
        })
        .collect()
}
