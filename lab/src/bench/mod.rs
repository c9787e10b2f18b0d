//! `walhook bench`: throughput and latency, measured on a throwaway
//! Postgres. Benchmarks print figures; tests check behaviour.

pub mod archive;
pub mod blackhole;
pub mod capture;
pub mod cold_reads;
pub mod flood;
pub mod noisy;
pub mod pipeline;
pub mod receiver;
pub mod reconcile;
pub mod world;

use std::process::ExitCode;

/// Arguments of `walhook bench`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "`walhook bench --scenario NAME [flags]` is the same as `walhook bench NAME [flags]`."
)]
pub struct Args {
    /// The scenario to run.
    #[command(subcommand)]
    pub scenario: Scenario,
}

/// Benchmark scenarios.
#[derive(Debug, clap::Subcommand)]
pub enum Scenario {
    /// Capture alone: events/s decoded, canonicalised and handed on, against
    /// pg_recvlogical draining the same changes to /dev/null.
    Capture(capture::Args),
    /// The whole path: committed orders to webhooks on local receivers,
    /// with first-attempt latency percentiles.
    Pipeline(pipeline::Args),
    /// A healthy tenant's first-attempt latency alone and next to a tenant
    /// with 1,000 failing endpoints and a hanging endpoint.
    #[command(name = "noisy-neighbour")]
    NoisyNeighbour(noisy::Args),
    /// Healthy endpoints' first-attempt latency with every endpoint healthy,
    /// then with 10 % of the endpoints black-holed (accept, never answer).
    #[command(name = "black-hole")]
    BlackHole(blackhole::Args),
    /// The archive: attempt rows per second and per core, and Parquet
    /// bytes per attempt.
    Archive(archive::Args),
    /// Reads of archived history through the API: a listing that matches
    /// nothing over 30 archived days of a million deliveries, lookups by
    /// id, and 64 listings at once of one tenant beside another's.
    #[command(name = "cold-reads")]
    ColdReads(cold_reads::Args),
    /// Reconciliation: a two-day window of deliveries and attempts, one day
    /// archived and one hot, reconciled; rows per second.
    Reconcile(reconcile::Args),
    /// The benchmarks' receiver, started by them in a process of its own.
    #[command(hide = true)]
    Receiver,
}

/// Runs a scenario.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.scenario {
        Scenario::Capture(a) => capture::run(a).await,
        Scenario::Pipeline(a) => pipeline::run(a).await,
        Scenario::NoisyNeighbour(a) => noisy::run(a).await,
        Scenario::BlackHole(a) => blackhole::run(a).await,
        Scenario::Archive(a) => archive::run(a).await,
        Scenario::ColdReads(a) => cold_reads::run(a).await,
        Scenario::Reconcile(a) => reconcile::run(a).await,
        Scenario::Receiver => receiver::serve().await,
    }
}

/// Waits `length`, with a progress bar labelled `label` unless `quiet`.
pub async fn hold(length: std::time::Duration, label: &str, quiet: bool) {
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        walhook_cli::progress::bar(length.as_secs(), label)
    };
    let started = std::time::Instant::now();
    while started.elapsed() < length {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        bar.inc(1);
    }
    bar.finish_and_clear();
}
