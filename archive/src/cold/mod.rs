//! Cold reads: archived deliveries, their attempts and events, by id and
//! by listing, with the same ids and bytes they had in the hot tables; and
//! the restore that lets an archived delivery be replayed.
//!
//! A read fetches only what can hold the row: the catalog names the
//! archived days, each day's manifest (cached; manifests never change once
//! verified) names the parts, and of those only the tenant's bucket, and of
//! those only parts whose tenant and id ranges admit the row.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, RecordBatch};
use chrono::NaiveDate;
use uuid::Uuid;
use walhook_pipeline::delivery::DeliveryStatus;
use walhook_pipeline::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;
use walhook_sql::deliveries::{AttemptRow, DeliveryFilter, DeliveryRecord, EventRecord};

use crate::ArchiveError;
use crate::dates::NaiveDateSql;
use crate::encode::decode;
use crate::layout::bucket_of;
use crate::manifest::Manifest;
use crate::table::Table;

/// The default replay window for archived deliveries.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(30 * 86_400);

/// What [`ColdHistory::restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The delivery and its event are hot again (or already were).
    Restored,
    /// No archived delivery of the tenant has this id.
    NotFound,
    /// The event is older than the replay window.
    OutsideWindow {
        /// When the event occurred.
        occurred_at: SystemTime,
        /// The window.
        window: Duration,
    },
}

/// Reads archived history from the store the archive wrote.
pub struct ColdHistory<S: ObjectStore> {
    platform: Platform,
    store: S,
    replay_window: Duration,
    manifests: parking_lot::Mutex<HashMap<String, Arc<Manifest>>>,
}

impl<S: ObjectStore> std::fmt::Debug for ColdHistory<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdHistory")
            .field("store", &self.store.describe())
            .field("replay_window", &self.replay_window)
            .finish()
    }
}

/// One archived day of one table: its manifests, oldest generation first.
struct Day {
    day: NaiveDate,
    manifests: Vec<Arc<Manifest>>,
}

