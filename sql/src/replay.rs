//! Manual replays: asked for by the API (one delivery, or every failure of
//! an endpoint in a time window), carried out by the dispatcher.
//!
//! A delivery has at most one open request (`done_at IS NULL`) when asked
//! through the API: replays and recoveries of one endpoint take the same
//! transaction-scoped advisory lock, then look for an open request in a
//! statement that starts after the lock is held, so two callers cannot both
//! see "none open". The advisory lock, unlike `FOR UPDATE` on the endpoint
//! row, does not block fan-out, whose delivery inserts take `KEY SHARE`
//! locks on endpoints.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::ids::{DeliveryId, EndpointId, TenantId};

use crate::{Platform, StoreError};

/// Failed deliveries one recovery statement asks for at most: a recovery of
/// a long outage is many short statements (each well inside the API's
/// `statement_timeout`), not one unbounded one.
pub const RECOVER_BATCH: i64 = 1000;

/// What a replay request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// Queued: the request's id.
    Requested(i64),
    /// No such delivery for this tenant.
    NotFound,
    /// The delivery is planned and has not had its first attempt yet: it
    /// is being sent anyway.
    NotAttemptedYet,
    /// The delivery's endpoint was deleted: nothing to send to.
    EndpointDeleted,
    /// The delivery's event occurred before the replay window.
    OutsideWindow {
        /// When the event occurred.
        occurred_at: SystemTime,
    },
    /// A request for this delivery is open already (not carried out yet).
    AlreadyOpen {
        /// The open request's id.
        request: i64,
        /// When it was made.
        requested_at: SystemTime,
    },
}

/// Serialises replay requests of one endpoint until the transaction ends.
async fn lock_endpoint_replays(
    tx: &deadpool_postgres::Transaction<'_>,
    endpoint: Uuid,
) -> Result<(), StoreError> {
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('walhook.replays:' || $1::uuid::text, 0))",
        &[&endpoint],
    )
    .await
    .map_err(StoreError::query("lock an endpoint's replays"))?;
    Ok(())
}

