//! Mapping the configuration onto the runtime (`walhook_pipeline::runtime`).
//!
//! Each command hands over its [`Roles`]; this module prepares what needs
//! the outside world (the Postgres source, checked first as `walhook
//! doctor` does; the HTTP egress; the embedded or Fluvio log `[log] kind`
//! names; the endpoint directory) and starts a
//! [`walhook_pipeline::runtime::Process`], which supervises every role
//! and stops them in order.

use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use walhook_connectors::fluvio::FluvioLog;
use walhook_connectors::http::HttpEgress;
use walhook_connectors::postgres::{CaptureError, PostgresSource};
use walhook_pipeline::dispatch::DispatchSettings;
use walhook_pipeline::endpoint::SubscriptionCache;
use walhook_pipeline::fanout::FanoutSettings;
use walhook_pipeline::log::embedded::EmbeddedLog;
use walhook_pipeline::membership::MembershipCounters;
use walhook_pipeline::metrics::PipelineMetrics;
use walhook_pipeline::runtime::{
    self, CaptureRole, LogControl, Process, ProcessSettings, Share, Task,
};
pub use walhook_pipeline::runtime::{Counters, DispatchRole, Running, WorkerRole};
use walhook_sql::Platform;

use crate::config::{Config, LogKind};

/// Starts every stage; `shutdown` stops them in order.
pub async fn start(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    start_observed(cfg, platform, shutdown, None, Vec::new()).await
}

/// [`start`], feeding `metrics` (capture lag, attempts, first-attempt
/// latency) when given, with `tasks` (the archive and reconcile schedules)
/// beside the stages.
pub async fn start_observed(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
    metrics: Option<Arc<PipelineMetrics>>,
    tasks: Vec<Task>,
) -> anyhow::Result<Running> {
    let routes = cfg.log.routes()?;
    let dispatch = match &routes {
        Some(routes) => Some(DispatchRole::Member {
            leased: join_group(
                cfg,
                &platform,
                &cfg.log.deliveries_topic(),
                walhook_pipeline::routing::DISPATCH_GROUP,
                cfg.log.deliveries_partitions,
            )
            .await?,
            node_id: cfg.dispatch.node_id.clone(),
            routes: routes.clone(),
        }),
        None => None,
    };
    let roles = Roles {
        capture: true,
        workers: Some(WorkerRole {
            share: Share::Fixed((0..cfg.log.events_partitions).collect()),
            node_id: cfg.dispatch.node_id.clone(),
            route: routes.map(|r| (r, cfg.log.deliveries_topic())),
        }),
        dispatch,
        tasks,
    };
    start_roles(cfg, platform, shutdown, metrics, roles).await
}

/// Joins `group` of `topic` (`partitions` partitions) in the platform
/// database, as this host and process.
pub async fn join_group(
    cfg: &Config,
    platform: &Platform,
    topic: &str,
    group: &str,
    partitions: u32,
) -> anyhow::Result<runtime::Leased> {
    use walhook_pipeline::membership::{MembershipSettings, MembershipStore};
    let settings = MembershipSettings {
        topic: topic.to_owned(),
        group: group.to_owned(),
        partitions,
        lease: cfg.log.member_lease,
    };
    let member = platform
        .join(&settings.key(), &holder(), settings.partitions, settings.lease)
        .await
        .map_err(|e| match refusal(&e) {
            Some(why) => anyhow::anyhow!("{why}"),
            None => anyhow::Error::new(e).context(format!(
                "could not join the {group} group in the platform database (was `walhook migrate` run?)"
            )),
        })?;
    tracing::info!(
        slot = member.slot,
        epoch = member.epoch,
        group = %settings.key(),
        lease = ?settings.lease,
        "joined the {group} group"
    );
    Ok(runtime::Leased {
        store: Arc::new(platform.clone()),
        member,
        lease: settings.lease,
        counters: Arc::new(MembershipCounters::new(&settings.key(), member)),
    })
}

/// This process, as the members' table names it: host and pid.
pub fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "an unnamed host".into());
    format!("{host} pid {}", std::process::id())
}

/// The platform database's refusal inside a store error, if it is one.
fn refusal(e: &walhook_pipeline::store::StoreError) -> Option<&str> {
    match std::error::Error::source(e)?.downcast_ref::<walhook_sql::StoreError>()? {
        walhook_sql::StoreError::Refused(why) => Some(why),
        _ => None,
    }
}

