//! Secret rotation: a new signing secret for an endpoint, while the
//! previous ones keep signing for an overlap so that receivers switch
//! without a failed verification.

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
    ) -> Result<(SigningSecret, i32), StoreError> {
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
                "SELECT tenant_id FROM walhook.endpoints WHERE id = $1 AND deleted_at IS NULL FOR UPDATE",
                &[&uid],
            )
            .await
            .map_err(StoreError::query("lock an endpoint"))?
            .ok_or_else(|| StoreError::Schema(format!("endpoint {id} does not exist")))?;
        let tenant: String = row.get(0);
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
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             VALUES ($1, $2, 'endpoint.secret_rotated', $3, jsonb_build_object('secret_version', $4::int4, 'overlap_ms', $5::float8))",
            &[&tenant, &actor, &id.to_string(), &version, &overlap_ms],
        )
        .await
        .map_err(StoreError::query("audit a secret rotation"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("commit a secret rotation"))?;
        Ok((secret, version))
    }
}
