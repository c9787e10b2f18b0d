//! The id index of archived deliveries: which day holds a delivery id, so
//! that a lookup by id reads one day's objects.
//!
//! ```text
//!  verified generation of deliveries D
//!     │ the id column of its parts (ranged reads, one column)
//!     ▼
//!  each id: inside a range of another day ─────────────► exception (id → D)
//!           inside a range of D (an earlier generation) ─► nothing (D already)
//!           otherwise: (gap between existing ranges, id lead >> 24)
//!     ▼
//!  lead buckets close together in one gap merge ────────► range [min, max] → D
//!     ▼ one transaction
//!  archive_id_ranges, archive_id_exceptions, archive_partitions.indexed
//! ```
//!
//! Delivery ids are led by their event's commit LSN
//! ([`walhook_pipeline::ids::DeliveryId::derive`]), so a day's ids gather in
//! a few narrow ranges (one per source database; a range breaks where more
//! than 64 MiB of WAL lies between two deliveries of the day). Ids that are
//! not led by an LSN (test events and operational events have random or
//! hashed ids) each make a range of their own or an exception; there are
//! few of them.
//!
//! The invariant that makes a lookup exact: **ranges of different days
//! never overlap**. A new range is cut from the gaps between the ranges
//! already written, and an id of the new day that lies inside another day's
//! range is an exception instead. So a lookup checks the exceptions, then
//! takes the one range with the largest `lo` at or below the id: if it
//! reaches the id, its day holds the id, and no other day can. Removing a
//! generation (its catalog row, which cascades) keeps the invariant.

use std::collections::BTreeMap;

use arrow_array::Array;
use chrono::NaiveDate;
use futures::TryStreamExt;
use uuid::Uuid;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use crate::ArchiveError;
use crate::catalog::PartitionState;
use crate::cold::reader::{PartReader, Spend, load_metadata};
use crate::dates::NaiveDateSql;
use crate::manifest::Manifest;
use crate::table::Table;

/// Bits of the id's leading 64 (the LSN) that one bucket spans: 16 MiB of
/// WAL.
pub const LEAD_BUCKET_BITS: u32 = 24;

/// Buckets without an id of the day that a range may span: a range breaks
/// where more than 64 MiB of WAL lies between two deliveries of the day,
/// so that the LSNs of two source databases (or of a test event's random
/// id) are not joined into one range that would cover other days' ids.
pub const BRIDGED_BUCKETS: u64 = 4;

/// Rows written per statement.
const WRITE_BATCH: usize = 10_000;

/// A range of ids already in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The smallest id.
    pub lo: u128,
    /// The largest id.
    pub hi: u128,
    /// The day it belongs to.
    pub day: NaiveDate,
}

/// What indexing one generation produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DayIndex {
    /// New ranges, sorted and disjoint from each other and from every
    /// range that existed.
    pub ranges: Vec<(u128, u128)>,
    /// Ids inside another day's range.
    pub exceptions: Vec<u128>,
}

/// Builds the index of one day's generation from its ids, in any order.
#[derive(Debug)]
pub struct IndexBuilder {
    day: NaiveDate,
    /// Existing ranges, sorted by `lo`, disjoint.
    existing: Vec<IdRange>,
    /// (gap between existing ranges, lead bucket) → smallest and largest id.
    buckets: BTreeMap<(usize, u64), (u128, u128)>,
    exceptions: Vec<u128>,
}

impl IndexBuilder {
    /// A builder for `day`, around the `existing` ranges (any order).
    pub fn new(day: NaiveDate, mut existing: Vec<IdRange>) -> Self {
        existing.sort_by_key(|r| r.lo);
        IndexBuilder {
            day,
            existing,
            buckets: BTreeMap::new(),
            exceptions: Vec::new(),
        }
    }

    /// Adds one id of the day.
    pub fn add(&mut self, id: u128) {
        // The first existing range that ends at or after the id.
        let gap = self.existing.partition_point(|r| r.hi < id);
        if let Some(r) = self.existing.get(gap)
            && r.lo <= id
        {
            if r.day != self.day {
                self.exceptions.push(id);
            }
            return;
        }
        let bucket = ((id >> 64) as u64) >> LEAD_BUCKET_BITS;
        self.buckets
            .entry((gap, bucket))
            .and_modify(|(lo, hi)| {
                *lo = (*lo).min(id);
                *hi = (*hi).max(id);
            })
            .or_insert((id, id));
    }

    /// The ranges (buckets of one gap at most [`BRIDGED_BUCKETS`] apart
    /// merged) and exceptions.
    pub fn finish(mut self) -> DayIndex {
        let mut ranges: Vec<(u128, u128)> = Vec::new();
        let mut last: Option<(usize, u64)> = None;
        for ((gap, bucket), (lo, hi)) in self.buckets {
            match (last, ranges.last_mut()) {
                (Some((g, b)), Some(r)) if g == gap && bucket - b <= BRIDGED_BUCKETS => r.1 = hi,
                _ => ranges.push((lo, hi)),
            }
            last = Some((gap, bucket));
        }
        self.exceptions.sort_unstable();
        self.exceptions.dedup();
        DayIndex {
            ranges,
            exceptions: self.exceptions,
        }
    }
}

