//! Wiring the stages of one `walhook run` process on the embedded log.
//!
//! ```text
//!  capture ──▶ events (embedded, durable group "fanout") ──▶ fan-out ×P ──▶ deliveries ──▶ dispatcher
//!     ▲                                                        │
//!     └──────── receipt: fan-out committed to Postgres ◀───────┘
//! ```
//!
//! With metrics ([`start_observed`]), capture reports its lag, and the
//! dispatcher's egress is wrapped to count attempts by outcome and time
//! first attempts (see `crate::metrics`).
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
use walhook_pipeline::capture::{Incident, LogSink};
use walhook_pipeline::delivery::DeliveryJob;
use walhook_pipeline::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use walhook_pipeline::endpoint::SubscriptionCache;
use walhook_pipeline::event::Event;
use walhook_pipeline::fanout::{FanoutCounters, FanoutOperator, FanoutSettings};
use walhook_pipeline::ids::{Lsn, Offset};
use walhook_pipeline::log::embedded::EmbeddedLog;
use walhook_pipeline::log::{Consumer, Log, LogError, TopicSpec};
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

use crate::config::Config;
use crate::metrics::MeteredEgress;

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

/// Writes capture checkpoints (at most once a second) and incidents.
struct PlatformObserver {
    confirmed: tokio::sync::watch::Sender<Lsn>,
    incidents: mpsc::UnboundedSender<Incident>,
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
    fn incident(&self, incident: &Incident) {
        self.counters
            .incidents
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = self.incidents.send(incident.clone());
    }
}

/// The observer, and the tasks writing what it sees (they end, after a last
/// write, once the observer is dropped).
fn observer(
    platform: Platform,
    source: String,
    slot: String,
    counters: Arc<CaptureCounters>,
    metrics: Option<Arc<PipelineMetrics>>,
) -> (Arc<PlatformObserver>, Vec<JoinHandle<()>>) {
    let (confirmed, mut confirmed_rx) = tokio::sync::watch::channel(Lsn::ZERO);
    let (incidents, mut incidents_rx) = mpsc::unbounded_channel::<Incident>();
    let p = platform.clone();
    let (s, sl) = (source.clone(), slot.clone());
    let saver = tokio::spawn(async move {
        while confirmed_rx.changed().await.is_ok() {
            let lsn = *confirmed_rx.borrow_and_update();
            if let Err(e) = p.save_checkpoint(&s, &sl, lsn, None).await {
                tracing::warn!(error = %e, "could not save the capture checkpoint");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let recorder = tokio::spawn(async move {
        while let Some(i) = incidents_rx.recv().await {
            if let Err(e) = platform
                .record_incidents(&source, std::slice::from_ref(&i))
                .await
            {
                tracing::warn!(error = %e, "could not store a capture incident");
            }
        }
    });
    (
        Arc::new(PlatformObserver {
            confirmed,
            incidents,
            counters,
            metrics,
        }),
        vec![saver, recorder],
    )
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

    let directory = Arc::new(SubscriptionCache::default());
    directory
        .load(&platform)
        .await
        .context("cannot load endpoints")?;
    let refresh_stop = CancellationToken::new();
    {
        let directory = directory.clone();
        let platform = platform.clone();
        let stop = refresh_stop.clone();
        tokio::spawn(async move {
            directory
                .refresh(platform, Duration::from_millis(200), stop)
                .await
        });
    }

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
    let platform = Arc::new(platform);
    // Cancelled by the caller, or by any stage that fails for good.
    let stop_all = shutdown.child_token();
    let failure: Arc<parking_lot::Mutex<Option<anyhow::Error>>> = Arc::default();
    let fail = {
        let stop_all = stop_all.clone();
        let failure = failure.clone();
        move |e: anyhow::Error| {
            tracing::error!(error = %format!("{e:#}"), "a stage failed; stopping");
            failure.lock().get_or_insert(e);
            stop_all.cancel();
        }
    };

    // Dispatch.
    let settings = DispatchSettings {
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
    };
    let egress = Arc::new(MeteredEgress::new(
        HttpEgress::new(cfg.egress.clone())?,
        metrics.clone(),
    ));
    let (jobs_tx, jobs_rx) = mpsc::channel::<DeliveryJob>(4096);
    let dispatch_stop = CancellationToken::new();
    let dispatcher = Dispatcher::new(
        egress,
        platform.clone(),
        directory.clone(),
        settings,
        counters.dispatch.clone(),
    );
    let dispatch_task = {
        let fail = fail.clone();
        let stop = dispatch_stop.clone();
        tokio::spawn(async move {
            if let Err(e) = dispatcher.run(jobs_rx, stop).await {
                fail(e.into());
            }
        })
    };
    let forward_stop = CancellationToken::new();
    for p in 0..log.partitions("deliveries")? {
        let consumer = log
            .consumer::<DeliveryJob>("deliveries", p, "dispatch")
            .await?;
        tokio::spawn(forward(consumer, jobs_tx.clone(), forward_stop.clone()));
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
        let (fail, stop, counters) = (fail.clone(), fanout_stop.clone(), counters.fanout.clone());
        fanout_tasks.push(tokio::spawn(async move {
            if let Err(e) = op.run(counters, stop).await {
                fail(e.into());
            }
        }));
    }

    // Capture, restarted after transient errors.
    let (observer, observer_tasks) = observer(
        (*platform).clone(),
        cfg.source.name.clone(),
        cfg.source.slot.clone(),
        counters.capture.clone(),
        metrics,
    );
    let events = log.producer::<Event>("events")?;
    let capture_stop = stop_all.clone();
    let capture_task = tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        loop {
            let sink = LogSink::new(events.clone());
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
        // Capture runs until shutdown, or until it or another stage fails.
        match capture_task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => fail(anyhow::Error::new(e).context("capture stopped")),
            Err(e) => fail(anyhow::anyhow!("capture panicked: {e}")),
        }
        // Then the rest, upstream first.
        fanout_stop.cancel();
        for t in fanout_tasks {
            let _ = t.await;
        }
        forward_stop.cancel();
        dispatch_stop.cancel();
        let _ = dispatch_task.await;
        refresh_stop.cancel();
        log.close();
        for t in observer_tasks {
            let _ = t.await;
        }
        match failure.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    });
    Ok(Running {
        counters,
        directory,
        task,
    })
}

/// Moves jobs from a deliveries partition to the dispatcher.
async fn forward<C: Consumer<DeliveryJob>>(
    mut consumer: C,
    out: mpsc::Sender<DeliveryJob>,
    stop: CancellationToken,
) {
    loop {
        let records = tokio::select! {
            _ = stop.cancelled() => return,
            r = consumer.poll(256) => match r {
                Ok(r) => r,
                Err(LogError::Closed) => return,
                Err(e) => {
                    tracing::error!(error = %e, "deliveries partition failed");
                    return;
                }
            },
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            continue;
        };
        for r in records {
            if out.send(r.message).await.is_err() {
                return;
            }
        }
        // The deliveries table holds the truth; the log only carries jobs.
        let _ = consumer.commit(Offset(last.0 + 1)).await;
    }
}
