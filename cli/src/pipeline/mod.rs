//! Wiring the stages of a process onto the log `[log] kind` names.
//!
//! ```text
//!  capture ──▶ events (embedded or Fluvio) ──▶ fan-out ×P ──▶ deliveries (in-process) ──▶ dispatcher
//!     ▲                                           │
//!     └── receipt: embedded: fan-out committed to Postgres; Fluvio: stored by the cluster
//! ```
//!
//! `walhook run` runs every stage; on Fluvio, `walhook capture` runs
//! capture alone and `walhook fanout --member I/N` a worker group (fan-out
//! of its share of the events partitions and their dispatcher). The worker
//! runtime is `walhook_pipeline::runtime`; this module adds what needs the
//! connectors (capture from Postgres, the HTTP egress, the Fluvio client)
//! and the configuration.
//!
//! With metrics ([`start_observed`]), capture reports its lag, and the
//! dispatcher tells an observer about every attempt (see `crate::metrics`).
//!
//! The log is closed after a failure and a Fluvio cluster is watched
//! (`cluster.rs`).
//!
//! Every long-lived task (fan-out per partition, the forwarders, dispatch,
//! the directory refresher, the checkpoint writer) runs under a
//! [`Supervisor`]: if one ends, fails or panics while the process runs, the
//! process stops in order and exits with an error naming it; nothing is
//! lost, since everything not yet durable is read again after the restart.
//!
//! Shutdown goes upstream first: capture stops reading and waits for its
//! receipts, fan-out then finishes its batch, and dispatch drains the
//! attempts in flight. What is left is pending in Postgres and is claimed
//! again at the next start.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use walhook_connectors::fluvio::FluvioLog;
use walhook_connectors::http::HttpEgress;
use walhook_connectors::postgres::{CaptureError, CaptureObserver, PostgresSource, RunOptions};
use walhook_pipeline::capture::{Incident, LedgerSink, LogSink, RecordingSink};
use walhook_pipeline::dispatch::observe::AttemptObserver;
use walhook_pipeline::dispatch::{DispatchCounters, DispatchSettings};
use walhook_pipeline::endpoint::{RefreshSettings, SubscriptionCache};
use walhook_pipeline::event::Event;
use walhook_pipeline::failpoint;
use walhook_pipeline::fanout::{FanoutCounters, FanoutSettings};
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::log::embedded::EmbeddedLog;
use walhook_pipeline::log::{Log, Producer};
use walhook_pipeline::membership::MembershipCounters;
use walhook_pipeline::metrics::{MetricsObserver, PipelineMetrics};
use walhook_pipeline::runtime::{self, Share, WorkerCounters, WorkerSettings, Workers};
use walhook_pipeline::supervise::{Stopped, Supervisor};
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

use self::cluster::Closable;
use crate::config::{Config, LogKind};

mod cluster;

/// Capture's counters.
#[derive(Debug, Default)]
pub struct CaptureCounters {
    /// Transactions read.
    pub transactions: std::sync::atomic::AtomicU64,
    /// Row changes read.
    pub changes: std::sync::atomic::AtomicU64,
    /// Events handed on.
    pub events: std::sync::atomic::AtomicU64,
    /// Incidents.
    pub incidents: std::sync::atomic::AtomicU64,
}

/// Counters of a running pipeline.
#[derive(Debug, Default)]
pub struct Counters {
    /// Capture's.
    pub capture: Arc<CaptureCounters>,
    /// Fan-out's.
    pub fanout: Arc<FanoutCounters>,
    /// Dispatch's.
    pub dispatch: Arc<DispatchCounters>,
    /// The memberships of this process (fan-out without `--member`, the
    /// dispatch members of `[log] dispatch = "by-endpoint"`).
    pub memberships: Vec<Arc<MembershipCounters>>,
}

