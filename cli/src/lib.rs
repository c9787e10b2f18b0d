//! The production commands of `walhook`: a thin composition root.
//!
//! It loads the config (`walhook-config`, re-exported as [`config`]),
//! maps it onto the runtime of `walhook-pipeline` and runs it. Each subcommand is a module of [`commands`]; the binary (package
//! `walhook`, in `bin/`) parses the command line into [`Command`] and, in
//! the default build, the lab's commands (`walhook-lab`: bench, chaos,
//! demo), which a production build leaves out.

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod commands;
pub mod metrics;
pub mod pipeline;
pub mod progress;

pub use walhook_config as config;

use std::process::ExitCode;

use clap::Subcommand;

/// The commit this binary was built from (`git rev-parse --short=12 HEAD`
/// when `cli/build.rs` ran, followed by "-dirty" when a source of the
/// binary differed from it), or "unknown" outside a git checkout. The
/// environment variable is set for this crate only: other crates read it
/// here.
pub const BUILD_COMMIT: &str = env!("WALHOOK_COMMIT");

/// What `walhook --version` prints after the name: the release, the commit
/// it was built from and the platform schema version it brings (the
/// migrations `walhook migrate` applies up to).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("WALHOOK_COMMIT"),
    ", schema version ",
    env!("WALHOOK_SCHEMA_LEVEL"),
    ")"
);

/// The production subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read the captured database's tables and write a commented
    /// walhook.toml (a rule per table and operation, outboxes recognised)
    /// and walhook-setup.sql (least-privilege roles, publication, replica
    /// identity), to review and apply. Changes nothing in the database.
    Init(commands::init::Args),
    /// Create or upgrade the platform schema `walhook` (idempotent).
    Migrate(commands::migrate::Args),
    /// Check every precondition of `walhook run` at once, changing nothing:
    /// the captured database (wal_level, the role, slots, the publication,
    /// each rule against its table), the platform schema, the master key
    /// and the clock; each problem with its fix; exit 1 if one fails.
    Doctor(commands::doctor::Args),
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
    /// Check a URL against the egress policy (URL rules, then every address
    /// its name resolves to) without sending anything; exit 1 if refused.
    CheckUrl(commands::check_url::Args),
    /// Master keys for endpoint secrets at rest: generate one, re-seal every
    /// secret under the current key, show which keys seal how many rows.
    Secrets(commands::secrets::Args),
}

/// Structured logs on stderr in `format` (`text` or `json`), at the level
/// of WALHOOK_LOG or RUST_LOG, else `default`.
pub fn init_logging(format: &str, default: &str) {
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

/// Runs `work` on a new multi-threaded runtime; errors go to stderr with
/// their causes, and the exit status is then 1.
pub fn block_on(work: impl std::future::Future<Output = anyhow::Result<ExitCode>>) -> ExitCode {
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
    match runtime.block_on(work) {
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

/// Runs a production command.
pub async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Migrate(args) => commands::migrate::run(args).await,
        Command::Doctor(args) => commands::doctor::run(args).await,
        Command::Init(args) => commands::init::run(args).await,
        Command::Run(args) => commands::run::run(args).await,
        Command::Api(args) => commands::api::run(args).await,
        Command::Capture(args) => commands::capture::run(args).await,
        Command::Dispatch(args) => commands::dispatch::run(args).await,
        Command::Fanout(args) => commands::fanout::run(args).await,
        Command::Archive(args) => commands::archive::run(args),
        Command::Reconcile(args) => commands::reconcile::run(args).await,
        Command::CheckUrl(args) => commands::check_url::run(args).await,
        Command::Secrets(args) => commands::secrets::run(args).await,
    }
}
