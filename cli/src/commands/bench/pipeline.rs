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
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::world::{World, build_commit, cpu_seconds, peak_rss_kib, process_cpu_seconds};
use crate::pipeline::Running;

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
    pub batch: i64,
    /// Writer connections.
    #[arg(long, default_value_t = 4)]
    pub writers: u64,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
    /// First find the highest rate this machine sustains, then run
    /// `--duration` at it. The search starts at `--rate` on a cluster of its
    /// own, in 20 s steps 15 % apart (up while a step keeps up, down while
    /// it does not); a step keeps up when its backlog drains within 1 s of
    /// the writers stopping and its p99 commit→first attempt is within
    /// `--p99-budget`.
    #[arg(long)]
    pub find_rate: bool,
    /// The p99 commit→first-attempt latency a step of `--find-rate` may
    /// reach and still count as sustained.
    #[arg(long, default_value = "1s", value_parser = walhook_pipeline::duration::parse)]
    pub p99_budget: Duration,
    /// Serve the REST API in the same process during the run (as
    /// `walhook run` with `[api]` does).
    #[arg(long)]
    pub api: bool,
    /// While the writers run, send this many unauthenticated requests per
    /// second to the API (`/metrics`, `/readyz`, unknown keys) from 32
    /// loopback connections; implies `--api`. Compare the p99 with a run
    /// with `--api` alone.
    #[arg(long, default_value_t = 0)]
    pub api_flood: u64,
    /// Load `pg_stat_statements` and report the statements that took the
    /// most Postgres time (µs per row), and each platform table's scans,
    /// inserts, updates (HOT or not) and deletes.
    #[arg(long)]
    pub statements: bool,
}

/// The dispatch and fan-out settings every run of this benchmark uses.
const SETTINGS: &str = "[dispatch]\nmax_in_flight = 512\n\n[fanout]\nbatch_size = 1000\n";

/// A throwaway cluster with the tenant's endpoints, and every stage running
/// (with the API when asked for: its port is returned).
async fn start(args: &Args) -> anyhow::Result<(World, CancellationToken, Running, Option<u16>)> {
    let world = if args.statements {
        World::start_with(&[
            ("shared_preload_libraries", "'pg_stat_statements'"),
            ("pg_stat_statements.track", "all"),
        ])
        .await?
    } else {
        World::start().await?
    };
    world.endpoints("bench", args.endpoints, 64).await?;
    let shutdown = CancellationToken::new();
    if args.api || args.api_flood > 0 {
        let (running, port) = world.run_with_api(SETTINGS, shutdown.clone()).await?;
        return Ok((world, shutdown, running, Some(port)));
    }
    let running = world.run("", SETTINGS, shutdown.clone()).await?;
    Ok((world, shutdown, running, None))
}

