//! `walhook bench archive`: attempt rows archived per second and per core of
//! the archiver, and Parquet bytes per attempt, on a throwaway Postgres with
//! a local-directory store.

use std::time::Instant;

use anyhow::Context;
use walhook_archive::table::Table;
use walhook_archive::{Archiver, Outcome, PartitionReport, Progress, Settings};
use walhook_devkit::postgres::LocalPostgres;

use super::world::cpu_seconds;

/// Arguments of `walhook bench archive`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Attempt rows in the archived day.
    #[arg(long, default_value_t = 2_000_000)]
    pub rows: u64,
    /// Tenants the rows belong to.
    #[arg(long, default_value_t = 100)]
    pub tenants: u32,
    /// Endpoints the rows are spread over.
    #[arg(long, default_value_t = 400)]
    pub endpoints: u32,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn start(&self, _table: Table, _day: chrono::NaiveDate, rows: u64) {
        self.0.set_length(rows);
    }
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
}

/// Fills one past day of `walhook.attempts` with realistic rows (10 %
/// failures and retries, a few response digests), archives it, prints the
/// rates.
pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let pg = LocalPostgres::start().await?;
    let url = pg.create_database("walhook").await?;
    let mut sql = pg.connect("walhook").await?;
    walhook_sql::migrate::run(&mut sql).await?;
    let day = chrono::Utc::now().date_naive() - chrono::Duration::days(10);
    eprintln!("filling attempts of {day} with {} rows …", args.rows);
    let fill = Instant::now();
    sql.batch_execute(&format!(
        "SELECT walhook.ensure_day_partition('attempts', '{day}');
         INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger,
             endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome,
             error_class, response_sha256, response_excerpt)
         SELECT md5(i::text || 'attempt')::uuid,
                (lpad(to_hex(4294967296 + i / 4), 16, '0') || substr(md5(i::text), 1, 16))::uuid,
                ('00000000-0000-4000-8000-' || lpad(to_hex(i % {e}), 12, '0'))::uuid,
                'tenant-' || (i % {e}) % {t},
                CASE WHEN i % 10 = 0 THEN 2 ELSE 1 END, 'auto', 1,
                '{day}'::timestamptz + (i * 86000.0 / {n}) * interval '1 second',
                '{day}'::timestamptz + (i * 86000.0 / {n}) * interval '1 second' + ((5 + i % 37) * interval '1 ms'),
                CASE WHEN i % 10 = 0 THEN 503 ELSE 200 END, 5 + i % 37,
                CASE WHEN i % 10 = 0 THEN 'retryable' ELSE 'succeeded' END,
                CASE WHEN i % 10 = 0 THEN 'http_5xx' END,
                sha256(CASE WHEN i % 10 = 0 THEN 'busy' ELSE 'ok' END::bytea),
                CASE WHEN i % 10 = 0 THEN 'busy' END
         FROM generate_series(1, {n}) i;",
        e = args.endpoints.max(1),
        t = args.tenants.max(1),
        n = args.rows.max(1),
    ))
    .await
    .context("filling the attempts table")?;
    sql.batch_execute("VACUUM ANALYZE walhook.attempts")
        .await
        .context("vacuuming the attempts table")?;
    eprintln!(
        "filled in {:.1}s; archiving …",
        fill.elapsed().as_secs_f64()
    );
    let dir = tempfile::tempdir()?;
    let store = walhook_archive::objstore::LocalDirStore::open(dir.path())?;
    let settings = Settings {
        tables: vec![Table::Attempts],
        today: Some(day + chrono::Duration::days(5)),
        ..Settings::default()
    };
    let bar = walhook_cli::progress::bar(args.rows, "attempts archived");
    let (cpu0, pg0, _) = cpu_seconds();
    let started = Instant::now();
    let progress = Bar(bar.clone());
    let reports: Vec<PartitionReport> =
        walhook_cli::commands::archive::on_own_thread(move || async move {
            let platform = walhook_sql::Platform::new(&url, 4)?;
            let archiver = Archiver::new(platform, store, settings);
            Ok(archiver.run(&progress).await?)
        })?;
    let wall = started.elapsed().as_secs_f64();
    let (cpu1, pg1, _) = cpu_seconds();
    bar.finish_and_clear();
    let r = reports
        .iter()
        .find(|r| r.day == day)
        .context("the filled day was not archived")?;
    if r.outcome != Outcome::Archived {
        anyhow::bail!("the day was not archived: {:?}", r.outcome);
    }
    let own = cpu1 - cpu0;
    let pg_cpu = pg1 - pg0;
    let figures = serde_json::json!({
        "rows": r.rows,
        "files": r.files,
        "parquet_bytes": r.bytes,
        "bytes_per_attempt": r.bytes as f64 / r.rows as f64,
        "wall_seconds": wall,
        "rows_per_second": r.rows as f64 / wall,
        "archiver_cpu_seconds": own,
        "rows_per_archiver_core_second": r.rows as f64 / own.max(1e-9),
        "postgres_cpu_seconds": pg_cpu,
        "rows_per_core_second_all": r.rows as f64 / (own + pg_cpu).max(1e-9),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!(
            "archived {} attempt rows of {day} into {} parts, {} bytes",
            r.rows, r.files, r.bytes
        );
        println!(
            "  {:.1} bytes per attempt in Parquet",
            figures["bytes_per_attempt"].as_f64().unwrap_or(0.0)
        );
        println!(
            "  {:.0} rows/s wall; archiver {:.2} CPU-s = {:.0} rows per core-second; Postgres {:.2} CPU-s; both: {:.0} rows per core-second",
            r.rows as f64 / wall,
            own,
            r.rows as f64 / own.max(1e-9),
            pg_cpu,
            r.rows as f64 / (own + pg_cpu).max(1e-9)
        );
        println!("  (export, verification by reading every object back, and the partition drop)");
    }
    Ok(std::process::ExitCode::SUCCESS)
}
