//! The contract every [`ChangeSource`] keeps, checked through the trait
//! alone.
//!
//! Each check takes a fresh source from the [`SourceFixture`] (its own slot
//! and table for Postgres), commits transactions through it, and fails with
//! a message naming the rule it broke. The twin ([`super::memory`]) runs the
//! suite in this crate's unit tests; the Postgres source runs it against a
//! real cluster in `walhook-connectors`' tests.
//!
//! The rules:
//! - what was committed is handed off in commit order, each transaction
//!   once per run, its events in change order, carrying the source's name;
//! - what a run confirmed is not read again by the next run;
//! - what was not confirmed (a dry run, a receipt that failed, a sink that
//!   refused) is read again, with the same ids and bytes, and the failure
//!   is transient;
//! - a live run hands off what is committed while it runs, and stops on
//!   shutdown with what was durable confirmed;
//! - one run reads a source at a time: a second one fails, transiently.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::{CaptureObserver, ChangeSource, RunOptions, RunStats, SourceError, SourceErrorKind};
use crate::capture::{CapturedTransaction, SinkError, TransactionSink};
use crate::event::Event;
use crate::ids::Lsn;
use crate::log::{LogError, Receipt};
use crate::supervise::error_chain;

/// Makes the sources the contract is checked on.
pub trait SourceFixture: Sync {
    /// The source under test.
    type Source: ChangeSource;

    /// A source with nothing committed yet, ready to run.
    fn fresh(&self) -> impl Future<Output = Self::Source> + Send;

    /// Commits one transaction that makes one event per object id, in
    /// this order, on `source`'s database.
    fn commit(&self, source: &Self::Source, objects: &[&str]) -> impl Future<Output = ()> + Send;
}

/// A rule the source broke.
#[derive(Debug, thiserror::Error)]
#[error("change source contract broken: {0}")]
pub struct Broken(pub String);

fn check(ok: bool, rule: impl FnOnce() -> String) -> Result<(), Broken> {
    if ok { Ok(()) } else { Err(Broken(rule())) }
}

/// How long a run may take to catch up or to stop (a real source connects,
/// and streams a few transactions).
const WAIT: Duration = Duration::from_secs(60);

/// Runs every check, each on a fresh source.
pub async fn check_all<F: SourceFixture>(fixture: &F) -> Result<(), Broken> {
    reads_in_commit_order(fixture).await?;
    confirmed_work_is_not_read_again(fixture).await?;
    unconfirmed_work_is_read_again(fixture).await?;
    a_failed_receipt_fails_the_run_and_is_read_again(fixture).await?;
    a_refusing_sink_fails_the_run_and_is_read_again(fixture).await?;
    a_live_run_streams_and_stops_on_shutdown(fixture).await?;
    one_run_at_a_time(fixture).await?;
    Ok(())
}

/// What the contract's sink answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Durable at once.
    Durable,
    /// The receipt fails.
    ReceiptFails,
    /// `hand_off` refuses.
    Refuse,
}

/// Collects what a run hands off.
#[derive(Clone)]
struct Collect {
    txs: Arc<Mutex<Vec<CapturedTransaction>>>,
    answer: Answer,
}

impl Collect {
    fn new(answer: Answer) -> Self {
        Collect {
            txs: Arc::default(),
            answer,
        }
    }

    /// The events handed off, in order (transactions without events, a
    /// real source's heartbeats, left out).
    fn events(&self) -> Vec<Event> {
        self.txs
            .lock()
            .iter()
            .flat_map(|t| t.events.clone())
            .collect()
    }

    fn objects(&self) -> Vec<String> {
        self.events()
            .iter()
            .map(|e| e.object_id.clone().unwrap_or_default())
            .collect()
    }

    /// The transactions that made events.
    fn with_events(&self) -> Vec<CapturedTransaction> {
        self.txs
            .lock()
            .iter()
            .filter(|t| !t.events.is_empty())
            .cloned()
            .collect()
    }
}

impl TransactionSink for Collect {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        if self.answer == Answer::Refuse && !tx.events.is_empty() {
            return Err(SinkError::Closed);
        }
        let fails = self.answer == Answer::ReceiptFails && !tx.events.is_empty();
        self.txs.lock().push(tx);
        Ok(if fails {
            Receipt::new(std::future::ready(Err(LogError::Closed)))
        } else {
            Receipt::ready()
        })
    }
}

/// Records the confirmed positions.
#[derive(Default)]
struct Confirmed(Mutex<Vec<Lsn>>);

