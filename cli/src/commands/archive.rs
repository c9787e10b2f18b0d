//! `walhook archive`: day partitions past the hot window become Parquet in
//! the configured store, are verified, and leave Postgres.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use chrono::NaiveDate;
use walhook_archive::table::Table;
use walhook_archive::{Archiver, Outcome, PartitionReport, Progress, Settings};
use walhook_pipeline::objstore::ObjectStore;

use crate::config::Config;

/// Arguments of `walhook archive`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  walhook archive --config walhook.toml --dry-run     what is due, nothing written
  walhook archive --config walhook.toml               archive every due day
  walhook archive --config walhook.toml --table attempts

Each day goes: Parquet parts -> manifest -> every object read back and
matched -> only then the hot partition is dropped. A crash anywhere is
harmless: run the command again. See docs/archive.md and docs/analytics.md.")]
pub struct Args {
    /// The config file: [platform] names the database, [archive] the store.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
    /// Show what is due and how many rows it holds; write and drop nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Archive only these tables (events, deliveries, attempts); repeatable.
    #[arg(long = "table", value_name = "TABLE")]
    pub tables: Vec<String>,
    /// Days kept in Postgres, instead of [archive] hot_days.
    #[arg(long)]
    pub hot_days: Option<u32>,
    /// Count the hot window back from this date (YYYY-MM-DD) instead of
    /// today (UTC): for rehearsals and tests.
    #[arg(long, value_name = "DATE")]
    pub today: Option<NaiveDate>,
    /// Print the summary as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

struct Bar(indicatif::ProgressBar);

impl Progress for Bar {
    fn start(&self, table: Table, day: NaiveDate, rows: u64) {
        self.0.reset();
        self.0.set_length(rows);
        self.0.set_message(format!("{table} {day}"));
    }
    fn rows(&self, n: u64) {
        self.0.inc(n);
    }
    fn finish(&self, report: &PartitionReport) {
        self.0.println(line(report));
    }
}

/// Archives every due day and prints a summary; exit status 1 if a day
/// failed.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let mut tables = Vec::new();
    for t in &args.tables {
        tables.push(Table::parse(t).with_context(|| {
            format!("--table {t:?} is not an archived table: use events, deliveries or attempts")
        })?);
    }
    if tables.is_empty() {
        tables = Table::ALL.to_vec();
    }
    let hot_days = args.hot_days.unwrap_or(cfg.archive.hot_days);
    if hot_days < 1 {
        anyhow::bail!(
            "--hot-days 0 would archive today's partitions while they are written: use 1 or more"
        );
    }
    let settings = Settings {
        hot_days,
        tables,
        dry_run: args.dry_run,
        today: args.today,
        ..cfg.archive.settings()
    };
    let platform_cfg = cfg.platform()?.clone();
    let archive_cfg = cfg.archive.clone();
    let (dry_run, quiet) = (args.dry_run, args.json);
    let reports = on_own_thread(move || async move {
        let platform = platform_cfg.platform()?;
        platform.check().await.context(
            "cannot use the platform database ([platform].url): is Postgres running, the URL right and `walhook migrate` done?",
        )?;
        let store = archive_cfg.open_store().await?;
        eprintln!(
            "archiving days before {} into {}{}",
            settings.cutoff(),
            store.describe(),
            if dry_run {
                " (dry run: nothing is written)"
            } else {
                ""
            }
        );
        let archiver = Archiver::new(platform, store, settings);
        let bar = crate::progress::bar(0, "archive");
        if quiet {
            bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        }
        let reports = archiver.run(&Bar(bar.clone())).await?;
        bar.finish_and_clear();
        Ok(reports)
    })?;
    let failed = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Failed(_)))
        .count();
    if args.json {
        let list: Vec<serde_json::Value> = reports.iter().map(json).collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        print_summary(&reports);
    }
    Ok(if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn outcome_text(o: &Outcome) -> (&'static str, Option<&str>) {
    match o {
        Outcome::Planned => ("due", None),
        Outcome::Archived => ("archived", None),
        Outcome::Expired => ("expired", None),
        Outcome::Waiting(why) => ("waiting", Some(why)),
        Outcome::Failed(why) => ("FAILED", Some(why)),
    }
}

fn line(r: &PartitionReport) -> String {
    let (state, why) = outcome_text(&r.outcome);
    let mut s = format!(
        "{:<10} {} g{:<2} {:>9} rows {:>12} bytes {:>3} files {:>7.2}s  {state}",
        r.table.name(),
        r.day,
        r.generation,
        r.rows,
        r.bytes,
        r.files,
        r.seconds
    );
    if let Some(why) = why {
        s.push_str(": ");
        s.push_str(why);
    }
    s
}

fn print_summary(reports: &[PartitionReport]) {
    if reports.is_empty() {
        println!("nothing is due: every day before the cutoff is archived");
        return;
    }
    println!(
        "{:<10} {:<10} {:<3} {:>14} {:>18} {:>9} {:>8}  outcome",
        "table", "day", "gen", "rows", "bytes", "files", "time"
    );
    for r in reports {
        println!("{}", line(r));
    }
    let rows: u64 = reports.iter().map(|r| r.rows).sum();
    let bytes: u64 = reports.iter().map(|r| r.bytes).sum();
    let secs: f64 = reports.iter().map(|r| r.seconds).sum();
    println!(
        "total: {} days, {rows} rows, {bytes} bytes in {secs:.2}s ({:.0} rows/s)",
        reports.len(),
        rows as f64 / secs.max(1e-9)
    );
}

fn json(r: &PartitionReport) -> serde_json::Value {
    let (state, why) = outcome_text(&r.outcome);
    serde_json::json!({
        "table": r.table.name(),
        "day": r.day.to_string(),
        "generation": r.generation,
        "rows": r.rows,
        "bytes": r.bytes,
        "files": r.files,
        "seconds": r.seconds,
        "outcome": state,
        "detail": why,
    })
}

/// Runs `work` on a thread of its own with a single-threaded runtime: an
/// archive round is one sequential stream (Postgres's COPY, encoding, the
/// store), and on one thread its database connection wakes no other
/// thread for every message (about a quarter of the archiver's CPU went to
/// thread switches on the shared runtime).
pub fn on_own_thread<F, Fut, T>(work: F) -> anyhow::Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    std::thread::Builder::new()
        .name("walhook-archive".into())
        .spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
                .block_on(work())
        })?
        .join()
        .map_err(|_| anyhow::anyhow!("the archive thread panicked"))?
}
