//! Tenant routes: webhook endpoints.
//!
//! Every change is a new config version (kept, listed by `…/versions`) and
//! an audit record. Deleting is soft: the endpoint stops receiving, its
//! history stays. Secrets are shown once: at creation and at rotation.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::time::Timestamp;
use walhook_pipeline::url_policy::{UrlPolicy, VettedHost, check_url};
use walhook_sql::StoreError;
use walhook_sql::endpoint_admin::EndpointRecord;
use walhook_sql::endpoints::{CreatedEndpoint as Created, EndpointChange, NewEndpoint};

use super::tenants::PageQuery;
use super::validate::{self, Checks};
use crate::auth::TenantCaller;
use crate::error::{ApiError, ErrorResponses, QuotaResponses};
use crate::extract::{IdempotencyKey, JsonBody, PathParams, QueryParams};
use crate::idempotency::{self, Reply};
use crate::model::endpoints::*;
use crate::model::ts;
use crate::settings::{MAX_RECOVER_WINDOW, MAX_ROTATION_OVERLAP};
use crate::{ApiState, cursor, quota, test_event};

/// An empty body (`{}` or nothing).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no endpoint {id:?}"))
}

fn endpoint_id(text: &str) -> Result<EndpointId, ApiError> {
    text.parse().map_err(|_| not_found(text))
}

/// The endpoint, or a 404 (also for another tenant's).
async fn owned(
    state: &ApiState,
    tenant: &TenantId,
    text: &str,
) -> Result<EndpointRecord, ApiError> {
    let id = endpoint_id(text)?;
    state
        .platform
        .endpoint_of_tenant(tenant, id)
        .await?
        .ok_or_else(|| not_found(text))
}

/// `StoreError::Schema` from the endpoint writers means the endpoint is gone
/// (deleted between the ownership check and the write).
fn gone(id: EndpointId) -> impl FnOnce(StoreError) -> ApiError {
    move |e| match e {
        StoreError::Schema(_) => not_found(&id.to_string()),
        other => other.into(),
    }
}

/// Creates an endpoint; its signing secret is in this response only (a
/// replay with the same `Idempotency-Key` answers `secret: null`,
/// `secret_withheld: true`). A tenant has at most
/// `[api].max_endpoints_per_tenant` endpoints (429 beyond).
#[utoipa::path(post, path = "/v1/webhook-endpoints", tag = "endpoints",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe (a replay does not show the secret again)")),
    request_body = CreateEndpoint,
    responses((status = 201, description = "The endpoint and its secret", body = CreatedEndpoint), ErrorResponses, QuotaResponses),
    security(("tenant_key" = [])))]
