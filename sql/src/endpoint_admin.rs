//! The control plane's reads and deletes of endpoints, always scoped to a
//! tenant: a query for another tenant's endpoint finds nothing, so the API
//! answers 404 and says nothing about it. Changes go through
//! [`Platform::update_endpoint`] and [`Platform::rotate_secret`] (in
//! `endpoints`), after an ownership check here.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::retry::RetryOverride;

use crate::endpoints::record_version;
use crate::{Platform, StoreError};

/// An endpoint as the API shows it.
#[derive(Debug, Clone)]
pub struct EndpointRecord {
    /// Its id.
    pub id: EndpointId,
    /// Where deliveries go.
    pub url: String,
    /// A description for people.
    pub description: String,
    /// Subscribed types; empty means every type.
    pub event_types: Vec<String>,
    /// Whether it gets new deliveries.
    pub enabled: bool,
    /// Why it was disabled, when it is.
    pub disabled_reason: Option<String>,
    /// Requests per second, if limited.
    pub rate_limit_per_sec: Option<i32>,
    /// Concurrent requests, if limited.
    pub max_in_flight: Option<i32>,
    /// The current config version.
    pub config_version: i32,
    /// The current secret's version.
    pub secret_version: i32,
    /// When it was created.
    pub created_at: SystemTime,
    /// When it last changed.
    pub updated_at: SystemTime,
    /// Its retry schedule's changes, when it has any.
    pub retry: Option<RetryOverride>,
    /// How its deliveries are ordered (`none`, `per_object`).
    pub ordering: String,
    /// Its ownership check.
    pub verification: VerificationRecord,
}

/// An endpoint's ownership check as stored.
#[derive(Debug, Clone)]
pub struct VerificationRecord {
    /// Whether it waits for one (nothing is sent until it passes).
    pub pending: bool,
    /// When the current check was asked for.
    pub requested_at: Option<SystemTime>,
    /// When it passed.
    pub verified_at: Option<SystemTime>,
    /// Why the latest try of the current check failed.
    pub last_error: Option<String>,
    /// When that try was made.
    pub last_checked_at: Option<SystemTime>,
}

/// One config version of an endpoint.
#[derive(Debug, Clone)]
pub struct EndpointVersionRecord {
    /// The version.
    pub version: i32,
    /// The URL then.
    pub url: String,
    /// The description then.
    pub description: String,
    /// The subscriptions then.
    pub event_types: Vec<String>,
    /// Enabled then.
    pub enabled: bool,
    /// The rate limit then.
    pub rate_limit_per_sec: Option<i32>,
    /// The in-flight cap then.
    pub max_in_flight: Option<i32>,
    /// When the version was made.
    pub changed_at: SystemTime,
    /// Who made it.
    pub changed_by: String,
    /// The newest signing secret's version then (`None` for versions made
    /// before walhook kept it).
    pub secret_version: Option<i32>,
    /// The retry schedule's changes then.
    pub retry: Option<RetryOverride>,
    /// The ordering then (`none` for versions made before walhook had it).
    pub ordering: String,
}

const COLUMNS: &str = "e.id, e.url, e.description, e.event_types, e.enabled, e.disabled_reason, \
    e.rate_limit_per_sec, e.max_in_flight, e.config_version, \
    coalesce((SELECT max(s.version) FROM walhook.endpoint_secrets s WHERE s.endpoint_id = e.id), 0), \
    e.created_at, e.updated_at, e.retry_policy::text, \
    e.verification_challenge IS NOT NULL, e.verification_requested_at, e.verified_at, \
    (SELECT f.error FROM walhook.endpoint_verification_failures f \
      WHERE f.endpoint_id = e.id AND f.challenge = e.verification_challenge), \
    (SELECT f.checked_at FROM walhook.endpoint_verification_failures f \
      WHERE f.endpoint_id = e.id AND f.challenge = e.verification_challenge), \
    e.ordering";

/// A stored override (written by walhook, so it parses; one that does not is
/// shown as none here and quarantines the endpoint in dispatch).
fn parse_retry(text: Option<String>) -> Option<RetryOverride> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

fn record(r: &tokio_postgres::Row) -> EndpointRecord {
    EndpointRecord {
        id: EndpointId(*r.get::<_, Uuid>(0).as_bytes()),
        url: r.get(1),
        description: r.get(2),
        event_types: r.get(3),
        enabled: r.get(4),
        disabled_reason: r.get(5),
        rate_limit_per_sec: r.get(6),
        max_in_flight: r.get(7),
        config_version: r.get(8),
        secret_version: r.get(9),
        created_at: r.get(10),
        updated_at: r.get(11),
        retry: parse_retry(r.get(12)),
        verification: VerificationRecord {
            pending: r.get(13),
            requested_at: r.get(14),
            verified_at: r.get(15),
            last_error: r.get(16),
            last_checked_at: r.get(17),
        },
        ordering: r.get(18),
    }
}

