//! The drop step, once a generation is verified: the day's partition goes
//! (or, for a day in the legacy partition, its archived rows are deleted
//! tenant by tenant and the partition goes once empty), keeping any row
//! that changed since the export.

use chrono::NaiveDate;
use walhook_pipeline::objstore::ObjectStore;

use super::{Archiver, DELETE_BATCH, DropOutcome, HotDay};
use crate::ArchiveError;
use crate::catalog::CatalogRow;
use crate::dates::bounds;
use crate::manifest::Manifest;
use crate::table::Table;

/// Whether delivery row `d` changed after the export, given the parameters
/// holding the export's start (`stamp`, the archiver's clock) and its
/// snapshot (`snapshot`, `pg_snapshot` text, or null for generations
/// written before migration 0028); `c.newest` comes from [`NEWEST`].
///
/// With a snapshot: the row's version (its `xmin`) is one the export could
/// not see, whatever its `updated_at` says (a transaction stamps its start
/// and may commit after the export's snapshot). `xmin` is a 32-bit xid: it
/// is widened with the epoch of the newest xid, one epoch back when its low
/// bits are above the newest's. A frozen row keeps its raw `xmin`, so a row
/// frozen more than 2^32 transactions ago may widen to a recent xid: it then
/// counts as changed (the day is written again, nothing is lost) only if it
/// lands between the export's snapshot and now, a chance of one in
/// 2^32 / (transactions since the export).
fn changed(stamp: &str, snapshot: &str) -> String {
    format!(
        "CASE WHEN {snapshot}::text IS NULL THEN d.updated_at > {stamp} ELSE NOT pg_visible_in_snapshot( \
         ((greatest(0, (c.newest >> 32) - CASE WHEN d.xmin::text::int8 > (c.newest & 4294967295) THEN 1 ELSE 0 END) << 32) \
           | d.xmin::text::int8)::text::xid8, {snapshot}::text::pg_snapshot) END"
    )
}

/// The newest transaction id (`c.newest`, 64 bits) for [`changed`].
const NEWEST: &str = "(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8 AS newest) c";

impl<S: ObjectStore> Archiver<S> {
    /// Removes the day's hot rows; returns how many stay (deliveries changed
    /// since the export).
    pub(super) async fn drop_hot(
        &self,
        table: Table,
        day: NaiveDate,
        manifest: &Manifest,
        exported: &CatalogRow,
    ) -> Result<DropOutcome, ArchiveError> {
        let mut client = self.platform.client().await?;
        let (written_at, snapshot) = (exported.written_at, exported.export_snapshot.as_deref());
        let name = match self.hot_day(&client, table, day).await? {
            HotDay::Nowhere => return Ok(DropOutcome::Dropped { left: 0 }),
            HotDay::Legacy(legacy) => {
                return self
                    .empty_legacy_day(legacy, day, written_at, snapshot)
                    .await;
            }
            HotDay::Partition(name) => name,
        };
        let tx = client
            .transaction()
            .await
            .map_err(ArchiveError::query("start the drop"))?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '5s'; LOCK TABLE walhook.{name} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .map_err(ArchiveError::query("lock the day partition"))?;
        let n: i64 = tx
            .query_one(&format!("SELECT count(*) FROM walhook.{name}"), &[])
            .await
            .map_err(ArchiveError::query("count the day partition"))?
            .get(0);
        // Deliveries change after the export (a replay, a cancellation):
        // a row the export saw in another state, or one being replayed,
        // keeps the partition, and the day is written again with the
        // latest state.
        let changed: i64 = if table == Table::Deliveries {
            tx.query_one(
                &format!(
                    "SELECT count(*) FROM walhook.{name} d, {NEWEST} \
                     WHERE d.status = 'pending' OR {} \
                     OR EXISTS (SELECT 1 FROM walhook.replay_requests r \
                     WHERE r.delivery_id = d.id AND r.done_at IS NULL)",
                    changed("$1", "$2")
                ),
                &[&written_at, &snapshot],
            )
            .await
            .map_err(ArchiveError::query(
                "look for deliveries changed after the export",
            ))?
            .get(0)
        } else {
            0
        };
        if n as u64 != manifest.hot_rows() || changed > 0 {
            // The partition is whole, so the day is written anew (the
            // caller forgets this generation's catalog row, or keeps a
            // published compaction and takes the rows again).
            return Ok(DropOutcome::Changed {
                hot: n as u64,
                archived: manifest.hot_rows(),
                changed: changed as u64,
            });
        }
        tx.batch_execute(&format!("DROP TABLE walhook.{name}"))
            .await
            .map_err(ArchiveError::query("drop the day partition"))?;
        walhook_sql::commit!(tx, client).map_err(ArchiveError::query("drop the day partition"))?;
        Ok(DropOutcome::Dropped { left: 0 })
    }

