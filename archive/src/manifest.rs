//! The manifest: what one generation of one table's day holds in the store.
//!
//! Written after every part is stored and read back by verification. It has
//! no wall-clock field, so a rerun over the same hot rows writes the same
//! bytes (the crash tests compare object sets byte for byte); when the day
//! was archived is in `walhook.archive_partitions`.

use serde::{Deserialize, Serialize};

use crate::table::{Kind, SCHEMA_VERSION, Table};

/// The `format` field of every manifest.
pub const FORMAT: &str = "walhook.archive.manifest";

/// One generation of one table's day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT`].
    pub format: String,
    /// The Parquet layout's version ([`SCHEMA_VERSION`]).
    pub schema_version: u32,
    /// The walhook version that wrote the parts.
    pub software_version: String,
    /// The hot table.
    pub table: String,
    /// The day, `YYYY-MM-DD` (UTC).
    pub date: String,
    /// 0 for a day's first archive, then 1, 2, … for rows archived later.
    pub generation: u32,
    /// How many tenant buckets the day is split into.
    pub tenant_buckets: u16,
    /// Rows over all parts.
    pub row_count: u64,
    /// Bytes over all parts.
    pub byte_count: u64,
    /// The smallest and largest row id (lower-case hyphenated uuids).
    pub id_range: Option<(String, String)>,
    /// The smallest and largest value of the day column, UTC microseconds.
    pub time_range: Option<(i64, i64)>,
    /// The columns, in order.
    pub columns: Vec<ColumnInfo>,
    /// The parts, sorted by key.
    pub files: Vec<FileEntry>,
    /// Set on a generation that holds the day's whole latest state (every
    /// id once, its latest row): it alone is the day's live set, and the
    /// earlier generations' manifests are history. Absent on a day's first
    /// generation and on generations written before compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
}

/// How a compacted generation was made from the day's live set before it
/// and the hot rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compaction {
    /// The generations whose parts it merged.
    pub merged: Vec<u32>,
    /// Rows taken unchanged from those parts; the rest came from the hot
    /// table.
    pub carried_rows: u64,
    /// The parts this generation wrote (rewritten earlier parts, under
    /// their own keys, and parts of rows new to the day), sorted: each is
    /// staged at [`crate::layout::staged_key`] and read back before it
    /// replaces the live object.
    pub written: Vec<String>,
}

/// One column as the manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnInfo {
    /// Its name.
    pub name: String,
    /// Its type: uuid, text, int32, int64, timestamp_us_utc, bytes, sha256.
    pub r#type: String,
    /// Whether it may be null.
    pub nullable: bool,
}

/// One Parquet part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    /// Its key in the store.
    pub key: String,
    /// Its tenant bucket.
    pub tenant_bucket: u16,
    /// Rows in it.
    pub rows: u64,
    /// Its size.
    pub bytes: u64,
    /// SHA-256 of its bytes, lower-case hex.
    pub sha256: String,
    /// The smallest and largest row id in it.
    pub id_range: (String, String),
    /// The smallest and largest value of the day column in it.
    pub time_range: (i64, i64),
    /// Rows per tenant in it: a cold read of one tenant skips parts that
    /// do not name it, and reconciliation counts per tenant without
    /// reading Parquet.
    pub tenants: std::collections::BTreeMap<String, u64>,
}

impl Manifest {
    /// An empty manifest for one generation of `table`'s `date`.
    pub fn new(table: Table, date: &str, generation: u32, tenant_buckets: u16) -> Self {
        Manifest {
            format: FORMAT.into(),
            schema_version: SCHEMA_VERSION,
            software_version: env!("CARGO_PKG_VERSION").into(),
            table: table.name().into(),
            date: date.into(),
            generation,
            tenant_buckets,
            row_count: 0,
            byte_count: 0,
            id_range: None,
            time_range: None,
            columns: table
                .columns()
                .iter()
                .map(|c| ColumnInfo {
                    name: c.name.into(),
                    r#type: kind_name(c.kind).into(),
                    nullable: c.nullable,
                })
                .collect(),
            files: Vec::new(),
            compaction: None,
        }
    }

    /// Rows this generation took from the hot table.
    pub fn hot_rows(&self) -> u64 {
        self.row_count
            - self
                .compaction
                .as_ref()
                .map_or(0, |c| c.carried_rows.min(self.row_count))
    }

    /// Whether this generation wrote the part at `key` (so that it is
    /// staged until published).
    pub fn wrote(&self, key: &str) -> bool {
        self.compaction
            .as_ref()
            .is_none_or(|c| c.written.binary_search_by(|k| k.as_str().cmp(key)).is_ok())
    }

    /// Adds a part and widens the totals and ranges.
    pub fn add(&mut self, file: FileEntry) {
        self.row_count += file.rows;
        self.byte_count += file.bytes;
        self.id_range = Some(match self.id_range.take() {
            None => file.id_range.clone(),
            Some((lo, hi)) => (
                lo.min(file.id_range.0.clone()),
                hi.max(file.id_range.1.clone()),
            ),
        });
        self.time_range = Some(match self.time_range {
            None => file.time_range,
            Some((lo, hi)) => (lo.min(file.time_range.0), hi.max(file.time_range.1)),
        });
        self.files.push(file);
        self.files.sort_by(|a, b| a.key.cmp(&b.key));
    }

    /// The manifest as stored: pretty JSON with a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a manifest serialises");
        v.push(b'\n');
        v
    }

    /// Parses a stored manifest.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Whether the manifest may hold the row with `id` (a hyphenated uuid).
    pub fn may_hold(&self, id: &str) -> bool {
        self.id_range
            .as_ref()
            .is_some_and(|(lo, hi)| lo.as_str() <= id && id <= hi.as_str())
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Uuid => "uuid",
        Kind::Text => "text",
        Kind::Int32 => "int32",
        Kind::Lsn => "int64",
        Kind::Timestamp => "timestamp_us_utc",
        Kind::Bytes => "bytes",
        Kind::Sha256 => "sha256",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_round_trips_and_totals_its_files() {
        let mut m = Manifest::new(Table::Attempts, "2026-11-27", 0, 16);
        for (i, k) in ["b", "a"].iter().enumerate() {
            m.add(FileEntry {
                key: (*k).into(),
                tenant_bucket: i as u16,
                rows: 10,
                bytes: 100,
                sha256: "00".repeat(32),
                id_range: (format!("0{i}"), format!("9{i}")),
                time_range: (i as i64, 10 + i as i64),
                tenants: [("t".to_string(), 10u64)].into_iter().collect(),
            });
        }
        assert_eq!((m.row_count, m.byte_count), (20, 200));
        assert_eq!(m.files[0].key, "a");
        assert_eq!(m.id_range, Some(("00".into(), "91".into())));
        assert_eq!(m.time_range, Some((0, 11)));
        assert!(m.may_hold("50") && !m.may_hold("95"));
        assert_eq!(Manifest::from_bytes(&m.to_bytes()).unwrap(), m);
    }
}
