//! Migrations 0022–0024 on a database that already holds days of
//! deliveries, with writes going on: the table becomes partitioned by day
//! without losing or refusing a row, the old rows stay in one legacy
//! partition, the archive empties it day by day and drops it once empty,
//! and from then on every day has a partition of its own.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::Utc;
use walhook_archive::objstore::{AnyStore, LocalDirStore};
use walhook_archive::{Archiver, Outcome, Settings};
use walhook_devkit::postgres::LocalPostgres;
use walhook_sql::Platform;

use crate::support::history;

/// The last migration before deliveries were partitioned.
const BEFORE: i32 = 21;

/// A delivery made now by the writer (a succeeded one, with an id derived
/// as the table checks), prepared once: the statement outlives the
/// migration, as a running walhook's cached statements do.
const WRITE: &str = "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, \
       event_occurred_at, endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, \
       last_http_status) \
     SELECT (encode(substring(uuid_send(e) FROM 1 FOR 8) || substring(sha256( \
                '\\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8') \
                || '\\x0000000000000010'::bytea || uuid_send(e) \
                || '\\x0000000000000010'::bytea || uuid_send($1::uuid)) FROM 1 FOR 8), 'hex'))::uuid, \
            e, $1::uuid, $2::text, 'order.created', now(), 1, 'succeeded', 1, now(), now() + interval '1 day', 200 \
     FROM gen_random_uuid() e";

/// A state change of an existing delivery, as dispatch makes them.
const TOUCH: &str = "UPDATE walhook.deliveries SET attempt_count = attempt_count + 1 \
     WHERE id = (SELECT id FROM walhook.deliveries WHERE tenant_id = $1 ORDER BY id LIMIT 1)";

#[tokio::test]
async fn deliveries_become_partitioned_by_day_online_and_the_legacy_partition_empties_away() {
    let pg = LocalPostgres::start().await.unwrap();
    let url = pg.create_database("platform").await.unwrap();
    let mut sql = pg.connect("platform").await.unwrap();
    walhook_sql::migrate::run_until(&mut sql, BEFORE)
        .await
        .unwrap();

    // Four days of history as release 21 held it: one deliveries table
    // (its day partitions did not exist yet).
    let h = history(4, 300, 2, 2);
    sql.batch_execute(&h.setup_sql()).await.unwrap();
    for d in 0..h.days {
        let day = h
            .day_sql(d)
            .replace("'events', 'deliveries', 'attempts'", "'events', 'attempts'");
        sql.batch_execute(&day).await.unwrap();
    }
    let before: i64 = count(&sql, "SELECT count(*) FROM walhook.deliveries").await;
    assert_eq!(before, 4 * 300 * 2, "the history's deliveries");
    let endpoint: uuid::Uuid = sql
        .query_one(
            "SELECT id FROM walhook.endpoints WHERE tenant_id = 'tenant-0' LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // Traffic while the migrations run: new deliveries and state changes,
    // through statements prepared before.
    let writer = pg.connect("platform").await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn({
        let stop = stop.clone();
        async move {
            let write = writer.prepare(WRITE).await.unwrap();
            let touch = writer.prepare(TOUCH).await.unwrap();
            let (mut made, mut errors) = (0i64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match writer.execute(&write, &[&endpoint, &"tenant-0"]).await {
                    Ok(n) => made += n as i64,
                    Err(e) => errors.push(format!("insert: {e}")),
                }
                if let Err(e) = writer.execute(&touch, &[&"tenant-1"]).await {
                    errors.push(format!("update: {e}"));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (made, errors)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = walhook_sql::migrate::run(&mut sql).await.unwrap();
    // 22 to 24 move deliveries to daily partitions; later ones follow.
    assert_eq!(report.applied[..3], [22, 23, 24], "{:?}", report.applied);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (made, errors) = traffic.await.unwrap();
    assert!(
        errors.is_empty(),
        "writes refused during the migration: {errors:?}"
    );
    assert!(made > 0, "the writer wrote");

    let partitioned: bool = sql
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'walhook.deliveries'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(partitioned, "walhook.deliveries is partitioned");
    let legacy = count(&sql, "SELECT count(*) FROM walhook.deliveries_legacy").await;
    assert_eq!(
        legacy,
        before + made,
        "every row, old and new, is in the legacy partition"
    );
    assert_eq!(
        count(&sql, "SELECT count(*) FROM walhook.deliveries").await,
        before + made
    );
    // Today is covered by the legacy partition: no partition of its own.
    let own = today_partition(&sql).await;
    assert_eq!(own, None, "today's rows go to the legacy partition");

    // The archive, days later: every day of the legacy partition leaves
    // Postgres, and the emptied partition goes with the last one.
    let dir = tempfile::tempdir().unwrap();
    let store = AnyStore::Local(LocalDirStore::open(dir.path().join("archive")).unwrap());
    let platform = Platform::new(&url, 4).unwrap();
    let settings = Settings {
        hot_days: 1,
        today: Some(Utc::now().date_naive() + chrono::Duration::days(4)),
        ..Settings::default()
    };
    let reports = Archiver::new(platform.clone(), store, settings)
        .run(&walhook_archive::archiver::Silent)
        .await
        .unwrap();
    assert!(
        reports.iter().all(|r| r.outcome == Outcome::Archived),
        "{reports:#?}"
    );
    assert_eq!(
        count(&sql, "SELECT count(*) FROM walhook.deliveries").await,
        0
    );
    let gone: bool = sql
        .query_one(
            "SELECT to_regclass('walhook.deliveries_legacy') IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(gone, "the emptied legacy partition is dropped");
    assert_eq!(
        count(
            &sql,
            "SELECT coalesce(sum(row_count), 0)::int8 FROM walhook.archive_partitions \
             WHERE table_name = 'deliveries' AND state = 'dropped'"
        )
        .await,
        before + made,
        "every delivery is archived once"
    );

    // From now on a day gets its own partition, keyed on id.
    let own = today_partition(&sql).await;
    let own = own.expect("a partition of its own once the legacy partition is gone");
    let writer = pg.connect("platform").await.unwrap();
    writer
        .execute(WRITE, &[&endpoint, &"tenant-0"])
        .await
        .unwrap();
    assert_eq!(
        count(&sql, &format!("SELECT count(*) FROM walhook.{own}")).await,
        1
    );

    // A fresh install never has a legacy partition.
    pg.create_database("fresh").await.unwrap();
    let mut fresh = pg.connect("fresh").await.unwrap();
    walhook_sql::migrate::run(&mut fresh).await.unwrap();
    let none: bool = fresh
        .query_one(
            "SELECT to_regclass('walhook.deliveries_legacy') IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(none, "no legacy partition on a fresh install");
}

async fn count(sql: &tokio_postgres::Client, q: &str) -> i64 {
    sql.query_one(q, &[]).await.unwrap().get(0)
}

/// `ensure_day_partition` for today's deliveries: the partition's name, or
/// `None` while the legacy partition covers the day.
async fn today_partition(sql: &tokio_postgres::Client) -> Option<String> {
    sql.query_one(
        "SELECT walhook.ensure_day_partition('deliveries', (now() AT TIME ZONE 'UTC')::date)",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}