impl Platform {
    /// Asks for a manual attempt of `delivery`; returns the request's id.
    /// The dispatcher sends it (same `webhook-id`, same bytes, signed with
    /// the endpoint's current secrets) within a sweep interval. Fails with
    /// [`StoreError::Schema`] when the delivery does not exist.
    pub async fn request_replay(
        &self,
        delivery: DeliveryId,
        actor: &str,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "INSERT INTO walhook.replay_requests (delivery_id, requested_by) \
                 SELECT id, $2 FROM walhook.deliveries WHERE id = $1 RETURNING id",
                &[&Uuid::from_bytes(delivery.0), &actor],
            )
            .await
            .map_err(StoreError::query("request a replay"))?
            .ok_or_else(|| StoreError::Schema(format!("delivery {delivery} does not exist")))?;
        Ok(row.get(0))
    }

    /// Asks for a manual attempt of delivery `id` of `tenant` (see
    /// [`Platform::request_replay`]), with an audit record, unless one is
    /// open already.
    pub async fn request_replay_of_tenant(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
        actor: &str,
        window: std::time::Duration,
    ) -> Result<ReplayOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        let row = tx
            .query_opt(
                "SELECT e.deleted_at IS NOT NULL, e.id, d.event_occurred_at FROM walhook.deliveries d \
                 JOIN walhook.endpoints e ON e.id = d.endpoint_id \
                 WHERE d.id = $1 AND d.tenant_id = $2",
                &[&uid, &tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("read a delivery"))?;
        if let Some(r) = &row {
            let occurred_at: SystemTime = r.get(2);
            let age = SystemTime::now()
                .duration_since(occurred_at)
                .unwrap_or_default();
            if age > window {
                return Ok(ReplayOutcome::OutsideWindow { occurred_at });
            }
        }
        let endpoint: Uuid = match row.map(|r| (r.get::<_, bool>(0), r.get(1))) {
            None if self.is_planned(tenant, id).await? => {
                return Ok(ReplayOutcome::NotAttemptedYet);
            }
            None => return Ok(ReplayOutcome::NotFound),
            Some((true, _)) => return Ok(ReplayOutcome::EndpointDeleted),
            Some((false, endpoint)) => endpoint,
        };
        lock_endpoint_replays(&tx, endpoint).await?;
        let open = tx
            .query_opt(
                "SELECT id, requested_at FROM walhook.replay_requests \
                 WHERE delivery_id = $1 AND done_at IS NULL ORDER BY id LIMIT 1",
                &[&uid],
            )
            .await
            .map_err(StoreError::query("look for an open replay"))?;
        if let Some(open) = open {
            return Ok(ReplayOutcome::AlreadyOpen {
                request: open.get(0),
                requested_at: open.get(1),
            });
        }
        let request: i64 = tx
            .query_one(
                "INSERT INTO walhook.replay_requests (delivery_id, requested_by) VALUES ($1, $2) RETURNING id",
                &[&uid, &actor],
            )
            .await
            .map_err(StoreError::query("request a replay"))?
            .get(0);
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'delivery.replay_requested', $3, jsonb_build_object('replay_request_id', $4::int8))",
            &[&tenant.as_str(), &actor, &id.to_string(), &request],
        )
        .await
        .map_err(StoreError::query("audit a replay"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a replay"))?;
        Ok(ReplayOutcome::Requested(request))
    }

    /// Asks for a manual attempt of every failed or exhausted delivery of
    /// endpoint `endpoint` of `tenant` made in `[since, until)` that has no
    /// open replay request yet (so recovering twice asks once). Works
    /// oldest first in transactions of at most [`RECOVER_BATCH`]
    /// deliveries; a recovery cut short (a crash, a timeout) has committed
    /// whole batches, and asking again completes it. Returns how many were
    /// asked for, or `None` when the endpoint is not the tenant's.
    pub async fn recover_endpoint(
        &self,
        tenant: &TenantId,
        endpoint: EndpointId,
        since: SystemTime,
        until: Option<SystemTime>,
        actor: &str,
    ) -> Result<Option<i64>, StoreError> {
        let mut client = self.client().await?;
        let uid = Uuid::from_bytes(endpoint.0);
        if !crate::endpoint_admin::is_tenants(&client, tenant, uid).await? {
            return Ok(None);
        }
        let mut count = 0i64;
        // The keyset of the last delivery looked at; the nil id sorts
        // before every real one, so the first batch starts at `since`.
        let mut after = (since, Uuid::nil());
        loop {
            let tx = client
                .transaction()
                .await
                .map_err(StoreError::query("begin"))?;
            lock_endpoint_replays(&tx, uid).await?;
            let batch = tx
                .query(
                    "SELECT d.id, d.created_at FROM walhook.deliveries d \
                     WHERE d.endpoint_id = $1 AND d.status IN ('failed', 'exhausted') \
                       AND d.created_at >= $2 AND ($3::timestamptz IS NULL OR d.created_at < $3) \
                       AND (d.created_at, d.id) > ($4, $5) \
                     ORDER BY d.created_at, d.id LIMIT $6",
                    &[&uid, &since, &until, &after.0, &after.1, &RECOVER_BATCH],
                )
                .await
                .map_err(StoreError::query("read failed deliveries"))?;
            let Some(last) = batch.last() else {
                break;
            };
            after = (last.get(1), last.get(0));
            let ids: Vec<Uuid> = batch.iter().map(|r| r.get(0)).collect();
            // A statement of its own, after the lock: it sees requests that
            // a replay holding the lock before us committed.
            let asked = tx
                .execute(
                    "INSERT INTO walhook.replay_requests (delivery_id, requested_by) \
                     SELECT u.id, $2 FROM unnest($1::uuid[]) WITH ORDINALITY AS u(id, n) \
                     WHERE NOT EXISTS (SELECT 1 FROM walhook.replay_requests r \
                                       WHERE r.delivery_id = u.id AND r.done_at IS NULL) \
                     ORDER BY u.n",
                    &[&ids, &actor],
                )
                .await
                .map_err(StoreError::query("request replays"))?;
            crate::commit!(tx, client).map_err(StoreError::query("commit a recovery batch"))?;
            count += asked as i64;
            if (ids.len() as i64) < RECOVER_BATCH {
                break;
            }
        }
        client
            .execute(
                "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
                 VALUES ($1, $2, 'endpoint.recovered', $3, jsonb_build_object('since', $4::timestamptz, \
                         'until', $5::timestamptz, 'replay_request_count', $6::int8))",
                &[&tenant.as_str(), &actor, &endpoint.to_string(), &since, &until, &count],
            )
            .await
            .map_err(StoreError::query("audit a recovery"))?;
        Ok(Some(count))
    }
}
