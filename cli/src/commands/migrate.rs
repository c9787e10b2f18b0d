//! `walhook migrate`: create or upgrade the platform schema, or (with
//! `--check`) say what an upgrade would apply and which of its statements
//! lock the tables the pipeline writes all the time.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use walhook_sql::migrate::check::describe;

use crate::config::Config;

/// Arguments of `walhook migrate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The config file; its [platform].url names the database.
    #[arg(long, short, env = "WALHOOK_CONFIG")]
    pub config: PathBuf,

    /// Apply nothing: list the pending migrations, each with the locks it
    /// takes on the tables the pipeline writes all the time (events,
    /// deliveries, attempts, pending, fanouts, and their partitions), and
    /// exit 0 when the schema is current, 1 when a migration is pending or
    /// the schema does not match this binary (for a deploy script to gate
    /// on).
    #[arg(long)]
    pub check: bool,
}

/// Applies pending migrations and reports what it did, or checks.
#[allow(clippy::disallowed_methods)] // bare spawn: a connection's driver
pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(&args.config)?;
    let options = cfg.platform()?.connect_options()?;
    let (mut client, conn) = options
        .config()
        .connect(options.connector()?)
        .await
        .with_context(|| "cannot connect to the platform database ([platform].url); is Postgres running and the URL right?")?;
    tokio::spawn(conn);
    if args.check {
        let status = walhook_sql::migrate::status(&client).await?;
        let (text, current) = describe(&status);
        print!("{text}");
        return Ok(if current {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_the_schema_the_binary_brings() {
        assert!(
            crate::VERSION.ends_with(&format!(
                "schema version {})",
                walhook_sql::migrate::latest()
            )),
            "{}",
            crate::VERSION
        );
        assert!(crate::VERSION.contains(crate::BUILD_COMMIT));
    }
}
