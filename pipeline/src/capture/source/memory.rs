//! An in-memory [`ChangeSource`] for unit tests: a list of committed
//! transactions and a confirmed position, read as a slot is.
//!
//! [`MemorySource::commit`] appends a transaction (one event per object
//! id), [`MemorySource::fail_next_run`] makes the next run fail with a
//! chosen kind, and a second run while one reads fails transiently, as a
//! slot that is active elsewhere does. It keeps the contract of
//! [`super::contract`], checked in this crate's unit tests.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::stream::{FuturesOrdered, StreamExt};
use parking_lot::Mutex;
use sha2::Digest;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{CaptureObserver, ChangeSource, RunOptions, RunStats, SourceError, SourceErrorKind};
use crate::capture::{CapturedTransaction, SinkError, TransactionSink};
use crate::event::{Event, EventKey, EventType};
use crate::ids::{EventId, Lsn, TenantId};
use crate::log::LogError;
use crate::time::Timestamp;

/// The tenant of the twin's events.
pub const TENANT: &str = "acme";
/// The type of the twin's events.
pub const EVENT_TYPE: &str = "memory.changed";

/// Why a run of the twin failed.
#[derive(Debug, thiserror::Error)]
pub enum MemorySourceError {
    /// Another run reads the source.
    #[error("source {0:?} is read by another run")]
    Busy(String),
    /// The sink refused a transaction.
    #[error("the sink refused a transaction")]
    Sink(#[from] SinkError),
    /// A receipt failed: what it covered was not made durable.
    #[error("a receipt failed")]
    Receipt(#[source] LogError),
    /// Asked for by [`MemorySource::fail_next_run`].
    #[error("an injected {0:?} failure")]
    Injected(SourceErrorKind),
}

impl SourceError for MemorySourceError {
    fn kind(&self) -> SourceErrorKind {
        match self {
            MemorySourceError::Busy(_) | MemorySourceError::Receipt(_) => {
                SourceErrorKind::Transient
            }
            MemorySourceError::Sink(e) if e.is_transient() => SourceErrorKind::Transient,
            MemorySourceError::Sink(_) => SourceErrorKind::Definite,
            MemorySourceError::Injected(kind) => *kind,
        }
    }
}

#[derive(Default)]
struct State {
    committed: Vec<CapturedTransaction>,
    confirmed: Lsn,
    reading: bool,
    fail_next: Vec<SourceErrorKind>,
    runs: u32,
}

/// The twin (see the module docs).
pub struct MemorySource {
    name: Arc<str>,
    state: Mutex<State>,
    wake: Notify,
}

impl std::fmt::Debug for MemorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock();
        f.debug_struct("MemorySource")
            .field("name", &self.name)
            .field("committed", &state.committed.len())
            .field("confirmed", &state.confirmed)
            .finish()
    }
}

/// Space between the twin's transactions, in LSN bytes.
const LSN_STEP: u64 = 0x100;

impl MemorySource {
    /// An empty source named `name`.
    pub fn new(name: &str) -> Self {
        MemorySource {
            name: Arc::from(name),
            state: Mutex::default(),
            wake: Notify::new(),
        }
    }

    /// Commits a transaction that makes one event per object id, in order;
    /// returns its end position.
    pub fn commit(&self, objects: &[&str]) -> Lsn {
        let mut state = self.state.lock();
        let commit_lsn = Lsn((state.committed.len() as u64 + 1) * LSN_STEP);
        let commit_time = Timestamp::now();
        let tenant = TenantId::new(TENANT).expect("a valid tenant");
        let event_type = EventType::new(EVENT_TYPE).expect("a valid type");
        let events = objects
            .iter()
            .enumerate()
            .map(|(i, object)| {
                let ordinal = u32::try_from(i).expect("fewer than 2^32 objects");
                let payload = bytes::Bytes::from(
                    serde_json::json!({ "object": object, "lsn": commit_lsn.0 }).to_string(),
                );
                Event {
                    id: EventId::derive(&self.name, commit_lsn, ordinal, "memory"),
                    source: self.name.clone(),
                    key: EventKey {
                        commit_lsn,
                        tx_ordinal: ordinal,
                    },
                    tenant_id: tenant.clone(),
                    event_type: event_type.clone(),
                    schema_version: 1,
                    object_id: Some((*object).to_owned()),
                    object_version: None,
                    occurred_at: commit_time,
                    payload_hash: sha2::Sha256::digest(&payload).into(),
                    payload,
                }
            })
            .collect::<Vec<_>>();
        let end_lsn = Lsn(commit_lsn.0 + 8);
        state.committed.push(CapturedTransaction {
            source: self.name.clone(),
            commit_lsn,
            end_lsn,
            commit_time,
            change_count: u32::try_from(events.len()).expect("fewer than 2^32 changes"),
            part: 0,
            ledger: Vec::new(),
            events,
            incidents: Vec::new(),
        });
        drop(state);
        self.wake.notify_waiters();
        end_lsn
    }

    /// The position the source confirmed.
    pub fn confirmed(&self) -> Lsn {
        self.state.lock().confirmed
    }