pub async fn create_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    key: IdempotencyKey,
    body: JsonBody<CreateEndpoint>,
) -> Result<Response, ApiError> {
    let b = &body.value;
    let mut checks = Checks::default();
    let url = checks.url("url", &b.url, &state.settings.url_policy);
    checks.text("description", &b.description, MAX_DESCRIPTION_LEN, true);
    let types = checks.event_types("event_types", &b.event_types);
    checks
        .known_types(&state.platform, "event_types", &types)
        .await?;
    checks.range(
        "rate_limit_per_sec",
        b.rate_limit_per_sec,
        1,
        MAX_RATE_LIMIT,
    );
    checks.range("max_in_flight", b.max_in_flight, 1, MAX_IN_FLIGHT);
    checks.retry(b.retry.as_ref(), &state.settings.retry_limits);
    checks.finish()?;
    let new = NewEndpoint {
        tenant_id: caller.tenant.clone(),
        url: url.expect("checked above"),
        event_types: types,
        description: b.description.clone(),
        rate_limit_per_sec: b.rate_limit_per_sec,
        max_in_flight: b.max_in_flight,
        enabled: b.enabled,
        retry: b.retry.map(Into::into).unwrap_or_default(),
        ordering: b.ordering.into(),
        verify: state.settings.require_verification,
    };
    // With an Idempotency-Key the id comes from the key, so that a retry
    // after a crash between the work and storing its response cannot make
    // a second endpoint (idempotency.rs).
    let id = match &key.0 {
        Some(k) => EndpointId::derive_for_request(&caller.principal.idempotency_scope(), k),
        None => EndpointId::random(),
    };
    let (s, new, actor) = (&state, &new, caller.principal.actor());
    let actor = &actor;
    idempotency::once(
        s,
        &caller.principal,
        &key,
        "POST /v1/webhook-endpoints",
        &body.raw,
        || async move {
            let limit = s.settings.limits.max_endpoints_per_tenant;
            let secret = match s
                .platform
                .create_endpoint_within(id, new, actor, Some(limit))
                .await?
            {
                Created::Created(secret) => secret,
                Created::Exists => {
                    return Err(ApiError::Conflict(format!(
                        "endpoint {id} was already created by an earlier request with this \
                         Idempotency-Key whose answer was lost; read it with GET /v1/webhook-endpoints/{id} \
                         and get a secret you can see with POST /v1/webhook-endpoints/{id}/rotate-secret"
                    )));
                }
                Created::QuotaReached { count } => {
                    return Err(quota::endpoints_exceeded(&new.tenant_id, limit, count));
                }
            };
            let record = s
                .platform
                .endpoint_of_tenant(&new.tenant_id, id)
                .await?
                .ok_or_else(|| not_found(&id.to_string()))?;
            let created = CreatedEndpoint::new(record.into(), secret.expose_text());
            Ok(Reply::shown_once(StatusCode::CREATED, &created))
        },
    )
    .await
}

/// Lists the tenant's endpoints, oldest first.
#[utoipa::path(get, path = "/v1/webhook-endpoints", tag = "endpoints", params(PageQuery),
    responses((status = 200, description = "A page of endpoints", body = EndpointPage), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn list_endpoints(
    caller: TenantCaller,
    State(state): State<ApiState>,
    QueryParams(q): QueryParams<PageQuery>,
) -> Result<Response, ApiError> {
    let limit = validate::limit(q.limit.as_deref(), 50, 250)?;
    let after = match &q.cursor {
        Some(c) => Some(cursor::parse_keyset(&cursor::decode(c, "endpoints", "")?)?),
        None => None,
    };
    let mut rows = state
        .platform
        .list_endpoints(&caller.tenant, after, limit + 1)
        .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            rows.last().map(|e| {
                let uuid = uuid::Uuid::from_bytes(e.id.0);
                cursor::encode("endpoints", "", &cursor::keyset(e.created_at, uuid))
            })
        })
        .flatten();
    Ok(axum::Json(EndpointPage {
        data: rows.into_iter().map(Endpoint::from).collect(),
        next_cursor,
    })
    .into_response())
}

/// One endpoint.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{endpoint_id}", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)")),
    responses((status = 200, description = "The endpoint", body = Endpoint), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn get_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let record = owned(&state, &caller.tenant, &id).await?;
    Ok(axum::Json(Endpoint::from(record)).into_response())
}