/// The ranges in the index of `table` (every day and generation).
pub(crate) async fn existing_ranges(
    platform: &Platform,
    table: Table,
) -> Result<Vec<IdRange>, ArchiveError> {
    let client = platform.client().await?;
    let rows = client
        .query(
            "SELECT lo, hi, day FROM walhook.archive_id_ranges WHERE table_name = $1",
            &[&table.name()],
        )
        .await
        .map_err(ArchiveError::query("read the archive's id index"))?;
    Ok(rows
        .iter()
        .map(|r| IdRange {
            lo: r.get::<_, Uuid>(0).as_u128(),
            hi: r.get::<_, Uuid>(1).as_u128(),
            day: r.get::<_, NaiveDateSql>(2).0,
        })
        .collect())
}

/// Reads the ids of every part of `manifest` (the id column only) into an
/// index of `day` around the existing ranges.
pub(crate) async fn build<S: ObjectStore>(
    platform: &Platform,
    store: &S,
    table: Table,
    day: NaiveDate,
    manifest: &Manifest,
) -> Result<DayIndex, ArchiveError> {
    let mut builder = IndexBuilder::new(day, existing_ranges(platform, table).await?);
    let spend = Spend::unlimited();
    for f in &manifest.files {
        let mut reader = PartReader::new(store.clone(), f.key.clone(), f.bytes, spend.clone());
        let meta = load_metadata(&mut reader).await?;
        let id = table.column_index("id").expect("every table has an id");
        let mask = parquet::arrow::ProjectionMask::roots(
            meta.metadata().file_metadata().schema_descr(),
            [id],
        );
        let mut stream = parquet::arrow::ParquetRecordBatchStreamBuilder::new_with_metadata(
            Box::new(reader) as Box<dyn parquet::arrow::async_reader::AsyncFileReader>,
            meta,
        )
        .with_projection(mask)
        .with_batch_size(64 * 1024)
        .build()
        .map_err(ArchiveError::Parquet)?;
        while let Some(batch) = stream.try_next().await.map_err(ArchiveError::Parquet)? {
            let ids = crate::cold::rows::uuid_column(&batch, "id")?;
            for i in 0..ids.len() {
                let bytes: [u8; 16] = ids.value(i).try_into().map_err(|_| ArchiveError::Shape {
                    table,
                    column: "id",
                    detail: "an id that is not 16 bytes".into(),
                })?;
                builder.add(u128::from_be_bytes(bytes));
            }
        }
    }
    Ok(builder.finish())
}

