//! The day partitions of the hot tables against a real cluster: autovacuum
//! leaves their inserts alone (migration 0027) and still analyzes them,
//! on partitions made before the migration and after it.

use std::time::{Duration, Instant};

use walhook_devkit::postgres::LocalPostgres;

/// The hot tables cut into day partitions.
const PARENTS: [&str; 3] = ["events", "deliveries", "attempts"];

/// `ensure_day_partition` for each of [`PARENTS`], `days` after today (UTC).
async fn make_day(sql: &tokio_postgres::Client, days: i32) -> Vec<String> {
    let mut names = Vec::new();
    for parent in PARENTS {
        let row = sql
            .query_one(
                "SELECT walhook.ensure_day_partition($1, (now() AT TIME ZONE 'UTC')::date + $2::int4)",
                &[&parent, &days],
            )
            .await
            .unwrap();
        names.push(row.get(0));
    }
    names
}

/// The storage parameters of `walhook.<name>`.
async fn options(sql: &tokio_postgres::Client, name: &str) -> Vec<String> {
    sql.query_one(
        "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = to_regclass('walhook.' || $1)",
        &[&name],
    )
    .await
    .unwrap()
    .get(0)
}

fn has_the_settings(name: &str, options: &[String]) {
    assert!(
        options
            .iter()
            .any(|o| o == "autovacuum_vacuum_insert_threshold=-1"),
        "{name}: {options:?}"
    );
    if name.starts_with("deliveries_") {
        // The room for a state change to stay in its page (0024) is kept.
        assert!(
            options.iter().any(|o| o == "fillfactor=80"),
            "{name}: {options:?}"
        );
    }
}

#[tokio::test]
async fn day_partitions_before_and_after_the_migration_skip_insert_triggered_vacuums() {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run_until(&mut sql, 26).await.unwrap();
    let before = make_day(&sql, 0).await;
    for name in &before {
        let opts = options(&sql, name).await;
        assert!(
            !opts.iter().any(|o| o.starts_with("autovacuum")),
            "{name} before 0027: {opts:?}"
        );
    }
    let report = walhook_sql::migrate::run(&mut sql).await.unwrap();
    assert_eq!(report.applied.first(), Some(&27));
    for name in &before {
        has_the_settings(name, &options(&sql, name).await);
    }
    for name in make_day(&sql, 1).await {
        has_the_settings(&name, &options(&sql, &name).await);
    }
}

/// Autovacuum itself, on a short nap: a plain table given the same rows is
/// vacuumed for its inserts, the day partition is analyzed but not
/// vacuumed. Fails if the setting were ignored or meant "the default".
#[tokio::test]
async fn autovacuum_analyzes_a_day_partition_but_does_not_vacuum_it_for_inserts() {
    let pg = LocalPostgres::builder()
        .setting("autovacuum_naptime", "1s")
        .start()
        .await
        .unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let day = make_day(&sql, 0).await;
    let attempts = day.iter().find(|n| n.starts_with("attempts_")).unwrap();
    sql.batch_execute(&format!(
        "CREATE TABLE walhook.control (LIKE walhook.{attempts});
         INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger,
                endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome)
         SELECT gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'acme', 1, 'auto', 1,
                now(), now(), 200, 5, 'succeeded'
         FROM generate_series(1, 20000);
         INSERT INTO walhook.control SELECT * FROM walhook.{attempts};"
    ))
    .await
    .unwrap();
    let seen = |table: &str| {
        format!(
            "SELECT coalesce(autovacuum_count, 0), coalesce(autoanalyze_count, 0) \
             FROM pg_stat_user_tables WHERE schemaname = 'walhook' AND relname = '{table}'"
        )
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let control = sql.query_one(&seen("control"), &[]).await.unwrap();
        let day = sql.query_one(&seen(attempts), &[]).await.unwrap();
        let (control_vacuums, day_vacuums, day_analyzes): (i64, i64, i64) =
            (control.get(0), day.get(0), day.get(1));
        if control_vacuums > 0 && day_analyzes > 0 {
            assert_eq!(day_vacuums, 0, "{attempts} was vacuumed for its inserts");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "autovacuum did not come: control vacuumed {control_vacuums} times, \
             {attempts} analyzed {day_analyzes} times"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The archive's gauges over the day partitions, read as a scrape reads
/// them: the oldest hot day, and how near each table's partitions are to
/// their anti-wraparound vacuum, measured against the effective
/// `autovacuum_freeze_max_age` (a partition's own value counts only when
/// lower than the cluster's, as in Postgres).
#[tokio::test]
async fn the_archive_gauges_read_the_oldest_day_and_the_freeze_horizon_of_each_table() {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let three_days_ago = make_day(&sql, -3).await;
    let today = make_day(&sql, 0).await;
    let named = |names: &[String], parent: &str| {
        names
            .iter()
            .find(|n| n.starts_with(&format!("{parent}_")))
            .unwrap()
            .clone()
    };
    // Today's attempts: a lower limit of its own (the least Postgres
    // accepts); both days of events: a higher one, which Postgres ignores.
    sql.batch_execute(&format!(
        "ALTER TABLE walhook.{} SET (autovacuum_freeze_max_age = 100000);
         ALTER TABLE walhook.{} SET (autovacuum_freeze_max_age = 1000000000);
         ALTER TABLE walhook.{} SET (autovacuum_freeze_max_age = 1000000000);",
        named(&today, "attempts"),
        named(&three_days_ago, "events"),
        named(&today, "events"),
    ))
    .await
    .unwrap();
    for _ in 0..300 {
        sql.query_one("SELECT txid_current()", &[]).await.unwrap();
    }
    let cluster: f64 = sql
        .query_one(
            "SELECT current_setting('autovacuum_freeze_max_age')::float8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let platform = walhook_sql::Platform::new(&pg.url("postgres"), 2).unwrap();
    let gauges = platform.pipeline_gauges().await.unwrap();
    let table = |name: &str| {
        gauges
            .archive
            .iter()
            .find(|a| a.table == name)
            .unwrap_or_else(|| panic!("no gauges for {name}: {:?}", gauges.archive))
            .clone()
    };
    let (events, attempts) = (table("events"), table("attempts"));
    for t in [&events, &attempts] {
        assert!(t.xid_age >= 300, "{t:?}");
        assert!(
            (3.0 * 86_400.0..4.0 * 86_400.0).contains(&t.oldest_hot_age_secs),
            "the oldest hot day began three days ago (UTC midnight): {t:?}"
        );
    }
    // 300 and more transactions of the 100,000 the partition allows itself.
    assert!(
        (0.003..0.05).contains(&attempts.freeze_progress),
        "{attempts:?}"
    );
    // Against the cluster's limit: the partition's larger one is ignored.
    let expected = events.xid_age as f64 / cluster;
    assert!(
        (events.freeze_progress - expected).abs() < expected * 0.1,
        "{events:?}: expected about {expected} of the cluster's {cluster}"
    );
}
