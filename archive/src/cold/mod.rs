//! Cold reads: archived deliveries, their attempts and events, by id and
//! by listing, with the same ids and bytes they had in the hot tables; and
//! the restore that lets an archived delivery be replayed.
//!
//! ```text
//!  listing (newest first, keyset cursor)        lookup by id
//!     │ catalog: archived days below the cursor    │ id index: exceptions, then the
//!     │ (at most days_per_request of them)         │ range holding the id → one day
//!     ▼                                            ▼
//!  manifests of the day (cache) ── the tenant's bucket, parts naming the tenant
//!     ▼
//!  footer + page index of each part (cache; ranged GETs)
//!     ▼ statistics: row groups and pages of the tenant, the time window, the id
//!  pages of the filter columns, then of the output columns, for the rows kept
//!     ▼
//!  records; a listing stops when the page is full, the days or bytes of the
//!  request's budget are spent (a cursor at the day boundary), or the days end
//! ```
//!
//! What one request may take is bounded three ways ([`ColdLimits`]): the
//! archived days and the bytes a listing reads before it answers with a
//! cursor (a listing that matches nothing pages through the archive in
//! several cheap requests instead of one that reads it all), the archive
//! reads a tenant may have at once (more are refused with
//! [`ArchiveError::TenantReadsBusy`]), and the memory manifests and footers
//! may take ([`cache`]).
//!
//! - [`listing`]: paging through archived days.
//! - [`lookup`]: a delivery, its event and its attempts by id.
//! - [`restore`]: the restore behind replays.
//! - `reader`, `prune`, `predicate`: ranged reads, pruning by statistics,
//!   conditions evaluated while decoding.
//! - [`counting`]: a store wrapper that counts reads (metrics, tests).

pub mod cache;
pub mod counting;
pub mod listing;
pub mod lookup;
mod predicate;
mod prune;
pub(crate) mod reader;
mod restore;
pub(crate) mod rows;
mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::RecordBatch;
use chrono::NaiveDate;
use futures::TryStreamExt;
use parquet::arrow::ParquetRecordBatchStreamBuilder;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use parquet::arrow::async_reader::AsyncFileReader;
use walhook_pipeline::ids::TenantId;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;
use walhook_sql::deliveries::EventRecord;

use crate::ArchiveError;
use crate::dates::NaiveDateSql;
use crate::layout::bucket_of;
use crate::manifest::{FileEntry, Manifest};
use crate::table::Table;
use cache::{Meta, MetaCache};
use predicate::Pred;
use prune::Selection;
use reader::{PartReader, Spend};
use slots::TenantSlots;

pub use cache::DEFAULT_CACHE_BYTES;
pub use counting::{CountingStore, ReadTotals};
pub use listing::ListPage;
pub use predicate::Keyset;
pub use slots::{DEFAULT_READS_PER_TENANT, Slot};

/// The default replay window for archived deliveries.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// The default number of archived days one listing request reads: a
/// listing that matches nothing walks 30 days in five requests.
pub const DEFAULT_DAYS_PER_REQUEST: usize = 7;

/// The default number of bytes one listing request reads from the store
/// (manifests, footers and pages not cached): 8 MiB, tens of milliseconds
/// from a local disk or S3 in the same region.
pub const DEFAULT_BYTES_PER_REQUEST: u64 = 8 * 1024 * 1024;

/// What one request, and one tenant, may take from the archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdLimits {
    /// Archived days a listing request reads before it answers with a
    /// cursor.
    pub days_per_request: usize,
    /// Bytes a listing request reads from the store before it answers
    /// with a cursor (a day it cannot finish within them is read in parts
    /// of its time).
    pub bytes_per_request: u64,
    /// Archive reads one tenant may have at once
    /// (`[api].cold_reads_per_tenant`).
    pub reads_per_tenant: usize,
    /// Memory for cached manifests and footers, bytes.
    pub cache_bytes: usize,
}

