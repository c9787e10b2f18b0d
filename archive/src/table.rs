//! The three archived tables: their columns, how a row is read from the hot
//! table and how it becomes an Arrow column.
//!
//! One column list per table drives everything: the `SELECT` that reads a day
//! (values converted in SQL to what Parquet stores: timestamps as UTC
//! microseconds, enums as text, LSNs as integers), the Arrow schema, the
//! column builders, and the manifest's schema description. Adding a column is
//! one line here and a schema-version bump.

use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, FixedSizeBinaryBuilder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::ArchiveError;
use crate::copy::CopyReader;

/// The version of the Parquet layout; manifests carry it and readers check it.
///
/// - 1: the first layout.
/// - 2: attempts gain `secret_versions` (the versions of the secrets that
///   signed the attempt, newest first, comma-separated).
///
/// Readers accept every version from [`OLDEST_READABLE`] on: a later
/// layout only adds nullable columns, read as missing from older files.
pub const SCHEMA_VERSION: u32 = 2;

/// The oldest layout readers still accept.
pub const OLDEST_READABLE: u32 = 1;

/// A hot table that is archived by day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// `walhook.events`, by `occurred_at`.
    Events,
    /// `walhook.deliveries` (terminal rows only), by `created_at`.
    Deliveries,
    /// `walhook.attempts`, by `started_at`.
    Attempts,
}

/// What a column holds, and so its SQL conversion and Arrow type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A uuid, stored as 16 bytes (Parquet `UUID`).
    Uuid,
    /// Text (dictionary-encoded where it repeats).
    Text,
    /// A 32-bit integer.
    Int32,
    /// A Postgres LSN, stored as a 64-bit integer.
    Lsn,
    /// An instant, UTC microseconds.
    Timestamp,
    /// Bytes.
    Bytes,
    /// A SHA-256 digest, 32 bytes.
    Sha256,
}

/// One archived column.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// The Parquet column name (the hot column's name).
    pub name: &'static str,
    /// The SQL expression that reads it (`$` stands for nothing: plain SQL
    /// over the hot table).
    pub sql: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Whether it may be null.
    pub nullable: bool,
    /// Whether values repeat enough for a dictionary to pay.
    pub dictionary: bool,
}

const fn col(name: &'static str, sql: &'static str, kind: Kind, nullable: bool) -> Column {
    let dictionary = matches!(kind, Kind::Text | Kind::Int32);
    Column {
        name,
        sql,
        kind,
        nullable,
        dictionary,
    }
}

const fn unique(mut c: Column) -> Column {
    c.dictionary = false;
    c
}

const fn repeats(mut c: Column) -> Column {
    c.dictionary = true;
    c
}

const EVENTS: &[Column] = &[
    col("id", "id", Kind::Uuid, false),
    col("tenant_id", "tenant_id", Kind::Text, false),
    col("event_type", "event_type", Kind::Text, false),
    col("schema_version", "schema_version", Kind::Int32, false),
    col("object_id", "object_id", Kind::Text, true),
    unique(col("object_version", "object_version", Kind::Text, true)),
    col("occurred_at", "occurred_at", Kind::Timestamp, false),
    col("source", "source", Kind::Text, false),
    col("commit_lsn", "commit_lsn", Kind::Lsn, false),
    col("tx_ordinal", "tx_ordinal", Kind::Int32, false),
    col("payload", "payload", Kind::Bytes, false),
    col("payload_sha256", "payload_sha256", Kind::Sha256, false),
    col("created_at", "created_at", Kind::Timestamp, false),
];

const DELIVERIES: &[Column] = &[
    col("id", "id", Kind::Uuid, false),
    col("event_id", "event_id", Kind::Uuid, false),
    repeats(col("endpoint_id", "endpoint_id", Kind::Uuid, false)),
    col("tenant_id", "tenant_id", Kind::Text, false),
    col("event_type", "event_type", Kind::Text, false),
    col(
        "event_occurred_at",
        "event_occurred_at",
        Kind::Timestamp,
        false,
    ),
    col(
        "endpoint_config_version",
        "endpoint_config_version",
        Kind::Int32,
        false,
    ),
    col("status", "status::text", Kind::Text, false),
    col("attempt_count", "attempt_count", Kind::Int32, false),
    col(
        "manual_attempt_count",
        "manual_attempt_count",
        Kind::Int32,
        false,
    ),
    col("next_attempt_at", "next_attempt_at", Kind::Timestamp, false),
    col("expires_at", "expires_at", Kind::Timestamp, false),
    col("last_http_status", "last_http_status", Kind::Int32, true),
    col("last_error_class", "last_error_class", Kind::Text, true),
    col("created_at", "created_at", Kind::Timestamp, false),
    col("updated_at", "updated_at", Kind::Timestamp, false),
];

