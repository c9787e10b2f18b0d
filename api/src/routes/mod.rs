//! The routes, one module per resource, and the router that mounts them.

pub mod catalog;
pub mod deliveries;
pub mod endpoints;
pub mod ops;
pub mod reconciliations;
pub mod sent;
pub mod tenants;
pub mod validate;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use axum::routing::{get, post};

use crate::ApiState;
use crate::error::ApiError;
use crate::extract::MAX_BODY_BYTES;

async fn no_route() -> impl IntoResponse {
    ApiError::NotFound("no such route; GET /openapi.json lists the routes".into())
}

async fn no_method() -> impl IntoResponse {
    let status = axum::http::StatusCode::METHOD_NOT_ALLOWED;
    let problem = crate::error::Problem::new(
        "method",
        "Method not allowed",
        status,
        "this route does not take this method; GET /openapi.json lists the methods",
    );
    crate::error::problem_response(status, &problem)
}

/// Every route, with the edge, metrics, request limits, the body limit and
/// problem-document fallbacks.
pub fn router(state: ApiState) -> Router {
    use deliveries::*;
    use endpoints::*;
    use tenants::*;
    let api = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/readyz", get(ops::readyz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi_json))
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route(
            "/v1/tenants/{tenant_id}",
            get(get_tenant).patch(patch_tenant),
        )
        .route(
            "/v1/tenants/{tenant_id}/api-keys",
            post(create_api_key).get(list_api_keys),
        )
        .route(
            "/v1/tenants/{tenant_id}/api-keys/{key_id}",
            axum::routing::delete(revoke_api_key),
        )
        .route(
            "/v1/webhook-endpoints",
            post(create_endpoint).get(list_endpoints),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}",
            get(get_endpoint)
                .patch(patch_endpoint)
                .delete(delete_endpoint),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/versions",
            get(endpoint_versions),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/stats",
            get(endpoint_stats),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
            post(rotate_secret),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/recover",
            post(recover_endpoint),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/test",
            post(test_endpoint),
        )
        .route(
            "/v1/webhook-endpoints/{endpoint_id}/verify",
            post(verify_endpoint),
        )
        .route("/v1/webhook-deliveries", get(list_deliveries))
        .route("/v1/webhook-deliveries/{delivery_id}", get(get_delivery))
        .route(
            "/v1/webhook-deliveries/{delivery_id}/requests",
            get(sent::sent_requests),
        )
        .route(
            "/v1/webhook-deliveries/{delivery_id}/replay",
            post(replay_delivery),
        )
        .route(
            "/v1/webhook-deliveries/{delivery_id}/cancel",
            post(cancel_delivery),
        )
        .route("/v1/event-types", get(catalog::list_event_types))
        .route("/v1/event-types/{event_type}", get(catalog::get_event_type))
        .route("/v1/audit-log", get(catalog::list_audit))
        .route(
            "/v1/reconciliations",
            get(reconciliations::list_reconciliations),
        )
        .route(
            "/v1/reconciliations/{reconciliation_id}",
            get(reconciliations::get_reconciliation),
        )
        .route(
            "/v1/reconciliations/{reconciliation_id}/report.html",
            get(reconciliations::reconciliation_html),
        )
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state.clone());
    // The console calls these routes in-process, past the request limit and
    // the metrics (its own request was limited and counted once).
    state.guards.console.set_api(api.clone());
    api.merge(crate::console::router().with_state(state.clone()))
        // Inside the metrics layer, so that refusals for load are counted.
        .layer(axum::middleware::from_fn_with_state(
            state.guards.requests.clone(),
            crate::limits::enforce,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::metrics::track,
        ))
        // Outermost: what reaches the metrics has a standard method.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::edge::edge,
        ))
}

/// `GET /metrics` without a token, for the listener of
/// `[api].metrics_listen`; anything else is a 404.
pub fn metrics_router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(ops::open_metrics))
        .fallback(no_route)
        .with_state(state)
}
