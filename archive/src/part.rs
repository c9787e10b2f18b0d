//! One Parquet part in the making: its rows as Arrow columns, and what its
//! manifest entry says about them (id and time ranges, rows per tenant).

use std::collections::BTreeMap;

use crate::ArchiveError;
use crate::copy::CopyReader;
use crate::table::{BatchBuilder, Kind, PG_EPOCH_MICROS, Table};

/// What a finished part holds besides its rows.
#[derive(Debug, Clone, Default)]
pub struct PartStats {
    /// The smallest and largest row id (hyphenated).
    pub id_range: (String, String),
    /// The smallest and largest value of the day column, UTC microseconds.
    pub time_range: (i64, i64),
    /// Rows per tenant.
    pub tenants: BTreeMap<String, u64>,
}

/// Gathers one part's rows and the figures its manifest entry names.
pub struct PartBuilder {
    batch: BatchBuilder,
    ids: Option<(uuid::Uuid, uuid::Uuid)>,
    times: Option<(i64, i64)>,
    tenants: BTreeMap<String, u64>,
    time_col: usize,
    tenant_col: usize,
}

impl PartBuilder {
    /// An empty part of `table`.
    pub fn new(table: Table) -> Self {
        debug_assert_eq!(table.columns()[0].kind, Kind::Uuid);
        PartBuilder {
            batch: BatchBuilder::new(table),
            ids: None,
            times: None,
            tenants: BTreeMap::new(),
            time_col: table.column_index(table.day_column()).expect("day column"),
            tenant_col: table.column_index("tenant_id").expect("tenant column"),
        }
    }

    /// Rows so far.
    pub fn len(&self) -> usize {
        self.batch.len()
    }

    /// Whether no row was added.
    pub fn is_empty(&self) -> bool {
        self.batch.is_empty()
    }

    /// Adds the current tuple of `copy` (the columns of
    /// [`Table::select_list`]).
    pub fn push(&mut self, copy: &CopyReader) -> Result<(), ArchiveError> {
        self.batch.push_tuple(copy)?;
        // The batch checked the widths of these three columns.
        let id = uuid::Uuid::from_slice(copy.field(0).unwrap_or_default()).unwrap_or_default();
        let t = copy
            .field(self.time_col)
            .and_then(|v| v.try_into().ok())
            .map(i64::from_be_bytes)
            .unwrap_or_default()
            .saturating_add(PG_EPOCH_MICROS);
        let tenant = std::str::from_utf8(copy.field(self.tenant_col).unwrap_or_default())
            .unwrap_or_default();
        self.ids = Some(match self.ids {
            None => (id, id),
            Some((lo, hi)) => (lo.min(id), hi.max(id)),
        });
        self.times = Some(match self.times {
            None => (t, t),
            Some((lo, hi)) => (lo.min(t), hi.max(t)),
        });
        match self.tenants.get_mut(tenant) {
            Some(n) => *n += 1,
            None => {
                self.tenants.insert(tenant.to_string(), 1);
            }
        }
        Ok(())
    }

    /// The rows as one batch and their figures; the builder is empty after.
    pub fn finish(&mut self) -> Result<(arrow_array::RecordBatch, PartStats), ArchiveError> {
        let batch = self.batch.finish()?;
        let (lo, hi) = self.ids.take().unwrap_or_default();
        Ok((
            batch,
            PartStats {
                id_range: (lo.to_string(), hi.to_string()),
                time_range: self.times.take().unwrap_or_default(),
                tenants: std::mem::take(&mut self.tenants),
            },
        ))
    }
}
