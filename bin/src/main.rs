//! The `walhook` command: see `walhook --help`.
//!
//! This file only parses the command line: the production commands are
//! `walhook-cli`'s, and the lab's (demo, bench, chaos) come from
//! `walhook-lab` when the `lab` feature is on (the default).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the system allocator: the hot paths allocate many
/// short-lived buffers (request bodies, headers, batch vectors), and glibc's
/// malloc took about a tenth of the process's CPU in the pipeline benchmark
/// (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Committed Postgres changes become signed webhooks.
///
/// walhook tails the business database's WAL through logical replication,
/// turns row changes into events with the capture rules of the config file,
/// fans each event out to the tenant's subscribed endpoints and delivers
/// signed (Standard Webhooks) attempts with retries: at least once, never a
/// silent loss.
#[derive(Debug, Parser)]
#[command(
    name = "walhook",
    version = walhook_cli::VERSION,
    about,
    long_about,
    propagate_version = true
)]
struct Cli {
    /// Log format on stderr: `text` or `json`. The level comes from
    /// WALHOOK_LOG (or RUST_LOG), e.g. `info` or `walhook=debug`.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,

    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// Every subcommand.
#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Product(walhook_cli::Command),
    #[cfg(feature = "lab")]
    #[command(flatten)]
    Lab(walhook_lab::Command),
}

/// Transparent huge pages off for this process, unless the operator set
/// `MIMALLOC_ALLOW_THP` (their choice wins). mimalloc asks for huge pages
/// on its arenas (`madvise`), and the first touch of each one zeroes 2 MiB
/// in the thread that allocated: when a burst grew the heap (a tenant's
/// 1,000 failing endpoints arriving at once), a tokio worker stalled for
/// tens of milliseconds and a healthy tenant's p99 in that second went from
/// about 10 to 27–48 ms (docs/performance.md, "Isolation under load").
/// walhook's heap is tens of MiB, so huge pages buy it little.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none()
        && let Err(e) = rustix::thread::disable_transparent_huge_pages(true)
    {
        eprintln!("walhook: could not turn transparent huge pages off ({e}); going on with them");
    }
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    #[cfg(feature = "lab")]
    let args = walhook_lab::scenario_flag_as_subcommand(args);
    let cli = Cli::parse_from(args);
    // The lab's commands and check-url talk to a person: keep the logs to
    // warnings.
    let quiet = match &cli.command {
        Command::Product(c) => matches!(c, walhook_cli::Command::CheckUrl(_)),
        #[cfg(feature = "lab")]
        Command::Lab(_) => true,
    };
    walhook_cli::init_logging(&cli.log_format, if quiet { "warn" } else { "info" });
    walhook_cli::block_on(async move {
        match cli.command {
            Command::Product(c) => walhook_cli::run(c).await,
            #[cfg(feature = "lab")]
            Command::Lab(c) => walhook_lab::run(c).await,
        }
    })
}
