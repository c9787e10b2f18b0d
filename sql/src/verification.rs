//! Endpoint ownership checks as stored: the challenge an endpoint waits
//! for, its outcome, and the audit records of both.

use uuid::Uuid;
use walhook_pipeline::ids::{EndpointId, TenantId};

use crate::{Platform, StoreError};

/// A fresh challenge: 32 random bytes, hex.
pub fn new_challenge() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The longest failure detail kept.
const MAX_ERROR_LEN: usize = 512;

impl Platform {
    /// Asks endpoint `id` of `tenant` to prove ownership again, with a new
    /// challenge: its deliveries wait until it proves it. `None` when there is
    /// no such endpoint.
    pub async fn request_verification(
        &self,
        tenant: &TenantId,
        id: EndpointId,
        actor: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let challenge = new_challenge();
        let updated = tx
            .execute(
                "UPDATE walhook.endpoints SET verification_challenge = $3, \
                   verification_requested_at = now(), verified_at = NULL, updated_at = now() \
                 WHERE id = $1 AND tenant_id = $2 AND deleted_at IS NULL",
                &[&Uuid::from_bytes(id.0), &tenant.as_str(), &challenge],
            )
            .await
            .map_err(StoreError::query("ask an endpoint to verify"))?;
        if updated == 0 {
            return Ok(None);
        }
        tx.execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target) \
             VALUES ($1, $2, 'endpoint.verification_requested', $3)",
            &[&tenant.as_str(), &actor, &id.to_string()],
        )
        .await
        .map_err(StoreError::query("audit a verification request"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a verification request"))?;
        Ok(Some(challenge))
    }

    /// Records a check of `challenge`: `Ok` verifies the endpoint (audited
    /// as `endpoint.verified`) unless a newer challenge replaced it; `Err`
    /// keeps it waiting and stores why.
    pub async fn record_verification_result(
        &self,
        id: EndpointId,
        challenge: &str,
        result: Result<(), String>,
    ) -> Result<(), StoreError> {
        let uid = Uuid::from_bytes(id.0);
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        match result {
            Ok(()) => {
                let row = tx
                    .query_opt(
                        "UPDATE walhook.endpoints SET verification_challenge = NULL, verified_at = now() \
                         WHERE id = $1 AND verification_challenge = $2 RETURNING tenant_id",
                        &[&uid, &challenge],
                    )
                    .await
                    .map_err(StoreError::query("verify an endpoint"))?;
                if let Some(row) = row {
                    let tenant: String = row.get(0);
                    tx.execute(
                        "DELETE FROM walhook.endpoint_verification_failures WHERE endpoint_id = $1",
                        &[&uid],
                    )
                    .await
                    .map_err(StoreError::query("clear a verification failure"))?;
                    tx.execute(
                        "INSERT INTO walhook.audit_log (tenant_id, actor, action, target) \
                         VALUES ($1, 'walhook', 'endpoint.verified', $2)",
                        &[&tenant, &id.to_string()],
                    )
                    .await
                    .map_err(StoreError::query("audit an endpoint verification"))?;
                }
            }
            Err(why) => {
                let why: String = why.chars().take(MAX_ERROR_LEN).collect();
                tx.execute(
                    "INSERT INTO walhook.endpoint_verification_failures (endpoint_id, challenge, error) \
                     SELECT id, $2, $3 FROM walhook.endpoints WHERE id = $1 AND verification_challenge = $2 \
                     ON CONFLICT (endpoint_id) DO UPDATE SET challenge = EXCLUDED.challenge, \
                       error = EXCLUDED.error, checked_at = now()",
                    &[&uid, &challenge, &why],
                )
                .await
                .map_err(StoreError::query("record a verification failure"))?;
            }
        }
        crate::commit!(tx, client).map_err(StoreError::query("commit a verification result"))?;
        Ok(())
    }
}