impl<S: ObjectStore> ColdHistory<S> {
    /// Cold history of `platform`'s archive in `store`.
    pub fn new(platform: Platform, store: S, replay_window: Duration) -> Self {
        ColdHistory {
            platform,
            store,
            replay_window,
            manifests: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The archived days of `table`, newest first; only days at least
    /// verified (a `written` day may still be rewritten).
    async fn days(&self, table: Table) -> Result<Vec<Day>, ArchiveError> {
        let client = self.platform.client().await?;
        let rows = client
            .query(
                "SELECT day, manifest_key FROM walhook.archive_partitions \
                 WHERE table_name = $1 AND state IN ('verified', 'dropped') ORDER BY day DESC, generation",
                &[&table.name()],
            )
            .await
            .map_err(ArchiveError::query("read the archive catalog"))?;
        let mut days: Vec<Day> = Vec::new();
        for r in rows {
            let day = r.get::<_, NaiveDateSql>(0).0;
            let manifest = self.manifest(r.get(1)).await?;
            match days.last_mut() {
                Some(d) if d.day == day => d.manifests.push(manifest),
                _ => days.push(Day {
                    day,
                    manifests: vec![manifest],
                }),
            }
        }
        Ok(days)
    }

    async fn manifest(&self, key: &str) -> Result<Arc<Manifest>, ArchiveError> {
        if let Some(m) = self.manifests.lock().get(key) {
            return Ok(m.clone());
        }
        let bytes = self.store.get(key).await?.ok_or_else(|| missing(key))?;
        let m = Arc::new(
            Manifest::from_bytes(&bytes).map_err(|e| ArchiveError::Shape {
                table: Table::Deliveries,
                column: "manifest",
                detail: format!("{key} does not parse: {e}"),
            })?,
        );
        self.manifests.lock().insert(key.to_string(), m.clone());
        Ok(m)
    }

    /// The rows of `tenant` in `manifest`'s parts that may hold `id` (any
    /// id when `None`).
    async fn tenant_rows(
        &self,
        manifest: &Manifest,
        tenant: &TenantId,
        id: Option<&str>,
    ) -> Result<Vec<RecordBatch>, ArchiveError> {
        let bucket = bucket_of(tenant.as_str(), manifest.tenant_buckets);
        let t = tenant.as_str();
        let mut out = Vec::new();
        for f in &manifest.files {
            let admits_tenant = f.tenants.contains_key(t);
            let admits_id =
                id.is_none_or(|id| f.id_range.0.as_str() <= id && id <= f.id_range.1.as_str());
            if f.tenant_bucket != bucket || !admits_tenant || !admits_id {
                continue;
            }
            let bytes = self
                .store
                .get(&f.key)
                .await?
                .ok_or_else(|| missing(&f.key))?;
            for batch in decode(bytes)? {
                let tenants = batch
                    .column_by_name("tenant_id")
                    .map(|c| c.as_string::<i32>().clone())
                    .ok_or_else(|| shape("tenant_id"))?;
                let keep: arrow_array::BooleanArray =
                    tenants.iter().map(|v| Some(v == Some(t))).collect();
                let filtered = arrow_select_filter(&batch, &keep)?;
                if filtered.num_rows() > 0 {
                    out.push(filtered);
                }
            }
        }
        Ok(out)
    }

    /// Archived delivery `id` of `tenant`, in its latest generation.
    pub async fn delivery(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Option<DeliveryRecord>, ArchiveError> {
        let key = Uuid::from_bytes(id.0).to_string();
        let mut found = None;
        for day in self.days(Table::Deliveries).await? {
            for m in &day.manifests {
                if !m.may_hold(&key) {
                    continue;
                }
                for batch in self.tenant_rows(m, tenant, Some(&key)).await? {
                    for r in deliveries(&batch)? {
                        if r.id == id {
                            found = Some(r);
                        }
                    }
                }
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(found)
    }

    /// Archived deliveries of the filter's tenant that match it, newest
    /// first by `(created_at, id)`, at most `filter.limit`.
    pub async fn list_deliveries(
        &self,
        filter: &DeliveryFilter,
    ) -> Result<Vec<DeliveryRecord>, ArchiveError> {
        let mut out: Vec<DeliveryRecord> = Vec::new();
        for day in self.days(Table::Deliveries).await? {
            let (from, to) = crate::dates::bounds(day.day);
            if filter.since.is_some_and(|s| s >= to) || filter.until.is_some_and(|u| u < from) {
                continue;
            }
            if let Some((before, _)) = filter.before
                && before < from
            {
                continue;
            }
            let mut rows: HashMap<DeliveryId, DeliveryRecord> = HashMap::new();
            for m in &day.manifests {
                for batch in self.tenant_rows(m, &filter.tenant, None).await? {
                    for r in deliveries(&batch)? {
                        if matches(filter, &r) {
                            rows.insert(r.id, r);
                        }
                    }
                }
            }
            let mut rows: Vec<DeliveryRecord> = rows.into_values().collect();
            rows.sort_by(|a, b| {
                (b.created_at, Uuid::from_bytes(b.id.0))
                    .cmp(&(a.created_at, Uuid::from_bytes(a.id.0)))
            });
            out.extend(rows);
            if out.len() as i64 >= filter.limit {
                break;
            }
        }
        out.truncate(filter.limit.max(0) as usize);
        Ok(out)
    }

    /// The archived event of `delivery`.
    pub async fn event(
        &self,
        tenant: &TenantId,
        delivery: &DeliveryRecord,
    ) -> Result<Option<ColdEvent>, ArchiveError> {
        let day = date_of(delivery.event_occurred_at);
        let key = Uuid::from_bytes(delivery.event_id.0).to_string();
        for d in self.days(Table::Events).await? {
            if d.day != day {
                continue;
            }
            for m in &d.manifests {
                for batch in self.tenant_rows(m, tenant, Some(&key)).await? {
                    if let Some(e) = events(&batch)?
                        .into_iter()
                        .find(|e| e.record.id == delivery.event_id)
                    {
                        return Ok(Some(e));
                    }
                }
            }
        }
        Ok(None)
    }

    /// The archived attempts of `delivery`, in the order they started.
    pub async fn attempts(
        &self,
        tenant: &TenantId,
        delivery: &DeliveryRecord,
    ) -> Result<Vec<AttemptRow>, ArchiveError> {
        let first = date_of(delivery.created_at);
        let last = date_of(delivery.updated_at.max(delivery.created_at));
        let mut out = Vec::new();
        for d in self.days(Table::Attempts).await? {
            if d.day < first || d.day > last {
                continue;
            }
            for m in &d.manifests {
                for batch in self.tenant_rows(m, tenant, None).await? {
                    out.extend(attempts(&batch, delivery.id)?);
                }
            }
        }
        out.sort_by_key(|a| (a.started_at, a.number));
        out.dedup_by_key(|a| a.id);
        Ok(out)
    }

    /// Makes archived delivery `id` of `tenant` and its event hot again, so
    /// that a replay can send it: the same ids and bytes, the delivery's
    /// last state. A later archive round writes them as a new generation
    /// of their days.
    pub async fn restore(
        &self,
        tenant: &TenantId,
        id: DeliveryId,
    ) -> Result<Restore, ArchiveError> {
        let Some(delivery) = self.delivery(tenant, id).await? else {
            return Ok(Restore::NotFound);
        };
        let age = SystemTime::now()
            .duration_since(delivery.event_occurred_at)
            .unwrap_or_default();
        if age > self.replay_window {
            return Ok(Restore::OutsideWindow {
                occurred_at: delivery.event_occurred_at,
                window: self.replay_window,
            });
        }
        let Some(event) = self.event(tenant, &delivery).await? else {
            return Ok(Restore::NotFound);
        };
        let mut client = self.platform.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(ArchiveError::query("start a restore"))?;
        let e = &event.record;
        tx.execute(
            "SELECT walhook.ensure_day_partition('events', ($1::timestamptz AT TIME ZONE 'UTC')::date)",
            &[&e.occurred_at],
        )
        .await
        .map_err(ArchiveError::query("make the event's day partition"))?;
        tx.execute(
            "INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version, \
             occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, ('0/0'::pg_lsn + $9::text::numeric), $10, $11, $12, $13) \
             ON CONFLICT DO NOTHING",
            &[
                &Uuid::from_bytes(e.id.0),
                &tenant.as_str(),
                &e.event_type,
                &e.schema_version,
                &e.object_id,
                &e.object_version,
                &e.occurred_at,
                &e.source,
                &event.commit_lsn.to_string(),
                &event.tx_ordinal,
                &e.payload,
                &e.payload_sha256,
                &event.created_at,
            ],
        )
        .await
        .map_err(ArchiveError::query("restore an archived event"))?;
        let d = &delivery;
        tx.execute(
            "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at, \
             endpoint_config_version, status, attempt_count, manual_attempt_count, next_attempt_at, expires_at, \
             last_http_status, last_error_class, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::walhook.delivery_status, $9, $10, $11, $12, $13, $14, $15, $16) \
             ON CONFLICT (id) DO NOTHING",
            &[
                &Uuid::from_bytes(d.id.0),
                &Uuid::from_bytes(d.event_id.0),
                &Uuid::from_bytes(d.endpoint_id.0),
                &tenant.as_str(),
                &d.event_type,
                &d.event_occurred_at,
                &d.endpoint_config_version,
                &d.status.as_str(),
                &d.attempt_count,
                &d.manual_attempt_count,
                &d.next_attempt_at,
                &d.expires_at,
                &d.last_http_status,
                &d.last_error_class,
                &d.created_at,
                &d.updated_at,
            ],
        )
        .await
        .map_err(ArchiveError::query("restore an archived delivery"))?;
        walhook_sql::commit!(tx, client).map_err(ArchiveError::query("commit a restore"))?;
        tracing::info!(delivery_id = %id, tenant = %tenant, "archived delivery restored for a replay");
        Ok(Restore::Restored)
    }
}

/// An archived event with the columns a restore needs beyond the API's.
#[derive(Debug, Clone)]
pub struct ColdEvent {
    /// What the API shows.
    pub record: EventRecord,
    /// The source commit's LSN.
    pub commit_lsn: u64,
    /// Its place in the transaction.
    pub tx_ordinal: i32,
    /// When it was stored.
    pub created_at: SystemTime,
}

fn missing(key: &str) -> ArchiveError {
    ArchiveError::Shape {
        table: Table::Deliveries,
        column: "object",
        detail: format!("{key} is named by the catalog or a manifest but missing from the store"),
    }
}

fn shape(column: &'static str) -> ArchiveError {
    ArchiveError::Shape {
        table: Table::Deliveries,
        column,
        detail: "the archived part lacks this column or has another type".into(),
    }
}

fn date_of(t: SystemTime) -> NaiveDate {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.date_naive())
        .unwrap_or_default()
}

fn matches(f: &DeliveryFilter, r: &DeliveryRecord) -> bool {
    f.endpoint.is_none_or(|e| e == r.endpoint_id)
        && f.event_type.as_ref().is_none_or(|t| *t == r.event_type)
        && f.status.is_none_or(|s| s == r.status)
        && f.since.is_none_or(|s| r.created_at >= s)
        && f.until.is_none_or(|u| r.created_at < u)
        && f.before
            .is_none_or(|(at, id)| (r.created_at, Uuid::from_bytes(r.id.0)) < (at, id))
}

fn arrow_select_filter(
    batch: &RecordBatch,
    keep: &arrow_array::BooleanArray,
) -> Result<RecordBatch, ArchiveError> {
    let columns = batch
        .columns()
        .iter()
        .map(|c| arrow_select::filter::filter(c.as_ref(), keep))
        .collect::<Result<Vec<_>, _>>()
        .map_err(ArchiveError::Arrow)?;
    RecordBatch::try_new(batch.schema(), columns).map_err(ArchiveError::Arrow)
}

/// Column accessors over one batch, by name.
struct Cols<'a>(&'a RecordBatch);

impl<'a> Cols<'a> {
    fn col(&self, name: &'static str) -> Result<&'a dyn Array, ArchiveError> {
        self.0
            .column_by_name(name)
            .map(|c| c.as_ref())
            .ok_or_else(|| shape(name))
    }
    fn id16(&self, name: &'static str, i: usize) -> Result<[u8; 16], ArchiveError> {
        let a = self
            .col(name)?
            .as_fixed_size_binary_opt()
            .ok_or_else(|| shape(name))?;
        a.value(i).try_into().map_err(|_| shape(name))
    }
    fn text(&self, name: &'static str, i: usize) -> Result<Option<String>, ArchiveError> {
        let a = self
            .col(name)?
            .as_string_opt::<i32>()
            .ok_or_else(|| shape(name))?;
        Ok(a.is_valid(i).then(|| a.value(i).to_string()))
    }
    /// A comma-separated list of integers; `None` when the value is null or
    /// the file predates the column (layout 1).
    fn int_list(&self, name: &'static str, i: usize) -> Result<Option<Vec<i32>>, ArchiveError> {
        if self.0.column_by_name(name).is_none() {
            return Ok(None);
        }
        let Some(text) = self.text(name, i)? else {
            return Ok(None);
        };
        text.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().map_err(|_| shape(name)))
            .collect::<Result<Vec<i32>, _>>()
            .map(Some)
    }
    fn int(&self, name: &'static str, i: usize) -> Result<Option<i32>, ArchiveError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<Int32Type>()
            .ok_or_else(|| shape(name))?;
        Ok(a.is_valid(i).then(|| a.value(i)))
    }
    fn int64(&self, name: &'static str, i: usize) -> Result<i64, ArchiveError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<Int64Type>()
            .ok_or_else(|| shape(name))?;
        Ok(a.value(i))
    }
    fn time(&self, name: &'static str, i: usize) -> Result<SystemTime, ArchiveError> {
        let a = self
            .col(name)?
            .as_primitive_opt::<TimestampMicrosecondType>()
            .ok_or_else(|| shape(name))?;
        let us = a.value(i);
        Ok(if us >= 0 {
            UNIX_EPOCH + Duration::from_micros(us as u64)
        } else {
            UNIX_EPOCH - Duration::from_micros(us.unsigned_abs())
        })
    }
    fn bytes(&self, name: &'static str, i: usize) -> Result<Option<Vec<u8>>, ArchiveError> {
        let c = self.col(name)?;
        if let Some(a) = c.as_binary_opt::<i32>() {
            return Ok(a.is_valid(i).then(|| a.value(i).to_vec()));
        }
        let a = c.as_fixed_size_binary_opt().ok_or_else(|| shape(name))?;
        Ok(a.is_valid(i).then(|| a.value(i).to_vec()))
    }
}

fn deliveries(batch: &RecordBatch) -> Result<Vec<DeliveryRecord>, ArchiveError> {
    let c = Cols(batch);
    (0..batch.num_rows())
        .map(|i| {
            Ok(DeliveryRecord {
                id: DeliveryId(c.id16("id", i)?),
                event_id: EventId(c.id16("event_id", i)?),
                endpoint_id: EndpointId(c.id16("endpoint_id", i)?),
                event_type: c.text("event_type", i)?.unwrap_or_default(),
                status: c
                    .text("status", i)?
                    .as_deref()
                    .and_then(DeliveryStatus::parse)
                    .ok_or_else(|| shape("status"))?,
                attempt_count: c.int("attempt_count", i)?.unwrap_or(0),
                manual_attempt_count: c.int("manual_attempt_count", i)?.unwrap_or(0),
                next_attempt_at: c.time("next_attempt_at", i)?,
                expires_at: c.time("expires_at", i)?,
                last_http_status: c.int("last_http_status", i)?,
                last_error_class: c.text("last_error_class", i)?,
                endpoint_config_version: c.int("endpoint_config_version", i)?.unwrap_or(1),
                event_occurred_at: c.time("event_occurred_at", i)?,
                created_at: c.time("created_at", i)?,
                updated_at: c.time("updated_at", i)?,
            })
        })
        .collect()
}

fn events(batch: &RecordBatch) -> Result<Vec<ColdEvent>, ArchiveError> {
    let c = Cols(batch);
    (0..batch.num_rows())
        .map(|i| {
            Ok(ColdEvent {
                record: EventRecord {
                    id: EventId(c.id16("id", i)?),
                    event_type: c.text("event_type", i)?.unwrap_or_default(),
                    schema_version: c.int("schema_version", i)?.unwrap_or(1),
                    object_id: c.text("object_id", i)?,
                    object_version: c.text("object_version", i)?,
                    occurred_at: c.time("occurred_at", i)?,
                    source: c.text("source", i)?.unwrap_or_default(),
                    payload: c.bytes("payload", i)?.unwrap_or_default(),
                    payload_sha256: c.bytes("payload_sha256", i)?.unwrap_or_default(),
                },
                commit_lsn: c.int64("commit_lsn", i)? as u64,
                tx_ordinal: c.int("tx_ordinal", i)?.unwrap_or(0),
                created_at: c.time("created_at", i)?,
            })
        })
        .collect()
}

fn attempts(batch: &RecordBatch, delivery: DeliveryId) -> Result<Vec<AttemptRow>, ArchiveError> {
    let c = Cols(batch);
    let mut out = Vec::new();
    for i in 0..batch.num_rows() {
        if c.id16("delivery_id", i)? != delivery.0 {
            continue;
        }
        out.push(AttemptRow {
            id: AttemptId(c.id16("id", i)?),
            number: c.int("number", i)?.unwrap_or(0),
            trigger: c.text("trigger", i)?.unwrap_or_default(),
            endpoint_config_version: c.int("endpoint_config_version", i)?.unwrap_or(1),
            started_at: c.time("started_at", i)?,
            finished_at: c.time("finished_at", i)?,
            http_status: c.int("http_status", i)?,
            latency_ms: c.int("latency_ms", i)?.unwrap_or(0),
            outcome: c.text("outcome", i)?.unwrap_or_default(),
            error_class: c.text("error_class", i)?,
            response_sha256: c.bytes("response_sha256", i)?,
            response_excerpt: c.text("response_excerpt", i)?,
            secret_versions: c.int_list("secret_versions", i)?,
            note: c.text("note", i)?,
        });
    }
    Ok(out)
}