    /// Deletes the archived rows of `day` from the legacy partition (rows
    /// of terminal deliveries unchanged since the export and not being
    /// replayed), a batch per statement and tenant, and drops the
    /// partition once it is empty. Returns how many of the day's rows stay.
    pub(super) async fn empty_legacy_day(
        &self,
        legacy: &'static str,
        day: NaiveDate,
        written_at: std::time::SystemTime,
        snapshot: Option<&str>,
    ) -> Result<DropOutcome, ArchiveError> {
        let mut client = self.platform.client().await?;
        let (from, to) = bounds(day);
        let tenants: Vec<String> = client
            .query("SELECT id FROM walhook.tenants ORDER BY id", &[])
            .await
            .map_err(ArchiveError::query("list tenants"))?
            .into_iter()
            .map(|r| r.get(0))
            .collect();
        let legacy_changed = changed("$4", "$6");
        for tenant in &tenants {
            loop {
                let n = client
                    .execute(
                        &format!(
                            "DELETE FROM walhook.{legacy} WHERE id IN (SELECT d.id FROM walhook.{legacy} d, {NEWEST} \
                             WHERE d.tenant_id = $1 AND d.created_at >= $2 AND d.created_at < $3 \
                             AND d.status <> 'pending' AND NOT ({legacy_changed}) \
                             AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests r \
                             WHERE r.delivery_id = d.id AND r.done_at IS NULL) LIMIT $5)"
                        ),
                        &[tenant, &from, &to, &written_at, &DELETE_BATCH, &snapshot],
                    )
                    .await
                    .map_err(ArchiveError::query("delete a day of archived deliveries"))?;
                if n == 0 {
                    break;
                }
            }
        }
        let left: i64 = client
            .query_one(
                &format!(
                    "SELECT count(*) FROM walhook.{legacy} WHERE created_at >= $1 AND created_at < $2"
                ),
                &[&from, &to],
            )
            .await
            .map_err(ArchiveError::query("count a day's hot rows"))?
            .get(0);
        // Empty, the partition goes, under a lock that waits for nobody
        // long (a row arriving meanwhile keeps it for a later round).
        let tx = client
            .transaction()
            .await
            .map_err(ArchiveError::query("start the drop"))?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '5s'; LOCK TABLE walhook.{legacy} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .map_err(ArchiveError::query("lock the legacy partition"))?;
        let empty: bool = tx
            .query_one(
                &format!("SELECT NOT EXISTS (SELECT 1 FROM walhook.{legacy})"),
                &[],
            )
            .await
            .map_err(ArchiveError::query("look into the legacy partition"))?
            .get(0);
        if empty {
            tx.batch_execute(&format!("DROP TABLE walhook.{legacy}"))
                .await
                .map_err(ArchiveError::query("drop the legacy partition"))?;
            walhook_sql::commit!(tx, client)
                .map_err(ArchiveError::query("drop the legacy partition"))?;
            tracing::info!(
                partition = legacy,
                "the legacy partition of deliveries is empty and dropped: every day has a partition of its own now"
            );
        }
        Ok(DropOutcome::Dropped { left: left as u64 })
    }
}
