//! Operator routes: tenants and their API keys.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use walhook_pipeline::ids::TenantId;

use super::validate::{self, Checks};
use crate::auth::{Operator, Principal, generate_key, parse_key_id};
use crate::error::{ApiError, ErrorResponses};
use crate::extract::{IdempotencyKey, JsonBody, PathParams, QueryParams};
use crate::idempotency::{self, Reply};
use crate::model::tenants::*;
use crate::{ApiState, cursor};

/// Paging of simple listings.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<String>)]
    pub cursor: Option<String>,
    /// Page size, 1 to 250 (default 50).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 250)]
    pub limit: Option<String>,
}

fn tenant_id(text: &str) -> Result<TenantId, ApiError> {
    TenantId::new(text).map_err(|_| ApiError::NotFound(format!("no tenant {text:?}")))
}

/// Registers a tenant.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe")),
    request_body = CreateTenant,
    responses((status = 201, description = "The tenant", body = Tenant), ErrorResponses),
    security(("operator" = [])))]
pub async fn create_tenant(
    _: Operator,
    State(state): State<ApiState>,
    key: IdempotencyKey,
    body: JsonBody<CreateTenant>,
) -> Result<Response, ApiError> {
    let b = body.value;
    let mut checks = Checks::default();
    let id = match TenantId::new(b.id.clone()) {
        Ok(id) if b.id.trim() == b.id => Some(id),
        _ => {
            checks.fail(
                "id",
                "must be 1 to 128 characters, without control characters or surrounding spaces",
            );
            None
        }
    };
    let name = b.name.clone().unwrap_or_else(|| b.id.clone());
    checks.text("name", &name, MAX_NAME_LEN, false);
    let weight = b.weight.unwrap_or(1);
    if !(1..=1000).contains(&weight) {
        checks.fail("weight", format!("is {weight}; give 1 to 1000"));
    }
    if let Some(n) = b.max_in_flight
        && !(1..=100_000).contains(&n)
    {
        checks.fail(
            "max_in_flight",
            format!(
                "is {n}; give 1 to 100000, or leave it out for [dispatch] tenant_max_in_flight"
            ),
        );
    }
    let max_in_flight = b.max_in_flight;
    checks.retry(b.retry.as_ref(), &state.settings.retry_limits);
    let retry = b.retry.map(Into::into).unwrap_or_default();
    checks.finish()?;
    let id = id.expect("checked above");
    let (s, id, name, retry) = (&state, &id, &name, &retry);
    idempotency::once(
        s,
        &Principal::Operator,
        &key,
        "POST /v1/tenants",
        &body.raw,
        || async move {
            match s
                .platform
                .insert_tenant(id, name, weight, max_in_flight, retry, "operator")
                .await?
            {
                Some(t) => Ok(Reply::json(StatusCode::CREATED, &Tenant::from(t))),
                None => Err(ApiError::Conflict(format!("tenant {id:?} already exists"))),
            }
        },
    )
    .await
}

/// Lists tenants by id.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", params(PageQuery),
    responses((status = 200, description = "A page of tenants", body = TenantPage), ErrorResponses),
    security(("operator" = [])))]
pub async fn list_tenants(
    _: Operator,
    State(state): State<ApiState>,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Response, ApiError> {
    let limit = validate::limit(q.limit.as_deref(), 50, 250)?;
    let after = match &q.cursor {
        Some(c) => Some(cursor::decode(c, "tenants", "")?),
        None => None,
    };
    let mut rows = state
        .platform
        .list_tenants(after.as_deref(), limit + 1)
        .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            rows.last()
                .map(|t| cursor::encode("tenants", "", t.id.as_str()))
        })
        .flatten();
    Ok(axum::Json(TenantPage {
        data: rows.into_iter().map(Tenant::from).collect(),
        next_cursor,
    })
    .into_response())
}

/// One tenant.
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}", tag = "tenants",
    params(("tenant_id" = String, Path, description = "The tenant")),
    responses((status = 200, description = "The tenant", body = Tenant), ErrorResponses),
    security(("operator" = [])))]
pub async fn get_tenant(
    _: Operator,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let id = tenant_id(&id)?;
    match state.platform.tenant(&id).await? {
        Some(t) => Ok(axum::Json(Tenant::from(t)).into_response()),
        None => Err(ApiError::NotFound(format!("no tenant {id:?}"))),
    }
}

/// Changes a tenant's weight, in-flight budget or retry schedule. Dispatch
/// applies the change within a directory reload (about a second).
#[utoipa::path(patch, path = "/v1/tenants/{tenant_id}", tag = "tenants",
    params(("tenant_id" = String, Path, description = "The tenant")),
    request_body = PatchTenant,
    responses((status = 200, description = "The tenant as changed", body = Tenant), ErrorResponses),
    security(("operator" = [])))]
