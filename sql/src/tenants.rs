//! Tenants and their API keys, as the control plane manages them.
//!
//! Keys are random and shown once; only their SHA-256 is stored (a key has
//! 256 bits of entropy, so a slow password hash would add nothing but
//! latency). Every issue and revocation is an audit record.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::ids::TenantId;
use walhook_pipeline::retry::RetryOverride;

use crate::endpoints::retry_json;
use crate::{Platform, StoreError};

/// A tenant as stored.
#[derive(Debug, Clone)]
pub struct TenantRecord {
    /// Its id (the value of the capture rules' tenant column).
    pub id: TenantId,
    /// A name for people.
    pub name: String,
    /// Its share of dispatch capacity.
    pub weight: i32,
    /// Its own in-flight budget per dispatcher node, if set.
    pub max_in_flight: Option<i32>,
    /// When it was registered.
    pub created_at: SystemTime,
    /// When it was disabled, if it is.
    pub disabled_at: Option<SystemTime>,
    /// Its retry schedule's changes, when it has any.
    pub retry: Option<RetryOverride>,
}

/// A change to a tenant; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct TenantChange {
    /// New weight.
    pub weight: Option<i32>,
    /// New in-flight budget (`Some(None)` removes it).
    pub max_in_flight: Option<Option<i32>>,
    /// New retry schedule changes (`Some(None)` removes them).
    pub retry: Option<Option<RetryOverride>>,
}

impl TenantChange {
    fn changed_fields(&self) -> Vec<&'static str> {
        [
            ("weight", self.weight.is_some()),
            ("max_in_flight", self.max_in_flight.is_some()),
            ("retry", self.retry.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect()
    }
}

/// An API key as stored (never the key itself).
#[derive(Debug, Clone)]
pub struct ApiKeyRecord {
    /// Its id.
    pub id: Uuid,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// A name for people.
    pub name: String,
    /// The first characters of the key.
    pub prefix: String,
    /// When it was issued.
    pub created_at: SystemTime,
    /// Who issued it.
    pub created_by: String,
    /// When it was revoked, if it was.
    pub revoked_at: Option<SystemTime>,
}

fn tenant_row(r: &tokio_postgres::Row) -> Option<TenantRecord> {
    Some(TenantRecord {
        id: TenantId::new(r.get::<_, String>(0)).ok()?,
        name: r.get(1),
        weight: r.get(2),
        created_at: r.get(3),
        disabled_at: r.get(4),
        max_in_flight: r.get(5),
        retry: r
            .get::<_, Option<String>>(6)
            .and_then(|t| serde_json::from_str(&t).ok()),
    })
}

fn key_row(r: &tokio_postgres::Row) -> Option<ApiKeyRecord> {
    Some(ApiKeyRecord {
        id: r.get(0),
        tenant_id: TenantId::new(r.get::<_, String>(1)).ok()?,
        name: r.get(2),
        prefix: r.get(3),
        created_at: r.get(4),
        created_by: r.get(5),
        revoked_at: r.get(6),
    })
}

const TENANT_COLUMNS: &str =
    "id, name, weight, created_at, disabled_at, max_in_flight, retry_policy::text";
const KEY_COLUMNS: &str = "id, tenant_id, name, prefix, created_at, created_by, revoked_at";

impl Platform {
    /// Registers a tenant; `None` when the id is taken.
    pub async fn insert_tenant(
        &self,
        id: &TenantId,
        name: &str,
        weight: i32,
        max_in_flight: Option<i32>,
        retry: &RetryOverride,
        actor: &str,
    ) -> Result<Option<TenantRecord>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let row = tx
            .query_opt(
                &format!(
                    "INSERT INTO walhook.tenants (id, name, weight, max_in_flight, retry_policy) \
                     VALUES ($1, $2, $3, $4, $5::text::jsonb) \
                     ON CONFLICT (id) DO NOTHING RETURNING {TENANT_COLUMNS}"
                ),
                &[
                    &id.as_str(),
                    &name,
                    &weight,
                    &max_in_flight,
                    &retry_json(Some(retry)),
                ],
            )
            .await
            .map_err(StoreError::query("create a tenant"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'tenant.created', $1, jsonb_build_object('name', $3::text, 'weight', $4::int4, \
                     'max_in_flight', $5::int4, 'retry', $6::text::jsonb))",
            &[&id.as_str(), &actor, &name, &weight, &max_in_flight, &retry_json(Some(retry))],
        )
        .await
        .map_err(StoreError::query("audit a tenant creation"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a tenant creation"))?;
        Ok(tenant_row(&row))
    }

    /// Applies `change` to tenant `id`, with an audit record; `None` when
    /// there is no such tenant.
    pub async fn update_tenant(
        &self,
        id: &TenantId,
        change: &TenantChange,
        actor: &str,
    ) -> Result<Option<TenantRecord>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let row = tx
            .query_opt(
                &format!(
                    "UPDATE walhook.tenants SET weight = coalesce($2, weight), \
                       max_in_flight = CASE WHEN $3 THEN $4 ELSE max_in_flight END, \
                       retry_policy = CASE WHEN $5 THEN $6::text::jsonb ELSE retry_policy END \
                     WHERE id = $1 RETURNING {TENANT_COLUMNS}"
                ),
                &[
                    &id.as_str(),
                    &change.weight,
                    &change.max_in_flight.is_some(),
                    &change.max_in_flight.flatten(),
                    &change.retry.is_some(),
                    &retry_json(change.retry.flatten().as_ref()),
                ],
            )
            .await
            .map_err(StoreError::query("update a tenant"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'tenant.updated', $1, jsonb_build_object('changed', $3::text[]))",
            &[&id.as_str(), &actor, &change.changed_fields()],
        )
        .await
        .map_err(StoreError::query("audit a tenant change"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a tenant change"))?;
        Ok(tenant_row(&row))
    }

    /// A tenant by id.
    pub async fn tenant(&self, id: &TenantId) -> Result<Option<TenantRecord>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT {TENANT_COLUMNS} FROM walhook.tenants WHERE id = $1"),
                &[&id.as_str()],
            )
            .await
            .map_err(StoreError::query("read a tenant"))?;
        Ok(row.as_ref().and_then(tenant_row))
    }

