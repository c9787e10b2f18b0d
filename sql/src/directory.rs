//! The endpoint directory dispatch reads: every live endpoint with its
//! active secrets (opened with the platform's keyring), and the epoch that
//! says when to read it again.

use uuid::Uuid;
use walhook_pipeline::endpoint::{EndpointConfig, EndpointSource};
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};

use crate::{Platform, StoreError};

impl EndpointSource for Platform {
    /// The epoch bumped by every endpoint, secret or tenant change, mixed
    /// with the latest secret expiry already passed: a rotation overlap
    /// ending changes no row, yet the expired secret must stop signing, so
    /// the directory has to reload then too. Only equality is meaningful.
    async fn config_epoch(&self) -> Result<i64, walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT c.epoch, coalesce((SELECT (extract(epoch FROM max(s.expires_at)) * 1000000)::int8 \
                 FROM walhook.endpoint_secrets s WHERE s.expires_at <= now()), 0) \
                 FROM walhook.config_epoch c",
                &[],
            )
            .await
            .map_err(StoreError::query("read the config epoch"))?;
        let (epoch, expired_micros): (i64, i64) = (row.get(0), row.get(1));
        Ok(epoch
            .wrapping_mul(1_000_000_007)
            .wrapping_add(expired_micros))
    }

    async fn load_endpoints(
        &self,
    ) -> Result<Vec<EndpointConfig>, walhook_pipeline::store::StoreError> {
        let keyring = self.keyring()?;
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT e.id, e.tenant_id, e.url, e.event_types, e.enabled, e.config_version, \
                        e.rate_limit_per_sec, e.max_in_flight, \
                        s.versions, s.key_ids, s.secrets, e.created_at \
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
        let mut out = Vec::with_capacity(rows.len());
        let mut plain = 0usize;
        for r in rows {
            let id: Uuid = r.get(0);
            let id = EndpointId(*id.as_bytes());
            let tenant: String = r.get(1);
            let types: Vec<String> = r.get(3);
            let rate: Option<i32> = r.get(6);
            let cap: Option<i32> = r.get(7);
            let versions: Vec<i32> = r.get(8);
            let key_ids: Vec<String> = r.get(9);
            let sealed: Vec<Vec<u8>> = r.get(10);
            let Ok(tenant_id) = TenantId::new(tenant) else {
                continue;
            };
            // One row that does not open fails the load: the previous
            // directory stays in use and the error says which key to add.
            let mut secrets = Vec::with_capacity(sealed.len());
            for ((version, key_id), bytes) in versions.iter().zip(&key_ids).zip(&sealed) {
                plain += usize::from(key_id == crate::secrets::PLAIN_KEY_ID);
                secrets.push(
                    keyring
                        .open(id, *version, key_id, bytes)
                        .map_err(StoreError::from)?,
                );
            }
            out.push(EndpointConfig {
                id,
                tenant_id,
                url: r.get(2),
                event_types: types
                    .iter()
                    .filter_map(|t| EventType::new(t).ok())
                    .collect(),
                enabled: r.get(4),
                config_version: r.get(5),
                rate_limit_per_sec: rate.map(|n| n.max(1) as u32),
                max_in_flight: cap.map(|n| n.max(1) as u32),
                secrets,
                created_at: walhook_pipeline::time::Timestamp::from_system_time(r.get(11)),
            });
        }
        if plain > 0 {
            tracing::warn!(
                secrets = plain,
                "endpoint secrets stored in plaintext (written before encryption); run `walhook secrets rotate` to seal them"
            );
        }
        Ok(out)
    }
}
