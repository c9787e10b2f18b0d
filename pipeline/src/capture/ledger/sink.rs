//! [`LedgerSink`]: records each transaction part's tallies in the capture
//! ledger once its events are durable, before the slot may move past it.
//!
//! ```text
//!  hand_off(tx) ──▶ inner.hand_off(tx) ──receipt──┐
//!       │                                         ▼
//!       └─(key, window, tallies, receipt)──▶ queue ──▶ writer task (one per sink)
//!                                                    take what is queued (≤ 4096;
//!                                                    a small batch waits 10 ms for more)
//!                                                    await the receipts in order
//!                                                    one store transaction for all
//!  outer receipt ◀──────────────────────────────────── resolve (or fail) each
//! ```
//!
//! One small Postgres transaction per batch, not per transaction: under
//! load the queue fills while the writer waits for receipts or the store,
//! so batches grow with the rate. Every part that read a change is counted
//! under the source's own row ([`super::SOURCE_RULE`]: each change once,
//! whatever rules looked at it); a part that read none skips the writer:
//! its receipt is the inner one.
//!
//! Failure: a part whose events were not made durable fails, with every
//! part after it, and none of them is counted (counting a later part would
//! move the mark past the failed one, which would then never be counted).
//! The writer then stops: the acker stops at the failed receipt, capture
//! restarts and reads the parts again. The writer is watched through its
//! receipts and its queue: if it ends or panics, every receipt it holds
//! fails and the next hand-off fails, so capture cannot stall on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{CaptureLedgerStore, LedgerPart, PartKey};
use crate::capture::{CapturedTransaction, SinkError, TransactionSink};
use crate::log::{LogError, Receipt};
use crate::store::StoreError;

/// Parts queued for the writer before `hand_off` waits.
const QUEUE_PARTS: usize = 4096;

/// The most parts written in one store transaction.
const MAX_BATCH_PARTS: usize = 4096;

/// How long a small batch waits for more parts before it is written: at a
/// few hundred transactions a second the writer otherwise keeps up and
/// writes one part per Postgres transaction (about 1.8 µs of Postgres per
/// delivery, docs/performance.md). It delays only the slot's confirmation,
/// never a delivery.
const LINGER: Duration = Duration::from_millis(10);

/// A batch at least this large is written at once.
const LINGER_BELOW: usize = 32;

/// How transient store failures are retried before a batch fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub first: Duration,
    /// The longest wait (each doubles up to it).
    pub max: Duration,
    /// Retries before giving up.
    pub retries: u32,
}

impl Default for Backoff {
    /// From 50 ms, doubling to 5 s, ten retries: about 30 s, as
    /// [`RecordingSink`](crate::capture::RecordingSink) waits for incidents.
    fn default() -> Self {
        Backoff {
            first: Duration::from_millis(50),
            max: Duration::from_secs(5),
            retries: 10,
        }
    }
}

/// Why a part was not counted; carried as a [`LogError::Backend`] by its
/// receipt, so the acker stops there and capture reads it again.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The store failed (after retries, when transient).
    #[error("could not record the capture ledger")]
    Store(#[source] StoreError),
    /// A part before this one was not made durable or not counted.
    #[error("an earlier transaction part was not counted, so this one was not either")]
    EarlierPartFailed,
}

impl From<LedgerError> for LogError {
    fn from(e: LedgerError) -> Self {
        LogError::Backend(Box::new(e))
    }
}

/// A part waiting for the writer.
struct Pending {
    source: Arc<str>,
    part: LedgerPart,
    /// Resolves when the inner sink made the part's events durable.
    durable: Receipt,
    done: oneshot::Sender<Result<(), LogError>>,
}

/// Hands each transaction to `inner`, then records its tallies in the
/// capture ledger once `inner`'s receipt resolved; the receipt it returns
/// resolves once both are done.
pub struct LedgerSink<S> {
    inner: S,
    queue: mpsc::Sender<Pending>,
}

impl<S> LedgerSink<S> {
    /// Wraps `inner`, recording tallies in `store`; starts the writer task
    /// (it ends when the sink is dropped and its queue is done).
    pub fn new<L: CaptureLedgerStore>(inner: S, store: Arc<L>) -> Self {
        Self::with_backoff(inner, store, Backoff::default())
    }

