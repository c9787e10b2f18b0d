//! The capture ledger: what capture counted, per (source, rule, minute of
//! commit time), so that reconciliation can compare it with the events
//! stored for those minutes.
//!
//! ```text
//!  StreamState ──CapturedTransaction { part, ledger: [RuleTally] }──▶ LedgerSink ──▶ inner sink (log)
//!                                                                        │ (tallies, key, inner receipt)
//!                                                                        ▼
//!                           one writer task: await inner receipts in order, fold the
//!                           batch per (rule, window), CaptureLedgerStore::record_ledger_parts
//!                                                                        │
//!              acker ◀── outer receipt: events durable AND ledger committed
//! ```
//!
//! Exactly once: every transaction part has a key, (commit LSN, part
//! number), which is the same when the slot sends the transaction again
//! (same WAL, same chunking). The store keeps, per source, the key of the
//! last part it counted (the *mark*) and, in the transaction that adds a
//! batch, counts only parts above it and moves it. Parts reach the store
//! in key order, only after their events are durable, and the slot is not
//! confirmed past a part before its batch committed; so a part is counted
//! at most once (the mark), and at least once (a part not counted is never
//! confirmed, so it is read again).
//!
//! Per rule and part, `changes = events + filtered + incidents`. The
//! source's own row ([`SOURCE_RULE`]) counts each change of the part once.

#[cfg(any(test, feature = "testing"))]
pub mod contract;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
#[cfg(test)]
mod model;
pub mod sink;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use crate::ids::Lsn;
use crate::store::StoreError;
use crate::time::Timestamp;

/// What one rule did in one transaction part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleTally {
    /// The rule's name.
    pub rule: Arc<str>,
    /// Changes the rule looked at: every row change of a table it is on,
    /// every transactional message with its prefix.
    pub changes: u32,
    /// Events it made that were kept.
    pub events: u32,
    /// Changes its operations or conditions left out.
    pub filtered: u32,
    /// Changes it could not turn into an event (including events larger
    /// than `max_event_bytes`).
    pub incidents: u32,
}

impl RuleTally {
    /// A tally of nothing yet.
    pub fn new(rule: Arc<str>) -> Self {
        RuleTally {
            rule,
            changes: 0,
            events: 0,
            filtered: 0,
            incidents: 0,
        }
    }

    /// The tally of `rule` in `ledger`, added when absent. A source has few
    /// rules, so a short list searched in order beats a map here.
    pub fn entry<'a>(ledger: &'a mut Vec<RuleTally>, rule: &Arc<str>) -> &'a mut RuleTally {
        match ledger.iter().position(|t| t.rule == *rule) {
            Some(i) => &mut ledger[i],
            None => {
                ledger.push(RuleTally::new(rule.clone()));
                ledger.last_mut().expect("just pushed")
            }
        }
    }
}

/// The ledger row of the source itself, beside its rules' rows: every row
/// change (and transactional message) the source read, counted once
/// however many rules looked at it. Its `events`, `filtered` and
/// `incidents` are 0: those belong to the rules. No rule can take this
/// name (the config refuses it).
pub const SOURCE_RULE: &str = "*";

/// `tallies` with the source's own tally of `changes` added (none when the
/// part read no change).
pub fn with_source_tally(tallies: &[RuleTally], changes: u32) -> Vec<RuleTally> {
    let mut out = tallies.to_vec();
    if changes > 0 {
        let mut source = RuleTally::new(SOURCE_RULE.into());
        source.changes = changes;
        out.push(source);
    }
    out
}

/// Where a transaction part sits in the stream: the ledger's
/// de-duplication key (ordered by commit LSN, then part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartKey {
    /// The transaction's commit LSN.
    pub commit_lsn: Lsn,
    /// The part: 0 for the first chunk of a transaction, the highest for
    /// the one handed off at its commit.
    pub part: u32,
}

impl std::fmt::Display for PartKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.commit_lsn, self.part)
    }
}

/// One transaction part's tallies, as the ledger takes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPart {
    /// Its key.
    pub key: PartKey,
    /// The minute of its commit time ([`Timestamp::minute_start`]).
    pub window: Timestamp,
    /// Per rule; rules that saw nothing are absent.
    pub tallies: Vec<RuleTally>,
}

/// The ledger's sums for one (rule, window) of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRow {
    /// The rule.
    pub rule: String,
    /// The start of the minute.
    pub window: Timestamp,
    /// Changes the rule looked at.
    pub changes: u64,
    /// Events made and kept.
    pub events: u64,
    /// Changes left out by operations or conditions.
    pub filtered: u64,
    /// Incidents.
    pub incidents: u64,
    /// The smallest commit LSN counted.
    pub first_commit_lsn: Lsn,
    /// The largest commit LSN counted.
    pub last_commit_lsn: Lsn,
}

impl LedgerRow {
    fn add(&mut self, other: &LedgerRow) {
        self.changes += other.changes;
        self.events += other.events;
        self.filtered += other.filtered;
        self.incidents += other.incidents;
        self.first_commit_lsn = self.first_commit_lsn.min(other.first_commit_lsn);
        self.last_commit_lsn = self.last_commit_lsn.max(other.last_commit_lsn);
    }
}

/// One source's ledger and mark, as read back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    /// The key of the last part counted.
    pub mark: Option<PartKey>,
    /// The sums, sorted by (rule, window).
    pub rows: Vec<LedgerRow>,
}