/// Which stages a process runs.
#[derive(Debug)]
pub struct Roles {
    /// Capture (the business database's slot → the events topic).
    pub capture: bool,
    /// Fan-out of some events partitions and their dispatcher.
    pub workers: Option<WorkerRole>,
    /// Dispatch alone: a member of the dispatch group on the deliveries
    /// topic, or a dispatcher node fed by no log.
    pub dispatch: Option<DispatchRole>,
    /// Scheduled jobs beside the stages.
    pub tasks: Vec<Task>,
}

/// The topics of `[log]`: the events topic, then the deliveries topic when
/// dispatch goes by endpoint (Fluvio only).
pub fn log_topics(cfg: &Config) -> Vec<walhook_pipeline::log::TopicSpec> {
    let mut topics = vec![runtime::events_topic(
        &cfg.log.events_topic(),
        cfg.log.events_partitions,
        cfg.log.capacity,
    )];
    if cfg.log.kind == LogKind::Fluvio && cfg.log.dispatch == crate::config::LogDispatch::ByEndpoint
    {
        topics.push(walhook_pipeline::log::TopicSpec {
            name: cfg.log.deliveries_topic(),
            partitions: cfg.log.deliveries_partitions,
            capacity: cfg.log.capacity,
            durable_groups: vec![walhook_pipeline::routing::DISPATCH_GROUP.into()],
        });
    }
    topics
}

/// Starts the stages of `roles` on the log `[log] kind` names.
pub async fn start_roles(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
    metrics: Option<Arc<PipelineMetrics>>,
    roles: Roles,
) -> anyhow::Result<Running> {
    if !roles.capture
        && roles.workers.is_none()
        && matches!(roles.dispatch, Some(DispatchRole::Node { .. }))
    {
        // A dispatcher node reads no log: it claims from Postgres.
        let log = EmbeddedLog::new(Vec::new());
        return start_on(cfg, platform, shutdown, metrics, roles, log).await;
    }
    let mut topics = log_topics(cfg);
    match cfg.log.kind {
        LogKind::Embedded => {
            anyhow::ensure!(
                roles.capture && roles.workers.is_some(),
                "the embedded log lives inside one process: run every stage with `walhook run`"
            );
            let log = EmbeddedLog::new([topics.remove(0)]);
            start_on(cfg, platform, shutdown, metrics, roles, log).await
        }
        LogKind::Fluvio => {
            if let Some(warning) = cfg.log.exposure() {
                tracing::warn!("{warning}");
            }
            let log = FluvioLog::connect(cfg.log.fluvio_settings(), topics)
                .await
                .map_err(anyhow::Error::new)
                .context("cannot open the Fluvio log ([log] kind = \"fluvio\")")?;
            start_on(cfg, platform, shutdown, metrics, roles, log).await
        }
    }
}

