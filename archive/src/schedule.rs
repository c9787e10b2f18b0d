//! `walhook run`'s archive schedule: a round a minute after start (or
//! after `every`, if shorter), then one every `every`, until shutdown;
//! "today" (the hot window and the retention) from a [`Clock`], so tests
//! move the calendar.

use std::future::Future;
use std::time::Duration;

use chrono::{NaiveDate, Utc};
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use crate::archiver::{Outcome, PartitionReport, Silent};
use crate::{ArchiveError, Archiver, Settings};

/// The first round waits at most this long after start.
pub const FIRST_ROUND_AFTER: Duration = Duration::from_secs(60);

/// Where the schedule reads today's date.
pub trait Clock: Send + Sync {
    /// Today, UTC.
    fn today(&self) -> NaiveDate;
}

/// The system's clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn today(&self) -> NaiveDate {
        Utc::now().date_naive()
    }
}

/// How one scheduled round ended.
#[derive(Debug)]
pub enum Round {
    /// The store could not be opened (the error, as text).
    NoStore(String),
    /// The round ran: each table's day.
    Ran(Vec<PartitionReport>),
    /// Another round held the lock; this one was skipped.
    Busy,
    /// The round stopped (the error, as text) or panicked.
    Stopped(String),
}

/// Runs rounds every `every` until `shutdown` resolves: each opens the
/// store (`open`), archives with `settings` and the clock's today, logs
/// each day's outcome and hands the round to `seen`. A failed round is
/// logged and the next one runs; the hot rows stay until a round
/// succeeds.
#[allow(clippy::disallowed_methods)] // bare spawn: each round in a task of its own so that a panic is logged; the schedule awaits it
pub async fn run_every<S, O, F>(
    every: Duration,
    settings: Settings,
    platform: Platform,
    open: O,
    clock: &dyn Clock,
    shutdown: impl Future<Output = ()>,
    mut seen: impl FnMut(Round),
) where
    S: ObjectStore,
    O: Fn() -> F,
    F: Future<Output = Result<S, String>>,
{
    let mut wait = FIRST_ROUND_AFTER.min(every);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = every;
        let store = match open().await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot open the archive store; trying again at the next round");
                seen(Round::NoStore(e));
                continue;
            }
        };
        let settings = Settings {
            today: Some(clock.today()),
            ..settings.clone()
        };
        let archiver = Archiver::new(platform.clone(), store, settings);
        // A round in a task of its own: a panic in it is logged and the
        // next round runs, instead of ending scheduled archiving unseen.
        let round = tokio::spawn(async move { archiver.run(&Silent).await });
        seen(match round.await {
            Ok(Ok(reports)) => {
                for r in &reports {
                    log(r);
                }
                Round::Ran(reports)
            }
            Ok(Err(ArchiveError::Busy)) => {
                tracing::info!("another archive round is running; this one is skipped");
                Round::Busy
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "the archive round stopped; trying again at the next round");
                Round::Stopped(e.to_string())
            }
            Err(e) => {
                tracing::error!(error = %e, "the archive round panicked; trying again at the next round");
                Round::Stopped(e.to_string())
            }
        });
    }
}

fn log(r: &PartitionReport) {
    match &r.outcome {
        Outcome::Failed(why) => {
            tracing::error!(table = %r.table, day = %r.day, error = %why, "archiving a day failed; its hot rows are kept")
        }
        Outcome::Waiting(why) => {
            tracing::info!(table = %r.table, day = %r.day, reason = %why, "a day is not archived yet")
        }
        Outcome::Expired => {
            tracing::info!(table = %r.table, day = %r.day, rows = r.rows, "an archived day past the retention was deleted")
        }
        Outcome::Archived | Outcome::Planned => {
            tracing::info!(table = %r.table, day = %r.day, rows = r.rows, bytes = r.bytes, files = r.files, "day archived")
        }
    }
}
