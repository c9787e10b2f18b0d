//! `walhook chaos --soak`: a long run at a steady rate with a fault every
//! few minutes, sampling what leaks show in (walhook's RSS and open
//! descriptors, its Postgres sessions, the slot's lag, the hot tables'
//! sizes), then the same independent judgement as the rounds over every
//! order written.
//!
//! The default faults are the ones that leave the `walhook run` process
//! running (Postgres killed, network faults, storms): a drift of RSS or of
//! descriptors is a property of one process over the hour, and a restart
//! would hide it. The rounds cover the faults that end the process.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use walhook_devkit::faultproxy::Fault;
use walhook_devkit::postgres::{Reconnecting, connect_retrying};
use walhook_devkit::receiver::Received;

use super::svg::{Series, small_multiples};
use super::{
    Args, FAULT_HOLD, INSERT_ORDERS, Walhook, World, chosen_faults, network_fault, start_storm,
    storm,
};

/// The faults a soak injects unless told otherwise.
pub const SOAK_FAULTS: &[&str] = &[
    "postgres-kill",
    "receiver-reset",
    "pg-connection-limit",
    "receiver-blackhole",
    "pg-cancel-storm",
];

/// One sample; `None` where the reading failed (Postgres down).
#[derive(Debug, Clone, Serialize)]
struct Sample {
    /// Seconds since the writes began.
    t: f64,
    rss_mib: Option<f64>,
    open_fds: Option<u64>,
    /// Sessions of walhook's platform role plus the walsender.
    pg_sessions: Option<i64>,
    slot_lag_mib: Option<f64>,
    /// `pending` and `fanouts`: rows that live until their work is done.
    queue_tables_mib: Option<f64>,
    /// `events`, `deliveries`, `attempts`: the history (grows until archived).
    history_tables_mib: Option<f64>,
    /// Requests the receiver answered since the previous sample, a second.
    requests_per_sec: f64,
}

/// A fault injected (or walhook found dead and restarted).
#[derive(Debug, Clone, Serialize)]
struct Mark {
    t: f64,
    fault: String,
    injected: String,
}

/// What the receiver saw of one (endpoint, fact).
struct Seen {
    first_id: u64,
    unstable: bool,
    ok: u32,
}

/// The receiver's requests folded as they come, so that an hour's bodies
/// are not kept.
#[derive(Default)]
struct Tally {
    /// (endpoint index, paid, order id).
    seen: HashMap<(u16, bool, i64), Seen>,
    bad_signatures: u64,
    foreign: u64,
}

impl Tally {
    fn fold(&mut self, paths: &HashMap<String, u16>, batch: Vec<Received>) {
        for r in batch {
            let body: Option<serde_json::Value> = serde_json::from_slice(&r.body).ok();
            let fact = body.as_ref().and_then(|b| {
                let paid = match b["type"].as_str()? {
                    "order.created" => false,
                    "order.paid" => true,
                    _ => return None,
                };
                Some((paid, b["object_id"].as_str()?.parse::<i64>().ok()?))
            });
            let (Some(&ep), Some((paid, id))) = (paths.get(&r.path), fact) else {
                self.foreign += 1;
                continue;
            };
            if r.verified == Some(false) {
                self.bad_signatures += 1;
            }
            let mut h = DefaultHasher::new();
            r.webhook_id.hash(&mut h);
            let hash = h.finish();
            let seen = self.seen.entry((ep, paid, id)).or_insert(Seen {
                first_id: hash,
                unstable: false,
                ok: 0,
            });
            seen.unstable |= seen.first_id != hash;
            if (200..300).contains(&r.status) {
                seen.ok += 1;
            }
        }
    }
}

/// The whole soak's result.
#[derive(Debug, Serialize)]
struct SoakReport {
    length_seconds: f64,
    rate_orders_per_sec: u32,
    endpoints: usize,
    orders_committed: u64,
    webhooks_expected: u64,
    lost: u64,
    unexpected: u64,
    unstable_ids: u64,
    bad_signatures: u64,
    duplicate_sends: u64,
    attempts_after_unknown_outcome: i64,
    walhook_restarts: u32,
    drained_seconds: f64,
    rss_mib_after_warmup: f64,
    rss_mib_at_end: f64,
    rss_drift: f64,
    open_fds_after_warmup: u64,
    open_fds_at_end: u64,
    pg_sessions_after_warmup: i64,
    pg_sessions_at_end: i64,
    slot_lag_mib_max: f64,
    queue_tables_mib_max: f64,
    clean: bool,
    faults: Vec<Mark>,
    samples: Vec<Sample>,
}

fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

fn open_fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// The size of tables, partitions included (a partitioned table's own
/// size is 0; a plain table has no partition tree).
macro_rules! tables_mib {
    ($($name:literal),+) => {
        concat!(
            "(SELECT sum(pg_total_relation_size(t.name::regclass) + COALESCE((\
               SELECT sum(pg_total_relation_size(p.relid)) FROM pg_partition_tree(t.name::regclass) p \
               WHERE p.relid <> t.name::regclass), 0))::float8 / 1048576 \
             FROM unnest(ARRAY[", $("'", $name, "'::text,",)+ "NULL]) t(name) WHERE t.name IS NOT NULL)"
        )
    };
}

const PG_SAMPLE: &str = concat!(
    "SELECT \
      (SELECT count(*) FROM pg_stat_activity WHERE usename = $1 OR backend_type = 'walsender'), \
      (SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::float8 / 1048576 \
         FROM pg_replication_slots WHERE slot_name = 'walhook'), ",
    tables_mib!("walhook.pending", "walhook.fanouts"),
    ", ",
    tables_mib!("walhook.events", "walhook.deliveries", "walhook.attempts"),
);

/// Postgres's part of a sample: sessions, slot lag, queue and history MiB.
async fn pg_sample(
    session: &mut Option<tokio_postgres::Client>,
    url: &str,
) -> (Option<i64>, Option<f64>, Option<f64>, Option<f64>) {
    if session.as_ref().is_none_or(|c| c.is_closed()) {
        *session = connect_retrying(url, Duration::from_millis(500)).await.ok();
    }
    let Some(client) = session.as_ref() else {
        return (None, None, None, None);
    };
    match client.query_one(PG_SAMPLE, &[&storm::APP_ROLE]).await {
        Ok(row) => (row.get(0), row.get(1), row.get(2), row.get(3)),
        Err(_) => {
            *session = None;
            (None, None, None, None)
        }
    }
}

/// Where the stages stand, once per run.
const STAGES: &str = "SELECT (SELECT count(*) FROM walhook.events), \
    (SELECT count(*) FROM walhook.fanouts), \
    (SELECT count(*) FROM walhook.pending WHERE lease_owner IS NOT NULL), \
    (SELECT count(*) FROM walhook.pending WHERE lease_owner IS NULL), \
    (SELECT coalesce(max(pg_current_wal_lsn() - confirmed_flush_lsn), 0)::int8 FROM pg_replication_slots)";

/// Every client session and walsender of the cluster: what it waits on and
/// for how long its transaction has been open.
const SESSIONS: &str = "SELECT pid, coalesce(datname::text, ''), coalesce(state, ''), \
    coalesce(wait_event_type || ':' || wait_event, ''), \
    coalesce(extract(epoch FROM now() - xact_start)::int8, -1), \
    left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 160) \
    FROM pg_stat_activity \
    WHERE pid <> pg_backend_pid() AND backend_type IN ('client backend', 'walsender') \
    ORDER BY xact_start NULLS LAST";

