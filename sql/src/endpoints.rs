//! Tenants and endpoints: the changes the control plane (and the demo)
//! make; dispatch reads them through [`crate::directory`]. Every endpoint
//! change is a new config version, kept in `endpoint_versions`, and an
//! audit record.
//!
//! Signing secrets are sealed with the platform's keyring before they are
//! stored and opened when the directory is loaded (see [`crate::secrets`]);
//! the database only ever holds ciphertext.

use uuid::Uuid;
use walhook_pipeline::endpoint::DeliveryOrder;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::redact::url_without_secrets;
use walhook_pipeline::retry::RetryOverride;
use walhook_pipeline::signing::SigningSecret;

use crate::{Platform, StoreError};

/// A new endpoint's settings.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    /// Its tenant.
    pub tenant_id: TenantId,
    /// Where deliveries go.
    pub url: String,
    /// Subscribed types; empty means all.
    pub event_types: Vec<EventType>,
    /// A description for people.
    pub description: String,
    /// Requests per second, if limited.
    pub rate_limit_per_sec: Option<u32>,
    /// Concurrent requests, if limited.
    pub max_in_flight: Option<u32>,
    /// Starts enabled.
    pub enabled: bool,
    /// Changes to the retry schedule (empty: the tenant's, then `[retry]`).
    pub retry: RetryOverride,
    /// How its deliveries are ordered.
    pub ordering: DeliveryOrder,
    /// Whether it must pass an ownership check before anything is sent
    /// (the API's `[api] require_verification`).
    pub verify: bool,
}

/// What [`Platform::create_endpoint_within`] did.
#[derive(Debug)]
pub enum CreatedEndpoint {
    /// Created, with this first secret (to show once).
    Created(SigningSecret),
    /// An endpoint with this id exists already; it was left as it is.
    Exists,
    /// The tenant has this many endpoints, the most allowed; nothing was
    /// created.
    QuotaReached {
        /// The tenant's endpoints (not deleted).
        count: i64,
    },
}

/// A change to an endpoint; `None` leaves a field as it is.
#[derive(Debug, Clone, Default)]
pub struct EndpointChange {
    /// New URL.
    pub url: Option<String>,
    /// New subscriptions.
    pub event_types: Option<Vec<EventType>>,
    /// New description.
    pub description: Option<String>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// New rate limit (`Some(None)` removes it).
    pub rate_limit_per_sec: Option<Option<u32>>,
    /// New in-flight cap (`Some(None)` removes it).
    pub max_in_flight: Option<Option<u32>>,
    /// New retry schedule changes (`Some(None)` removes them).
    pub retry: Option<Option<RetryOverride>>,
    /// New ordering.
    pub ordering: Option<DeliveryOrder>,
    /// Whether the change needs a new ownership check (the URL's host
    /// changed while checks are required).
    pub reverify: bool,
}

impl EndpointChange {
    /// The names of the fields this change sets, for the audit log.
    pub fn changed_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let fields = [
            ("url", self.url.is_some()),
            ("event_types", self.event_types.is_some()),
            ("description", self.description.is_some()),
            ("enabled", self.enabled.is_some()),
            ("rate_limit_per_sec", self.rate_limit_per_sec.is_some()),
            ("max_in_flight", self.max_in_flight.is_some()),
            ("retry", self.retry.is_some()),
            ("ordering", self.ordering.is_some()),
        ];
        for (name, set) in fields {
            if set {
                out.push(name);
            }
        }
        out
    }
}

fn types_text(types: &[EventType]) -> Vec<String> {
    types.iter().map(|t| t.to_string()).collect()
}

/// An override as stored (`NULL` when it changes nothing).
pub(crate) fn retry_json(o: Option<&RetryOverride>) -> Option<String> {
    o.filter(|o| !o.is_empty())
        .map(|o| serde_json::to_string(o).expect("an override serialises"))
}

fn opt_i32(v: Option<u32>) -> Option<i32> {
    v.map(|n| i32::try_from(n).unwrap_or(i32::MAX))
}

impl Platform {
    /// Creates a tenant (or does nothing if it exists).
    pub async fn create_tenant(&self, id: &TenantId, name: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO walhook.tenants (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
                &[&id.as_str(), &name],
            )
            .await
            .map_err(StoreError::query("create a tenant"))?;
        Ok(())
    }

