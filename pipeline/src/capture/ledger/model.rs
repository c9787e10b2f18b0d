//! A model-based test of the ledger's exactly-once promise: capture runs
//! over a fixed stream of transaction parts, each run from the slot's
//! confirmed position, with receipts that fail and runs that crash
//! (their writers left running beside the next run's); after a last clean
//! run the ledger holds every part exactly once.

use std::sync::Arc;

use proptest::prelude::*;

use super::memory::MemoryLedgerStore;
use super::{LedgerPart, PartKey, RuleTally, fold, with_source_tally};
use crate::capture::{CapturedTransaction, LedgerSink, SinkError, TransactionSink};
use crate::ids::Lsn;
use crate::log::{LogError, Receipt};
use crate::time::Timestamp;

/// Fails the receipt of the `fail`-th hand-off of a run.
struct Flaky {
    handed: usize,
    fail: Option<usize>,
}

impl TransactionSink for Flaky {
    async fn hand_off(&mut self, _tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        let n = self.handed;
        self.handed += 1;
        if Some(n) == self.fail {
            return Ok(Receipt::new(async { Err(LogError::Closed) }));
        }
        // Durable a little later, as the log's receipts are.
        Ok(Receipt::new(async {
            tokio::task::yield_now().await;
            Ok(())
        }))
    }
}

/// One run of capture: where its inner receipts fail, after how many
/// hand-offs it crashes, and how many of its durable transactions the
/// acker confirmed before it stopped.
#[derive(Debug, Clone)]
struct Run {
    fail: Option<usize>,
    crash_after: Option<usize>,
    confirm_at_most: usize,
}

fn run_strategy() -> impl Strategy<Value = Run> {
    (
        proptest::option::of(0..12usize),
        proptest::option::of(0..12usize),
        0..8usize,
    )
        .prop_map(|(fail, crash_after, confirm_at_most)| Run {
            fail,
            crash_after,
            confirm_at_most,
        })
}

fn part_tx(tx: usize, part: u32, events: u32) -> CapturedTransaction {
    let commit_time = Timestamp(1_795_947_000_000_000 + tx as i64 * 20_000_000);
    CapturedTransaction {
        source: "main".into(),
        commit_lsn: Lsn(0x1000 * (tx as u64 + 1)),
        end_lsn: Lsn(0x1000 * (tx as u64 + 1) + 8),
        commit_time,
        change_count: events,
        part,
        ledger: if events == 0 {
            Vec::new()
        } else {
            vec![RuleTally {
                rule: if tx.is_multiple_of(2) { "even" } else { "odd" }.into(),
                changes: events + 1,
                events,
                filtered: 1,
                incidents: 0,
            }]
        },
        events: Vec::new(),
        incidents: Vec::new(),
    }
}

/// Runs capture over `txs` (events per part of each transaction) from
/// transaction `start`; returns the first transaction not confirmed.
async fn capture(
    txs: &[Vec<u32>],
    start: usize,
    store: &Arc<MemoryLedgerStore>,
    run: &Run,
) -> usize {
    let mut sink = LedgerSink::new(
        Flaky {
            handed: 0,
            fail: run.fail,
        },
        store.clone(),
    );
    let mut receipts: Vec<(usize, Receipt)> = Vec::new();
    let mut handed = 0;
    'read: for (i, parts) in txs.iter().enumerate().skip(start) {
        for (p, events) in parts.iter().enumerate() {
            if run.crash_after == Some(handed) {
                break 'read;
            }
            handed += 1;
            match sink.hand_off(part_tx(i, p as u32, *events)).await {
                Ok(r) => receipts.push((i, r)),
                Err(_) => break 'read,
            }
        }
    }
    // A crash drops the sink; its writer goes on with what it holds.
    drop(sink);
    // The acker: in order, a transaction once all its parts resolved.
    let mut confirmed = start;
    let mut open: Option<usize> = None;
    for (i, receipt) in receipts {
        if open != Some(i) {
            if let Some(done) = open {
                confirmed = done + 1;
            }
            open = Some(i);
        }
        if receipt.await.is_err() {
            open = None;
            break;
        }
    }
    // The last transaction counts only if all its parts were handed off.
    if let Some(done) = open
        && handed_all(txs, start, run.crash_after, done)
    {
        confirmed = done + 1;
    }
    confirmed.min(start + run.confirm_at_most)
}

/// Whether every part of transaction `tx` was handed off by a run that
/// started at `start` and crashed after `crash_after` hand-offs.
fn handed_all(txs: &[Vec<u32>], start: usize, crash_after: Option<usize>, tx: usize) -> bool {
    let through: usize = txs[start..=tx].iter().map(Vec::len).sum();
    crash_after.is_none_or(|c| c >= through)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_part_is_counted_exactly_once_whatever_fails(
        txs in proptest::collection::vec(proptest::collection::vec(0..5u32, 1..4), 1..8),
        runs in proptest::collection::vec(run_strategy(), 0..6),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let store = Arc::new(MemoryLedgerStore::new());
        rt.block_on(async {
            let mut start = 0;
            for run in &runs {
                start = capture(&txs, start, &store, run).await;
            }
            let clean = Run { fail: None, crash_after: None, confirm_at_most: usize::MAX / 2 };
            let end = capture(&txs, start, &store, &clean).await;
            assert_eq!(end, txs.len());
        });
        let all: Vec<LedgerPart> = txs
            .iter()
            .enumerate()
            .flat_map(|(i, parts)| {
                parts.iter().enumerate().map(move |(p, events)| {
                    let tx = part_tx(i, p as u32, *events);
                    LedgerPart {
                        key: PartKey { commit_lsn: tx.commit_lsn, part: tx.part },
                        window: tx.commit_time.minute_start(),
                        tallies: with_source_tally(&tx.ledger, tx.change_count),
                    }
                })
            })
            .filter(|p| !p.tallies.is_empty())
            .collect();
        prop_assert_eq!(store.snapshot("main").rows, fold(&all, None).rows);
    }
}
