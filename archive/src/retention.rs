//! Retention: archived days older than `[archive] retention_days` leave
//! the store too.

use chrono::Duration;
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;
use crate::archiver::{Archiver, Outcome, PartitionReport};
use crate::catalog::PartitionState;
use crate::dates::NaiveDateSql;
use crate::manifest::Manifest;
use crate::table::Table;

impl<S: ObjectStore> Archiver<S> {
    /// Deletes the objects of archived days older than `days` days (every
    /// part its manifests name, then the manifests) and marks them
    /// `expired`. Idempotent: a crash half-way deletes the rest next time.
    pub(crate) async fn expire(&self, days: u32) -> Result<Vec<PartitionReport>, ArchiveError> {
        let before = self.settings.today() - Duration::days(i64::from(days));
        let client = self.platform.client().await?;
        let rows = client
            .query(
                "SELECT table_name, day, generation, manifest_key, row_count, byte_count, file_count \
                 FROM walhook.archive_partitions WHERE state = 'dropped' AND day < $1 \
                 AND table_name = ANY($2) ORDER BY day, table_name, generation",
                &[
                    &NaiveDateSql(before),
                    &self.settings.tables.iter().map(|t| t.name()).collect::<Vec<_>>(),
                ],
            )
            .await
            .map_err(ArchiveError::query("find days past the retention"))?;
        let mut reports = Vec::new();
        for r in rows {
            let Some(table) = Table::parse(r.get(0)) else {
                continue;
            };
            let day = r.get::<_, NaiveDateSql>(1).0;
            let generation = r.get::<_, i32>(2) as u32;
            let key: String = r.get(3);
            if !self.settings.dry_run {
                if let Some(bytes) = self.store.get(&key).await? {
                    let manifest =
                        Manifest::from_bytes(&bytes).map_err(|e| ArchiveError::Shape {
                            table,
                            column: "manifest",
                            detail: format!("{key} does not parse: {e}"),
                        })?;
                    for f in &manifest.files {
                        self.store.delete(&f.key).await?;
                    }
                    self.store.delete(&key).await?;
                }
                client
                    .execute(
                        "UPDATE walhook.archive_partitions SET state = $4, expired_at = now() \
                         WHERE table_name = $1 AND day = $2 AND generation = $3",
                        &[
                            &table.name(),
                            &NaiveDateSql(day),
                            &(generation as i32),
                            &PartitionState::Expired.as_str(),
                        ],
                    )
                    .await
                    .map_err(ArchiveError::query("mark a day expired"))?;
            }
            reports.push(PartitionReport {
                table,
                day,
                generation,
                rows: r.get::<_, i64>(4) as u64,
                bytes: r.get::<_, i64>(5) as u64,
                files: r.get::<_, i32>(6) as usize,
                outcome: Outcome::Expired,
                seconds: 0.0,
            });
        }
        Ok(reports)
    }
}
