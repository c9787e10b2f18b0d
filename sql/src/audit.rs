//! The audit log and the event-type catalog, as the control plane reads
//! them. Audit records are written by the change they describe, in its
//! transaction (see `endpoints`, `tenants`, `deliveries`).

use std::time::SystemTime;

use walhook_pipeline::ids::TenantId;

use crate::{Platform, StoreError};

/// One audit record.
#[derive(Debug, Clone)]
pub struct AuditRecord {
    /// Its id (grows with time).
    pub id: i64,
    /// The tenant it concerns, if any.
    pub tenant_id: Option<String>,
    /// Who acted: `operator` or `api_key:<id>`.
    pub actor: String,
    /// What was done, e.g. `endpoint.updated`.
    pub action: String,
    /// On what: an endpoint, delivery, key or tenant id.
    pub target: Option<String>,
    /// Details (config version, overlap, counts).
    pub detail: serde_json::Value,
    /// When.
    pub at: SystemTime,
}

/// What to list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// One tenant's records (always set for tenants).
    pub tenant: Option<TenantId>,
    /// One action's.
    pub action: Option<String>,
    /// One target's.
    pub target: Option<String>,
    /// Records older than this id (newest first).
    pub before_id: Option<i64>,
    /// Rows at most.
    pub limit: i64,
}

/// An event type of the catalog.
#[derive(Debug, Clone)]
pub struct EventTypeRecord {
    /// Its name.
    pub name: String,
    /// The current schema version.
    pub schema_version: i32,
    /// The capture source that produces it (`walhook.api` for `webhook.test`).
    pub source: String,
    /// A description.
    pub description: String,
    /// When it was last seen in a capture config.
    pub updated_at: SystemTime,
}

impl Platform {
    /// Audit records matching `f`, newest first.
    pub async fn list_audit(&self, f: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.client().await?;
        let tenant = f.tenant.as_ref().map(TenantId::as_str);
        let rows = client
            .query(
                "SELECT id, tenant_id, actor, action, target, detail, at FROM walhook.audit_log \
                 WHERE ($1::text IS NULL OR tenant_id = $1) AND ($2::text IS NULL OR action = $2) \
                   AND ($3::text IS NULL OR target = $3) AND ($4::int8 IS NULL OR id < $4) \
                 ORDER BY id DESC LIMIT $5",
                &[&tenant, &f.action, &f.target, &f.before_id, &f.limit],
            )
            .await
            .map_err(StoreError::query("list audit records"))?;
        Ok(rows
            .iter()
            .map(|r| AuditRecord {
                id: r.get(0),
                tenant_id: r.get(1),
                actor: r.get(2),
                action: r.get(3),
                target: r.get(4),
                detail: r.get(5),
                at: r.get(6),
            })
            .collect())
    }

    /// The event-type catalog, by name.
    pub async fn event_types(&self) -> Result<Vec<EventTypeRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT name, schema_version, source, description, updated_at FROM walhook.event_types ORDER BY name",
                &[],
            )
            .await
            .map_err(StoreError::query("list event types"))?;
        Ok(rows
            .iter()
            .map(|r| EventTypeRecord {
                name: r.get(0),
                schema_version: r.get(1),
                source: r.get(2),
                description: r.get(3),
                updated_at: r.get(4),
            })
            .collect())
    }

    /// Those of `names` that are not in the catalog.
    pub async fn unknown_event_types(&self, names: &[String]) -> Result<Vec<String>, StoreError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT n FROM unnest($1::text[]) AS n \
                 WHERE NOT EXISTS (SELECT 1 FROM walhook.event_types t WHERE t.name = n)",
                &[&names],
            )
            .await
            .map_err(StoreError::query("check event types"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
