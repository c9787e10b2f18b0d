//! Where objects go: Hive-style keys, tenant buckets and day names.
//!
//! ```text
//! table=attempts/date=2026-11-27/tenant_bucket=03/part-00000.parquet
//! table=attempts/date=2026-11-27/_manifest.json
//! ```
//!
//! Names are a pure function of (table, day, generation, bucket, sequence), so
//! a rerun writes the same keys and every step is idempotent. A day archived
//! again later (rows that reached the hot table after its first archive, or
//! rows changed since) is a new *generation*: its manifest is
//! `_manifest-gN.json` and its parts of rows new to the day are numbered
//! from `generation × 10,000`. A later generation is *compacted*
//! ([`crate::merge`]): it names every live part of the day, and rewrites
//! the earlier parts that held rows it changes under their own keys, so
//! each id lies in one part.

use chrono::NaiveDate;
use sha2::{Digest, Sha256};

use crate::table::Table;

/// The default number of tenant buckets per day.
pub const DEFAULT_TENANT_BUCKETS: u16 = 16;

/// The bucket of `tenant` among `buckets`: the first two bytes of SHA-256 of
/// the tenant id, modulo the bucket count. The same expression runs in SQL
/// ([`bucket_sql`]) so that Postgres sorts rows by bucket.
pub fn bucket_of(tenant: &str, buckets: u16) -> u16 {
    let d = Sha256::digest(tenant.as_bytes());
    (u16::from(d[0]) * 256 + u16::from(d[1])) % buckets.max(1)
}

/// [`bucket_of`] in SQL over the column `tenant_id`, with the bucket count
/// as parameter `$n`: the digest's first four hex digits as a 16-bit
/// number (one SHA-256 per row).
pub fn bucket_sql(param: usize) -> String {
    bucket_sql_over(&format!("${param}::int4"))
}

/// [`bucket_sql`] with the bucket count as an SQL expression.
pub fn bucket_sql_over(buckets: &str) -> String {
    format!(
        "(('x' || left(encode(sha256(convert_to(tenant_id, 'UTF8')), 'hex'), 4))::bit(16)::int4 % {buckets})"
    )
}

/// The key prefix of one table's day: `table=T/date=YYYY-MM-DD/`.
pub fn day_prefix(table: Table, day: NaiveDate) -> String {
    format!("table={}/date={}/", table.name(), day.format("%Y-%m-%d"))
}

/// The key of part `seq` of `bucket` in generation `generation`.
pub fn part_key(table: Table, day: NaiveDate, generation: u32, bucket: u16, seq: u32) -> String {
    format!(
        "{}tenant_bucket={bucket:02}/part-{:05}.parquet",
        day_prefix(table, day),
        generation * 10_000 + seq
    )
}

/// The key of a generation's manifest.
pub fn manifest_key(table: Table, day: NaiveDate, generation: u32) -> String {
    if generation == 0 {
        format!("{}_manifest.json", day_prefix(table, day))
    } else {
        format!("{}_manifest-g{generation}.json", day_prefix(table, day))
    }
}

/// Where a compacted generation's part waits, outside every glob over
/// the layout (`table=…` at the top, a name not ending in `.parquet`),
/// until it has been read back and matched: `_staging/gN/<key>.staged`.
/// See [`crate::merge`].
pub fn staged_key(key: &str, generation: u32) -> String {
    format!("_staging/g{generation}/{key}.staged")
}

/// The day a hot partition named `<table>_YYYYMMDD` holds.
pub fn partition_day(table: Table, relname: &str) -> Option<NaiveDate> {
    let suffix = relname.strip_prefix(table.name())?.strip_prefix('_')?;
    NaiveDate::parse_from_str(suffix, "%Y%m%d").ok()
}

/// The hot partition's name for `day`.
pub fn partition_name(table: Table, day: NaiveDate) -> String {
    format!("{}_{}", table.name(), day.format("%Y%m%d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_hive_style_and_deterministic() {
        let d = NaiveDate::from_ymd_opt(2026, 11, 27).unwrap();
        assert_eq!(
            part_key(Table::Attempts, d, 0, 3, 0),
            "table=attempts/date=2026-11-27/tenant_bucket=03/part-00000.parquet"
        );
        assert_eq!(
            part_key(Table::Events, d, 2, 15, 1),
            "table=events/date=2026-11-27/tenant_bucket=15/part-20001.parquet"
        );
        assert_eq!(
            manifest_key(Table::Deliveries, d, 0),
            "table=deliveries/date=2026-11-27/_manifest.json"
        );
        assert_eq!(
            manifest_key(Table::Deliveries, d, 1),
            "table=deliveries/date=2026-11-27/_manifest-g1.json"
        );
        assert_eq!(
            staged_key(
                "table=events/date=2026-11-27/tenant_bucket=15/part-20001.parquet",
                2
            ),
            "_staging/g2/table=events/date=2026-11-27/tenant_bucket=15/part-20001.parquet.staged"
        );
        assert_eq!(partition_day(Table::Attempts, "attempts_20261127"), Some(d));
        assert_eq!(partition_day(Table::Attempts, "events_20261127"), None);
        assert_eq!(partition_name(Table::Events, d), "events_20261127");
        for t in ["", "acme", "t-1", "テナント"] {
            assert!(bucket_of(t, 16) < 16);
            assert_eq!(bucket_of(t, 16), bucket_of(t, 16));
        }
    }
}
