//! The capture ledger's Postgres store keeps the contract the in-memory
//! model keeps: sums per (rule, window), each part counted once, writers of
//! one source serialised on its mark.

use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::capture::ledger::contract;
use walhook_sql::Platform;

#[tokio::test]
async fn the_postgres_ledger_keeps_the_contract() {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let platform = Platform::new(&pg.url("postgres"), 4).unwrap();
    contract::check_all(&platform, |source| {
        let (platform, source) = (platform.clone(), source.to_owned());
        async move { Ok(platform.capture_ledger(&source).await?) }
    })
    .await
    .unwrap();
    // A fresh source's mark records when its ledger began.
    let started: bool = sql
        .query_one(
            "SELECT started_at <= now() AND part >= 0 FROM walhook.capture_ledger_marks WHERE source = 'sums'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(started);
}
