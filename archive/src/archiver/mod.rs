//! The archive protocol: which days are due, and for each one export →
//! manifest → verify → drop, with a catalog row recording how far it got.
//!
//! Rules that make a crash anywhere harmless:
//! - The hot rows stay until the objects that hold them have been read back
//!   and matched ([`crate::verify`]); only then does the partition go.
//! - Object keys are a pure function of the day and the rows, and the bytes
//!   are a pure function of the rows (sorted by bucket, tenant, time, id; no
//!   wall clock in any object), so redoing a step rewrites identical objects.
//! - The catalog row is written after the manifest: a run that finds no row
//!   exports again (same bytes), one that finds `written` verifies, one that
//!   finds `verified` drops. A `verified` day is never exported again, since
//!   its hot rows may be partly gone.
//! - A day is due only when nothing can still change it: for deliveries, no
//!   planned, pending or replaying delivery of that day; for events, no such
//!   delivery of an event of that day (the dispatcher still needs its body).

use std::time::Instant;

use chrono::{Duration, NaiveDate, Utc};
use walhook_pipeline::failpoint;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use crate::catalog::PartitionState;
use crate::failure::failure_text;
use crate::layout::partition_name;
use crate::merge::Merge;
use crate::part::PartLimits;
use crate::table::Table;
use crate::verify::Phase;
use crate::{ArchiveError, verify};

mod drop;
mod export;

/// The default hot window: days younger than this stay in Postgres.
pub const DEFAULT_HOT_DAYS: u32 = 3;
/// The default number of rows per Parquet part.
pub const DEFAULT_PART_ROWS: usize = 1_000_000;
/// The default size of a part's rows (256 MiB): a part is built in memory,
/// so this bounds the export's memory, and DuckDB, Athena and Spark read
/// files of this size in a few row groups.
pub const DEFAULT_PART_BYTES: u64 = 256 * 1024 * 1024;
/// The largest `part_bytes` (1 GiB). With one row at most 1 GB (Postgres's
/// limit for a row in a `COPY`), no part can reach Arrow's 2 GiB limit for
/// one array.
pub const MAX_PART_BYTES: u64 = 1024 * 1024 * 1024;
/// Rows deleted per statement when a day of deliveries leaves.
const DELETE_BATCH: i64 = 10_000;
/// Days of deliveries archived before the id index that a round indexes.
const EARLIER_DAYS_INDEXED: i64 = 30;

/// What a run archives and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Days whose end is more than this many days ago are due.
    pub hot_days: u32,
    /// Tenant buckets per day.
    pub tenant_buckets: u16,
    /// Rows per Parquet part at most.
    pub part_rows: usize,
    /// Bytes of rows per Parquet part at most (as the copy stream holds
    /// them); a single row bigger than this gets a part of its own.
    pub part_bytes: u64,
    /// The tables to archive.
    pub tables: Vec<Table>,
    /// Plan only: read counts, write and drop nothing.
    pub dry_run: bool,
    /// "Today", for the hot window (tests and `--today`); `None` is the UTC
    /// date now.
    pub today: Option<NaiveDate>,
    /// Archived days older than this many days have their objects deleted;
    /// `None` keeps them.
    pub retention_days: Option<u32>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            hot_days: DEFAULT_HOT_DAYS,
            tenant_buckets: crate::layout::DEFAULT_TENANT_BUCKETS,
            part_rows: DEFAULT_PART_ROWS,
            part_bytes: DEFAULT_PART_BYTES,
            tables: Table::ALL.to_vec(),
            dry_run: false,
            today: None,
            retention_days: None,
        }
    }
}

impl Settings {
    /// The first day that stays hot.
    pub fn cutoff(&self) -> NaiveDate {
        self.today() - Duration::days(i64::from(self.hot_days))
    }

    pub(crate) fn today(&self) -> NaiveDate {
        self.today.unwrap_or_else(|| Utc::now().date_naive())
    }

    /// How big a part may grow.
    pub fn part_limits(&self) -> PartLimits {
        PartLimits {
            rows: self.part_rows,
            bytes: self.part_bytes,
        }
    }
}

/// Hears about a run's progress (the command line draws a bar).
pub trait Progress: Send + Sync {
    /// A table's day starts, with the rows it holds.
    fn start(&self, _table: Table, _day: NaiveDate, _rows: u64) {}
    /// More rows were written.
    fn rows(&self, _n: u64) {}
    /// The day ended.
    fn finish(&self, _report: &PartitionReport) {}
}

