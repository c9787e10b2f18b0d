//! `walhook bench black-hole`: what black-holed endpoints cost the others.
//!
//! Four tenants with ten endpoints each, all answering 200, under one
//! steady load in two phases. In the second, one endpoint of every tenant
//! (10 % of the endpoints) becomes a black hole: it accepts requests and
//! never answers, so each of its attempts holds a connection and an
//! in-flight slot until the request timeout. The healthy endpoints'
//! commit→first-attempt latency in each phase, and the ratio, say what the
//! black holes cost them (the aim: p99 moves less than 20 %).

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walhook_devkit::receiver::Behaviour;

use super::world::World;

/// Arguments of `walhook bench black-hole`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Orders per second over all tenants (each fans out to its tenant's
    /// ten endpoints).
    #[arg(long, default_value_t = 100)]
    pub rate: u64,
    /// Length of each phase.
    #[arg(long, default_value = "30s", value_parser = walhook_pipeline::duration::parse)]
    pub phase: Duration,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
}

const TENANTS: [&str; 4] = ["t1", "t2", "t3", "t4"];
const PER_TENANT: u32 = 10;
const PHASE_TWO: i64 = 1 << 40;

/// Writes every tenant's share of `rate` for `length`; returns the orders
/// written.
async fn phase(
    world: &World,
    first_id: i64,
    rate: u64,
    length: Duration,
    label: &str,
    json: bool,
) -> anyhow::Result<u64> {
    let mut all = Vec::new();
    for (i, tenant) in TENANTS.iter().enumerate() {
        let first = first_id + ((i as i64) << 32);
        all.push(
            world
                .writers(tenant, first, rate as f64 / TENANTS.len() as f64, 1, 1)
                .await?,
        );
    }
    super::hold(length, label, json).await;
    let mut written = 0;
    for (count, stop, tasks) in all {
        stop.cancel();
        for t in tasks {
            t.await??;
        }
        written += count.load(Ordering::Relaxed);
    }
    Ok(written)
}

/// Commit→first-attempt p50 and p99 (ms) of orders with ids in
/// `[from, to)` at endpoints other than `holes` (receiver paths).
async fn healthy_latency(
    world: &World,
    from: i64,
    to: i64,
    holes: &[String],
) -> anyhow::Result<[f64; 2]> {
    let urls: Vec<String> = holes.iter().map(|p| world.receiver.url(p)).collect();
    let row = world
        .platform_sql
        .query_one(
            "SELECT percentile_disc(ARRAY[0.5, 0.99]) WITHIN GROUP \
               (ORDER BY (extract(epoch FROM a.started_at - e.occurred_at) * 1000)::float8), count(*) \
             FROM walhook.attempts a JOIN walhook.deliveries d ON d.id = a.delivery_id \
             JOIN walhook.events e ON e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
             WHERE a.number = 1 AND a.trigger = 'auto' \
               AND e.object_id::int8 >= $1 AND e.object_id::int8 < $2 \
               AND d.endpoint_id NOT IN (SELECT id FROM walhook.endpoints WHERE url = ANY($3))",
            &[&from, &to, &urls],
        )
        .await?;
    let v: Vec<f64> = row.get::<_, Option<Vec<f64>>>(0).unwrap_or_default();
    Ok([0, 1].map(|i| v.get(i).copied().unwrap_or(f64::NAN)))
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let world = World::start().await?;
    let mut holes = Vec::new();
    for tenant in TENANTS {
        let paths = world.endpoints(tenant, PER_TENANT, 16).await?;
        holes.push(paths[0].clone());
    }
    let shutdown = CancellationToken::new();
    let running = world
        .run(
            "request_timeout = \"5s\"",
            "[retry]\nbase_delay = \"1s\"\nmax_delay = \"30s\"\n",
            shutdown.clone(),
        )
        .await?;
    let alone = phase(
        &world,
        0,
        args.rate,
        args.phase,
        "phase 1: all healthy",
        args.json,
    )
    .await?;
    for path in &holes {
        world
            .receiver
            .set_behaviour(
                path,
                &Behaviour::Delay {
                    wait: Duration::from_secs(3600),
                    status: 200,
                },
            )
            .await?;
    }
    let with_holes = phase(
        &world,
        PHASE_TWO,
        args.rate,
        args.phase,
        "phase 2: 10 % black holes",
        args.json,
    )
    .await?;
    // Let the last healthy deliveries start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let [a50, a99] = healthy_latency(&world, 0, PHASE_TWO, &holes).await?;
    let [h50, h99] = healthy_latency(&world, PHASE_TWO, i64::MAX, &holes).await?;
    let urls: Vec<String> = holes.iter().map(|p| world.receiver.url(p)).collect();
    let hole_attempts: i64 = world
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts a JOIN walhook.endpoints e ON e.id = a.endpoint_id \
             WHERE e.url = ANY($1) AND a.outcome <> 'succeeded'",
            &[&urls],
        )
        .await?
        .get(0);
    shutdown.cancel();
    running.wait().await?;
    let endpoints = TENANTS.len() as u32 * PER_TENANT;
    let result = serde_json::json!({
        "scenario": "black-hole",
        "rate": args.rate,
        "endpoints": endpoints,
        "black_holed_endpoints": holes.len(),
        "orders": { "alone": alone, "with_black_holes": with_holes },
        "black_hole_attempts_failed": hole_attempts,
        "healthy_first_attempt_ms": {
            "alone": { "p50": a50, "p99": a99 },
            "with_black_holes": { "p50": h50, "p99": h99 },
        },
        "ratio_p50": h50 / a50,
        "ratio_p99": h99 / a99,
    });
    if !args.json {
        println!(
            "black-hole benchmark: {} orders/s over {} tenants × {PER_TENANT} endpoints; phase 2 black-holes {} of {endpoints}",
            args.rate,
            TENANTS.len(),
            holes.len()
        );
        println!(
            "  healthy first attempt      {:>10} {:>10}",
            "p50 ms", "p99 ms"
        );
        println!("  all healthy                {a50:>10.1} {a99:>10.1}");
        println!("  with black holes           {h50:>10.1} {h99:>10.1}");
        println!(
            "  ratio                      {:>10.2} {:>10.2}",
            h50 / a50,
            h99 / a99
        );
        println!(
            "  black-holed attempts       {hole_attempts:>10} (each ended by the request timeout)"
        );
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(ExitCode::SUCCESS)
}