/// Changes an endpoint: a new config version.
#[utoipa::path(patch, path = "/v1/webhook-endpoints/{endpoint_id}", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)")),
    request_body = PatchEndpoint,
    responses((status = 200, description = "The endpoint after the change", body = Endpoint), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn patch_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    body: JsonBody<PatchEndpoint>,
) -> Result<Response, ApiError> {
    let record = owned(&state, &caller.tenant, &id).await?;
    let b = &body.value;
    let mut checks = Checks::default();
    let url = match &b.url {
        Some(u) => checks.url("url", u, &state.settings.url_policy),
        None => None,
    };
    if let Some(d) = &b.description {
        checks.text("description", d, MAX_DESCRIPTION_LEN, true);
    }
    let types = match &b.event_types {
        Some(names) => {
            let types = checks.event_types("event_types", names);
            checks
                .known_types(&state.platform, "event_types", &types)
                .await?;
            Some(types)
        }
        None => None,
    };
    checks.range(
        "rate_limit_per_sec",
        b.rate_limit_per_sec.flatten(),
        1,
        MAX_RATE_LIMIT,
    );
    checks.range("max_in_flight", b.max_in_flight.flatten(), 1, MAX_IN_FLIGHT);
    checks.retry(b.retry.flatten().as_ref(), &state.settings.retry_limits);
    let policy = &state.settings.url_policy;
    let reverify = state.settings.require_verification
        && url
            .as_deref()
            .is_some_and(|new| host_of(new, policy) != host_of(&record.url, policy));
    let change = EndpointChange {
        url,
        event_types: types,
        description: b.description.clone(),
        enabled: b.enabled,
        rate_limit_per_sec: b.rate_limit_per_sec,
        max_in_flight: b.max_in_flight,
        retry: b.retry.map(|r| r.map(Into::into)),
        ordering: b.ordering.map(Into::into),
        reverify,
    };
    if change.changed_fields().is_empty() {
        checks.fail(
            "body",
            "changes nothing; give at least one of url, description, event_types, enabled, rate_limit_per_sec, max_in_flight, retry, ordering",
        );
    }
    checks.finish()?;
    state
        .platform
        .update_endpoint(record.id, &change, &caller.principal.actor())
        .await
        .map_err(gone(record.id))?;
    let after = owned(&state, &caller.tenant, &id).await?;
    Ok(axum::Json(Endpoint::from(after)).into_response())
}

/// Deletes an endpoint: no new deliveries, pending ones are cancelled by
/// the dispatcher, history (versions, deliveries, attempts) is kept.
#[utoipa::path(delete, path = "/v1/webhook-endpoints/{endpoint_id}", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)")),
    responses((status = 204, description = "Deleted"), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn delete_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let eid = endpoint_id(&id)?;
    if state
        .platform
        .delete_endpoint(&caller.tenant, eid, &caller.principal.actor())
        .await?
    {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(not_found(&id))
    }
}

/// Every config version of an endpoint, oldest first.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{endpoint_id}/versions", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)")),
    responses((status = 200, description = "The versions", body = EndpointVersionList), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn endpoint_versions(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let eid = endpoint_id(&id)?;
    let versions = state
        .platform
        .endpoint_versions(&caller.tenant, eid)
        .await?
        .ok_or_else(|| not_found(&id))?;
    Ok(axum::Json(EndpointVersionList {
        data: versions.into_iter().map(EndpointVersion::from).collect(),
    })
    .into_response())
}

/// The window of `…/stats`, in hours.
#[derive(Debug, Clone, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StatsQuery {
    /// Hours back from now, 1 to 192 (default 24): the current hour and
    /// the `hours - 1` before it.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 192)]
    pub hours: Option<String>,
}

