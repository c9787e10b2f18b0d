//! A day that fails to archive is reported (the run's report, an open
//! incident, the `walhook_archive_failed_days` gauge, the failed days
//! reconciliation lists) and keeps its hot rows, while the later days and
//! the other tables are archived in the same run; once the row is fixed,
//! the next run archives the day and resolves the incident.
//!
//! The failure is a realistic one: an attempt whose `response_sha256` is
//! not a SHA-256 (20 bytes, as a SHA-1 written by an older tool or a hand
//! repair would be). Postgres stores any `bytea`; the exporter refuses a
//! digest column whose width is not 32 bytes.

use walhook_archive::failure::{FailedDay, failed_days};
use walhook_archive::objstore::LocalDirStore;
use walhook_archive::table::Table;
use walhook_archive::{Archiver, Outcome, PartitionReport, Settings};

use crate::support::{World, day, today};

fn outcome_of(reports: &[PartitionReport], table: Table, d: chrono::NaiveDate) -> &Outcome {
    &reports
        .iter()
        .find(|r| r.table == table && r.day == d)
        .unwrap_or_else(|| panic!("no report for {table} {d}: {reports:?}"))
        .outcome
}

async fn failed_days_of(w: &World, table: &str) -> i64 {
    w.platform
        .pipeline_gauges()
        .await
        .unwrap()
        .archive
        .into_iter()
        .find(|a| a.table == table)
        .unwrap()
        .failed_days
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_day_is_reported_and_later_days_and_other_tables_go_on() {
    let w = World::new().await;
    let dir = tempfile::tempdir().unwrap();
    for d in [day(1), day(2), day(3)] {
        w.attempts(d, 3).await;
    }
    for d in [day(1), day(2)] {
        w.events("acme", d, 0, 2, 100).await;
    }
    // One attempt of the first day carries a 20-byte digest.
    w.sql
        .execute(
            "UPDATE walhook.attempts SET response_sha256 = substring(response_sha256 FROM 1 FOR 20) \
             WHERE id = (SELECT id FROM walhook.attempts WHERE started_at < $1::text::timestamptz LIMIT 1)",
            &[&format!("{} 00:00:00+00", day(2))],
        )
        .await
        .unwrap();
    let archiver = Archiver::new(
        w.platform.clone(),
        LocalDirStore::open(dir.path()).unwrap(),
        Settings {
            today: Some(today()),
            ..Settings::default()
        },
    );

    let reports = archiver
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
    // The failed day: named with its table, day, column and cause.
    let Outcome::Failed(why) = outcome_of(&reports, Table::Attempts, day(1)) else {
        panic!("{reports:?}");
    };
    assert!(
        why.contains("column response_sha256 of attempts")
            && why.contains("20 bytes where a fixed width is expected"),
        "{why}"
    );
    // Later days of the table and the next table went on.
    for (table, d) in [
        (Table::Attempts, day(2)),
        (Table::Attempts, day(3)),
        (Table::Events, day(1)),
        (Table::Events, day(2)),
    ] {
        assert_eq!(
            outcome_of(&reports, table, d),
            &Outcome::Archived,
            "{table} {d}"
        );
    }
    assert_eq!(
        w.hot("attempts", day(1)).await,
        3,
        "the failed day kept its rows"
    );
    assert_eq!(w.hot("attempts", day(2)).await, 0);
    assert_eq!(w.hot("events", day(1)).await, 0);

    // An open incident says which day and why; the gauge counts it;
    // reconciliation's list has it.
    let incidents = w.platform.open_incidents().await.unwrap();
    let incident = incidents
        .iter()
        .find(|i| i.stage == "archive")
        .unwrap_or_else(|| panic!("{incidents:?}"));
    assert_eq!(incident.kind, "archive_day_failed");
    assert_eq!(incident.subject, format!("attempts/{}", day(1)));
    assert!(
        incident.detail.starts_with(&format!(
            "attempts of {} was not archived (its rows stay in Postgres)",
            day(1)
        )) && incident.detail.contains("response_sha256"),
        "{}",
        incident.detail
    );
    assert_eq!(failed_days_of(&w, "attempts").await, 1);
    assert_eq!(failed_days_of(&w, "events").await, 0);
    let listed = failed_days(&w.sql, day(1), day(3)).await.unwrap();
    assert_eq!(
        listed.iter().map(|f| (f.table, f.day)).collect::<Vec<_>>(),
        vec![(Table::Attempts, day(1))]
    );
    assert!(listed[0].cause.contains("response_sha256"));
    assert!(
        failed_days(&w.sql, day(2), day(3))
            .await
            .unwrap()
            .is_empty()
    );

    // A second failing run counts a second occurrence, not a second row.
    let reports = archiver
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
    assert!(matches!(
        outcome_of(&reports, Table::Attempts, day(1)),
        Outcome::Failed(_)
    ));
    let open = w.platform.open_incidents().await.unwrap();
    let archive: Vec<_> = open.iter().filter(|i| i.stage == "archive").collect();
    assert_eq!(archive.len(), 1, "{open:?}");
    assert_eq!(archive[0].occurrences, 2);

    // The row fixed, the next run archives the day and resolves it.
    w.sql
        .execute(
            "UPDATE walhook.attempts SET response_sha256 = sha256(response_sha256) \
             WHERE length(response_sha256) <> 32",
            &[],
        )
        .await
        .unwrap();
    let reports = archiver
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
    assert_eq!(
        outcome_of(&reports, Table::Attempts, day(1)),
        &Outcome::Archived
    );
    assert_eq!(w.hot("attempts", day(1)).await, 0);
    assert!(
        !w.platform
            .open_incidents()
            .await
            .unwrap()
            .iter()
            .any(|i| i.stage == "archive"),
        "the incident is still open"
    );
    assert_eq!(failed_days_of(&w, "attempts").await, 0);
    assert_eq!(
        failed_days(&w.sql, day(1), day(3)).await.unwrap(),
        Vec::<FailedDay>::new()
    );
}
