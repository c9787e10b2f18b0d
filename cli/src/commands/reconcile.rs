//! `walhook reconcile`: every stage of a window compared, every gap
//! classified, repairs on request, a report for machines and auditors.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;
use walhook_reconcile::{Progress, Reconciler, Request, Settings, Window};

use crate::config::Config;

/// Exit status when gaps remain (0: clean; 1: the run failed; 2: usage).
pub const EXIT_GAPS: u8 = 3;

/// Arguments of `walhook reconcile`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  walhook reconcile --config walhook.toml                      the last hour (to 2 minutes ago)
  walhook reconcile --config walhook.toml --since 2026-11-29 --until 2026-11-30 \\
                    --format html --out report.html            one day, for an auditor
  walhook reconcile --config walhook.toml --since -6h --tenant acme --repair

The funnel, per tenant: captured (capture's ledger) -> events -> expected
deliveries (the subscriptions in force when each event occurred, decided by
fan-out's own planner) -> materialised -> attempted -> terminal or pending
-> attempts -> archived rows. Every difference is explained (disabled,
deleted, filtered, ...) or a gap with an id. --repair re-drives missing
deliveries and re-enqueues overdue ones; a second run is then clean.

Exit status: 0 clean, 3 gaps remain, 1 the run failed. The run is stored in
the platform database (GET /v1/reconciliations). See docs/reconcile.md.")]
pub struct Args {
    /// The config file: [platform] names the database, [archive] the store
    /// of archived days, [reconcile] the grace.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// Start of the window: RFC 3339, a UTC day (2026-11-29), `now`, or a
    /// duration before now (-24h). Floored to the minute.
    #[arg(long, default_value = "-1h", allow_hyphen_values = true)]
    pub since: String,
    /// End of the window (exclusive), same forms. The default leaves the
    /// last 2 minutes, still in flight, to the next run.
    #[arg(long, default_value = "-2m", allow_hyphen_values = true)]
    pub until: String,
    /// Reconcile one tenant only (capture's ledger, which has no tenants,
    /// is then left out).
    #[arg(long, value_name = "ID")]
    pub tenant: Option<String>,
    /// Re-drive missing deliveries and re-enqueue overdue ones.
    #[arg(long)]
    pub repair: bool,
    /// How the report is written: `text` (a summary), `json` (the
    /// versioned report, docs/reconcile.md) or `html` (one self-contained
    /// page for auditors).
    #[arg(long, default_value = "text", value_parser = ["text", "json", "html"])]
    pub format: String,
    /// Write the report here instead of stdout (the text summary still
    /// goes to stderr).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// How long past due a pending delivery may wait before it is overdue,
    /// instead of [reconcile] grace (e.g. 30s).
    #[arg(long, value_parser = walhook_pipeline::duration::parse)]
    pub grace: Option<std::time::Duration>,
}

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn stage(&self, name: &str) {
        self.0.set_message(name.to_string());
    }
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
}

/// Runs one reconciliation and writes its report; exit status 3 when gaps
/// remain.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let window = Window::parse(&args.since, &args.until, SystemTime::now())?;
    if let Some(t) = &args.tenant {
        walhook_pipeline::ids::TenantId::new(t.clone())
            .map_err(|e| anyhow::anyhow!("--tenant {t:?}: {e}"))?;
    }
    let platform = cfg.platform()?.platform()?;
    platform.check().await.context(
        "cannot use the platform database ([platform].url): is Postgres running, the URL right and `walhook migrate` done?",
    )?;
    let store = cfg.archive.open_store().await?;
    let settings = Settings {
        grace: args.grace.unwrap_or(cfg.reconcile.grace),
        ..cfg.reconcile.settings(&cfg.source, cfg.retry.deadline)
    };
    let request = Request {
        window,
        tenant: args.tenant.clone(),
        repair: args.repair,
    };
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg:<40} {pos} rows ({per_sec})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let started = SystemTime::now();
    let reconciler = Reconciler::new(platform.clone(), Some(store), settings);
    let report = reconciler.run(&request, &Bar(bar.clone())).await?;
    bar.finish_and_clear();
    let summary = walhook_reconcile::text::summary(&report);
    match (args.format.as_str(), &args.out) {
        ("text", None) => print!("{summary}"),
        (format, out) => {
            let body = match format {
                "json" => serde_json::to_string_pretty(&report)? + "\n",
                "html" => walhook_reconcile::html::render(&report),
                _ => summary.clone(),
            };
            match out {
                Some(path) => {
                    write_file(path, &body)?;
                    eprint!("{summary}");
                    eprintln!("report written to {}", path.display());
                }
                None => {
                    print!("{body}");
                    eprint!("{summary}");
                }
            }
        }
    }
    let id =
        walhook_reconcile::schedule::store_run(&platform, &request, &report, "command", started)
            .await?;
    eprintln!("stored as reconciliation {id} (GET /v1/reconciliations/{id})");
    Ok(if report.clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_GAPS)
    })
}

fn write_file(path: &Path, body: &str) -> anyhow::Result<()> {
    std::fs::write(path, body)
        .with_context(|| format!("--out {}: cannot write the report there", path.display()))
}
