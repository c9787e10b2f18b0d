//! Postgres storms: what an operator's or a neighbour's mistake does to the
//! platform database while walhook streams.
//!
//! walhook reaches its platform database as a role of its own
//! ([`APP_ROLE`], not a superuser), so that the limits below bind it the
//! way they bind a production deployment.

use std::time::{Duration, Instant};

use walhook_devkit::postgres::{LocalPostgres, connect_retrying};

/// The role walhook uses for the platform database in `walhook chaos`.
pub const APP_ROLE: &str = "walhook_app";

/// Creates [`APP_ROLE`] and hands it the platform database, before the
/// migrations run as that role.
pub async fn create_app_role(pg: &LocalPostgres, database: &str) -> anyhow::Result<()> {
    let admin = pg.connect("postgres").await?;
    admin
        .batch_execute(&format!(
            "CREATE ROLE {APP_ROLE} LOGIN; ALTER DATABASE {database} OWNER TO {APP_ROLE};"
        ))
        .await?;
    Ok(())
}

/// A connection-limit storm: the role may open no session for `hold`
/// (`ALTER ROLE … CONNECTION LIMIT 0`, Postgres answers `53300
/// too_many_connections` to every new one) and every session it has is
/// ended at the start, so that walhook must reconnect into the refusal.
/// Returns what was done, for the report.
pub async fn connection_limit(pg_url: &str, hold: Duration) -> anyhow::Result<String> {
    let admin = connect_retrying(pg_url, Duration::from_secs(30)).await?;
    admin
        .batch_execute(&format!("ALTER ROLE {APP_ROLE} CONNECTION LIMIT 0"))
        .await?;
    let ended: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = $1",
            &[&APP_ROLE],
        )
        .await?
        .get(0);
    tokio::time::sleep(hold).await;
    // The limit must come off whatever happened meanwhile.
    let admin = connect_retrying(pg_url, Duration::from_secs(30)).await?;
    admin
        .batch_execute(&format!("ALTER ROLE {APP_ROLE} CONNECTION LIMIT -1"))
        .await?;
    Ok(format!(
        "connection limit 0 for {} s, {ended} sessions ended",
        hold.as_secs_f64()
    ))
}

/// A statement-cancel storm: for `hold`, every 2 ms, each statement the
/// role is running is cancelled (`pg_cancel_backend`: the same `57014
/// query_canceled` that a too-short `statement_timeout` raises, without
/// depending on which settings a session picked up). Returns what was done.
pub async fn cancel_storm(pg_url: &str, hold: Duration) -> anyhow::Result<String> {
    let admin = connect_retrying(pg_url, Duration::from_secs(30)).await?;
    let until = Instant::now() + hold;
    let mut cancelled = 0i64;
    while Instant::now() < until {
        let row = admin
            .query_one(
                "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity \
                 WHERE usename = $1 AND state = 'active' AND pid <> pg_backend_pid()",
                &[&APP_ROLE],
            )
            .await?;
        cancelled += row.get::<_, i64>(0);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(format!(
        "{cancelled} statements cancelled over {} s",
        hold.as_secs_f64()
    ))
}
