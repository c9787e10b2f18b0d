//! `walhook chaos`: seeded rounds of a realistic workload, each with one
//! injected fault, judged by a checker that trusts only the business
//! database and what the receivers logged.
//!
//! One throwaway Postgres (business and platform databases), three tenants
//! with two endpoints each on a loopback receiver, every endpoint behind a
//! fault proxy of its own, and `walhook run` as a child process (so that it
//! can be killed). Each round writes orders (inserts, some paid later),
//! injects one fault, restarts whatever died, waits for the round's
//! webhooks, and compares:
//!
//! - **lost**: a committed fact a subscribed endpoint never got a 2xx for;
//! - **unexpected**: a webhook for a fact that was not committed, or at an
//!   endpoint that did not subscribe to it;
//! - **unstable ids**: one fact at one endpoint under two `webhook-id`s;
//! - **bad signatures**: a request whose signature did not verify with the
//!   endpoint's secret;
//! - **duplicate sends**: 2xx answers beyond the first per fact and
//!   endpoint (allowed by at-least-once), and how many of them the history
//!   explains (attempts noted `previous_outcome_unknown`).
//!
//! Its parts:
//!
//! - `args`: the command line;
//! - `faults`: the fault catalogue, and the faults a run asks for checked
//!   against those its log can have;
//! - `world`: the throwaway Postgres, tenants, endpoints, fault proxies,
//!   receiver and config;
//! - `process` and `stages`: the walhook processes, started, killed,
//!   frozen and restarted;
//! - `storm`: the Postgres storms;
//! - `rounds`: the round runner;
//! - `verdict`: what each round found and the run's report;
//! - `soak`: the long run at a steady rate instead of rounds, with its
//!   samples, charts (`svg`) and report.

mod args;
mod faults;
mod process;
mod rounds;
mod soak;
mod stages;
mod storm;
mod svg;
mod verdict;
mod world;

use std::process::ExitCode;

pub use args::Args;
pub use faults::FAULTS;
pub use verdict::{ChaosReport, RoundResult};

/// Runs the chaos rounds, or the soak.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(length) = args.soak {
        return soak::run(&args, length).await;
    }
    rounds::run(args).await
}
