//! The contract every [`CaptureLedgerStore`] must keep: the in-memory store
//! runs it in its unit tests, the Postgres one against a throwaway cluster.
//!
//! Each check uses sources of its own, so the suite runs on one store.

use std::future::Future;

use super::{CaptureLedgerStore, LedgerPart, LedgerSnapshot, PartKey, RuleTally, fold};
use crate::ids::Lsn;
use crate::store::StoreError;
pub use crate::store::contract::ContractError;
use crate::store::contract::check;
use crate::time::Timestamp;

/// A part with tallies `(rule, changes, events, filtered, incidents)` in
/// minute `minute` (of some day).
pub fn part(lsn: u64, n: u32, minute: i64, tallies: &[(&str, u32, u32, u32, u32)]) -> LedgerPart {
    LedgerPart {
        key: PartKey {
            commit_lsn: Lsn(lsn),
            part: n,
        },
        window: Timestamp(1_795_947_000_000_000 + minute * 60_000_000).minute_start(),
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

/// Runs every check; `read` returns what the store holds for a source.
pub async fn check_all<S, R, F>(store: &S, read: R) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    sums_per_rule_and_window(store, &read).await?;
    a_part_is_counted_once(store, &read).await?;
    parts_of_one_transaction_are_counted_once_each(store, &read).await?;
    sources_are_independent(store, &read).await?;
    concurrent_writers_count_a_part_once(store, &read).await?;
    Ok(())
}

async fn expect<R, F>(
    read: &R,
    source: &str,
    parts: &[LedgerPart],
    what: &str,
) -> Result<(), ContractError>
where
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    let want = fold(parts, None);
    let got = read(source).await?;
    check(got.rows == want.rows, || {
        format!(
            "{what}: the ledger of {source} holds {:?}, expected {:?}",
            got.rows, want.rows
        )
    })?;
    check(got.mark == want.mark, || {
        format!(
            "{what}: the mark of {source} is {:?}, expected {:?}",
            got.mark, want.mark
        )
    })
}

async fn sums_per_rule_and_window<S, R, F>(store: &S, read: &R) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    let parts = [
        part(0x100, 0, 0, &[("a", 3, 2, 1, 0), ("b", 2, 0, 1, 1)]),
        part(0x200, 0, 0, &[("a", 1, 1, 0, 0)]),
        part(0x300, 0, 1, &[("a", 5, 5, 0, 0)]),
    ];
    let counted = store.record_ledger_parts("sums", &parts).await?;
    check(counted == 3, || format!("counted {counted} of 3 new parts"))?;
    expect(read, "sums", &parts, "one batch").await?;
    // A later batch adds to the same rows.
    let more = [part(0x400, 0, 1, &[("a", 1, 0, 1, 0)])];
    store.record_ledger_parts("sums", &more).await?;
    let all: Vec<LedgerPart> = parts.iter().chain(&more).cloned().collect();
    expect(read, "sums", &all, "two batches").await?;
    // An empty batch changes nothing.
    let counted = store.record_ledger_parts("sums", &[]).await?;
    check(counted == 0, || format!("an empty batch counted {counted}"))?;
    expect(read, "sums", &all, "an empty batch").await
}

async fn a_part_is_counted_once<S, R, F>(store: &S, read: &R) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    let parts = [
        part(0x100, 0, 0, &[("a", 1, 1, 0, 0)]),
        part(0x200, 0, 0, &[("a", 2, 2, 0, 0)]),
        part(0x300, 0, 0, &[("a", 4, 4, 0, 0)]),
    ];
    store.record_ledger_parts("once", &parts[..2]).await?;
    // The slot sent everything again, and one transaction more.
    let counted = store.record_ledger_parts("once", &parts).await?;
    check(counted == 1, || {
        format!("a batch re-reading two counted parts counted {counted}, expected 1")
    })?;
    let counted = store.record_ledger_parts("once", &parts).await?;
    check(counted == 0, || {
        format!("a batch of counted parts counted {counted}")
    })?;
    expect(read, "once", &parts, "re-read batches").await
}

async fn parts_of_one_transaction_are_counted_once_each<S, R, F>(
    store: &S,
    read: &R,
) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    let parts = [
        part(0x100, 0, 0, &[("a", 4096, 4096, 0, 0)]),
        part(0x100, 1, 0, &[("a", 4096, 4096, 0, 0)]),
        part(0x100, 2, 0, &[("a", 10, 9, 0, 1)]),
    ];
    store.record_ledger_parts("chunks", &parts[..1]).await?;
    // Capture stopped inside the transaction and read it again whole.
    let counted = store.record_ledger_parts("chunks", &parts).await?;
    check(counted == 2, || {
        format!("the re-read of a chunked transaction counted {counted} parts, expected 2")
    })?;
    expect(read, "chunks", &parts, "a chunked transaction read again").await
}

async fn sources_are_independent<S, R, F>(store: &S, read: &R) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    let high = [part(0x900, 0, 0, &[("a", 1, 1, 0, 0)])];
    let low = [part(0x100, 0, 0, &[("a", 2, 2, 0, 0)])];
    store.record_ledger_parts("left", &high).await?;
    let counted = store.record_ledger_parts("right", &low).await?;
    check(counted == 1, || {
        "another source's mark held a part back".to_owned()
    })?;
    expect(read, "left", &high, "source left").await?;
    expect(read, "right", &low, "source right").await
}

async fn concurrent_writers_count_a_part_once<S, R, F>(
    store: &S,
    read: &R,
) -> Result<(), ContractError>
where
    S: CaptureLedgerStore,
    R: Fn(&str) -> F,
    F: Future<Output = Result<LedgerSnapshot, StoreError>>,
{
    // Two runs of capture (one ending, one starting) write the same parts.
    let parts: Vec<LedgerPart> = (1..=20)
        .map(|i| part(i * 0x100, 0, i as i64 % 3, &[("a", 1, 1, 0, 0)]))
        .collect();
    let (a, b) = futures::join!(
        store.record_ledger_parts("race", &parts),
        store.record_ledger_parts("race", &parts)
    );
    let counted = a? + b?;
    check(counted == parts.len(), || {
        format!(
            "two writers of the same {} parts counted {counted}",
            parts.len()
        )
    })?;
    expect(read, "race", &parts, "two writers").await
}
