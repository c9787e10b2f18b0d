//! `walhook run`'s archive schedule with an injected calendar: rounds run
//! on their own at `every`, archive the due days, and retention deletes
//! the objects of archived (verified and dropped) days past
//! `retention_days` only: not younger days, not a day whose archive never
//! verified.

use std::sync::Mutex;
use std::time::Duration;

use chrono::NaiveDate;
use walhook_archive::objstore::{AnyStore, LocalDirStore};
use walhook_archive::schedule::{Clock, Round, run_every};
use walhook_archive::{Outcome, Settings};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use crate::support::{first_day, history};

/// Hands each round the next date of a list (the last one after that).
struct Calendar(Mutex<Vec<NaiveDate>>);

impl Clock for Calendar {
    fn today(&self) -> NaiveDate {
        let mut dates = self.0.lock().unwrap();
        if dates.len() > 1 {
            dates.remove(0)
        } else {
            dates[0]
        }
    }
}

fn date(s: &str) -> NaiveDate {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_rounds_archive_and_retention_deletes_only_dropped_days_past_the_limit() {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("platform").await.unwrap();
    let mut sql = pg.connect("platform").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let h = history(4, 20, 2, 1);
    sql.batch_execute(&h.setup_sql()).await.unwrap();
    for d in 0..4 {
        sql.batch_execute(&h.day_sql(d)).await.unwrap();
    }
    assert_eq!(first_day(), date("2026-03-01"));
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::Local(LocalDirStore::open(dir.path().join("archive")).unwrap());
    // A day far past the limit whose archive was written but never
    // verified (its manifest does not match what the catalog recorded):
    // retention must leave it.
    let stuck = "table=attempts/date=2026-02-01/_manifest.json";
    store
        .put(stuck, bytes::Bytes::from_static(b"{}"))
        .await
        .unwrap();
    sql.execute(
        "INSERT INTO walhook.archive_partitions (table_name, day, generation, state, manifest_key, \
         manifest_sha256, row_count, byte_count, file_count, store, written_at) \
         VALUES ('attempts', '2026-02-01', 0, 'written', $1, $2, 1, 1, 1, 'test', now())",
        &[&stuck, &"00".repeat(32)],
    )
    .await
    .unwrap();

    // Round 1 on 6 March: every day is due, none is past 10 days of
    // retention. Round 2 on 13 March: 1 and 2 March are.
    let calendar = Calendar(Mutex::new(vec![date("2026-03-06"), date("2026-03-13")]));
    let settings = Settings {
        hot_days: 1,
        retention_days: Some(10),
        ..Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut stop = Some(stop);
    let mut rounds: Vec<Vec<walhook_archive::PartitionReport>> = Vec::new();
    let open_store = store.clone();
    run_every(
        Duration::from_millis(50),
        settings,
        Platform::new(&url, 4).unwrap(),
        || {
            let s = open_store.clone();
            async move { Ok::<_, String>(s) }
        },
        &calendar,
        async {
            let _ = stopped.await;
        },
        |round| {
            match round {
                Round::Ran(reports) => rounds.push(reports),
                other => panic!("a round did not run: {other:?}"),
            }
            if rounds.len() == 2 {
                let _ = stop.take().map(|s| s.send(()));
            }
        },
    )
    .await;

    let outcome =
        |round: &Vec<walhook_archive::PartitionReport>, day: &str, o: &dyn Fn(&Outcome) -> bool| {
            round
                .iter()
                .filter(|r| r.day == date(day))
                .all(|r| o(&r.outcome))
                && round.iter().any(|r| r.day == date(day))
        };
    for day in ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04"] {
        assert!(
            outcome(&rounds[0], day, &|o| *o == Outcome::Archived),
            "{day}: {:#?}",
            rounds[0]
        );
    }
    assert!(
        outcome(&rounds[0], "2026-02-01", &|o| matches!(
            o,
            Outcome::Failed(_)
        )),
        "{:#?}",
        rounds[0]
    );
    assert!(
        rounds[0].iter().all(|r| r.outcome != Outcome::Expired),
        "nothing is past the limit on 6 March: {:#?}",
        rounds[0]
    );
    let expired: Vec<(String, NaiveDate)> = rounds[1]
        .iter()
        .filter(|r| r.outcome == Outcome::Expired)
        .map(|r| (r.table.to_string(), r.day))
        .collect();
    let mut want = Vec::new();
    for day in ["2026-03-01", "2026-03-02"] {
        for t in ["attempts", "deliveries", "events"] {
            want.push((t.to_string(), date(day)));
        }
    }
    let mut got = expired.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "{:#?}", rounds[1]);

    let keys: Vec<String> = store
        .list("table=")
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.key)
        .collect();
    for t in ["attempts", "deliveries", "events"] {
        for day in ["2026-03-01", "2026-03-02"] {
            let prefix = format!("table={t}/date={day}/");
            assert!(
                !keys.iter().any(|k| k.starts_with(&prefix)),
                "{prefix} left: {keys:?}"
            );
        }
        for day in ["2026-03-03", "2026-03-04"] {
            let prefix = format!("table={t}/date={day}/");
            assert!(
                keys.iter()
                    .any(|k| k.starts_with(&prefix) && k.ends_with(".parquet")),
                "{prefix} kept: {keys:?}"
            );
        }
    }
    assert!(
        keys.iter().any(|k| k == stuck),
        "the unverified day's objects stay"
    );
    let states: Vec<(String, String)> = sql
        .query(
            "SELECT day::text, state FROM walhook.archive_partitions ORDER BY day, table_name",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (day, state) in &states {
        let want = match day.as_str() {
            "2026-02-01" => "written",
            "2026-03-01" | "2026-03-02" => "expired",
            _ => "dropped",
        };
        assert_eq!(state, want, "{day}: {states:?}");
    }
}
