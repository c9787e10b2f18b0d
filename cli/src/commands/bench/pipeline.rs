//! `walhook bench pipeline`: the whole path under a steady load.
//!
//! Writers commit orders at a target rate for a duration; each order is one
//! event for one tenant with N endpoints (4 by default) on a local receiver
//! that answers 200 at once. Postgres, the receiver and walhook share the
//! machine, as in the design's sizing. Reported: events/s, deliveries/s and
//! attempts/s over the run, commit→first-attempt latency percentiles (from
//! the platform tables: attempt start − event commit time), the slot's
//! largest lag, walhook's peak RSS, and how long the backlog took to drain
//! after the writers stopped.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use walhook_devkit::postgres::LocalPostgres;
use walhook_devkit::receiver::Receiver;
use walhook_pipeline::ids::TenantId;
use walhook_sql::Platform;
use walhook_sql::endpoints::NewEndpoint;

use crate::config::Config;

/// Arguments of `walhook bench pipeline`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Orders (events) committed per second.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// How long the writers run.
    #[arg(long, default_value = "60s", value_parser = walhook_pipeline::duration::parse)]
    pub duration: Duration,
    /// Endpoints per event.
    #[arg(long, default_value_t = 4)]
    pub endpoints: u32,
    /// Orders per business transaction.
    #[arg(long, default_value_t = 10)]
    pub batch: u64,
    /// Writer connections.
    #[arg(long, default_value_t = 4)]
    pub writers: u64,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
}

const SCHEMA: &str =
    "CREATE TABLE orders (id bigint PRIMARY KEY, tenant_id text NOT NULL, status text NOT NULL,
                       total numeric(12,2) NOT NULL, placed_at timestamptz NOT NULL DEFAULT now())";

