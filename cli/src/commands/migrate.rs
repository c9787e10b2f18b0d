//! `walhook migrate`: create or upgrade the platform schema, or (with
//! `--check`) say what an upgrade would apply and which of its statements
//! lock the tables the pipeline writes all the time.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use walhook_sql::migrate::locks::{self, Lock};
use walhook_sql::migrate::{Migration, Status};

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

fn label(m: &Migration) -> String {
    format!("{:04}_{}", m.version, m.name)
}

/// The strongest lock per hot table `m` takes, strongest first.
fn hot_locks(m: &Migration) -> Vec<Lock> {
    let mut out: Vec<Lock> = Vec::new();
    for lock in locks::hot_locks(m.sql) {
        match out.iter_mut().find(|l| l.table == lock.table) {
            Some(l) if l.mode < lock.mode => *l = lock,
            Some(_) => {}
            None => out.push(lock),
        }
    }
    out.sort_by(|a, b| b.mode.cmp(&a.mode).then_with(|| a.table.cmp(&b.table)));
    out
}

/// What `--check` prints, and whether the schema is current.
fn describe(status: &Status) -> (String, bool) {
    let mut out = String::new();
    let have = status.applied.last().copied().unwrap_or(0);
    let latest = walhook_sql::migrate::latest();
    if !status.changed.is_empty() {
        for m in &status.changed {
            out.push_str(&format!(
                "migration {} was changed after it was applied (its SQL in this binary is not what ran): \
                 `walhook migrate` refuses to go on; run the binary that applied it, and ship schema changes \
                 as new migrations\n",
                label(m)
            ));
        }
    }
    if !status.unknown.is_empty() {
        out.push_str(&format!(
            "the schema holds versions {:?} that this binary does not know (it brings up to {latest}): \
             a newer walhook migrated this database; run that version\n",
            status.unknown
        ));
    }
    if status.pending.is_empty() {
        if status.changed.is_empty() && status.unknown.is_empty() {
            out.push_str(&format!(
                "schema walhook is current (version {have}); nothing to apply\n"
            ));
            return (out, true);
        }
        return (out, false);
    }
    let blocking = status
        .pending
        .iter()
        .any(|m| hot_locks(m).iter().any(|l| l.mode.blocks_writes()));
    out.push_str(&format!(
        "schema walhook is at version {have}; this binary brings version {latest}. {} pending:\n",
        if status.pending.len() == 1 {
            "1 migration".to_owned()
        } else {
            format!("{} migrations", status.pending.len())
        }
    ));
    for m in &status.pending {
        let held = hot_locks(m);
        if held.is_empty() {
            out.push_str(&format!(
                "  {}: no lock on a table the pipeline writes\n",
                label(m)
            ));
            continue;
        }
        out.push_str(&format!("  {}:\n", label(m)));
        for l in held {
            out.push_str(&format!(
                "    {} on {}: {}\n",
                l.mode.describe(),
                l.table,
                l.statement
            ));
        }
    }
    out.push_str("apply with `walhook migrate --config FILE`");
    if blocking {
        out.push_str(
            "; a lock that blocks writes holds capture, fan-out and dispatch back until its migration \
             commits (they wait, nothing is lost): apply it when a pause is acceptable",
        );
    }
    out.push('\n');
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(versions: &[i32]) -> Status {
        let all = walhook_sql::migrate::MIGRATIONS;
        Status {
            applied: all
                .iter()
                .map(|m| m.version)
                .filter(|v| !versions.contains(v))
                .collect(),
            pending: all
                .iter()
                .filter(|m| versions.contains(&m.version))
                .collect(),
            ..Status::default()
        }
    }

    #[test]
    fn a_current_schema_passes_the_check() {
        let (text, current) = describe(&pending(&[]));
        assert!(current, "{text}");
        assert!(text.contains("is current"), "{text}");
    }

    #[test]
    fn pending_migrations_are_listed_with_their_locks_on_hot_tables() {
        // 0008 creates `pending` (a new table: no wait) and 0024 moves
        // deliveries into daily partitions.
        let latest = walhook_sql::migrate::latest();
        let (text, current) = describe(&pending(&[8, 24]));
        assert!(!current);
        assert!(
            text.contains(&format!("brings version {latest}. 2 migrations pending")),
            "{text}"
        );
        assert!(text.contains("0024_deliveries_by_day:\n"), "{text}");
        assert!(text.contains("on deliveries"), "{text}");
        assert!(text.contains("walhook migrate --config"), "{text}");
    }

    #[test]
    fn a_schema_ahead_of_the_binary_fails_the_check() {
        let mut status = pending(&[]);
        status.unknown = vec![999];
        let (text, current) = describe(&status);
        assert!(!current);
        assert!(
            text.contains("[999]") && text.contains("newer walhook"),
            "{text}"
        );
    }

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