/// `walhook doctor`'s checks of the captured database, read-only, before
/// capture prepares anything: the first that fails stops the start, named
/// with its fix (capture's own checks would stop at a later point, some
/// only once the stream opened).
async fn preflight(cfg: &Config) -> anyhow::Result<()> {
    use walhook_connectors::postgres::preflight::{Verdict, check_source};
    let findings = check_source(&cfg.source, &cfg.rules).await;
    if let Some(f) = findings.iter().find(|f| f.verdict == Verdict::Fail) {
        anyhow::bail!(
            "capture cannot start: {} ({}){}; `walhook doctor --config FILE` checks everything at once",
            f.detail,
            f.check,
            f.fix
                .as_deref()
                .map(|fix| format!("; fix: {fix}"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The capture source, resuming from the platform's checkpoint: a slot
/// that is gone after this source read from it stops capture, unless the
/// operator accepted the loss (`--accept-slot-loss`), which records the gap
/// as a capture incident and lets a new slot start.
async fn prepare_source(cfg: &Config, platform: &Platform) -> anyhow::Result<PostgresSource> {
    let name = &cfg.source.name;
    let read_up_to = platform
        .capture_position(name)
        .await
        .context("could not read how far capture read before")?;
    match PostgresSource::prepare_resuming(cfg.source.clone(), cfg.rules.clone(), read_up_to).await
    {
        Err(CaptureError::SlotGone { read_up_to, .. }) if cfg.accept_slot_loss => {
            platform
                .reset_capture_position(name, &cfg.source.slot, read_up_to)
                .await
                .context("could not record the slot's loss")?;
            tracing::warn!(
                source = %name,
                slot = %cfg.source.slot,
                %read_up_to,
                "the slot was gone; loss accepted (--accept-slot-loss): recorded as a slot_reset capture incident, capture starts from a new slot"
            );
            Ok(PostgresSource::prepare(cfg.source.clone(), cfg.rules.clone()).await?)
        }
        other => {
            if cfg.accept_slot_loss && other.is_ok() {
                tracing::info!(
                    "--accept-slot-loss given, but the slot is there: nothing was reset"
                );
            }
            Ok(other?)
        }
    }
}

async fn start_on<L: LogControl>(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
    metrics: Option<Arc<PipelineMetrics>>,
    roles: Roles,
    log: L,
) -> anyhow::Result<Running> {
    platform.check().await.context(
        "the platform database is not ready: check that Postgres runs at [platform].url and that `walhook migrate` was run",
    )?;
    let capture = if roles.capture {
        preflight(cfg).await?;
        let source = prepare_source(cfg, &platform)
            .await?
            .with_schema_catalog(Arc::new(platform.schema_catalog(&cfg.source.name)));
        platform
            .upsert_event_types(&cfg.source.name, source.event_types())
            .await?;
        Some(CaptureRole {
            source,
            slot: cfg.source.slot.clone(),
        })
    } else {
        None
    };
    // Capture alone needs no endpoints (nor the master key); a key missing
    // at start-up is a configuration mistake, not one broken endpoint.
    let sends = roles.workers.is_some() || roles.dispatch.is_some();
    let (egress, directory) = if sends {
        (
            Some(Arc::new(HttpEgress::new(cfg.egress.clone())?)),
            Some(load_directory(&platform).await?),
        )
    } else {
        (None, None)
    };
    let process = Process {
        log,
        store: Arc::new(platform),
        egress,
        directory,
        capture,
        workers: roles.workers,
        dispatch: roles.dispatch,
        settings: process_settings(cfg),
        metrics,
        tasks: roles.tasks,
    };
    Ok(process.start(shutdown).await?)
}

/// The stages' topics and settings from `[log]`, `[fanout]`, `[dispatch]`,
/// `[breaker]` and `[retry]`.
fn process_settings(cfg: &Config) -> ProcessSettings {
    ProcessSettings {
        events_topic: cfg.log.events_topic(),
        deliveries_topic: cfg.log.deliveries_topic(),
        deliveries_partitions: cfg.log.deliveries_partitions,
        capacity: cfg.log.capacity,
        fanout: FanoutSettings {
            batch_size: cfg.fanout.batch_size,
            linger: cfg.fanout.linger,
            deadline: cfg.retry.deadline,
            lease_owner: None,
            lease: cfg.dispatch.lease,
            route: None,
        },
        dispatch: dispatch_settings(cfg),
    }
}

/// The dispatcher's settings from `[dispatch]`, `[breaker]` and `[retry]`.
pub fn dispatch_settings(cfg: &Config) -> DispatchSettings {
    DispatchSettings {
        node_id: cfg.dispatch.node_id.clone(),
        max_in_flight: cfg.dispatch.max_in_flight,
        endpoint_max_in_flight: cfg.dispatch.endpoint_max_in_flight,
        tenant_max_in_flight: cfg.dispatch.tenant_max_in_flight,
        endpoint_max_queued: cfg.dispatch.endpoint_max_queued,
        disable_after: cfg.dispatch.disable_after,
        breaker: cfg.breaker.clone(),
        retry: cfg.retry.clone(),
        lease: cfg.dispatch.lease,
        sweep_interval: cfg.dispatch.sweep_interval,
        drain_timeout: cfg.dispatch.drain_timeout,
        ..DispatchSettings::default()
    }
}

/// Loads the endpoint directory and refuses to run when a master key that
/// sealed secrets is missing (a configuration mistake, not one broken
/// endpoint).
pub async fn load_directory(platform: &Platform) -> anyhow::Result<Arc<SubscriptionCache>> {
    let directory = Arc::new(SubscriptionCache::default());
    directory
        .load(platform)
        .await
        .context("cannot load endpoints")?;
    if let Some(key) = directory.snapshot().missing_keys().first() {
        anyhow::bail!(
            "endpoint secrets are sealed under master key {key}, which is not configured: add that key to \
             [secrets].old_key_files (or WALHOOK_OLD_MASTER_KEYS) until `walhook secrets rotate` has re-sealed every row"
        );
    }
    Ok(directory)
}
