//! Which rows of a part a read needs, from statistics alone: row groups
//! whose column statistics admit the tenant (and the time window, and the
//! id), then within them the pages whose page-index minimum and maximum
//! admit them; and what reading those pages of some columns costs.
//!
//! Parts are sorted by (tenant, time, id) within a tenant bucket, so a
//! tenant's rows are a few pages of each column and a time window a few of
//! those; ids led by the LSN grow with time, so an id is one or two pages.
//! Minimums and maximums may be truncated (long tenant ids): the checks
//! only ever keep more pages than needed, never fewer.

use std::ops::Range;

use parquet::arrow::arrow_reader::RowSelection;
use parquet::file::metadata::ParquetMetaData;
use parquet::file::page_index::column_index::ColumnIndexMetaData;
use parquet::file::statistics::Statistics;

/// A condition on one column that statistics can refute.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cond<'a> {
    /// A byte-array column (text, uuid) equals `value`.
    BytesEq {
        /// The column's index.
        column: usize,
        /// The value.
        value: &'a [u8],
    },
    /// A 64-bit column (a timestamp) lies in `lo..=hi`.
    Between {
        /// The column's index.
        column: usize,
        /// The smallest value admitted.
        lo: i64,
        /// The largest value admitted.
        hi: i64,
    },
}

impl Cond<'_> {
    fn column(&self) -> usize {
        match self {
            Cond::BytesEq { column, .. } | Cond::Between { column, .. } => *column,
        }
    }

    /// Whether a chunk of values between `min` and `max` (as statistics
    /// give them) may hold a match; unknown bounds admit.
    fn admits_stats(&self, stats: Option<&Statistics>) -> bool {
        match (self, stats) {
            (Cond::BytesEq { value, .. }, Some(s)) => {
                s.min_bytes_opt().is_none_or(|m| m <= *value)
                    && s.max_bytes_opt().is_none_or(|m| *value <= m)
            }
            (Cond::Between { lo, hi, .. }, Some(Statistics::Int64(s))) => {
                s.min_opt().is_none_or(|m| m <= hi) && s.max_opt().is_none_or(|m| m >= lo)
            }
            _ => true,
        }
    }

    /// Whether page `i` of a column with `index` may hold a match.
    fn admits_page(&self, index: &ColumnIndexMetaData, i: usize) -> bool {
        match (self, index) {
            (
                Cond::BytesEq { value, .. },
                ColumnIndexMetaData::BYTE_ARRAY(x) | ColumnIndexMetaData::FIXED_LEN_BYTE_ARRAY(x),
            ) => {
                x.min_value(i).is_none_or(|m| m <= *value)
                    && x.max_value(i).is_none_or(|m| *value <= m)
            }
            (Cond::Between { lo, hi, .. }, ColumnIndexMetaData::INT64(x)) => {
                x.min_value(i).is_none_or(|m| m <= hi) && x.max_value(i).is_none_or(|m| m >= lo)
            }
            _ => true,
        }
    }
}

/// The rows of a part that may match: row groups, and ranges of rows in
/// each (sorted, disjoint, relative to the row group).
#[derive(Debug, Clone, Default)]
pub(crate) struct Selection {
    /// The row groups with rows that may match, ascending.
    pub(crate) row_groups: Vec<usize>,
    /// For each of them, its rows that may match.
    pub(crate) ranges: Vec<Vec<Range<usize>>>,
}

