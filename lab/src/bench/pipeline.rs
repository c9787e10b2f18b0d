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
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use walhook_devkit::fluvio::FluvioCluster;

use super::world::{World, build_commit, cpu_seconds, peak_rss_kib, process_cpu_seconds};
use walhook_cli::pipeline::{Roles, Running};

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
    /// second to the API (`/metrics` without a token, `/readyz`, unknown
    /// keys) from 32
    /// loopback connections; implies `--api`. Compare the p99 with a run
    /// with `--api` alone.
    #[arg(long, default_value_t = 0)]
    pub api_flood: u64,
    /// Load `pg_stat_statements` and report the statements that took the
    /// most Postgres time (µs per row), and each platform table's scans,
    /// inserts, updates (HOT or not) and deletes.
    #[arg(long)]
    pub statements: bool,
    /// Run the throwaway Postgres with `fsync` and `full_page_writes` on,
    /// as a production server runs (`synchronous_commit` is on either
    /// way). Without it they are off, as in the test clusters and in the
    /// benchmarks of earlier builds, so that figures compare across
    /// builds; with it, figures include the WAL flushes a durable server
    /// waits for. The result's `settings.postgres` says which ran.
    #[arg(long)]
    pub durable: bool,
    /// The log between the stages: `embedded` (one process) or `fluvio` (a
    /// throwaway local cluster from the Fluvio tools, see docs/scale-out.md).
    #[arg(long, default_value = "embedded", value_parser = ["embedded", "fluvio"])]
    pub log: String,
    /// With `--log fluvio`: run fan-out and dispatch as this many
    /// `walhook fanout` processes, joined to their group (capture stays in
    /// this process). 0 runs every stage in this process.
    #[arg(long, default_value_t = 0)]
    pub members: u32,
    /// With `--log fluvio`: `[log] dispatch = "by-endpoint"`, the jobs
    /// through the deliveries topic (as many partitions as members, at
    /// least 2) to `walhook dispatch` members (as many as fan-out members;
    /// in this process without --members).
    #[arg(long)]
    pub by_endpoint: bool,
}

/// walhook as the benchmark runs it: in this process, or capture here and
/// fan-out members as processes of their own.
struct Deployment {
    running: Running,
    members: Vec<std::process::Child>,
    /// Kept alive for the run (stopped when dropped).
    _cluster: Option<FluvioCluster>,
    /// The members' config file (removed when dropped).
    _dir: Option<tempfile::TempDir>,
}

impl Deployment {
    /// Deliveries that succeeded: the dispatcher's counter in this process,
    /// or the receiver's count when members send.
    async fn succeeded(&self, world: &World) -> u64 {
        if self.members.is_empty() {
            self.running
                .counters
                .dispatch
                .succeeded
                .load(Ordering::Relaxed)
        } else {
            world.receiver.count().await.unwrap_or(0)
        }
    }

    /// CPU seconds of the member processes so far.
    fn members_cpu(&self) -> f64 {
        self.members
            .iter()
            .map(|c| process_cpu_seconds(c.id()))
            .sum()
    }

    /// Stops the members (SIGTERM: they drain) and this process's stages.
    async fn stop(mut self, shutdown: CancellationToken) -> anyhow::Result<()> {
        for c in &self.members {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
        }
        for c in &mut self.members {
            let _ = c.wait();
        }
        shutdown.cancel();
        Ok(self.running.wait().await?)
    }
}

/// The dispatch and fan-out settings every run of this benchmark uses.
const SETTINGS: &str = "[dispatch]\nmax_in_flight = 512\n\n[fanout]\nbatch_size = 1000\n";