/// Whether endpoint `id` is `tenant`'s and not deleted.
pub(crate) async fn is_tenants(
    client: &impl deadpool_postgres::GenericClient,
    tenant: &TenantId,
    id: Uuid,
) -> Result<bool, StoreError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM walhook.endpoints WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL",
            &[&id, &tenant.as_str()],
        )
        .await
        .map_err(StoreError::query("read an endpoint"))?
        .is_some())
}

fn uid(id: EndpointId) -> Uuid {
    Uuid::from_bytes(id.0)
}

impl Platform {
    /// Endpoint `id` of `tenant`, unless deleted.
    pub async fn endpoint_of_tenant(
        &self,
        tenant: &TenantId,
        id: EndpointId,
    ) -> Result<Option<EndpointRecord>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {COLUMNS} FROM walhook.endpoints e \
                     WHERE e.id = $1 AND e.tenant_id = $2 AND e.deleted_at IS NULL"
                ),
                &[&uid(id), &tenant.as_str()],
            )
            .await
            .map_err(StoreError::query("read an endpoint"))?;
        Ok(row.as_ref().map(record))
    }

    /// The endpoints of `tenant` in creation order, after the keyset
    /// position `after` (created_at, id), at most `limit`.
    pub async fn list_endpoints(
        &self,
        tenant: &TenantId,
        after: Option<(SystemTime, Uuid)>,
        limit: i64,
    ) -> Result<Vec<EndpointRecord>, StoreError> {
        let client = self.client().await?;
        let (at, id) = after.unzip();
        let rows = client
            .query(
                &format!(
                    "SELECT {COLUMNS} FROM walhook.endpoints e \
                     WHERE e.tenant_id = $1 AND e.deleted_at IS NULL \
                       AND ($2::timestamptz IS NULL OR (e.created_at, e.id) > ($2, $3::uuid)) \
                     ORDER BY e.created_at, e.id LIMIT $4"
                ),
                &[&tenant.as_str(), &at, &id, &limit],
            )
            .await
            .map_err(StoreError::query("list endpoints"))?;
        Ok(rows.iter().map(record).collect())
    }

    /// Every config version of endpoint `id` of `tenant`, oldest first;
    /// `None` when the endpoint is not the tenant's or is deleted.
    pub async fn endpoint_versions(
        &self,
        tenant: &TenantId,
        id: EndpointId,
    ) -> Result<Option<Vec<EndpointVersionRecord>>, StoreError> {
        if self.endpoint_of_tenant(tenant, id).await?.is_none() {
            return Ok(None);
        }
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT version, url, description, event_types, enabled, rate_limit_per_sec, \
                        max_in_flight, changed_at, changed_by, secret_version, retry_policy::text, \
                        coalesce(ordering, 'none') \
                 FROM walhook.endpoint_versions WHERE endpoint_id = $1 ORDER BY version",
                &[&uid(id)],
            )
            .await
            .map_err(StoreError::query("list endpoint versions"))?;
        Ok(Some(
            rows.iter()
                .map(|r| EndpointVersionRecord {
                    version: r.get(0),
                    url: r.get(1),
                    description: r.get(2),
                    event_types: r.get(3),
                    enabled: r.get(4),
                    rate_limit_per_sec: r.get(5),
                    max_in_flight: r.get(6),
                    changed_at: r.get(7),
                    changed_by: r.get(8),
                    secret_version: r.get(9),
                    retry: parse_retry(r.get(10)),
                    ordering: r.get(11),
                })
                .collect(),
        ))
    }

    /// Soft-deletes endpoint `id` of `tenant`: no new deliveries (fan-out and
    /// dispatch stop seeing it; dispatch cancels what is pending), history
    /// kept. Records a last config version (disabled) and an audit record.
    /// `false` when there is no such endpoint.
    pub async fn delete_endpoint(
        &self,
        tenant: &TenantId,
        id: EndpointId,
        actor: &str,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let row = tx
            .query_opt(
                "UPDATE walhook.endpoints SET deleted_at = now(), enabled = false, \
                   disabled_reason = 'deleted by ' || $3, config_version = config_version + 1, updated_at = now() \
                 WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL RETURNING config_version",
                &[&uid(id), &tenant.as_str(), &actor],
            )
            .await
            .map_err(StoreError::query("delete an endpoint"))?;
        let Some(row) = row else {
            return Ok(false);
        };
        let version: i32 = row.get(0);
        record_version(&tx, uid(id), actor).await?;
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.deleted', $3, jsonb_build_object('config_version', $4::int4))",
            &[&tenant.as_str(), &actor, &id.to_string(), &version],
        )
        .await
        .map_err(StoreError::query("audit an endpoint deletion"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit an endpoint deletion"))?;
        Ok(true)
    }
}
