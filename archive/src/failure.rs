//! A day that fails to archive: which failures stay with their day and which
//! end the run, and how a failed day is reported so that nobody misses it.
//!
//! ```text
//!  archive_day(table, day) ──Err──▶ ends_the_run? ──yes──▶ the run stops (store or database broken)
//!                                        │ no
//!                                        ▼
//!  log (table, day, cause) · incident archive/archive_day_failed "table/day"
//!  · walhook_archive_failed_days{table} · report FAILED ──▶ next day, next table
//!
//!  archive_day(table, day) ──Archived──▶ the day's open incident is resolved
//! ```
//!
//! A failed day keeps its hot rows (nothing was dropped), so no history is
//! lost; the incident stays open, shown in the console, counted by the
//! metric and listed by reconciliation, until a later run archives the day.

use chrono::NaiveDate;
use walhook_pipeline::incident::{IncidentKind, Stage, StageIncident};
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;
use crate::archiver::{Archiver, Outcome, PartitionReport};
use crate::table::Table;

impl ArchiveError {
    /// Whether this failure ends the run rather than only its day: a
    /// definite failure of the store (credentials, bucket, permissions) or
    /// of the database (a refused statement that is not about a row's
    /// data) would fail every later day the same way. Everything about the
    /// day itself (a row the exporter refuses, a value Postgres cannot
    /// send, Parquet or Arrow refusing a part, a verification that does not
    /// match, a catalog row in a state this version does not know) and
    /// anything transient stays with its day.
    pub fn ends_the_run(&self) -> bool {
        if self.is_transient() {
            return false;
        }
        match self {
            ArchiveError::Shape { .. }
            | ArchiveError::Arrow(_)
            | ArchiveError::Parquet(_)
            | ArchiveError::Verification { .. }
            | ArchiveError::UnknownState { .. } => false,
            ArchiveError::Query { source, .. } => !about_the_rows(source),
            ArchiveError::Db(_)
            | ArchiveError::Store(_)
            | ArchiveError::Busy
            | ArchiveError::TenantReadsBusy { .. } => true,
        }
    }
}

/// Whether Postgres refused because of the rows read: a data exception
/// (class 22), a limit a row passed (class 54) or data found corrupt
/// (XX001, XX002).
fn about_the_rows(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|code| {
        let code = code.code();
        code.starts_with("22") || code.starts_with("54") || code == "XX001" || code == "XX002"
    })
}

/// An error and its causes on one line, as reports and incidents show it.
pub(crate) fn failure_text(e: &ArchiveError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The incident's subject for `table`'s `day`: `attempts/2026-11-27`.
pub fn subject(table: Table, day: NaiveDate) -> String {
    format!("{table}/{day}")
}

/// A day whose archiving failed and that no run has archived since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedDay {
    /// The table.
    pub table: Table,
    /// The day.
    pub day: NaiveDate,
    /// The incident's sentence: what failed and why.
    pub cause: String,
}

/// The failed days of `first..=last` (open `archive_day_failed`
/// incidents), by table and day: what reconciliation lists beside the
/// archived days.
pub async fn failed_days(
    client: &tokio_postgres::Client,
    first: NaiveDate,
    last: NaiveDate,
) -> Result<Vec<FailedDay>, ArchiveError> {
    let rows = client
        .query(
            "SELECT subject, detail FROM walhook.incidents \
             WHERE stage = $1 AND kind = $2 AND resolved_at IS NULL ORDER BY subject",
            &[
                &Stage::Archive.as_str(),
                &IncidentKind::ArchiveDayFailed.as_str(),
            ],
        )
        .await
        .map_err(ArchiveError::query("read the archive's failed days"))?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let subject: &str = r.get(0);
            let (table, day) = subject.split_once('/')?;
            Some(FailedDay {
                table: Table::parse(table)?,
                day: day.parse().ok()?,
                cause: r.get(1),
            })
        })
        .filter(|f| (first..=last).contains(&f.day))
        .collect())
}

