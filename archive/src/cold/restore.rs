//! The restore behind a replay of an archived delivery: the delivery and
//! its event become hot rows again, with the same ids and bytes.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::ids::{DeliveryId, TenantId};
use walhook_pipeline::objstore::ObjectStore;

use super::{ColdHistory, Restore, Slot};
use crate::ArchiveError;

impl<S: ObjectStore> ColdHistory<S> {
    /// Makes archived delivery `id` of `tenant` and its event hot again, so
    /// that a replay can send it: the same ids and bytes, the delivery's
    /// last state. A later archive round writes them as a new generation
    /// of their days.
    pub async fn restore(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
        held: Option<&Slot>,
    ) -> Result<Restore, ArchiveError> {
        // One slot for both reads.
        let own = self.slot(tenant, held)?;
        let held = own.as_ref().or(held);
        let Some(delivery) = self.delivery(tenant, id, held).await? else {
            return Ok(Restore::NotFound);
        };
        let age = SystemTime::now()
            .duration_since(delivery.event_occurred_at)
            .unwrap_or_default();
        if age > self.replay_window {
            return Ok(Restore::OutsideWindow {
                occurred_at: delivery.event_occurred_at,
                window: self.replay_window,
            });
        }
        let Some(event) = self.event(tenant, &delivery, held).await? else {
            return Ok(Restore::NotFound);
        };
        let mut client = self.platform.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(ArchiveError::query("start a restore"))?;
        let e = &event.record;
        tx.execute(
            "SELECT walhook.ensure_day_partition('events', ($1::timestamptz AT TIME ZONE 'UTC')::date)",
            &[&e.occurred_at],
        )
        .await
        .map_err(ArchiveError::query("make the event's day partition"))?;
        tx.execute(
            "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version, \
             occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ('0/0'::pg_lsn + $9::text::numeric), $10, $11, $12, $13) \
             ON CONFLICT DO NOTHING",
            &[
                &Uuid::from_bytes(e.id.0),
                &tenant.as_str(),
                &e.event_type,
                &e.schema_version,
                &e.object_id,
                &e.object_version,
                &e.occurred_at,
                &e.source,
                &event.commit_lsn.to_string(),
                &event.tx_ordinal,
                &e.payload,
                &e.payload_sha256,
                &event.created_at,
            ],
        )
        .await
        .map_err(ArchiveError::query("restore an archived event"))?;
        let d = &delivery;
        // Made on its first day: the row goes back to that day's partition.
        tx.execute(
            "SELECT walhook.ensure_day_partition('deliveries', ($1::timestamptz AT TIME ZONE 'UTC')::date)",
            &[&d.created_at],
        )
        .await
        .map_err(ArchiveError::query("make the delivery's day partition"))?;
        tx.execute(
            "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at, \
             endpoint_config_version, status, attempt_count, manual_attempt_count, next_attempt_at, expires_at, \
             last_http_status, last_error_class, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::walhook.delivery_status, $9, $10, $11, $12, $13, $14, $15, $16) \
             ON CONFLICT DO NOTHING",
            &[
                &Uuid::from_bytes(d.id.0),
                &Uuid::from_bytes(d.event_id.0),
                &Uuid::from_bytes(d.endpoint_id.0),
                &tenant.as_str(),
                &d.event_type,
                &d.event_occurred_at,
                &d.endpoint_config_version,
                &d.status.as_str(),
                &d.attempt_count,
                &d.manual_attempt_count,
                &d.next_attempt_at,
                &d.expires_at,
                &d.last_http_status,
                &d.last_error_class.map(|e| e.as_str()),
                &d.created_at,
                &d.updated_at,
            ],
        )
        .await
        .map_err(ArchiveError::query("restore an archived delivery"))?;
        walhook_sql::commit!(tx, client).map_err(ArchiveError::query("commit a restore"))?;
        tracing::info!(delivery_id = %id, tenant = %tenant, "archived delivery restored for a replay");
        Ok(Restore::Restored)
    }
}