/// A [`Progress`] that hears nothing.
pub struct Silent;
impl Progress for Silent {}

/// How one table's day ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `--dry-run`: what would be archived.
    Planned,
    /// Written, verified and dropped from the hot tables.
    Archived,
    /// Not yet due: the reason.
    Waiting(String),
    /// Older than the retention: its objects were deleted (or, dry run,
    /// would be).
    Expired,
    /// Failed; the hot rows are kept. The error, as text.
    Failed(String),
}

/// One table's day in a run.
#[derive(Debug, Clone)]
pub struct PartitionReport {
    /// The table.
    pub table: Table,
    /// The day.
    pub day: NaiveDate,
    /// The generation written or resumed.
    pub generation: u32,
    /// Rows archived (or, dry run, that would be).
    pub rows: u64,
    /// Parquet bytes stored.
    pub bytes: u64,
    /// Parts stored.
    pub files: usize,
    /// How it ended.
    pub outcome: Outcome,
    /// Wall time spent on it.
    pub seconds: f64,
}

impl PartitionReport {
    /// A report of generation 0 with nothing written yet.
    pub fn new(table: Table, day: NaiveDate, outcome: Outcome) -> Self {
        PartitionReport {
            table,
            day,
            generation: 0,
            rows: 0,
            bytes: 0,
            files: 0,
            outcome,
            seconds: 0.0,
        }
    }
}

/// What removing a day's hot rows did.
enum DropOutcome {
    /// The rows are gone, but for `left` deliveries changed since the
    /// export (they stay hot for a later generation).
    Dropped { left: u64 },
    /// The partition holds other rows than the manifest, or `changed` of
    /// its deliveries changed after the export: nothing dropped.
    Changed {
        hot: u64,
        archived: u64,
        changed: u64,
    },
}

/// Why a day partition was not dropped: rows that arrived after the export
/// (`hot` at the drop against `archived`), or deliveries that changed.
fn what_changed(hot: u64, archived: u64, changed: u64) -> String {
    if hot != archived {
        format!(
            "the day partition holds {hot} rows at the drop, the export took {archived}: rows arrived after the export"
        )
    } else {
        format!(
            "{changed} deliveries of the day changed after the export, are pending or are being replayed (states the archive does not hold yet)"
        )
    }
}

/// A key for `pg_try_advisory_lock`: one archive round at a time per
/// platform database ("walhook archive" in ASCII, roughly).
const ROUND_LOCK: i64 = 0x7761_6c68_6172_6368;

/// Runs the archive protocol against one platform database and one store.
pub struct Archiver<S: ObjectStore> {
    pub(crate) platform: Platform,
    pub(crate) store: S,
    pub(crate) settings: Settings,
}

impl<S: ObjectStore> Archiver<S> {
    /// An archiver of `platform`'s hot tables into `store`.
    pub fn new(platform: Platform, store: S, settings: Settings) -> Self {
        Archiver {
            platform,
            store,
            settings,
        }
    }

    /// The store written to.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Archives every due day of every table, oldest first. A day that
    /// fails (a row the exporter refuses, a part Parquet cannot take, a
    /// verification that does not match, a transient error) is reported,
    /// counted and recorded as an incident, its hot rows kept, and the run
    /// goes on with the next day and the other tables; only a definite
    /// failure of the store or the database ends the run (see
    /// [`ArchiveError::ends_the_run`]).
    ///
    /// One round runs at a time per platform database (a session advisory
    /// lock, released when the round ends or its process dies): a second
    /// archiver (`walhook run`'s schedule next to a `walhook archive`) gets
    /// [`ArchiveError::Busy`] instead of racing the first over the catalog.
    pub async fn run(&self, progress: &dyn Progress) -> Result<Vec<PartitionReport>, ArchiveError> {
        // A connection of its own, out of the pool: dropping it (the round
        // ends, fails or is cancelled) closes it and so releases the lock.
        let lock = deadpool_postgres::Object::take(self.platform.client().await?);
        let held: bool = lock
            .query_one("SELECT pg_try_advisory_lock($1)", &[&ROUND_LOCK])
            .await
            .map_err(ArchiveError::query("take the archive round's lock"))?
            .get(0);
        if !held {
            return Err(ArchiveError::Busy);
        }
        let result = self.run_locked(progress).await;
        let _ = lock
            .execute("SELECT pg_advisory_unlock($1)", &[&ROUND_LOCK])
            .await;
        result
    }