    /// [`LedgerSink::new`], retrying transient store failures as `backoff`
    /// says.
    #[allow(clippy::disallowed_methods)] // bare spawn: the ledger writer ends when its sink is dropped, after its queue is done
    pub fn with_backoff<L: CaptureLedgerStore>(inner: S, store: Arc<L>, backoff: Backoff) -> Self {
        let (queue, rx) = mpsc::channel(QUEUE_PARTS);
        tokio::spawn(write_ledger(rx, store, backoff));
        LedgerSink { inner, queue }
    }
}

impl<S: TransactionSink> TransactionSink for LedgerSink<S> {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        if tx.ledger.is_empty() && tx.change_count == 0 {
            return self.inner.hand_off(tx).await;
        }
        let source = tx.source.clone();
        let part = LedgerPart {
            key: PartKey {
                commit_lsn: tx.commit_lsn,
                part: tx.part,
            },
            window: tx.commit_time.minute_start(),
            tallies: super::with_source_tally(&tx.ledger, tx.change_count),
        };
        let durable = self.inner.hand_off(tx).await?;
        let (done, counted) = oneshot::channel();
        self.queue
            .send(Pending {
                source,
                part,
                durable,
                done,
            })
            .await
            .map_err(|_| SinkError::Closed)?;
        Ok(Receipt::new(async move {
            counted.await.unwrap_or(Err(LogError::Closed))
        }))
    }
}

/// The writer: batches of parts, in hand-off order, until the sink is
/// dropped or a part fails.
async fn write_ledger<L: CaptureLedgerStore>(
    mut rx: mpsc::Receiver<Pending>,
    store: Arc<L>,
    backoff: Backoff,
) {
    let mut batch = Vec::with_capacity(MAX_BATCH_PARTS);
    while rx.recv_many(&mut batch, MAX_BATCH_PARTS).await > 0 {
        if batch.len() < LINGER_BELOW {
            let deadline = tokio::time::Instant::now() + LINGER;
            while batch.len() < MAX_BATCH_PARTS {
                let room = MAX_BATCH_PARTS - batch.len();
                match tokio::time::timeout_at(deadline, rx.recv_many(&mut batch, room)).await {
                    Ok(n) if n > 0 => {}
                    // The deadline passed, or the sink was dropped: write
                    // what there is.
                    _ => break,
                }
            }
        }
        // The parts whose events are durable, up to the first that is not.
        let mut sources = Vec::with_capacity(batch.len());
        let mut parts = Vec::with_capacity(batch.len());
        let mut dones = Vec::with_capacity(batch.len());
        let mut failed: Vec<(oneshot::Sender<_>, LogError)> = Vec::new();
        for pending in batch.drain(..) {
            if !failed.is_empty() {
                failed.push((pending.done, LedgerError::EarlierPartFailed.into()));
                continue;
            }
            match pending.durable.await {
                Ok(()) => {
                    sources.push(pending.source);
                    parts.push(pending.part);
                    dones.push(pending.done);
                }
                Err(e) => failed.push((pending.done, e)),
            }
        }
        let mut stop = !failed.is_empty();
        // One store call per run of one source (a sink serves one source;
        // the runs keep this correct if it ever does not).
        let mut start = 0;
        while start < parts.len() {
            let end = start
                + sources[start..]
                    .iter()
                    .take_while(|s| **s == sources[start])
                    .count();
            match record(&*store, &sources[start], &parts[start..end], backoff).await {
                Ok(counted) => {
                    tracing::debug!(source = %sources[start], parts = end - start, counted, "capture ledger recorded");
                    for done in dones.drain(..end - start) {
                        // A receipt dropped unread means capture stopped
                        // waiting for it: nothing to tell, nothing stalls.
                        let _ = done.send(Ok(()));
                    }
                    start = end;
                }
                Err(e) => {
                    tracing::error!(source = %sources[start], error = %e.chain(), "could not record the capture ledger; capture stops and reads the transactions again");
                    let mut rest = dones.drain(..);
                    if let Some(first) = rest.next() {
                        let _ = first.send(Err(LedgerError::Store(e).into()));
                    }
                    for done in rest {
                        let _ = done.send(Err(LedgerError::EarlierPartFailed.into()));
                    }
                    stop = true;
                    break;
                }
            }
        }
        for (done, e) in failed {
            let _ = done.send(Err(e));
        }
        if stop {
            // Parts still queued fail as the queue drops; so do later
            // hand-offs.
            return;
        }
    }
}