/// The backlog did not drain within the settle time: prints which stage
/// holds it and what every Postgres session is doing, so that a run that
/// fails says why (walhook's log, kept, says what walhook did).
async fn print_stuck(world: &World) {
    let client = match world.pg.connect("walhook").await {
        Ok(c) => c,
        Err(e) => {
            println!("the backlog did not drain; Postgres cannot be asked why: {e}");
            return;
        }
    };
    match client.query_one(STAGES, &[]).await {
        Ok(r) => println!(
            "the backlog did not drain: {} events fanned out, {} plans left, pending deliveries {} held and {} unheld, slot lag {} bytes",
            r.get::<_, i64>(0),
            r.get::<_, i64>(1),
            r.get::<_, i64>(2),
            r.get::<_, i64>(3),
            r.get::<_, i64>(4)
        ),
        Err(e) => println!("the backlog did not drain; the stages cannot be read: {e}"),
    }
    match client.query(SESSIONS, &[]).await {
        Ok(rows) => {
            println!("Postgres sessions (pid, database, state, wait, transaction age s, query):");
            for r in rows {
                println!(
                    "  {} {} {} {} {} {}",
                    r.get::<_, i32>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                    r.get::<_, String>(3),
                    r.get::<_, i64>(4),
                    r.get::<_, String>(5)
                );
            }
        }
        Err(e) => println!("the sessions cannot be read: {e}"),
    }
}

/// Writes `rate` orders a second in 10 ms ticks (one multi-row insert a
/// tick, and every fourth order of the tick before paid) until `stop`;
/// `last` is the highest id tried. Outcomes do not matter: the judgement
/// reads what the database kept.
async fn write_orders(url: String, rate: u32, stop: Arc<AtomicBool>, last: Arc<AtomicI64>) {
    let mut writer = Reconnecting::new(url);
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut next = 1i64;
    let mut previous: Option<(i64, i64)> = None;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        // Ids owed by now, so that a stall is caught up in bigger ticks.
        let due = (started.elapsed().as_secs_f64() * f64::from(rate)) as i64 + 1;
        let upto = due.min(next + i64::from(rate)); // at most a second's worth at once
        if upto <= next {
            continue;
        }
        let (first, end) = (next, upto - 1);
        let _ = writer.execute(INSERT_ORDERS, &[&first, &end]).await;
        last.store(end, Ordering::Relaxed);
        next = upto;
        if let Some((a, b)) = previous {
            let _ = writer
                .execute(
                    "UPDATE orders SET status = 'paid' \
                     WHERE id BETWEEN $1 AND $2 AND id % 4 = 0 AND status <> 'paid'",
                    &[&a, &b],
                )
                .await;
        }
        previous = Some((first, end));
    }
}

/// The orders the business database kept, judged against the tally:
/// (expected, lost, unexpected, unstable, duplicates).
async fn judge(world: &World, tally: &Tally) -> anyhow::Result<(u64, u64, u64, u64, u64, u64)> {
    let shop = connect_retrying(&world.pg.url("shop"), Duration::from_secs(30)).await?;
    let rows = shop
        .query("SELECT id, tenant_id, status = 'paid' FROM orders", &[])
        .await?;
    let (mut expected, mut lost, mut matched) = (0u64, 0u64, 0u64);
    for r in &rows {
        let (id, tenant, paid): (i64, String, bool) = (r.get(0), r.get(1), r.get(2));
        let mut facts = vec![(false, "order.created")];
        if paid {
            facts.push((true, "order.paid"));
        }
        for (is_paid, event_type) in facts {
            for (ep, _) in world
                .endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| e.wants(&tenant, event_type))
            {
                expected += 1;
                match tally.seen.get(&(ep as u16, is_paid, id)) {
                    Some(s) => {
                        matched += 1;
                        if s.ok == 0 {
                            lost += 1;
                        }
                    }
                    None => lost += 1,
                }
            }
        }
    }
    let unexpected = tally.seen.len() as u64 - matched + tally.foreign;
    let unstable = tally.seen.values().filter(|s| s.unstable).count() as u64;
    let duplicates = tally
        .seen
        .values()
        .map(|s| u64::from(s.ok.saturating_sub(1)))
        .sum();
    Ok((
        rows.len() as u64,
        expected,
        lost,
        unexpected,
        unstable,
        duplicates,
    ))
}

/// How a window of samples is summed up.
#[derive(Clone, Copy)]
enum Summary {
    Mean,
    Median,
    Max,
}