    async fn run_locked(
        &self,
        progress: &dyn Progress,
    ) -> Result<Vec<PartitionReport>, ArchiveError> {
        let mut reports = Vec::new();
        for table in self.settings.tables.clone() {
            for day in self.due_days(table).await? {
                let started = Instant::now();
                let mut report = match self.archive_day(table, day, progress).await {
                    Ok(r) => {
                        if r.outcome == Outcome::Archived {
                            self.resolve_failure(table, day).await;
                        }
                        r
                    }
                    Err(e) if e.ends_the_run() => {
                        tracing::error!(%table, %day, error = %failure_text(&e), "the archive store or the platform database failed; the run stops and the hot rows are kept");
                        return Err(e);
                    }
                    Err(e) => self.day_failed(table, day, &e).await,
                };
                report.seconds = started.elapsed().as_secs_f64();
                progress.finish(&report);
                reports.push(report);
            }
        }
        if !self.settings.dry_run && self.settings.tables.contains(&Table::Deliveries) {
            let n = self.index_earlier_days(EARLIER_DAYS_INDEXED).await?;
            if n > 0 {
                tracing::info!(
                    generations = n,
                    "indexed days of deliveries archived before the id index"
                );
            }
        }
        if let Some(days) = self.settings.retention_days {
            for report in self.expire(days).await? {
                progress.finish(&report);
                reports.push(report);
            }
        }
        Ok(reports)
    }

    /// Takes one table's day as far as it can go.
    pub async fn archive_day(
        &self,
        table: Table,
        day: NaiveDate,
        progress: &dyn Progress,
    ) -> Result<PartitionReport, ArchiveError> {
        let pending = self.catalog(table, day).await?;
        let mut report = PartitionReport::new(table, day, Outcome::Archived);
        let resume = match pending {
            Some(row)
                if matches!(
                    row.state,
                    PartitionState::Written | PartitionState::Verified
                ) =>
            {
                // A written manifest that has gone from the store (removed by
                // the operator after a failed verification) means: write the
                // day anew, which is safe while nothing was dropped.
                if row.state == PartitionState::Written
                    && self.store.get(&row.manifest_key).await?.is_none()
                {
                    self.forget(table, day, row.generation).await?;
                    None
                } else {
                    Some(row)
                }
            }
            _ => None,
        };
        let row = match resume {
            Some(row) => row,
            None => {
                if let Some(reason) = self.not_due_because(table, day).await? {
                    report.outcome = Outcome::Waiting(reason);
                    return Ok(report);
                }
                let generation = self.next_generation(table, day).await?;
                if self.settings.dry_run {
                    report.generation = generation;
                    report.rows = self.hot_count(table, day).await?;
                    report.outcome = Outcome::Planned;
                    return Ok(report);
                }
                // A day archived before: this generation is compacted over
                // its live set (see `crate::merge`).
                let live = self.live_set(table, day).await?;
                let merge = (!live.is_empty()).then(|| Merge::new(table, live));
                self.export(table, day, generation, merge, progress).await?
            }
        };
        report.generation = row.generation;
        if self.settings.dry_run {
            report.outcome = Outcome::Planned;
            return Ok(report);
        }
        failpoint::hit("archive.before_verify");
        let phase = if row.state == PartitionState::Written {
            Phase::Staged
        } else {
            Phase::Live
        };
        let mut manifest = verify::verify_in(
            &self.store,
            table,
            day,
            &row.manifest_key,
            &row.manifest_sha256,
            phase,
        )
        .await?;
        report.rows = manifest.row_count;
        report.bytes = manifest.byte_count;
        report.files = manifest.files.len();
        if row.state == PartitionState::Written && manifest.compaction.is_some() {
            // No count against the hot table here: rows that reach the day
            // or change after the export stay hot (see the drop) and go to
            // the next generation, so publication never has to be undone.
            self.publish(&manifest).await?;
            manifest = verify::verify_in(
                &self.store,
                table,
                day,
                &row.manifest_key,
                &row.manifest_sha256,
                Phase::Live,
            )
            .await?;
            self.record_verified(table, day, row.generation, &manifest)
                .await?;
        } else if row.state == PartitionState::Written {
            let hot = self.hot_count(table, day).await?;
            if hot != manifest.row_count {
                // Rows reached or left the day after it was exported; the
                // hot rows are whole, so the next run writes the day anew.
                self.forget(table, day, row.generation).await?;
                report.outcome = Outcome::Waiting(format!(
                    "the hot table holds {hot} rows of this day, the manifest {}: rows changed after the export; the day is written anew on the next run",
                    manifest.row_count
                ));
                return Ok(report);
            }
            self.record_verified(table, day, row.generation, &manifest)
                .await?;
        }
        failpoint::hit("archive.before_drop");
        let left = match self.drop_hot(table, day, &manifest, &row).await? {
            DropOutcome::Dropped { left } => left,
            DropOutcome::Changed {
                hot,
                archived,
                changed,
            } if manifest.compaction.is_some() => {
                // Published: the generation stands, the partition stays,
                // and the next generation takes its rows again.
                self.clear_staged(&manifest).await?;
                self.set_state(table, day, row.generation, PartitionState::Dropped)
                    .await?;
                report.outcome = Outcome::Waiting(format!(
                    "{}; nothing was dropped and the day is archived again as generation {} on a later run",
                    what_changed(hot, archived, changed),
                    row.generation + 1
                ));
                return Ok(report);
            }
            DropOutcome::Changed {
                hot,
                archived,
                changed,
            } => {
                self.forget(table, day, row.generation).await?;
                report.outcome = Outcome::Waiting(format!(
                    "{}; nothing was dropped and the day is written anew on the next run",
                    what_changed(hot, archived, changed)
                ));
                return Ok(report);
            }
        };
        failpoint::hit("archive.after_drop");
        self.clear_staged(&manifest).await?;
        self.set_state(table, day, row.generation, PartitionState::Dropped)
            .await?;
        if left > 0 {
            report.outcome = Outcome::Waiting(format!(
                "{left} deliveries of this day changed after the export (a replay) and stay hot; they are archived as generation {} on a later run",
                row.generation + 1
            ));
        }
        Ok(report)
    }

