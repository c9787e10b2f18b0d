//! The catalog of event schemas: every version of every table rule's event
//! shape, with its JSON Schema.

use std::time::SystemTime;

use walhook_pipeline::capture::SchemaCatalog;

use crate::{Platform, StoreError};

/// One stored schema version.
#[derive(Debug, Clone)]
pub struct SchemaVersionRecord {
    /// The version.
    pub version: i32,
    /// The JSON Schema.
    pub schema: serde_json::Value,
    /// The capture source that registered it.
    pub source: String,
    /// When it was registered.
    pub created_at: SystemTime,
}

/// The catalog as one capture source writes it.
#[derive(Debug, Clone)]
pub struct SourceSchemas {
    platform: Platform,
    source: String,
}

impl Platform {
    /// The catalog for capture source `source`.
    pub fn schema_catalog(&self, source: &str) -> SourceSchemas {
        SourceSchemas {
            platform: self.clone(),
            source: source.to_owned(),
        }
    }

    /// Every schema version of `event_type`, oldest first.
    pub async fn schema_versions(
        &self,
        event_type: &str,
    ) -> Result<Vec<SchemaVersionRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT version, schema, source, created_at FROM walhook.event_schemas \
                 WHERE event_type = $1 ORDER BY version",
                &[&event_type],
            )
            .await
            .map_err(StoreError::query("read event schemas"))?;
        Ok(rows
            .iter()
            .map(|r| SchemaVersionRecord {
                version: r.get(0),
                schema: r.get(1),
                source: r.get(2),
                created_at: r.get(3),
            })
            .collect())
    }

    async fn register_schema(
        &self,
        source: &str,
        event_type: &str,
        base: u32,
        fingerprint: &str,
        schema_of: &(dyn Fn(u32) -> serde_json::Value + Send + Sync),
    ) -> Result<u32, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        // One registration per type at a time: versions are dense.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('walhook.event_schemas:' || $1, 0))",
            &[&event_type],
        )
        .await
        .map_err(StoreError::query("lock an event type's schemas"))?;
        let row = tx
            .query_opt(
                "SELECT version FROM walhook.event_schemas WHERE event_type = $1 AND fingerprint = $2",
                &[&event_type, &fingerprint],
            )
            .await
            .map_err(StoreError::query("read an event schema"))?;
        if let Some(row) = row {
            return Ok(row.get::<_, i32>(0) as u32);
        }
        let latest: Option<i32> = tx
            .query_one(
                "SELECT max(version) FROM walhook.event_schemas WHERE event_type = $1",
                &[&event_type],
            )
            .await
            .map_err(StoreError::query("read an event type's versions"))?
            .get(0);
        let base = i32::try_from(base).unwrap_or(i32::MAX);
        let version = latest.map_or(base, |v| (v + 1).max(base));
        let schema = schema_of(version as u32);
        tx.execute(
            "INSERT INTO walhook.event_schemas (event_type, version, fingerprint, schema, source) \
             VALUES ($1, $2, $3, $4, $5)",
            &[&event_type, &version, &fingerprint, &schema, &source],
        )
        .await
        .map_err(StoreError::query("store an event schema"))?;
        // The catalog's current version follows the newest shape.
        tx.execute(
            "INSERT INTO walhook.event_types (name, schema_version, source) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET schema_version = greatest(walhook.event_types.schema_version, EXCLUDED.schema_version), \
               updated_at = now()",
            &[&event_type, &version, &source],
        )
        .await
        .map_err(StoreError::query("update the event-type catalog"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit an event schema"))?;
        tracing::info!(event_type, version, "registered a new event schema version");
        Ok(version as u32)
    }
}

impl SchemaCatalog for SourceSchemas {
    fn version_for<'a>(
        &'a self,
        event_type: &'a str,
        base: u32,
        fingerprint: &'a str,
        schema_of: &'a (dyn Fn(u32) -> serde_json::Value + Send + Sync),
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<u32, walhook_pipeline::store::StoreError>>
                + Send
                + 'a,
        >,
    > {
        Box::pin(async move {
            Ok(self
                .platform
                .register_schema(&self.source, event_type, base, fingerprint, schema_of)
                .await?)
        })
    }
}
