//! What capture keeps in the platform database: checkpoints, incidents and
//! the event-type catalog.

use walhook_pipeline::capture::{CaptureIncidentStore, Incident};
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
        let kinds: Vec<&str> = incidents.iter().map(|i| i.kind.as_str()).collect();
        let lsns: Vec<Option<String>> = incidents
            .iter()
            .map(|i| i.commit_lsn.map(|l| l.to_string()))
            .collect();
        let ordinals: Vec<Option<i32>> = incidents
            .iter()
            .map(|i| i.tx_ordinal.map(|o| o as i32))
            .collect();
        let rules: Vec<Option<&str>> = incidents.iter().map(|i| i.rule.as_deref()).collect();
        let tables: Vec<Option<&str>> = incidents.iter().map(|i| i.table.as_deref()).collect();
        let details: Vec<&str> = incidents.iter().map(|i| i.detail.as_str()).collect();
        client
            .execute(
                "INSERT INTO walhook.capture_incidents (source, kind, commit_lsn, tx_ordinal, rule, table_name, detail) \
                 SELECT $1, k, l::pg_lsn, o, r, t, d \
                 FROM unnest($2::text[], $3::text[], $4::int4[], $5::text[], $6::text[], $7::text[]) AS u(k, l, o, r, t, d) \
                 ON CONFLICT DO NOTHING",
                &[&source, &kinds, &lsns, &ordinals, &rules, &tables, &details],
            )
            .await
            .map_err(StoreError::query("record capture incidents"))?;
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

impl CaptureIncidentStore for Platform {
    async fn record_capture_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self.record_incidents(source, incidents).await?)
    }
}