/// An endpoint's attempts hour by hour (kept 8 days) with its success
/// rate, and its circuit breaker: what a dashboard charts.
#[utoipa::path(get, path = "/v1/webhook-endpoints/{endpoint_id}/stats", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)"), StatsQuery),
    responses((status = 200, description = "The endpoint's hours and circuit", body = EndpointStats), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn endpoint_stats(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    QueryParams(q): QueryParams<StatsQuery>,
) -> Result<Response, ApiError> {
    let hours = validate::count("query.hours", q.hours.as_deref(), 24, 192)?;
    let eid = endpoint_id(&id)?;
    let (tallies, circuit) = state
        .platform
        .endpoint_tallies(&caller.tenant, eid, hours as u32)
        .await?
        .ok_or_else(|| not_found(&id))?;
    let attempts: i64 = tallies.iter().map(|h| h.attempts).sum();
    let succeeded: i64 = tallies.iter().map(|h| h.succeeded).sum();
    Ok(axum::Json(EndpointStats {
        endpoint_id: eid.to_string(),
        attempts,
        succeeded,
        success_rate: (attempts > 0).then(|| succeeded as f64 / attempts as f64),
        hours: tallies
            .into_iter()
            .map(|h| HourStats {
                hour: ts(h.hour),
                attempts: h.attempts,
                succeeded: h.succeeded,
            })
            .collect(),
        circuit: Circuit::from_row(circuit),
    })
    .into_response())
}

/// Makes a new signing secret (shown once: a replay with the same
/// `Idempotency-Key` answers `secret: null`, `secret_withheld: true`); the
/// previous ones keep signing for the overlap.
#[utoipa::path(post, path = "/v1/webhook-endpoints/{endpoint_id}/rotate-secret", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe (a replay does not show the secret again)")),
    request_body(content = RotateSecret, description = "Optional; `{}` takes the default overlap"),
    responses((status = 200, description = "The new secret", body = RotatedSecret), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn rotate_secret(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<RotateSecret>,
) -> Result<Response, ApiError> {
    let overlap = match body.value.overlap_seconds {
        None => state.settings.rotation_overlap,
        Some(secs) if secs <= MAX_ROTATION_OVERLAP.as_secs() => Duration::from_secs(secs),
        Some(secs) => {
            return Err(ApiError::field(
                "overlap_seconds",
                format!("is {secs}; give 0 to {}", MAX_ROTATION_OVERLAP.as_secs()),
            ));
        }
    };
    let record = owned(&state, &caller.tenant, &id).await?;
    let path = format!("POST /v1/webhook-endpoints/{}/rotate-secret", record.id);
    let (s, actor) = (&state, &caller.principal.actor());
    idempotency::once(
        s,
        &caller.principal,
        &key,
        &path,
        &body.raw,
        || async move {
            let made = s
                .platform
                .rotate_secret(record.id, overlap, actor)
                .await
                .map_err(gone(record.id))?;
            let rotated = RotatedSecret {
                secret: Some(made.secret.expose_text()),
                secret_withheld: false,
                note: None,
                secret_version: made.version,
                config_version: Some(made.config_version),
                previous_secrets_expire_at: ts(std::time::SystemTime::now() + overlap),
            };
            Ok(Reply::shown_once(StatusCode::OK, &rotated))
        },
    )
    .await
}

/// Replays every failed or exhausted delivery of the endpoint made in a
/// time window: one manual attempt each. `since` may be 30 days ago at
/// most; deliveries with an open replay are skipped.
#[utoipa::path(post, path = "/v1/webhook-endpoints/{endpoint_id}/recover", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe")),
    request_body = RecoverEndpoint,
    responses((status = 202, description = "Replays requested", body = RecoverAccepted), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn recover_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<RecoverEndpoint>,
) -> Result<Response, ApiError> {
    let b = body.value.clone();
    // Postgres keeps times from 4713 BC on; chrono parses far wider. Delivery
    // history starts in 1970 anyway.
    use chrono::Datelike;
    for (field, t) in [("since", Some(b.since)), ("until", b.until)] {
        if let Some(t) = t
            && !(1970..=9999).contains(&t.year())
        {
            return Err(ApiError::field(
                field,
                "must be a time between the years 1970 and 9999",
            ));
        }
    }
    if let Some(until) = b.until
        && until <= b.since
    {
        return Err(ApiError::field("until", "must be later than since"));
    }
    // Another tenant's endpoint is a 404 whatever the body says.
    let eid = owned(&state, &caller.tenant, &id).await?.id;
    // No further back than the replay window (and 30 days at most).
    let window = state.settings.replay_window.min(MAX_RECOVER_WINDOW);
    let oldest = chrono::Utc::now()
        - chrono::Duration::from_std(window).unwrap_or(chrono::Duration::days(30));
    if b.since < oldest {
        return Err(ApiError::field(
            "since",
            format!(
                "is {}, more than {} days ago; recovery looks back {} days at most (the replay \
                 window): give a time after {}",
                b.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                window.as_secs() / 86_400,
                window.as_secs() / 86_400,
                oldest.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        ));
    }
    let path = format!("POST /v1/webhook-endpoints/{eid}/recover");
    let (s, tenant, actor) = (&state, &caller.tenant, &caller.principal.actor());
    idempotency::once(
        s,
        &caller.principal,
        &key,
        &path,
        &body.raw,
        || async move {
            let count = s
                .platform
                .recover_endpoint(tenant, eid, b.since.into(), b.until.map(Into::into), actor)
                .await?
                .ok_or_else(|| not_found(&eid.to_string()))?;
            let accepted = RecoverAccepted {
                replay_request_count: count,
                since: b.since,
                until: b.until,
            };
            Ok(Reply::json(StatusCode::ACCEPTED, &accepted))
        },
    )
    .await
}

/// The host of a URL as the egress policy compares hosts (`None` when the
/// URL does not pass the policy).
fn host_of(url: &str, policy: &UrlPolicy) -> Option<VettedHost> {
    check_url(url, policy).ok().map(|v| v.host)
}

/// Sends the endpoint a new ownership check (a signed
/// `webhook.verification` request with a fresh challenge, which it answers
/// with a proof computed with its secret). Until it passes, its deliveries
/// wait; the previous challenge no longer counts. At most
/// `[api].verify_requests_per_minute` per endpoint (429 with `Retry-After`
/// beyond).
#[utoipa::path(post, path = "/v1/webhook-endpoints/{endpoint_id}/verify", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)")),
    request_body(content = Empty, description = "Optional; `{}` or nothing"),
    responses((status = 202, description = "The check is queued; the endpoint waits for it", body = Endpoint), ErrorResponses, QuotaResponses),
    security(("tenant_key" = [])))]
pub async fn verify_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    _body: JsonBody<Empty>,
) -> Result<Response, ApiError> {
    let record = owned(&state, &caller.tenant, &id).await?;
    // Counted only for the tenant's own endpoints (a 404 counts nothing),
    // before anything is written.
    let limit = &state.guards.verify_requests;
    if let Err(refusal) = limit.take(&record.id, std::time::Instant::now()) {
        return Err(quota::verify_requests_exceeded(
            record.id,
            limit.limit(),
            refusal,
        ));
    }
    state
        .platform
        .request_verification(&caller.tenant, record.id, &caller.principal.actor())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no endpoint {}", record.id)))?;
    let record = owned(&state, &caller.tenant, &id).await?;
    Ok((StatusCode::ACCEPTED, axum::Json(Endpoint::from(record))).into_response())
}

