//! Archived rows by id: a delivery (its day from the id index, see
//! [`crate::index`]), its event (the day of its occurrence) and its
//! attempts (the days between its creation and its last change).
//!
//! Within a day, statistics narrow the read to the tenant's pages, and of
//! those to the pages whose id (or time) range admits the row: delivery ids
//! grow with the WAL, so with time, and an id is one or two pages.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;

use chrono::NaiveDate;
use uuid::Uuid;
use walhook_pipeline::ids::{DeliveryId, TenantId};
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::deliveries::{AttemptRow, DeliveryRecord};

use super::predicate::Pred;
use super::prune::{Cond, Selection};
use super::reader::Spend;
use super::{ColdEvent, ColdHistory, Read, Slot, day_of, micros, rows, tenant_files};
use crate::ArchiveError;
use crate::dates::NaiveDateSql;
use crate::manifest::FileEntry;
use crate::table::Table;

/// How far an attempt's start may lie outside its delivery's creation
/// and last change (they come from different clocks: Postgres's and the
/// dispatcher's).
const CLOCK_SLACK: Duration = Duration::from_secs(300);

/// Where the id index says an archived delivery is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    /// The indexed day that holds the id, if one does.
    pub indexed: Option<NaiveDate>,
    /// Days archived before the index existed (not yet indexed), newest
    /// first: they may hold it too.
    pub unindexed: Vec<NaiveDate>,
}

fn columns(table: Table) -> Vec<&'static str> {
    table.columns().iter().map(|c| c.name).collect()
}

impl<S: ObjectStore> ColdHistory<S> {
    /// The days that may hold delivery `id`, from the index alone.
    pub async fn place(&self, id: DeliveryId) -> Result<Place, ArchiveError> {
        let client = self.platform.client().await?;
        let rows = client
            .query(
                "SELECT 'exception', e.day FROM walhook.archive_id_exceptions e \
                   JOIN walhook.archive_partitions p USING (table_name, day, generation) \
                   WHERE e.table_name = 'deliveries' AND e.id = $1 AND p.state IN ('verified', 'dropped') \
                 UNION ALL \
                 SELECT 'range', r.day FROM (SELECT day, generation, hi FROM walhook.archive_id_ranges \
                   WHERE table_name = 'deliveries' AND lo <= $1 ORDER BY lo DESC LIMIT 1) r \
                   JOIN walhook.archive_partitions p ON p.table_name = 'deliveries' \
                   AND p.day = r.day AND p.generation = r.generation \
                   WHERE r.hi >= $1 AND p.state IN ('verified', 'dropped') \
                 UNION ALL \
                 SELECT DISTINCT 'unindexed', day FROM walhook.archive_partitions \
                   WHERE table_name = 'deliveries' AND state IN ('verified', 'dropped') AND NOT indexed \
                 ORDER BY 1, 2 DESC",
                &[&Uuid::from_bytes(id.0)],
            )
            .await
            .map_err(ArchiveError::query("read the archive's id index"))?;
        let mut place = Place::default();
        for r in rows {
            let kind: &str = r.get(0);
            let day = r.get::<_, NaiveDateSql>(1).0;
            match kind {
                // An exception names its day outright; it comes first.
                "exception" => place.indexed = Some(day),
                "range" => {
                    place.indexed.get_or_insert(day);
                }
                _ => place.unindexed.push(day),
            }
        }
        place.unindexed.retain(|d| Some(*d) != place.indexed);
        Ok(place)
    }