    /// Tenants in id order, after `after`, at most `limit`.
    pub async fn list_tenants(
        &self,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<TenantRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {TENANT_COLUMNS} FROM walhook.tenants \
                     WHERE ($1::text IS NULL OR id > $1) ORDER BY id LIMIT $2"
                ),
                &[&after, &limit],
            )
            .await
            .map_err(StoreError::query("list tenants"))?;
        Ok(rows.iter().filter_map(tenant_row).collect())
    }

    /// Stores a new key's hash for `tenant`; `None` when the tenant does not
    /// exist.
    pub async fn insert_api_key(
        &self,
        tenant: &TenantId,
        name: &str,
        prefix: &str,
        key_sha256: &[u8; 32],
        actor: &str,
    ) -> Result<Option<ApiKeyRecord>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let id = Uuid::new_v4();
        let row = tx
            .query_opt(
                &format!(
                    "INSERT INTO walhook.api_keys (id, tenant_id, name, prefix, key_sha256, created_by) \
                     SELECT $1, id, $3, $4, $5, $6 FROM walhook.tenants WHERE id = $2 \
                     RETURNING {KEY_COLUMNS}"
                ),
                &[&id, &tenant.as_str(), &name, &prefix, &key_sha256.as_slice(), &actor],
            )
            .await
            .map_err(StoreError::query("store an API key"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'api_key.created', $3, jsonb_build_object('name', $4::text, 'prefix', $5::text))",
            &[&tenant.as_str(), &actor, &id.to_string(), &name, &prefix],
        )
        .await
        .map_err(StoreError::query("audit an API key"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit an API key"))?;
        Ok(key_row(&row))
    }

    /// The keys of `tenant`, oldest first (revoked ones included).
    pub async fn api_keys(&self, tenant: &TenantId) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {KEY_COLUMNS} FROM walhook.api_keys WHERE tenant_id = $1 ORDER BY created_at, id"
                ),
                &[&tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("list API keys"))?;
        Ok(rows.iter().filter_map(key_row).collect())
    }

    /// Revokes key `id` of `tenant`; `false` when there is no such key.
    /// Revoking a revoked key changes nothing and answers `true`.
    pub async fn revoke_api_key(
        &self,
        tenant: &TenantId,
        id: Uuid,
        actor: &str,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let row = tx
            .query_opt(
                "UPDATE walhook.api_keys SET revoked_at = coalesce(revoked_at, now()), \
                   revoked_by = coalesce(revoked_by, $3) \
                 WHERE id = $1 AND tenant_id = $2 RETURNING revoked_at = now()",
                &[&id, &tenant.as_str(), &actor],
            )
            .await
            .map_err(StoreError::query("revoke an API key"))?;
        let Some(row) = row else {
            return Ok(false);
        };
        // `now()` is the transaction's start: equal only when set just now.
        if row.get::<_, bool>(0) {
            tx.execute(
                "INSERT INTO walhook.audit_log (tenant_id, actor, action, target) \
                 VALUES ($1, $2, 'api_key.revoked', $3)",
                &[&tenant.as_str(), &actor, &id.to_string()],
            )
            .await
            .map_err(StoreError::query("audit an API key revocation"))?;
        }
        crate::commit!(tx, client).map_err(StoreError::query("commit an API key revocation"))?;
        Ok(true)
    }

    /// The shown prefixes of every key not revoked.
    pub async fn live_key_prefixes(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT prefix FROM walhook.api_keys WHERE revoked_at IS NULL",
                &[],
            )
            .await
            .map_err(StoreError::query("read the API keys' prefixes"))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The tenant and key id of a live key with this hash (not revoked, its
    /// tenant not disabled).
    pub async fn tenant_for_key(
        &self,
        key_sha256: &[u8; 32],
    ) -> Result<Option<(TenantId, Uuid)>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT k.tenant_id, k.id FROM walhook.api_keys k JOIN walhook.tenants t ON t.id = k.tenant_id \
                 WHERE k.key_sha256 = $1 AND k.revoked_at IS NULL AND t.disabled_at IS NULL",
                &[&key_sha256.as_slice()],
            )
            .await
            .map_err(StoreError::query("look up an API key"))?;
        Ok(row.and_then(|r| Some((TenantId::new(r.get::<_, String>(0)).ok()?, r.get(1)))))
    }
}