pub async fn patch_tenant(
    _: Operator,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    body: JsonBody<PatchTenant>,
) -> Result<Response, ApiError> {
    let id = tenant_id(&id)?;
    let b = &body.value;
    let mut checks = Checks::default();
    if let Some(w) = b.weight
        && !(1..=1000).contains(&w)
    {
        checks.fail("weight", format!("is {w}; give 1 to 1000"));
    }
    if let Some(Some(n)) = b.max_in_flight
        && !(1..=100_000).contains(&n)
    {
        checks.fail(
            "max_in_flight",
            format!("is {n}; give 1 to 100000, or null for [dispatch] tenant_max_in_flight"),
        );
    }
    checks.retry(b.retry.flatten().as_ref(), &state.settings.retry_limits);
    let change = walhook_sql::tenants::TenantChange {
        weight: b.weight,
        max_in_flight: b.max_in_flight,
        retry: b.retry.map(|r| r.map(Into::into)),
    };
    if b.weight.is_none() && b.max_in_flight.is_none() && b.retry.is_none() {
        checks.fail(
            "body",
            "changes nothing; give at least one of weight, max_in_flight, retry",
        );
    }
    checks.finish()?;
    match state
        .platform
        .update_tenant(&id, &change, "operator")
        .await?
    {
        Some(t) => Ok(axum::Json(Tenant::from(t)).into_response()),
        None => Err(ApiError::NotFound(format!("no tenant {id:?}"))),
    }
}

/// Issues an API key for a tenant; the key is in this response only.
#[utoipa::path(post, path = "/v1/tenants/{tenant_id}/api-keys", tag = "tenants",
    params(("tenant_id" = String, Path, description = "The tenant"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe (a replay does not show the key again)")),
    request_body = CreateApiKey,
    responses((status = 201, description = "The key, shown once", body = CreatedApiKey), ErrorResponses),
    security(("operator" = [])))]
pub async fn create_api_key(
    _: Operator,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<CreateApiKey>,
) -> Result<Response, ApiError> {
    let tenant = tenant_id(&id)?;
    let mut checks = Checks::default();
    checks.text("name", &body.value.name, MAX_NAME_LEN, false);
    checks.finish()?;
    let path = format!("POST /v1/tenants/{tenant}/api-keys");
    let (s, tenant, name) = (&state, &tenant, &body.value.name);
    idempotency::once(
        s,
        &Principal::Operator,
        &key,
        &path,
        &body.raw,
        || async move {
            let (secret, prefix, hash) = generate_key();
            let record = s
                .platform
                .insert_api_key(tenant, name, &prefix, &hash, "operator")
                .await?
                .ok_or_else(|| ApiError::NotFound(format!("no tenant {tenant:?}")))?;
            s.guards.key_prefixes.add(&prefix);
            let shown = CreatedApiKey::new(ApiKey::from(record), secret);
            Ok(Reply::shown_once(StatusCode::CREATED, &shown))
        },
    )
    .await
}

/// A tenant's API keys (never the keys themselves).
#[utoipa::path(get, path = "/v1/tenants/{tenant_id}/api-keys", tag = "tenants",
    params(("tenant_id" = String, Path, description = "The tenant")),
    responses((status = 200, description = "The keys", body = ApiKeyList), ErrorResponses),
    security(("operator" = [])))]
pub async fn list_api_keys(
    _: Operator,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let tenant = tenant_id(&id)?;
    if state.platform.tenant(&tenant).await?.is_none() {
        return Err(ApiError::NotFound(format!("no tenant {tenant:?}")));
    }
    let keys = state.platform.api_keys(&tenant).await?;
    Ok(axum::Json(ApiKeyList {
        data: keys.into_iter().map(ApiKey::from).collect(),
    })
    .into_response())
}

/// Revokes an API key: it stops authenticating at once.
#[utoipa::path(delete, path = "/v1/tenants/{tenant_id}/api-keys/{key_id}", tag = "tenants",
    params(("tenant_id" = String, Path, description = "The tenant"),
           ("key_id" = String, Path, description = "The key (`key_…`)")),
    responses((status = 204, description = "Revoked (or already revoked)"), ErrorResponses),
    security(("operator" = [])))]
pub async fn revoke_api_key(
    _: Operator,
    State(state): State<ApiState>,
    PathParams((id, key_id)): PathParams<(String, String)>,
) -> Result<Response, ApiError> {
    let tenant = tenant_id(&id)?;
    let not_found = || ApiError::NotFound(format!("tenant {tenant:?} has no API key {key_id:?}"));
    let uuid = parse_key_id(&key_id).ok_or_else(not_found)?;
    let revoked = state
        .platform
        .revoke_api_key(&tenant, uuid, "operator")
        .await?;
    // Whether or not it was live: no request after this answer uses it.
    state.guards.verified_keys.forget_all();
    if revoked {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(not_found())
    }
}
