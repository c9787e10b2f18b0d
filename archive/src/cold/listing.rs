//! Listing archived deliveries: newest first by `(created_at, id)`, day by
//! day, within a budget per request.
//!
//! A request takes the archived days below its cursor, newest first, and
//! for each the tenant's parts (its bucket, and the parts whose manifest
//! entry names it). It reads each day in two passes:
//!
//! 1. the times of the rows that match: the tenant column (only of the
//!    pages of the tenant), then the filter columns of the rows left, then
//!    the time column of the rows left. A filter that matches nothing ends
//!    here, having read a few pages of two columns.
//! 2. every column of the newest rows the page still needs (the window from
//!    the time of the last of them up to the cursor), exactly bounded by
//!    the keyset.
//!
//! A request stops when the page is full, when the archived days end, or
//! when it has read [`ColdLimits::days_per_request`] days or would pass
//! [`ColdLimits::bytes_per_request`] bytes with the next day. It then
//! answers [`ListPage::resume`]: every matching row at or after it was
//! examined, and the next request continues below it (the same keyset
//! cursor as hot listings, with a nil id at a day's or a window's start).
//! A first day that alone would pass the bytes is read in a part of its
//! time that fits, and the cursor lands inside the day.
//!
//! [`ColdLimits::days_per_request`]: super::ColdLimits::days_per_request
//! [`ColdLimits::bytes_per_request`]: super::ColdLimits::bytes_per_request

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMicrosecondType;
use chrono::Duration;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;
use uuid::Uuid;
use walhook_pipeline::ids::TenantId;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::deliveries::{DeliveryFilter, DeliveryRecord};

use super::predicate::{Keyset, Pred};
use super::prune::{Cond, Selection};
use super::reader::Spend;
use super::{ColdHistory, Read, Slot, day_of, day_start, instant, micros, rows, tenant_files};
use crate::ArchiveError;
use crate::manifest::FileEntry;
use crate::table::Table;

/// The id below every id: a keyset at a time's start.
const NIL: [u8; 16] = [0; 16];

/// One page of archived deliveries and what reading it took.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Matching archived deliveries, newest first: the newest `limit` (or
    /// more) when the page is full, else every one at or after
    /// [`ListPage::resume`].
    pub rows: Vec<DeliveryRecord>,
    /// Where the next request continues when this one stopped before the
    /// page was full and before the archived days ended (its budget ran
    /// out): every matching archived delivery at or after this position
    /// was examined; those below it were not.
    pub resume: Option<(SystemTime, Uuid)>,
    /// Bytes read from the store (manifests, footers, pages; not what
    /// came from the cache).
    pub bytes: u64,
    /// GETs sent to the store.
    pub reads: u64,
    /// Archived days examined.
    pub days: usize,
}

/// The columns of an archived delivery.
const DELIVERY_COLUMNS: &[&str] = &[
    "id",
    "event_id",
    "endpoint_id",
    "tenant_id",
    "event_type",
    "event_occurred_at",
    "endpoint_config_version",
    "status",
    "attempt_count",
    "manual_attempt_count",
    "next_attempt_at",
    "expires_at",
    "last_http_status",
    "last_error_class",
    "created_at",
    "updated_at",
];

/// One part of a day with its footer.
struct Part<'a> {
    file: &'a FileEntry,
    meta: ArrowReaderMetadata,
}

