//! `walhook migrate`: create or upgrade the platform schema.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;

/// Arguments of `walhook migrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file; its [platform].url names the database.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,
}

/// Applies pending migrations and reports what it did.
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let options = cfg.platform()?.connect_options()?;
    let (mut client, conn) = options
        .config()
        .connect(options.connector()?)
        .await
        .with_context(|| "cannot connect to the platform database ([platform].url); is Postgres running and the URL right?")?;
    tokio::spawn(conn);
    let report = walhook_sql::migrate::run(&mut client).await?;
    if report.applied.is_empty() {
        println!(
            "schema walhook is up to date (version {})",
            report.already.last().copied().unwrap_or(0)
        );
    } else {
        println!(
            "applied migrations {:?}; schema walhook is at version {}",
            report.applied,
            report.applied.last().copied().unwrap_or(0)
        );
    }
    Ok(ExitCode::SUCCESS)
}
