//! `walhook dispatch`: a dispatcher node alone, next to the `walhook run`
//! (or other nodes) that share its platform database.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use walhook_connectors::http::HttpEgress;
use walhook_pipeline::dispatch::Dispatcher;
use walhook_pipeline::endpoint::RefreshSettings;

use crate::config::Config;

/// Arguments of `walhook dispatch`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:
  walhook dispatch --config walhook.toml --node-id dispatch-2

A dispatcher node without capture or fan-out: it claims what is due and
held by no live node (retries handed back, deliveries of a node whose
lease lapsed, replays, fan-out plans of a lapsed node), sends, and records
under its own lease; a result that comes back after its lease moved on is
kept as history and never changes the delivery. Every process needs its
own node id.

With [log] dispatch = \"by-endpoint\" (Fluvio) it is a member of the
dispatch group instead: it joins the group in the platform database, reads
its share of the deliveries topic's partitions, and runs a dispatcher for
each (node <node id>-p<partition>.<token>) that sends that partition's
endpoints' deliveries, so each endpoint's in-flight cap, rate limit and
circuit are decided by one member. Start as many as there are partitions
([log] deliveries_partitions); partitions move when a member joins, leaves
or stops renewing. See docs/scale-out.md.")]
pub struct Args {
    /// The config file: [platform], [secrets], [dispatch], [retry],
    /// [breaker] and [egress] are read.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// This node's id, instead of [dispatch] node_id: unique among the
    /// running processes, stable across restarts of this one.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Serve Prometheus metrics of this process at http://ADDR/metrics
    /// (and /healthz), for example 127.0.0.1:9464. No token is asked for and
    /// the labels name tenants and endpoints: keep it on loopback.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<String>,
}

/// Runs until SIGINT/SIGTERM, then drains attempts in flight and exits.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    cfg.warn_unauthenticated_databases(false);
    if let Some(routes) = cfg.log.routes()? {
        return run_member(&cfg, &args, routes).await;
    }
    let mut settings = crate::pipeline::dispatch_settings(&cfg);
    if let Some(id) = args.node_id {
        settings.node_id = super::fanout::check_node_id(&id)?;
    }
    let keyring = cfg
        .secrets
        .keyring()
        .context("walhook dispatch needs the master key that seals endpoint secrets")?;
    let platform = Arc::new(cfg.platform()?.platform()?.with_keyring(keyring));
    platform.check().await.context(
        "the platform database is not ready: check that Postgres runs at [platform].url and that `walhook migrate` was run",
    )?;
    let directory = crate::pipeline::load_directory(&platform).await?;
    let shutdown = super::shutdown_on_signals();
    let refresh_stop = CancellationToken::new();
    let refresher = {
        let (directory, platform, stop) =
            (directory.clone(), (*platform).clone(), refresh_stop.clone());
        tokio::spawn(async move {
            directory
                .refresh(platform, RefreshSettings::default(), stop)
                .await
        })
    };
    let node = settings.node_id.clone();
    let counters = Arc::new(crate::pipeline::Counters::default());
    let metrics = super::stage_metrics(args.metrics_listen.as_deref(), &shutdown).await?;
    let mut dispatcher = Dispatcher::new(
        Arc::new(HttpEgress::new(cfg.egress.clone())?),
        platform,
        directory.clone(),
        settings,
        counters.dispatch.clone(),
    );
    if let Some(m) = &metrics {
        dispatcher = dispatcher.with_observer(Arc::new(
            walhook_pipeline::metrics::MetricsObserver::new(m.pipeline.clone()),
        ));
        m.register_collector(Box::new(crate::metrics::PipelineCollector::new(
            counters, directory,
        )));
    }
    // No log feeds this node: everything it sends it claims from Postgres.
    // The sender stays open, or the dispatcher would take its close for
    // the end of its work.
    let (_jobs, jobs_rx) = tokio::sync::mpsc::channel(1);
    tracing::info!(node = %node, "dispatcher node running");
    let result = dispatcher.run(jobs_rx, shutdown).await;
    refresh_stop.cancel();
    let _ = refresher.await;
    result.context("dispatch stopped")?;
    tracing::info!(node = %node, "dispatcher node stopped");
    Ok(ExitCode::SUCCESS)
}

/// `[log] dispatch = "by-endpoint"`: joins the dispatch group of the
/// deliveries topic and runs a dispatcher for each partition it holds.
async fn run_member(
    cfg: &Config,
    args: &Args,
    routes: Arc<walhook_pipeline::routing::Routes>,
) -> anyhow::Result<ExitCode> {
    let keyring = cfg
        .secrets
        .keyring()
        .context("walhook dispatch needs the master key that seals endpoint secrets")?;
    let platform = cfg.platform()?.platform()?.with_keyring(keyring);
    let leased = crate::pipeline::join_group(
        cfg,
        &platform,
        &cfg.log.deliveries_topic(),
        walhook_pipeline::routing::DISPATCH_GROUP,
        cfg.log.deliveries_partitions,
    )
    .await?;
    let node_id = match &args.node_id {
        Some(id) => super::fanout::check_node_id(id)?,
        None => format!("{}-dispatch-{}", cfg.dispatch.node_id, leased.member.slot),
    };
    tracing::info!(node = %node_id, slot = leased.member.slot, "dispatch member starting");
    let roles = crate::pipeline::Roles {
        capture: false,
        workers: None,
        dispatch: Some(crate::pipeline::DispatchRole {
            leased,
            node_id,
            routes,
        }),
    };
    super::run_stages(
        cfg,
        platform,
        roles,
        args.metrics_listen.as_deref(),
        "dispatch",
    )
    .await
}