    /// Runs started so far (failed ones included).
    pub fn runs(&self) -> u32 {
        self.state.lock().runs
    }

    /// The next run fails at once with an error of `kind`.
    pub fn fail_next_run(&self, kind: SourceErrorKind) {
        self.state.lock().fail_next.push(kind);
    }

    fn after(&self, position: Lsn) -> Option<CapturedTransaction> {
        let state = self.state.lock();
        state
            .committed
            .iter()
            .find(|t| t.end_lsn > position)
            .cloned()
    }

    fn confirm(&self, lsn: Lsn) {
        let mut state = self.state.lock();
        state.confirmed = state.confirmed.max(lsn);
    }
}

/// Marks the source free again when a run ends, however it ends.
struct Reading<'a>(&'a MemorySource);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.state.lock().reading = false;
    }
}

/// How long a stopping run waits for receipts still out.
const DRAIN: Duration = Duration::from_secs(10);

impl ChangeSource for MemorySource {
    type Error = MemorySourceError;

    fn name(&self) -> &str {
        &self.name
    }

    async fn run<S: TransactionSink + 'static>(
        &self,
        mut sink: S,
        observer: std::sync::Arc<dyn CaptureObserver>,
        options: RunOptions,
        shutdown: CancellationToken,
    ) -> Result<RunStats, MemorySourceError> {
        let (start, stop_at) = {
            let mut state = self.state.lock();
            state.runs += 1;
            if state.reading {
                return Err(MemorySourceError::Busy(self.name.to_string()));
            }
            if let Some(kind) = state.fail_next.pop() {
                return Err(MemorySourceError::Injected(kind));
            }
            state.reading = true;
            let last = state.committed.last().map_or(Lsn::ZERO, |t| t.end_lsn);
            (state.confirmed, options.stop_when_caught_up.then_some(last))
        };
        let _reading = Reading(self);
        let mut stats = RunStats {
            confirmed: start,
            ..RunStats::default()
        };
        let mut receipts = FuturesOrdered::new();
        let mut read_to = start;
        let durable = |stats: &mut RunStats, lsn: Lsn| {
            stats.confirmed = lsn;
            if options.confirm {
                self.confirm(lsn);
            }
            observer.confirmed(lsn);
        };
        let result = loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Receipts that resolved meanwhile, in order.
            while let Some(Some((lsn, outcome))) = receipts.next().now_or_never() {
                match outcome {
                    Ok(()) => durable(&mut stats, lsn),
                    Err(e) => return Err(MemorySourceError::Receipt(e)),
                }
            }
            let caught_up = stop_at.is_some_and(|s| read_to >= s);
            if caught_up && receipts.is_empty() {
                break Ok(());
            }
            if !caught_up && let Some(tx) = self.after(read_to) {
                read_to = tx.end_lsn;
                observer.transaction(&tx);
                stats.transactions += 1;
                stats.changes += u64::from(tx.change_count);
                stats.events += tx.events.len() as u64;
                let end = tx.end_lsn;
                let receipt = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break Ok(()),
                    handed = sink.hand_off(tx) => handed?,
                };
                receipts.push_back(receipt.map(move |r| (end, r)));
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                Some((lsn, outcome)) = receipts.next(), if !receipts.is_empty() => match outcome {
                    Ok(()) => durable(&mut stats, lsn),
                    Err(e) => break Err(MemorySourceError::Receipt(e)),
                },
                _ = &mut woken, if !caught_up => {}
            }
        };
        result?;
        // What became durable in time is confirmed; the rest is read again.
        let drain = async {
            while let Some((lsn, outcome)) = receipts.next().await {
                outcome.map_err(MemorySourceError::Receipt)?;
                durable(&mut stats, lsn);
            }
            Ok(())
        };
        match tokio::time::timeout(DRAIN, drain).await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(())) | Err(_) => Ok(stats),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::source::contract::{SourceFixture, check_all};

    struct Twin;

    impl SourceFixture for Twin {
        type Source = MemorySource;

        async fn fresh(&self) -> MemorySource {
            MemorySource::new("twin")
        }

        async fn commit(&self, source: &MemorySource, objects: &[&str]) {
            source.commit(objects);
        }
    }

    #[tokio::test]
    async fn the_twin_keeps_the_source_contract() {
        check_all(&Twin).await.unwrap();
    }

    #[tokio::test]
    async fn an_injected_failure_has_its_kind_and_the_next_run_reads() {
        let source = MemorySource::new("twin");
        source.commit(&["a"]);
        source.fail_next_run(SourceErrorKind::Definite);
        let run = |confirm| {
            source.run(
                crate::capture::WriterSink::new(std::io::sink()),
                Arc::new(super::super::LogObserver),
                RunOptions {
                    confirm,
                    stop_when_caught_up: true,
                },
                CancellationToken::new(),
            )
        };
        let e = run(true).await.unwrap_err();
        assert_eq!(e.kind(), SourceErrorKind::Definite);
        let stats = run(true).await.unwrap();
        assert_eq!((stats.events, source.runs()), (1, 2));
        assert_eq!(source.confirmed(), stats.confirmed);
    }
}
