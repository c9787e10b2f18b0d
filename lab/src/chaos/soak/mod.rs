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
//!
//! Its parts: `sample` reads walhook's process and Postgres, `tally` folds
//! the receiver's requests and judges them against the business database,
//! `stuck` says why a backlog did not drain, and `report` writes the
//! verdict with its charts.

mod report;
mod sample;
mod stuck;
mod tally;

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use walhook_devkit::faultproxy::Fault;
use walhook_devkit::postgres::{Reconnecting, connect_retrying};

use super::Args;
use super::faults::{FAULT_HOLD, chosen_faults, network_fault, start_storm};
use super::process::Walhook;
use super::world::{INSERT_ORDERS, World};
use report::{Mark, SoakReport, print_summary, write_report};
use sample::{Sample, Summary, open_fds, pg_sample, rss_mib, window};
use stuck::print_stuck;
use tally::{Tally, judge};

/// The faults a soak injects unless told otherwise.
pub const SOAK_FAULTS: &[&str] = &[
    "postgres-kill",
    "receiver-reset",
    "pg-connection-limit",
    "receiver-blackhole",
    "pg-cancel-storm",
];

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