/// `how` of `f` over the samples with `t` in `[from, to)` (0 when none).
fn window<T: Into<f64> + Copy>(
    samples: &[Sample],
    from: f64,
    to: f64,
    f: impl Fn(&Sample) -> Option<T>,
    how: Summary,
) -> f64 {
    let mut values: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t < to)
        .filter_map(|s| f(s).map(Into::into))
        .collect();
    if values.is_empty() {
        return 0.0;
    }
    match how {
        Summary::Mean => values.iter().sum::<f64>() / values.len() as f64,
        Summary::Max => values.iter().copied().fold(0.0, f64::max),
        Summary::Median => {
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        }
    }
}

/// Runs the soak for `length`.
pub async fn run(args: &Args, length: Duration) -> anyhow::Result<ExitCode> {
    if args.log == "fluvio" {
        anyhow::bail!(
            "--soak runs on the embedded log; on Fluvio, run rounds: walhook chaos --log fluvio --rounds N"
        );
    }
    let faults = chosen_faults(&args.faults, SOAK_FAULTS, false)?;
    if args.rate == 0 {
        anyhow::bail!(
            "--rate 0: a soak needs orders to write; give orders a second, for example --rate 1000"
        );
    }
    println!(
        "walhook chaos --soak {}s: {} orders/s, a fault every {}s ({}), samples every {}s",
        length.as_secs(),
        args.rate,
        args.fault_every.as_secs(),
        faults.join(", "),
        args.sample_every.as_secs()
    );
    std::fs::create_dir_all(&args.report)
        .with_context(|| format!("--report: cannot create {}", args.report.display()))?;
    let mut world = World::start(3).await?;
    let mut walhook = world.start_walhook().await?;
    let paths: HashMap<String, u16> = world
        .endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| (e.path.clone(), i as u16))
        .collect();
    let admin_url = world.pg.url("walhook");

    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicI64::new(0));
    let writer = tokio::spawn(write_orders(
        world.pg.url("shop"),
        args.rate,
        stop.clone(),
        last.clone(),
    ));
    let started = Instant::now();
    let mut tally = Tally::default();
    let mut samples = Vec::new();
    let mut marks: Vec<Mark> = Vec::new();
    let mut restarts = 0u32;
    let mut admin = None;
    let (mut next_sample, mut next_fault) = (Duration::ZERO, args.fault_every);
    let mut fault_no = 0usize;
    let mut heal_at: Option<(Instant, usize)> = None;
    let mut storm: Option<(tokio::task::JoinHandle<anyhow::Result<String>>, usize)> = None;
    let mut requests_before = (0usize, Instant::now());
    let bar = walhook_cli::progress::bar(length.as_secs(), "soak seconds");
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = started.elapsed();
        bar.set_position(now.as_secs());
        tally.fold(&paths, world.receiver.drain());
        if !walhook.running() {
            restarts += 1;
            marks.push(Mark {
                t: now.as_secs_f64(),
                fault: "walhook-exited".into(),
                injected: "walhook run ended; started again".into(),
            });
            walhook = Walhook::start(&world.cfg, &world.log, None)?;
        }
        if let Some((at, victim)) = heal_at
            && Instant::now() >= at
        {
            world.endpoints[victim].proxy.set(Fault::None);
            heal_at = None;
        }
        if let Some((handle, mark)) = storm.take_if(|(h, _)| h.is_finished()) {
            marks[mark].injected = match handle.await {
                Ok(Ok(done)) => done,
                Ok(Err(e)) => format!("storm failed: {e:#}"),
                Err(e) => format!("storm task failed: {e}"),
            };
        }
        if now >= next_fault && length.saturating_sub(now) > FAULT_HOLD * 5 {
            next_fault += args.fault_every;
            let fault = faults[fault_no % faults.len()].clone();
            let victim = fault_no % world.endpoints.len();
            fault_no += 1;
            let t = now.as_secs_f64();
            let injected = match fault.as_str() {
                "postgres-kill" => {
                    world
                        .pg
                        .crash_and_restart(Duration::from_millis(500))
                        .await?;
                    "kill -9 of Postgres, started again 0.5 s later".to_owned()
                }
                network if network.starts_with("receiver-") => {
                    let f = network_fault(network).unwrap_or(Fault::None);
                    world.endpoints[victim].proxy.set(f);
                    heal_at = Some((Instant::now() + FAULT_HOLD, victim));
                    format!(
                        "{f:?} at {} for {} s",
                        world.endpoints[victim].path,
                        FAULT_HOLD.as_secs()
                    )
                }
                "sigkill" => {
                    walhook.kill();
                    "SIGKILL of walhook run".to_owned()
                }
                other if other.contains('.') => {
                    anyhow::bail!(
                        "--faults {other}: a failpoint needs walhook restarted with it; the soak injects faults into a running walhook (use the rounds for failpoints)"
                    )
                }
                other => {
                    storm = start_storm(other, &world.pg).map(|h| (h, marks.len()));
                    "storm running".to_owned()
                }
            };
            marks.push(Mark { t, fault, injected });
        }
        if now >= next_sample {
            next_sample += args.sample_every;
            let pid = walhook.pid();
            let (sessions, lag, queue, history) = pg_sample(&mut admin, &admin_url).await;
            let count = world.receiver.count();
            let secs = requests_before.1.elapsed().as_secs_f64().max(0.001);
            let per_sec = (count - requests_before.0) as f64 / secs;
            requests_before = (count, Instant::now());
            let sample = Sample {
                t: now.as_secs_f64(),
                rss_mib: rss_mib(pid),
                open_fds: open_fds(pid),
                pg_sessions: sessions,
                slot_lag_mib: lag,
                queue_tables_mib: queue,
                history_tables_mib: history,
                requests_per_sec: per_sec,
            };
            bar.set_message(format!(
                "rss {:.0} MiB, lag {:.1} MiB",
                sample.rss_mib.unwrap_or(0.0),
                sample.slot_lag_mib.unwrap_or(0.0)
            ));
            samples.push(sample);
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.await?;
    if let Some((at, victim)) = heal_at.take() {
        tokio::time::sleep_until(at.into()).await;
        world.endpoints[victim].proxy.set(Fault::None);
    }
    if let Some((handle, mark)) = storm.take() {
        marks[mark].injected = handle.await??;
    }
    bar.finish_and_clear();
    let writes_ended = Instant::now();
    println!(
        "writes ended after order {}; waiting up to {} s for the backlog",
        last.load(Ordering::Relaxed),
        args.settle.as_secs()
    );

    // The backlog drains; judged every 5 s until nothing is missing.
    // Judging reads every order, so it waits until requests stopped
    // arriving for two seconds (or the settle time is up).
    let mut quiet_since = (world.receiver.count(), Instant::now());
    let stuck = loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if !walhook.running() {
            restarts += 1;
            walhook = Walhook::start(&world.cfg, &world.log, None)?;
        }
        tally.fold(&paths, world.receiver.drain());
        let count = world.receiver.count();
        if count != quiet_since.0 {
            quiet_since = (count, Instant::now());
        }
        let out_of_time = writes_ended.elapsed() >= args.settle;
        if quiet_since.1.elapsed() < Duration::from_secs(2) && !out_of_time {
            continue;
        }
        let (_, _, lost, ..) = judge(&world, &tally).await?;
        if lost == 0 || out_of_time {
            break lost > 0;
        }
        quiet_since = (world.receiver.count(), Instant::now());
    };
    let drained_seconds = writes_ended.elapsed().as_secs_f64();
    if stuck {
        print_stuck(&world).await;
    }
    // Late duplicates show within a moment.
    tokio::time::sleep(Duration::from_secs(1)).await;
    tally.fold(&paths, world.receiver.drain());
    let (orders, expected, lost, unexpected, unstable, duplicates) = judge(&world, &tally).await?;
    walhook.stop();
    let unknown: i64 = connect_retrying(&world.platform_url, Duration::from_secs(30))
        .await?
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE note = 'previous_outcome_unknown'",
            &[],
        )
        .await?
        .get(0);

    // Drift: the first fifth after a tenth of warm-up against the last fifth.
    let len = length.as_secs_f64();
    let (warm, early_end, late) = (0.1 * len, 0.3 * len, 0.8 * len);
    let rss_first = window(&samples, warm, early_end, |s| s.rss_mib, Summary::Mean);
    let rss_last = window(&samples, late, len + 1.0, |s| s.rss_mib, Summary::Mean);
    // Medians of the early and the late window.
    let early_late = |f: fn(&Sample) -> Option<f64>| {
        (
            window(&samples, warm, early_end, f, Summary::Median),
            window(&samples, late, len + 1.0, f, Summary::Median),
        )
    };
    let (fds_first, fds_last) = early_late(|s| s.open_fds.map(|v| v as f64));
    let (fds_first, fds_last) = (fds_first as u64, fds_last as u64);
    let (sessions_first, sessions_last) = early_late(|s| s.pg_sessions.map(|v| v as f64));
    let (sessions_first, sessions_last) = (sessions_first as i64, sessions_last as i64);
    let rss_drift = if rss_first > 0.0 {
        rss_last / rss_first - 1.0
    } else {
        0.0
    };
    // Descriptors and sessions move with the traffic (the HTTP pool grows
    // in the burst after a fault and shrinks as idle connections expire):
    // a leak raises the middle of the window, a burst only its top, so
    // the windows' medians are compared; growth is more than 10 % and 2
    // above.
    let grew = |first: f64, last: f64| last > (first * 1.1).max(first + 2.0);
    let clean = lost == 0
        && unexpected == 0
        && unstable == 0
        && tally.bad_signatures == 0
        && rss_drift < 0.10
        && !grew(fds_first as f64, fds_last as f64)
        && !grew(sessions_first as f64, sessions_last as f64);
    let report = SoakReport {
        length_seconds: len,
        rate_orders_per_sec: args.rate,
        endpoints: world.endpoints.len(),
        orders_committed: orders,
        webhooks_expected: expected,
        lost,
        unexpected,
        unstable_ids: unstable,
        bad_signatures: tally.bad_signatures,
        duplicate_sends: duplicates,
        attempts_after_unknown_outcome: unknown,
        walhook_restarts: restarts,
        drained_seconds: (drained_seconds * 10.0).round() / 10.0,
        rss_mib_after_warmup: rss_first,
        rss_mib_at_end: rss_last,
        rss_drift,
        open_fds_after_warmup: fds_first,
        open_fds_at_end: fds_last,
        pg_sessions_after_warmup: sessions_first,
        pg_sessions_at_end: sessions_last,
        slot_lag_mib_max: window(&samples, 0.0, len + 1.0, |s| s.slot_lag_mib, Summary::Max),
        queue_tables_mib_max: window(
            &samples,
            0.0,
            len + 1.0,
            |s| s.queue_tables_mib,
            Summary::Max,
        ),
        clean,
        faults: marks,
        samples,
    };
    write_report(&args.report, &report)?;
    print_summary(&report, &args.report);
    if !report.clean {
        world.keep_log();
    }
    Ok(if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The sampled series as charts.
fn charts(report: &SoakReport) -> String {
    let series = |title, unit, f: fn(&Sample) -> Option<f64>| Series {
        title,
        unit,
        points: report.samples.iter().map(|s| (s.t, f(s))).collect(),
    };
    let marks: Vec<(f64, String)> = report
        .faults
        .iter()
        .map(|m| (m.t, format!("{} ({})", m.fault, m.injected)))
        .collect();
    small_multiples(
        &[
            series("walhook RSS", "MiB", |s| s.rss_mib),
            series("walhook open descriptors", "", |s| {
                s.open_fds.map(|v| v as f64)
            }),
            series("Postgres sessions (walhook)", "", |s| {
                s.pg_sessions.map(|v| v as f64)
            }),
            series("slot lag", "MiB", |s| s.slot_lag_mib),
            series("queue tables (pending, fanouts)", "MiB", |s| {
                s.queue_tables_mib
            }),
            series(
                "history tables (events, deliveries, attempts)",
                "MiB",
                |s| s.history_tables_mib,
            ),
            series("requests answered", "/s", |s| Some(s.requests_per_sec)),
        ],
        &marks,
        report.length_seconds,
    )
}

fn write_report(dir: &std::path::Path, report: &SoakReport) -> anyhow::Result<()> {
    let svg = charts(report);
    std::fs::write(dir.join("soak.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(dir.join("soak.svg"), &svg)?;
    let row = |name: &str, value: String| {
        format!("<tr><th scope=\"row\">{name}</th><td>{value}</td></tr>")
    };
    let rows = [
        row("length", format!("{:.0} min", report.length_seconds / 60.0)),
        row(
            "rate",
            format!(
                "{} orders/s ({} endpoints)",
                report.rate_orders_per_sec, report.endpoints
            ),
        ),
        row("orders committed", report.orders_committed.to_string()),
        row("webhooks expected", report.webhooks_expected.to_string()),
        row("lost", report.lost.to_string()),
        row("unexpected", report.unexpected.to_string()),
        row("unstable ids", report.unstable_ids.to_string()),
        row("bad signatures", report.bad_signatures.to_string()),
        row(
            "duplicate sends",
            format!(
                "{} (attempts noted previous_outcome_unknown: {})",
                report.duplicate_sends, report.attempts_after_unknown_outcome
            ),
        ),
        row("walhook restarts", report.walhook_restarts.to_string()),
        row(
            "RSS after warm-up → at end",
            format!(
                "{:.1} → {:.1} MiB (drift {:+.1} %)",
                report.rss_mib_after_warmup,
                report.rss_mib_at_end,
                report.rss_drift * 100.0
            ),
        ),
        row(
            "open descriptors after warm-up → at end (medians)",
            format!(
                "{} → {}",
                report.open_fds_after_warmup, report.open_fds_at_end
            ),
        ),
        row(
            "Postgres sessions after warm-up → at end (medians)",
            format!(
                "{} → {}",
                report.pg_sessions_after_warmup, report.pg_sessions_at_end
            ),
        ),
        row(
            "slot lag, largest",
            format!("{:.1} MiB", report.slot_lag_mib_max),
        ),
        row(
            "backlog drained after the writes",
            format!("{:.1} s", report.drained_seconds),
        ),
        row(
            "verdict",
            if report.clean {
                "clean".into()
            } else {
                "NOT CLEAN".into()
            },
        ),
    ];
    let faults: String = report
        .faults
        .iter()
        .map(|m| {
            format!(
                "<tr><td>{:.0} s</td><td>{}</td><td>{}</td></tr>",
                m.t,
                html_escape(&m.fault),
                html_escape(&m.injected)
            )
        })
        .collect();
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>walhook soak</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:62em}}table{{border-collapse:collapse}}\
         th,td{{text-align:left;padding:2px 10px;border-bottom:1px solid #ddd}}</style></head><body>\
         <h1>walhook soak</h1><table>{}</table><h2>Samples</h2>\
         <p>Dashed red lines: faults (hover for what was done).</p>{svg}\
         <h2>Faults</h2><table><tr><th>at</th><th>fault</th><th>what was done</th></tr>{faults}</table></body></html>",
        rows.concat()
    );
    std::fs::write(dir.join("soak.html"), html)?;
    Ok(())
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn print_summary(r: &SoakReport, dir: &std::path::Path) {
    println!(
        "\n  {} orders, {} webhooks expected: lost {}, unexpected {}, unstable ids {}, bad signatures {}, duplicate sends {} (unknown outcomes noted {})",
        r.orders_committed,
        r.webhooks_expected,
        r.lost,
        r.unexpected,
        r.unstable_ids,
        r.bad_signatures,
        r.duplicate_sends,
        r.attempts_after_unknown_outcome
    );
    println!(
        "  RSS {:.1} → {:.1} MiB ({:+.1} %), descriptors {} → {}, Postgres sessions {} → {}, slot lag ≤ {:.1} MiB, drained {:.1} s after the writes, walhook restarts {}, faults {}",
        r.rss_mib_after_warmup,
        r.rss_mib_at_end,
        r.rss_drift * 100.0,
        r.open_fds_after_warmup,
        r.open_fds_at_end,
        r.pg_sessions_after_warmup,
        r.pg_sessions_at_end,
        r.slot_lag_mib_max,
        r.drained_seconds,
        r.walhook_restarts,
        r.faults.len()
    );
    println!(
        "  report: {}  {}",
        dir.join("soak.html").display(),
        if r.clean { "clean" } else { "NOT CLEAN" }
    );
}
