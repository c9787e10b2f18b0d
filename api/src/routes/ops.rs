//! Operations: liveness, readiness (the database answers and the schema is
//! current), Prometheus metrics and the OpenAPI document.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ApiState;
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
/// the one this binary needs.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses((status = 200, description = "Ready", body = Health),
              (status = 503, description = "Not ready, and why", body = Problem, content_type = "application/problem+json")))]
pub async fn readyz(State(state): State<ApiState>) -> Response {
    match state.platform.check().await {
        Ok(()) => axum::Json(Health {
            status: "ok".into(),
        })
        .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            problem_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &Problem {
                    kind: "urn:walhook:problem:unavailable".into(),
                    title: "Not ready".into(),
                    status: 503,
                    detail: e.to_string(),
                    errors: Vec::new(),
                },
            )
        }
    }
}

/// Prometheus metrics of the API and of the pipeline stages in this
/// process (OpenMetrics text).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Metrics", body = String,
               content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
pub async fn metrics(State(state): State<ApiState>) -> Response {
    let text = state.metrics.render(Some(&state.platform)).await;
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
