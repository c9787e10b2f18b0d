//! Who is calling: the operator (one token from the config) or a tenant (an
//! API key).
//!
//! Tenant keys are `whk_` and 43 characters of URL-safe base64 (256 random
//! bits), shown once when issued; the database keeps their SHA-256 and
//! their first characters. A revoked key, or a key of a disabled tenant,
//! no longer authenticates. Every handler of a tenant route gets the
//! caller's [`TenantId`] from here and passes it to every query, so another
//! tenant's object is never found (404).
//!
//! Failed authentications are limited per client address and per token
//! presented (`[api].failed_authentications_per_minute`, see
//! [`crate::ratelimit`]): past the limit a request is answered 429 with
//! `Retry-After` before its token is even looked at. A request without
//! any `Authorization` header presents nothing and is not counted.

use std::time::Instant;

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use uuid::Uuid;
use walhook_pipeline::ids::TenantId;

use crate::ApiState;
use crate::error::{ApiError, QuotaExceeded};
use crate::metrics::Refusal;
use crate::ratelimit::{CredentialKey, Refused};

/// The prefix of tenant API keys.
pub const KEY_PREFIX: &str = "whk_";

/// Characters of a key kept to tell keys apart (`whk_` and 8 more).
pub const SHOWN_PREFIX_LEN: usize = 12;

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// The operator token.
    Operator,
    /// A tenant's API key.
    Tenant {
        /// The tenant.
        tenant: TenantId,
        /// The key's id.
        key_id: Uuid,
    },
}

impl Principal {
    /// The actor recorded in audit records and endpoint versions.
    pub fn actor(&self) -> String {
        match self {
            Principal::Operator => "operator".into(),
            Principal::Tenant { key_id, .. } => format!("api_key:{}", key_text_id(*key_id)),
        }
    }

    /// The namespace of idempotency keys (one per caller).
    pub fn idempotency_scope(&self) -> String {
        match self {
            Principal::Operator => "operator".into(),
            Principal::Tenant { tenant, .. } => format!("tenant:{tenant}"),
        }
    }
}

/// The text form of an API key id: `key_` and the UUID's hex digits.
pub fn key_text_id(id: Uuid) -> String {
    format!("key_{}", id.simple())
}

/// Parses [`key_text_id`]'s form.
pub fn parse_key_id(text: &str) -> Option<Uuid> {
    let hex = text.strip_prefix("key_")?;
    (hex.len() == 32)
        .then(|| Uuid::try_parse(hex).ok())
        .flatten()
}

/// A fresh key, its shown prefix and its SHA-256.
pub fn generate_key() -> (String, String, [u8; 32]) {
    let key = format!(
        "{KEY_PREFIX}{}",
        URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
    );
    let prefix = key[..SHOWN_PREFIX_LEN].to_owned();
    let hash = hash_key(&key);
    (key, prefix, hash)
}

/// Whether `token` has the form of a key [`generate_key`] makes: `whk_` and
/// the URL-safe base64 of 32 bytes.
pub fn well_formed(token: &str) -> bool {
    token.len() == KEY_PREFIX.len() + 43
        && token.starts_with(KEY_PREFIX)
        && token[KEY_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// SHA-256 of a key's text.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Compares without an early exit, so timing does not reveal the token.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let (ha, hb) = (Sha256::digest(a), Sha256::digest(b));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let value = parts
        .headers
        .get(header::AUTHORIZATION)
        .ok_or_else(|| {
            ApiError::Unauthorized(
                "no Authorization header; send `Authorization: Bearer <API key>`".into(),
            )
        })?
        .to_str()
        .map_err(|_| ApiError::Unauthorized("the Authorization header is not ASCII".into()))?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(ApiError::Unauthorized(
            "the Authorization header must be `Bearer <API key>`".into(),
        ));
    }
    Ok(token.trim())
}

/// Authenticates the request (within the failed-authentication limits),
/// and counts a tenant's request against its share of the request slots.
pub async fn authenticate(parts: &Parts, state: &ApiState) -> Result<Principal, ApiError> {
    let principal = limited(parts, state, |token| principal_of(token, state)).await?;
    if let Principal::Tenant { tenant, .. } = &principal {
        crate::limits::admit_tenant(&parts.extensions, tenant)?;
    }
    Ok(principal)
}

/// Checks the request's bearer token with `check`, within
/// `[api].failed_authentications_per_minute`: refused (429) when the
/// address or the token used it up; a 401 from `check` counts against
/// both.
async fn limited<'p, T, F>(
    parts: &'p Parts,
    state: &ApiState,
    check: impl FnOnce(&'p str) -> F,
) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, ApiError>>,
{
    let token = bearer(parts)?;
    let client = parts
        .extensions
        .get::<crate::client::ClientAddr>()
        .map(|c| c.key());
    let credential = CredentialKey::of(token);
    let failures = &state.guards.failed_auths;
    if let Err(refused) = failures.check(client, credential, Instant::now()) {
        if state.metrics.refused(Refusal::AuthenticationRate) {
            tracing::warn!(
                client = %client.map(|c| c.to_string()).unwrap_or_default(),
                by = refused.whom(),
                "request refused: too many failed authentications"
            );
        }
        return Err(too_many_failures(&refused, failures.per_minute()));
    }
    let result = check(token).await;
    if let Err(ApiError::Unauthorized(_)) = &result {
        failures.record(client, credential, Instant::now());
    }
    result
}

