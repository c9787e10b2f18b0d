//! An in-memory [`CaptureLedgerStore`]: the model the Postgres one is held
//! to by the [contract](super::contract), and the store of unit tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::{CaptureLedgerStore, LedgerPart, LedgerSnapshot, fold};
use crate::store::StoreError;

/// Keeps the ledger in memory. [`MemoryLedgerStore::fail_next`] makes
/// writes fail transiently, for tests of the writer's retries.
#[derive(Debug, Default)]
pub struct MemoryLedgerStore {
    sources: Mutex<HashMap<String, LedgerSnapshot>>,
    failures: Mutex<u32>,
    writes: AtomicUsize,
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

    /// What is recorded for `source`.
    pub fn snapshot(&self, source: &str) -> LedgerSnapshot {
        self.sources.lock().get(source).cloned().unwrap_or_default()
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
