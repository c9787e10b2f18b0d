//! One Parquet part in the making: its rows as Arrow columns, what its
//! manifest entry says about them (id and time ranges, rows per tenant),
//! and whether another row still fits ([`PartBuilder::fits`]).

use std::collections::BTreeMap;

use crate::ArchiveError;
use crate::copy::CopyReader;
use crate::table::{BatchBuilder, Kind, PG_EPOCH_MICROS, Table};

/// How big a part may grow (`[archive] part_rows` and `part_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartLimits {
    /// Rows at most.
    pub rows: usize,
    /// Bytes at most, as the copy stream holds the rows (about what Arrow
    /// holds in memory, and more than the compressed Parquet file).
    pub bytes: u64,
}

/// [`PartBuilder::fits`] as a pure function of the part's figures.
pub fn fits(rows: usize, bytes: u64, row_bytes: u64, limits: PartLimits) -> bool {
    rows == 0 || (rows < limits.rows && bytes.saturating_add(row_bytes) <= limits.bytes)
}

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
    /// The rows' size in the copy stream (see [`CopyReader::tuple_bytes`]).
    bytes: u64,
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
            bytes: 0,
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

    /// The rows' bytes so far, as the copy stream held them.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether a row of `row_bytes` may join this part under `limits`: an
    /// empty part takes any row (one bigger than the byte limit gets a
    /// part of its own), a part holding rows takes it only within both
    /// limits.
    pub fn fits(&self, row_bytes: u64, limits: PartLimits) -> bool {
        fits(self.len(), self.bytes, row_bytes, limits)
    }

    /// Adds the current tuple of `copy` (the columns of
    /// [`Table::select_list`]).
    pub fn push(&mut self, copy: &CopyReader) -> Result<(), ArchiveError> {
        self.batch.push_tuple(copy)?;
        self.bytes = self.bytes.saturating_add(copy.tuple_bytes() as u64);
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
        self.bytes = 0;
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: PartLimits = PartLimits {
        rows: 4,
        bytes: 1000,
    };

    #[test]
    fn parts_close_at_the_row_or_the_byte_limit() {
        assert!(fits(0, 0, 5000, LIMITS), "an empty part takes a big row");
        assert!(fits(1, 400, 600, LIMITS));
        assert!(!fits(1, 400, 601, LIMITS));
        assert!(!fits(4, 10, 1, LIMITS));
        assert!(!fits(1, u64::MAX, 1, LIMITS));
    }

    proptest! {
        /// Rows of any sizes, cut greedily: every part holds at most the
        /// limits, unless it is one row that alone passes the byte limit;
        /// no part could have taken the next part's first row.
        #[test]
        fn greedy_parts_respect_the_limits(sizes in proptest::collection::vec(0u64..3000, 0..200)) {
            let mut parts: Vec<Vec<u64>> = Vec::new();
            let mut current: Vec<u64> = Vec::new();
            for size in sizes {
                if !fits(current.len(), current.iter().sum(), size, LIMITS) {
                    parts.push(std::mem::take(&mut current));
                }
                current.push(size);
            }
            parts.push(current);
            for (i, part) in parts.iter().enumerate() {
                let bytes: u64 = part.iter().sum();
                prop_assert!(part.len() <= LIMITS.rows);
                prop_assert!(bytes <= LIMITS.bytes || part.len() == 1, "{part:?}");
                if let Some(next) = parts.get(i + 1) {
                    prop_assert!(part.len() == LIMITS.rows || bytes + next[0] > LIMITS.bytes);
                }
            }
        }
    }
}
