//! One module per subcommand.

pub mod api;
pub mod archive;
pub mod capture;
pub mod check_url;
pub mod dispatch;
pub mod doctor;
pub mod fanout;
pub mod init;
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
) -> anyhow::Result<Option<Arc<crate::metrics::StageMetrics>>> {
    let Some(listen) = listen else {
        return Ok(None);
    };
    let metrics = Arc::new(crate::metrics::StageMetrics::default());
    crate::metrics::serve_stage_metrics(listen, metrics.clone(), shutdown.clone()).await?;
    Ok(Some(metrics))
}

/// Runs the stages of `roles` until SIGINT/SIGTERM (`walhook capture` and
/// `walhook fanout` on Fluvio), with metrics on `metrics_listen` when given.
pub async fn run_stages(
    cfg: &crate::config::Config,
    platform: walhook_sql::Platform,
    roles: crate::pipeline::Roles,
    metrics_listen: Option<&str>,
    what: &str,
) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context;
    let shutdown = shutdown_on_signals();
    let metrics = stage_metrics(metrics_listen, &shutdown).await?;
    let running = crate::pipeline::start_roles(
        cfg,
        platform,
        shutdown,
        metrics.as_ref().map(|m| m.pipeline.clone()),
        roles,
    )
    .await
    .with_context(|| format!("walhook {what} could not start"))?;
    if let Some(m) = &metrics {
        m.register_collector(Box::new(crate::metrics::PipelineCollector::new(
            running.counters.clone(),
            running.directory.clone(),
        )));
    }
    running.wait().await?;
    tracing::info!("walhook {what} stopped");
    Ok(std::process::ExitCode::SUCCESS)
}
/// A token cancelled by SIGINT or SIGTERM.
#[allow(clippy::disallowed_methods)] // bare spawn: the signal listener lives as long as the process
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
