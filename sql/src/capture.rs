//! What capture keeps in the platform database: checkpoints, incidents,
//! the capture ledger and the event-type catalog.

use std::str::FromStr;
use std::time::SystemTime;

use walhook_pipeline::capture::ledger::{LedgerPart, LedgerRow, LedgerSnapshot, PartKey, fold};
use walhook_pipeline::capture::{CaptureIncidentStore, CaptureLedgerStore, Incident};
use walhook_pipeline::ids::Lsn;
use walhook_pipeline::time::Timestamp;

use crate::{Platform, StoreError};

/// Takes the source's mark (made when absent: `0/0` and part -1, below
/// every key) and holds its row lock to the end of the transaction, so
/// that writers of one source take turns.
const LOCK_MARK: &str = "\
INSERT INTO walhook.capture_ledger_marks AS m (source, commit_lsn, part) VALUES ($1, '0/0', -1) \
ON CONFLICT (source) DO UPDATE SET updated_at = now() \
RETURNING m.commit_lsn::text, m.part";

/// Adds one batch's sums (one row per (rule, window)) and moves the mark.
const ADD_PARTS: &str = "\
WITH added AS ( \
    INSERT INTO walhook.capture_ledger AS l (source, rule, window_start, changes, events, filtered, \
                                             incidents, first_commit_lsn, last_commit_lsn) \
    SELECT $1, u.rule, u.w, u.c, u.e, u.f, u.i, u.lo::pg_lsn, u.hi::pg_lsn \
    FROM unnest($2::text[], $3::timestamptz[], $4::int8[], $5::int8[], $6::int8[], $7::int8[], \
                $8::text[], $9::text[]) AS u(rule, w, c, e, f, i, lo, hi) \
    ON CONFLICT (source, rule, window_start) DO UPDATE SET \
        changes = l.changes + EXCLUDED.changes, \
        events = l.events + EXCLUDED.events, \
        filtered = l.filtered + EXCLUDED.filtered, \
        incidents = l.incidents + EXCLUDED.incidents, \
        first_commit_lsn = least(l.first_commit_lsn, EXCLUDED.first_commit_lsn), \
        last_commit_lsn = greatest(l.last_commit_lsn, EXCLUDED.last_commit_lsn), \
        updated_at = now() \
) \
UPDATE walhook.capture_ledger_marks SET commit_lsn = $10::text::pg_lsn, part = $11, updated_at = now() \
WHERE source = $1";

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn parse_lsn(text: &str) -> Result<Lsn, StoreError> {
    Lsn::from_str(text).map_err(|_| {
        StoreError::Schema(format!(
            "the capture ledger holds the LSN {text:?}, which is not one"
        ))
    })
}

