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
    /// Check the config file (syntax, every section's settings, the rules
    /// without a database, the database URLs and the master key) and exit:
    /// 0 when walhook run would accept it. Touches no database; the
    /// systemd unit's `reload` runs this (a restart applies the file).
    #[arg(long)]
    pub check_config: bool,
}

/// Runs until SIGINT/SIGTERM, then stops intake, drains in-flight attempts
/// (up to [dispatch].drain_timeout) and exits.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cfg = Config::load(&args.config)?;
    if args.check_config {
        cfg.platform()?;
        cfg.source.connect_options()?;
        cfg.secrets
            .keyring()
            .context("walhook run needs the master key that seals endpoint secrets")?;
        println!(
            "{}: walhook run accepts it ({} rules); restart walhook to apply it",
            args.config.display(),
            cfg.rules.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
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
/// that ended `settle` ago at that interval until the process stops
/// (`walhook_reconcile::schedule`). Each run is stored (GET
/// /v1/reconciliations, the `walhook_reconcile_*` metrics); gaps are logged
/// as errors; `repair = true` repairs what it can.
async fn scheduled_reconcile(
    cfg: Config,
    platform: walhook_sql::Platform,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let rc = &cfg.reconcile;
    let schedule = walhook_reconcile::schedule::Schedule {
        every: rc.every,
        window: rc.window,
        settle: rc.settle,
        repair: rc.repair,
        report_dir: rc.report_dir.clone(),
        settings: rc.settings(&cfg.source, cfg.retry.deadline),
    };
    let open = || {
        let cfg = &cfg.archive;
        async move { cfg.open_store().await.map_err(|e| format!("{e:#}")) }
    };
    walhook_reconcile::schedule::run_every(schedule, platform, open, shutdown.cancelled()).await;
}
