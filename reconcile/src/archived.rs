//! The window's rows in archived days, read from their Parquet parts, so
//! that archived days are reconciled like hot ones: expected deliveries
//! against made ones, deliveries against their attempts, with the same gap
//! classes and ids.
//!
//! ```text
//!  dropped day ──manifest (verified)──▶ parts ──▶ rows of the window only
//!   (events by occurred_at,                        one generation per id (the latest)
//!    deliveries by event_occurred_at,                 │
//!    attempts by delivery)                            ▼
//!                                         merged with the hot rows, by event id
//! ```
//!
//! Only days whose hot rows were dropped are read: a day archived but not
//! dropped is still counted from the hot tables. Parts whose day-column
//! range or tenants cannot hold a row of the window are skipped.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use walhook_archive::ArchiveError;
use walhook_archive::manifest::Manifest;
use walhook_archive::table::Table;
use walhook_pipeline::objstore::ObjectStore;

use crate::ReconcileError;
use crate::hot::{DeliveryRow, EventRow, RowStatus};

/// The window's archived rows, one generation per id.
#[derive(Default)]
pub struct Archived {
    /// Events, by id.
    events: HashMap<[u8; 16], (u32, EventRow)>,
    /// Deliveries, by id.
    deliveries: HashMap<[u8; 16], (u32, DeliveryRow)>,
    /// Attempts, by id: (generation, delivery, number, noted as taken over).
    attempts: HashMap<[u8; 16], (u32, [u8; 16], i32, bool)>,
    /// Dropped days whose parts could not be read (verification failed):
    /// their rows are neither hot nor read, so what depends on them is
    /// left uncompared (the archive gap names the day).
    pub unread: Vec<(Table, chrono::NaiveDate)>,
}

/// Per delivery: its archived attempt numbers, and how many of them note
/// a take-over from a node whose attempt may have been out.
#[derive(Debug, Default, Clone, Copy)]
pub struct ColdAttempts {
    /// Distinct attempt numbers.
    pub numbers: i64,
    /// Of them, noted `previous_outcome_unknown`.
    pub unknown: i64,
}

/// The merge's inputs: events by id, deliveries by event and endpoint, and
/// attempts per delivery.
pub(crate) struct Sorted {
    /// Events, by id.
    pub(crate) events: Vec<EventRow>,
    /// Deliveries, by (event, endpoint).
    pub(crate) deliveries: Vec<DeliveryRow>,
    /// Attempts per delivery id.
    pub(crate) attempts: HashMap<[u8; 16], ColdAttempts>,
}

impl Archived {
    /// Reads the part `bytes` of `table` (generation `generation`), keeping
    /// the rows of `[since, until)` (and of `tenant`).
    pub fn add_part(
        &mut self,
        table: Table,
        generation: u32,
        batches: &[RecordBatch],
        since: SystemTime,
        until: SystemTime,
        tenant: Option<&str>,
    ) -> Result<u64, ReconcileError> {
        let mut rows = 0u64;
        for batch in batches {
            let c = Cols(batch, table);
            for i in 0..batch.num_rows() {
                rows += 1;
                let id = c.id16("id", i)?;
                match table {
                    Table::Events => {
                        let at = c.time("occurred_at", i)?;
                        let t = c.text("tenant_id", i)?;
                        if at < since || at >= until || tenant.is_some_and(|w| w != t) {
                            continue;
                        }
                        let row = EventRow {
                            id,
                            tenant: t,
                            event_type: c.text("event_type", i)?,
                            occurred_at: at,
                            operational: c.int64("commit_lsn", i)? == 0,
                            archived: true,
                        };
                        keep(&mut self.events, id, generation, row);
                    }
                    Table::Deliveries => {
                        let at = c.time("event_occurred_at", i)?;
                        let t = c.text("tenant_id", i)?;
                        if at < since || at >= until || tenant.is_some_and(|w| w != t) {
                            continue;
                        }
                        let counted = i64::from(c.int("attempt_count", i)?)
                            + i64::from(c.int("manual_attempt_count", i)?);
                        let row = DeliveryRow::archived(
                            c.id16("event_id", i)?,
                            c.id16("endpoint_id", i)?,
                            id,
                            t,
                            RowStatus::parse(&c.text("status", i)?, id)?,
                            counted,
                            c.time("created_at", i)?,
                            at,
                        );
                        keep(&mut self.deliveries, id, generation, row);
                    }
                    Table::Attempts => {
                        let t = c.text("tenant_id", i)?;
                        if tenant.is_some_and(|w| w != t) {
                            continue;
                        }
                        let unknown =
                            c.opt_text("note", i)?.as_deref() == Some("previous_outcome_unknown");
                        let row = (
                            generation,
                            c.id16("delivery_id", i)?,
                            c.int("number", i)?,
                            unknown,
                        );
                        match self.attempts.get(&id) {
                            Some(old) if old.0 >= generation => {}
                            _ => {
                                self.attempts.insert(id, row);
                            }
                        }
                    }
                }
            }
        }
        Ok(rows)
    }