/// Runs the benchmark.
pub async fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    if args.find_rate {
        args.rate = find_rate(&args).await?;
    }
    let (world, shutdown, running, api_port) = start(&args).await?;

    // Slot lag sampler.
    let max_lag = Arc::new(AtomicI64::new(0));
    let sampler_stop = CancellationToken::new();
    {
        let max_lag = max_lag.clone();
        let stop = sampler_stop.clone();
        let sampler = world.pg.connect("shop").await?;
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

    let wal_start = world.wal().await?;
    let receiver_pid = world.receiver.pid();
    let receiver_cpu = || receiver_pid.map_or(0.0, process_cpu_seconds);
    let receiver_start = receiver_cpu();
    let (written, write_stop, writers) = world
        .writers("bench", 0, args.rate as f64, args.batch, args.writers)
        .await?;
    let flood_stop = CancellationToken::new();
    let flood = match (api_port, args.api_flood) {
        (Some(port), rate) if rate > 0 => {
            Some(super::flood::start(port, rate, 32, flood_stop.clone()))
        }
        _ => None,
    };
    let total_expected = args.rate * args.duration.as_secs();
    let bar = if args.json {
        indicatif::ProgressBar::hidden()
    } else {
        super::progress(total_expected, "events committed")
    };
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    while started.elapsed() < args.duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        bar.set_position(written.load(Ordering::Relaxed));
        bar.set_message(format!(
            "{} webhooks",
            world.receiver.count().await.unwrap_or(0)
        ));
    }
    write_stop.cancel();
    flood_stop.cancel();
    for w in writers {
        w.await.context("a writer panicked")??;
    }
    let write_secs = started.elapsed().as_secs_f64();
    let flood = match flood {
        Some((report, tasks)) => {
            for t in tasks {
                t.await.context("a flood client panicked")?;
            }
            Some(report.lock().clone())
        }
        None => None,
    };
    let cpu_end = cpu_seconds();
    let receiver_end = receiver_cpu();
    let cpu = (
        (cpu_end.0 - cpu_start.0) / write_secs,
        (cpu_end.1 - cpu_start.1) / write_secs,
        (cpu_end.2 - cpu_start.2) / write_secs,
        (receiver_end - receiver_start) / write_secs,
    );
    bar.finish_and_clear();
    let events = written.load(Ordering::Relaxed);
    let deliveries_expected = events * u64::from(args.endpoints);

    // Drain: until every delivery succeeded (or 5 minutes), watched through
    // the dispatcher's counter rather than by querying the database under load.
    let drain_start = Instant::now();
    let succeeded = || running.counters.dispatch.succeeded.load(Ordering::Relaxed);
    while succeeded() < deliveries_expected && drain_start.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let total_secs = started.elapsed().as_secs_f64();
    // The cost model: what each delivery cost, writes and drain included.
    let cpu_done = cpu_seconds();
    let wal_end = world.wal().await?;
    let receiver_done = receiver_cpu();
    let (statements, tables) = if args.statements {
        (world.statements(12).await?, world.table_activity().await?)
    } else {
        (Vec::new(), Vec::new())
    };
    sampler_stop.cancel();
    shutdown.cancel();
    running.wait().await?;

    let row = world
        .platform_sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                    (SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'), (SELECT count(*) FROM walhook.attempts)",
            &[],
        )
        .await?;
    let (ev, del, ok, att): (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    let [p50, p99, p999] = world.first_attempt_latency("bench", 0, i64::MAX).await?;
    let found = args.find_rate.then_some(args.rate);
    let per = |x: f64| x / (ok.max(1) as f64);
    let cost = serde_json::json!({
        "postgres_cpu_us": per(cpu_done.1 - cpu_start.1) * 1e6,
        "walhook_cpu_us": per(cpu_done.0 - cpu_start.0) * 1e6,
        "receiver_cpu_us": per(receiver_done - receiver_start) * 1e6,
        "wal_bytes": per(wal_end.bytes - wal_start.bytes),
        "wal_records": per(wal_end.records - wal_start.records),
        "wal_full_page_images": per(wal_end.fpi - wal_start.fpi),
        "note": "per delivery that succeeded, over the writes and the drain; WAL and Postgres CPU include the business writes (one order per event)",
    });
    let result = serde_json::json!({
        "scenario": "pipeline",
        "target_events_per_second": args.rate,
        "rate_found_by_search": found,
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
        "first_attempt_latency_ms": { "p50": p50, "p99": p99, "p99_9": p999 },
        "slot_max_lag_bytes": max_lag.load(Ordering::Relaxed),
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
        "cpu_cores_while_writing": { "walhook_process": cpu.0, "postgres": cpu.1, "receiver_process": cpu.3, "machine_busy": cpu.2 },
        "per_delivery": cost,
        "statements": statements.iter().map(|(q, calls, rows, ms, us_per_row)| serde_json::json!({
            "query": q, "calls": calls, "rows": rows, "total_ms": ms, "us_per_row": us_per_row,
        })).collect::<Vec<_>>(),
        "tables": tables,
        "commit": build_commit(),
        "machine": { "cores": std::thread::available_parallelism().map_or(0, |n| n.get()) },
        "settings": { "walhook": SETTINGS, "postgres": "devkit's throwaway cluster (fsync off, synchronous_commit on, full_page_writes off, shared_buffers 128MB)" },
        "api": api_port.is_some(),
        "api_flood": flood.as_ref().map(|f| serde_json::json!({
            "target_requests_per_second": args.api_flood,
            "requests": f.sent,
            "requests_per_second": f.sent as f64 / write_secs,
            "statuses": f.statuses.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        })),
        "note": "Postgres, the receiver (its own process), the load writers and walhook share this machine; RSS is this process (walhook + writers)",
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
            "  commit→first attempt      p50 {p50:.0} ms   p99 {p99:.0} ms   p99.9 {p999:.0} ms"
        );
        println!(
            "  slot max lag              {:>10} bytes",
            max_lag.load(Ordering::Relaxed)
        );
        println!(
            "  peak RSS                  {:>10.0} MiB",
            peak_rss_kib() as f64 / 1024.0
        );
        println!(
            "  per delivery              Postgres {:.1} µs CPU, walhook {:.1} µs, receiver {:.1} µs, {:.0} WAL bytes",
            cost["postgres_cpu_us"].as_f64().unwrap_or(0.0),
            cost["walhook_cpu_us"].as_f64().unwrap_or(0.0),
            cost["receiver_cpu_us"].as_f64().unwrap_or(0.0),
            cost["wal_bytes"].as_f64().unwrap_or(0.0)
        );
        for (q, calls, rows, ms, us) in &statements {
            println!("    {ms:>9.0} ms {calls:>8} calls {rows:>9} rows {us:>7.1} µs/row  {q}");
        }
        if !tables.is_empty() {
            println!(
                "    {:<22} {:>9} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "table",
                "seq scans",
                "seq rows",
                "idx scans",
                "inserted",
                "updated",
                "HOT",
                "deleted"
            );
        }
        for t in &tables {
            println!(
                "    {:<22} {:>9} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10}",
                t.table,
                t.seq_scans,
                t.seq_rows_read,
                t.index_scans,
                t.inserted,
                t.updated,
                t.hot_updated,
                t.deleted
            );
        }
        if let Some(f) = &flood {
            println!(
                "  API flood                 {:>10} requests ({:.0}/s), answers {:?}",
                f.sent,
                f.sent as f64 / write_secs,
                f.statuses
            );
        }
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(if ok as u64 == deliveries_expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The highest events/s that keeps up (see [`Args::find_rate`]), searched
/// on a throwaway cluster of its own so that the measured run starts clean.
async fn find_rate(args: &Args) -> anyhow::Result<u64> {
    const STEP: Duration = Duration::from_secs(20);
    const DRAIN_BUDGET: Duration = Duration::from_secs(1);
    const MAX_STEPS: u32 = 12;
    let (world, shutdown, running, _) = start(args).await?;
    let succeeded = || running.counters.dispatch.succeeded.load(Ordering::Relaxed);
    let say = |line: String| {
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    say(format!(
        "finding the highest sustained rate from {} events/s ({} s steps, p99 budget {} ms)",
        args.rate,
        STEP.as_secs(),
        args.p99_budget.as_millis()
    ));
    let mut rate = args.rate.max(1);
    let mut expected = 0u64;
    let mut best: Option<u64> = None;
    let mut first_ok: Option<bool> = None;
    for step in 0..MAX_STEPS {
        let first_id = i64::from(step + 1) << 40;
        let (written, stop, writers) = world
            .writers("bench", first_id, rate as f64, args.batch, args.writers)
            .await?;
        tokio::time::sleep(STEP).await;
        stop.cancel();
        for w in writers {
            w.await.context("a writer panicked")??;
        }
        expected += written.load(Ordering::Relaxed) * u64::from(args.endpoints);
        let stopped = Instant::now();
        while succeeded() < expected && stopped.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let drain = stopped.elapsed();
        let [_, p99, _] = world
            .first_attempt_latency("bench", first_id, first_id + (1 << 40))
            .await?;
        let ok = drain <= DRAIN_BUDGET && p99 <= args.p99_budget.as_secs_f64() * 1000.0;
        say(format!(
            "  {rate:>6} events/s: p99 {p99:.0} ms, drained {:.1} s after the writers stopped: {}",
            drain.as_secs_f64(),
            if ok { "keeps up" } else { "falls behind" }
        ));
        if ok {
            best = Some(best.map_or(rate, |b| b.max(rate)));
        }
        match (*first_ok.get_or_insert(ok), ok) {
            // Going up: stop at the first step that falls behind.
            (true, false) => break,
            (true, true) => rate = (rate as f64 * 1.15).ceil() as u64,
            // Going down: stop at the first step that keeps up.
            (false, true) => break,
            (false, false) => rate = ((rate as f64 / 1.15).floor() as u64).max(1),
        }
    }
    shutdown.cancel();
    running.wait().await?;
    let Some(best) = best else {
        anyhow::bail!(
            "no rate down to {rate} events/s kept up within {} ms at p99; start lower with --rate",
            args.p99_budget.as_millis()
        );
    };
    say(format!("sustained: {best} events/s; measuring it now"));
    Ok(best)
}
