//! `walhook run`: every stage in one process, and the API when the config
//! has `[api]`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use walhook_api::Metrics;
use walhook_pipeline::runtime::Task;

use crate::config::Config;
use crate::metrics::PipelineCollector;

/// Arguments of `walhook run`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file (see walhook.example.toml).
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// When the replication slot this source read from is gone (dropped,
    /// or lost and then dropped): record the changes it held as a gap (a
    /// `slot_reset` capture incident, shown by `walhook reconcile`) and
    /// start a new slot at the current position. Without it walhook stops
    /// and says so; use it once, after deciding how to re-send the gap.
    #[arg(long)]
    pub accept_slot_loss: bool,
}

/// Runs until SIGINT/SIGTERM, then stops intake, drains in-flight attempts
/// (up to [dispatch].drain_timeout) and exits.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cfg = Config::load(&args.config)?;
    cfg.warn_unauthenticated_databases(true);
    cfg.accept_slot_loss = args.accept_slot_loss;
    let p = cfg.platform()?;
    let keyring = cfg
        .secrets
        .keyring()
        .context("walhook run needs the master key that seals endpoint secrets")?;
    tracing::info!(
        key_id = keyring.current_id(),
        keys = keyring.key_ids().len(),
        "master keys loaded"
    );
    let platform = p.platform()?.with_keyring(keyring);
    let shutdown = super::shutdown_on_signals();
    let metrics = cfg.api.as_ref().map(|_| Arc::new(Metrics::new()));
    let mut tasks = Vec::new();
    if !cfg.archive.every.is_zero() {
        let (archive, platform) = (cfg.archive.clone(), platform.clone());
        tasks.push(Task::new("the archive schedule", move |stop| {
            scheduled_archive(archive, platform, stop)
        }));
    }
    if !cfg.reconcile.every.is_zero() {
        let (cfg, platform) = (cfg.clone(), platform.clone());
        tasks.push(Task::new("the reconcile schedule", move |stop| {
            scheduled_reconcile(cfg, platform, stop)
        }));
    }
    let running = crate::pipeline::start_observed(
        &cfg,
        platform.clone(),
        shutdown.clone(),
        metrics.as_ref().map(|m| m.pipeline.clone()),
        tasks,
    )
    .await
    .context("walhook could not start")?;
    // The API starts after the pipeline, so the event-type catalog holds
    // this config's types before the first request.
    let api = match &metrics {
        Some(metrics) => {
            metrics.register_collector(Box::new(PipelineCollector::new(
                running.counters.clone(),
                running.directory.clone(),
            )));
            // A pool of its own: API traffic cannot take the connections
            // fan-out and dispatch need.
            let spawned = match super::api::platform(&cfg) {
                Ok(api_platform) => {
                    super::api::spawn(&cfg, api_platform, metrics.clone(), shutdown.clone()).await
                }
                Err(e) => Err(e),
            };
            match spawned {
                Ok(task) => Some(task),
                Err(e) => {
                    // Stop the stages cleanly before reporting.
                    shutdown.cancel();
                    let _ = running.wait().await;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    tracing::info!(source = %cfg.source.name, slot = %cfg.source.slot, "walhook is running");
    let result = running.wait().await;
    // A stage that failed for good stops the process, API included.
    shutdown.cancel();
    if let Some(api) = api {
        let _ = api.await;
    }
    result?;
    tracing::info!("walhook stopped");
    Ok(ExitCode::SUCCESS)
}

/// `[archive] every`: archives due days a minute after start, then at that
/// interval, until the process stops (`walhook_archive::schedule`). A failed round
/// is logged and retried at the next one; the hot rows stay until a round
/// succeeds (see `walhook_archive::archiver`).
async fn scheduled_archive(
    cfg: crate::config::ArchiveConfig,
    platform: walhook_sql::Platform,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let open = || {
        let cfg = &cfg;
        async move { cfg.open_store().await.map_err(|e| format!("{e:#}")) }
    };
    walhook_archive::schedule::run_every(
        cfg.every,
        cfg.settings(),
        platform,
        open,
        &walhook_archive::schedule::SystemClock,
        shutdown.cancelled(),
        |_| {},
    )
    .await;
}

/// `[reconcile] every`: reconciles the rolling window `[reconcile] window`
/// that ended `settle` ago, first after `every` (at most 15 minutes), then at
/// that interval, until shutdown. Each run is stored (GET
/// /v1/reconciliations, the `walhook_reconcile_*` metrics); gaps are logged
/// as errors; `repair = true` repairs what it can.
#[allow(clippy::disallowed_methods)] // bare spawn: each round in a task of its own so that a panic is logged; the schedule awaits it
async fn scheduled_reconcile(
    cfg: Config,
    platform: walhook_sql::Platform,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let rc = cfg.reconcile.clone();
    let mut wait = rc.every.min(std::time::Duration::from_secs(15 * 60));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = rc.every;
        let store = match cfg.archive.open_store().await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(
                    error = format!("{e:#}"),
                    "cannot open the archive store; reconciling without reading archived days"
                );
                None
            }
        };
        let window =
            walhook_reconcile::Window::rolling(std::time::SystemTime::now(), rc.window, rc.settle);
        let request = walhook_reconcile::Request {
            window,
            tenant: None,
            repair: rc.repair,
        };
        let settings = rc.settings(&cfg.source, cfg.retry.deadline);
        let reconciler = walhook_reconcile::Reconciler::new(platform.clone(), store, settings);
        let report_dir = rc.report_dir.clone();
        let round_platform = platform.clone();
        // A run in a task of its own: a panic is logged and the next run
        // still happens.
        let round = tokio::spawn(async move {
            let started = std::time::SystemTime::now();
            let report = reconciler
                .run(&request, &walhook_reconcile::reconciler::Silent)
                .await?;
            let id = super::reconcile::store_run(
                &round_platform,
                &request,
                &report,
                "scheduled",
                started,
            )
            .await?;
            if let Some(dir) = &report_dir {
                super::reconcile::write_reports(dir, &report)?;
            }
            anyhow::Ok((id, report))
        });
        match round.await {
            Ok(Ok((id, report))) if report.clean => {
                tracing::info!(
                    reconciliation = id,
                    since = %report.parameters.since,
                    until = %report.parameters.until,
                    events = report.funnel.events,
                    deliveries = report.funnel.materialised_deliveries,
                    repaired = report.repaired_count(),
                    "reconciled: clean"
                )
            }
            Ok(Ok((id, report))) => tracing::error!(
                reconciliation = id,
                since = %report.parameters.since,
                until = %report.parameters.until,
                gaps = report.open_gaps(),
                classes = %serde_json::to_string(&report.gap_counts).unwrap_or_default(),
                "reconciliation found gaps; see GET /v1/reconciliations/{id}"
            ),
            Ok(Err(e)) => tracing::error!(
                error = format!("{e:#}"),
                "the reconciliation failed; trying again at the next run"
            ),
            Err(e) => tracing::error!(
                error = %e,
                "the reconciliation panicked; trying again at the next run"
            ),
        }
    }
}
