//! `walhook bench reconcile`: a day-sized window of deliveries and attempts,
//! one day archived (Parquet, verified by reading every object back, the
//! window's rows read and judged like hot ones) and one day hot,
//! reconciled; rows read per second, stage by stage. `--archived-only`
//! reconciles the archived day alone.

use std::time::Instant;

use anyhow::Context;
use walhook_archive::{Archiver, Settings};
use walhook_devkit::postgres::LocalPostgres;
use walhook_reconcile::{Progress, Reconciler, Request, Window};

use super::world::cpu_seconds;

/// Arguments of `walhook bench reconcile`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Events per day (two days: one archived, one hot); each has one
    /// delivery per endpoint of its tenant.
    #[arg(long, default_value_t = 250_000)]
    pub events_per_day: u64,
    /// Tenants.
    #[arg(long, default_value_t = 50)]
    pub tenants: u32,
    /// Endpoints per tenant.
    #[arg(long, default_value_t = 4)]
    pub endpoints: u32,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
    /// Reconcile only the archived day (its rows read from Parquet).
    #[arg(long)]
    pub archived_only: bool,
}

/// A spinner that also notes when each stage began.
struct Bar(
    indicatif::ProgressBar,
    parking_lot::Mutex<Vec<(String, Instant)>>,
);

impl Progress for Bar {
    fn stage(&self, name: &str) {
        self.0.set_message(name.to_string());
        // Archived days are one stage, whatever day is being read.
        let name = name.split(':').next().unwrap_or(name).to_string();
        let mut stages = self.1.lock();
        if stages.last().is_none_or(|(last, _)| *last != name) {
            stages.push((name, Instant::now()));
        }
    }
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
}

/// Tenants, endpoints with their first version, a day of events with their
/// deliveries (10 % retried once) and attempts, and capture's ledger for
/// them, all consistent: a clean reconciliation.
fn fill_sql(day: chrono::NaiveDate, first: u64, args: &Args) -> String {
    let (n, t) = (args.events_per_day, args.tenants.max(1));
    format!(
        "SELECT walhook.ensure_day_partition(p, '{day}') FROM unnest(ARRAY['events', 'deliveries', 'attempts']) p;
         INSERT INTO walhook.events (id, tenant_id, event_type, schema_version, object_id, object_version,
             occurred_at, source, commit_lsn, tx_ordinal, payload, payload_sha256)
         SELECT md5('event' || i)::uuid, 'tenant-' || (i % {t}), 'order.created', 1, i::text, NULL,
                '{day}'::timestamptz + (i - {first}) * (86000.0 / {n}) * interval '1 second',
                'bench', ('0/' || to_hex(i * 256))::pg_lsn, 0,
                convert_to('{{\"id\":' || i || '}}', 'UTF8'), sha256(convert_to('{{\"id\":' || i || '}}', 'UTF8'))
         FROM generate_series({first}, {first} + {n} - 1) i;
         INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at,
             endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, created_at, updated_at,
             last_http_status)
         SELECT (encode(substring(uuid_send(ev.id) FROM 1 FOR 8) || substring(sha256(
                    '\\x0000000000000013'::bytea || convert_to('walhook.delivery.v2', 'UTF8')
                    || '\\x0000000000000010'::bytea || uuid_send(ev.id)
                    || '\\x0000000000000010'::bytea || uuid_send(ep.id)) FROM 1 FOR 8), 'hex'))::uuid,
                ev.id, ep.id, ev.tenant_id, ev.event_type, ev.occurred_at, 1, 'succeeded',
                CASE WHEN get_byte(uuid_send(ev.id), 15) % 10 = 0 THEN 2 ELSE 1 END,
                ev.occurred_at, ev.occurred_at + interval '1 day',
                ev.occurred_at + interval '50 ms', ev.occurred_at + interval '80 ms', 200
         FROM walhook.events ev JOIN walhook.endpoints ep ON ep.tenant_id = ev.tenant_id
         WHERE ev.occurred_at >= '{day}' AND ev.occurred_at < '{day}'::date + 1;
         INSERT INTO walhook.attempts (id, delivery_id, endpoint_id, tenant_id, number, trigger,
             endpoint_config_version, started_at, finished_at, http_status, latency_ms, outcome)
         SELECT md5(d.id::text || k)::uuid, d.id, d.endpoint_id, d.tenant_id, k, 'auto', 1,
                d.created_at + k * interval '10 ms', d.created_at + k * interval '10 ms' + interval '5 ms',
                CASE WHEN k < d.attempt_count THEN 503 ELSE 200 END, 5,
                CASE WHEN k < d.attempt_count THEN 'retryable' ELSE 'succeeded' END
         FROM walhook.deliveries d CROSS JOIN LATERAL generate_series(1, d.attempt_count) k
         WHERE d.created_at >= '{day}' AND d.created_at < '{day}'::date + 1;
         INSERT INTO walhook.capture_ledger (source, rule, window_start, changes, events, filtered, incidents,
             first_commit_lsn, last_commit_lsn)
         SELECT 'bench', 'order_created', date_trunc('minute', occurred_at), count(*), count(*), 0, 0,
                min(commit_lsn), max(commit_lsn)
         FROM walhook.events WHERE occurred_at >= '{day}' AND occurred_at < '{day}'::date + 1 GROUP BY 3;"
    )
}

