//! Capture as the runtime runs it: a [`ChangeSource`] restarted after
//! transient errors, its counters and metrics, and its checkpoints.
//!
//! The sink chain is fixed: incidents are stored before the hand-off
//! ([`RecordingSink`]), the ledger counts a transaction once its events are
//! durable ([`LedgerSink`]), and the events go to the log's events topic
//! ([`LogSink`]), whose receipts decide what the source confirms.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::capture::{
    CaptureIncidentStore, CaptureLedgerStore, CaptureObserver, CapturedTransaction, ChangeSource,
    Incident, LedgerSink, LogSink, RecordingSink, RunOptions, SourceError, SourceErrorKind,
};
use crate::event::Event;
use crate::failpoint;
use crate::ids::Lsn;
use crate::log::Producer;
use crate::metrics::PipelineMetrics;
use crate::store::StoreError;
use crate::supervise::Stopped;
use crate::time::Timestamp;

/// Where capture's checkpoints are kept (the platform database): the
/// position confirmed and the source's lag, shown by the API. A checkpoint
/// is informational; the source's own confirmed position is the truth.
pub trait CheckpointStore: Send + Sync + 'static {
    /// Saves `source`'s confirmed position `lsn` on `slot`, with its lag
    /// in bytes when known.
    fn save_checkpoint(
        &self,
        source: &str,
        slot: &str,
        lsn: Lsn,
        lag_bytes: Option<i64>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// Capture's counters.
#[derive(Debug, Default)]
pub struct CaptureCounters {
    /// Transactions read.
    pub transactions: AtomicU64,
    /// Row changes read.
    pub changes: AtomicU64,
    /// Events handed on.
    pub events: AtomicU64,
    /// Incidents.
    pub incidents: AtomicU64,
}

/// Counts what capture sees, feeds its metrics, and passes the confirmed
/// position to the checkpoint writer. Incidents are stored by the sink
/// before the source can move past them, and the ledger once the events it
/// counts are durable, not here.
pub(super) struct CountingObserver {
    pub(super) confirmed: watch::Sender<Lsn>,
    /// The source's latest lag, bytes (-1 until known), saved with the
    /// next checkpoint.
    pub(super) lag: Arc<AtomicI64>,
    pub(super) counters: Arc<CaptureCounters>,
    pub(super) metrics: Option<Arc<PipelineMetrics>>,
}

impl CaptureObserver for CountingObserver {
    fn confirmed(&self, lsn: Lsn) {
        self.confirmed.send_replace(lsn);
    }
    fn transaction(&self, tx: &CapturedTransaction) {
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
        self.lag.store(lag_bytes, Relaxed);
        if let Some(m) = &self.metrics {
            m.slot_lag_bytes.set(lag_bytes);
        }
    }
    fn incident(&self, _incident: &Incident) {
        self.counters.incidents.fetch_add(1, Relaxed);
    }
}

/// Saves capture checkpoints (at most twice a second) until `stop` (when
/// capture ends first, its last position is saved and the writer waits for
/// `stop`, so that its end is never mistaken for a failure).
pub(super) async fn save_checkpoints<S: CheckpointStore>(
    store: Arc<S>,
    source: String,
    slot: String,
    mut confirmed: watch::Receiver<Lsn>,
    lag: Arc<AtomicI64>,
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
        // A failed write is retried with the next position.
        let lag = lag.load(Relaxed);
        let lag = (lag >= 0).then_some(lag);
        if let Err(e) = store.save_checkpoint(&source, &slot, lsn, lag).await {
            tracing::warn!(error = %e, "could not save the capture checkpoint");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Runs capture into `events` until `stop` or a definite error, restarting
/// it after transient errors with a pause that grows while restarts fail
/// fast (the database is down) and starts over once a run lasted longer
/// than the pause before it (it connected and streamed): a database that
/// crashes now and then is not waited for longer each time.
pub(super) async fn run_capture<C, P, S>(
    source: C,
    events: P,
    observer: Arc<dyn CaptureObserver>,
    store: Arc<S>,
    stop: CancellationToken,
) -> Result<(), C::Error>
where
    C: ChangeSource,
    P: Producer<Event>,
    S: CaptureIncidentStore + CaptureLedgerStore,
{
    const FIRST_PAUSE: Duration = Duration::from_millis(200);
    let mut backoff = FIRST_PAUSE;
    loop {
        let started = tokio::time::Instant::now();
        let sink = RecordingSink::new(
            LedgerSink::new(LogSink::new(events.clone()), store.clone()),
            store.clone(),
        );
        let options = RunOptions {
            confirm: true,
            stop_when_caught_up: false,
        };
        match source
            .run(sink, observer.clone(), options, stop.clone())
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == SourceErrorKind::Transient && !stop.is_cancelled() => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::ledger::memory::MemoryLedgerStore;
    use crate::capture::source::memory::MemorySource;
    use crate::log::Log;
    use crate::log::embedded::EmbeddedLog;

    #[tokio::test]
    async fn transient_failures_restart_capture_and_a_definite_one_ends_it() {
        let log = EmbeddedLog::new([topic()]);
        let events = log.producer::<Event>("events").unwrap();
        let source = Arc::new(MemorySource::new("twin"));
        source.commit(&["a"]);
        source.fail_next_run(SourceErrorKind::Transient);
        let (confirmed, _rx) = watch::channel(Lsn::ZERO);
        let counters = Arc::new(CaptureCounters::default());
        let observer = Arc::new(CountingObserver {
            confirmed,
            lag: Arc::new(AtomicI64::new(-1)),
            counters: counters.clone(),
            metrics: None,
        });
        let store = Arc::new(MemoryLedgerStore::new());
        let stop = CancellationToken::new();
        let run = run_capture(source.clone(), events, observer, store, stop.clone());
        let drive = async {
            while counters.events.load(Relaxed) < 1 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            source.fail_next_run(SourceErrorKind::Definite);
            // The running read ends on the next failure injected only at a
            // start: stop it by shutdown instead and check the restart.
            stop.cancel();
        };
        let (ended, ()) = tokio::join!(run, drive);
        ended.unwrap();
        assert_eq!(source.runs(), 2, "one failed start, one read");
        // The definite failure left queued ends the next capture at once.
        let (confirmed, _rx) = watch::channel(Lsn::ZERO);
        let log = EmbeddedLog::new([topic()]);
        let e = run_capture(
            source.clone(),
            log.producer::<Event>("events").unwrap(),
            Arc::new(CountingObserver {
                confirmed,
                lag: Arc::new(AtomicI64::new(-1)),
                counters: Arc::default(),
                metrics: None,
            }),
            Arc::new(MemoryLedgerStore::new()),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), SourceErrorKind::Definite);
    }

    /// An events topic whose records are durable once appended (no
    /// fan-out here to commit them).
    fn topic() -> crate::log::TopicSpec {
        crate::log::TopicSpec {
            name: "events".into(),
            partitions: 1,
            capacity: 100,
            durable_groups: Vec::new(),
        }
    }
}
