//! Archived days the window touches: every object their manifests name is
//! read back and matched (the archive's own verification), and the parts of
//! dropped days that may hold the window's rows are read
//! ([`crate::archived`]) for the hot stage to judge with the hot rows. Days
//! the archive
//! failed to write (open `archive_day_failed` incidents) are listed too,
//! with the cause: their rows are still hot (counted by the hot stage), so
//! they are no gap, but an auditor sees that the day is not cold yet.

use std::time::SystemTime;

use walhook_archive::dates::NaiveDateSql;
use walhook_archive::table::Table;
use walhook_archive::{ArchiveError, PartitionState, VerificationKind};
use walhook_pipeline::objstore::ObjectStore;

use crate::ReconcileError;
use crate::archived::Archived;
use crate::findings::{Findings, gap};
use crate::report::{ArchiveDay, ArchiveDayState, GapClass};

/// What the archive stage reads: the window, and the days each table's
/// rows of it may be archived under.
pub struct Span {
    /// The window's start.
    pub since: SystemTime,
    /// The window's end.
    pub until: SystemTime,
    /// The one tenant read, if one.
    pub tenant: Option<String>,
    /// The window's days (events).
    pub days: Vec<chrono::NaiveDate>,
    /// Days after the window's last that may hold its deliveries (created
    /// after their event) and attempts (retried until the deadline).
    pub deliveries_after: u64,
    /// See `deliveries_after`.
    pub attempts_after: u64,
}

/// Checks the archived days of the span, and reads the window's rows of
/// the dropped ones; rows of days still hot are counted by the hot stage.
pub async fn run<S: ObjectStore>(
    client: &tokio_postgres::Client,
    store: Option<&S>,
    span: &Span,
    findings: &mut Findings,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(Vec<ArchiveDay>, Archived), ReconcileError> {
    let mut archived = Archived::default();
    let (Some(first), Some(window_last)) = (span.days.first(), span.days.last()) else {
        return Ok((Vec::new(), archived));
    };
    let after = span.deliveries_after.max(span.attempts_after);
    let last = &(*window_last + chrono::Days::new(after));
    let last_of = |table: Table| {
        *window_last
            + chrono::Days::new(match table {
                Table::Events => 0,
                Table::Deliveries => span.deliveries_after,
                Table::Attempts => span.attempts_after,
            })
    };
    let rows = client
        .query(
            "SELECT table_name, day, generation, state, manifest_key, manifest_sha256, row_count, file_count \
             FROM walhook.archive_partitions \
             WHERE day >= $1 AND day <= $2 AND state IN ('written', 'verified', 'dropped') \
             ORDER BY table_name, day, generation",
            &[&NaiveDateSql(*first), &NaiveDateSql(*last)],
        )
        .await
        .map_err(ReconcileError::query("read the archive catalog"))?;
    let mut out = Vec::new();
    for r in rows {
        let name: String = r.get(0);
        let Some(table) = Table::parse(&name) else {
            continue;
        };
        let day = r.get::<_, NaiveDateSql>(1).0;
        if day > last_of(table) {
            continue;
        }
        let generation = r.get::<_, i32>(2) as u32;
        let state = PartitionState::stored(r.get(3), table, day, generation)
            .map_err(ReconcileError::Archive)?;
        let key: String = r.get(4);
        let sha: String = r.get(5);
        progress(&format!("{name} {day} (generation {generation})"));
        let mut checked = ArchiveDay {
            table: name.clone(),
            day: day.to_string(),
            generation,
            state: state.into(),
            rows: r.get::<_, i64>(6) as u64,
            files: r.get::<_, i32>(7) as u64,
            verified: false,
            problem: None,
        };
        let Some(store) = store else {
            checked.problem =
                Some("no archive store is configured, so its objects were not read".into());
            out.push(checked);
            continue;
        };
        let started = SystemTime::now();
        match walhook_archive::verify::verify(store, table, day, &key, &sha).await {
            Ok(manifest) => {
                checked.verified = true;
                // Hot rows gone: the window's rows are read from the parts.
                if state == PartitionState::Dropped {
                    crate::archived::read_day(
                        store,
                        table,
                        &manifest,
                        span.since,
                        span.until,
                        span.tenant.as_deref(),
                        &mut archived,
                    )
                    .await?;
                }
            }
            Err(ArchiveError::Verification {
                object,
                kind,
                problem,
                fix,
                ..
            }) => {
                let class = match kind {
                    VerificationKind::Missing => GapClass::ArchiveObjectMissing,
                    VerificationKind::Mismatch => GapClass::ArchiveMismatch,
                };
                let subject = format!("{name}/{day}/generation-{generation}");
                findings.gap(gap(
                    class,
                    &subject,
                    None,
                    format!(
                        "{name} of {day} (generation {generation}, {state}): {object}: {problem}. {}",
                        if state == PartitionState::Dropped {
                            "The hot rows are gone: restore the object from a copy (bucket versioning, a backup)"
                                .to_string()
                        } else {
                            fix
                        }
                    ),
                ));
                checked.problem = Some(format!("{object}: {problem}"));
                if state == PartitionState::Dropped {
                    archived.unread.push((table, day));
                }
            }
            Err(e) => return Err(ReconcileError::Archive(e)),
        }
        tracing::debug!(table = %name, %day, took = ?started.elapsed().unwrap_or_default(), "archived day checked");
        out.push(checked);
    }
    out.extend(failed_days(client, *first, *last).await?);
    Ok((out, archived))
}

/// Days of `first..=last` whose archiving failed and that no run has
/// archived since, with the incident's cause.
async fn failed_days(
    client: &tokio_postgres::Client,
    first: chrono::NaiveDate,
    last: chrono::NaiveDate,
) -> Result<Vec<ArchiveDay>, ReconcileError> {
    Ok(walhook_archive::failure::failed_days(client, first, last)
        .await
        .map_err(ReconcileError::Archive)?
        .into_iter()
        .map(|f| ArchiveDay {
            table: f.table.name().to_owned(),
            day: f.day.to_string(),
            generation: 0,
            state: ArchiveDayState::Failed,
            rows: 0,
            files: 0,
            verified: false,
            problem: Some(f.cause),
        })
        .collect())
}