impl CaptureObserver for Confirmed {
    fn confirmed(&self, lsn: Lsn) {
        self.0.lock().push(lsn);
    }
}

fn options(confirm: bool, stop_when_caught_up: bool) -> RunOptions {
    RunOptions {
        confirm,
        stop_when_caught_up,
    }
}

/// One run to the position current at its start.
async fn catch_up<C: ChangeSource>(
    source: &C,
    sink: &Collect,
    confirm: bool,
) -> Result<Result<RunStats, C::Error>, Broken> {
    tokio::time::timeout(
        WAIT,
        source.run(
            sink.clone(),
            Arc::new(Confirmed::default()),
            options(confirm, true),
            CancellationToken::new(),
        ),
    )
    .await
    .map_err(|_| Broken(format!("a run did not catch up within {WAIT:?}")))
}

/// [`catch_up`] that must succeed.
async fn caught_up<C: ChangeSource>(
    source: &C,
    sink: &Collect,
    confirm: bool,
    what: &str,
) -> Result<RunStats, Broken> {
    catch_up(source, sink, confirm)
        .await?
        .map_err(|e| Broken(format!("{what}: the run failed: {}", error_chain(&e))))
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

async fn reads_in_commit_order<F: SourceFixture>(f: &F) -> Result<(), Broken> {
    let source = f.fresh().await;
    f.commit(&source, &["a1", "a2"]).await;
    f.commit(&source, &["b1"]).await;
    f.commit(&source, &["c1", "c2", "c3"]).await;
    let sink = Collect::new(Answer::Durable);
    let stats = caught_up(&source, &sink, true, "reading three transactions").await?;
    let objects = sink.objects();
    check(
        objects == strings(&["a1", "a2", "b1", "c1", "c2", "c3"]),
        || {
            format!(
                "three transactions are handed off in commit order, their events in change order: got {objects:?}"
            )
        },
    )?;
    let txs = sink.with_events();
    check(txs.len() == 3, || {
        format!(
            "each transaction is handed off once: got {} with events",
            txs.len()
        )
    })?;
    check(
        txs.windows(2)
            .all(|w| w[0].commit_lsn < w[1].commit_lsn && w[0].end_lsn < w[1].end_lsn),
        || "commit and end positions grow with each transaction".into(),
    )?;
    check(
        sink.events().iter().all(|e| &*e.source == source.name()),
        || format!("every event carries the source's name {:?}", source.name()),
    )?;
    check(stats.events == 6, || {
        format!(
            "the run counts the 6 events it handed off: counted {}",
            stats.events
        )
    })?;
    let last = txs.last().map_or(Lsn::ZERO, |t| t.end_lsn);
    check(stats.confirmed >= last, || {
        format!(
            "a caught-up run confirms what was durable: confirmed {} before the last end {last}",
            stats.confirmed
        )
    })
}

async fn confirmed_work_is_not_read_again<F: SourceFixture>(f: &F) -> Result<(), Broken> {
    let source = f.fresh().await;
    f.commit(&source, &["a"]).await;
    let first = Collect::new(Answer::Durable);
    caught_up(&source, &first, true, "the first run").await?;
    f.commit(&source, &["b"]).await;
    let second = Collect::new(Answer::Durable);
    caught_up(&source, &second, true, "the second run").await?;
    let objects = second.objects();
    check(objects == strings(&["b"]), || {
        format!("a run after a confirmed one reads only what is new: got {objects:?}")
    })
}

async fn unconfirmed_work_is_read_again<F: SourceFixture>(f: &F) -> Result<(), Broken> {
    let source = f.fresh().await;
    f.commit(&source, &["a", "b"]).await;
    let dry = Collect::new(Answer::Durable);
    caught_up(&source, &dry, false, "a dry run").await?;
    let again = Collect::new(Answer::Durable);
    caught_up(&source, &again, true, "the run after a dry run").await?;
    let (before, after) = (dry.events(), again.events());
    check(before.len() == 2 && before == after, || {
        format!(
            "what a dry run read is read again, with the same ids and bytes: {:?} then {:?}",
            before.iter().map(|e| &e.object_id).collect::<Vec<_>>(),
            after.iter().map(|e| &e.object_id).collect::<Vec<_>>()
        )
    })
}

/// A run failing as `answer` makes it: transiently, and the next run reads
/// the transaction again.
async fn fails_transiently_and_repeats<F: SourceFixture>(
    f: &F,
    answer: Answer,
    what: &str,
) -> Result<(), Broken> {
    let source = f.fresh().await;
    f.commit(&source, &["a"]).await;
    let failing = Collect::new(answer);
    match catch_up(&source, &failing, true).await? {
        Ok(_) => return Err(Broken(format!("{what}: the run ended without an error"))),
        Err(e) => check(e.kind() == SourceErrorKind::Transient, || {
            format!(
                "{what}: the run's failure is transient: {}",
                error_chain(&e)
            )
        })?,
    }
    let retry = Collect::new(Answer::Durable);
    caught_up(&source, &retry, true, "the run after the failure").await?;
    let objects = retry.objects();
    check(objects == strings(&["a"]), || {
        format!("{what}: the next run reads the transaction again: got {objects:?}")
    })
}

async fn a_failed_receipt_fails_the_run_and_is_read_again<F: SourceFixture>(
    f: &F,
) -> Result<(), Broken> {
    fails_transiently_and_repeats(f, Answer::ReceiptFails, "a receipt that fails").await
}

async fn a_refusing_sink_fails_the_run_and_is_read_again<F: SourceFixture>(
    f: &F,
) -> Result<(), Broken> {
    fails_transiently_and_repeats(f, Answer::Refuse, "a sink that refuses").await
}

/// Waits until `sink` saw `n` events.
async fn until_events(sink: &Collect, n: usize) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    while sink.events().len() < n {
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

async fn a_live_run_streams_and_stops_on_shutdown<F: SourceFixture>(f: &F) -> Result<(), Broken> {
    let source = f.fresh().await;
    let sink = Collect::new(Answer::Durable);
    let observer = Arc::new(Confirmed::default());
    let stop = CancellationToken::new();
    let run = source.run(
        sink.clone(),
        observer.clone(),
        options(true, false),
        stop.clone(),
    );
    let drive = async {
        f.commit(&source, &["live"]).await;
        let seen = until_events(&sink, 1).await;
        stop.cancel();
        seen
    };
    let (ran, seen) = tokio::time::timeout(WAIT * 2, async { tokio::join!(run, drive) })
        .await
        .map_err(|_| Broken("a live run did not stop after shutdown".into()))?;
    check(seen, || {
        "a live run hands off a transaction committed while it runs".into()
    })?;
    let stats = ran.map_err(|e| {
        Broken(format!(
            "a live run stopped by shutdown ends cleanly: {}",
            error_chain(&e)
        ))
    })?;
    let end = sink.with_events().last().map_or(Lsn::ZERO, |t| t.end_lsn);
    check(stats.confirmed >= end, || {
        format!(
            "a stopped run confirmed what was durable: {} < {end}",
            stats.confirmed
        )
    })?;
    check(observer.0.lock().iter().any(|l| *l >= end), || {
        "the observer is told the confirmed position".into()
    })?;
    let after = Collect::new(Answer::Durable);
    caught_up(&source, &after, true, "the run after a stopped one").await?;
    check(after.events().is_empty(), || {
        format!(
            "what a stopped run confirmed is not read again: got {:?}",
            after.objects()
        )
    })
}

async fn one_run_at_a_time<F: SourceFixture>(f: &F) -> Result<(), Broken> {
    let source = f.fresh().await;
    let sink = Collect::new(Answer::Durable);
    let stop = CancellationToken::new();
    let first = source.run(
        sink.clone(),
        Arc::new(Confirmed::default()),
        options(true, false),
        stop.clone(),
    );
    let second = async {
        // The first run reads once it handed a transaction off.
        f.commit(&source, &["held"]).await;
        if !until_events(&sink, 1).await {
            stop.cancel();
            return Err(Broken(
                "the first run never handed off its transaction".into(),
            ));
        }
        let other = Collect::new(Answer::Durable);
        let outcome = catch_up(&source, &other, true).await;
        stop.cancel();
        match outcome? {
            Ok(_) => Err(Broken(
                "a second run of a source that another run reads fails".into(),
            )),
            Err(e) => check(e.kind() == SourceErrorKind::Transient, || {
                format!("a second run's failure is transient: {}", error_chain(&e))
            }),
        }
    };
    let (first, second) = tokio::time::timeout(WAIT * 2, async { tokio::join!(first, second) })
        .await
        .map_err(|_| Broken("two runs did not end".into()))?;
    second?;
    first.map(|_| ()).map_err(|e| {
        Broken(format!(
            "the first run ends cleanly on shutdown: {}",
            error_chain(&e)
        ))
    })
}