/// The 429 of a request over `[api].failed_authentications_per_minute`.
fn too_many_failures(refused: &Refused, per_minute: u32) -> ApiError {
    let secs = refused.retry_after_secs();
    ApiError::QuotaExceeded {
        detail: format!(
            "more than {per_minute} failed authentications in a minute {}, the most \
             [api].failed_authentications_per_minute allows; this request's token was not \
             checked. Retry in {secs} s with a valid API key",
            refused.whom()
        ),
        quota: QuotaExceeded {
            limit_name: "failed_authentications_per_minute".into(),
            limit: u64::from(per_minute),
            current: u64::from(per_minute),
            retry_after_seconds: Some(secs),
        },
    }
}

/// A caller allowed to read `/metrics` on the public listener: the
/// operator token, or `[api].metrics_token`; anyone else gets a 401.
#[derive(Debug, Clone, Copy)]
pub struct MetricsReader;

impl FromRequestParts<ApiState> for MetricsReader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        let refused = || {
            ApiError::Unauthorized(
                "/metrics needs `Authorization: Bearer <[api].metrics_token or the operator \
                 token>`; or scrape [api].metrics_listen (loopback by default), which needs none"
                    .into(),
            )
        };
        let read = limited(parts, state, |token| async move {
            let settings = &state.settings;
            let metrics_token = settings
                .metrics_token
                .as_ref()
                .map(|t| t.expose().as_bytes());
            if constant_time_eq(
                token.as_bytes(),
                settings.operator_token.expose().as_bytes(),
            ) || metrics_token.is_some_and(|t| constant_time_eq(token.as_bytes(), t))
            {
                Ok(MetricsReader)
            } else {
                Err(refused())
            }
        })
        .await;
        read.map_err(|e| match e {
            ApiError::Unauthorized(_) => refused(),
            other => other,
        })
    }
}

/// Who `token` (the operator token or a tenant's API key) is; 401 when it
/// is neither a live key nor the operator token.
pub async fn principal_of(token: &str, state: &ApiState) -> Result<Principal, ApiError> {
    if constant_time_eq(
        token.as_bytes(),
        state.settings.operator_token.expose().as_bytes(),
    ) {
        return Ok(Principal::Operator);
    }
    let invalid = || ApiError::Unauthorized("the API key is unknown or revoked".into());
    // Only the form of a key walhook issues can be one; and only a key whose
    // prefix a live key has is worth a query.
    if !well_formed(token)
        || !state
            .guards
            .key_prefixes
            .may_exist(&state.platform, &token[..SHOWN_PREFIX_LEN])
            .await?
    {
        return Err(invalid());
    }
    let hash = hash_key(token);
    if let Some((tenant, key_id)) = state.guards.verified_keys.get(&hash) {
        return Ok(Principal::Tenant { tenant, key_id });
    }
    match state.platform.tenant_for_key(&hash).await? {
        Some((tenant, key_id)) => {
            state.guards.verified_keys.put(hash, tenant.clone(), key_id);
            Ok(Principal::Tenant { tenant, key_id })
        }
        None => Err(invalid()),
    }
}

impl FromRequestParts<ApiState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        authenticate(parts, state).await
    }
}

/// The operator, or a 403.
#[derive(Debug, Clone, Copy)]
pub struct Operator;

impl FromRequestParts<ApiState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        match authenticate(parts, state).await? {
            Principal::Operator => Ok(Operator),
            Principal::Tenant { .. } => Err(ApiError::Forbidden(
                "this route needs the operator token, not a tenant API key".into(),
            )),
        }
    }
}

/// A tenant caller, or a 403.
#[derive(Debug, Clone)]
pub struct TenantCaller {
    /// The tenant.
    pub tenant: TenantId,
    /// The principal (for audit and idempotency).
    pub principal: Principal,
}

impl FromRequestParts<ApiState> for TenantCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, ApiError> {
        match authenticate(parts, state).await? {
            Principal::Operator => Err(ApiError::Forbidden(
                "this route acts for a tenant: use one of the tenant's API keys (POST /v1/tenants/{id}/api-keys issues one)".into(),
            )),
            Principal::Tenant { tenant, key_id } => Ok(TenantCaller {
                tenant: tenant.clone(),
                principal: Principal::Tenant { tenant, key_id },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_hashed() {
        let (a, pa, ha) = generate_key();
        let (b, _, hb) = generate_key();
        assert_ne!(a, b);
        assert_ne!(ha, hb);
        assert!(a.starts_with(KEY_PREFIX) && a.len() == 4 + 43, "{a}");
        assert!(a.starts_with(&pa));
        assert_eq!(hash_key(&a), ha);
        assert!(well_formed(&a) && well_formed(&b));
        for bad in [
            "whk_short",
            "garbage",
            &a[..a.len() - 1],
            &format!("{a}x"),
            &a.replace('_', "/"),
        ] {
            assert!(!well_formed(bad), "{bad}");
        }
    }

    #[test]
    fn key_ids_round_trip() {
        let id = Uuid::new_v4();
        assert_eq!(parse_key_id(&key_text_id(id)), Some(id));
        assert_eq!(parse_key_id("key_xyz"), None);
        assert_eq!(parse_key_id(&id.to_string()), None);
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