impl<S: ObjectStore> ColdHistory<S> {
    /// Archived deliveries of the filter's tenant that match it, newest
    /// first, at least `filter.limit` of them unless the budget or the
    /// days ran out first (then [`ListPage::resume`] says where to go on),
    /// and only those at or above `floor` (the last row a caller already
    /// has from elsewhere: nothing below it is needed).
    ///
    /// Reads nothing, and takes no read slot, when no archived day lies in
    /// the window; uses `held` when the caller took the tenant's slot
    /// already ([`ColdHistory::hold`]).
    pub async fn list_deliveries(
        &self,
        filter: &DeliveryFilter,
        floor: Option<(SystemTime, Uuid)>,
        held: Option<&Slot>,
    ) -> Result<ListPage, ArchiveError> {
        let need = filter.limit.max(0) as usize;
        let key = |(t, id): (SystemTime, Uuid)| (micros(t), *id.as_bytes());
        let upper = [
            filter.before.map(key),
            filter.until.map(|u| (micros(u), NIL)),
        ]
        .into_iter()
        .flatten()
        .min();
        let lower = [filter.since.map(|s| (micros(s), NIL)), floor.map(key)]
            .into_iter()
            .flatten()
            .max();
        if need == 0 || upper.is_some_and(|u| lower.is_some_and(|l| u <= l)) {
            return Ok(ListPage::default());
        }
        // The last day the window reaches (a nil id at a day's start
        // excludes that day), and the first.
        let top = upper.map(|u| day_of(last_time(u)));
        let bottom = lower.map(|(t, _)| day_of(t));
        if bottom.is_some_and(|b| top.is_some_and(|t| b > t)) {
            return Ok(ListPage::default());
        }
        let budget_days = self.limits.days_per_request.max(1);
        let days = self
            .days(Table::Deliveries, bottom, top, Some(budget_days + 1))
            .await?;
        if days.is_empty() {
            return Ok(ListPage::default());
        }
        let _slot = self.slot(&filter.tenant, held)?;
        let spend = Spend::unlimited();
        let mut page = ListPage::default();
        let mut rows: Vec<DeliveryRecord> = Vec::new();
        let mut stopped = false;
        for (i, day) in days.iter().take(budget_days).enumerate() {
            let next_day = day.day + Duration::days(1);
            let hi = upper.map_or((day_start(next_day), NIL), |u| {
                u.min((day_start(next_day), NIL))
            });
            let lo = lower.map_or((day_start(day.day), NIL), |l| {
                l.max((day_start(day.day), NIL))
            });
            let mut parts = Vec::new();
            for m in self.manifests(day, &spend).await? {
                for file in tenant_files(&m, &filter.tenant) {
                    if file.time_range.0 <= hi.0 && file.time_range.1 >= lo.0 {
                        let meta = self.footer(file, &spend).await?;
                        parts.push((file.clone(), meta));
                    }
                }
            }
            let parts: Vec<Part<'_>> = parts
                .iter()
                .map(|(file, meta)| Part {
                    file,
                    meta: meta.clone(),
                })
                .collect();
            let mut from = lo;
            if !parts.is_empty() {
                // The first pass must leave room for the second to read at
                // least one row whole.
                let left = self
                    .limits
                    .bytes_per_request
                    .saturating_sub(spend.bytes())
                    .saturating_sub(reserve(&parts, &filter.tenant, lo.0, last_time(hi)));
                let first = first_pass_columns(filter);
                if plan(&parts, &filter.tenant, lo.0, last_time(hi), &first) > left {
                    if i > 0 {
                        // The days read so far stand; this one is next.
                        page.resume = Some(at(hi));
                        stopped = true;
                        break;
                    }
                    let start = narrowest(&parts, &filter.tenant, lo.0, hi, left, &first);
                    from = (start, NIL).max(lo);
                }
                let (found, examined) = self
                    .read_window(
                        &parts,
                        filter,
                        from,
                        hi,
                        need.saturating_sub(rows.len()),
                        &spend,
                    )
                    .await?;
                rows.extend(found);
                from = examined;
            }
            page.days += 1;
            if rows.len() >= need {
                stopped = true;
                break;
            }
            if from > lo {
                // Only part of the day fit: the rest is the next request's.
                page.resume = Some(at(from));
                stopped = true;
                break;
            }
        }
        if !stopped && days.len() > budget_days {
            // More archived days lie below: the next request starts there.
            let last = days[budget_days - 1].day;
            page.resume = Some(at((day_start(last), NIL)));
        }
        rows.sort_by_key(|r| std::cmp::Reverse(keyset(r)));
        page.rows = rows;
        page.bytes = spend.bytes();
        page.reads = spend.reads();
        tracing::debug!(
            tenant = %filter.tenant,
            days = page.days,
            bytes = page.bytes,
            reads = page.reads,
            rows = page.rows.len(),
            resumes = page.resume.is_some(),
            "archived deliveries listed"
        );
        Ok(page)
    }

