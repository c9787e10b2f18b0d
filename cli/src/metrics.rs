//! The metrics server of a stage process on its own; the registry and
//! the collector over the process's counters are
//! `walhook_pipeline::runtime::metrics`.

use std::sync::Arc;

pub use walhook_pipeline::runtime::metrics::{PipelineCollector, StageMetrics};

/// Serves `GET /metrics` (the metrics of this process: no SQL gauges, which
/// `walhook api` serves once for the deployment) and `GET /healthz` on
/// `listen` until `shutdown`, for the processes without the API: `walhook
/// capture`, `walhook fanout`, `walhook dispatch` (`--metrics-listen`).
/// `/healthz` answers 503 with the reason while the Fluvio cluster has not
/// answered for some seconds (see `walhook_connectors::fluvio`'s watch).
#[allow(clippy::disallowed_methods)] // bare spawn: the metrics server ends at shutdown; its failure is logged and delivery goes on
pub async fn serve_stage_metrics(
    listen: &str,
    metrics: Arc<StageMetrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use axum::http::header;
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!("cannot listen on --metrics-listen {listen:?}; is the port free?")
        })?;
    let health = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move {
                    let text = metrics.render();
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let problem = health.pipeline.log_problem.lock().clone();
                async move {
                    match problem {
                        None => (axum::http::StatusCode::OK, "ok".to_owned()),
                        Some(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        );
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "--metrics-listen is not loopback: anyone who can reach it reads tenant and endpoint metrics without a token"
        );
    }
    tracing::info!(%addr, "serving /metrics");
    // Ends at shutdown; a failure before that is logged, and the stages
    // go on (metrics are not worth stopping delivery for).
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}
