//! Wiring the stages of one `walhook run` process on the embedded log.
//!
//! ```text
//!  capture ──▶ events (embedded, durable group "fanout") ──▶ fan-out ×P ──▶ deliveries ──▶ dispatcher
//!     ▲                                                        │
//!     └──────── receipt: fan-out committed to Postgres ◀───────┘
//! ```
//!
//! With metrics ([`start_observed`]), capture reports its lag, and the
//! dispatcher tells an observer about every attempt (see `crate::metrics`).
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
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use walhook_api::metrics::PipelineMetrics;
use walhook_connectors::http::HttpEgress;
use walhook_connectors::postgres::{CaptureError, CaptureObserver, PostgresSource, RunOptions};
use walhook_pipeline::capture::{Incident, LedgerSink, LogSink, RecordingSink};
use walhook_pipeline::delivery::DeliveryJob;
use walhook_pipeline::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use walhook_pipeline::endpoint::{RefreshSettings, SubscriptionCache};
use walhook_pipeline::event::Event;
use walhook_pipeline::failpoint;
use walhook_pipeline::fanout::{FanoutCounters, FanoutOperator, FanoutSettings};
use walhook_pipeline::ids::{Lsn, Offset};
use walhook_pipeline::log::embedded::EmbeddedLog;
use walhook_pipeline::log::{Consumer, Log, LogError, TopicSpec};
use walhook_pipeline::supervise::{Stopped, Supervisor};
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

