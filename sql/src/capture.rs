//! What capture keeps in the platform database: checkpoints, incidents and
//! the event-type catalog.

use walhook_pipeline::capture::Incident;
use walhook_pipeline::ids::Lsn;

use crate::{Platform, StoreError};

impl Platform {
    /// Records that `source` confirmed `lsn` on `slot`.
    pub async fn save_checkpoint(
        &self,
        source: &str,
        slot: &str,
        lsn: Lsn,
        lag_bytes: Option<i64>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO walhook.capture_checkpoints (source, slot_name, confirmed_lsn, slot_lag_bytes) \
                 VALUES ($1, $2, $3::text::pg_lsn, $4) \
                 ON CONFLICT (source) DO UPDATE SET slot_name = EXCLUDED.slot_name, \
                   confirmed_lsn = greatest(walhook.capture_checkpoints.confirmed_lsn, EXCLUDED.confirmed_lsn), \
                   slot_lag_bytes = coalesce(EXCLUDED.slot_lag_bytes, walhook.capture_checkpoints.slot_lag_bytes), \
                   updated_at = now()",
                &[&source, &slot, &lsn.to_string(), &lag_bytes],
            )
            .await
            .map_err(StoreError::query("save a capture checkpoint"))?;
        Ok(())
    }

    /// Stores incidents; one seen again after a restart is stored once.
    pub async fn record_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> Result<(), StoreError> {
        if incidents.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "INSERT INTO walhook.capture_incidents (source, kind, commit_lsn, tx_ordinal, rule, table_name, detail) \
                 VALUES ($1, $2, $3::text::pg_lsn, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            )
            .await
            .map_err(StoreError::query("prepare an incident insert"))?;
        for i in incidents {
            let ordinal = i.tx_ordinal.map(|o| o as i32);
            let lsn = i.commit_lsn.map(|l| l.to_string());
            client
                .execute(
                    &stmt,
                    &[
                        &source,
                        &i.kind.as_str(),
                        &lsn,
                        &ordinal,
                        &i.rule,
                        &i.table,
                        &i.detail,
                    ],
                )
                .await
                .map_err(StoreError::query("record a capture incident"))?;
        }
        Ok(())
    }

    /// Records the event types a source's rules produce.
    pub async fn upsert_event_types(
        &self,
        source: &str,
        types: &[(String, u32)],
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        for (name, version) in types {
            client
                .execute(
                    "INSERT INTO walhook.event_types (name, schema_version, source) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO UPDATE SET schema_version = EXCLUDED.schema_version, \
                       source = EXCLUDED.source, updated_at = now()",
                    &[name, &(*version as i32), &source],
                )
                .await
                .map_err(StoreError::query("record an event type"))?;
        }
        Ok(())
    }
}
