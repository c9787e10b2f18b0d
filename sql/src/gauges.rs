//! Pipeline gauges computed from the platform database when metrics are
//! scraped: what no single process can count (the oldest pending delivery,
//! circuits, capture checkpoints), read with cheap indexed queries.

use crate::{Platform, StoreError};

/// What a scrape reads.
#[derive(Debug, Clone, Default)]
pub struct PipelineGauges {
    /// Pending deliveries.
    pub pending: i64,
    /// Seconds since the oldest pending delivery was made (0 when none).
    pub oldest_pending_age_secs: f64,
    /// Pending deliveries due now or earlier that no dispatcher holds.
    pub overdue_unleased: i64,
    /// Seconds the oldest due delivery awaiting its first attempt has been
    /// due (0 when none).
    pub oldest_due_new_secs: f64,
    /// Seconds the oldest due retry has been due (0 when none).
    pub oldest_due_retry_secs: f64,
    /// Endpoints per circuit state (`closed`, `open`, `half_open`, …).
    pub circuits: Vec<(String, i64)>,
    /// Per capture source: WAL the slot retains (bytes) and seconds since
    /// the checkpoint last moved.
    pub capture: Vec<(String, Option<i64>, f64)>,
    /// Per archived table (`events`, `deliveries`, `attempts`): rows and
    /// Parquet bytes archived and dropped from the hot tables, failed
    /// verifications, days that failed to archive, and seconds since the
    /// start of the oldest day still hot (0 when none).
    pub archive: Vec<ArchiveGauges>,
    /// The latest reconciliation over every tenant, if any ran.
    pub reconcile: Option<ReconcileGauges>,
}

/// The latest reconciliation's figures (over every tenant).
#[derive(Debug, Clone, Default)]
pub struct ReconcileGauges {
    /// Gaps found by the latest run, by class (classes it found).
    pub gaps: Vec<(String, i64)>,
    /// Gaps it left unrepaired.
    pub open_gaps: i64,
    /// The end of the latest window found clean (Unix seconds; 0 if none).
    pub last_clean_until: f64,
    /// When the latest run ended (Unix seconds).
    pub last_run_at: f64,
}

/// The archive's figures for one table.
#[derive(Debug, Clone, Default)]
pub struct ArchiveGauges {
    /// The table.
    pub table: String,
    /// Rows archived and dropped.
    pub rows: i64,
    /// Parquet bytes of those rows.
    pub bytes: i64,
    /// Verifications that found a mismatch.
    pub verification_failures: i64,
    /// Seconds since the oldest hot day began.
    pub oldest_hot_age_secs: f64,
    /// Days whose last archive attempt failed and that no run has archived
    /// since (open `archive_day_failed` incidents).
    pub failed_days: i64,
    /// Transactions since the oldest row not yet frozen in the table's
    /// partitions (the largest `age(relfrozenxid)`): Postgres freezes a
    /// partition in an anti-wraparound pass at `autovacuum_freeze_max_age`.
    pub xid_age: i64,
    /// The largest share of its effective `autovacuum_freeze_max_age` (the
    /// cluster's, or the partition's own when lower) that a partition's
    /// `age(relfrozenxid)` has reached: at 1 that pass starts.
    pub freeze_progress: f64,
}