use crate::config::Config;
use crate::metrics::MetricsObserver;

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
        if let Err(e) = platform.save_checkpoint(&source, &slot, lsn, None).await {
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
    platform.check().await.context(
        "the platform database is not ready: check that Postgres runs at [platform].url and that `walhook migrate` was run",
    )?;
    let source = PostgresSource::prepare(cfg.source.clone(), cfg.rules.clone()).await?;
    platform
        .upsert_event_types(&cfg.source.name, source.event_types())
        .await?;
    let platform = Arc::new(platform);

    // Cancelled by the caller, or when a task fails or ends too early.
    let stop_all = shutdown.child_token();
    let failed = CancellationToken::new();
    let supervisor = Supervisor::new(failed.clone());

    // A key missing at start-up is a configuration mistake, not one broken
    // endpoint: refuse to run rather than quarantine every endpoint it
    // sealed.
    let directory = load_directory(&platform).await?;
    let refresh_stop = CancellationToken::new();
    let refresher = {
        let (directory, platform, stop) =
            (directory.clone(), (*platform).clone(), refresh_stop.clone());
        supervisor.spawn("the endpoint directory refresher", async move {
            directory
                .refresh(platform, RefreshSettings::default(), stop)
                .await;
            Ok::<(), Stopped>(())
        })
    };

    let log = EmbeddedLog::new([
        TopicSpec {
            name: "events".into(),
            partitions: cfg.log.events_partitions,
            capacity: cfg.log.capacity,
            durable_groups: vec!["fanout".into()],
        },
        TopicSpec {
            name: "deliveries".into(),
            partitions: cfg.log.deliveries_partitions,
            capacity: cfg.log.capacity,
            durable_groups: vec![],
        },
    ]);
    let counters = Arc::new(Counters::default());

    // Dispatch.
    let settings = dispatch_settings(cfg);
    let egress = Arc::new(HttpEgress::new(cfg.egress.clone())?);
    let (jobs_tx, jobs_rx) = mpsc::channel::<DeliveryJob>(4096);
    let dispatch_stop = CancellationToken::new();
    let mut dispatcher = Dispatcher::new(
        egress,
        platform.clone(),
        directory.clone(),
        settings,
        counters.dispatch.clone(),
    );
    if let Some(m) = &metrics {
        dispatcher = dispatcher.with_observer(Arc::new(MetricsObserver::new(m.clone())));
    }
    let dispatch_task = {
        let stop = dispatch_stop.clone();
        supervisor.spawn("dispatch", dispatcher.run(jobs_rx, stop))
    };
    let forward_stop = CancellationToken::new();
    let mut forwarders = Vec::new();
    for p in 0..log.partitions("deliveries")? {
        let consumer = log
            .consumer::<DeliveryJob>("deliveries", p, "dispatch")
            .await?;
        forwarders.push(supervisor.spawn(
            format!("the forwarder of deliveries partition {p}"),
            forward(consumer, jobs_tx.clone(), forward_stop.clone()),
        ));
    }
    drop(jobs_tx);

    // Fan-out.
    let fanout_stop = CancellationToken::new();
    let mut fanout_tasks = Vec::new();
    for p in 0..log.partitions("events")? {
        let consumer = log.consumer::<Event>("events", p, "fanout").await?;
        let op = FanoutOperator::new(
            consumer,
            log.producer::<DeliveryJob>("deliveries")?,
            platform.clone(),
            directory.clone(),
            FanoutSettings {
                batch_size: cfg.fanout.batch_size,
                deadline: cfg.retry.deadline,
                lease_owner: Some(cfg.dispatch.node_id.clone()),
                lease: cfg.dispatch.lease,
            },
        );
        let (stop, counters) = (fanout_stop.clone(), counters.fanout.clone());
        fanout_tasks.push(
            supervisor.spawn(format!("fan-out of events partition {p}"), async move {
                op.run(counters, stop).await
            }),
        );
    }

    // Capture, restarted after transient errors.
    let (confirmed, confirmed_rx) = tokio::sync::watch::channel(Lsn::ZERO);
    let observer = Arc::new(PlatformObserver {
        confirmed,
        counters: counters.capture.clone(),
        metrics,
    });
    let checkpoints_stop = CancellationToken::new();
    let checkpoints = supervisor.spawn(
        "the capture checkpoint writer",
        save_checkpoints(
            platform.clone(),
            cfg.source.name.clone(),
            cfg.source.slot.clone(),
            confirmed_rx,
            checkpoints_stop.clone(),
        ),
    );
    let events = log.producer::<Event>("events")?;
    let capture_stop = stop_all.clone();
    let incident_store = platform.clone();
    let capture_task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        loop {
            // Incidents are stored before the hand-off; the ledger counts a
            // transaction once fan-out made its events durable, and its
            // receipt resolves only then (see `LedgerSink`).
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
                    capture_stop.clone(),
                )
                .await;
            match result {
                Ok(_) => return Ok::<(), CaptureError>(()),
                Err(e) if e.is_transient() && !capture_stop.is_cancelled() => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "capture stopped; restarting");
                    tokio::select! {
                        _ = capture_stop.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(e) => return Err(e),
            }
        }
    });

    let task = tokio::spawn(async move {
        // Capture runs until shutdown, or until it or another task fails.
        let mut capture_task = capture_task;
        let capture_ended = tokio::select! {
            ended = &mut capture_task => ended,
            _ = failed.cancelled() => {
                // A task failed: capture stops without waiting for receipts
                // that may never come (closing the log fails them); what
                // was not confirmed is read again after the restart.
                stop_all.cancel();
                log.close();
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
        fanout_stop.cancel();
        for t in fanout_tasks {
            let _ = t.await;
        }
        forward_stop.cancel();
        for t in forwarders {
            let _ = t.await;
        }
        dispatch_stop.cancel();
        let _ = dispatch_task.await;
        refresh_stop.cancel();
        let _ = refresher.await;
        log.close();
        checkpoints_stop.cancel();
        let _ = checkpoints.await;
        match (supervisor.take_failure(), capture_failure) {
            (Some(e), _) => Err(anyhow::Error::new(e)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(()),
        }
    });
    Ok(Running {
        counters,
        directory,
        task,
    })
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

/// Moves jobs from a deliveries partition to the dispatcher, until `stop`
/// or the log's close. When dispatch is gone it waits for the stop that
/// dispatch's failure brings.
async fn forward<C: Consumer<DeliveryJob>>(
    mut consumer: C,
    out: mpsc::Sender<DeliveryJob>,
    stop: CancellationToken,
) -> Result<(), LogError> {
    loop {
        if failpoint::hit("dispatch.forward") {
            return Ok(());
        }
        let records = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = consumer.poll(256) => match r {
                Ok(r) => r,
                Err(LogError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            continue;
        };
        for r in records {
            if out.send(r.message).await.is_err() {
                // Dispatch is gone: its own end says why (the supervisor
                // keeps the first failure, which must be the cause, not
                // this consequence). Wait for the stop it brings.
                stop.cancelled().await;
                return Ok(());
            }
        }
        // The deliveries table holds the truth; the log only carries jobs.
        consumer.commit(Offset(last.0 + 1)).await?;
    }
}
