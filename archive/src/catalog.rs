//! The archive's catalog (`walhook.archive_partitions`): how far each
//! generation of each table's day got through the protocol
//! ([`PartitionState`]), and (for deliveries) the id index written with the
//! step to `verified`.

use chrono::NaiveDate;
use tokio_postgres::types::ToSql;
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;
use crate::archiver::Archiver;
use crate::dates::NaiveDateSql;
use crate::index;
use crate::manifest::Manifest;
use crate::table::Table;

walhook_pipeline::stored_names! {
    /// How far one generation of a table's day got through the archive
    /// protocol: the `state` of its row in `walhook.archive_partitions`.
    ///
    /// ```text
    ///  (no row) ─export, manifest─▶ written ─verify─▶ verified ─drop─▶ dropped ─retention─▶ expired
    /// ```
    ///
    /// The hot rows stay until `dropped`; only `verified` and `dropped`
    /// generations are read by cold reads, and only `dropped` (and
    /// `expired`) ones make the next archiving of the day a new generation.
    pub enum PartitionState as "archive partition state" {
        /// Its parts and manifest are in the store, not yet read back: the
        /// hot rows are whole. The next run verifies it (or, when its
        /// manifest has gone, writes the day anew).
        Written = "written",
        /// Every object was read back and matched (and, for deliveries, its
        /// id index written): it is the day's archived copy, cold reads
        /// serve it, and it is never exported again, since its hot rows may
        /// be partly gone. The next run drops the hot rows.
        Verified = "verified",
        /// Its hot rows are gone from Postgres: the objects are the day's
        /// only copy. Rows that reach the day later are archived as the next
        /// generation.
        Dropped = "dropped",
        /// Older than `[archive] retention_days`: its objects were deleted
        /// too, and nothing of the generation is left but this row.
        Expired = "expired",
    }
}

impl PartitionState {
    /// Parses the state stored in the catalog row of `table`'s `day`,
    /// `generation`; a state this version does not know is
    /// [`ArchiveError::UnknownState`], never a guess.
    pub fn stored(
        text: &str,
        table: Table,
        day: NaiveDate,
        generation: u32,
    ) -> Result<PartitionState, ArchiveError> {
        PartitionState::try_from(text).map_err(|unknown| ArchiveError::UnknownState {
            table,
            day,
            generation,
            unknown,
        })
    }
}

/// One catalog row.
#[derive(Debug, Clone)]
pub(crate) struct CatalogRow {
    pub(crate) generation: u32,
    pub(crate) state: PartitionState,
    pub(crate) manifest_key: String,
    pub(crate) manifest_sha256: String,
    pub(crate) written_at: std::time::SystemTime,
    /// The snapshot the export read the day under (`pg_snapshot` text;
    /// none for generations written before migration 0028).
    pub(crate) export_snapshot: Option<String>,
}

impl<S: ObjectStore> Archiver<S> {
    pub(crate) async fn catalog(
        &self,
        table: Table,
        day: NaiveDate,
    ) -> Result<Option<CatalogRow>, ArchiveError> {
        let client = self.platform.client().await?;
        let row = client
            .query_opt(
                "SELECT generation, state, manifest_key, manifest_sha256, written_at, export_snapshot \
                 FROM walhook.archive_partitions WHERE table_name = $1 AND day = $2 \
                 ORDER BY generation DESC LIMIT 1",
                &[&table.name(), &NaiveDateSql(day)],
            )
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        row.map(|r| {
            let generation = r.get::<_, i32>(0) as u32;
            Ok(CatalogRow {
                generation,
                state: PartitionState::stored(r.get(1), table, day, generation)?,
                manifest_key: r.get(2),
                manifest_sha256: r.get(3),
                written_at: r.get(4),
                export_snapshot: r.get(5),
            })
        })
        .transpose()
    }

    pub(crate) async fn next_generation(
        &self,
        table: Table,
        day: NaiveDate,
    ) -> Result<u32, ArchiveError> {
        Ok(match self.catalog(table, day).await? {
            Some(row) if matches!(row.state, PartitionState::Dropped | PartitionState::Expired) => {
                row.generation + 1
            }
            Some(row) => row.generation,
            None => 0,
        })
    }

    pub(crate) async fn count_failure(
        &self,
        table: Table,
        day: NaiveDate,
    ) -> Result<(), ArchiveError> {
        self.catalog_execute(
            "count a failed verification",
            "UPDATE walhook.archive_partitions SET verify_failures = verify_failures + 1 \
             WHERE table_name = $1 AND day = $2 AND state <> 'dropped'",
            &[&table.name(), &NaiveDateSql(day)],
        )
        .await
    }

    pub(crate) async fn forget(
        &self,
        table: Table,
        day: NaiveDate,
        generation: u32,
    ) -> Result<(), ArchiveError> {
        self.catalog_execute(
            "reset a day in the archive catalog",
            "DELETE FROM walhook.archive_partitions WHERE table_name = $1 AND day = $2 AND generation = $3",
            &[&table.name(), &NaiveDateSql(day), &(generation as i32)],
        )
        .await
    }