/// What a batch adds to the ledger once the parts at or below the mark
/// are left out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Folded {
    /// One row per (rule, window), sorted.
    pub rows: Vec<LedgerRow>,
    /// The largest key counted: the new mark (none when nothing is new).
    pub mark: Option<PartKey>,
    /// How many parts were counted.
    pub counted: usize,
}

/// Sums the parts above `mark` per (rule, window): a statement then touches
/// each ledger row once, however many transactions the batch holds.
pub fn fold(parts: &[LedgerPart], mark: Option<PartKey>) -> Folded {
    let mut rows: BTreeMap<(&str, Timestamp), LedgerRow> = BTreeMap::new();
    let mut folded = Folded::default();
    for part in parts.iter().filter(|p| mark.is_none_or(|m| p.key > m)) {
        folded.counted += 1;
        folded.mark = folded.mark.max(Some(part.key));
        for t in &part.tallies {
            let add = LedgerRow {
                rule: t.rule.to_string(),
                window: part.window,
                changes: u64::from(t.changes),
                events: u64::from(t.events),
                filtered: u64::from(t.filtered),
                incidents: u64::from(t.incidents),
                first_commit_lsn: part.key.commit_lsn,
                last_commit_lsn: part.key.commit_lsn,
            };
            match rows.get_mut(&(&*t.rule, part.window)) {
                Some(row) => row.add(&add),
                None => {
                    rows.insert((&*t.rule, part.window), add);
                }
            }
        }
    }
    folded.rows = rows.into_values().collect();
    folded
}

/// Where the capture ledger is kept (the platform database).
pub trait CaptureLedgerStore: Send + Sync + 'static {
    /// Adds `parts` of `source` to the ledger in one transaction: parts
    /// whose key is at or below the source's mark were counted before (the
    /// slot sent them again) and are left out; the rest are summed per
    /// (rule, window) into the ledger and the mark moves to the largest key.
    /// Concurrent calls for one source are serialised on the mark. Returns
    /// how many parts were counted; durable when it resolves `Ok`, and
    /// nothing is counted when it fails.
    fn record_ledger_parts(
        &self,
        source: &str,
        parts: &[LedgerPart],
    ) -> impl Future<Output = Result<usize, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(lsn: u64, n: u32, minute: i64, tallies: &[(&str, u32, u32, u32, u32)]) -> LedgerPart {
        LedgerPart {
            key: PartKey {
                commit_lsn: Lsn(lsn),
                part: n,
            },
            window: Timestamp(minute * 60_000_000),
            tallies: tallies
                .iter()
                .map(|&(rule, changes, events, filtered, incidents)| RuleTally {
                    rule: rule.into(),
                    changes,
                    events,
                    filtered,
                    incidents,
                })
                .collect(),
        }
    }

    #[test]
    fn entry_adds_a_rule_once() {
        let mut ledger = Vec::new();
        let a: Arc<str> = "a".into();
        RuleTally::entry(&mut ledger, &a).changes += 1;
        RuleTally::entry(&mut ledger, &"b".into()).events += 1;
        // Another allocation of the same name is the same rule.
        RuleTally::entry(&mut ledger, &"a".into()).changes += 1;
        assert_eq!(ledger.len(), 2);
        assert_eq!((ledger[0].changes, ledger[1].events), (2, 1));
    }

    #[test]
    fn fold_sums_per_rule_and_window_and_bounds_the_lsns() {
        let parts = [
            part(10, 0, 5, &[("a", 3, 2, 1, 0), ("b", 1, 0, 0, 1)]),
            part(10, 1, 5, &[("a", 4, 4, 0, 0)]),
            part(20, 0, 5, &[("a", 1, 1, 0, 0)]),
            part(30, 0, 6, &[("a", 2, 0, 2, 0)]),
        ];
        let f = fold(&parts, None);
        assert_eq!(f.counted, 4);
        assert_eq!(
            f.mark,
            Some(PartKey {
                commit_lsn: Lsn(30),
                part: 0
            })
        );
        let got: Vec<_> = f
            .rows
            .iter()
            .map(|r| {
                (
                    r.rule.as_str(),
                    r.window.0 / 60_000_000,
                    r.changes,
                    r.events,
                    r.filtered,
                    r.incidents,
                    r.first_commit_lsn.0,
                    r.last_commit_lsn.0,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", 5, 8, 7, 1, 0, 10, 20),
                ("a", 6, 2, 0, 2, 0, 30, 30),
                ("b", 5, 1, 0, 0, 1, 10, 10),
            ]
        );
    }

    #[test]
    fn fold_leaves_out_parts_at_or_below_the_mark() {
        let parts = [
            part(10, 0, 1, &[("a", 1, 1, 0, 0)]),
            part(10, 1, 1, &[("a", 1, 1, 0, 0)]),
            part(20, 0, 1, &[("a", 1, 1, 0, 0)]),
        ];
        let mark = PartKey {
            commit_lsn: Lsn(10),
            part: 1,
        };
        let f = fold(&parts, Some(mark));
        assert_eq!(f.counted, 1);
        assert_eq!(f.rows[0].changes, 1);
        assert_eq!(f.rows[0].first_commit_lsn, Lsn(20));
        // Nothing above the mark: nothing to write, the mark stays.
        let none = fold(&parts[..2], Some(mark));
        assert_eq!(none, Folded::default());
    }
}
