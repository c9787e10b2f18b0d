//! One module per subcommand.

pub mod api;
pub mod archive;
pub mod bench;
pub mod capture;
pub mod check_url;
pub mod demo;
pub mod dispatch;
pub mod fanout;
pub mod migrate;
pub mod reconcile;
pub mod run;
pub mod secrets;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

/// The metrics registry of a stage process, serving on `listen` when given
/// (bound before the stages start, so a busy port changes nothing).
pub async fn stage_metrics(
    listen: Option<&str>,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<Arc<walhook_api::Metrics>>> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let metrics = Arc::new(walhook_api::Metrics::new());
    crate::metrics::serve_stage_metrics(listen, metrics.clone(), shutdown.clone()).await?;
    Ok(Some(metrics))
}

/// Lets `metrics` read the running stages' counters at each scrape.
pub fn register_stage_collector(
    metrics: Option<&walhook_api::Metrics>,
    running: &crate::pipeline::Running,
) {
    if let Some(m) = metrics {
        m.register_collector(Box::new(crate::metrics::PipelineCollector::new(
            running.counters.clone(),
            running.directory.clone(),
        )));
    }
}

/// A token cancelled by SIGINT or SIGTERM.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}