    pub(crate) async fn set_state(
        &self,
        table: Table,
        day: NaiveDate,
        generation: u32,
        state: PartitionState,
    ) -> Result<(), ArchiveError> {
        self.catalog_execute(
            "advance a day in the archive catalog",
            "UPDATE walhook.archive_partitions SET state = $4, \
             verified_at = CASE WHEN $5 THEN now() ELSE verified_at END, \
             dropped_at = CASE WHEN $6 THEN now() ELSE dropped_at END \
             WHERE table_name = $1 AND day = $2 AND generation = $3",
            &[
                &table.name(),
                &NaiveDateSql(day),
                &(generation as i32),
                &state.as_str(),
                &(state == PartitionState::Verified),
                &(state == PartitionState::Dropped),
            ],
        )
        .await
    }

    /// Moves a verified generation to `verified`; for deliveries, writes
    /// its id index ([`crate::index`]) in the same transaction, so that a
    /// verified day is always indexed.
    pub(crate) async fn record_verified(
        &self,
        table: Table,
        day: NaiveDate,
        generation: u32,
        manifest: &Manifest,
    ) -> Result<(), ArchiveError> {
        if table != Table::Deliveries {
            return self
                .set_state(table, day, generation, PartitionState::Verified)
                .await;
        }
        let index = index::build(&self.platform, &self.store, table, day, manifest).await?;
        index::write(&self.platform, table, day, generation, &index, true).await?;
        tracing::debug!(%table, %day, generation, ranges = index.ranges.len(), exceptions = index.exceptions.len(), "id index written");
        Ok(())
    }

    /// Indexes up to `limit` generations of deliveries archived before the
    /// id index existed, newest first; lookups search those days one by
    /// one until then. Returns how many it indexed.
    pub(crate) async fn index_earlier_days(&self, limit: i64) -> Result<usize, ArchiveError> {
        let table = Table::Deliveries;
        let rows = self
            .platform
            .client()
            .await?
            .query(
                "SELECT day, generation, manifest_key FROM walhook.archive_partitions \
                 WHERE table_name = $1 AND state IN ('verified', 'dropped') AND NOT indexed \
                 ORDER BY day DESC, generation LIMIT $2",
                &[&table.name(), &limit],
            )
            .await
            .map_err(ArchiveError::query("find days without an id index"))?;
        let mut done = 0;
        for r in rows {
            let day = r.get::<_, NaiveDateSql>(0).0;
            let generation = r.get::<_, i32>(1) as u32;
            let key: String = r.get(2);
            let Some(bytes) = self.store.get(&key).await? else {
                tracing::warn!(%day, key, "a manifest named by the catalog is missing; its day stays unindexed");
                continue;
            };
            let manifest = Manifest::from_bytes(&bytes).map_err(|e| ArchiveError::Shape {
                table,
                column: "manifest",
                detail: format!("{key} does not parse: {e}"),
            })?;
            let index = index::build(&self.platform, &self.store, table, day, &manifest).await?;
            index::write(&self.platform, table, day, generation, &index, false).await?;
            done += 1;
        }
        Ok(done)
    }

    pub(crate) async fn catalog_execute(
        &self,
        what: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), ArchiveError> {
        let client = self.platform.client().await?;
        client
            .execute(sql, params)
            .await
            .map_err(ArchiveError::query(what))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_states_round_trip_through_their_stored_names() {
        assert_eq!(PartitionState::ALL.len(), 4);
        for state in PartitionState::ALL {
            assert_eq!(PartitionState::try_from(state.as_str()), Ok(*state));
            assert_eq!(state.to_string(), state.as_str());
            assert_eq!(
                serde_json::to_string(state).unwrap(),
                format!("\"{}\"", state.as_str())
            );
        }
        let names: Vec<_> = PartitionState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(names, ["written", "verified", "dropped", "expired"]);
    }

    #[test]
    fn an_unknown_stored_state_is_an_error_naming_it_the_table_and_the_day() {
        let day = NaiveDate::from_ymd_opt(2026, 11, 27).unwrap();
        let e = PartitionState::stored("compacting", Table::Attempts, day, 3).unwrap_err();
        assert!(
            matches!(e, ArchiveError::UnknownState { generation: 3, .. }),
            "{e}"
        );
        let text = e.to_string();
        for part in [
            "\"compacting\"",
            "walhook.archive_partitions",
            "attempts",
            "2026-11-27",
            "generation 3",
            "written, verified, dropped, expired",
        ] {
            assert!(text.contains(part), "{part} not in {text}");
        }
        assert!(!e.ends_the_run() && !e.is_transient());
        assert_eq!(
            PartitionState::stored("verified", Table::Attempts, day, 3).unwrap(),
            PartitionState::Verified
        );
    }
}