    /// The matching rows of `parts` in `[lo, hi)`, the newest `need` (or
    /// more) of them, and the lowest position examined (`lo`, or higher
    /// when only the newest part of the window was read).
    async fn read_window(
        &self,
        parts: &[Part<'_>],
        filter: &DeliveryFilter,
        lo: Keyset,
        hi: Keyset,
        need: usize,
        spend: &Arc<Spend>,
    ) -> Result<(Vec<DeliveryRecord>, Keyset), ArchiveError> {
        let tenant = filter.tenant.as_str();
        // The last time in the window (a nil id at `hi` leaves its time out).
        let top = last_time(hi);
        // Pass 1: the times of the matching rows.
        let mut times: Vec<i64> = Vec::new();
        for p in parts {
            let selection = select(p, tenant, lo.0, top);
            let mut preds = vec![Pred::TextEq {
                column: "tenant_id",
                value: tenant.to_owned(),
            }];
            preds.extend(filter_preds(filter));
            preds.push(Pred::Between {
                column: "created_at",
                lo: lo.0,
                hi: top,
            });
            for batch in self
                .read(
                    Read {
                        table: Table::Deliveries,
                        file: p.file,
                        meta: p.meta.clone(),
                        selection: &selection,
                        preds,
                        output: &["created_at"],
                    },
                    spend,
                )
                .await?
            {
                let t = batch
                    .column(0)
                    .as_primitive_opt::<TimestampMicrosecondType>()
                    .ok_or_else(|| rows::shape("created_at"))?;
                times.extend(t.values().iter().copied());
            }
        }
        if times.is_empty() {
            return Ok((Vec::new(), lo));
        }
        times.sort_unstable_by(|a, b| b.cmp(a));
        // Rows at the cursor's own time may lie at or after it: count them
        // as extra, so that the window surely holds `need` rows. Every
        // `(time, nil)` below is before `hi`, so the window is never empty
        // and paging always moves on.
        let k = need + times.iter().filter(|t| **t == hi.0).count();
        let mut from = match times.get(k.saturating_sub(1)) {
            Some(t) if times.len() > k => lo.max((*t, NIL)),
            _ => lo,
        };
        // Every column of those rows must fit in what is left of the
        // budget; if not, fewer of the newest rows, and the cursor lands
        // among the day's rows.
        let left = self.limits.bytes_per_request.saturating_sub(spend.bytes());
        let all: Vec<usize> = (0..Table::Deliveries.columns().len()).collect();
        // No match lies after the newest one pass 1 found.
        let newest = times[0];
        let cost = |t: i64| plan(parts, &filter.tenant, t, newest, &all);
        if cost(from.0) > left {
            let last = k.min(times.len()) - 1;
            // The cost grows with the rows taken: the most that fit.
            let (mut a, mut b) = (0, last);
            while a < b {
                let mid = (a + b).div_ceil(2);
                if cost(times[mid]) <= left {
                    a = mid;
                } else {
                    b = mid - 1;
                }
            }
            from = lo.max((times[a], NIL));
        }
        // Pass 2: every column of the rows in [from, hi); a later
        // generation's row replaces an earlier one's.
        let mut found: HashMap<[u8; 16], DeliveryRecord> = HashMap::new();
        for p in parts {
            let selection = select(p, tenant, from.0, newest);
            let mut preds = vec![Pred::TextEq {
                column: "tenant_id",
                value: tenant.to_owned(),
            }];
            preds.extend(filter_preds(filter));
            preds.push(Pred::Keyset {
                time: "created_at",
                lo: Some(from),
                hi: Some(hi),
            });
            for batch in self
                .read(
                    Read {
                        table: Table::Deliveries,
                        file: p.file,
                        meta: p.meta.clone(),
                        selection: &selection,
                        preds,
                        output: DELIVERY_COLUMNS,
                    },
                    spend,
                )
                .await?
            {
                for r in rows::deliveries(&batch)? {
                    found.insert(r.id.0, r);
                }
            }
        }
        Ok((found.into_values().collect(), from))
    }
}

/// The filter's conditions beyond the tenant and the time.
fn filter_preds(f: &DeliveryFilter) -> Vec<Pred> {
    let mut preds = Vec::new();
    if let Some(e) = f.endpoint {
        preds.push(Pred::UuidEq {
            column: "endpoint_id",
            value: e.0,
        });
    }
    if let Some(t) = &f.event_type {
        preds.push(Pred::TextEq {
            column: "event_type",
            value: t.clone(),
        });
    }
    if let Some(s) = f.status {
        preds.push(Pred::TextEq {
            column: "status",
            value: s.as_str().to_owned(),
        });
    }
    preds
}

/// The rows of part `p` that statistics admit for `tenant` in `lo..=hi`.
fn select(p: &Part<'_>, tenant: &str, lo: i64, hi: i64) -> Selection {
    let table = Table::Deliveries;
    Selection::new(
        p.meta.metadata(),
        &[
            Cond::BytesEq {
                column: table.column_index("tenant_id").expect("a tenant column"),
                value: tenant.as_bytes(),
            },
            Cond::Between {
                column: table.column_index("created_at").expect("a time column"),
                lo,
                hi,
            },
        ],
    )
}

/// The columns the first pass reads: the tenant, the filters', the time.
fn first_pass_columns(f: &DeliveryFilter) -> Vec<usize> {
    let table = Table::Deliveries;
    let mut names = vec!["tenant_id", "created_at"];
    if f.endpoint.is_some() {
        names.push("endpoint_id");
    }
    if f.event_type.is_some() {
        names.push("event_type");
    }
    if f.status.is_some() {
        names.push("status");
    }
    names
        .into_iter()
        .filter_map(|n| table.column_index(n))
        .collect()
}

/// What reading `columns` of the rows of `parts` in `[lo, hi]` that
/// statistics admit may cost at most: every page that holds one of them.
fn plan(parts: &[Part<'_>], tenant: &TenantId, lo: i64, hi: i64, columns: &[usize]) -> u64 {
    parts
        .iter()
        .map(|p| select(p, tenant.as_str(), lo, hi).bytes(p.meta.metadata(), columns))
        .sum()
}

/// What reading one row of `parts` in `[lo, hi]` whole may cost at most:
/// the largest page of every column (twice, for a time whose rows straddle
/// two pages), in the part where that is most.
fn reserve(parts: &[Part<'_>], tenant: &TenantId, lo: i64, hi: i64) -> u64 {
    let all: Vec<usize> = (0..Table::Deliveries.columns().len()).collect();
    parts
        .iter()
        .map(|p| 2 * select(p, tenant.as_str(), lo, hi).row_bytes(p.meta.metadata(), &all))
        .max()
        .unwrap_or(0)
}

/// The earliest time from which reading `columns` up to `hi` costs at most
/// `left` (or `hi`'s own time, when even that costs more: a request always
/// reads something).
fn narrowest(
    parts: &[Part<'_>],
    tenant: &TenantId,
    lo: i64,
    hi: Keyset,
    left: u64,
    columns: &[usize],
) -> i64 {
    let top = last_time(hi);
    let (mut a, mut b) = (lo, top);
    // The cost only falls as the start rises: the lowest start that fits.
    while a < b {
        let mid = a + (b - a) / 2;
        if plan(parts, tenant, mid, top, columns) <= left {
            b = mid;
        } else {
            a = mid + 1;
        }
    }
    if plan(parts, tenant, a, top, columns) > left {
        tracing::debug!(
            budget = left,
            "one instant's rows cost more than the bytes left; read anyway so that paging goes on"
        );
    }
    a
}

/// The last microsecond a window ending (exclusive) at `hi` holds rows of.
fn last_time(hi: Keyset) -> i64 {
    if hi.1 == NIL { hi.0 - 1 } else { hi.0 }
}

fn keyset(r: &DeliveryRecord) -> (SystemTime, Uuid) {
    (r.created_at, Uuid::from_bytes(r.id.0))
}

/// A keyset as the API's cursor holds it.
fn at(k: Keyset) -> (SystemTime, Uuid) {
    (instant(k.0), Uuid::from_bytes(k.1))
}
