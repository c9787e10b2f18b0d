//! `Idempotency-Key` on POSTs.
//!
//! ```text
//!  key absent ─────────────────────────────────▶ work ─▶ response
//!  key new ──claim──▶ work ─▶ store (status, body) ─▶ response
//!  key seen, same request, done ───────────────▶ stored response (+ Idempotent-Replayed: true)
//!  key seen, same request, running ────────────▶ 409
//!  key seen, other request ────────────────────▶ 422 naming the header
//! ```
//!
//! The request is identified by method, path and body bytes; keys are
//! scoped per caller (operator, or one tenant). Refusals of the work (a
//! 409, a 404) are stored like successes, so a retry gets the same answer;
//! validation refusals come before the key is claimed (they do not depend
//! on state, so a retry gets them again anyway); server errors and quota
//! refusals (429: a later retry may succeed) release the key so a retry can
//! do the work. A request stopped by `[api].request_timeout` leaves its
//! claim open; a retry may take it over after a minute. Records are kept
//! [`RETENTION_SECS`].
//!
//! A response that shows a secret once (an endpoint's signing secret, a
//! rotated secret, a new API key) is a [`ShownOnce`] value: the caller gets
//! it whole, and the record holds [`ShownOnce::withheld`], the same
//! response with the secret replaced by `null`, a `…_withheld: true` flag
//! and a note saying how to get a new one. So the secret exists in
//! plaintext only in the one response that showed it, never in
//! `walhook.idempotency_keys`.

use std::future::Future;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, PROBLEM_JSON};
use crate::extract::IdempotencyKey;
use walhook_sql::idempotency::Claim;

/// How long records are kept (seconds).
pub const RETENTION_SECS: f64 = 24.0 * 3600.0;

/// The header marking a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// A response that carries a secret to be shown once.
pub trait ShownOnce: Serialize {
    /// The same response without the secret: what replays answer.
    fn withheld(&self) -> Self;
}

/// A JSON response a POST produced.
#[derive(Clone)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The JSON body.
    pub body: Vec<u8>,
    /// What to store for replays, when it differs from `body`.
    pub stored: Option<Vec<u8>>,
}

impl Reply {
    /// `value` as JSON with `status`.
    pub fn json<T: Serialize>(status: StatusCode, value: &T) -> Self {
        Reply {
            status,
            body: serde_json::to_vec(value).unwrap_or_default(),
            stored: None,
        }
    }

    /// `value` as JSON with `status`; replays answer it with the secret
    /// withheld (see the module docs).
    pub fn shown_once<T: ShownOnce>(status: StatusCode, value: &T) -> Self {
        Reply {
            stored: Some(serde_json::to_vec(&value.withheld()).unwrap_or_default()),
            ..Reply::json(status, value)
        }
    }
}

impl std::fmt::Debug for Reply {
    // The body may hold a secret shown once: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("body_bytes", &self.body.len())
            .finish_non_exhaustive()
    }
}

fn json_response(status: StatusCode, body: Vec<u8>, replayed: bool) -> Response {
    let content_type = if status.is_client_error() || status.is_server_error() {
        PROBLEM_JSON
    } else {
        "application/json"
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if replayed {
        headers.insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    response
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        json_response(self.status, self.body, false)
    }
}

/// Runs `work` at most once per caller and key (see the module docs).
pub async fn once<F, Fut>(
    state: &ApiState,
    principal: &Principal,
    key: &IdempotencyKey,
    method_path: &str,
    raw_body: &[u8],
    work: F,
) -> Result<Response, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<Reply, ApiError>>,
{
    let Some(key) = &key.0 else {
        return work().await.map(IntoResponse::into_response);
    };
    let scope = principal.idempotency_scope();
    let mut hasher = Sha256::new();
    hasher.update(method_path.as_bytes());
    hasher.update(b"\n");
    hasher.update(raw_body);
    let request: [u8; 32] = hasher.finalize().into();
    match state
        .platform
        .claim_idempotency_key(&scope, key, &request)
        .await?
    {
        Claim::Fresh => {}
        Claim::InProgress => {
            return Err(ApiError::Conflict(
                "a request with this Idempotency-Key is still being processed; retry in a moment"
                    .into(),
            ));
        }
        Claim::Mismatch => {
            return Err(ApiError::field(
                "header.Idempotency-Key",
                "was already used for a different request (method, path or body); use a new key for a new request",
            ));
        }
        Claim::Done { status, body } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            return Ok(json_response(status, body, true));
        }
    }
    let (status, body, stored) = match work().await {
        Ok(reply) => {
            let stored = reply.stored.clone().unwrap_or_else(|| reply.body.clone());
            (reply.status, reply.body, stored)
        }
        Err(e) if e.status().is_server_error() || e.status() == StatusCode::TOO_MANY_REQUESTS => {
            if let Err(release) = state.platform.release_idempotency_key(&scope, key).await {
                tracing::warn!(error = %release, "could not release an idempotency key");
            }
            return Err(e);
        }
        Err(e) => {
            let body = serde_json::to_vec(&e.problem()).unwrap_or_default();
            (e.status(), body.clone(), body)
        }
    };
    if let Err(e) = state
        .platform
        .finish_idempotency_key(&scope, key, status.as_u16(), &stored)
        .await
    {
        // The work is done; the caller gets its answer. A retry finds the
        // claim open and, after a minute, does the work again.
        tracing::warn!(error = %e, "could not store an idempotent response");
    }
    Ok(json_response(status, body, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tenants::{ApiKey, CreatedApiKey};

    #[test]
    fn a_secret_shown_once_is_neither_stored_nor_printed() {
        let api_key = ApiKey {
            id: "key_0".into(),
            tenant_id: "acme".into(),
            name: "ci".into(),
            prefix: "whk_abcdefgh".into(),
            created_at: chrono::Utc::now(),
            created_by: "operator".into(),
            revoked_at: None,
        };
        let secret = "whk_abcdefgh-the-rest-of-the-key";
        let shown = CreatedApiKey::new(api_key, secret.into());
        let reply = Reply::shown_once(StatusCode::CREATED, &shown);
        assert!(String::from_utf8_lossy(&reply.body).contains(secret));
        let stored: serde_json::Value =
            serde_json::from_slice(reply.stored.as_deref().unwrap()).unwrap();
        assert!(!stored.to_string().contains(secret), "{stored}");
        assert!(stored["key"].is_null());
        assert_eq!(stored["key_withheld"], true);
        assert!(stored["note"].as_str().unwrap().contains("revoke key_0"));
        for printed in [format!("{shown:?}"), format!("{reply:?}")] {
            assert!(!printed.contains(secret), "{printed}");
        }
    }
}