    /// Creates an endpoint with a fresh secret; returns its id and the
    /// secret (to show once).
    pub async fn create_endpoint(
        &self,
        ep: &NewEndpoint,
        actor: &str,
    ) -> Result<(EndpointId, SigningSecret), StoreError> {
        loop {
            let id = EndpointId::random();
            if let Some(secret) = self.create_endpoint_as(id, ep, actor).await? {
                return Ok((id, secret));
            }
        }
    }

    /// Creates endpoint `id` (its config version 1, its first secret and an
    /// audit record) in one transaction; `None` when an endpoint with this
    /// id exists already (it is left as it is).
    pub async fn create_endpoint_as(
        &self,
        id: EndpointId,
        ep: &NewEndpoint,
        actor: &str,
    ) -> Result<Option<SigningSecret>, StoreError> {
        Ok(
            match self.create_endpoint_within(id, ep, actor, None).await? {
                CreatedEndpoint::Created(secret) => Some(secret),
                CreatedEndpoint::Exists | CreatedEndpoint::QuotaReached { .. } => None,
            },
        )
    }

    /// [`Platform::create_endpoint_as`], refusing when the tenant has
    /// `max_per_tenant` endpoints (deleted ones do not count) already. The
    /// count and the insert run under a per-tenant lock, so concurrent
    /// creations cannot pass the limit together.
    pub async fn create_endpoint_within(
        &self,
        id: EndpointId,
        ep: &NewEndpoint,
        actor: &str,
        max_per_tenant: Option<u32>,
    ) -> Result<CreatedEndpoint, StoreError> {
        let secret = SigningSecret::generate();
        let sealed = self.keyring()?.seal(id, 1, &secret);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        if let Some(max) = max_per_tenant {
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('walhook.endpoints:' || $1, 0))",
                &[&ep.tenant_id.as_str()],
            )
            .await
            .map_err(StoreError::query("lock a tenant's endpoints"))?;
            // A statement of its own: its snapshot starts after the lock is
            // held, so it counts what a creation before us committed.
            let row = tx
                .query_one(
                    "SELECT (SELECT count(*) FROM walhook.endpoints WHERE tenant_id = $1 AND deleted_at IS NULL), \
                            EXISTS (SELECT 1 FROM walhook.endpoints WHERE id = $2)",
                    &[&ep.tenant_id.as_str(), &uid],
                )
                .await
                .map_err(StoreError::query("count a tenant's endpoints"))?;
            let (count, exists): (i64, bool) = (row.get(0), row.get(1));
            if exists {
                return Ok(CreatedEndpoint::Exists);
            }
            if count >= i64::from(max) {
                return Ok(CreatedEndpoint::QuotaReached { count });
            }
        }
        let inserted = tx.execute(
            "INSERT INTO walhook.endpoints (id, tenant_id, url, description, event_types, enabled, \
             rate_limit_per_sec, max_in_flight, retry_policy, verification_challenge, verification_requested_at, ordering) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::text::jsonb, $10, CASE WHEN $10::text IS NULL THEN NULL ELSE now() END, $11) \
             ON CONFLICT (id) DO NOTHING",
            &[
                &uid,
                &ep.tenant_id.as_str(),
                &ep.url,
                &ep.description,
                &types_text(&ep.event_types),
                &ep.enabled,
                &opt_i32(ep.rate_limit_per_sec),
                &opt_i32(ep.max_in_flight),
                &retry_json(Some(&ep.retry)),
                &ep.verify.then(crate::verification::new_challenge),
                &ep.ordering.as_str(),
            ],
        )
        .await
        .map_err(StoreError::query("create an endpoint"))?;
        if inserted == 0 {
            return Ok(CreatedEndpoint::Exists);
        }
        tx.execute(
            "INSERT INTO walhook.endpoint_secrets (endpoint_id, version, secret, key_id) VALUES ($1, 1, $2, $3)",
            &[&uid, &sealed.bytes, &sealed.key_id],
        )
        .await
        .map_err(StoreError::query("store an endpoint secret"))?;
        record_version(&tx, uid, actor).await?;
        // The operator reads audit records: the URL without the parts
        // where a receiver's credentials live (the tenant reads it whole
        // through its endpoint).
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.created', $3, jsonb_build_object('url', $4::text, 'config_version', 1))",
            &[
                &ep.tenant_id.as_str(),
                &actor,
                &id.to_string(),
                &url_without_secrets(&ep.url),
            ],
        )
        .await
        .map_err(StoreError::query("audit an endpoint creation"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit an endpoint creation"))?;
        Ok(CreatedEndpoint::Created(secret))
    }

    /// Applies `change` as a new config version; returns the new version.
    pub async fn update_endpoint(
        &self,
        id: EndpointId,
        change: &EndpointChange,
        actor: &str,
    ) -> Result<i32, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        let types = change.event_types.as_deref().map(types_text);
        let row = tx
            .query_opt(
                "UPDATE walhook.endpoints SET \
                   url = coalesce($2, url), \
                   event_types = coalesce($3, event_types), \
                   description = coalesce($4, description), \
                   enabled = coalesce($5, enabled), \
                   rate_limit_per_sec = CASE WHEN $6 THEN $7 ELSE rate_limit_per_sec END, \
                   max_in_flight = CASE WHEN $8 THEN $9 ELSE max_in_flight END, \
                   disabled_reason = CASE WHEN $5 = false THEN 'disabled by ' || $10 WHEN $5 THEN NULL ELSE disabled_reason END, \
                   retry_policy = CASE WHEN $11 THEN $12::text::jsonb ELSE retry_policy END, \
                   verification_challenge = coalesce($13, verification_challenge), \
                   verification_requested_at = CASE WHEN $13::text IS NULL THEN verification_requested_at ELSE now() END, \
                   verified_at = CASE WHEN $13::text IS NULL THEN verified_at END, \
                   ordering = coalesce($14, ordering), \
                   config_version = config_version + 1, updated_at = now() \
                 WHERE id = $1 AND deleted_at IS NULL RETURNING config_version, tenant_id",
                &[
                    &uid,
                    &change.url,
                    &types,
                    &change.description,
                    &change.enabled,
                    &change.rate_limit_per_sec.is_some(),
                    &opt_i32(change.rate_limit_per_sec.flatten()),
                    &change.max_in_flight.is_some(),
                    &opt_i32(change.max_in_flight.flatten()),
                    &actor,
                    &change.retry.is_some(),
                    &retry_json(change.retry.flatten().as_ref()),
                    &change.reverify.then(crate::verification::new_challenge),
                    &change.ordering.map(DeliveryOrder::as_str),
                ],
            )
            .await
            .map_err(StoreError::query("update an endpoint"))?
            .ok_or_else(|| StoreError::Schema(format!("endpoint {id} does not exist")))?;
        let version: i32 = row.get(0);
        let tenant: String = row.get(1);
        record_version(&tx, uid, actor).await?;
        // Disabling and enabling are named actions: the audit log answers
        // "who turned this endpoint off" without reading details.
        let action = match change.enabled {
            Some(false) => "endpoint.disabled",
            Some(true) => "endpoint.enabled",
            None => "endpoint.updated",
        };
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, $5, $3, jsonb_build_object('config_version', $4::int4, 'changed', $6::text[]))",
            &[&tenant, &actor, &id.to_string(), &version, &action, &change.changed_fields()],
        )
        .await
        .map_err(StoreError::query("audit an endpoint change"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit an endpoint change"))?;
        Ok(version)
    }
}