/// A running pipeline.
pub struct Running {
    /// Its counters.
    pub counters: Arc<Counters>,
    /// The endpoint directory it reads.
    pub directory: Arc<SubscriptionCache>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Waits for the pipeline to end (after its shutdown token was
    /// cancelled, or on a definite error).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("the pipeline task panicked")?
    }
}

/// Writes capture checkpoints (at most twice a second), counts what capture
/// sees and feeds its metrics. Incidents are stored by the capture sink
/// ([`RecordingSink`]) before the slot can move past them, and the capture
/// ledger by [`LedgerSink`] once the events it counts are durable, not
/// here.
struct PlatformObserver {
    confirmed: tokio::sync::watch::Sender<Lsn>,
    /// The slot's latest lag, bytes (-1 until known), saved with the next
    /// checkpoint so that `walhook api` can show it.
    slot_lag: Arc<std::sync::atomic::AtomicI64>,
    counters: Arc<CaptureCounters>,
    metrics: Option<Arc<PipelineMetrics>>,
}

impl CaptureObserver for PlatformObserver {
    fn confirmed(&self, lsn: Lsn) {
        self.confirmed.send_replace(lsn);
    }
    fn transaction(&self, tx: &walhook_pipeline::capture::CapturedTransaction) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.transactions.fetch_add(1, Relaxed);
        self.counters
            .changes
            .fetch_add(u64::from(tx.change_count), Relaxed);
        self.counters
            .events
            .fetch_add(tx.events.len() as u64, Relaxed);
        if let Some(m) = &self.metrics {
            let lag = Timestamp::now().since(tx.commit_time);
            m.capture_lag.set(lag.as_secs_f64());
        }
    }
    fn slot_lag(&self, lag_bytes: i64) {
        self.slot_lag
            .store(lag_bytes, std::sync::atomic::Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.slot_lag_bytes.set(lag_bytes);
        }
    }
    fn incident(&self, _incident: &Incident) {
        self.counters
            .incidents
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Saves capture checkpoints until `stop` (when capture ends first, its
/// last position is saved and the writer waits for `stop`, so that its end
/// is never mistaken for a failure).
async fn save_checkpoints(
    platform: Arc<Platform>,
    source: String,
    slot: String,
    mut confirmed: tokio::sync::watch::Receiver<Lsn>,
    slot_lag: Arc<std::sync::atomic::AtomicI64>,
    stop: CancellationToken,
) -> Result<(), Stopped> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            changed = confirmed.changed() => {
                if changed.is_err() {
                    stop.cancelled().await;
                    return Ok(());
                }
            }
        }
        if failpoint::hit("capture.checkpoint") {
            return Ok(());
        }
        let lsn = *confirmed.borrow_and_update();
        // A checkpoint is informational (the slot is the truth): a failed
        // write is retried with the next position.
        let lag = slot_lag.load(std::sync::atomic::Ordering::Relaxed);
        let lag = (lag >= 0).then_some(lag);
        if let Err(e) = platform.save_checkpoint(&source, &slot, lsn, lag).await {
            tracing::warn!(error = %e, "could not save the capture checkpoint");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Starts every stage; `shutdown` stops them in order.
pub async fn start(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    start_observed(cfg, platform, shutdown, None).await
}

/// [`start`], feeding `metrics` (capture lag, attempts, first-attempt
/// latency) when given.
pub async fn start_observed(
    cfg: &Config,
    platform: Platform,
    shutdown: CancellationToken,
    metrics: Option<Arc<PipelineMetrics>>,
) -> anyhow::Result<Running> {
    let routes = cfg.log.routes()?;
    let dispatch = match &routes {
        Some(routes) => Some(DispatchRole {
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
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "an unnamed host".into());
    let holder = format!("{host} pid {}", std::process::id());
    let member = platform
        .join(&settings.key(), &holder, settings.partitions, settings.lease)
        .await
        .map_err(anyhow::Error::new)
        .with_context(|| {
            format!(
                "could not join the {group} group in the platform database (was `walhook migrate` run?)"
            )
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

/// Which stages a process runs.
#[derive(Debug)]
pub struct Roles {
    /// Capture (the business database's slot → the events topic).
    pub capture: bool,
    /// Fan-out of some events partitions and their dispatcher.
    pub workers: Option<WorkerRole>,
    /// A member of the dispatch group on the deliveries topic (`[log]
    /// dispatch = "by-endpoint"`).
    pub dispatch: Option<DispatchRole>,
}

/// A worker group's share of the events topic.
#[derive(Debug)]
pub struct WorkerRole {
    /// The events partitions read.
    pub share: Share,
    /// The dispatcher node id of the group.
    pub node_id: String,
    /// Fan-out alone, to the deliveries topic by these routes (`[log]
    /// dispatch = "by-endpoint"`).
    pub route: Option<(Arc<walhook_pipeline::routing::Routes>, String)>,
}

/// A member of the dispatch group: a dispatcher per deliveries partition
/// it holds.
pub struct DispatchRole {
    /// Its membership.
    pub leased: runtime::Leased,
    /// The base of its dispatchers' node ids (`<base>-p<partition>.<token>`).
    pub node_id: String,
    /// The routes (the fan-out members' own).
    pub routes: Arc<walhook_pipeline::routing::Routes>,
}

impl std::fmt::Debug for DispatchRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DispatchRole")
            .field("member", &self.leased.member)
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
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

async fn start_on<L: Log + Closable>(
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
    let source = if roles.capture {
        preflight(cfg).await?;
        let source = prepare_source(cfg, &platform)
            .await?
            .with_schema_catalog(Arc::new(platform.schema_catalog(&cfg.source.name)));
        platform
            .upsert_event_types(&cfg.source.name, source.event_types())
            .await?;
        Some(source)
    } else {
        None
    };
    let platform = Arc::new(platform);

    // Cancelled by the caller, or when a task fails or ends too early.
    let stop_all = shutdown.child_token();
    let failed = CancellationToken::new();
    let supervisor = Supervisor::new(failed.clone());

    // A key missing at start-up is a configuration mistake, not one broken
    // endpoint: refuse to run rather than quarantine every endpoint it
    // sealed.
    // Capture alone needs no endpoints (nor the master key).
    let refresh_stop = CancellationToken::new();
    let (directory, refresher) = if roles.workers.is_some() || roles.dispatch.is_some() {
        let directory = load_directory(&platform).await?;
        let (d, platform, stop) = (directory.clone(), (*platform).clone(), refresh_stop.clone());
        let refresher = supervisor.spawn("the endpoint directory refresher", async move {
            d.refresh(platform, RefreshSettings::default(), stop).await;
            Ok::<(), Stopped>(())
        });
        (directory, Some(refresher))
    } else {
        (Arc::new(SubscriptionCache::default()), None)
    };
    let counters = Arc::new(Counters {
        memberships: {
            let mut m = Vec::new();
            if let Some(WorkerRole {
                share: Share::Leased(leased),
                ..
            }) = &roles.workers
            {
                m.push(leased.counters.clone());
            }
            if let Some(d) = &roles.dispatch {
                m.push(d.leased.counters.clone());
            }
            m
        },
        ..Counters::default()
    });
    let watch_stop = CancellationToken::new();
    if let Some(watch) = log.watch(metrics.clone(), watch_stop.clone()) {
        supervisor.spawn("the Fluvio cluster watch", watch);
    }

    // Told about every attempt, and the requests' way out: shared by the
    // workers and the dispatch member.
    let observer = metrics
        .as_ref()
        .map(|m| Arc::new(MetricsObserver::new(m.clone())) as Arc<dyn AttemptObserver>);
    let egress = match (&roles.workers, &roles.dispatch) {
        (None, None) => None,
        _ => Some(Arc::new(HttpEgress::new(cfg.egress.clone())?)),
    };
    let workers = match (roles.workers, egress.clone()) {
        (Some(role), Some(egress)) => {
            let mut dispatch = dispatch_settings(cfg);
            dispatch.node_id = role.node_id.clone();
            let settings = WorkerSettings {
                events_topic: cfg.log.events_topic(),
                share: role.share,
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
                dispatch,
                observer: observer.clone(),
                route: role.route,
            };
            let worker_counters = WorkerCounters {
                fanout: counters.fanout.clone(),
                dispatch: counters.dispatch.clone(),
            };
            // Boxed: the start's future is large, and nesting it in the
            // select below inline overflows the compiler's layout queries.
            let starting = Box::pin(Workers::start(
                &log,
                egress,
                platform.clone(),
                directory.clone(),
                settings,
                &worker_counters,
                &supervisor,
            ));
            // Opening the partitions waits for their leaders; a task that
            // fails meanwhile (the cluster watch giving up) ends the start.
            tokio::select! {
                started = starting => Some(started?),
                _ = failed.cancelled() => {
                    return Err(match supervisor.take_failure() {
                        Some(e) => anyhow::Error::new(e),
                        None => anyhow::anyhow!("a task failed while the workers started"),
                    });
                }
            }
        }
        _ => None,
    };

    // The dispatch member: a dispatcher per deliveries partition it holds.
    let dispatch_members = match (roles.dispatch, egress) {
        (Some(role), Some(egress)) => {
            let mut settings = dispatch_settings(cfg);
            settings.node_id = role.node_id.clone();
            let topic = cfg.log.deliveries_topic();
            let partitions = log.partitions(&topic)?;
            let reader = walhook_pipeline::routing::PartitionDispatch {
                log: log.clone(),
                topic: topic.clone(),
                egress,
                store: platform.clone(),
                directory: directory.clone(),
                settings,
                routes: role.routes,
                counters: counters.dispatch.clone(),
                observer,
            }
            .into_reader();
            let membership = walhook_pipeline::membership::MembershipSettings {
                topic,
                group: walhook_pipeline::routing::DISPATCH_GROUP.into(),
                partitions,
                lease: role.leased.lease,
            };
            let stop = CancellationToken::new();
            let task = supervisor.spawn(
                "the dispatch membership",
                walhook_pipeline::membership::hold_partitions(
                    role.leased.store,
                    role.leased.member,
                    membership,
                    role.leased.counters,
                    reader,
                    stop.clone(),
                ),
            );
            Some((stop, task))
        }
        _ => None,
    };

    // Capture, restarted after transient errors.
    // The checkpoint writer (stop token, task) when this process captures.
    let mut checkpoints = None;
    let capture_task = match source {
        Some(source) => {
            let (confirmed, confirmed_rx) = tokio::sync::watch::channel(Lsn::ZERO);
            let slot_lag = Arc::new(std::sync::atomic::AtomicI64::new(-1));
            let observer = Arc::new(PlatformObserver {
                confirmed,
                slot_lag: slot_lag.clone(),
                counters: counters.capture.clone(),
                metrics,
            });
            let stop = CancellationToken::new();
            let writer = supervisor.spawn(
                "the capture checkpoint writer",
                save_checkpoints(
                    platform.clone(),
                    cfg.source.name.clone(),
                    cfg.source.slot.clone(),
                    confirmed_rx,
                    slot_lag,
                    stop.clone(),
                ),
            );
            checkpoints = Some((stop, writer));
            let events = log.producer::<Event>(&cfg.log.events_topic())?;
            tokio::spawn(run_capture(
                source,
                events,
                observer,
                platform.clone(),
                stop_all.clone(),
            ))
        }
        // No capture here: the process runs until shutdown.
        None => {
            let stop = stop_all.clone();
            tokio::spawn(async move {
                stop.cancelled().await;
                Ok(())
            })
        }
    };

    let watchdog = (failed.clone(), supervisor.clone());
    let orderly = async move {
        // Capture runs until shutdown, or until it or another task fails.
        let mut capture_task = capture_task;
        let capture_ended = tokio::select! {
            ended = &mut capture_task => ended,
            _ = failed.cancelled() => {
                // A task failed: capture stops without waiting for receipts
                // that may never come (closing the log fails them); what
                // was not confirmed is read again after the restart.
                stop_all.cancel();
                log.close_after_failure();
                if let Some(w) = &workers {
                    w.close();
                }
                capture_task.await
            }
        };
        let capture_failure = match capture_ended {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(anyhow::Error::new(e).context("capture stopped")),
            Err(e) => Some(anyhow::anyhow!("capture panicked: {e}")),
        };
        // Then the rest, upstream first; tasks ending now end on purpose.
        supervisor.stopping();
        if let Some(w) = workers {
            w.stop().await;
        }
        if let Some((stop, task)) = dispatch_members {
            stop.cancel();
            let _ = task.await;
        }
        refresh_stop.cancel();
        watch_stop.cancel();
        if let Some(t) = refresher {
            let _ = t.await;
        }
        log.close_after_failure();
        if let Some((stop, writer)) = checkpoints {
            stop.cancel();
            let _ = writer.await;
        }
        match (supervisor.take_failure(), capture_failure) {
            (Some(e), _) => Err(anyhow::Error::new(e)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(()),
        }
    };
    let task = tokio::spawn(async move {
        // Once a task failed the process stops in bounded time, even when a
        // part of the orderly stop waits for what the failed task would
        // have done (seen in a soak: the stop hung and walhook sat idle);
        // what was not confirmed is read again after the restart.
        let (failed, supervisor) = watchdog;
        tokio::pin!(orderly);
        tokio::select! {
            done = &mut orderly => done,
            _ = async {
                failed.cancelled().await;
                tokio::time::sleep(FAILED_STOP_DEADLINE).await;
            } => {
                tracing::error!(
                    deadline_secs = FAILED_STOP_DEADLINE.as_secs(),
                    "a task failed and the orderly stop did not finish in time; exiting without it"
                );
                Err(match supervisor.take_failure() {
                    Some(e) => anyhow::Error::new(e),
                    None => anyhow::anyhow!("a task failed"),
                }
                .context(format!(
                    "the orderly stop after the failure did not finish within {} s",
                    FAILED_STOP_DEADLINE.as_secs()
                )))
            }
        }
    });
    Ok(Running {
        counters,
        directory,
        task,
    })
}

/// How long the orderly stop after a task's failure may take before the
/// process exits without it.
const FAILED_STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Runs capture into `events` until `stop` or a definite error, restarting
/// it after transient errors with a pause that grows while restarts fail
/// fast (the database is down) and starts over once a run lasted longer than
/// the pause before it (it connected and streamed): a database that crashes
/// now and then is not waited for longer each time.
async fn run_capture<P: Producer<Event>>(
    source: PostgresSource,
    events: P,
    observer: Arc<PlatformObserver>,
    incident_store: Arc<Platform>,
    stop: CancellationToken,
) -> Result<(), CaptureError> {
    const FIRST_PAUSE: Duration = Duration::from_millis(200);
    let mut backoff = FIRST_PAUSE;
    loop {
        let started = tokio::time::Instant::now();
        // Incidents are stored before the hand-off; the ledger counts a
        // transaction once its events are durable, and its receipt
        // resolves only then (see `LedgerSink`).
        let sink = RecordingSink::new(
            LedgerSink::new(LogSink::new(events.clone()), incident_store.clone()),
            incident_store.clone(),
        );
        let result = source
            .run(
                sink,
                observer.clone(),
                RunOptions {
                    confirm: true,
                    stop_when_caught_up: false,
                },
                stop.clone(),
            )
            .await;
        match result {
            Ok(_) => return Ok(()),
            Err(e) if e.is_transient() && !stop.is_cancelled() => {
                if started.elapsed() > backoff {
                    backoff = FIRST_PAUSE;
                }
                tracing::warn!(error = %e, retry_in = ?backoff, "capture stopped; restarting");
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e),
        }
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
