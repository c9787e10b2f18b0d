//! `Idempotency-Key` records: the first request with a key claims it, stores
//! its response when done; a retry with the same key and request gets that
//! response again.
//!
//! The claim and the work are separate transactions: a crash in between
//! leaves a claim without a response, which another request may take over
//! after [`ABANDONED_AFTER_SECS`]. The work may then run twice, so every
//! effect is made safe to repeat: an endpoint created under a key gets an
//! id derived from the key (a second run finds it and answers 409 naming
//! it); tenants are named by the caller (409 again); replays, recoveries
//! and test events add attempts, which a receiver dedups by `webhook-id`;
//! a secret rotation rotates once more (the secret the lost answer held is
//! simply never used); an API key issued twice leaves one key nobody has
//! seen, which the operator can revoke.

use crate::{Platform, StoreError};

/// A claim without a response older than this (seconds) is taken over.
pub const ABANDONED_AFTER_SECS: f64 = 60.0;

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is ours now: do the work, then finish or release.
    Fresh,
    /// Another request with this key is still running.
    InProgress,
    /// The key was used for a different request.
    Mismatch,
    /// Done before: answer this again.
    Done {
        /// The status sent.
        status: u16,
        /// The body sent.
        body: Vec<u8>,
    },
}

impl Platform {
    /// Claims `key` for `principal` and a request hashing to `request`.
    pub async fn claim_idempotency_key(
        &self,
        principal: &str,
        key: &str,
        request: &[u8; 32],
    ) -> Result<Claim, StoreError> {
        let client = self.client().await?;
        let fresh = client
            .query_opt(
                "INSERT INTO walhook.idempotency_keys AS k (principal, key, request_sha256) VALUES ($1, $2, $3) \
                 ON CONFLICT (principal, key) DO UPDATE SET created_at = now(), request_sha256 = EXCLUDED.request_sha256 \
                   WHERE k.status IS NULL AND k.request_sha256 = EXCLUDED.request_sha256 \
                     AND k.created_at < now() - $4 * interval '1 second' \
                 RETURNING 1",
                &[&principal, &key, &request.as_slice(), &ABANDONED_AFTER_SECS],
            )
            .await
            .map_err(StoreError::query("claim an idempotency key"))?;
        if fresh.is_some() {
            return Ok(Claim::Fresh);
        }
        let row = client
            .query_opt(
                "SELECT request_sha256, status, response FROM walhook.idempotency_keys WHERE principal = $1 AND key = $2",
                &[&principal, &key],
            )
            .await
            .map_err(StoreError::query("read an idempotency key"))?;
        let Some(row) = row else {
            // Purged in between: a retry of the caller will claim it.
            return Ok(Claim::InProgress);
        };
        let hash: Vec<u8> = row.get(0);
        if hash != request.as_slice() {
            return Ok(Claim::Mismatch);
        }
        let status: Option<i32> = row.get(1);
        let body: Option<Vec<u8>> = row.get(2);
        Ok(match (status, body) {
            (Some(s), Some(body)) => Claim::Done {
                status: u16::try_from(s).unwrap_or(500),
                body,
            },
            _ => Claim::InProgress,
        })
    }

    /// Stores the response of a claimed key.
    pub async fn finish_idempotency_key(
        &self,
        principal: &str,
        key: &str,
        status: u16,
        body: &[u8],
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE walhook.idempotency_keys SET status = $3, response = $4 WHERE principal = $1 AND key = $2",
                &[&principal, &key, &i32::from(status), &body],
            )
            .await
            .map_err(StoreError::query("store an idempotent response"))?;
        Ok(())
    }

    /// Gives a claimed key back (the work failed in a way a retry may fix).
    pub async fn release_idempotency_key(
        &self,
        principal: &str,
        key: &str,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM walhook.idempotency_keys WHERE principal = $1 AND key = $2 AND status IS NULL",
                &[&principal, &key],
            )
            .await
            .map_err(StoreError::query("release an idempotency key"))?;
        Ok(())
    }

    /// Removes records older than `max_age_secs`; returns how many.
    pub async fn purge_idempotency_keys(&self, max_age_secs: f64) -> Result<u64, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM walhook.idempotency_keys WHERE created_at < now() - $1 * interval '1 second'",
                &[&max_age_secs],
            )
            .await
            .map_err(StoreError::query("purge idempotency keys"))
    }
}