/// Keeps the endpoint's configuration, as it now is, as a row of
/// `endpoint_versions` (every change is a new version; history is kept).
pub(crate) async fn record_version(
    tx: &deadpool_postgres::Transaction<'_>,
    endpoint: Uuid,
    actor: &str,
) -> Result<(), StoreError> {
    tx.execute(
        "INSERT INTO walhook.endpoint_versions (endpoint_id, version, url, description, event_types, \
         enabled, rate_limit_per_sec, max_in_flight, changed_by, secret_version, retry_policy, ordering) \
         SELECT id, config_version, url, description, event_types, enabled, rate_limit_per_sec, \
         max_in_flight, $2, (SELECT max(s.version) FROM walhook.endpoint_secrets s WHERE s.endpoint_id = e.id), \
         retry_policy, ordering \
         FROM walhook.endpoints e WHERE id = $1",
        &[&endpoint, &actor],
    )
    .await
    .map_err(StoreError::query("record an endpoint version"))?;
    Ok(())
}

/// The type of the operational event emitted when walhook disables an
/// endpoint.
pub const ENDPOINT_DISABLED: &str = "endpoint.disabled";

impl Platform {
    /// Disables `id` because of `reason` (a 410, or failing too long): a new
    /// config version, an audit record, and an `endpoint.disabled` event
    /// delivered to the tenant's other endpoints that subscribe to it.
    pub async fn disable_endpoint_for(
        &self,
        id: EndpointId,
        reason: &str,
        actor: &str,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        let Some(row) = tx
            .query_opt(
                "UPDATE walhook.endpoints SET enabled = false, disabled_reason = $2, \
                   config_version = config_version + 1, updated_at = now() \
                 WHERE id = $1 AND enabled AND deleted_at IS NULL RETURNING config_version, tenant_id, url",
                &[&uid, &reason],
            )
            .await
            .map_err(StoreError::query("disable an endpoint"))?
        else {
            // Already disabled or deleted: nothing to do.
            return Ok(());
        };
        let version: i32 = row.get(0);
        let tenant: String = row.get(1);
        let url: String = row.get(2);
        record_version(&tx, uid, actor).await?;
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.disabled', $3, jsonb_build_object('reason', $4::text, 'config_version', $5::int4))",
            &[&tenant, &actor, &id.to_string(), &reason, &version],
        )
        .await
        .map_err(StoreError::query("audit an endpoint disable"))?;

