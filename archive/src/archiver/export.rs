//! The export step: every hot row of a day, in the archive's order, cut
//! into Parquet parts, put under keys that depend only on the rows, then
//! the manifest and the catalog row that says the generation is `written`.

use bytes::Bytes;
use chrono::NaiveDate;
use futures::StreamExt;
use walhook_pipeline::failpoint;
use walhook_pipeline::objstore::ObjectStore;

use super::{Archiver, Progress};
use crate::catalog::{CatalogRow, PartitionState};
use crate::copy::{CopyReader, Next};
use crate::dates::NaiveDateSql;
use crate::encode::encode;
use crate::layout::{bucket_sql_over, manifest_key, part_key, partition_name, staged_key};
use crate::manifest::{FileEntry, Manifest};
use crate::merge::Merge;
use crate::part::PartBuilder;
use crate::table::Table;
use crate::{ArchiveError, VerificationKind};

impl<S: ObjectStore> Archiver<S> {
    /// Writes every hot row of the day as parts and a manifest, and records
    /// the generation as `written`.
    pub(super) async fn export(
        &self,
        table: Table,
        day: NaiveDate,
        generation: u32,
        mut merge: Option<Merge>,
        progress: &dyn Progress,
    ) -> Result<CatalogRow, ArchiveError> {
        let started_at = std::time::SystemTime::now();
        let buckets = self.settings.tenant_buckets;
        let mut client = self.platform.client().await?;
        let hot = self.hot_day(&client, table, day).await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(ArchiveError::query("start the export snapshot"))?;
        tx.execute("SET LOCAL statement_timeout = 0", &[])
            .await
            .map_err(ArchiveError::query(
                "lift the statement timeout for the export",
            ))?;
        // What this export can see: the drop keeps every row whose version
        // this snapshot could not see (it changed after the export).
        let snapshot: String = tx
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await
            .map_err(ArchiveError::query("read the export's snapshot"))?
            .get(0);
        let day_col = table.day_column();
        // COPY takes no parameters: the values below are a number and two
        // dates this code formats, never input.
        let source = hot
            .source(day)
            .unwrap_or_else(|| format!("walhook.{}", partition_name(table, day)));
        let total: i64 = tx
            .query_one(&format!("SELECT count(*) FROM {source}"), &[])
            .await
            .map_err(ArchiveError::query("count the day's rows"))?
            .get(0);
        let bucket = bucket_sql_over(&i32::from(buckets).to_string());
        let copy_sql = format!(
            "COPY (SELECT {}, {bucket} FROM {source} ORDER BY {bucket}, tenant_id, {day_col}, id) \
             TO STDOUT (FORMAT binary)",
            table.select_list(),
        );
        progress.start(table, day, total as u64);
        let stream = tx
            .copy_out(&copy_sql)
            .await
            .map_err(ArchiveError::query("read the day's rows"))?;
        futures::pin_mut!(stream);
        let mut copy = CopyReader::new();
        let mut manifest = Manifest::new(
            table,
            &day.format("%Y-%m-%d").to_string(),
            generation,
            buckets,
        );
        let mut part = PartBuilder::new(table);
        let limits = self.settings.part_limits();
        let bucket_col = table.columns().len();
        let status_col = table.column_index("status");
        let mut current: Option<(u16, u32)> = None; // (bucket, next sequence)
        // A compacted generation's parts wait outside the layout until
        // verified.
        let staged = merge.is_some();
        let mut new_parts = Vec::new();
        loop {
            match copy.next_tuple().map_err(|detail| ArchiveError::Shape {
                table,
                column: "copy",
                detail,
            })? {
                Next::Tuple => {}
                Next::End => break,
                Next::NeedMore => match stream.next().await {
                    Some(chunk) => {
                        copy.feed(&chunk.map_err(ArchiveError::query("read the day's rows"))?);
                        continue;
                    }
                    None => {
                        return Err(ArchiveError::Shape {
                            table,
                            column: "copy",
                            detail: "the copy ended inside a tuple".into(),
                        });
                    }
                },
            }
            if let Some(i) = status_col
                && copy.field(i) == Some(&b"pending"[..])
            {
                return Err(ArchiveError::Verification {
                    table,
                    day,
                    object: "walhook.deliveries".into(),
                    kind: VerificationKind::Mismatch,
                    problem: "a delivery of this day is still pending but has no pending entry".into(),
                    fix: "nothing was written or dropped; find it with `SELECT id FROM walhook.deliveries WHERE status = 'pending'` and report it: the dispatcher keeps every pending delivery in walhook.pending".into(),
                });
            }
            let bucket = copy
                .field(bucket_col)
                .and_then(|v| v.try_into().ok())
                .map(i32::from_be_bytes)
                .unwrap_or_default() as u16;
            if let Some(m) = merge.as_mut()
                && m.absorb(&self.store, &copy, bucket).await?
            {
                continue;
            }
            let row_bytes = copy.tuple_bytes() as u64;
            let seq = match current {
                Some((b, seq)) if b == bucket && part.fits(row_bytes, limits) => seq,
                Some((b, seq)) => {
                    let file = self
                        .put_part(&mut part, table, day, generation, (b, seq), staged)
                        .await?;
                    new_parts.push(file.key.clone());
                    progress.rows(file.rows);
                    manifest.add(file);
                    if b == bucket { seq + 1 } else { 0 }
                }
                None => 0,
            };
            current = Some((bucket, seq));
            part.push(&copy)?;
        }
        if let Some((b, seq)) = current {
            let file = self
                .put_part(&mut part, table, day, generation, (b, seq), staged)
                .await?;
            new_parts.push(file.key.clone());
            progress.rows(file.rows);
            manifest.add(file);
        }
        walhook_sql::commit!(tx, client).map_err(ArchiveError::query("end the export snapshot"))?;
        if let Some(m) = merge {
            m.finish(&self.store, &mut manifest, new_parts).await?;
        }
        let key = manifest_key(table, day, generation);
        let receipt = self
            .store
            .put(&key, Bytes::from(manifest.to_bytes()))
            .await?;
        failpoint::hit("archive.after_manifest");
        let written = PartitionState::Written;
        let client = self.platform.client().await?;
        client
            .execute(
                "INSERT INTO walhook.archive_partitions (table_name, day, generation, state, manifest_key, \
                 manifest_sha256, row_count, byte_count, file_count, store, written_at, export_snapshot) \
                 VALUES ($1, $2, $3, $11, $4, $5, $6, $7, $8, $9, $10, $12) \
                 ON CONFLICT (table_name, day, generation) DO UPDATE SET state = excluded.state, \
                 manifest_key = excluded.manifest_key, manifest_sha256 = excluded.manifest_sha256, \
                 row_count = excluded.row_count, byte_count = excluded.byte_count, \
                 file_count = excluded.file_count, store = excluded.store, written_at = excluded.written_at, \
                 export_snapshot = excluded.export_snapshot, \
                 verified_at = NULL, dropped_at = NULL",
                &[
                    &table.name(),
                    &NaiveDateSql(day),
                    &(generation as i32),
                    &key,
                    &receipt.sha256,
                    &(manifest.row_count as i64),
                    &(manifest.byte_count as i64),
                    &(manifest.files.len() as i32),
                    &self.store.describe(),
                    &started_at,
                    &written.as_str(),
                    &snapshot,
                ],
            )
            .await
            .map_err(ArchiveError::query("record the written day in the archive catalog"))?;
        Ok(CatalogRow {
            generation,
            state: written,
            manifest_key: key,
            manifest_sha256: receipt.sha256,
            written_at: started_at,
            export_snapshot: Some(snapshot),
        })
    }

    pub(super) async fn put_part(
        &self,
        part: &mut PartBuilder,
        table: Table,
        day: NaiveDate,
        generation: u32,
        (bucket, seq): (u16, u32),
        staged: bool,
    ) -> Result<FileEntry, ArchiveError> {
        let (batch, stats) = part.finish()?;
        let rows = batch.num_rows() as u64;
        let bytes = encode(table, &batch)?;
        let key = part_key(table, day, generation, bucket, seq);
        let at = if staged {
            staged_key(&key, generation)
        } else {
            key.clone()
        };
        let receipt = self.store.put(&at, bytes).await?;
        failpoint::hit("archive.after_part");
        Ok(FileEntry {
            key,
            tenant_bucket: bucket,
            rows,
            bytes: receipt.size,
            sha256: receipt.sha256,
            id_range: stats.id_range,
            time_range: stats.time_range,
            tenants: stats.tenants,
        })
    }
}
