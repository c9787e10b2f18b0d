//! walhook's control plane: the REST API.
//!
//! ```text
//!  operator token ──▶ /v1/tenants, /v1/tenants/{id}/api-keys, /v1/audit-log
//!  tenant API key ──▶ /v1/webhook-endpoints[/{id}[/versions|/rotate-secret|/recover|/test]]
//!                     /v1/webhook-deliveries[/{id}[/replay]], /v1/event-types, /v1/audit-log
//!  anyone        ──▶ /healthz, /readyz, /metrics, /openapi.json
//!                          │
//!                          ▼
//!        platform Postgres (walhook-sql): endpoints + versions, secrets, deliveries,
//!        attempts, replay requests (carried out by the dispatcher), audit log
//! ```
//!
//! - [`auth`]: bearer tokens; every tenant query is scoped to the caller's
//!   tenant, so another tenant's object is a 404 like a missing one.
//! - [`error`]: RFC 9457 problem documents naming the field at fault.
//! - [`extract`]: JSON bodies and query strings parsed into problems, not
//!   plain-text rejections.
//! - [`idempotency`]: `Idempotency-Key` on every POST.
//! - [`metrics`]: the Prometheus registry this service serves and the
//!   pipeline in the same process feeds.
//! - [`routes`]: one module per resource; [`openapi`] collects them into the
//!   document served at `/openapi.json` and committed as `api/openapi.json`.
//!
//! [`serve`] takes its listener and a shutdown token, so tests and
//! `walhook run` start it in-process.

pub mod auth;
pub mod cursor;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod metrics;
pub mod model;
pub mod openapi;
pub mod routes;
pub mod settings;
pub mod test_event;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use walhook_sql::Platform;

pub use error::ApiError;
pub use metrics::Metrics;
pub use settings::ApiSettings;

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    /// The platform database.
    pub platform: Platform,
    /// The API's settings.
    pub settings: Arc<ApiSettings>,
    /// The metrics registry served at `/metrics`.
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState")
            .field("platform", &self.platform)
            .finish_non_exhaustive()
    }
}

/// Why the service stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The listener failed.
    #[error("the API server failed")]
    Io(#[from] std::io::Error),
}

/// Serves the API on `listener` until `shutdown`, then finishes the
/// requests in progress. Also purges old idempotency records hourly.
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let purge = {
        let platform = state.platform.clone();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match platform
                    .purge_idempotency_keys(idempotency::RETENTION_SECS)
                    .await
                {
                    Ok(n) if n > 0 => tracing::debug!(removed = n, "purged idempotency records"),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "could not purge idempotency records"),
                }
            }
        })
    };
    let app = routes::router(state);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    purge.abort();
    result.map_err(ServeError::Io)
}
