//! Secret rotation: a new signing secret for an endpoint, while the
//! previous ones keep signing for an overlap so that receivers switch
//! without a failed verification.
//!
//! A rotation is a new endpoint config version (naming the new secret's
//! version) and an `endpoint.secret_rotated` audit record. When an overlap
//! ends, the old secret is retired: the first node that reloads its
//! directory afterwards writes an `endpoint.secret_retired` audit record,
//! once.

use uuid::Uuid;
use walhook_pipeline::ids::EndpointId;
use walhook_pipeline::signing::SigningSecret;

use crate::{Platform, StoreError};

impl Platform {
    /// Makes a new signing secret for `id`; the previous ones keep signing
    /// for `overlap` (receivers switch without a failed verification).
    /// Returns the new secret (to show once) and its version.
    pub async fn rotate_secret(
        &self,
        id: EndpointId,
        overlap: std::time::Duration,
        actor: &str,
    ) -> Result<Rotated, StoreError> {
        let keyring = self.keyring()?;
        let secret = SigningSecret::generate();
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let uid = Uuid::from_bytes(id.0);
        let row = tx
            .query_opt(
                "UPDATE walhook.endpoints SET config_version = config_version + 1, updated_at = now() \
                 WHERE id = $1 AND deleted_at IS NULL RETURNING tenant_id, config_version",
                &[&uid],
            )
            .await
            .map_err(StoreError::query("lock an endpoint"))?
            .ok_or_else(|| StoreError::Schema(format!("endpoint {id} does not exist")))?;
        let tenant: String = row.get(0);
        let config_version: i32 = row.get(1);
        let overlap_ms = overlap.as_millis() as f64;
        tx.execute(
            "UPDATE walhook.endpoint_secrets SET expires_at = now() + $2 * interval '1 millisecond' \
             WHERE endpoint_id = $1 AND (expires_at IS NULL OR expires_at > now() + $2 * interval '1 millisecond')",
            &[&uid, &overlap_ms],
        )
        .await
        .map_err(StoreError::query("schedule the old secrets' expiry"))?;
        // The endpoint row is locked: the next version is ours. It is part of
        // what the seal authenticates, so it is chosen before sealing.
        let version: i32 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) + 1 FROM walhook.endpoint_secrets WHERE endpoint_id = $1",
                &[&uid],
            )
            .await
            .map_err(StoreError::query("number the new secret"))?
            .get(0);
        let sealed = keyring.seal(id, version, &secret);
        tx.execute(
            "INSERT INTO walhook.endpoint_secrets (endpoint_id, version, secret, key_id) VALUES ($1, $2, $3, $4)",
            &[&uid, &version, &sealed.bytes, &sealed.key_id],
        )
        .await
        .map_err(StoreError::query("store the new secret"))?;
        crate::endpoints::record_version(&tx, uid, actor).await?;
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.secret_rotated', $3, jsonb_build_object('secret_version', $4::int4, \
                     'overlap_ms', $5::float8, 'config_version', $6::int4))",
            &[&tenant, &actor, &id.to_string(), &version, &overlap_ms, &config_version],
        )
        .await
        .map_err(StoreError::query("audit a secret rotation"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a secret rotation"))?;
        Ok(Rotated {
            secret,
            version,
            config_version,
        })
    }

    /// Retires the secrets whose rotation overlap has ended: each gets an
    /// `endpoint.secret_retired` audit record, once, whichever node gets
    /// here first (the row lock orders them). Returns how many were retired.
    pub async fn retire_expired_secrets(&self) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let retired = tx
            .query(
                "UPDATE walhook.endpoint_secrets s SET retired_at = now() FROM walhook.endpoints e \
                 WHERE e.id = s.endpoint_id AND s.expires_at <= now() AND s.retired_at IS NULL \
                 RETURNING e.tenant_id, s.endpoint_id, s.version, s.expires_at",
                &[],
            )
            .await
            .map_err(StoreError::query("retire expired secrets"))?;
        if retired.is_empty() {
            return Ok(0);
        }
        let tenants: Vec<String> = retired.iter().map(|r| r.get(0)).collect();
        let targets: Vec<String> = retired
            .iter()
            .map(|r| EndpointId(*r.get::<_, Uuid>(1).as_bytes()).to_string())
            .collect();
        let versions: Vec<i32> = retired.iter().map(|r| r.get(2)).collect();
        let expired: Vec<std::time::SystemTime> = retired.iter().map(|r| r.get(3)).collect();
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             SELECT tenant, 'walhook', 'endpoint.secret_retired', target, \
                    jsonb_build_object('secret_version', version, 'expired_at', expired) \
             FROM unnest($1::text[], $2::text[], $3::int4[], $4::timestamptz[]) \
                  AS t(tenant, target, version, expired)",
            &[&tenants, &targets, &versions, &expired],
        )
        .await
        .map_err(StoreError::query("audit retired secrets"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit retired secrets"))?;
        Ok(retired.len() as u64)
    }
}

/// What a rotation made.
#[derive(Debug)]
pub struct Rotated {
    /// The new secret, to show once.
    pub secret: SigningSecret,
    /// Its version.
    pub version: i32,
    /// The endpoint config version the rotation made.
    pub config_version: i32,
}