impl Default for ColdLimits {
    fn default() -> Self {
        ColdLimits {
            days_per_request: DEFAULT_DAYS_PER_REQUEST,
            bytes_per_request: DEFAULT_BYTES_PER_REQUEST,
            reads_per_tenant: DEFAULT_READS_PER_TENANT,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// What [`ColdHistory::restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The delivery and its event are hot again (or already were).
    Restored,
    /// No archived delivery of the tenant has this id.
    NotFound,
    /// The event is older than the replay window.
    OutsideWindow {
        /// When the event occurred.
        occurred_at: SystemTime,
        /// The window.
        window: Duration,
    },
}

/// An archived event with the columns a restore needs beyond the API's.
#[derive(Debug, Clone)]
pub struct ColdEvent {
    /// What the API shows.
    pub record: EventRecord,
    /// The source commit's LSN.
    pub commit_lsn: u64,
    /// Its place in the transaction.
    pub tx_ordinal: i32,
    /// When it was stored.
    pub created_at: SystemTime,
}

/// How cold reads stand, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdStats {
    /// Manifests and footers cached.
    pub cache_entries: usize,
    /// Their estimated size in memory.
    pub cache_bytes: usize,
    /// The cache's bound.
    pub cache_capacity: usize,
    /// Reads refused because their tenant was at its cap.
    pub refused: u64,
}

/// Reads archived history from the store the archive wrote.
pub struct ColdHistory<S: ObjectStore> {
    platform: Platform,
    store: S,
    replay_window: Duration,
    limits: ColdLimits,
    cache: MetaCache,
    slots: Arc<TenantSlots>,
    /// The newest archived day of each table and when it was read
    /// ([`ColdHistory::archived_through`]).
    horizon: parking_lot::Mutex<[Option<Horizon>; 3]>,
}

/// When the newest archived day of a table was read, and what it was.
type Horizon = (Instant, Option<NaiveDate>);

/// How long [`ColdHistory::archived_through`] trusts what it read.
const HORIZON_TTL: Duration = Duration::from_secs(1);

impl<S: ObjectStore> std::fmt::Debug for ColdHistory<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdHistory")
            .field("store", &self.store.describe())
            .field("replay_window", &self.replay_window)
            .field("limits", &self.limits)
            .finish()
    }
}

/// One archived day of one table: its manifests' keys, oldest generation
/// first.
#[derive(Debug, Clone)]
pub(crate) struct Day {
    pub(crate) day: NaiveDate,
    pub(crate) manifests: Vec<String>,
}

/// The newest archived day of a table (`$1`), at least verified.
const NEWEST_DAY: &str = "SELECT max(day) FROM walhook.archive_partitions \
                          WHERE table_name = $1 AND state IN ('verified', 'dropped')";

/// The parts of a table's (`$1`) archived days between `$2` and `$3`
/// (both optional), at most `$4` days, newest first: prepared once per
/// connection, since a listing page asks it every time.
const ARCHIVED_DAYS: &str = "WITH days AS (SELECT DISTINCT day FROM walhook.archive_partitions \
                   WHERE table_name = $1 AND state IN ('verified', 'dropped') \
                   AND ($2::date IS NULL OR day >= $2) AND ($3::date IS NULL OR day <= $3) \
                   ORDER BY day DESC LIMIT $4) \
                 SELECT p.day, p.manifest_key FROM walhook.archive_partitions p JOIN days USING (day) \
                 WHERE p.table_name = $1 AND p.state IN ('verified', 'dropped') \
                 ORDER BY p.day DESC, p.generation";

impl<S: ObjectStore> ColdHistory<S> {
    /// Cold history of `platform`'s archive in `store`, with the default
    /// limits.
    pub fn new(platform: Platform, store: S, replay_window: Duration) -> Self {
        Self::with_limits(platform, store, replay_window, ColdLimits::default())
    }

    /// Cold history with `limits`.
    pub fn with_limits(
        platform: Platform,
        store: S,
        replay_window: Duration,
        limits: ColdLimits,
    ) -> Self {
        ColdHistory {
            platform,
            store,
            replay_window,
            limits,
            cache: MetaCache::new(limits.cache_bytes),
            slots: Arc::new(TenantSlots::new(limits.reads_per_tenant)),
            horizon: parking_lot::Mutex::new([None; 3]),
        }
    }

    /// The limits.
    pub fn limits(&self) -> ColdLimits {
        self.limits
    }

    /// The store read from.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The cache's use and the refusals so far.
    pub fn stats(&self) -> ColdStats {
        let (cache_entries, cache_bytes) = self.cache.usage();
        ColdStats {
            cache_entries,
            cache_bytes,
            cache_capacity: self.cache.capacity(),
            refused: self.slots.refused(),
        }
    }

    /// A read slot of `tenant` (one of its archive reads at once, freed
    /// when dropped), or the refusal past its cap. A caller that knows a
    /// request will read the archive takes it first, so that a tenant over
    /// its cap is refused before the request costs anything else.
    pub fn hold(&self, tenant: &TenantId) -> Result<Slot, ArchiveError> {
        self.slots.take(tenant)
    }

