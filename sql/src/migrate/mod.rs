//! Versioned, idempotent migrations of schema `walhook`.
//!
//! Each file in `sql/migrations/` is applied once, in version order, in its
//! own transaction, and recorded in `walhook.schema_migrations` with its
//! SHA-256. Running `walhook migrate` again applies only what is new; a file
//! changed after it was applied is refused (ship a new migration instead).
//! An advisory lock serialises concurrent migrators.

pub mod check;
pub mod locks;
pub mod rights;

use sha2::{Digest, Sha256};
use tokio_postgres::GenericClient;

use crate::StoreError;

/// A migration embedded in the binary.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version (the file's number).
    pub version: i32,
    /// Its name (the file's name without number and extension).
    pub name: &'static str,
    /// Its SQL.
    pub sql: &'static str,
}

/// Every migration, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "capture",
        sql: include_str!("../../migrations/0001_capture.sql"),
    },
    Migration {
        version: 2,
        name: "platform",
        sql: include_str!("../../migrations/0002_platform.sql"),
    },
    Migration {
        version: 3,
        name: "dispatch",
        sql: include_str!("../../migrations/0003_dispatch.sql"),
    },
    Migration {
        version: 4,
        name: "secrets",
        sql: include_str!("../../migrations/0004_secrets.sql"),
    },
    Migration {
        version: 5,
        name: "api",
        sql: include_str!("../../migrations/0005_api.sql"),
    },
    Migration {
        version: 6,
        name: "incidents",
        sql: include_str!("../../migrations/0006_incidents.sql"),
    },
    Migration {
        version: 7,
        name: "ordered_ids",
        sql: include_str!("../../migrations/0007_ordered_ids.sql"),
    },
    Migration {
        version: 8,
        name: "pending",
        sql: include_str!("../../migrations/0008_pending.sql"),
    },
    Migration {
        version: 9,
        name: "fanouts",
        sql: include_str!("../../migrations/0009_fanouts.sql"),
    },
    Migration {
        version: 10,
        name: "archive",
        sql: include_str!("../../migrations/0010_archive.sql"),
    },
    Migration {
        version: 11,
        name: "capture_ledger",
        sql: include_str!("../../migrations/0011_capture_ledger.sql"),
    },
    Migration {
        version: 12,
        name: "reconcile",
        sql: include_str!("../../migrations/0012_reconcile.sql"),
    },
    Migration {
        version: 13,
        name: "tenant_budget",
        sql: include_str!("../../migrations/0013_tenant_budget.sql"),
    },
    Migration {
        version: 14,
        name: "cancellations",
        sql: include_str!("../../migrations/0014_cancellations.sql"),
    },
    Migration {
        version: 15,
        name: "secret_versions",
        sql: include_str!("../../migrations/0015_secret_versions.sql"),
    },
    Migration {
        version: 16,
        name: "retry_overrides",
        sql: include_str!("../../migrations/0016_retry_overrides.sql"),
    },
    Migration {
        version: 17,
        name: "endpoint_verification",
        sql: include_str!("../../migrations/0017_endpoint_verification.sql"),
    },
    Migration {
        version: 18,
        name: "event_schemas",
        sql: include_str!("../../migrations/0018_event_schemas.sql"),
    },
    Migration {
        version: 19,
        name: "delivery_order",
        sql: include_str!("../../migrations/0019_delivery_order.sql"),
    },
    Migration {
        version: 20,
        name: "attempt_tallies",
        sql: include_str!("../../migrations/0020_attempt_tallies.sql"),
    },
    Migration {
        version: 21,
        name: "archive_id_index",
        sql: include_str!("../../migrations/0021_archive_id_index.sql"),
    },
    Migration {
        version: 22,
        name: "deliveries_by_day_prepare",
        sql: include_str!("../../migrations/0022_deliveries_by_day_prepare.sql"),
    },
    Migration {
        version: 23,
        name: "deliveries_by_day_validate",
        sql: include_str!("../../migrations/0023_deliveries_by_day_validate.sql"),
    },
    Migration {
        version: 24,
        name: "deliveries_by_day",
        sql: include_str!("../../migrations/0024_deliveries_by_day.sql"),
    },
    Migration {
        version: 25,
        name: "stage_members",
        sql: include_str!("../../migrations/0025_stage_members.sql"),
    },
    Migration {
        version: 26,
        name: "delivery_partition",
        sql: include_str!("../../migrations/0026_delivery_partition.sql"),
    },
    Migration {
        version: 27,
        name: "day_partitions_no_insert_vacuum",
        sql: include_str!("../../migrations/0027_day_partitions_no_insert_vacuum.sql"),
    },
    Migration {
        version: 28,
        name: "archive_export_snapshot",
        sql: include_str!("../../migrations/0028_archive_export_snapshot.sql"),
    },
];

/// A key for `pg_advisory_xact_lock` ("walhook" in ASCII, roughly).
const LOCK_KEY: i64 = 0x0077_616c_686f_6f6b;

