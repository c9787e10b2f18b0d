//! `walhook api`: the control-plane REST API alone (also served by
//! `walhook run` when the config has `[api]`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use walhook_api::{ApiState, Metrics};
use walhook_sql::Platform;

use crate::config::{ApiConfig, Config};

/// Arguments of `walhook api`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file (see walhook.example.toml); needs [platform] and
    /// [api].
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
}

/// The `[api]` section, or an error saying how to add it.
pub fn section(cfg: &Config) -> anyhow::Result<&ApiConfig> {
    cfg.api.as_ref().context(
        "the config has no [api] section: add [api] with listen = \"127.0.0.1:8080\" and set \
         WALHOOK_API_OPERATOR_TOKEN (see walhook.example.toml)",
    )
}

/// The API's own pool on the platform database (`[api].max_connections`
/// connections with `[api].statement_timeout`), apart from the pipeline's
/// so that API traffic cannot starve fan-out and dispatch, with the
/// keyring that seals endpoint secrets.
pub fn platform(cfg: &Config) -> anyhow::Result<Platform> {
    let api = section(cfg)?;
    let p = cfg.platform()?;
    let keyring = cfg
        .secrets
        .keyring()
        .context("the API needs the master key that seals endpoint secrets")?;
    Ok(walhook_api::connect(&p.connect_options()?, &api.limits())?.with_keyring(keyring))
}

/// Binds `[api].listen` (and `[api].metrics_listen`, unless "off") and
/// serves until `shutdown`, in a task, on `platform` (the API's own pool:
/// [`platform`]). Both addresses are bound before anything is served, so a
/// busy port is a start error naming its setting.
#[allow(clippy::disallowed_methods)] // bare spawn: the API server's task is awaited by the command that starts it
pub async fn spawn(
    cfg: &Config,
    platform: Platform,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let api = section(cfg)?;
    let listener = TcpListener::bind(&api.listen).await.with_context(|| {
        format!(
            "cannot listen on [api].listen = {:?}; is the port free?",
            api.listen
        )
    })?;
    let addr = listener.local_addr()?;
    let metrics_listener = match api.metrics_listen() {
        Some(listen) => Some(TcpListener::bind(listen).await.with_context(|| {
            format!(
                "cannot listen on [api].metrics_listen = {listen:?}; is the port free? Give \
                 another address, or \"off\" to serve /metrics only on [api].listen (with a token)"
            )
        })?),
        None => None,
    };
    let mut state = ApiState::new(platform.clone(), api.settings(cfg), metrics);
    // Archived history: the store [archive] names (a local directory by
    // default). A store that cannot be opened leaves the API on the hot
    // tables alone, and says so.
    match cfg.archive.open_store().await {
        Ok(store) => {
            let limits = walhook_archive::cold::ColdLimits {
                reads_per_tenant: api.cold_reads_per_tenant,
                ..walhook_archive::cold::ColdLimits::default()
            };
            state = state
                .with_cold(Arc::new(walhook_archive::cold::ColdHistory::with_limits(
                    platform,
                    walhook_archive::cold::CountingStore::new(store),
                    cfg.archive.replay_window,
                    limits,
                )))
                .context("cannot start the threads that read archived history")?;
        }
        Err(e) => tracing::warn!(
            error = format!("{e:#}"),
            "the archive's store cannot be opened: the API serves the hot tables only, and archived deliveries answer 404"
        ),
    }
    tracing::info!(%addr, "the API is listening");
    if let Some(l) = &metrics_listener {
        let metrics_addr = l.local_addr()?;
        if !metrics_addr.ip().is_loopback() {
            tracing::warn!(
                addr = %metrics_addr,
                "[api].metrics_listen is not loopback: anyone who can reach it reads tenant and endpoint metrics without a token"
            );
        }
        tracing::info!(addr = %metrics_addr, "serving /metrics without a token ([api].metrics_listen)");
    }
    Ok(tokio::spawn(async move {
        let served = walhook_api::serve(listener, state.clone(), shutdown.clone());
        let metrics = async {
            match metrics_listener {
                Some(l) => walhook_api::serve_metrics(l, state, shutdown).await,
                None => Ok(()),
            }
        };
        let (served, metrics) = tokio::join!(served, metrics);
        if let Err(e) = served {
            tracing::error!(error = %e, "the API stopped");
        }
        if let Err(e) = metrics {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    }))
}

/// Serves until SIGINT/SIGTERM.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    cfg.warn_unauthenticated_databases(false);
    let platform = platform(&cfg)?;
    platform.check().await.context(
        "the platform database is not ready: check that Postgres runs at [platform].url and that `walhook migrate` was run",
    )?;
    // The rules' event types, from the config: in a split deployment the
    // API may start before capture ever ran, and endpoint creation checks
    // subscriptions against the catalog.
    platform
        .upsert_event_types(
            &cfg.source.name,
            &walhook_connectors::postgres::rule_event_types(&cfg.rules),
        )
        .await
        .context("cannot register the rules' event types in the catalog")?;
    let shutdown = super::shutdown_on_signals();
    let task = spawn(&cfg, platform, Arc::new(Metrics::new()), shutdown).await?;
    task.await.context("the API task panicked")?;
    tracing::info!("the API stopped");
    Ok(ExitCode::SUCCESS)
}