/// A throwaway cluster with the tenant's endpoints, and every stage running
/// (with the API when asked for: its port is returned).
async fn start(args: &Args) -> anyhow::Result<(World, CancellationToken, Deployment, Option<u16>)> {
    let mut settings = Vec::new();
    if args.statements {
        settings.extend([
            ("shared_preload_libraries", "'pg_stat_statements'"),
            ("pg_stat_statements.track", "all"),
        ]);
    }
    if args.durable {
        settings.extend([("fsync", "on"), ("full_page_writes", "on")]);
    }
    let world = World::start_with(&settings).await?;
    world.endpoints("bench", args.endpoints, 64).await?;
    let shutdown = CancellationToken::new();
    let deployment = |running| Deployment {
        running,
        members: Vec::new(),
        _cluster: None,
        _dir: None,
    };
    if args.log == "fluvio" {
        let cluster = FluvioCluster::start("walhook bench pipeline --log fluvio").ok_or_else(|| {
            anyhow::anyhow!(
                "--log fluvio needs a Fluvio cluster: set WALHOOK_FLUVIO_TOOLS to the directory with bin/fluvio-run and \
                 bin/fluvio (the Fluvio tools), or WALHOOK_FLUVIO_ENDPOINT to a running cluster"
            )
        })?;
        let mut extra = format!(
            "{SETTINGS}\n[log]\nkind = \"fluvio\"\nendpoint = \"{}\"\ntopic_prefix = \"bench{:08x}-\"\n",
            cluster.endpoint(),
            std::process::id()
        );
        if args.by_endpoint {
            extra.push_str(&format!(
                "dispatch = \"by-endpoint\"\ndeliveries_partitions = {}\n",
                args.members.max(2)
            ));
        }
        let cfg = world.config("", &extra)?;
        if args.members == 0 {
            let running =
                walhook_cli::pipeline::start(&cfg, world.platform.clone(), shutdown.clone())
                    .await?;
            let deployment = Deployment {
                _cluster: Some(cluster),
                ..deployment(running)
            };
            return Ok((world, shutdown, deployment, None));
        }
        // Capture here; fan-out and dispatch in member processes.
        let roles = Roles {
            capture: true,
            workers: None,
            dispatch: None,
            tasks: Vec::new(),
        };
        let running = walhook_cli::pipeline::start_roles(
            &cfg,
            world.platform.clone(),
            shutdown.clone(),
            None,
            roles,
        )
        .await?;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("walhook.toml");
        std::fs::write(&path, world.config_text("", &extra))?;
        let exe = std::env::current_exe()?;
        let mut members = Vec::new();
        let mut stages = vec!["fanout"; args.members as usize];
        if args.by_endpoint {
            stages.extend(vec!["dispatch"; args.members as usize]);
        }
        for stage in stages {
            members.push(
                std::process::Command::new(&exe)
                    .args([stage, "--config"])
                    .arg(&path)
                    .env("WALHOOK_MASTER_KEY", &world.master_key)
                    .env("WALHOOK_LOG", "warn")
                    .spawn()
                    .with_context(|| format!("cannot start a walhook {stage} member"))?,
            );
        }
        return Ok((
            world,
            shutdown,
            Deployment {
                running,
                members,
                _cluster: Some(cluster),
                _dir: Some(dir),
            },
            None,
        ));
    }
    if args.api || args.api_flood > 0 {
        let (running, port) = world.run_with_api(SETTINGS, shutdown.clone()).await?;
        return Ok((world, shutdown, deployment(running), Some(port)));
    }
    let running = world.run("", SETTINGS, shutdown.clone()).await?;
    Ok((world, shutdown, deployment(running), None))
}

/// The first order id of the warm-up (above every measured one).
const WARM_UP_FIRST_ID: i64 = 1 << 60;

/// What the warm-up wrote.
struct WarmUp {
    events: u64,
    deliveries: u64,
}

/// Commits 20 orders and waits until their deliveries succeeded (at most a
/// minute).
async fn warm_up(world: &World, deployment: &Deployment, endpoints: u64) -> anyhow::Result<WarmUp> {
    const ORDERS: i64 = 20;
    let shop = world.pg.connect("shop").await?;
    for id in WARM_UP_FIRST_ID..WARM_UP_FIRST_ID + ORDERS {
        shop.execute(
            "INSERT INTO orders (id, tenant_id, status, total) VALUES ($1, 'bench', 'new', 1)",
            &[&id],
        )
        .await?;
    }
    let want = ORDERS as u64 * endpoints;
    let started = Instant::now();
    while deployment.succeeded(world).await < want {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the warm-up's {want} deliveries did not succeed within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(WarmUp {
        events: ORDERS as u64,
        deliveries: want,
    })
}