impl Selection {
    /// The rows of the part behind `meta` that `conds` do not refute.
    pub(crate) fn new(meta: &ParquetMetaData, conds: &[Cond<'_>]) -> Selection {
        let mut out = Selection::default();
        for (rg, group) in meta.row_groups().iter().enumerate() {
            let rows = group.num_rows().max(0) as usize;
            let mut ranges: Vec<Range<usize>> = std::iter::once(0..rows).collect();
            for c in conds {
                if !c.admits_stats(group.column(c.column()).statistics()) {
                    ranges.clear();
                    break;
                }
                if let Some(pages) = page_rows(meta, rg, c.column(), rows) {
                    let index = meta.page_index_for_row_group(rg);
                    if let Some(ci) = index.column_index(c.column()) {
                        let kept: Vec<Range<usize>> = pages
                            .into_iter()
                            .enumerate()
                            .filter(|(i, _)| c.admits_page(ci, *i))
                            .map(|(_, r)| r)
                            .collect();
                        ranges = intersect(&ranges, &merge(kept));
                    }
                }
                if ranges.is_empty() {
                    break;
                }
            }
            if !ranges.is_empty() {
                out.row_groups.push(rg);
                out.ranges.push(ranges);
            }
        }
        out
    }

    /// Whether no row may match.
    pub(crate) fn is_empty(&self) -> bool {
        self.row_groups.is_empty()
    }

    /// The selection over the chosen row groups, as the reader takes it.
    pub(crate) fn row_selection(&self, meta: &ParquetMetaData) -> RowSelection {
        let mut all = Vec::new();
        let mut offset = 0;
        for (rg, ranges) in self.row_groups.iter().zip(&self.ranges) {
            all.extend(ranges.iter().map(|r| r.start + offset..r.end + offset));
            offset += meta.row_group(*rg).num_rows().max(0) as usize;
        }
        RowSelection::from_consecutive_ranges(all.into_iter(), offset)
    }

    /// The bytes of `columns` that reading the selection fetches: every
    /// page that holds a selected row, and the column's dictionary. Without
    /// a page index, the whole column chunk.
    pub(crate) fn bytes(&self, meta: &ParquetMetaData, columns: &[usize]) -> u64 {
        let mut total = 0u64;
        for (rg, ranges) in self.row_groups.iter().zip(&self.ranges) {
            let group = meta.row_group(*rg);
            let rows = group.num_rows().max(0) as usize;
            let index = meta.page_index_for_row_group(*rg);
            for &c in columns {
                let chunk = group.column(c);
                let Some(locations) = index.page_locations(c) else {
                    total += chunk.compressed_size().max(0) as u64;
                    continue;
                };
                let mut any = false;
                for (i, loc) in locations.iter().enumerate() {
                    let start = loc.first_row_index.max(0) as usize;
                    let end = locations
                        .get(i + 1)
                        .map_or(rows, |n| n.first_row_index.max(0) as usize);
                    if ranges.iter().any(|r| r.start < end && start < r.end) {
                        total += loc.compressed_page_size.max(0) as u64;
                        any = true;
                    }
                }
                if any && let Some(dict) = chunk.dictionary_page_offset() {
                    total += (chunk.data_page_offset() - dict).max(0) as u64;
                }
            }
        }
        total
    }
}

impl Selection {
    /// The most that reading one selected row's `columns` may cost: the
    /// largest selected page of each column, and its dictionary.
    pub(crate) fn row_bytes(&self, meta: &ParquetMetaData, columns: &[usize]) -> u64 {
        let mut total = 0u64;
        for &c in columns {
            let mut most = 0u64;
            for (rg, ranges) in self.row_groups.iter().zip(&self.ranges) {
                let group = meta.row_group(*rg);
                let rows = group.num_rows().max(0) as usize;
                let chunk = group.column(c);
                let dict = chunk
                    .dictionary_page_offset()
                    .map_or(0, |d| (chunk.data_page_offset() - d).max(0) as u64);
                let index = meta.page_index_for_row_group(*rg);
                let Some(locations) = index.page_locations(c) else {
                    most = most.max(chunk.compressed_size().max(0) as u64);
                    continue;
                };
                for (i, loc) in locations.iter().enumerate() {
                    let start = loc.first_row_index.max(0) as usize;
                    let end = locations
                        .get(i + 1)
                        .map_or(rows, |n| n.first_row_index.max(0) as usize);
                    if ranges.iter().any(|r| r.start < end && start < r.end) {
                        most = most.max(loc.compressed_page_size.max(0) as u64 + dict);
                    }
                }
            }
            total += most;
        }
        total
    }
}

/// The rows of each page of `column` in row group `rg`, from its offset
/// index.
fn page_rows(
    meta: &ParquetMetaData,
    rg: usize,
    column: usize,
    rows: usize,
) -> Option<Vec<Range<usize>>> {
    let index = meta.page_index_for_row_group(rg);
    let locations = index.page_locations(column)?;
    Some(
        locations
            .iter()
            .enumerate()
            .map(|(i, loc)| {
                let start = loc.first_row_index.max(0) as usize;
                let end = locations
                    .get(i + 1)
                    .map_or(rows, |n| n.first_row_index.max(0) as usize);
                start..end
            })
            .collect(),
    )
}

/// Sorted ranges with touching ones joined.
fn merge(mut ranges: Vec<Range<usize>>) -> Vec<Range<usize>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<usize>> = Vec::new();
    for r in ranges.into_iter().filter(|r| !r.is_empty()) {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The rows in both sorted, disjoint lists.
fn intersect(a: &[Range<usize>], b: &[Range<usize>]) -> Vec<Range<usize>> {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let start = a[i].start.max(b[j].start);
        let end = a[i].end.min(b[j].end);
        if start < end {
            out.push(start..end);
        }
        if a[i].end < b[j].end {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_intersect_and_merge() {
        assert_eq!(
            intersect(&[0..10, 20..30], &[5..25, 28..40]),
            vec![5..10, 20..25, 28..30]
        );
        assert_eq!(merge(vec![5..7, 0..5, 9..12, 10..11]), vec![0..7, 9..12]);
        assert!(intersect(&[0..5, 7..7], &[5..7, 9..9]).is_empty());
    }
}
