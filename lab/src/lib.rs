//! The lab: `walhook demo`, `walhook bench` and `walhook chaos`.
//!
//! They start throwaway clusters (Postgres, Fluvio, receivers, fault
//! proxies) from `walhook-devkit`, so the production commands do not link
//! them: the binary (package `walhook`) includes the lab through its default
//! `lab` feature, and `cargo build --release --no-default-features -p
//! walhook` builds walhook without it (docs/architecture.md).

// Throwaway clusters and lab tools: their tasks live as long as the test
// or the command that made them.
#![allow(clippy::disallowed_methods)]

pub mod bench;
pub mod chaos;
pub mod demo;

use std::process::ExitCode;

use clap::Subcommand;

/// The lab's subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Watch business writes become verified webhooks on a throwaway
    /// Postgres with local receivers (needs only the Postgres binaries).
    Demo(demo::Args),
    /// Measure throughput and latency on a throwaway Postgres.
    Bench(bench::Args),
    /// Seeded rounds of a workload on a throwaway Postgres, each with one
    /// injected fault (failpoints, SIGKILL, kill -9 of Postgres, network
    /// faults), judged against the business database: lost, unexpected,
    /// unstable ids, bad signatures, duplicate sends; exit 1 unless clean.
    Chaos(chaos::Args),
}

/// Runs a lab command.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Chaos(args) => chaos::run(args).await,
    }
}

/// `walhook bench --scenario NAME …` (the spelling of the issue that asked
/// for the benchmarks) is `walhook bench NAME …`.
pub fn scenario_flag_as_subcommand(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// The lab's commands as the binary parses them.
    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

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
            Command::Bench(bench::Args {
                scenario: bench::Scenario::NoisyNeighbour(_)
            })
        ));
    }
}