    /// The rows, sorted for the merge.
    pub(crate) fn sorted(self) -> Sorted {
        let mut events: Vec<EventRow> = self.events.into_values().map(|(_, e)| e).collect();
        events.sort_unstable_by_key(|e| e.id);
        let mut deliveries: Vec<DeliveryRow> =
            self.deliveries.into_values().map(|(_, d)| d).collect();
        deliveries.sort_unstable_by_key(|d| (d.event_id, d.endpoint_id));
        let mut numbers: HashMap<([u8; 16], i32), bool> = HashMap::new();
        for (_, delivery, number, unknown) in self.attempts.into_values() {
            *numbers.entry((delivery, number)).or_default() |= unknown;
        }
        let mut attempts: HashMap<[u8; 16], ColdAttempts> = HashMap::new();
        for ((delivery, _), unknown) in numbers {
            let a = attempts.entry(delivery).or_default();
            a.numbers += 1;
            a.unknown += i64::from(unknown);
        }
        Sorted {
            events,
            deliveries,
            attempts,
        }
    }
}

fn keep<T>(map: &mut HashMap<[u8; 16], (u32, T)>, id: [u8; 16], generation: u32, row: T) {
    match map.get(&id) {
        Some((g, _)) if *g >= generation => {}
        _ => {
            map.insert(id, (generation, row));
        }
    }
}

/// Whether a part of `table` with day-column range `range` (UTC µs) may
/// hold a row of `[since, until)`: deliveries are archived by creation,
/// which is never before their event, so only the upper bound prunes them;
/// attempts are read whole (a delivery's attempts follow it for days).
pub fn may_hold(table: Table, range: (i64, i64), since: SystemTime, until: SystemTime) -> bool {
    let us = |t: SystemTime| {
        t.duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64)
    };
    match table {
        Table::Events => range.1 >= us(since) && range.0 < us(until),
        Table::Deliveries => range.1 >= us(since),
        Table::Attempts => range.1 >= us(since),
    }
}

/// Reads the parts of a verified `manifest` that may hold the window's
/// rows (and `tenant`'s) into `archived`; returns the rows read.
#[allow(clippy::too_many_arguments)]
pub async fn read_day<S: ObjectStore>(
    store: &S,
    table: Table,
    manifest: &Manifest,
    since: SystemTime,
    until: SystemTime,
    tenant: Option<&str>,
    archived: &mut Archived,
) -> Result<u64, ReconcileError> {
    let mut rows = 0;
    for file in &manifest.files {
        if !may_hold(table, file.time_range, since, until)
            || tenant.is_some_and(|t| !file.tenants.contains_key(t))
        {
            continue;
        }
        let Some(bytes) = store
            .get(&file.key)
            .await
            .map_err(|e| ReconcileError::Archive(e.into()))?
        else {
            // Verification read it a moment ago; a part gone since is the
            // next run's finding.
            continue;
        };
        let batches = walhook_archive::encode::decode(bytes).map_err(ReconcileError::Archive)?;
        rows += archived.add_part(table, manifest.generation, &batches, since, until, tenant)?;
    }
    Ok(rows)
}

/// Column accessors over one batch, by name; a missing or mistyped column
/// is the archive's shape error.
struct Cols<'a>(&'a RecordBatch, Table);

impl<'a> Cols<'a> {
    fn shape(&self, column: &'static str) -> ReconcileError {
        ReconcileError::Archive(ArchiveError::Shape {
            table: self.1,
            column,
            detail: "the archived part lacks this column or has another type".into(),
        })
    }
    fn col(&self, name: &'static str) -> Result<&'a dyn Array, ReconcileError> {
        self.0
            .column_by_name(name)
            .map(|c| c.as_ref())
            .ok_or_else(|| self.shape(name))
    }
    fn id16(&self, name: &'static str, i: usize) -> Result<[u8; 16], ReconcileError> {
        let a = self
            .col(name)?
            .as_fixed_size_binary_opt()
            .ok_or_else(|| self.shape(name))?;
        a.value(i).try_into().map_err(|_| self.shape(name))
    }
    fn opt_text(&self, name: &'static str, i: usize) -> Result<Option<String>, ReconcileError> {
        let a = self
            .col(name)?
            .as_string_opt::<i32>()
            .ok_or_else(|| self.shape(name))?;
        Ok(a.is_valid(i).then(|| a.value(i).to_string()))
    }
    fn text(&self, name: &'static str, i: usize) -> Result<String, ReconcileError> {
        Ok(self.opt_text(name, i)?.unwrap_or_default())
    }
    fn int(&self, name: &'static str, i: usize) -> Result<i32, ReconcileError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<Int32Type>()
            .ok_or_else(|| self.shape(name))?;
        Ok(if a.is_valid(i) { a.value(i) } else { 0 })
    }
    fn int64(&self, name: &'static str, i: usize) -> Result<i64, ReconcileError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| self.shape(name))?;
        Ok(a.value(i))
    }
    fn time(&self, name: &'static str, i: usize) -> Result<SystemTime, ReconcileError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| self.shape(name))?;
        let us = a.value(i);
        Ok(if us >= 0 {
            UNIX_EPOCH + Duration::from_micros(us as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
        })
    }
}