    /// Rows of `table`'s `day` in the hot table.
    async fn hot_count(&self, table: Table, day: NaiveDate) -> Result<u64, ArchiveError> {
        let client = self.platform.client().await?;
        let Some(source) = self.hot_day(&client, table, day).await?.source(day) else {
            return Ok(0);
        };
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {source}"), &[])
            .await
            .map_err(ArchiveError::query("count a day's hot rows"))?
            .get(0);
        Ok(n as u64)
    }

    /// Where the hot rows of `table`'s `day` are.
    pub(crate) async fn hot_day(
        &self,
        client: &deadpool_postgres::Object,
        table: Table,
        day: NaiveDate,
    ) -> Result<HotDay, ArchiveError> {
        let name = partition_name(table, day);
        if relation_exists(client, &name).await? {
            return Ok(HotDay::Partition(name));
        }
        if let Some(legacy) = table.legacy_partition()
            && relation_exists(client, legacy).await?
        {
            return Ok(HotDay::Legacy(legacy));
        }
        Ok(HotDay::Nowhere)
    }
}

/// Where a day's hot rows are.
pub(crate) enum HotDay {
    /// In the day's own partition (its name).
    Partition(String),
    /// In the legacy partition (its name), among other days' rows.
    Legacy(&'static str),
    /// Nowhere: the day has no hot rows.
    Nowhere,
}

impl HotDay {
    /// The rows as a `FROM` item, if there are any; a day in the legacy
    /// partition is read through the tenant index. COPY takes no
    /// parameters: the values are a name and two dates this code formats,
    /// never input.
    fn source(&self, day: NaiveDate) -> Option<String> {
        match self {
            HotDay::Partition(name) => Some(format!("walhook.{name}")),
            HotDay::Legacy(legacy) => {
                let next = day + Duration::days(1);
                Some(format!(
                    "(SELECT d.* FROM walhook.tenants t, LATERAL (SELECT * FROM walhook.{legacy} d \
                     WHERE d.tenant_id = t.id AND d.created_at >= '{day} 00:00:00+00' \
                     AND d.created_at < '{next} 00:00:00+00') d) d"
                ))
            }
            HotDay::Nowhere => None,
        }
    }
}

/// Whether `walhook.{name}` exists.
async fn relation_exists(
    client: &deadpool_postgres::Object,
    name: &str,
) -> Result<bool, ArchiveError> {
    Ok(client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("walhook.{name}")],
        )
        .await
        .map_err(ArchiveError::query("look for a day partition"))?
        .get(0))
}
