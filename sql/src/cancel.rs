//! Cancelling a pending delivery through the API, and the dispatcher's
//! view of cancellations.
//!
//! A cancel ends the delivery as `cancelled` (terminal), removes its
//! pending row, bumps its lease version (a result of an attempt already
//! out is then kept as history and never changes the state), writes an
//! audit record and a row of `walhook.delivery_cancellations`, all in one
//! transaction. Dispatcher nodes read those rows every sweep and drop the
//! deliveries from memory, so a retry they scheduled never goes out.

use uuid::Uuid;
use walhook_pipeline::delivery::{DeliveryStatus, EndReason};
use walhook_pipeline::ids::{DeliveryId, TenantId};

use crate::{Platform, StoreError, stored_opt};

/// What a cancel found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The delivery was pending and is now cancelled.
    Cancelled,
    /// No such delivery for this tenant.
    NotFound,
    /// The delivery is planned and its first attempt is being made now: it
    /// has no row to cancel yet.
    NotAttemptedYet,
    /// The delivery had ended already, in this state.
    Ended(DeliveryStatus),
}

impl Platform {
    /// Cancels pending delivery `id` of `tenant` on behalf of `actor`.
    pub async fn cancel_delivery_of_tenant(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
        actor: &str,
    ) -> Result<CancelOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        let cancelled = tx
            .query_opt(
                "UPDATE walhook.deliveries SET status = 'cancelled', last_error_class = $3, \
                   lease_owner = NULL, lease_expires_at = NULL, lease_version = lease_version + 1, \
                   updated_at = now() \
                 WHERE id = $1 AND tenant_id = $2 AND status = 'pending' RETURNING id",
                &[&uid, &tenant.as_str(), &EndReason::Cancelled.as_str()],
            )
            .await
            .map_err(StoreError::query("cancel a delivery"))?;
        if cancelled.is_none() {
            let status = tx
                .query_opt(
                    "SELECT status::text FROM walhook.deliveries WHERE id = $1 AND tenant_id = $2",
                    &[&uid, &tenant.as_str()],
                )
                .await
                .map_err(StoreError::query("read a delivery"))?
                .map(|r| r.get::<_, String>(0));
            drop(tx);
            let status: Option<DeliveryStatus> = stored_opt(status.as_deref(), "delivery", id)?;
            return Ok(match status {
                Some(status) => CancelOutcome::Ended(status),
                None if self.is_planned(tenant, id).await? => CancelOutcome::NotAttemptedYet,
                None => CancelOutcome::NotFound,
            });
        }
        for (sql, what) in [
            (
                "DELETE FROM walhook.pending WHERE delivery_id = $1",
                "remove a cancelled delivery's pending row",
            ),
            (
                "INSERT INTO walhook.delivery_cancellations (delivery_id) VALUES ($1)",
                "note a cancellation for the dispatchers",
            ),
        ] {
            tx.execute(sql, &[&uid])
                .await
                .map_err(StoreError::query(what))?;
        }
        tx.execute(
            "DELETE FROM walhook.delivery_cancellations WHERE cancelled_at < now() - interval '1 day'",
            &[],
        )
        .await
        .map_err(StoreError::query("forget old cancellations"))?;
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'delivery.cancelled', $3, '{}'::jsonb)",
            &[&tenant.as_str(), &actor, &id.to_string()],
        )
        .await
        .map_err(StoreError::query("audit a cancellation"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a cancellation"))?;
        Ok(CancelOutcome::Cancelled)
    }

    /// Cancellations after position `after` (at most `limit`, in order),
    /// and the position to ask after next time. With `after = None` it
    /// returns none and the current last position: a node starting now has
    /// nothing cancelled in memory.
    pub async fn read_cancellations(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<DeliveryId>, i64), StoreError> {
        let client = self.client().await?;
        let Some(after) = after else {
            let last: i64 = client
                .query_one(
                    "SELECT coalesce(max(seq), 0) FROM walhook.delivery_cancellations",
                    &[],
                )
                .await
                .map_err(StoreError::query("read the last cancellation"))?
                .get(0);
            return Ok((Vec::new(), last));
        };
        let rows = client
            .query(
                "SELECT seq, delivery_id FROM walhook.delivery_cancellations \
                 WHERE seq > $1 ORDER BY seq LIMIT $2",
                &[&after, &(limit as i64)],
            )
            .await
            .map_err(StoreError::query("read cancellations"))?;
        let next = rows.last().map_or(after, |r| r.get(0));
        Ok((
            rows.iter()
                .map(|r| DeliveryId(*r.get::<_, Uuid>(1).as_bytes()))
                .collect(),
            next,
        ))
    }
}
