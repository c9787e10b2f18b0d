//! `walhook capture`: the capture stage alone.
//!
//! On the Fluvio log (`[log] kind = "fluvio"`) it writes the events topic,
//! and confirms the slot once the cluster stored a transaction's events
//! (fan-out members read them: `walhook fanout`). With `--stdout` it prints every event body as one line of canonical JSON
//! and confirms nothing to the slot (unless `--confirm`), so users try their
//! rules against real traffic before going live. Incidents go to stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::bail;
use walhook_connectors::postgres::{CaptureObserver, PostgresSource, RunOptions};
use walhook_pipeline::capture::{Incident, WriterSink};

use crate::config::{Config, LogKind};
use crate::pipeline::Roles;

/// Arguments of `walhook capture`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file ([source] and [[rules]]).
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// Print events to stdout, one canonical JSON line each, instead of
    /// handing them on.
    #[arg(long)]
    pub stdout: bool,
    /// With --stdout: confirm printed transactions to the slot, so that the
    /// next run starts after them. Without it the slot does not move.
    #[arg(long, requires = "stdout")]
    pub confirm: bool,
    /// Stop once every change committed before the command started has been
    /// read (instead of running until Ctrl-C).
    #[arg(long)]
    pub until_caught_up: bool,
    /// With the Fluvio log: serve Prometheus metrics of this process at
    /// http://ADDR/metrics (and /healthz), for example 127.0.0.1:9464. No
    /// token is asked for and the labels name tenants and endpoints: keep
    /// it on loopback.
    #[arg(long, value_name = "ADDR", conflicts_with = "stdout")]
    pub metrics_listen: Option<String>,
    /// When the replication slot this source read from is gone (dropped,
    /// or lost and then dropped): record the changes it held as a gap (a
    /// `slot_reset` capture incident, shown by `walhook reconcile`) and
    /// start a new slot at the current position. Without it walhook stops
    /// and says so; use it once, after deciding how to re-send the gap.
    #[arg(long, conflicts_with = "stdout")]
    pub accept_slot_loss: bool,
}

/// Prints incidents to stderr as JSON lines.
struct StderrObserver;

impl CaptureObserver for StderrObserver {
    fn incident(&self, incident: &Incident) {
        if let Ok(line) = serde_json::to_string(incident) {
            eprintln!("incident: {line}");
        }
    }
}

/// Runs capture.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cfg = Config::load(&args.config)?;
    cfg.warn_unauthenticated_databases(true);
    cfg.accept_slot_loss = args.accept_slot_loss;
    if !args.stdout && cfg.log.kind == LogKind::Fluvio {
        if args.until_caught_up {
            bail!(
                "--until-caught-up goes with --stdout (trying rules); capture into the log runs until stopped"
            );
        }
        let roles = Roles {
            capture: true,
            workers: None,
            dispatch: None,
            tasks: Vec::new(),
        };
        let platform = cfg.platform()?.platform()?;
        return super::run_stages(
            &cfg,
            platform,
            roles,
            args.metrics_listen.as_deref(),
            "capture",
        )
        .await;
    }
    if !args.stdout {
        bail!(
            "the embedded log lives inside one process: run the whole pipeline with `walhook run \
             --config {}`, set [log] kind = \"fluvio\" to run capture alone, or try the rules with \
             `walhook capture --stdout`",
            args.config.display()
        );
    }
    let source = PostgresSource::prepare(cfg.source.clone(), cfg.rules.clone()).await?;
    let shutdown = super::shutdown_on_signals();
    let options = RunOptions {
        confirm: args.confirm,
        stop_when_caught_up: args.until_caught_up,
    };
    let sink = WriterSink::new(std::io::BufWriter::new(std::io::stdout()));
    let stats = source
        .run(sink, Arc::new(StderrObserver), options, shutdown)
        .await?;
    tracing::info!(
        transactions = stats.transactions,
        changes = stats.changes,
        events = stats.events,
        incidents = stats.incidents,
        confirmed = %stats.confirmed,
        "capture stopped"
    );
    Ok(ExitCode::SUCCESS)
}