    /// `held` if it is `tenant`'s, else a slot of its own.
    fn slot(&self, tenant: &TenantId, held: Option<&Slot>) -> Result<Option<Slot>, ArchiveError> {
        match held {
            Some(h) if h.tenant() == tenant => Ok(None),
            _ => self.slots.take(tenant).map(Some),
        }
    }

    /// The newest archived day of `table`, as read from the catalog at
    /// most once a second: a guess for deciding early (taking a read slot
    /// before anything else, or sending a request to the archive at all),
    /// never for what a read returns. Callers allow it a day's margin.
    pub async fn archived_through(&self, table: Table) -> Result<Option<NaiveDate>, ArchiveError> {
        let slot = match table {
            Table::Events => 0,
            Table::Deliveries => 1,
            Table::Attempts => 2,
        };
        if let Some((at, newest)) = self.horizon.lock()[slot]
            && at.elapsed() < HORIZON_TTL
        {
            return Ok(newest);
        }
        let newest = self.newest_day(table).await?;
        self.horizon.lock()[slot] = Some((Instant::now(), newest));
        Ok(newest)
    }

    /// Whether rows of `table` made at or after `since` may be archived.
    /// Decided from [`ColdHistory::archived_through`] when its answer
    /// cannot have changed since it was read (`since` falls well after or
    /// on or before it), else from the catalog now: a day archived in the
    /// last second is never missed.
    pub async fn may_hold_since(
        &self,
        table: Table,
        since: SystemTime,
    ) -> Result<bool, ArchiveError> {
        let day = day_of(micros(since));
        match self.archived_through(table).await? {
            Some(newest) if day <= newest => Ok(true),
            Some(newest) if day > newest + chrono::Duration::days(1) => Ok(false),
            _ => Ok(self
                .newest_day(table)
                .await?
                .is_some_and(|newest| day <= newest)),
        }
    }

    /// The newest archived day of `table` (at least verified), if any.
    pub(crate) async fn newest_day(&self, table: Table) -> Result<Option<NaiveDate>, ArchiveError> {
        let client = self.platform.client().await?;
        let stmt = client
            .prepare_cached(NEWEST_DAY)
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        let row = client
            .query_one(&stmt, &[&table.name()])
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        Ok(row.get::<_, Option<NaiveDateSql>>(0).map(|d| d.0))
    }

    /// The archived days of `table` from `to` down to `from` (both
    /// included, unbounded when `None`), newest first, at most `limit` of
    /// them; only days at least verified (a `written` day may still be
    /// rewritten).
    pub(crate) async fn days(
        &self,
        table: Table,
        from: Option<NaiveDate>,
        to: Option<NaiveDate>,
        limit: Option<usize>,
    ) -> Result<Vec<Day>, ArchiveError> {
        let client = self.platform.client().await?;
        let limit = limit.map_or(i64::MAX, |l| l as i64);
        let stmt = client
            .prepare_cached(ARCHIVED_DAYS)
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        let rows = client
            .query(
                &stmt,
                &[
                    &table.name(),
                    &from.map(NaiveDateSql),
                    &to.map(NaiveDateSql),
                    &limit,
                ],
            )
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        let mut days: Vec<Day> = Vec::new();
        for r in rows {
            let day = r.get::<_, NaiveDateSql>(0).0;
            let key: String = r.get(1);
            match days.last_mut() {
                Some(d) if d.day == day => d.manifests.push(key),
                _ => days.push(Day {
                    day,
                    manifests: vec![key],
                }),
            }
        }
        Ok(days)
    }

    /// The manifest at `key`, from the cache or the store.
    pub(crate) async fn manifest(
        &self,
        key: &str,
        spend: &Spend,
    ) -> Result<Arc<Manifest>, ArchiveError> {
        if let Some(Meta::Manifest(m)) = self.cache.get(key) {
            return Ok(m);
        }
        let bytes = self.store.get(key).await?.ok_or_else(|| missing(key))?;
        spend.add(bytes.len() as u64);
        let m = Arc::new(
            Manifest::from_bytes(&bytes).map_err(|e| ArchiveError::Shape {
                table: Table::Deliveries,
                column: "manifest",
                detail: format!("{key} does not parse: {e}"),
            })?,
        );
        // Parsed, a manifest takes about twice its JSON.
        self.cache
            .insert(key, Meta::Manifest(m.clone()), bytes.len() * 2);
        Ok(m)
    }

    /// The manifests of `day`'s live set, oldest generation first.
    pub(crate) async fn manifests(
        &self,
        day: &Day,
        spend: &Spend,
    ) -> Result<Vec<Arc<Manifest>>, ArchiveError> {
        let mut out = Vec::with_capacity(day.manifests.len());
        for key in &day.manifests {
            let m = self.manifest(key, spend).await?;
            // A compacted generation names the day's whole live set: the
            // generations before it are history (see `crate::merge`).
            if m.compaction.is_some() {
                out.clear();
            }
            out.push(m);
        }
        Ok(out)
    }