/// Fills two days, archives the older, reconciles both, prints the rates.
pub async fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let pg = LocalPostgres::start().await?;
    let url = pg.create_database("walhook").await?;
    let mut sql = pg.connect("walhook").await?;
    walhook_sql::migrate::run(&mut sql).await?;
    let hot_day = chrono::Utc::now().date_naive() - chrono::Duration::days(1);
    let cold_day = hot_day - chrono::Duration::days(2);
    let (t, e) = (args.tenants.max(1), args.endpoints.max(1));
    eprintln!(
        "filling {cold_day} (to archive) and {hot_day} (hot): {} events a day, {t} tenants × {e} endpoints …",
        args.events_per_day
    );
    let fill = Instant::now();
    sql.batch_execute(&format!(
        "SET TIME ZONE 'UTC';
         INSERT INTO walhook.tenants (id, name) SELECT 'tenant-' || i, 'tenant ' || i FROM generate_series(0, {t} - 1) i;
         INSERT INTO walhook.endpoints (id, tenant_id, url, created_at)
         SELECT md5('endpoint' || i || '/' || j)::uuid, 'tenant-' || i, 'https://example.com/' || i || '/' || j,
                '{cold_day}'::timestamptz - interval '1 day'
         FROM generate_series(0, {t} - 1) i, generate_series(1, {e}) j;
         INSERT INTO walhook.endpoint_versions (endpoint_id, version, url, description, event_types, enabled,
             changed_at, changed_by)
         SELECT id, 1, url, '', '{{}}', true, created_at, 'bench' FROM walhook.endpoints;"
    ))
    .await
    .context("creating tenants and endpoints")?;
    sql.batch_execute(&format!(
        "SET TIME ZONE 'UTC'; {}",
        fill_sql(cold_day, 1, &args)
    ))
    .await
    .context("filling the day to archive")?;
    sql.batch_execute(&format!(
        "SET TIME ZONE 'UTC'; {}",
        fill_sql(hot_day, 1 + args.events_per_day, &args)
    ))
    .await
    .context("filling the hot day")?;
    sql.batch_execute("VACUUM ANALYZE walhook.events, walhook.deliveries, walhook.attempts")
        .await
        .context("vacuuming")?;
    let counts = sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                    (SELECT count(*) FROM walhook.attempts)",
            &[],
        )
        .await?;
    let (events, deliveries, attempts): (i64, i64, i64) =
        (counts.get(0), counts.get(1), counts.get(2));
    eprintln!(
        "filled {events} events, {deliveries} deliveries, {attempts} attempts in {:.1}s; archiving {cold_day} …",
        fill.elapsed().as_secs_f64()
    );
    let dir = tempfile::tempdir()?;
    let archive_dir = dir.path().to_path_buf();
    let archive_url = url.clone();
    let archived = Instant::now();
    walhook_cli::commands::archive::on_own_thread(move || async move {
        let platform = walhook_sql::Platform::new(&archive_url, 4)?;
        let store = walhook_archive::objstore::LocalDirStore::open(&archive_dir)?;
        let settings = Settings {
            hot_days: 1,
            today: Some(hot_day),
            ..Settings::default()
        };
        Archiver::new(platform, store, settings)
            .run(&walhook_archive::archiver::Silent)
            .await?;
        Ok(())
    })?;
    eprintln!(
        "archived in {:.1}s; reconciling [{cold_day}, {}) …",
        archived.elapsed().as_secs_f64(),
        if args.archived_only {
            cold_day
        } else {
            hot_day
        } + chrono::Duration::days(1)
    );

    let platform = walhook_sql::Platform::new(&url, 4)?;
    let store = walhook_archive::objstore::LocalDirStore::open(dir.path())?;
    let reconciler = Reconciler::new(
        platform,
        Some(store),
        walhook_reconcile::Settings::default(),
    );
    let since = cold_day.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let last = if args.archived_only {
        cold_day
    } else {
        hot_day
    };
    let until = (last + chrono::Duration::days(1))
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc();
    let request = Request {
        window: Window {
            since: since.into(),
            until: until.into(),
        },
        tenant: None,
        repair: false,
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg:<40} {pos} rows ({per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let (cpu0, pg0, _) = cpu_seconds();
    let started = Instant::now();
    let progress = Bar(bar.clone(), parking_lot::Mutex::new(Vec::new()));
    let report = reconciler.run(&request, &progress).await?;
    let wall = started.elapsed().as_secs_f64();
    let ended = Instant::now();
    let stages: Vec<(String, f64)> = {
        let marks = progress.1.lock();
        marks
            .iter()
            .enumerate()
            .map(|(i, (name, at))| {
                let next = marks.get(i + 1).map_or(ended, |(_, t)| *t);
                (name.clone(), (next - *at).as_secs_f64())
            })
            .collect()
    };
    let (cpu1, pg1, _) = cpu_seconds();
    bar.finish_and_clear();
    let f = &report.funnel;
    let hot_rows = f.events - f.events_archived + f.materialised_deliveries - f.deliveries_archived
        + f.attempts_hot;
    let cold_rows = f.events_archived + f.deliveries_archived + f.attempts_archived;
    let rows = hot_rows + cold_rows;
    let figures = serde_json::json!({
        "events": f.events,
        "events_archived": f.events_archived,
        "deliveries_hot": f.materialised_deliveries - f.deliveries_archived,
        "deliveries_archived": f.deliveries_archived,
        "attempts_hot": f.attempts_hot,
        "attempts_archived": f.attempts_archived,
        "rows": rows,
        "wall_seconds": wall,
        "rows_per_second": rows as f64 / wall,
        "reconciler_cpu_seconds": cpu1 - cpu0,
        "postgres_cpu_seconds": pg1 - pg0,
        "clean": report.clean,
        "gaps": report.open_gaps(),
        "stage_seconds": stages.iter().map(|(n, s)| (n.clone(), serde_json::json!(s))).collect::<serde_json::Map<_, _>>(),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&figures)?);
    } else {
        println!(
            "reconciled {rows} rows in {wall:.1}s = {:.0} rows/s ({})",
            rows as f64 / wall,
            if report.clean {
                "clean".to_string()
            } else {
                format!("{} gaps", report.open_gaps())
            }
        );
        println!(
            "  hot: {} events, {} deliveries, {} attempts; archived (objects verified, the window's rows read from Parquet): {} events, {} deliveries, {} attempts",
            f.events - f.events_archived,
            f.materialised_deliveries - f.deliveries_archived,
            f.attempts_hot,
            f.events_archived,
            f.deliveries_archived,
            f.attempts_archived
        );
        let split: Vec<String> = stages.iter().map(|(n, s)| format!("{n} {s:.2}s")).collect();
        println!("  stages: {}", split.join(", "));
        println!(
            "  reconciler {:.2} CPU-s, Postgres {}",
            cpu1 - cpu0,
            if pg1 >= pg0 {
                format!("{:.2} CPU-s", pg1 - pg0)
            } else {
                "CPU not measurable (a Postgres process ended meanwhile)".to_string()
            }
        );
    }
    Ok(if report.clean {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("{}", walhook_reconcile::text::summary(&report));
        std::process::ExitCode::from(walhook_cli::commands::reconcile::EXIT_GAPS)
    })
}