impl Platform {
    /// Records that `source` confirmed `lsn` on `slot`.
    pub async fn save_checkpoint(
        &self,
        source: &str,
        slot: &str,
        lsn: Lsn,
        lag_bytes: Option<i64>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO walhook.capture_checkpoints (source, slot_name, confirmed_lsn, slot_lag_bytes) \
                 VALUES ($1, $2, $3::text::pg_lsn, $4) \
                 ON CONFLICT (source) DO UPDATE SET slot_name = EXCLUDED.slot_name, \
                   confirmed_lsn = greatest(walhook.capture_checkpoints.confirmed_lsn, EXCLUDED.confirmed_lsn), \
                   slot_lag_bytes = coalesce(EXCLUDED.slot_lag_bytes, walhook.capture_checkpoints.slot_lag_bytes), \
                   updated_at = now()",
                &[&source, &slot, &lsn.to_string(), &lag_bytes],
            )
            .await
            .map_err(StoreError::query("save a capture checkpoint"))?;
        Ok(())
    }

    /// How far `source` read from its slot (its saved checkpoint), if it
    /// ever did.
    pub async fn capture_position(&self, source: &str) -> Result<Option<Lsn>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT confirmed_lsn::text FROM walhook.capture_checkpoints WHERE source = $1",
                &[&source],
            )
            .await
            .map_err(StoreError::query("read a capture checkpoint"))?;
        Ok(row.and_then(|r| r.get::<_, String>(0).parse().ok()))
    }

    /// Gives up `source`'s position `read_up_to` on a slot that is gone
    /// (the operator accepted the loss): one transaction records a
    /// `slot_reset` capture incident naming the position, and forgets the
    /// checkpoint, so that a new slot may be created (it starts at the
    /// business database's position of that moment).
    pub async fn reset_capture_position(
        &self,
        source: &str,
        slot: &str,
        read_up_to: Lsn,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        let detail = format!(
            "replication slot {slot:?} was gone; the operator accepted the loss (--accept-slot-loss). \
             Changes committed after {read_up_to} and before the new slot was created were not captured"
        );
        tx.execute(
            "INSERT INTO walhook.capture_incidents (source, kind, commit_lsn, detail) \
             VALUES ($1, 'slot_reset', $2::text::pg_lsn, $3) ON CONFLICT DO NOTHING",
            &[&source, &read_up_to.to_string(), &detail],
        )
        .await
        .map_err(StoreError::query("record the slot reset"))?;
        tx.execute(
            "DELETE FROM walhook.capture_checkpoints WHERE source = $1",
            &[&source],
        )
        .await
        .map_err(StoreError::query("forget the capture checkpoint"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit the slot reset"))?;
        Ok(())
    }

    /// Stores incidents; one seen again after a restart is stored once.
    pub async fn record_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> Result<(), StoreError> {
        if incidents.is_empty() {
            return Ok(());
        }
        let client = self.client().await?;
        let kinds: Vec<&str> = incidents.iter().map(|i| i.kind.as_str()).collect();
        let lsns: Vec<Option<String>> = incidents
            .iter()
            .map(|i| i.commit_lsn.map(|l| l.to_string()))
            .collect();
        let ordinals: Vec<Option<i32>> = incidents
            .iter()
            .map(|i| i.tx_ordinal.map(|o| o as i32))
            .collect();
        let rules: Vec<Option<&str>> = incidents.iter().map(|i| i.rule.as_deref()).collect();
        let tables: Vec<Option<&str>> = incidents.iter().map(|i| i.table.as_deref()).collect();
        let details: Vec<&str> = incidents.iter().map(|i| i.detail.as_str()).collect();
        client
            .execute(
                "INSERT INTO walhook.capture_incidents (source, kind, commit_lsn, tx_ordinal, rule, table_name, detail) \
                 SELECT $1, k, l::pg_lsn, o, r, t, d \
                 FROM unnest($2::text[], $3::text[], $4::int4[], $5::text[], $6::text[], $7::text[]) AS u(k, l, o, r, t, d) \
                 ON CONFLICT DO NOTHING",
                &[&source, &kinds, &lsns, &ordinals, &rules, &tables, &details],
            )
            .await
            .map_err(StoreError::query("record capture incidents"))?;
        Ok(())
    }

    /// Adds `parts` of `source` to the capture ledger, leaving out those
    /// at or below the source's mark; see [`CaptureLedgerStore`]. Returns
    /// how many parts were counted.
    pub async fn record_ledger(
        &self,
        source: &str,
        parts: &[LedgerPart],
    ) -> Result<usize, StoreError> {
        if parts.is_empty() {
            return Ok(0);
        }
        let mut client = self.client().await?;
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin the capture ledger write"))?;
        let lock = tx
            .prepare_cached(LOCK_MARK)
            .await
            .map_err(StoreError::query("prepare the capture ledger mark lock"))?;
        let row = tx
            .query_one(&lock, &[&source])
            .await
            .map_err(StoreError::query("lock the capture ledger mark"))?;
        let part: i32 = row.get(1);
        let mark = match u32::try_from(part) {
            Ok(part) => Some(PartKey {
                commit_lsn: parse_lsn(row.get(0))?,
                part,
            }),
            // Made just now: nothing counted yet.
            Err(_) => None,
        };
        let folded = fold(parts, mark);
        let Some(new_mark) = folded.mark else {
            // Everything was counted before (the slot sent it again).
            tx.rollback()
                .await
                .map_err(StoreError::query("end the capture ledger write"))?;
            return Ok(0);
        };
        let rows = &folded.rows;
        let rules: Vec<&str> = rows.iter().map(|r| r.rule.as_str()).collect();
        let windows: Vec<SystemTime> = rows.iter().map(|r| r.window.to_system_time()).collect();
        let changes: Vec<i64> = rows.iter().map(|r| to_i64(r.changes)).collect();
        let events: Vec<i64> = rows.iter().map(|r| to_i64(r.events)).collect();
        let filtered: Vec<i64> = rows.iter().map(|r| to_i64(r.filtered)).collect();
        let incidents: Vec<i64> = rows.iter().map(|r| to_i64(r.incidents)).collect();
        let firsts: Vec<String> = rows
            .iter()
            .map(|r| r.first_commit_lsn.to_string())
            .collect();
        let lasts: Vec<String> = rows.iter().map(|r| r.last_commit_lsn.to_string()).collect();
        let part = i32::try_from(new_mark.part).unwrap_or(i32::MAX);
        let add = tx
            .prepare_cached(ADD_PARTS)
            .await
            .map_err(StoreError::query("prepare the capture ledger write"))?;
        tx.execute(
            &add,
            &[
                &source,
                &rules,
                &windows,
                &changes,
                &events,
                &filtered,
                &incidents,
                &firsts,
                &lasts,
                &new_mark.commit_lsn.to_string(),
                &part,
            ],
        )
        .await
        .map_err(StoreError::query("add to the capture ledger"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit the capture ledger write"))?;
        Ok(folded.counted)
    }

    /// The capture ledger of `source` and its mark (operators, tests).
    pub async fn capture_ledger(&self, source: &str) -> Result<LedgerSnapshot, StoreError> {
        let client = self.client().await?;
        let mark = client
            .query_opt(
                "SELECT commit_lsn::text, part FROM walhook.capture_ledger_marks WHERE source = $1",
                &[&source],
            )
            .await
            .map_err(StoreError::query("read the capture ledger mark"))?;
        let mark = match mark {
            Some(row) => match u32::try_from(row.get::<_, i32>(1)) {
                Ok(part) => Some(PartKey {
                    commit_lsn: parse_lsn(row.get(0))?,
                    part,
                }),
                Err(_) => None,
            },
            None => None,
        };
        let rows = client
            .query(
                "SELECT rule, window_start, changes, events, filtered, incidents, \
                        first_commit_lsn::text, last_commit_lsn::text \
                 FROM walhook.capture_ledger WHERE source = $1 \
                 ORDER BY rule COLLATE \"C\", window_start",
                &[&source],
            )
            .await
            .map_err(StoreError::query("read the capture ledger"))?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let rows = rows
            .iter()
            .map(|r| {
                Ok(LedgerRow {
                    rule: r.get(0),
                    window: Timestamp::from_system_time(r.get(1)),
                    changes: count(r.get(2)),
                    events: count(r.get(3)),
                    filtered: count(r.get(4)),
                    incidents: count(r.get(5)),
                    first_commit_lsn: parse_lsn(r.get(6))?,
                    last_commit_lsn: parse_lsn(r.get(7))?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(LedgerSnapshot { mark, rows })
    }

    /// Records the event types a source's rules produce (a type whose shape
    /// changed keeps its newest schema version).
    pub async fn upsert_event_types(
        &self,
        source: &str,
        types: &[(String, u32)],
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        for (name, version) in types {
            client
                .execute(
                    "INSERT INTO walhook.event_types (name, schema_version, source) VALUES ($1, $2, $3) \
                     ON CONFLICT (name) DO UPDATE SET schema_version = greatest(EXCLUDED.schema_version, \
                       coalesce((SELECT max(s.version) FROM walhook.event_schemas s WHERE s.event_type = EXCLUDED.name), 0)), \
                       source = EXCLUDED.source, updated_at = now()",
                    &[name, &(*version as i32), &source],
                )
                .await
                .map_err(StoreError::query("record an event type"))?;
        }
        Ok(())
    }
}

impl CaptureIncidentStore for Platform {
    async fn record_capture_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self.record_incidents(source, incidents).await?)
    }
}

impl CaptureLedgerStore for Platform {
    async fn record_ledger_parts(
        &self,
        source: &str,
        parts: &[LedgerPart],
    ) -> Result<usize, walhook_pipeline::store::StoreError> {
        Ok(self.record_ledger(source, parts).await?)
    }
}

impl walhook_pipeline::runtime::CheckpointStore for Platform {
    async fn save_checkpoint(
        &self,
        source: &str,
        slot: &str,
        lsn: Lsn,
        lag_bytes: Option<i64>,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(Platform::save_checkpoint(self, source, slot, lsn, lag_bytes).await?)
    }
}