fn checksum(sql: &str) -> String {
    Sha256::digest(sql.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Versions applied now.
    pub applied: Vec<i32>,
    /// Versions that were already there.
    pub already: Vec<i32>,
}

async fn applied<C: GenericClient>(client: &C) -> Result<Vec<(i32, String)>, StoreError> {
    let exists = client
        .query_one(
            "SELECT to_regclass('walhook.schema_migrations') IS NOT NULL",
            &[],
        )
        .await
        .map_err(StoreError::query("look for walhook.schema_migrations"))?;
    if !exists.get::<_, bool>(0) {
        return Ok(Vec::new());
    }
    let rows = client
        .query(
            "SELECT version, checksum FROM walhook.schema_migrations ORDER BY version",
            &[],
        )
        .await
        .map_err(StoreError::query("read walhook.schema_migrations"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The latest schema version this binary knows.
pub fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |m| m.version)
}

/// What the database holds against what this binary brings.
#[derive(Debug, Default)]
pub struct Status {
    /// Versions applied, in order.
    pub applied: Vec<i32>,
    /// Migrations of this binary not applied yet, in order.
    pub pending: Vec<&'static Migration>,
    /// Applied migrations whose SQL is not this binary's (changed after
    /// they shipped): `walhook migrate` refuses to go on.
    pub changed: Vec<&'static Migration>,
    /// Applied versions this binary does not know: a newer walhook
    /// migrated the database.
    pub unknown: Vec<i32>,
}

/// Reads which migrations the database holds, changing nothing.
pub async fn status<C: GenericClient>(client: &C) -> Result<Status, StoreError> {
    let done = applied(client).await?;
    let mut status = Status {
        applied: done.iter().map(|(v, _)| *v).collect(),
        ..Status::default()
    };
    for m in MIGRATIONS {
        match done.iter().find(|(v, _)| *v == m.version) {
            None => status.pending.push(m),
            Some((_, sum)) if *sum != checksum(m.sql) => status.changed.push(m),
            Some(_) => {}
        }
    }
    status.unknown = status
        .applied
        .iter()
        .copied()
        .filter(|v| !MIGRATIONS.iter().any(|m| m.version == *v))
        .collect();
    Ok(status)
}

/// Applies every pending migration.
pub async fn run(client: &mut tokio_postgres::Client) -> Result<Report, StoreError> {
    run_until(client, i32::MAX).await
}

/// Applies the pending migrations up to version `last`: a database as an
/// earlier release left it, for the tests of an upgrade.
pub async fn run_until(
    client: &mut tokio_postgres::Client,
    last: i32,
) -> Result<Report, StoreError> {
    let mut report = Report::default();
    for m in MIGRATIONS.iter().filter(|m| m.version <= last) {
        let tx = client
            .transaction()
            .await
            .map_err(StoreError::query("begin a migration"))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
            .await
            .map_err(StoreError::query("take the migration lock"))?;
        tx.batch_execute(
            // The schema may have been made beforehand for a platform role
            // without CREATE on the database (walhook-setup.sql does).
            "DO $$ BEGIN
                 IF to_regnamespace('walhook') IS NULL THEN CREATE SCHEMA walhook; END IF;
             END $$;
             CREATE TABLE IF NOT EXISTS walhook.schema_migrations (
                 version     integer PRIMARY KEY,
                 name        text NOT NULL,
                 checksum    text NOT NULL,
                 applied_at  timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .map_err(StoreError::query("create walhook.schema_migrations"))?;
        let done = applied(&tx).await?;
        let sum = checksum(m.sql);
        if let Some((_, recorded)) = done.iter().find(|(v, _)| *v == m.version) {
            if *recorded != sum {
                return Err(StoreError::Schema(format!(
                    "migration {:04}_{} was changed after it was applied (checksum {recorded} in the \
                     database, {sum} in this binary); put schema changes in a new migration",
                    m.version, m.name
                )));
            }
            report.already.push(m.version);
            crate::commit!(tx, client).map_err(StoreError::query("end a migration"))?;
            continue;
        }
        tx.batch_execute(m.sql)
            .await
            .map_err(StoreError::query("apply a migration"))?;
        tx.execute(
            "INSERT INTO walhook.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[&m.version, &m.name, &sum],
        )
        .await
        .map_err(StoreError::query("record a migration"))?;
        crate::commit!(tx, client).map_err(StoreError::query("commit a migration"))?;
        tracing::info!(version = m.version, name = m.name, "applied migration");
        report.applied.push(m.version);
    }
    Ok(report)
}

/// Fails unless every migration of this binary has been applied.
pub async fn check_current<C: GenericClient>(client: &C) -> Result<(), StoreError> {
    let done = applied(client).await?;
    let latest = MIGRATIONS.last().map_or(0, |m| m.version);
    let have = done.last().map_or(0, |(v, _)| *v);
    if have < latest {
        return Err(StoreError::Schema(format!(
            "the platform schema is at version {have}, this binary needs {latest}: run `walhook migrate --config FILE`"
        )));
    }
    if have > latest {
        return Err(StoreError::Schema(format!(
            "the platform schema is at version {have}, newer than this binary knows ({latest}): upgrade walhook"
        )));
    }
    Ok(())
}
