//! `walhook bench noisy-neighbour`: isolation, measured.
//!
//! One run, two phases. A healthy tenant (4 endpoints answering 200) gets
//! the same steady load in both. In the second phase a noisy tenant joins,
//! with 1,000 endpoints that all answer 500 and a load of its own, and one
//! endpoint of a third tenant that hangs until the request timeout. The
//! healthy tenant's commit→first-attempt latency in each phase, and the
//! ratio of the two, say how well walhook isolates tenants (the aim is a p99
//! ratio ≤ 1.2).

use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use walhook_devkit::receiver::Behaviour;

use super::world::World;

/// Arguments of `walhook bench noisy-neighbour`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The healthy tenant's orders per second (4 endpoints each).
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// The noisy tenant's orders per second (1,000 failing endpoints each).
    #[arg(long, default_value_t = 1)]
    pub noisy_rate: u64,
    /// Failing endpoints of the noisy tenant.
    #[arg(long, default_value_t = 1000)]
    pub noisy_endpoints: u32,
    /// Length of each phase.
    #[arg(long, default_value = "30s", value_parser = walhook_pipeline::duration::parse)]
    pub phase: Duration,
    /// Print only the JSON result.
    #[arg(long)]
    pub json: bool,
}

const PHASE_TWO: i64 = 1 << 40;

async fn phase(
    world: &World,
    tenant: &str,
    first_id: i64,
    rate: u64,
    length: Duration,
    label: &str,
    json: bool,
) -> anyhow::Result<u64> {
    let (written, stop, tasks) = world.writers(tenant, first_id, rate as f64, 1, 2).await?;
    super::hold(length, label, json).await;
    stop.cancel();
    for t in tasks {
        t.await??;
    }
    Ok(written.load(Ordering::Relaxed))
}

/// Runs the benchmark.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let world = World::start().await?;
    world.endpoints("healthy", 4, 16).await?;
    for path in world.endpoints("noisy", args.noisy_endpoints, 4).await? {
        world
            .receiver
            .set_behaviour(&path, &Behaviour::Status(500))
            .await?;
    }
    for path in world.endpoints("slowpoke", 1, 8).await? {
        world
            .receiver
            .set_behaviour(
                &path,
                &Behaviour::Delay {
                    wait: Duration::from_secs(3600),
                    status: 200,
                },
            )
            .await?;
    }
    let shutdown = CancellationToken::new();
    let running = world
        .run(
            "request_timeout = \"10s\"",
            "[retry]\nbase_delay = \"1s\"\nmax_delay = \"30s\"\n",
            shutdown.clone(),
        )
        .await?;

    let quiet = phase(
        &world,
        "healthy",
        0,
        args.rate,
        args.phase,
        "phase 1: healthy alone",
        args.json,
    )
    .await?;
    // Phase 2: the healthy load again, with the noise.
    let (noisy_written, noisy_stop, noisy_tasks) = world
        .writers("noisy", 2 * PHASE_TWO, args.noisy_rate as f64, 1, 1)
        .await?;
    let (slow_written, slow_stop, slow_tasks) =
        world.writers("slowpoke", 3 * PHASE_TWO, 5.0, 1, 1).await?;
    let loud = phase(
        &world,
        "healthy",
        PHASE_TWO,
        args.rate,
        args.phase,
        "phase 2: with the noise",
        args.json,
    )
    .await?;
    noisy_stop.cancel();
    slow_stop.cancel();
    for t in noisy_tasks.into_iter().chain(slow_tasks) {
        t.await??;
    }
    // Let the last healthy deliveries of phase 2 start.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let [q50, q99, _] = world.first_attempt_latency("healthy", 0, PHASE_TWO).await?;
    let [l50, l99, _] = world
        .first_attempt_latency("healthy", PHASE_TWO, i64::MAX)
        .await?;
    let (quiet_fanout, quiet_dispatch) = world.stage_p99("healthy", 0, PHASE_TWO).await?;
    let (loud_fanout, loud_dispatch) = world.stage_p99("healthy", PHASE_TWO, i64::MAX).await?;
    // When the tail happened: the first seconds of the noise (its
    // endpoints failing before their circuits open) or all along.
    let noise = ["noisy", "slowpoke"];
    let quiet_seconds = world.p99_by_second("healthy", 0, PHASE_TWO, &noise).await?;
    let loud_seconds = world
        .p99_by_second("healthy", PHASE_TWO, i64::MAX, &noise)
        .await?;
    let by_second = |v: &[(f64, i64)]| {
        v.iter()
            .map(|(p99, others)| serde_json::json!({ "p99_ms": p99, "noise_attempts": others }))
            .collect::<Vec<_>>()
    };
    let profile = |v: &[(f64, i64)]| {
        v.iter()
            .map(|(p99, _)| format!("{p99:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let noisy_attempts: i64 = world
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.attempts WHERE tenant_id IN ('noisy', 'slowpoke')",
            &[],
        )
        .await?
        .get(0);
    shutdown.cancel();
    running.wait().await?;
    let result = serde_json::json!({
        "scenario": "noisy-neighbour",
        "healthy_rate": args.rate,
        "healthy_endpoints": 4,
        "noisy_endpoints": args.noisy_endpoints,
        "noisy_events": noisy_written.load(Ordering::Relaxed),
        "slow_endpoint_events": slow_written.load(Ordering::Relaxed),
        "noisy_attempts": noisy_attempts,
        "healthy_events": { "quiet": quiet, "noisy": loud },
        "healthy_first_attempt_ms": {
            "quiet": { "p50": q50, "p99": q99 },
            "noisy": { "p50": l50, "p99": l99 },
        },
        "healthy_stage_p99_ms": {
            "quiet": { "commit_to_delivery_made": quiet_fanout, "made_to_first_attempt": quiet_dispatch },
            "noisy": { "commit_to_delivery_made": loud_fanout, "made_to_first_attempt": loud_dispatch },
        },
        "healthy_by_second": { "quiet": by_second(&quiet_seconds), "noisy": by_second(&loud_seconds) },
        "ratio_p50": l50 / q50,
        "ratio_p99": l99 / q99,
    });
    if !args.json {
        println!(
            "noisy-neighbour benchmark: healthy tenant {} orders/s × 4 endpoints; noisy tenant {} endpoints all 500; one endpoint hanging",
            args.rate, args.noisy_endpoints
        );
        println!(
            "  healthy first attempt      {:>10} {:>10}",
            "p50 ms", "p99 ms"
        );
        println!("  alone                      {q50:>10.1} {q99:>10.1}");
        println!("  with the noise             {l50:>10.1} {l99:>10.1}");
        println!(
            "  ratio                      {:>10.2} {:>10.2}",
            l50 / q50,
            l99 / q99
        );
        println!(
            "  p99 commit→delivery made   {quiet_fanout:>10.1} {loud_fanout:>10.1}   (alone, with the noise)"
        );
        println!("  p99 made→first attempt     {quiet_dispatch:>10.1} {loud_dispatch:>10.1}");
        println!("  noisy/slow attempts made   {noisy_attempts:>10}");
        println!("  healthy p99 ms, second by second:");
        println!("    alone           {}", profile(&quiet_seconds));
        println!("    with the noise  {}", profile(&loud_seconds));
    }
    println!("{}", serde_json::to_string(&result)?);
    Ok(ExitCode::SUCCESS)
}
