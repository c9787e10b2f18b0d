//! An in-memory [`CaptureLedgerStore`]: the model the Postgres one is held
//! to by the [contract](super::contract), and the store of unit tests. It
//! keeps capture's incidents and checkpoints too, so that capture can run
//! on it alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{CaptureLedgerStore, LedgerPart, LedgerSnapshot, fold};
use crate::capture::{CaptureIncidentStore, Incident};
use crate::ids::Lsn;
use crate::runtime::CheckpointStore;
use crate::store::StoreError;

/// Keeps the ledger in memory. [`MemoryLedgerStore::fail_next`] makes
/// writes fail transiently, for tests of the writer's retries.
#[derive(Debug, Default)]
pub struct MemoryLedgerStore {
    sources: Mutex<HashMap<String, LedgerSnapshot>>,
    failures: Mutex<u32>,
    writes: AtomicUsize,
    incidents: Mutex<Vec<Incident>>,
    checkpoints: Mutex<HashMap<String, Lsn>>,
}

impl MemoryLedgerStore {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes the next `n` writes fail with a transient error.
    pub fn fail_next(&self, n: u32) {
        *self.failures.lock() = n;
    }

    /// How many writes succeeded (batches, not parts).
    pub fn writes(&self) -> usize {
        self.writes.load(Ordering::Relaxed)
    }

    /// The capture incidents stored, in order.
    pub fn incidents(&self) -> Vec<Incident> {
        self.incidents.lock().clone()
    }

    /// The last checkpoint saved for `source`.
    pub fn checkpoint(&self, source: &str) -> Option<Lsn> {
        self.checkpoints.lock().get(source).copied()
    }

    /// What is recorded for `source`.
    pub fn snapshot(&self, source: &str) -> LedgerSnapshot {
        self.sources.lock().get(source).cloned().unwrap_or_default()
    }
}

impl CaptureIncidentStore for MemoryLedgerStore {
    async fn record_capture_incidents(
        &self,
        _source: &str,
        incidents: &[Incident],
    ) -> Result<(), StoreError> {
        let mut stored = self.incidents.lock();
        for incident in incidents {
            if !stored.contains(incident) {
                stored.push(incident.clone());
            }
        }
        Ok(())
    }
}

impl CheckpointStore for MemoryLedgerStore {
    async fn save_checkpoint(
        &self,
        source: &str,
        _slot: &str,
        lsn: Lsn,
        _lag_bytes: Option<i64>,
    ) -> Result<(), StoreError> {
        self.checkpoints.lock().insert(source.to_owned(), lsn);
        Ok(())
    }
}

impl CaptureLedgerStore for MemoryLedgerStore {
    async fn record_ledger_parts(
        &self,
        source: &str,
        parts: &[LedgerPart],
    ) -> Result<usize, StoreError> {
        {
            let mut failures = self.failures.lock();
            if *failures > 0 {
                *failures -= 1;
                return Err(StoreError::transient(
                    "the in-memory ledger was told to fail",
                    std::io::Error::other("injected"),
                ));
            }
        }
        let mut sources = self.sources.lock();
        let ledger = sources.entry(source.to_owned()).or_default();
        let folded = fold(parts, ledger.mark);
        for add in folded.rows {
            match ledger
                .rows
                .iter_mut()
                .find(|r| r.rule == add.rule && r.window == add.window)
            {
                Some(row) => row.add(&add),
                None => ledger.rows.push(add),
            }
        }
        ledger
            .rows
            .sort_by(|a, b| (&a.rule, a.window).cmp(&(&b.rule, b.window)));
        ledger.mark = ledger.mark.max(folded.mark);
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(folded.counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_memory_store_keeps_the_contract() {
        let store = MemoryLedgerStore::new();
        super::super::contract::check_all(&store, |source| {
            let snap = store.snapshot(source);
            async move { Ok(snap) }
        })
        .await
        .unwrap();
    }
}
