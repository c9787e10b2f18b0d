//! Operations: liveness, readiness (the database answers and the schema is
//! current), Prometheus metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ApiState;
use crate::auth::MetricsReader;
use crate::error::{Problem, problem_response};
use crate::model::Health;

/// The process is alive.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".into(),
    })
}

/// The service can serve: the platform database answers and its schema is
/// the one this binary needs. The answer is reused for `[api].metrics_cache`
/// (the route needs no token), and a failure says only that the database
/// is not ready: its cause is logged, never shown.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready", body = Health),
              (status = 503, description = "Not ready (the cause is in the server's log)", body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<ApiState>) -> Response {
    let limits = &state.settings.limits;
    let ready = state
        .guards
        .readiness
        .get(limits.metrics_cache, || async {
            // Bounded like a statement: a hanging connect must not keep
            // every probe waiting on this read.
            let check = tokio::time::timeout(limits.statement_timeout, state.platform.check());
            let result = match check.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e}: {}", source_chain(&e))),
                Err(_) => Err(format!(
                    "the platform database did not answer within {:?}",
                    limits.statement_timeout
                )),
            };
            if let Err(cause) = &result {
                tracing::warn!(cause = %cause, "not ready");
            }
            result
        })
        .await;
    match ready {
        Ok(()) => axum::Json(Health {
            status: "ok".into(),
        })
        .into_response(),
        Err(_) => {
            let status = StatusCode::SERVICE_UNAVAILABLE;
            let mut response = problem_response(
                status,
                &Problem::new(
                    "unavailable",
                    "Not ready",
                    status,
                    "the platform database is not ready (unreachable, or its schema is not the \
                     one this version needs); the cause is in the server's log",
                ),
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

/// The causes of `e`, for the log.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push(cause.to_string());
        next = cause.source();
    }
    out.join(": ")
}

/// Prometheus metrics of the API and of the pipeline stages in this
/// process (OpenMetrics text), for the operator token or
/// `[api].metrics_token`: they name tenants and endpoints. Without a
/// token, scrape `[api].metrics_listen` (loopback by default) instead.
/// The SQL gauges are read at most once per `[api].metrics_cache`.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics", body = String,
               content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
              (status = 401, description = "No operator token or metrics token", body = Problem, content_type = "application/problem+json"),
              (status = 429, description = "Too many failed authentications from this address or with this token; retry after `Retry-After` seconds", body = Problem, content_type = "application/problem+json")),
    security(("operator" = []), ("metrics_token" = [])))]
pub async fn metrics(_reader: MetricsReader, State(state): State<ApiState>) -> Response {
    open_metrics(State(state)).await
}

/// The metrics without a token: the handler of `[api].metrics_listen`.
pub async fn open_metrics(State(state): State<ApiState>) -> Response {
    let text = state
        .metrics
        .render(Some(&state.platform), state.settings.limits.metrics_cache)
        .await;
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// The OpenAPI document of this API.
pub async fn openapi_json() -> Response {
    let mut response = crate::openapi::document_json().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
