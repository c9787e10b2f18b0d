//! `walhook dispatch`: a dispatcher node alone, next to the `walhook run`
//! (or other nodes) that share its platform database.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;
use crate::pipeline::DispatchRole;

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
    let keyring = cfg
        .secrets
        .keyring()
        .context("walhook dispatch needs the master key that seals endpoint secrets")?;
    let platform = cfg.platform()?.platform()?.with_keyring(keyring);
    let node_id = args
        .node_id
        .as_deref()
        .map(super::fanout::check_node_id)
        .transpose()?;
    let role = match cfg.log.routes()? {
        // `[log] dispatch = "by-endpoint"`: a member of the dispatch group
        // of the deliveries topic, a dispatcher for each partition it holds.
        Some(routes) => {
            let leased = crate::pipeline::join_group(
                &cfg,
                &platform,
                &cfg.log.deliveries_topic(),
                walhook_pipeline::routing::DISPATCH_GROUP,
                cfg.log.deliveries_partitions,
            )
            .await?;
            let node_id = node_id.unwrap_or_else(|| {
                format!("{}-dispatch-{}", cfg.dispatch.node_id, leased.member.slot)
            });
            tracing::info!(node = %node_id, slot = leased.member.slot, "dispatch member starting");
            DispatchRole::Member {
                leased,
                node_id,
                routes,
            }
        }
        None => {
            let node_id = node_id.unwrap_or_else(|| cfg.dispatch.node_id.clone());
            tracing::info!(node = %node_id, "dispatcher node starting");
            DispatchRole::Node { node_id }
        }
    };
    let roles = crate::pipeline::Roles {
        capture: false,
        workers: None,
        dispatch: Some(role),
        tasks: Vec::new(),
    };
    super::run_stages(
        &cfg,
        platform,
        roles,
        args.metrics_listen.as_deref(),
        "dispatch",
    )
    .await
}
