//! The round runner: the seeded rounds of `walhook chaos`, each writing
//! orders while it injects its one fault, restarting whatever died, then
//! waiting for the round's webhooks and handing them to the verdict.

use std::collections::HashSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use walhook_devkit::faultproxy::Fault;
use walhook_devkit::fluvio::FluvioCluster;
use walhook_devkit::postgres::{Reconnecting, connect_retrying};

use super::Args;
use super::faults::{FAULT_HOLD, chosen_faults, faults_of, network_fault, start_storm};
use super::process::{Walhook, signal_pid};
use super::stages;
use super::verdict::{ChaosReport, RoundResult, arrived, judge, print_summary};
use super::world::{INSERT_ORDERS, MEMBER_LEASE, TENANTS, World};

/// Orders in the large transaction of a `capture.mid_transaction` round:
/// more than two of capture's 4,096-event parts.
const LARGE_TX: i64 = 10_000;

/// A deterministic generator (SplitMix64): the same seed, the same run.
pub(super) struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The order the faults take turns in: shuffled by the seed (with a
/// generator of its own, so the rounds' other choices stay those of the
/// seed), so that a short run samples different faults from seed to seed
/// while any `faults.len()` consecutive rounds still give every fault one
/// turn.
pub(super) fn fault_order(faults: &[String], seed: u64) -> Vec<String> {
    let mut order = faults.to_vec();
    let mut rng = Rng(seed ^ 0x6661_756C_7473_2121);
    for i in (1..order.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// Runs the chaos rounds.
pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let fluvio = args.log == "fluvio";
    if args.by_endpoint && !fluvio {
        anyhow::bail!(
            "--by-endpoint puts a deliveries topic between fan-out and dispatch members on Fluvio: add --log fluvio"
        );
    }
    let faults = chosen_faults(&args.faults, &faults_of(fluvio), fluvio)?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut rng = Rng(seed);
    let faults = fault_order(&faults, seed);
    println!(
        "walhook chaos: {} rounds, seed {seed} (repeat with --seed {seed}), faults in turn: {}",
        args.rounds,
        faults.join(", ")
    );

    let cluster = if fluvio {
        let Some(cluster) = FluvioCluster::builder("walhook chaos --log fluvio")
            .own()
            .start()
        else {
            anyhow::bail!(
                "--log fluvio starts a throwaway Fluvio cluster: set WALHOOK_FLUVIO_TOOLS to the directory with \
                 bin/fluvio-run and bin/fluvio (the Fluvio tools)"
            );
        };
        println!(
            "  on a Fluvio cluster at {}: walhook capture and {} fan-out members{}",
            cluster.endpoint(),
            args.members,
            if args.by_endpoint {
                format!(
                    ", {} dispatch members over a deliveries topic keyed by endpoint",
                    args.members
                )
            } else {
                String::new()
            }
        );
        Some(cluster)
    } else {
        None
    };
    let dispatchers = if args.by_endpoint { args.members } else { 0 };
    let mut world =
        World::start_on(1, cluster, args.by_endpoint.then_some(args.members.max(2))).await?;
    let mut stages = stages::Stages::start(
        world.cfg.clone(),
        world.log.clone(),
        fluvio.then_some((args.members, dispatchers)),
    )?;
    world.wait_streaming().await?;

    let mut next_id = 0i64;
    let mut results = Vec::new();
    let bar = walhook_cli::progress::bar(u64::from(args.rounds), "chaos rounds");
    for round in 1..=args.rounds {
        let fault = faults[(round as usize - 1) % faults.len()].clone();
        let mut injected = String::new();
        // The process the round's failpoint, kill or freeze aims at.
        let target = stages.target(&fault, &mut rng);
        // A failpoint needs walhook started with it.
        if fault.contains('.') {
            // Points hit once per batch (a part of the large transaction, a
            // fan-out chunk, a recorder batch, a slot confirmation) are hit
            // only a few times in a round, the more rarely the busier the
            // machine (bigger batches): k is 1 to 3 there; the points hit
            // per transaction or attempt take k up to a tenth of the writes.
            let hits = match fault.as_str() {
                "capture.mid_transaction" => 2,
                "capture.before_confirm"
                | "fanout.before_materialize"
                | "fanout.after_materialize"
                | "fanout.after_commit"
                | "dispatch.after_record" => 3,
                _ => u64::from(args.writes / 10).max(1),
            };
            let hit = 1 + rng.below(hits);
            injected = format!("{fault}=abort@{hit}");
            stages.restart(target, Some(&injected))?;
            if fluvio {
                injected = format!("{injected} in {}", stages.name(target));
                if stages.joins(target) {
                    world.wait_holding(stages.pid(target)).await?;
                }
            }
        }
        let kill_at = rng.below(u64::from(args.writes).max(1)) as u32;
        let victim = rng.below(world.endpoints.len() as u64) as usize;
        let first_id = next_id + 1;
        let round_started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // A write's outcome may be unknown (a crash): the checker reads
        // what the database kept, so errors do not matter here.
        let mut writer = Reconnecting::new(world.pg.url("shop"));
        let mut restarted = false;
        let mut storm = None;
        let mut thaw = None;
        let mut standby = if fault == "lease-expiry" {
            Some(Walhook::start_standby(&world.cfg, &world.log)?)
        } else {
            None
        };
        for i in 0..args.writes {
            if i == kill_at {
                match fault.as_str() {
                    "sigkill" => {
                        injected = format!("SIGKILL of {} after {i} writes", stages.name(target));
                        stages.kill(target);
                    }
                    "spu-kill" => {
                        injected =
                            format!("SIGKILL of the SPU after {i} writes, restarted 2 s later");
                        let cluster = world
                            .cluster
                            .clone()
                            .context("spu-kill needs --log fluvio")?;
                        cluster.kill_spu();
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let _ =
                                tokio::task::spawn_blocking(move || cluster.restart_spu()).await;
                        }));
                    }
                    "member-freeze" => {
                        let hold = MEMBER_LEASE + Duration::from_secs(3);
                        injected = format!(
                            "SIGSTOP of {} for {} s (its lease: {} s) after {i} writes",
                            stages.name(target),
                            hold.as_secs(),
                            MEMBER_LEASE.as_secs()
                        );
                        let pid = stages.pid(target);
                        signal_pid(pid, "STOP");
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(hold).await;
                            signal_pid(pid, "CONT");
                        }));
                    }
                    "postgres-kill" => {
                        injected = format!("kill -9 of Postgres after {i} writes");
                        world
                            .pg
                            .crash_and_restart(Duration::from_millis(500))
                            .await?;
                    }
                    network if network.starts_with("receiver-") => {
                        let f = network_fault(network).unwrap_or(Fault::None);
                        injected = format!("{f:?} at {} for 3 s", world.endpoints[victim].path);
                        world.endpoints[victim].proxy.set(f);
                    }
                    "capture.mid_transaction" => {
                        let (first, last) = (next_id + 1, next_id + LARGE_TX);
                        next_id = last;
                        let _ = writer.execute(INSERT_ORDERS, &[&first, &last]).await;
                    }
                    "lease-expiry" => {
                        injected = format!("SIGSTOP of walhook run for 13 s after {i} writes");
                        let pid = stages.pid(target);
                        signal_pid(pid, "STOP");
                        thaw = Some(tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_secs(13)).await;
                            signal_pid(pid, "CONT");
                        }));
                    }
                    other => storm = start_storm(other, &world.pg),
                }
            }
            // Mostly new orders; now and then one of this round's is paid.
            if next_id >= first_id && rng.below(4) == 0 {
                let id = first_id + rng.below((next_id - first_id + 1) as u64) as i64;
                let _ = writer
                    .execute(
                        "UPDATE orders SET status = 'paid' WHERE id = $1 AND status <> 'paid'",
                        &[&id],
                    )
                    .await;
            } else {
                next_id += 1;
                let tenant = TENANTS[rng.below(TENANTS.len() as u64) as usize];
                let _ = writer
                    .execute(
                        "INSERT INTO orders (id, tenant_id, total) VALUES ($1, $2, 9.99)",
                        &[&next_id, &tenant],
                    )
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            if stages.restart_dead()? {
                restarted = true;
                if injected.is_empty() {
                    injected = fault.clone();
                }
            }
        }
        if fault.starts_with("receiver-") {
            tokio::time::sleep(FAULT_HOLD).await;
            world.endpoints[victim].proxy.set(Fault::None);
        }
        if let Some(storm) = storm {
            injected = storm.await??;
        }
        if let Some(thaw) = thaw {
            thaw.await?;
        }
        let last_write = Instant::now();

        // What the business database kept of this round: the truth.
        let shop = connect_retrying(&world.pg.url("shop"), Duration::from_secs(30)).await?;
        let rows = shop
            .query(
                "SELECT id, tenant_id, status FROM orders WHERE id >= $1 AND id <= $2",
                &[&first_id, &next_id],
            )
            .await?;
        let mut expected: HashSet<(String, String, String)> = HashSet::new();
        let mut facts = 0u64;
        for r in &rows {
            let (id, tenant, status): (i64, String, String) = (r.get(0), r.get(1), r.get(2));
            let mut types = vec!["order.created"];
            if status == "paid" {
                types.push("order.paid");
            }
            for t in types {
                facts += 1;
                for ep in world.endpoints.iter().filter(|e| e.wants(&tenant, t)) {
                    expected.insert((ep.path.clone(), t.to_owned(), id.to_string()));
                }
            }
        }
        let in_round = |object: &str| {
            object
                .parse::<i64>()
                .is_ok_and(|id| id >= first_id && id <= next_id)
        };
        let deadline = Instant::now() + args.settle;
        loop {
            if stages.restart_dead()? {
                restarted = true;
            }
            let got = arrived(&world.receiver, &in_round);
            if expected.iter().all(|k| got.contains_key(k)) || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let settle_seconds = last_write.elapsed().as_secs_f64();
        if let Some(mut node) = standby.take() {
            node.stop();
        }
        // A failpoint that did not fire must not leak into later rounds.
        if fault.contains('.') && !restarted {
            stages.restart(target, None)?;
        }
        // Late duplicates show within a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut result = judge(&world.receiver, &expected, &in_round);
        result.slowest_attempt_ms = connect_retrying(&world.platform_url, Duration::from_secs(30))
            .await?
            .query_one(
                "SELECT coalesce(max(latency_ms), 0)::int8 FROM walhook.attempts \
                 WHERE started_at >= to_timestamp($1)",
                &[&round_started],
            )
            .await?
            .get(0);
        result.round = round;
        result.fault = fault;
        result.injected = injected;
        result.facts = facts;
        result.walhook_restarted = restarted;
        result.settle_seconds = (settle_seconds * 10.0).round() / 10.0;
        bar.inc(1);
        bar.set_message(format!(
            "round {round}: lost {}, dup {}",
            result.lost, result.duplicate_sends
        ));
        results.push(result);
    }
    bar.finish_and_clear();
    stages.stop();
    let platform_sql = connect_retrying(&world.platform_url, Duration::from_secs(30)).await?;
    let unknown: i64 = platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE note = 'previous_outcome_unknown'",
            &[],
        )
        .await?
        .get(0);
    let report = ChaosReport {
        seed,
        clean: results.iter().all(RoundResult::clean),
        rounds: results,
        attempts_after_unknown_outcome: unknown,
    };
    print_summary(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if !report.clean || args.keep_log {
        world.keep_log();
    }
    Ok(if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::fault_order;

    #[test]
    fn the_seed_shuffles_the_faults_turns_and_every_fault_keeps_one() {
        let faults: Vec<String> = (0..20).map(|i| format!("fault-{i:02}")).collect();
        let first_five = |seed| fault_order(&faults, seed)[..5].to_vec();
        for seed in [1, 2, 20261201] {
            let mut order = fault_order(&faults, seed);
            assert_eq!(
                order,
                fault_order(&faults, seed),
                "the same seed, the same order"
            );
            order.sort();
            assert_eq!(order, faults, "every fault has exactly one turn");
        }
        assert!(
            (2..10).any(|seed| first_five(seed) != first_five(1)),
            "five rounds run the same faults whatever the seed"
        );
        assert_eq!(fault_order(&faults[..1], 7), faults[..1]);
        assert!(fault_order(&[], 7).is_empty());
    }
}