/// Runs the benchmark.
pub async fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    if args.find_rate {
        args.rate = find_rate(&args).await?;
    }
    if args.by_endpoint && args.log != "fluvio" {
        anyhow::bail!(
            "--by-endpoint sends the jobs through a deliveries topic on a shared log: add --log fluvio"
        );
    }
    if args.members > 0 && args.log != "fluvio" {
        anyhow::bail!(
            "--members {} runs fan-out members over a shared log: add --log fluvio",
            args.members
        );
    }
    let (world, shutdown, deployment, api_port) = start(&args).await?;

    // Slot lag sampler: the maximum of each minute (flat from the first
    // minute to the last, or growing); the run's maximum is theirs.
    let lag_by_minute = Arc::new(parking_lot::Mutex::new(Vec::<i64>::new()));
    let sampler_stop = CancellationToken::new();
    {
        let by_minute = lag_by_minute.clone();
        let stop = sampler_stop.clone();
        let sampler = world.pg.connect("shop").await?;
        let began = std::time::Instant::now();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(row) = sampler
                    .query_one("SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)::int8 FROM pg_replication_slots", &[])
                    .await
                {
                    let lag: i64 = row.get(0);
                    let minute = (began.elapsed().as_secs() / 60) as usize;
                    let mut m = by_minute.lock();
                    if m.len() <= minute {
                        m.resize(minute + 1, 0);
                    }
                    m[minute] = m[minute].max(lag);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
    }

    // Warm-up: a few orders through every stage before the measurement, so
    // that start-up (consumers connecting, member processes starting) is
    // not counted as latency. Their ids sit above the measured ones.
    let warm = warm_up(&world, &deployment, u64::from(args.endpoints)).await?;
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
        walhook_cli::progress::bar(total_expected, "events committed")
    };
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let members_start = deployment.members_cpu();
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
    let members_end = deployment.members_cpu();
    let receiver_end = receiver_cpu();
    let cpu = (
        (cpu_end.0 - cpu_start.0 + members_end - members_start) / write_secs,
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
    while deployment.succeeded(&world).await < deliveries_expected + warm.deliveries
        && drain_start.elapsed() < Duration::from_secs(300)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let total_secs = started.elapsed().as_secs_f64();
    // The cost model: what each delivery cost, writes and drain included.
    let cpu_done = cpu_seconds();
    let members_done = deployment.members_cpu();
    let wal_end = world.wal().await?;
    let receiver_done = receiver_cpu();
    let postgres_settings = world.postgres_settings().await?;
    let (statements, tables) = if args.statements {
        (world.statements(12).await?, world.table_activity().await?)
    } else {
        (Vec::new(), Vec::new())
    };
    sampler_stop.cancel();
    deployment.stop(shutdown).await?;

    let row = world
        .platform_sql
        .query_one(
            "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                    (SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'), (SELECT count(*) FROM walhook.attempts)",
            &[],
        )
        .await?;
    let (ev, del, ok, att): (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    // Less the warm-up's rows.
    let w = warm.deliveries as i64;
    let (ev, del, ok, att) = (ev - warm.events as i64, del - w, ok - w, att - w);
    let [p50, p99, p999] = world
        .first_attempt_latency("bench", 0, WARM_UP_FIRST_ID)
        .await?;
    let found = args.find_rate.then_some(args.rate);
    let per = |x: f64| x / (ok.max(1) as f64);
    let cost = serde_json::json!({
        "postgres_cpu_us": per(cpu_done.1 - cpu_start.1) * 1e6,
        "walhook_cpu_us": per(cpu_done.0 - cpu_start.0 + members_done - members_start) * 1e6,
        "receiver_cpu_us": per(receiver_done - receiver_start) * 1e6,
        "wal_bytes": per(wal_end.bytes - wal_start.bytes),
        "wal_records": per(wal_end.records - wal_start.records),
        "wal_full_page_images": per(wal_end.fpi - wal_start.fpi),
        "note": "per delivery that succeeded, over the writes and the drain; WAL and Postgres CPU include the business writes (one order per event)",
    });
    let max_lag = lag_by_minute.lock().iter().copied().max().unwrap_or(0);
    let result = serde_json::json!({
        "scenario": "pipeline",
        "log": args.log,
        "fanout_member_processes": args.members,
        "dispatch": if args.by_endpoint { "by-endpoint" } else { "with-fanout" },
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
        "slot_max_lag_bytes": max_lag,
        "slot_max_lag_bytes_by_minute": lag_by_minute.lock().clone(),
        "peak_rss_mib": peak_rss_kib() as f64 / 1024.0,
        "cpu_cores_while_writing": { "walhook_process": cpu.0, "postgres": cpu.1, "receiver_process": cpu.3, "machine_busy": cpu.2 },
        "per_delivery": cost,
        "statements": statements.iter().map(|(q, calls, rows, ms, us_per_row)| serde_json::json!({
            "query": q, "calls": calls, "rows": rows, "total_ms": ms, "us_per_row": us_per_row,
        })).collect::<Vec<_>>(),
        "tables": tables,
        "commit": build_commit(),
        "machine": { "cores": std::thread::available_parallelism().map_or(0, |n| n.get()) },
        "settings": { "walhook": SETTINGS, "postgres": postgres_settings },
        "api": api_port.is_some(),
        "api_flood": flood.as_ref().map(|f| serde_json::json!({
            "target_requests_per_second": args.api_flood,
            "requests": f.sent,
            "requests_per_second": f.sent as f64 / write_secs,
            "statuses": f.statuses.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        })),
        "note": "Postgres, the receiver (its own process), the load writers and walhook share this machine; RSS is this process (walhook + writers); with member processes walhook's CPU includes theirs, and the Fluvio cluster's CPU is in machine_busy only",
    });
    if !args.json {
        println!(
            "pipeline benchmark: {} events/s target × {} endpoints for {:.0} s on the {} log{}",
            args.rate,
            args.endpoints,
            write_secs,
            args.log,
            if args.members > 0 {
                format!(" with {} fan-out member processes", args.members)
            } else {
                String::new()
            }
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
            "  slot max lag              {:>10} bytes (by minute: {})",
            max_lag,
            lag_by_minute
                .lock()
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(" ")
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
    let (world, shutdown, deployment, _) = start(args).await?;
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
    let mut expected = warm_up(&world, &deployment, u64::from(args.endpoints))
        .await?
        .deliveries;
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
        while deployment.succeeded(&world).await < expected
            && stopped.elapsed() < Duration::from_secs(120)
        {
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
    deployment.stop(shutdown).await?;
    let Some(best) = best else {
        anyhow::bail!(
            "no rate down to {rate} events/s kept up within {} ms at p99; start lower with --rate",
            args.p99_budget.as_millis()
        );
    };
    say(format!("sustained: {best} events/s; measuring it now"));
    Ok(best)
}