    /// The footer and page index of `file`, from the cache or the store.
    pub(crate) async fn footer(
        &self,
        file: &FileEntry,
        spend: &Arc<Spend>,
    ) -> Result<ArrowReaderMetadata, ArchiveError> {
        // By key and content: compaction replaces a part under its key.
        let at = format!("{}#{}", file.key, file.sha256);
        if let Some(Meta::Footer(m)) = self.cache.get(&at) {
            return Ok(m);
        }
        let mut reader = self.reader(file, spend);
        let meta = reader::load_metadata(&mut reader).await?;
        let weight = meta.metadata().memory_size();
        self.cache.insert(&at, Meta::Footer(meta.clone()), weight);
        Ok(meta)
    }

    fn reader(&self, file: &FileEntry, spend: &Arc<Spend>) -> PartReader<S> {
        PartReader::new(
            self.store.clone(),
            file.key.clone(),
            file.bytes,
            spend.clone(),
        )
    }

    /// The rows of one part that a [`Read`] asks for.
    pub(crate) async fn read(
        &self,
        read: Read<'_>,
        spend: &Arc<Spend>,
    ) -> Result<Vec<RecordBatch>, ArchiveError> {
        let Read {
            table,
            file,
            meta,
            selection,
            preds,
            output,
        } = read;
        if selection.is_empty() {
            return Ok(Vec::new());
        }
        let schema = meta.parquet_schema();
        let columns: Vec<usize> = output
            .iter()
            .map(|c| table.column_index(c).ok_or_else(|| rows::shape(c)))
            .collect::<Result<_, _>>()?;
        let mask = ProjectionMask::roots(schema, columns);
        let filter = predicate::row_filter(table, schema, preds);
        let row_selection = selection.row_selection(meta.metadata());
        // Boxed: the reader's stream wants an `Unpin` input, and the store
        // type need not be.
        let input: Box<dyn AsyncFileReader> = Box::new(self.reader(file, spend));
        let stream = ParquetRecordBatchStreamBuilder::new_with_metadata(input, meta)
            .with_row_groups(selection.row_groups.clone())
            .with_row_selection(row_selection)
            .with_row_filter(filter)
            .with_projection(mask)
            .build()
            .map_err(ArchiveError::Parquet)?;
        stream.try_collect().await.map_err(ArchiveError::Parquet)
    }
}

/// A read of one part: the rows of `selection` that pass `preds` (in
/// order), with the columns `output`.
pub(crate) struct Read<'a> {
    pub(crate) table: Table,
    pub(crate) file: &'a FileEntry,
    pub(crate) meta: ArrowReaderMetadata,
    pub(crate) selection: &'a Selection,
    pub(crate) preds: Vec<Pred>,
    pub(crate) output: &'a [&'static str],
}

/// The parts of `manifest` that may hold rows of `tenant`: its bucket's,
/// and of those the ones whose tenant counts name it.
pub(crate) fn tenant_files<'m>(
    manifest: &'m Manifest,
    tenant: &'m TenantId,
) -> impl Iterator<Item = &'m FileEntry> + 'm {
    let bucket = bucket_of(tenant.as_str(), manifest.tenant_buckets);
    manifest
        .files
        .iter()
        .filter(move |f| f.tenant_bucket == bucket && f.tenants.contains_key(tenant.as_str()))
}

pub(crate) fn missing(key: &str) -> ArchiveError {
    ArchiveError::Shape {
        table: Table::Deliveries,
        column: "object",
        detail: format!("{key} is named by the catalog or a manifest but missing from the store"),
    }
}

/// UTC microseconds of `t`.
pub(crate) fn micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_micros().min(i64::MAX as u128) as i64,
        Err(e) => -(e.duration().as_micros().min(i64::MAX as u128) as i64),
    }
}

/// The instant of UTC microseconds `us`.
pub(crate) fn instant(us: i64) -> SystemTime {
    if us >= 0 {
        UNIX_EPOCH + Duration::from_micros(us as u64)
    } else {
        UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
    }
}

/// The UTC day of UTC microseconds `us`.
pub(crate) fn day_of(us: i64) -> NaiveDate {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|d| d.date_naive())
        .unwrap_or_default()
}

/// The first microsecond of `day`.
pub(crate) fn day_start(day: NaiveDate) -> i64 {
    day.and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp_micros()
}
