//! The `walhook` command: a thin composition root.
//!
//! It loads the config, wires the stages from the library crates and runs
//! them; nothing depends on it. Each subcommand is a module of
//! [`commands`].

pub mod commands;
pub mod config;
pub mod metrics;
pub mod pipeline;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Committed Postgres changes become signed webhooks.
///
/// walhook tails the business database's WAL through logical replication,
/// turns row changes into events with the capture rules of the config file,
/// fans each event out to the tenant's subscribed endpoints and delivers
/// signed (Standard Webhooks) attempts with retries: at least once, never a
/// silent loss.
#[derive(Debug, Parser)]
#[command(name = "walhook", version, about, long_about, propagate_version = true)]
pub struct Cli {
    /// Log format on stderr: `text` or `json`. The level comes from
    /// WALHOOK_LOG (or RUST_LOG), e.g. `info` or `walhook=debug`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the platform schema `walhook` (idempotent).
    Migrate(commands::migrate::Args),
    /// Watch business writes become verified webhooks on a throwaway
    /// Postgres with local receivers (needs only the Postgres binaries).
    Demo(commands::demo::Args),
    /// Run every stage in one process (capture, fan-out, dispatch), and the
    /// REST API when the config has [api].
    Run(commands::run::Args),
    /// Serve the control-plane REST API alone (tenants, endpoints,
    /// deliveries, replays, audit; OpenAPI at /openapi.json).
    Api(commands::api::Args),
    /// Run the capture stage alone: into the Fluvio log ([log] kind =
    /// "fluvio"), or with --stdout, print events to try rules.
    Capture(commands::capture::Args),
    /// Run a fan-out member on the Fluvio log: fan-out of its share of the
    /// events partitions (--member I/N) and the dispatcher that sends them.
    Fanout(commands::fanout::Args),
    /// Run a dispatcher node alone (no capture, no fan-out): it claims what
    /// is due and held by no live node, e.g. a crashed node's deliveries.
    Dispatch(commands::dispatch::Args),
    /// Move days past the hot window to Parquet (local directory or S3),
    /// verified, then drop them from Postgres; --dry-run shows what is due.
    Archive(commands::archive::Args),
    /// Compare every stage for a window (captured -> events -> expected and
    /// made deliveries -> attempts -> archive), classify every gap, repair
    /// with --repair, and write a JSON or HTML report; exit 3 on gaps.
    Reconcile(commands::reconcile::Args),
    /// Measure throughput and latency on a throwaway Postgres.
    Bench(commands::bench::Args),
    /// Seeded rounds of a workload on a throwaway Postgres, each with one
    /// injected fault (failpoints, SIGKILL, kill -9 of Postgres, network
    /// faults), judged against the business database: lost, unexpected,
    /// unstable ids, bad signatures, duplicate sends; exit 1 unless clean.
    Chaos(commands::chaos::Args),
    /// Check a URL against the egress policy (URL rules, then every address
    /// its name resolves to) without sending anything; exit 1 if refused.
    CheckUrl(commands::check_url::Args),
    /// Master keys for endpoint secrets at rest: generate one, re-seal every
    /// secret under the current key, show which keys seal how many rows.
    Secrets(commands::secrets::Args),
}

fn init_logging(format: &str, default: &str) {
    let filter = std::env::var("WALHOOK_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .unwrap_or_else(|_| default.into());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (the log's disk is full, stderr is
    // a closed pipe) is lost, never a panic: tracing-subscriber reports its
    // own write errors with `eprintln!`, which panics when stderr fails,
    // and that panic ended walhook's tasks in a soak whose disk filled.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// `walhook bench --scenario NAME …` (the spelling of the issue that asked
/// for the benchmarks) is `walhook bench NAME …`.
fn scenario_flag_as_subcommand(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let Some(bench) = args.iter().position(|a| a == "bench") else {
        return args;
    };
    let Some(at) = args[bench + 1..]
        .iter()
        .position(|a| a == "--scenario" || a.to_string_lossy().starts_with("--scenario="))
        .map(|i| i + bench + 1)
    else {
        return args;
    };
    let flag = args[at].to_string_lossy().into_owned();
    if let Some(name) = flag.strip_prefix("--scenario=") {
        args[at] = name.into();
    } else if at + 1 < args.len() {
        args.remove(at);
    }
    args
}

/// Parses the command line and runs the command; errors go to stderr with
/// their causes, and the exit status is 1 (2 for usage errors, by clap).
pub fn main() -> ExitCode {
    let cli = Cli::parse_from(scenario_flag_as_subcommand(std::env::args_os().collect()));
    // The demo and benchmarks talk to a person: keep the logs to warnings.
    let quiet = matches!(
        cli.command,
        Command::Demo(_) | Command::Bench(_) | Command::Chaos(_) | Command::CheckUrl(_)
    );
    init_logging(&cli.log_format, if quiet { "warn" } else { "info" });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Migrate(args) => commands::migrate::run(args).await,
        Command::Demo(args) => commands::demo::run(args).await,
        Command::Run(args) => commands::run::run(args).await,
        Command::Api(args) => commands::api::run(args).await,
        Command::Capture(args) => commands::capture::run(args).await,
        Command::Dispatch(args) => commands::dispatch::run(args).await,
        Command::Fanout(args) => commands::fanout::run(args).await,
        Command::Bench(args) => commands::bench::run(args).await,
        Command::Chaos(args) => commands::chaos::run(args).await,
        Command::Archive(args) => commands::archive::run(args),
        Command::Reconcile(args) => commands::reconcile::run(args).await,
        Command::CheckUrl(args) => commands::check_url::run(args).await,
        Command::Secrets(args) => commands::secrets::run(args).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(line: &str) -> String {
        let args = line.split(' ').map(std::ffi::OsString::from).collect();
        scenario_flag_as_subcommand(args)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn bench_takes_the_scenario_as_a_flag_too() {
        assert_eq!(
            rewrite("walhook bench --scenario noisy-neighbour --phase 20s"),
            "walhook bench noisy-neighbour --phase 20s"
        );
        assert_eq!(
            rewrite("walhook --log-format json bench --scenario=pipeline --rate 10"),
            "walhook --log-format json bench pipeline --rate 10"
        );
        assert_eq!(rewrite("walhook bench capture"), "walhook bench capture");
        assert_eq!(rewrite("walhook run --config x"), "walhook run --config x");
        // Parsed for real: the flag form reaches the same subcommand.
        let cli = Cli::try_parse_from(scenario_flag_as_subcommand(
            [
                "walhook",
                "bench",
                "--scenario",
                "noisy-neighbour",
                "--phase",
                "2s",
            ]
            .map(std::ffi::OsString::from)
            .to_vec(),
        ))
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Bench(commands::bench::Args {
                scenario: commands::bench::Scenario::NoisyNeighbour(_)
            })
        ));
    }
}
