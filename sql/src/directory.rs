//! The endpoint directory dispatch reads: every live endpoint with its
//! active secrets (opened with the platform's keyring), and the epoch that
//! says when to read it again.

use uuid::Uuid;
use walhook_pipeline::endpoint::{DeliveryOrder, EndpointConfig, EndpointSource};
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::retry::RetryOverride;
use walhook_pipeline::signing::VersionedSecret;

use crate::{Platform, StoreError};

/// One row of `endpoint_versions` as loaded: version, event types,
/// enabled, changed at.
type RawVersion = (i32, Vec<String>, bool, std::time::SystemTime);

impl EndpointSource for Platform {
    /// The epoch bumped by every endpoint, secret or tenant change, mixed
    /// with the latest secret expiry already passed: a rotation overlap
    /// ending changes no row, yet the expired secret must stop signing, so
    /// the directory has to reload then too. Only equality is meaningful.
    async fn config_epoch(&self) -> Result<i64, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        // Asked before every fan-out batch: prepared once per connection.
        let stmt = client
            .prepare_cached(
                "SELECT c.epoch, coalesce((SELECT (extract(epoch FROM max(s.expires_at)) * 1000000)::int8 \
                 FROM walhook.endpoint_secrets s WHERE s.expires_at <= now()), 0) \
                 FROM walhook.config_epoch c",
            )
            .await
            .map_err(StoreError::query("prepare the config epoch query"))?;
        let row = client
            .query_one(&stmt, &[])
            .await
            .map_err(StoreError::query("read the config epoch"))?;
        let (epoch, expired_micros): (i64, i64) = (row.get(0), row.get(1));
        Ok(epoch
            .wrapping_mul(1_000_000_007)
            .wrapping_add(expired_micros))
    }

    async fn load_endpoints(
        &self,
    ) -> Result<walhook_pipeline::endpoint::Loaded, walhook_pipeline::store::StoreError> {
        let keyring = self.keyring()?;
        // A reload is when a secret whose overlap ended stops signing here:
        // the retirement is audited then (once across nodes). Failing to
        // audit it does not keep the directory from loading.
        match self.retire_expired_secrets().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                secrets = n,
                "retired signing secrets whose rotation overlap ended"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "could not record retired signing secrets; the next reload tries again")
            }
        }
        let client = self.client().await?;
        let tenants = client
            .query(
                "SELECT id, disabled_at IS NULL, weight, max_in_flight FROM walhook.tenants",
                &[],
            )
            .await
            .map_err(StoreError::query("load tenants"))?;
        let rows = client
            .query(
                "SELECT e.id, e.tenant_id, e.url, e.event_types, e.enabled, e.config_version, \
                        e.rate_limit_per_sec, e.max_in_flight, \
                        s.versions, s.key_ids, s.secrets, e.created_at, \
                        e.retry_policy::text, t.retry_policy::text, \
                        e.verification_challenge, e.verification_requested_at, e.ordering \
                 FROM walhook.endpoints e JOIN walhook.tenants t ON t.id = e.tenant_id \
                 CROSS JOIN LATERAL ( \
                     SELECT coalesce(array_agg(version ORDER BY version DESC), '{}') AS versions, \
                            coalesce(array_agg(key_id ORDER BY version DESC), '{}') AS key_ids, \
                            coalesce(array_agg(secret ORDER BY version DESC), '{}') AS secrets \
                     FROM walhook.endpoint_secrets \
                     WHERE endpoint_id = e.id AND (expires_at IS NULL OR expires_at > now())) s \
                 WHERE e.deleted_at IS NULL AND t.disabled_at IS NULL",
                &[],
            )
            .await
            .map_err(StoreError::query("load endpoints"))?;
        // Every subscription version in force within the horizon (and the
        // current one): fan-out decides each event by the version in force
        // when it was committed.
        let versions = client
            .query(
                "SELECT v.endpoint_id, v.version, v.event_types, v.enabled, v.changed_at \
                 FROM (SELECT endpoint_id, version, event_types, enabled, changed_at, \
                              lead(changed_at) OVER (PARTITION BY endpoint_id ORDER BY version) AS next_at \
                       FROM walhook.endpoint_versions) v \
                 JOIN walhook.endpoints e ON e.id = v.endpoint_id AND e.deleted_at IS NULL \
                 WHERE v.next_at IS NULL OR v.next_at > now() - $1 * interval '1 second' \
                 ORDER BY v.endpoint_id, v.version",
                &[&(walhook_pipeline::endpoint::VERSION_HORIZON.as_secs() as f64)],
            )
            .await
            .map_err(StoreError::query("load endpoint versions"))?;
        let mut history: std::collections::HashMap<Uuid, Vec<RawVersion>> =
            std::collections::HashMap::new();
        for v in versions {
            history
                .entry(v.get(0))
                .or_default()
                .push((v.get(1), v.get(2), v.get(3), v.get(4)));
        }
        let mut loaded = walhook_pipeline::endpoint::Loaded::default();
        for t in tenants {
            match TenantId::new(t.get::<_, String>(0)) {
                Ok(id) => {
                    let weight: i32 = t.get(2);
                    if weight != 1 {
                        loaded.weights.insert(id.clone(), weight.max(1) as u32);
                    }
                    if let Some(budget) = t.get::<_, Option<i32>>(3) {
                        loaded.budgets.insert(id.clone(), budget.max(1) as u32);
                    }
                    loaded.tenants.push((id, t.get(1)));
                }
                Err(e) => {
                    tracing::error!(error = %e, "a tenant row has an invalid id; its endpoints cannot be loaded")
                }
            }
        }
        for r in rows {
            let uid: Uuid = r.get(0);
            let id = EndpointId(*uid.as_bytes());
            let Ok(tenant_id) = TenantId::new(r.get::<_, String>(1)) else {
                tracing::error!(endpoint_id = %id, "an endpoint row has an invalid tenant id; it cannot be loaded");
                continue;
            };
            let rate: Option<i32> = r.get(6);
            let cap: Option<i32> = r.get(7);
            let mut problems: Vec<String> = Vec::new();
            let mut event_types = Vec::new();
            for t in r.get::<_, Vec<String>>(3) {
                match EventType::new(&t) {
                    Ok(t) => event_types.push(t),
                    // Dropping it would widen or narrow the subscription
                    // silently (an empty list means every type).
                    Err(e) => problems.push(format!("subscribed event type: {e}")),
                }
            }
            // A secret that does not open (or is stored in plaintext)
            // quarantines its endpoint only: every other endpoint keeps
            // loading and receiving changes.
            let versions: Vec<i32> = r.get(8);
            let key_ids: Vec<String> = r.get(9);
            let sealed: Vec<Vec<u8>> = r.get(10);
            let mut secrets = Vec::with_capacity(sealed.len());
            for ((version, key_id), bytes) in versions.iter().zip(&key_ids).zip(&sealed) {
                match keyring.open(id, *version, key_id, bytes) {
                    Ok(secret) => secrets.push(VersionedSecret {
                        version: *version,
                        secret,
                    }),
                    Err(e) => {
                        if let crate::secrets::SecretsError::UnknownKey { key_id, .. } = &e
                            && !loaded.missing_keys.contains(key_id)
                        {
                            loaded.missing_keys.push(key_id.clone());
                        }
                        problems.push(e.to_string());
                    }
                }
            }
            let mut versions = Vec::new();
            for (version, types, enabled, changed_at) in history.remove(&uid).unwrap_or_default() {
                let mut event_types = Vec::with_capacity(types.len());
                for t in &types {
                    match EventType::new(t) {
                        Ok(t) => event_types.push(t),
                        Err(e) => {
                            problems.push(format!("config version {version}'s event type: {e}"))
                        }
                    }
                }
                versions.push(walhook_pipeline::endpoint::SubscriptionVersion {
                    version,
                    valid_from: walhook_pipeline::time::Timestamp::from_system_time(changed_at),
                    enabled,
                    event_types,
                });
            }
            // The endpoint's fields over its tenant's.
            let mut retry = RetryOverride::default();
            for (whose, text) in [
                ("endpoint", r.get::<_, Option<String>>(12)),
                ("tenant", r.get(13)),
            ] {
                match text.as_deref().map(serde_json::from_str::<RetryOverride>) {
                    None => {}
                    Some(Ok(o)) => retry = retry.or(o),
                    Some(Err(e)) => {
                        problems.push(format!("the {whose}'s retry_policy does not parse: {e}"))
                    }
                }
            }
            let ordering_text: String = r.get(16);
            let ordering = DeliveryOrder::parse(&ordering_text).unwrap_or_else(|| {
                problems.push(format!(
                    "its ordering {ordering_text:?} is not one walhook knows"
                ));
                DeliveryOrder::default()
            });
            let quarantine = (!problems.is_empty()).then(|| {
                secrets.clear();
                problems.join("; ")
            });
            loaded.endpoints.push(EndpointConfig {
                id,
                tenant_id,
                url: r.get(2),
                event_types,
                enabled: r.get(4),
                config_version: r.get(5),
                rate_limit_per_sec: rate.map(|n| n.max(1) as u32),
                max_in_flight: cap.map(|n| n.max(1) as u32),
                secrets: secrets.into(),
                retry,
                verification: r.get::<_, Option<String>>(14).map(|challenge| {
                    walhook_pipeline::endpoint::PendingVerification {
                        challenge,
                        requested_at: r
                            .get::<_, Option<std::time::SystemTime>>(15)
                            .map_or(walhook_pipeline::time::Timestamp(0), |t| {
                                walhook_pipeline::time::Timestamp::from_system_time(t)
                            }),
                    }
                }),
                ordering,
                created_at: walhook_pipeline::time::Timestamp::from_system_time(r.get(11)),
                quarantine,
                history: versions,
            });
        }
        Ok(loaded)
    }

    async fn quarantine_sync(
        &self,
        quarantined: &[std::sync::Arc<EndpointConfig>],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        use walhook_pipeline::incident::{IncidentKind, Stage, StageIncident};
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let ids: Vec<String> = quarantined.iter().map(|e| e.id.to_string()).collect();
        // Lifted: open quarantines of endpoints that load now (or are gone).
        let lifted = tx
            .query(
                "UPDATE walhook.incidents SET resolved_at = now() \
                 WHERE stage = 'directory' AND kind = 'endpoint_quarantined' \
                   AND resolved_at IS NULL AND subject <> ALL($1::text[]) RETURNING subject",
                &[&ids],
            )
            .await
            .map_err(StoreError::query("lift endpoint quarantines"))?;
        for row in lifted {
            let subject: String = row.get(0);
            let Ok(id) = subject.parse::<EndpointId>() else {
                continue;
            };
            tx.execute(
                "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
                 SELECT tenant_id, 'walhook', 'endpoint.quarantine_lifted', $2, '{}'::jsonb \
                 FROM walhook.endpoints WHERE id = $1",
                &[&Uuid::from_bytes(id.0), &subject],
            )
            .await
            .map_err(StoreError::query("audit a lifted quarantine"))?;
        }
        let incidents: Vec<StageIncident> = quarantined
            .iter()
            .map(|e| {
                StageIncident::new(
                    Stage::Directory,
                    IncidentKind::EndpointQuarantined,
                    &e.id.to_string(),
                    &format!(
                        "endpoint {} cannot be loaded, so its deliveries wait: {}",
                        e.id,
                        e.quarantine.as_deref().unwrap_or("unknown reason")
                    ),
                )
            })
            .collect();
        let new = self.upsert_incidents(&tx, &incidents).await?;
        for e in quarantined
            .iter()
            .filter(|e| new.contains(&e.id.to_string()))
        {
            tx.execute(
                "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
                 VALUES ($1, 'walhook', 'endpoint.quarantined', $2, jsonb_build_object('reason', $3::text))",
                &[
                    &e.tenant_id.as_str(),
                    &e.id.to_string(),
                    &walhook_pipeline::sanitize::clean_str(
                        e.quarantine.as_deref().unwrap_or(""),
                        walhook_pipeline::sanitize::Lines::Escape,
                        walhook_pipeline::incident::MAX_DETAIL_BYTES,
                    ),
                ],
            )
            .await
            .map_err(StoreError::query("audit an endpoint quarantine"))?;
        }
        crate::commit!(tx, client).map_err(StoreError::query("commit quarantine changes"))?;
        Ok(())
    }
}
