//! Which days a run takes: hot days before the cutoff, days whose protocol
//! stopped half-way, and, of those, the ones nothing can still change (no
//! delivery of the day, or of an event of the day, still planned, pending
//! or replaying).

use std::collections::BTreeSet;

use chrono::{Duration, NaiveDate};
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;
use crate::archiver::Archiver;
use crate::dates::{NaiveDateSql, bounds};
use crate::layout::partition_day;
use crate::table::Table;

impl<S: ObjectStore> Archiver<S> {
    /// The days of `table` that a run takes: hot days before the cutoff and
    /// days whose protocol stopped half-way, oldest first.
    pub async fn due_days(&self, table: Table) -> Result<Vec<NaiveDate>, ArchiveError> {
        let cutoff = self.settings.cutoff();
        let client = self.platform.client().await?;
        let mut days = BTreeSet::new();
        for row in client
            .query(
                "SELECT day FROM walhook.archive_partitions WHERE table_name = $1 AND state IN ('written', 'verified')",
                &[&table.name()],
            )
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?
        {
            days.insert(row.get::<_, NaiveDateSql>(0).0);
        }
        let parent = format!("walhook.{}", table.name());
        for row in client
            .query(
                "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                 WHERE i.inhparent = $1::text::regclass",
                &[&parent],
            )
            .await
            .map_err(ArchiveError::query("list the day partitions"))?
        {
            if let Some(day) = partition_day(table, row.get(0))
                && day < cutoff
            {
                days.insert(day);
            }
        }
        let legacy = match table.legacy_partition() {
            Some(name) => client
                .query_one(
                    "SELECT to_regclass($1)::text",
                    &[&format!("walhook.{name}")],
                )
                .await
                .map_err(ArchiveError::query("look for the legacy partition"))?
                .get::<_, Option<String>>(0),
            None => None,
        };
        if let Some(legacy) = legacy {
            // The legacy partition holds many days: the oldest row through
            // each tenant's index, then every day from there to the cutoff
            // that has rows.
            let oldest: Option<i64> = client
                .query_one(
                    &format!(
                        "SELECT min(x.m) FROM walhook.tenants t, LATERAL (SELECT \
                         (extract(epoch FROM min(created_at)) / 86400)::int8 AS m \
                         FROM {legacy} d WHERE d.tenant_id = t.id) x"
                    ),
                    &[],
                )
                .await
                .map_err(ArchiveError::query("find the oldest delivery"))?
                .get(0);
            if let Some(first) = oldest {
                let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
                let mut day = epoch + Duration::days(first - 1);
                while day < cutoff {
                    let (from, to) = bounds(day);
                    let has: bool = client
                        .query_one(
                            &format!(
                                "SELECT EXISTS (SELECT 1 FROM walhook.tenants t, LATERAL (SELECT 1 \
                                 FROM {legacy} d WHERE d.tenant_id = t.id \
                                 AND d.created_at >= $1 AND d.created_at < $2 LIMIT 1) x)"
                            ),
                            &[&from, &to],
                        )
                        .await
                        .map_err(ArchiveError::query("look for deliveries of a day"))?
                        .get(0);
                    if has {
                        days.insert(day);
                    }
                    day += Duration::days(1);
                }
            }
        }
        Ok(days.into_iter().collect())
    }

    /// Why `table`'s `day` is not due yet, if it is not: a delivery still
    /// planned, pending or replaying that was made on or before the day
    /// (deliveries), or that belongs to an event of the day or older
    /// (events, whose bodies the dispatcher still needs).
    pub(crate) async fn not_due_because(
        &self,
        table: Table,
        day: NaiveDate,
    ) -> Result<Option<String>, ArchiveError> {
        let (column, pending, meaning) = match table {
            Table::Attempts => return Ok(None),
            Table::Deliveries => (
                "created_at",
                "SELECT count(*) FROM walhook.pending WHERE created_at < $1",
                "deliveries were made on or before this day; they end by their retry deadline",
            ),
            Table::Events => (
                "event_occurred_at",
                "SELECT count(*) FROM walhook.pending p LEFT JOIN walhook.deliveries d \
                 ON d.id = p.delivery_id WHERE d.id IS NULL OR d.event_occurred_at < $1",
                "deliveries are of events of this day or older; their bodies stay hot until they end",
            ),
        };
        let (_, to) = bounds(day);
        let client = self.platform.client().await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT (SELECT count(*) FROM walhook.fanouts WHERE {column} < $1), ({pending}), \
                     (SELECT count(*) FROM walhook.replay_requests r JOIN walhook.deliveries d \
                      ON d.id = r.delivery_id WHERE r.done_at IS NULL AND d.{column} < $1)"
                ),
                &[&to],
            )
            .await
            .map_err(ArchiveError::query("count the deliveries that keep a day hot"))?;
        let (planned, pending, replaying): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        Ok((planned + pending + replaying > 0).then(|| {
            format!("{planned} planned, {pending} pending and {replaying} replaying {meaning}")
        }))
    }
}
