//! The edge of the API: what every request meets first, before metrics,
//! limits or routes.
//!
//! ```text
//!  request ─▶ method standard? ─no─▶ 405 problem (counted: refusals{reason="method"})
//!                 └─yes─▶ client address (TCP peer, or X-Forwarded-For from a trusted proxy)
//!                         ─▶ metrics ─▶ limits ─▶ routes
//!  response ◀─ Strict-Transport-Security when [api].public_url is https
//! ```
//!
//! A method is any token a client cares to send, so one outside the
//! standard set is refused here, before it can become a metric label, a
//! log field or a route lookup: a flood of made-up methods costs a counter
//! increment each and leaves nothing behind.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::ApiState;
use crate::client::ClientAddr;
use crate::error::{Problem, problem_response};
use crate::metrics::{Refusal, STANDARD_METHODS};

/// `Strict-Transport-Security` when the API is reached over https: a year,
/// this host only (subdomains may serve other things).
const HSTS: HeaderValue = HeaderValue::from_static("max-age=31536000");

/// The outermost middleware (see the module docs).
pub async fn edge(State(state): State<ApiState>, mut request: Request, next: Next) -> Response {
    let hsts = state.settings.strict_transport();
    let mut response = if STANDARD_METHODS.contains(request.method()) {
        if let Some(ConnectInfo(peer)) = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .copied()
        {
            let client = state
                .settings
                .trusted_proxies
                .client(peer.ip(), request.headers());
            request.extensions_mut().insert(ClientAddr(client));
        }
        next.run(request).await
    } else {
        if state.metrics.refused(Refusal::Method) {
            tracing::info!(
                length = request.method().as_str().len(),
                "request refused: a method outside the standard set"
            );
        }
        not_allowed()
    };
    if hsts {
        response
            .headers_mut()
            .insert(header::STRICT_TRANSPORT_SECURITY, HSTS);
    }
    response
}

/// A 405 like the router's for a method a route does not take (a 501
/// would read as a server error to clients and test tools).
fn not_allowed() -> Response {
    let status = StatusCode::METHOD_NOT_ALLOWED;
    let mut response = problem_response(
        status,
        &Problem::new(
            "method",
            "Method not allowed",
            status,
            "the API implements GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS only; \
             GET /openapi.json lists which each route takes",
        ),
    );
    // Whatever else the client sent is not worth reading.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
