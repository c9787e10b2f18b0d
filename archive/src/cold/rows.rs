//! Archived rows as the API's records: column accessors by name over
//! record batches, and the decoding of deliveries, events and attempts.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{Array, FixedSizeBinaryArray, RecordBatch};
use walhook_pipeline::ids::{AttemptId, DeliveryId, EndpointId, EventId};
use walhook_sql::deliveries::{AttemptRow, DeliveryRecord, EventRecord};

use super::ColdEvent;
use crate::ArchiveError;
use crate::table::Table;

pub(crate) fn shape(column: &'static str) -> ArchiveError {
    ArchiveError::Shape {
        table: Table::Deliveries,
        column,
        detail: "the archived part lacks this column or has another type".into(),
    }
}

/// The uuid column `name` of `batch`.
pub(crate) fn uuid_column<'a>(
    batch: &'a RecordBatch,
    name: &'static str,
) -> Result<&'a FixedSizeBinaryArray, ArchiveError> {
    batch
        .column_by_name(name)
        .and_then(|c| c.as_fixed_size_binary_opt())
        .ok_or_else(|| shape(name))
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
    /// A text column holding one of a stored enum's names (see
    /// `walhook_pipeline::stored`): a value this version does not know is
    /// a shape error naming it, never a default.
    fn named<T>(
        &self,
        table: Table,
        name: &'static str,
        i: usize,
    ) -> Result<Option<T>, ArchiveError>
    where
        T: for<'t> TryFrom<&'t str, Error = walhook_pipeline::stored::UnknownName>,
    {
        self.text(name, i)?
            .map(|v| {
                T::try_from(v.as_str()).map_err(|e| ArchiveError::Shape {
                    table,
                    column: name,
                    detail: e.to_string(),
                })
            })
            .transpose()
    }
    /// [`Cols::named`] for a column that may not be null.
    fn named_required<T>(
        &self,
        table: Table,
        name: &'static str,
        i: usize,
    ) -> Result<T, ArchiveError>
    where
        T: for<'t> TryFrom<&'t str, Error = walhook_pipeline::stored::UnknownName>,
    {
        self.named(table, name, i)?
            .ok_or_else(|| ArchiveError::Shape {
                table,
                column: name,
                detail: "the value is null in an archived row".into(),
            })
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

pub(crate) fn deliveries(batch: &RecordBatch) -> Result<Vec<DeliveryRecord>, ArchiveError> {
    let c = Cols(batch);
    (0..batch.num_rows())
        .map(|i| {
            Ok(DeliveryRecord {
                id: DeliveryId(c.id16("id", i)?),
                event_id: EventId(c.id16("event_id", i)?),
                endpoint_id: EndpointId(c.id16("endpoint_id", i)?),
                event_type: c.text("event_type", i)?.unwrap_or_default(),
                status: c.named_required(Table::Deliveries, "status", i)?,
                attempt_count: c.int("attempt_count", i)?.unwrap_or(0),
                manual_attempt_count: c.int("manual_attempt_count", i)?.unwrap_or(0),
                next_attempt_at: c.time("next_attempt_at", i)?,
                expires_at: c.time("expires_at", i)?,
                last_http_status: c.int("last_http_status", i)?,
                last_error_class: c.named(Table::Deliveries, "last_error_class", i)?,
                endpoint_config_version: c.int("endpoint_config_version", i)?.unwrap_or(1),
                event_occurred_at: c.time("event_occurred_at", i)?,
                created_at: c.time("created_at", i)?,
                updated_at: c.time("updated_at", i)?,
            })
        })
        .collect()
}

pub(crate) fn events(batch: &RecordBatch) -> Result<Vec<ColdEvent>, ArchiveError> {
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

pub(crate) fn attempts(
    batch: &RecordBatch,
    delivery: DeliveryId,
) -> Result<Vec<AttemptRow>, ArchiveError> {
    let c = Cols(batch);
    let mut out = Vec::new();
    for i in 0..batch.num_rows() {
        if c.id16("delivery_id", i)? != delivery.0 {
            continue;
        }
        out.push(AttemptRow {
            id: AttemptId(c.id16("id", i)?),
            number: c.int("number", i)?.unwrap_or(0),
            trigger: c.named_required(Table::Attempts, "trigger", i)?,
            endpoint_config_version: c.int("endpoint_config_version", i)?.unwrap_or(1),
            started_at: c.time("started_at", i)?,
            finished_at: c.time("finished_at", i)?,
            http_status: c.int("http_status", i)?,
            latency_ms: c.int("latency_ms", i)?.unwrap_or(0),
            outcome: c.named_required(Table::Attempts, "outcome", i)?,
            error_class: c.named(Table::Attempts, "error_class", i)?,
            response_sha256: c.bytes("response_sha256", i)?,
            response_excerpt: c.text("response_excerpt", i)?,
            secret_versions: c.int_list("secret_versions", i)?,
            note: c.named(Table::Attempts, "note", i)?,
        });
    }
    Ok(out)
}