    /// Archived delivery `id` of `tenant`, in its latest generation: read
    /// from the one day the id index names (and days not yet indexed,
    /// newest first, when it is not there). Takes a read slot of the
    /// tenant unless `held` is one.
    pub async fn delivery(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
        held: Option<&Slot>,
    ) -> Result<Option<DeliveryRecord>, ArchiveError> {
        let place = self.place(id).await?;
        let days: Vec<NaiveDate> = place.indexed.into_iter().chain(place.unindexed).collect();
        if days.is_empty() {
            return Ok(None);
        }
        let _slot = self.slot(tenant, held)?;
        let spend = Spend::unlimited();
        let key = Uuid::from_bytes(id.0).to_string();
        let table = Table::Deliveries;
        let output = columns(table);
        for day in days {
            let mut found = None;
            for d in self.days(table, Some(day), Some(day), None).await? {
                for m in self.manifests(&d, &spend).await? {
                    if !m.may_hold(&key) {
                        continue;
                    }
                    for file in tenant_files(&m, tenant) {
                        if !(file.id_range.0 <= key && key <= file.id_range.1) {
                            continue;
                        }
                        let conds = [Cond::BytesEq {
                            column: 0,
                            value: &id.0,
                        }];
                        let pred = Pred::UuidEq {
                            column: "id",
                            value: id.0,
                        };
                        for batch in self
                            .read_tenant_rows(table, file, tenant, &conds, pred, &output, &spend)
                            .await?
                        {
                            if let Some(r) = rows::deliveries(&batch)?.into_iter().last() {
                                found = Some(r);
                            }
                        }
                    }
                }
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// The archived event of `delivery`: read from the day it occurred.
    pub async fn event(
        &self,
        tenant: &TenantId,
        delivery: &DeliveryRecord,
        held: Option<&Slot>,
    ) -> Result<Option<ColdEvent>, ArchiveError> {
        let table = Table::Events;
        let at = micros(delivery.event_occurred_at);
        let day = day_of(at);
        let days = self.days(table, Some(day), Some(day), None).await?;
        if days.is_empty() {
            return Ok(None);
        }
        let _slot = self.slot(tenant, held)?;
        let spend = Spend::unlimited();
        let id = delivery.event_id.0;
        let key = Uuid::from_bytes(id).to_string();
        let output = columns(table);
        let time = table.column_index("occurred_at").expect("a time column");
        let mut found = None;
        for d in &days {
            for m in self.manifests(d, &spend).await? {
                for file in tenant_files(&m, tenant) {
                    let admits = file.id_range.0 <= key
                        && key <= file.id_range.1
                        && file.time_range.0 <= at
                        && at <= file.time_range.1;
                    if !admits {
                        continue;
                    }
                    let conds = [
                        Cond::Between {
                            column: time,
                            lo: at,
                            hi: at,
                        },
                        Cond::BytesEq {
                            column: 0,
                            value: &id,
                        },
                    ];
                    let pred = Pred::UuidEq {
                        column: "id",
                        value: id,
                    };
                    for batch in self
                        .read_tenant_rows(table, file, tenant, &conds, pred, &output, &spend)
                        .await?
                    {
                        if let Some(e) = rows::events(&batch)?.into_iter().last() {
                            found = Some(e);
                        }
                    }
                }
            }
        }
        Ok(found)
    }

    /// The archived attempts of `delivery`, in the order they started.
    /// `known` attempts of it are hot (a replay after a restore): the read
    /// stops once the archived ones and those make the delivery's count.
    ///
    /// The days read first are those of its automatic attempts (from its
    /// creation to its retry deadline) and of its last change; the days
    /// between only when attempts are still missing (replays on other
    /// days). Reads nothing when none of those days is archived.
    pub async fn attempts(
        &self,
        tenant: &TenantId,
        delivery: &DeliveryRecord,
        known: usize,
        held: Option<&Slot>,
    ) -> Result<Vec<AttemptRow>, ArchiveError> {
        let table = Table::Attempts;
        let from = micros(delivery.created_at) - CLOCK_SLACK.as_micros() as i64;
        let last = delivery.updated_at.max(delivery.created_at);
        let to = micros(last) + CLOCK_SLACK.as_micros() as i64;
        let mut days = self
            .days(table, Some(day_of(from)), Some(day_of(to)), None)
            .await?;
        if days.is_empty() {
            return Ok(Vec::new());
        }
        let expected =
            (delivery.attempt_count.max(0) + delivery.manual_attempt_count.max(0)) as usize;
        // The days of its automatic attempts (from its creation to its
        // retry deadline) and of its last change first; the others (the
        // clocks' slack, replays in between) only while attempts are
        // missing.
        let created = day_of(micros(delivery.created_at));
        let deadline = day_of(micros(delivery.expires_at.min(last)));
        let changed = day_of(micros(last));
        let first = |d: NaiveDate| (created <= d && d <= deadline) || d == changed;
        days.sort_by_key(|d| (!first(d.day), std::cmp::Reverse(d.day)));
        let _slot = self.slot(tenant, held)?;
        let spend = Spend::unlimited();
        let output = columns(table);
        let time = table.column_index("started_at").expect("a time column");
        let mut out: Vec<AttemptRow> = Vec::new();
        for d in &days {
            if !first(d.day) && out.len() + known >= expected {
                break;
            }
            for m in self.manifests(d, &spend).await? {
                for file in tenant_files(&m, tenant) {
                    if file.time_range.1 < from || file.time_range.0 > to {
                        continue;
                    }
                    let conds = [Cond::Between {
                        column: time,
                        lo: from,
                        hi: to,
                    }];
                    let pred = Pred::UuidEq {
                        column: "delivery_id",
                        value: delivery.id.0,
                    };
                    for batch in self
                        .read_tenant_rows(table, file, tenant, &conds, pred, &output, &spend)
                        .await?
                    {
                        out.extend(rows::attempts(&batch, delivery.id)?);
                    }
                }
            }
        }
        out.sort_by_key(|a| (a.started_at, a.number));
        out.dedup_by_key(|a| a.id);
        Ok(out)
    }

    /// The rows of `tenant` in `file` that `pred` admits, reading only the
    /// pages whose statistics admit the tenant and `conds`.
    #[allow(clippy::too_many_arguments)]
    async fn read_tenant_rows(
        &self,
        table: Table,
        file: &FileEntry,
        tenant: &TenantId,
        conds: &[Cond<'_>],
        pred: Pred,
        output: &[&'static str],
        spend: &Arc<Spend>,
    ) -> Result<Vec<RecordBatch>, ArchiveError> {
        let meta = self.footer(file, spend).await?;
        let mut all = vec![tenant_cond(table, tenant)];
        all.extend_from_slice(conds);
        let selection = Selection::new(meta.metadata(), &all);
        let read = Read {
            table,
            file,
            meta,
            selection: &selection,
            preds: vec![tenant_pred(tenant), pred],
            output,
        };
        self.read(read, spend).await
    }
}

fn tenant_cond(table: Table, tenant: &TenantId) -> Cond<'_> {
    Cond::BytesEq {
        column: table.column_index("tenant_id").expect("a tenant column"),
        value: tenant.as_str().as_bytes(),
    }
}

fn tenant_pred(tenant: &TenantId) -> Pred {
    Pred::TextEq {
        column: "tenant_id",
        value: tenant.as_str().to_owned(),
    }
}
