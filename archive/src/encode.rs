//! Rows to Parquet bytes: zstd, dictionaries where values repeat, page
//! statistics and the page index (column and offset indexes) for pruning,
//! row groups sized for DuckDB and Athena, pages sized for cold reads, and
//! the sort order (tenant, then time) declared in the footer.

use arrow_array::RecordBatch;
use bytes::Bytes;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{KeyValue, SortingColumn};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::ArchiveError;
use crate::table::{SCHEMA_VERSION, Table};

/// Rows per row group: 128 Ki rows is DuckDB's unit of parallelism (122,880
/// rows) rounded up, and gives Athena row groups of a few MB to tens of MB.
pub const ROW_GROUP_ROWS: usize = 131_072;

/// Rows per data page at most: the unit a cold read fetches. A lookup by id
/// reads one page of each column; 8 Ki rows keeps that to tens of KB, where
/// the writer's default (20,000 rows, or 1 MB) would make it hundreds,
/// while the page index of a million-row part stays near 100 KB.
pub const PAGE_ROWS: usize = 8192;

/// The writer settings of `table`'s parts.
pub fn properties(table: Table) -> WriterProperties {
    let tenant = table
        .column_index("tenant_id")
        .expect("every table has a tenant") as i32;
    let time = table
        .column_index(table.day_column())
        .expect("every table has its day column") as i32;
    let mut b = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("level 3 is valid"),
        ))
        .set_dictionary_enabled(true)
        .set_statistics_enabled(EnabledStatistics::Page)
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_sorting_columns(Some(vec![
            SortingColumn {
                column_idx: tenant,
                descending: false,
                nulls_first: false,
            },
            SortingColumn {
                column_idx: time,
                descending: false,
                nulls_first: false,
            },
        ]))
        .set_key_value_metadata(Some(vec![
            KeyValue::new("walhook.table".into(), table.name().to_string()),
            KeyValue::new("walhook.schema_version".into(), SCHEMA_VERSION.to_string()),
        ]));
    for c in table.columns() {
        b = b.set_column_dictionary_enabled(ColumnPath::from(c.name), c.dictionary);
    }
    b.build()
}

/// One Parquet file holding `batch`.
pub fn encode(table: Table, batch: &RecordBatch) -> Result<Bytes, ArchiveError> {
    let mut out = Vec::with_capacity(batch.get_array_memory_size() / 3 + 4096);
    let mut w = ArrowWriter::try_new(&mut out, table.schema(), Some(properties(table)))
        .map_err(ArchiveError::Parquet)?;
    w.write(batch).map_err(ArchiveError::Parquet)?;
    w.close().map_err(ArchiveError::Parquet)?;
    Ok(Bytes::from(out))
}

/// The row count a Parquet file's footer declares, and whether its schema is
/// `table`'s (column names in order).
pub fn footer_rows(table: Table, bytes: &Bytes) -> Result<u64, String> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let r =
        SerializedFileReader::new(bytes.clone()).map_err(|e| format!("not a Parquet file: {e}"))?;
    let meta = r.metadata().file_metadata();
    let names: Vec<&str> = meta
        .schema_descr()
        .columns()
        .iter()
        .map(|c| c.name())
        .collect();
    let want: Vec<&str> = table.columns().iter().map(|c| c.name).collect();
    if names != want {
        return Err(format!(
            "its columns are {names:?}, not the {table} layout {want:?}"
        ));
    }
    u64::try_from(meta.num_rows()).map_err(|_| "a negative row count".to_string())
}

/// Every row of a Parquet part, as record batches.
pub fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ArchiveError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .map_err(ArchiveError::Parquet)?
        .build()
        .map_err(ArchiveError::Parquet)?;
    reader
        .collect::<Result<Vec<_>, _>>()
        .map_err(ArchiveError::Arrow)
}