/// One store call, transient failures retried with backoff (capture waits
/// meanwhile: back-pressure).
async fn record<L: CaptureLedgerStore>(
    store: &L,
    source: &str,
    parts: &[LedgerPart],
    policy: Backoff,
) -> Result<usize, StoreError> {
    let mut wait = policy.first;
    let mut retries = 0;
    loop {
        match store.record_ledger_parts(source, parts).await {
            Ok(counted) => return Ok(counted),
            Err(e) if e.is_transient() && retries < policy.retries => {
                tracing::warn!(%source, error = %e.chain(), retry_in = ?wait, "could not record the capture ledger; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(policy.max);
                retries += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::capture::ledger::RuleTally;
    use crate::capture::ledger::memory::MemoryLedgerStore;
    use crate::ids::Lsn;
    use crate::time::Timestamp;

    /// Returns the receipts it is given, in order (ready ones after).
    #[derive(Default)]
    struct Scripted {
        receipts: VecDeque<Receipt>,
    }

    impl TransactionSink for Scripted {
        async fn hand_off(&mut self, _tx: CapturedTransaction) -> Result<Receipt, SinkError> {
            Ok(self.receipts.pop_front().unwrap_or_else(Receipt::ready))
        }
    }

    fn tx(lsn: u64, part: u32, events: u32) -> CapturedTransaction {
        CapturedTransaction {
            source: "main".into(),
            commit_lsn: Lsn(lsn),
            end_lsn: Lsn(lsn + 1),
            commit_time: Timestamp(1_795_947_104_123_456),
            change_count: events,
            part,
            ledger: vec![RuleTally {
                rule: "r".into(),
                changes: events,
                events,
                filtered: 0,
                incidents: 0,
            }],
            events: Vec::new(),
            incidents: Vec::new(),
        }
    }

    fn gate() -> (oneshot::Sender<Result<(), LogError>>, Receipt) {
        let (open, wait) = oneshot::channel();
        (
            open,
            Receipt::new(async move { wait.await.unwrap_or(Err(LogError::Closed)) }),
        )
    }

    fn events(store: &MemoryLedgerStore) -> u64 {
        store.snapshot("main").rows.iter().map(|r| r.events).sum()
    }

    #[tokio::test]
    async fn a_part_is_counted_only_once_its_events_are_durable() {
        let store = Arc::new(MemoryLedgerStore::new());
        let (open, durable) = gate();
        let mut sink = LedgerSink::new(
            Scripted {
                receipts: [durable].into(),
            },
            store.clone(),
        );
        let mut receipt = sink.hand_off(tx(10, 0, 3)).await.unwrap();
        tokio::task::yield_now().await;
        assert!(
            futures::poll!(&mut receipt).is_pending(),
            "resolved before the events were durable"
        );
        assert_eq!(events(&store), 0);
        open.send(Ok(())).unwrap();
        receipt.await.unwrap();
        let snap = store.snapshot("main");
        assert_eq!(events(&store), 3);
        assert_eq!(
            snap.rows[0].window.to_string(),
            "2026-11-29T10:11:00.000000Z"
        );
        assert_eq!(
            snap.mark,
            Some(PartKey {
                commit_lsn: Lsn(10),
                part: 0
            })
        );
    }

    #[tokio::test]
    async fn a_part_that_is_not_durable_fails_with_every_later_one_and_none_is_counted() {
        let store = Arc::new(MemoryLedgerStore::new());
        let (first, r1) = gate();
        let (second, r2) = gate();
        let mut sink = LedgerSink::new(
            Scripted {
                receipts: [r1, r2].into(),
            },
            store.clone(),
        );
        let a = sink.hand_off(tx(10, 0, 1)).await.unwrap();
        let b = sink.hand_off(tx(20, 0, 2)).await.unwrap();
        let c = sink.hand_off(tx(30, 0, 4)).await.unwrap();
        first.send(Ok(())).unwrap();
        second.send(Err(LogError::Closed)).unwrap();
        a.await.unwrap();
        assert!(matches!(b.await, Err(LogError::Closed)));
        assert!(c.await.is_err(), "a part after a failed one was confirmed");
        assert_eq!(events(&store), 1, "only the part before the failure counts");
        // The writer stopped: the next hand-off (or its receipt) fails.
        let next = sink.hand_off(tx(40, 0, 8)).await;
        match next {
            Err(SinkError::Closed) => {}
            Ok(r) => assert!(r.await.is_err()),
            Err(e) => panic!("unexpected {e}"),
        }
        assert_eq!(events(&store), 1);
    }

    /// Retries without waiting.
    const INSTANT: Backoff = Backoff {
        first: Duration::ZERO,
        max: Duration::ZERO,
        retries: 4,
    };

    #[tokio::test]
    async fn transient_store_failures_are_retried() {
        let store = Arc::new(MemoryLedgerStore::new());
        store.fail_next(3);
        let mut sink = LedgerSink::with_backoff(Scripted::default(), store.clone(), INSTANT);
        sink.hand_off(tx(10, 0, 5)).await.unwrap().await.unwrap();
        assert_eq!(events(&store), 5);
    }

    #[tokio::test]
    async fn a_store_that_keeps_failing_fails_the_receipts() {
        let store = Arc::new(MemoryLedgerStore::new());
        store.fail_next(INSTANT.retries + 1);
        let mut sink = LedgerSink::with_backoff(Scripted::default(), store.clone(), INSTANT);
        let a = sink.hand_off(tx(10, 0, 5)).await.unwrap();
        let err = a.await.unwrap_err();
        let LogError::Backend(cause) = err else {
            panic!("expected a backend error, got {err}");
        };
        assert!(cause.to_string().contains("capture ledger"), "{cause}");
        assert_eq!(events(&store), 0);
    }

    #[tokio::test]
    async fn parts_queued_together_are_written_in_one_transaction() {
        let store = Arc::new(MemoryLedgerStore::new());
        let (open, durable) = gate();
        let mut sink = LedgerSink::new(
            Scripted {
                receipts: [durable].into(),
            },
            store.clone(),
        );
        let mut receipts = Vec::new();
        for i in 0..100u64 {
            // Three parts per transaction, as a chunked one is handed off.
            receipts.push(
                sink.hand_off(tx(100 + i / 3, (i % 3) as u32, 1))
                    .await
                    .unwrap(),
            );
        }
        open.send(Ok(())).unwrap();
        for r in receipts {
            r.await.unwrap();
        }
        assert_eq!(events(&store), 100);
        assert!(store.writes() <= 2, "{} writes", store.writes());
    }

    #[tokio::test]
    async fn a_part_without_tallies_does_not_wait_for_the_writer() {
        let store = Arc::new(MemoryLedgerStore::new());
        let (_held, durable) = gate();
        let mut sink = LedgerSink::new(
            Scripted {
                receipts: [durable].into(),
            },
            store.clone(),
        );
        let _waiting = sink.hand_off(tx(10, 0, 1)).await.unwrap();
        let mut empty = tx(20, 0, 0);
        empty.ledger.clear();
        sink.hand_off(empty).await.unwrap().await.unwrap();
        assert_eq!(store.writes(), 0);
    }

    #[tokio::test]
    async fn every_change_is_counted_once_under_the_source_row() {
        let store = Arc::new(MemoryLedgerStore::new());
        let mut sink = LedgerSink::new(
            Scripted {
                receipts: std::collections::VecDeque::new(),
            },
            store.clone(),
        );
        // Two rules look at the same 3 changes.
        let mut two_rules = tx(10, 0, 3);
        two_rules.ledger.push(RuleTally {
            rule: "s".into(),
            changes: 3,
            events: 3,
            filtered: 0,
            incidents: 0,
        });
        sink.hand_off(two_rules).await.unwrap().await.unwrap();
        // 2 changes no rule looked at.
        let mut no_rule = tx(20, 0, 2);
        no_rule.ledger.clear();
        sink.hand_off(no_rule).await.unwrap().await.unwrap();
        let rows = store.snapshot("main").rows;
        let changes = |source: bool| -> u64 {
            rows.iter()
                .filter(|r| (r.rule == super::super::SOURCE_RULE) == source)
                .map(|r| r.changes)
                .sum()
        };
        assert_eq!(changes(true), 5);
        assert_eq!(changes(false), 6);
        assert_eq!(events(&store), 6);
    }
}