/// Sends a `webhook.test` event to the endpoint through the normal
/// dispatcher (signed, retried, recorded like any delivery). A tenant
/// sends at most `[api].test_events_per_minute` (429 with `Retry-After`
/// beyond).
#[utoipa::path(post, path = "/v1/webhook-endpoints/{endpoint_id}/test", tag = "endpoints",
    params(("endpoint_id" = String, Path, description = "The endpoint (`ep_…`)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe")),
    request_body(content = Empty, description = "Optional; `{}` or nothing"),
    responses((status = 202, description = "The test delivery is queued", body = TestAccepted), ErrorResponses, QuotaResponses),
    security(("tenant_key" = [])))]
pub async fn test_endpoint(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<Empty>,
) -> Result<Response, ApiError> {
    let record = owned(&state, &caller.tenant, &id).await?;
    if !record.enabled {
        return Err(ApiError::Conflict(format!(
            "endpoint {} is disabled; enable it (PATCH enabled=true) to send a test event",
            record.id
        )));
    }
    let path = format!("POST /v1/webhook-endpoints/{}/test", record.id);
    let (s, tenant, actor) = (&state, &caller.tenant, &caller.principal.actor());
    idempotency::once(
        s,
        &caller.principal,
        &key,
        &path,
        &body.raw,
        || async move {
            // Inside the idempotent work: a replay of an answered request
            // is not another test event.
            let limit = &s.guards.test_events;
            if let Err(refusal) = limit.take(tenant, std::time::Instant::now()) {
                return Err(quota::test_events_exceeded(tenant, limit.limit(), refusal));
            }
            let (event, delivery) = test_event::build(
                tenant,
                record.id,
                record.config_version,
                Timestamp::now(),
                s.settings.test_delivery_deadline,
            );
            s.platform
                .insert_test_delivery(&event, &delivery, actor)
                .await?;
            let accepted = TestAccepted {
                event_id: event.id.to_string(),
                delivery_id: delivery.id.to_string(),
            };
            Ok(Reply::json(StatusCode::ACCEPTED, &accepted))
        },
    )
    .await
}