const RULES: &str = r#"
[[rules]]
name = "order_created"
table = "orders"
operations = ["insert"]
event_type = "order.created"
tenant_column = "tenant_id"
object_id_column = "id"
object_version = "lsn"
"#;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let pg = LocalPostgres::start().await?;
    let shop_url = pg.create_database("shop").await?;
    let platform_url = pg.create_database("walhook").await?;
    let shop = pg.connect("shop").await?;
    shop.batch_execute(SCHEMA).await?;
    let mut platform_sql = pg.connect("walhook").await?;
    walhook_sql::migrate::run(&mut platform_sql).await?;
    // The database lives and dies with this process: so does its key.
    let platform =
        Platform::new(&platform_url, 16)?.with_keyring(walhook_sql::Keyring::ephemeral());
    let receiver = Receiver::start_counting().await?;
    let tenant = TenantId::new("bench")?;
    platform.create_tenant(&tenant, "bench").await?;
    for i in 0..args.endpoints {
        platform
            .create_endpoint(
                &NewEndpoint {
                    tenant_id: tenant.clone(),
                    url: receiver.url(&format!("ep{i}")),
                    event_types: vec![],
                    description: String::new(),
                    rate_limit_per_sec: None,
                    max_in_flight: Some(64),
                    enabled: true,
                },
                "bench",
            )
            .await?;
    }
    let cfg = Config::parse(&format!(
        "[platform]\nurl = \"{platform_url}\"\nmax_connections = 16\n\n[source]\nurl = \"{shop_url}\"\n\
         create_slot = true\ncreate_publication = true\nstatus_interval = \"200ms\"\n\n\
         [egress]\nallow_http_loopback = true\n\n[dispatch]\nmax_in_flight = 512\n\n[fanout]\nbatch_size = 1000\n{RULES}"
    ))?;
    let shutdown = CancellationToken::new();
    let running = crate::pipeline::start(&cfg, platform.clone(), shutdown.clone()).await?;

    // Slot lag sampler.
    let max_lag = Arc::new(AtomicI64::new(0));
    let sampler_stop = CancellationToken::new();
    {
        let max_lag = max_lag.clone();
        let stop = sampler_stop.clone();
        let sampler = pg.connect("shop").await?;
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(row) = sampler
                    .query_one("SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)::int8 FROM pg_replication_slots", &[])
                    .await
                {
                    max_lag.fetch_max(row.get(0), Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    // Writers: each commits `batch` orders per transaction at its share of the rate.
    let written = Arc::new(AtomicU64::new(0));
    let write_stop = CancellationToken::new();
    let mut writers = Vec::new();
    let per_writer_tx_rate = (args.rate as f64 / args.batch as f64 / args.writers as f64).max(0.01);
    for w in 0..args.writers {
        let client = pg.connect("shop").await?;
        let stop = write_stop.clone();
        let written = written.clone();
        let batch = args.batch as i64;
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / per_writer_tx_rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut next: i64 = (w as i64) << 40;
            let insert = client
                .prepare("INSERT INTO orders (id, tenant_id, status, total) SELECT g, 'bench', 'placed', (g % 1000) + 0.5 FROM generate_series($1::int8, $2::int8) g")
                .await?;
            while !stop.is_cancelled() {
                tick.tick().await;
                client.execute(&insert, &[&next, &(next + batch - 1)]).await?;
                next += batch;
                written.fetch_add(batch as u64, Ordering::Relaxed);
            }
            Ok::<(), tokio_postgres::Error>(())
        }));
    }
    let total_expected = args.rate * args.duration.as_secs();
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        super::progress(total_expected, "events committed")
    };
    let started = Instant::now();
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        bar.set_position(written.load(Ordering::Relaxed));
        bar.set_message(format!("{} webhooks", receiver.count()));
    }
    write_stop.cancel();
    for w in writers {
        w.await
            .context("a writer panicked")?
            .context("a writer failed")?;
    }
    let write_secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let events = written.load(Ordering::Relaxed);
    let deliveries_expected = events * u64::from(args.endpoints);

    // Drain: until every delivery succeeded (or 5 minutes).
    let drain_start = Instant::now();
    loop {
        let done: i64 = platform_sql
            .query_one(
                "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
                &[],
            )
            .await?
            .get(0);
        if done as u64 >= deliveries_expected || drain_start.elapsed() > Duration::from_secs(300) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let total_secs = started.elapsed().as_secs_f64();
    sampler_stop.cancel();
    shutdown.cancel();
    running.wait().await?;

    let row = platform_sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                    (SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'), (SELECT count(*) FROM walhook.attempts)",
            &[],
        )
        .await?;
    let (ev, del, ok, att): (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    let lat = platform_sql
        .query_one(
            "SELECT percentile_disc(ARRAY[0.5, 0.99, 0.999]) WITHIN GROUP (ORDER BY (extract(epoch FROM a.started_at - e.occurred_at) * 1000)::float8) \
             FROM walhook.attempts a JOIN walhook.deliveries d ON d.id = a.delivery_id \
             JOIN walhook.events e ON e.id = d.event_id AND e.occurred_at = d.event_occurred_at WHERE a.number = 1",
            &[],
        )
        .await?;
    let pct: Vec<f64> = lat.get::<_, Option<Vec<f64>>>(0).unwrap_or_default();
    let p = |i: usize| pct.get(i).copied().unwrap_or(f64::NAN);
    let result = serde_json::json!({
        "scenario": "pipeline",
        "target_events_per_second": args.rate,
        "endpoints_per_event": args.endpoints,
        "write_seconds": write_secs,
        "drain_seconds_after_writes": drain_secs,
        "events": ev,
        "deliveries": del,
        "deliveries_succeeded": ok,
        "attempts": att,
        "events_per_second": ev as f64 / write_secs,
        "deliveries_per_second_sustained": ok as f64 / total_secs,
        "attempts_per_second": att as f64 / total_secs,
        "first_attempt_latency_ms": { "p50": p(0), "p99": p(1), "p99_9": p(2) },
        "slot_max_lag_bytes": max_lag.load(Ordering::Relaxed),
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
        "note": "Postgres, receivers, load writers and walhook share this machine; RSS is this process (walhook + receiver + writers)",
    });
    if !args.json {
        println!(
            "pipeline benchmark: {} events/s target × {} endpoints for {:.0} s",
            args.rate, args.endpoints, write_secs
        );
        println!(
            "  events committed          {ev:>10}  ({:.0}/s)",
            ev as f64 / write_secs
        );
        println!("  deliveries made           {del:>10}");
        println!(
            "  deliveries succeeded      {ok:>10}  ({:.0}/s over {:.1} s incl. drain {:.1} s)",
            ok as f64 / total_secs,
            total_secs,
            drain_secs
        );
        println!(
            "  attempts                  {att:>10}  ({:.0}/s)",
            att as f64 / total_secs
        );
        println!(
            "  commit→first attempt      p50 {:.0} ms   p99 {:.0} ms   p99.9 {:.0} ms",
            p(0),
            p(1),
            p(2)
        );
        println!(
            "  slot max lag              {:>10} bytes",
            max_lag.load(Ordering::Relaxed)
        );
        println!(
            "  peak RSS                  {:>10.0} MiB",
            peak_rss_kib() as f64 / 1024.0
        );
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(if ok as u64 == deliveries_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