/// Writes `index` for `table`'s `day` generation `generation` and marks it
/// indexed, replacing what an earlier try wrote; with `verified`, also
/// moves the generation to `verified`, in the same transaction.
pub(crate) async fn write(
    platform: &Platform,
    table: Table,
    day: NaiveDate,
    generation: u32,
    index: &DayIndex,
    verified: bool,
) -> Result<(), ArchiveError> {
    let mut client = platform.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(ArchiveError::query("start writing the id index"))?;
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&table.name(), &NaiveDateSql(day), &(generation as i32)];
    for t in ["archive_id_ranges", "archive_id_exceptions"] {
        tx.execute(
            &format!(
                "DELETE FROM walhook.{t} WHERE table_name = $1 AND day = $2 AND generation = $3"
            ),
            &key,
        )
        .await
        .map_err(ArchiveError::query("clear an earlier id index of the day"))?;
    }
    for chunk in index.ranges.chunks(WRITE_BATCH) {
        let lo: Vec<Uuid> = chunk.iter().map(|r| Uuid::from_u128(r.0)).collect();
        let hi: Vec<Uuid> = chunk.iter().map(|r| Uuid::from_u128(r.1)).collect();
        tx.execute(
            "INSERT INTO walhook.archive_id_ranges (table_name, day, generation, lo, hi) \
             SELECT $1, $2, $3, lo, hi FROM unnest($4::uuid[], $5::uuid[]) AS r(lo, hi)",
            &[key[0], key[1], key[2], &lo, &hi],
        )
        .await
        .map_err(ArchiveError::query("write the id ranges of the day"))?;
    }
    for chunk in index.exceptions.chunks(WRITE_BATCH) {
        let ids: Vec<Uuid> = chunk.iter().map(|id| Uuid::from_u128(*id)).collect();
        tx.execute(
            "INSERT INTO walhook.archive_id_exceptions (table_name, day, generation, id) \
             SELECT $1, $2, $3, id FROM unnest($4::uuid[]) AS e(id)",
            &[key[0], key[1], key[2], &ids],
        )
        .await
        .map_err(ArchiveError::query("write the id exceptions of the day"))?;
    }
    let marked = if verified {
        tx.execute(
            "UPDATE walhook.archive_partitions SET indexed = true, state = $4, verified_at = now() \
             WHERE table_name = $1 AND day = $2 AND generation = $3",
            &[key[0], key[1], key[2], &PartitionState::Verified.as_str()],
        )
        .await
    } else {
        tx.execute(
            "UPDATE walhook.archive_partitions SET indexed = true \
             WHERE table_name = $1 AND day = $2 AND generation = $3",
            &key,
        )
        .await
    };
    marked.map_err(ArchiveError::query("mark the day indexed"))?;
    walhook_sql::commit!(tx, client).map_err(ArchiveError::query("commit the id index"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 1, d).unwrap()
    }

    /// An id led by `lsn`, completed by `tail`.
    fn id(lsn: u64, tail: u64) -> u128 {
        (u128::from(lsn) << 64) | u128::from(tail)
    }

    /// The day a lookup finds for `x`: exceptions first, then the range
    /// with the largest lo at or below it.
    fn lookup(ranges: &[IdRange], exceptions: &[(u128, NaiveDate)], x: u128) -> Option<NaiveDate> {
        if let Some((_, d)) = exceptions.iter().find(|(e, _)| *e == x) {
            return Some(*d);
        }
        ranges
            .iter()
            .filter(|r| r.lo <= x)
            .max_by_key(|r| r.lo)
            .filter(|r| r.hi >= x)
            .map(|r| r.day)
    }

    #[test]
    fn a_day_of_lsn_led_ids_is_one_range_and_strays_stand_alone() {
        let mut b = IndexBuilder::new(day(1), Vec::new());
        for i in 0..1000u64 {
            b.add(id(0x16_0000_0000 + i * 4096, i * 7919));
        }
        // A test delivery's random id.
        b.add(id(0xdead_beef_0000_0000, 1));
        let index = b.finish();
        assert_eq!(index.ranges.len(), 2, "{index:?}");
        assert_eq!(index.ranges[0].0, id(0x16_0000_0000, 0));
        assert!(index.exceptions.is_empty());
    }

    /// Days whose LSN ranges overlap at their edges, random ids, a second
    /// generation and a second source: every id is found on its own day,
    /// and ranges of different days never overlap.
    #[test]
    fn every_id_is_found_on_its_day_and_only_there() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut ranges: Vec<IdRange> = Vec::new();
        let mut exceptions: Vec<(u128, NaiveDate)> = Vec::new();
        let mut all: Vec<(u128, NaiveDate)> = Vec::new();
        let mut days: Vec<(NaiveDate, Vec<u128>)> = Vec::new();
        for d in 1..=10u32 {
            let mut ids = Vec::new();
            // Source A: about 1 GiB of WAL a day, days overlapping by 5 %.
            let start = 0x10_0000_0000u64 + u64::from(d) * (1 << 30);
            for _ in 0..500 {
                ids.push(id(start + next() % ((1 << 30) + (1 << 25)), next()));
            }
            // Source B, another LSN space.
            for _ in 0..100 {
                ids.push(id(
                    0x3_0000_0000 + u64::from(d) * (1 << 28) + next() % (1 << 28),
                    next(),
                ));
            }
            // Random ids (test events).
            for _ in 0..5 {
                ids.push((u128::from(next()) << 64) | u128::from(next()));
            }
            days.push((day(d), ids));
        }
        // Day 3 archived again later (generation 1), with ids of its own.
        let regen: Vec<u128> = (0..50)
            .map(|_| id(0x10_0000_0000 + 3 * (1 << 30) + next() % (1 << 30), next()))
            .collect();
        days.push((day(3), regen));
        for (d, ids) in days {
            let mut b = IndexBuilder::new(d, ranges.clone());
            for &x in ids.iter().rev() {
                b.add(x);
            }
            let index = b.finish();
            for (lo, hi) in &index.ranges {
                for r in &ranges {
                    assert!(
                        *hi < r.lo || *lo > r.hi,
                        "a new range of {d} overlaps one of {}",
                        r.day
                    );
                }
            }
            ranges.extend(
                index
                    .ranges
                    .iter()
                    .map(|&(lo, hi)| IdRange { lo, hi, day: d }),
            );
            exceptions.extend(index.exceptions.iter().map(|&x| (x, d)));
            all.extend(ids.into_iter().map(|x| (x, d)));
        }
        for (x, d) in &all {
            assert_eq!(lookup(&ranges, &exceptions, *x), Some(*d), "{x:032x}");
        }
        // The overlapping edges made a few exceptions, not many.
        assert!(exceptions.len() < all.len() / 10, "{}", exceptions.len());
    }
}