impl Platform {
    /// Reads the gauges.
    pub async fn pipeline_gauges(&self) -> Result<PipelineGauges, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "WITH planned AS ( \
                    SELECT f.created_at, f.lease_owner FROM walhook.fanouts f \
                    CROSS JOIN LATERAL unnest(f.delivery_ids) AS x(id) \
                    WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = x.id) IS NULL), \
                 waiting AS ( \
                    SELECT created_at, next_attempt_at <= now() AND lease_owner IS NULL AS unheld, \
                           next_attempt_at AS due_at, next_attempt_at > created_at AS retry FROM walhook.pending \
                    UNION ALL SELECT created_at, lease_owner IS NULL, created_at, false FROM planned) \
                 SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at))::float8, 0), \
                        count(*) FILTER (WHERE unheld), \
                        coalesce(extract(epoch FROM now() - min(due_at) FILTER (WHERE NOT retry AND due_at <= now()))::float8, 0), \
                        coalesce(extract(epoch FROM now() - min(due_at) FILTER (WHERE retry AND due_at <= now()))::float8, 0) \
                 FROM waiting",
                &[],
            )
            .await
            .map_err(StoreError::query("read pending deliveries"))?;
        let circuits = client
            .query(
                "SELECT circuit, count(*) FROM walhook.endpoint_health GROUP BY circuit ORDER BY circuit",
                &[],
            )
            .await
            .map_err(StoreError::query("read circuits"))?;
        let capture = client
            .query(
                "SELECT source, slot_lag_bytes, extract(epoch FROM now() - updated_at)::float8 \
                 FROM walhook.capture_checkpoints ORDER BY source",
                &[],
            )
            .await
            .map_err(StoreError::query("read capture checkpoints"))?;
        let archive = client
            .query(
                "WITH t(name) AS (VALUES ('events'), ('deliveries'), ('attempts')), \
                 cluster AS (SELECT current_setting('autovacuum_freeze_max_age')::float8 AS freeze_max), \
                 parts AS ( \
                    SELECT parent.relname::text AS name, c.relname::text AS relname, age(c.relfrozenxid) AS xid_age, \
                           age(c.relfrozenxid) / least(cluster.freeze_max, coalesce( \
                             (SELECT split_part(o, '=', 2)::float8 FROM unnest(c.reloptions) o \
                              WHERE split_part(o, '=', 1) = 'autovacuum_freeze_max_age'), cluster.freeze_max)) AS freeze_progress \
                    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
                    JOIN pg_class parent ON parent.oid = i.inhparent, cluster \
                    WHERE i.inhparent IN ('walhook.events'::regclass, 'walhook.deliveries'::regclass, \
                                          'walhook.attempts'::regclass)), \
                 oldest AS ( \
                    SELECT name, min(to_date(split_part(relname, '_', 2), 'YYYYMMDD'))::timestamp AT TIME ZONE 'UTC' AS at \
                    FROM parts WHERE name IN ('events', 'attempts') GROUP BY 1 \
                    UNION ALL SELECT 'deliveries', min(x.m) FROM walhook.tenants tn, \
                    LATERAL (SELECT date_trunc('day', min(created_at) AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS m \
                             FROM walhook.deliveries d WHERE d.tenant_id = tn.id) x) \
                 SELECT t.name, \
                   coalesce((SELECT sum(row_count) FILTER (WHERE state = 'dropped') FROM walhook.archive_partitions a WHERE a.table_name = t.name), 0)::int8, \
                   coalesce((SELECT sum(byte_count) FILTER (WHERE state = 'dropped') FROM walhook.archive_partitions a WHERE a.table_name = t.name), 0)::int8, \
                   coalesce((SELECT sum(verify_failures) FROM walhook.archive_partitions a WHERE a.table_name = t.name), 0)::int8, \
                   coalesce((SELECT extract(epoch FROM now() - min(o.at))::float8 FROM oldest o WHERE o.name = t.name), 0), \
                   (SELECT count(*) FROM walhook.incidents i WHERE i.stage = 'archive' AND i.kind = 'archive_day_failed' \
                      AND i.resolved_at IS NULL AND split_part(i.subject, '/', 1) = t.name), \
                   coalesce((SELECT max(p.xid_age) FROM parts p WHERE p.name = t.name), 0)::int8, \
                   coalesce((SELECT max(p.freeze_progress) FROM parts p WHERE p.name = t.name), 0)::float8 \
                 FROM t ORDER BY t.name",
                &[],
            )
            .await
            .map_err(StoreError::query("read archive figures"))?;
        let reconcile = client
            .query_opt(
                "SELECT r.gap_counts, r.open_gaps, extract(epoch FROM r.finished_at)::float8, \
                        coalesce((SELECT extract(epoch FROM max(c.until))::float8 FROM walhook.reconcile_runs c \
                                  WHERE c.clean AND c.tenant_id IS NULL), 0) \
                 FROM walhook.reconcile_runs r WHERE r.tenant_id IS NULL ORDER BY r.id DESC LIMIT 1",
                &[],
            )
            .await
            .map_err(StoreError::query("read the latest reconciliation"))?;
        let reconcile = reconcile.map(|r| {
            let counts: serde_json::Value = r.get(0);
            ReconcileGauges {
                gaps: counts
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(class, n)| (class.clone(), n.as_i64().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default(),
                open_gaps: r.get(1),
                last_run_at: r.get(2),
                last_clean_until: r.get(3),
            }
        });
        Ok(PipelineGauges {
            reconcile,
            archive: archive
                .iter()
                .map(|r| ArchiveGauges {
                    table: r.get(0),
                    rows: r.get(1),
                    bytes: r.get(2),
                    verification_failures: r.get(3),
                    oldest_hot_age_secs: r.get(4),
                    failed_days: r.get(5),
                    xid_age: r.get(6),
                    freeze_progress: r.get(7),
                })
                .collect(),
            pending: row.get(0),
            oldest_pending_age_secs: row.get(1),
            overdue_unleased: row.get(2),
            oldest_due_new_secs: row.get(3),
            oldest_due_retry_secs: row.get(4),
            circuits: circuits.iter().map(|r| (r.get(0), r.get(1))).collect(),
            capture: capture
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        })
    }

    /// The latest capture incidents (what capture saw that did not become
    /// an event), newest first: source, kind, commit LSN, rule, table,
    /// detail, Unix seconds seen.
    pub async fn recent_capture_incidents(
        &self,
        limit: i64,
    ) -> Result<Vec<CaptureIncidentRow>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT source, kind, commit_lsn::text, rule, table_name, detail, \
                        extract(epoch FROM seen_at)::float8 \
                 FROM walhook.capture_incidents ORDER BY id DESC LIMIT $1",
                &[&limit],
            )
            .await
            .map_err(StoreError::query("read capture incidents"))?;
        Ok(rows
            .iter()
            .map(|r| CaptureIncidentRow {
                source: r.get(0),
                kind: r.get(1),
                commit_lsn: r.get(2),
                rule: r.get(3),
                table: r.get(4),
                detail: r.get(5),
                seen_at: r.get(6),
            })
            .collect())
    }
}

/// A capture incident as the console lists it.
#[derive(Debug, Clone)]
pub struct CaptureIncidentRow {
    /// The capture source.
    pub source: String,
    /// What happened (`truncate`, `schema_change`, `slot_reset`, …).
    pub kind: String,
    /// The transaction's commit LSN, when there is one.
    pub commit_lsn: Option<String>,
    /// The rule concerned.
    pub rule: Option<String>,
    /// The table concerned.
    pub table: Option<String>,
    /// The sentence for the operator.
    pub detail: String,
    /// When it was seen (Unix seconds).
    pub seen_at: f64,
}