const ATTEMPTS: &[Column] = &[
    col("id", "id", Kind::Uuid, false),
    col("delivery_id", "delivery_id", Kind::Uuid, false),
    repeats(col("endpoint_id", "endpoint_id", Kind::Uuid, false)),
    col("tenant_id", "tenant_id", Kind::Text, false),
    col("number", "number", Kind::Int32, false),
    col("trigger", "trigger::text", Kind::Text, false),
    col(
        "endpoint_config_version",
        "endpoint_config_version",
        Kind::Int32,
        false,
    ),
    col("started_at", "started_at", Kind::Timestamp, false),
    col("finished_at", "finished_at", Kind::Timestamp, false),
    col("http_status", "http_status", Kind::Int32, true),
    col("latency_ms", "latency_ms", Kind::Int32, false),
    col("outcome", "outcome", Kind::Text, false),
    col("error_class", "error_class", Kind::Text, true),
    repeats(col(
        "response_sha256",
        "response_sha256",
        Kind::Sha256,
        true,
    )),
    col("response_excerpt", "response_excerpt", Kind::Text, true),
    col("note", "note", Kind::Text, true),
    col(
        "secret_versions",
        "array_to_string(secret_versions, ',')",
        Kind::Text,
        true,
    ),
];

impl Table {
    /// Every archived table, in the order a run takes them.
    pub const ALL: [Table; 3] = [Table::Attempts, Table::Deliveries, Table::Events];

    /// The hot table's name (and the `table=` key segment).
    pub fn name(self) -> &'static str {
        match self {
            Table::Events => "events",
            Table::Deliveries => "deliveries",
            Table::Attempts => "attempts",
        }
    }

    /// Parses a name given on the command line.
    pub fn parse(s: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == s)
    }

    /// The column that decides a row's day.
    pub fn day_column(self) -> &'static str {
        match self {
            Table::Events => "occurred_at",
            Table::Deliveries => "created_at",
            Table::Attempts => "started_at",
        }
    }

    /// The partition that holds a table's rows from before it was
    /// partitioned by day, emptied a day at a time by the archive and
    /// dropped once empty: `walhook.deliveries` until migration 0024 kept
    /// one table (existing installs only).
    pub fn legacy_partition(self) -> Option<&'static str> {
        matches!(self, Table::Deliveries).then_some("deliveries_legacy")
    }

    /// The archived columns, in Parquet order.
    pub fn columns(self) -> &'static [Column] {
        match self {
            Table::Events => EVENTS,
            Table::Deliveries => DELIVERIES,
            Table::Attempts => ATTEMPTS,
        }
    }

    /// The Arrow schema of the Parquet parts.
    pub fn schema(self) -> SchemaRef {
        let fields: Vec<Field> = self
            .columns()
            .iter()
            .map(|c| {
                let f = Field::new(c.name, data_type(c.kind), c.nullable);
                if c.kind == Kind::Uuid {
                    f.with_metadata(
                        [("ARROW:extension:name".to_string(), "arrow.uuid".to_string())]
                            .into_iter()
                            .collect::<std::collections::HashMap<String, String>>(),
                    )
                } else {
                    f
                }
            })
            .collect();
        Arc::new(Schema::new(fields))
    }

    /// The SQL select list, in column order, followed by the tenant bucket.
    pub fn select_list(self) -> String {
        self.columns()
            .iter()
            .map(|c| c.sql)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The index of a column by name.
    pub fn column_index(self, name: &str) -> Option<usize> {
        self.columns().iter().position(|c| c.name == name)
    }
}

impl std::fmt::Display for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn data_type(kind: Kind) -> DataType {
    match kind {
        Kind::Uuid => DataType::FixedSizeBinary(16),
        Kind::Text => DataType::Utf8,
        Kind::Int32 => DataType::Int32,
        Kind::Lsn => DataType::Int64,
        Kind::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        Kind::Bytes => DataType::Binary,
        Kind::Sha256 => DataType::FixedSizeBinary(32),
    }
}

/// The most bytes one Arrow `Binary`/`Utf8` array holds: its offsets are
/// `i32`. Parts are cut long before (`[archive] part_bytes`, at most 1 GiB);
/// this bound turns a part that would still pass it into an error instead
/// of the builder's panic.
pub const ARRAY_BYTES_MAX: usize = i32::MAX as usize;

/// Whether `more` bytes fit in an array already holding `held`.
fn within_array_limit(held: usize, more: usize) -> Result<(), String> {
    if held.saturating_add(more) > ARRAY_BYTES_MAX {
        return Err(format!(
            "the part would hold {} bytes in this column, past Arrow's limit of {ARRAY_BYTES_MAX} for one array; lower [archive] part_bytes",
            held.saturating_add(more)
        ));
    }
    Ok(())
}

/// Microseconds from the Unix epoch to Postgres's, 2000-01-01 UTC: binary
/// timestamps count from there.
pub const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

enum Builder {
    Uuid(FixedSizeBinaryBuilder),
    Text(StringBuilder),
    Int32(Int32Builder),
    Lsn(Int64Builder),
    Timestamp(TimestampMicrosecondBuilder),
    Bytes(BinaryBuilder),
    Sha256(FixedSizeBinaryBuilder),
}

/// Rows of one table gathered into Arrow columns.
pub struct BatchBuilder {
    table: Table,
    builders: Vec<Builder>,
    rows: usize,
}

