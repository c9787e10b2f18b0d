//! Reconciliation runs as stored (`walhook.reconcile_runs`): written by
//! `walhook reconcile` and by the schedule in `walhook run`, read by the API
//! and the metrics.

use std::time::SystemTime;

use crate::{Platform, StoreError};

/// A finished run, to store.
#[derive(Debug, Clone)]
pub struct NewReconciliation<'a> {
    /// `command` or `scheduled`.
    pub trigger: &'a str,
    /// The window's start.
    pub since: SystemTime,
    /// The window's end.
    pub until: SystemTime,
    /// The one tenant reconciled, if one was.
    pub tenant_id: Option<&'a str>,
    /// Whether repairs were made.
    pub repair: bool,
    /// No gap left unrepaired.
    pub clean: bool,
    /// Gaps left.
    pub open_gaps: i64,
    /// Gaps repaired.
    pub repaired: i64,
    /// Gaps by class.
    pub gap_counts: serde_json::Value,
    /// The report's data hash.
    pub data_sha256: &'a str,
    /// The whole report.
    pub report: serde_json::Value,
    /// When the run began.
    pub started_at: SystemTime,
}

/// A stored run; `report` is the whole report for the operator, and only
/// the tenant's own funnel and gaps for a tenant.
#[derive(Debug, Clone)]
pub struct Reconciliation {
    /// Its id (grows with time).
    pub id: i64,
    /// `command` or `scheduled`.
    pub trigger: String,
    /// The window's start.
    pub since: SystemTime,
    /// The window's end.
    pub until: SystemTime,
    /// The one tenant reconciled, if one was.
    pub tenant_id: Option<String>,
    /// Whether repairs were made.
    pub repair: bool,
    /// No gap left unrepaired (for a tenant: none of its own).
    pub clean: bool,
    /// Gaps left (for a tenant: its own).
    pub open_gaps: i64,
    /// Gaps by class (operator view).
    pub gap_counts: serde_json::Value,
    /// The report's data hash.
    pub data_sha256: String,
    /// When the run began.
    pub started_at: SystemTime,
    /// When it ended.
    pub finished_at: SystemTime,
    /// The report, or the tenant's part of it (`funnel` and `gaps`), when
    /// asked for.
    pub report: Option<serde_json::Value>,
}

/// Runs kept: older ones are deleted when a new one is stored.
pub const KEEP_RUNS: i64 = 5000;

const COLUMNS: &str = "id, trigger, since, until, tenant_id, repair, clean, open_gaps, gap_counts, \
                       data_sha256, started_at, finished_at";

/// The tenant's part of a report: its funnel row and its gaps.
const TENANT_PART: &str = "jsonb_build_object( \
    'funnel', (SELECT t FROM jsonb_array_elements(report->'tenants') t WHERE t->>'tenant' = $1), \
    'gaps', (SELECT coalesce(jsonb_agg(g), '[]'::jsonb) FROM jsonb_array_elements(report->'gaps') g \
             WHERE g->>'tenant' = $1))";

fn row_of(r: &tokio_postgres::Row, report: Option<serde_json::Value>) -> Reconciliation {
    Reconciliation {
        id: r.get(0),
        trigger: r.get(1),
        since: r.get(2),
        until: r.get(3),
        tenant_id: r.get(4),
        repair: r.get(5),
        clean: r.get(6),
        open_gaps: r.get(7),
        gap_counts: r.get(8),
        data_sha256: r.get(9),
        started_at: r.get(10),
        finished_at: r.get(11),
        report,
    }
}

/// A tenant's view of a row: its own gaps decide `clean` and `open_gaps`.
fn for_tenant(mut run: Reconciliation, part: serde_json::Value) -> Reconciliation {
    let open = part["gaps"]
        .as_array()
        .map(|g| g.iter().filter(|g| g["repaired"] != true).count())
        .unwrap_or(0) as i64;
    run.open_gaps = open;
    run.clean = open == 0;
    run.gap_counts = serde_json::Value::Null;
    run.report = Some(part);
    run
}

impl Platform {
    /// Stores a finished run; returns its id.
    pub async fn save_reconciliation(
        &self,
        run: &NewReconciliation<'_>,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_one(
                "INSERT INTO walhook.reconcile_runs (trigger, since, until, tenant_id, repair, clean, open_gaps, \
                     repaired, gap_counts, data_sha256, report, started_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING id",
                &[
                    &run.trigger,
                    &run.since,
                    &run.until,
                    &run.tenant_id,
                    &run.repair,
                    &run.clean,
                    &run.open_gaps,
                    &run.repaired,
                    &run.gap_counts,
                    &run.data_sha256,
                    &run.report,
                    &run.started_at,
                ],
            )
            .await
            .map_err(StoreError::query("store a reconciliation"))?;
        let id: i64 = row.get(0);
        client
            .execute(
                "DELETE FROM walhook.reconcile_runs WHERE id <= $1::int8 - $2::int8",
                &[&id, &KEEP_RUNS],
            )
            .await
            .map_err(StoreError::query("forget old reconciliations"))?;
        Ok(id)
    }

    /// Runs newest first, older than `before_id`; for a tenant, the runs over
    /// every tenant and its own, each with its own part of the report.
    pub async fn list_reconciliations(
        &self,
        tenant: Option<&str>,
        before_id: Option<i64>,
        limit: i64,
    ) -> Result<Vec<Reconciliation>, StoreError> {
        let client = self.client().await?;
        let before = before_id.unwrap_or(i64::MAX);
        match tenant {
            None => {
                let rows = client
                    .query(
                        &format!(
                            "SELECT {COLUMNS} FROM walhook.reconcile_runs WHERE id < $1 \
                             ORDER BY id DESC LIMIT $2"
                        ),
                        &[&before, &limit],
                    )
                    .await
                    .map_err(StoreError::query("list reconciliations"))?;
                Ok(rows.iter().map(|r| row_of(r, None)).collect())
            }
            Some(t) => {
                let rows = client
                    .query(
                        &format!(
                            "SELECT {COLUMNS}, {TENANT_PART} FROM walhook.reconcile_runs \
                             WHERE (tenant_id IS NULL OR tenant_id = $1) AND id < $2 \
                             ORDER BY id DESC LIMIT $3"
                        ),
                        &[&t, &before, &limit],
                    )
                    .await
                    .map_err(StoreError::query("list reconciliations"))?;
                Ok(rows
                    .iter()
                    .map(|r| for_tenant(row_of(r, None), r.get(12)))
                    .collect())
            }
        }
    }

    /// One run with its report (for a tenant: its part, and only a run over
    /// every tenant or its own).
    pub async fn reconciliation(
        &self,
        id: i64,
        tenant: Option<&str>,
    ) -> Result<Option<Reconciliation>, StoreError> {
        let client = self.client().await?;
        match tenant {
            None => {
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT {COLUMNS}, report FROM walhook.reconcile_runs WHERE id = $1"
                        ),
                        &[&id],
                    )
                    .await
                    .map_err(StoreError::query("read a reconciliation"))?;
                Ok(row.map(|r| row_of(&r, Some(r.get(12)))))
            }
            Some(t) => {
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT {COLUMNS}, {TENANT_PART} FROM walhook.reconcile_runs \
                             WHERE id = $2 AND (tenant_id IS NULL OR tenant_id = $1)"
                        ),
                        &[&t, &id],
                    )
                    .await
                    .map_err(StoreError::query("read a reconciliation"))?;
                Ok(row.map(|r| for_tenant(row_of(&r, None), r.get(12))))
            }
        }
    }
}