impl<S: ObjectStore> Archiver<S> {
    /// Reports `table`'s `day` as failed with `e`: logged with its table,
    /// day and cause, recorded as an open incident (which the console, the
    /// `walhook_archive_failed_days` gauge and reconciliation show), and a
    /// verification failure also counted in the catalog.
    pub(crate) async fn day_failed(
        &self,
        table: Table,
        day: NaiveDate,
        e: &ArchiveError,
    ) -> PartitionReport {
        let cause = failure_text(e);
        tracing::error!(%table, %day, error = %cause, "archiving a day failed; its hot rows are kept and the run goes on with the next day");
        if matches!(e, ArchiveError::Verification { .. })
            && let Err(count) = self.count_failure(table, day).await
        {
            tracing::error!(%table, %day, error = %failure_text(&count), "cannot count the failed verification in the archive catalog");
        }
        let incident = StageIncident::new(
            Stage::Archive,
            IncidentKind::ArchiveDayFailed,
            &subject(table, day),
            &format!("{table} of {day} was not archived (its rows stay in Postgres): {cause}"),
        );
        let stored = match self.platform.client().await {
            Ok(client) => self
                .platform
                .upsert_incidents(&client, std::slice::from_ref(&incident))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(store) = stored {
            // The log line above and the run's report still say it.
            tracing::error!(%table, %day, error = %store, "cannot record the failed day as an incident");
        }
        PartitionReport::new(table, day, Outcome::Failed(cause))
    }

    /// Resolves the open incident of `table`'s `day`, if one is open: the
    /// day is archived now.
    pub(crate) async fn resolve_failure(&self, table: Table, day: NaiveDate) {
        let resolved = self
            .catalog_execute(
                "resolve a failed day's incident",
                "UPDATE walhook.incidents SET resolved_at = now() \
                 WHERE stage = $1 AND kind = $2 AND subject = $3 AND resolved_at IS NULL",
                &[
                    &Stage::Archive.as_str(),
                    &IncidentKind::ArchiveDayFailed.as_str(),
                    &subject(table, day),
                ],
            )
            .await;
        if let Err(e) = resolved {
            tracing::warn!(%table, %day, error = %failure_text(&e), "cannot resolve the archived day's incident");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use walhook_pipeline::objstore::ObjectStoreError;

    #[test]
    fn failures_of_a_day_stay_with_it_and_broken_services_end_the_run() {
        let shape = ArchiveError::Shape {
            table: Table::Events,
            column: "payload_sha256",
            detail: "20 bytes where a fixed width is expected".into(),
        };
        let verification = ArchiveError::Verification {
            table: Table::Events,
            day: NaiveDate::from_ymd_opt(2026, 11, 27).unwrap(),
            object: "x".into(),
            kind: crate::VerificationKind::Mismatch,
            problem: "y".into(),
            fix: "z".into(),
        };
        let arrow = ArchiveError::Arrow(arrow_schema::ArrowError::ComputeError("big".into()));
        let parquet = ArchiveError::Parquet(parquet::errors::ParquetError::General("bad".into()));
        let unknown = ArchiveError::UnknownState {
            table: Table::Events,
            day: NaiveDate::from_ymd_opt(2026, 11, 27).unwrap(),
            generation: 0,
            unknown: crate::PartitionState::try_from("archived").unwrap_err(),
        };
        for e in [&shape, &verification, &arrow, &parquet, &unknown] {
            assert!(!e.ends_the_run(), "{e}");
        }
        let definite = ArchiveError::Store(ObjectStoreError::Definite {
            op: "put",
            key: "k".into(),
            hint: "check the credentials".into(),
            source: "denied".into(),
        });
        let transient = ArchiveError::Store(ObjectStoreError::Transient {
            op: "put",
            key: "k".into(),
            source: "timeout".into(),
        });
        assert!(definite.ends_the_run());
        assert!(!transient.ends_the_run());
        assert!(ArchiveError::Busy.is_transient());
        assert_eq!(
            subject(
                Table::Attempts,
                NaiveDate::from_ymd_opt(2026, 11, 27).unwrap()
            ),
            "attempts/2026-11-27"
        );
        assert!(failure_text(&shape).contains("column payload_sha256 of events: 20 bytes"));
    }
}