        // The operational event, for endpoints that subscribe to it.
        let Ok(tenant_id) = TenantId::new(tenant.clone()) else {
            crate::commit!(tx, client).map_err(StoreError::query("commit an endpoint disable"))?;
            return Ok(());
        };
        let event_type = EventType::new(ENDPOINT_DISABLED).expect("a valid type");
        let event_id = walhook_pipeline::ids::EventId::derive_operational(
            ENDPOINT_DISABLED,
            &id.0,
            version as u32,
        );
        let now = walhook_pipeline::time::Timestamp::now();
        let version_text = version.to_string();
        let id_text = id.to_string();
        let (payload, hash) = walhook_pipeline::event::Envelope {
            id: event_id,
            event_type: &event_type,
            tenant_id: &tenant_id,
            object_id: Some(&id_text),
            object_version_json: Some(&version_text),
            occurred_at: now,
            schema_version: 1,
            unavailable: &[],
        }
        .write(|w| {
            w.begin_object();
            w.key("endpoint_id");
            w.string(&id_text);
            w.key("reason");
            w.string(reason);
            // The event may go to another receiver than the endpoint's own
            // (an ops tool): no query string or user info.
            w.key("url");
            w.string(&url_without_secrets(&url));
            w.end_object();
        });
        self.ensure_partitions(&tx, "events", std::iter::once(now))
            .await?;
        self.ensure_partitions(&tx, "deliveries", std::iter::once(now))
            .await?;
        tx.execute(
            "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version, \
               occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256) \
             VALUES ($1, $2, $3, 1, $4, $5, $6, 'walhook', '0/0', 0, $7, $8) ON CONFLICT DO NOTHING",
            &[
                &Uuid::from_bytes(event_id.0),
                &tenant,
                &ENDPOINT_DISABLED,
                &id_text,
                &version_text,
                &now.to_system_time(),
                &payload.as_ref(),
                &hash.as_slice(),
            ],
        )
        .await
        .map_err(StoreError::query("store the endpoint.disabled event"))?;
        let subscribers = tx
            .query(
                "SELECT id, config_version FROM walhook.endpoints WHERE tenant_id = $1 AND enabled \
                 AND deleted_at IS NULL AND id <> $2 AND created_at <= $3 \
                 AND (event_types = '{}' OR $4 = ANY(event_types))",
                &[&tenant, &uid, &now.to_system_time(), &ENDPOINT_DISABLED],
            )
            .await
            .map_err(StoreError::query("find endpoint.disabled subscribers"))?;
        for s in subscribers {
            let ep = EndpointId(*s.get::<_, Uuid>(0).as_bytes());
            let delivery = walhook_pipeline::ids::DeliveryId::derive(event_id, ep);
            tx.execute(
                "WITH made AS (INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, \
                   event_occurred_at, endpoint_config_version, next_attempt_at, expires_at, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, now(), now() + interval '24 hours', $6) ON CONFLICT DO NOTHING \
                 RETURNING id, endpoint_id, created_at, next_attempt_at) \
                 INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at) \
                 SELECT * FROM made",
                &[
                    &Uuid::from_bytes(delivery.0),
                    &Uuid::from_bytes(event_id.0),
                    &Uuid::from_bytes(ep.0),
                    &tenant,
                    &ENDPOINT_DISABLED,
                    &now.to_system_time(),
                    &s.get::<_, i32>(1),
                ],
            )
            .await
            .map_err(StoreError::query("make an endpoint.disabled delivery"))?;
        }
        crate::commit!(tx, client).map_err(StoreError::query("commit an endpoint disable"))?;
        Ok(())
    }
}