impl BatchBuilder {
    /// An empty batch of `table`.
    pub fn new(table: Table) -> Self {
        let builders = table
            .columns()
            .iter()
            .map(|c| match c.kind {
                Kind::Uuid => Builder::Uuid(FixedSizeBinaryBuilder::new(16)),
                Kind::Text => Builder::Text(StringBuilder::new()),
                Kind::Int32 => Builder::Int32(Int32Builder::new()),
                Kind::Lsn => Builder::Lsn(Int64Builder::new()),
                Kind::Timestamp => {
                    Builder::Timestamp(TimestampMicrosecondBuilder::new().with_timezone("UTC"))
                }
                Kind::Bytes => Builder::Bytes(BinaryBuilder::new()),
                Kind::Sha256 => Builder::Sha256(FixedSizeBinaryBuilder::new(32)),
            })
            .collect();
        BatchBuilder {
            table,
            builders,
            rows: 0,
        }
    }

    /// The rows gathered so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether no row was gathered.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Appends the current tuple of `copy`: the columns of
    /// [`Table::select_list`] in Postgres's binary form.
    pub fn push_tuple(&mut self, copy: &CopyReader) -> Result<(), ArchiveError> {
        let table = self.table;
        for (i, (b, c)) in self.builders.iter_mut().zip(table.columns()).enumerate() {
            let v = copy.field(i);
            let shape = |detail: String| ArchiveError::Shape {
                table,
                column: c.name,
                detail,
            };
            if v.is_none() && !c.nullable {
                return Err(shape("NULL in a column that cannot be null".into()));
            }
            match b {
                Builder::Uuid(b) | Builder::Sha256(b) => match v {
                    Some(v) => b.append_value(v).map_err(|_| {
                        shape(format!("{} bytes where a fixed width is expected", v.len()))
                    })?,
                    None => b.append_null(),
                },
                Builder::Text(b) => match v {
                    Some(v) => {
                        within_array_limit(b.values_slice().len(), v.len()).map_err(shape)?;
                        b.append_value(
                            std::str::from_utf8(v)
                                .map_err(|_| shape("text that is not UTF-8".into()))?,
                        )
                    }
                    None => b.append_null(),
                },
                Builder::Int32(b) => b.append_option(
                    v.map(|v| v.try_into().map(i32::from_be_bytes))
                        .transpose()
                        .map_err(|_| shape("an int4 that is not 4 bytes".into()))?,
                ),
                Builder::Lsn(b) => b.append_option(
                    v.map(|v| v.try_into().map(i64::from_be_bytes))
                        .transpose()
                        .map_err(|_| shape("an 8-byte value that is not 8 bytes".into()))?,
                ),
                Builder::Timestamp(b) => b.append_option(
                    v.map(|v| {
                        v.try_into()
                            .map(|a| i64::from_be_bytes(a).saturating_add(PG_EPOCH_MICROS))
                    })
                    .transpose()
                    .map_err(|_| shape("a timestamp that is not 8 bytes".into()))?,
                ),
                Builder::Bytes(b) => {
                    if let Some(v) = v {
                        within_array_limit(b.values_slice().len(), v.len()).map_err(shape)?;
                    }
                    b.append_option(v)
                }
            }
        }
        self.rows += 1;
        Ok(())
    }

    /// The gathered rows as one record batch; the builder is empty after.
    pub fn finish(&mut self) -> Result<RecordBatch, ArchiveError> {
        let columns: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .map(|b| -> ArrayRef {
                match b {
                    Builder::Uuid(b) | Builder::Sha256(b) => Arc::new(b.finish()),
                    Builder::Text(b) => Arc::new(b.finish()),
                    Builder::Int32(b) => Arc::new(b.finish()),
                    Builder::Lsn(b) => Arc::new(b.finish()),
                    Builder::Timestamp(b) => Arc::new(b.finish()),
                    Builder::Bytes(b) => Arc::new(b.finish()),
                }
            })
            .collect();
        self.rows = 0;
        RecordBatch::try_new(self.table.schema(), columns).map_err(ArchiveError::Arrow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_past_the_i32_offset_limit_is_an_error_not_a_panic() {
        assert!(within_array_limit(0, 1 << 30).is_ok());
        assert!(within_array_limit(ARRAY_BYTES_MAX - 10, 10).is_ok());
        let err = within_array_limit(ARRAY_BYTES_MAX - 10, 11).unwrap_err();
        assert!(err.contains("part_bytes"), "{err}");
        assert!(within_array_limit(usize::MAX, usize::MAX).is_err());
    }

    #[test]
    fn every_table_has_an_id_a_tenant_and_its_day_column() {
        for t in Table::ALL {
            assert_eq!(t.columns()[0].name, "id");
            assert!(t.column_index("tenant_id").is_some(), "{t}");
            assert!(t.column_index(t.day_column()).is_some(), "{t}");
            assert_eq!(t.schema().fields().len(), t.columns().len());
            assert_eq!(Table::parse(t.name()), Some(t));
        }
    }
}
