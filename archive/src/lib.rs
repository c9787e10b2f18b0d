//! walhook's cold history: day partitions of the hot tables become Parquet
//! on object storage, verified, and only then leave Postgres.
//!
//! ```text
//!  hot day (events_20261127, attempts_20261127, deliveries of that day)
//!     │ read sorted by (tenant bucket, tenant, time, id)        [export]
//!     ▼
//!  parts: table=T/date=D/tenant_bucket=NN/part-NNNNN.parquet   archive.after_part
//!     ▼
//!  manifest: table=T/date=D/_manifest.json                     archive.after_manifest
//!     ▼ catalog: written
//!  verify: every object read back, hashes, sizes, footers, hot count
//!     ▼ catalog: verified                                      archive.before_drop
//!  drop the partition (or delete the day's terminal deliveries)
//!     ▼ catalog: dropped
//! ```
//!
//! - [`table`]: the archived tables and their columns.
//! - [`layout`]: object keys, tenant buckets.
//! - [`copy`]: the binary `COPY` stream the export reads.
//! - [`encode`]: rows to Parquet and back.
//! - [`manifest`]: what a day's objects hold; [`part`]: one part in the
//!   making.
//! - [`dates`]: UTC days and Postgres `date` values.
//! - [`catalog`]: the catalog row of each generation of a day and its
//!   [`PartitionState`] (`written`, `verified`, `dropped`, `expired`).
//! - [`archiver`]: the protocol above, its plan and its report; `due`:
//!   which days a run takes.
//! - [`failure`]: a day that fails is reported (log, incident, metric) and
//!   the run goes on; which failures end the run instead.
//! - [`verify`]: reading every object back.
//! - `merge`: a day archived again is compacted: one live set, each id
//!   once, its latest row.
//! - [`cold`]: archived deliveries, attempts and events by id and by
//!   listing (paged day by day within a budget), and the restore behind
//!   replays of archived deliveries.
//! - [`schedule`]: `walhook run`'s rounds, with an injected clock.
//! - [`index`]: which day holds a delivery id, written when a day is
//!   verified.
//!
//! - [`objstore`]: the stores it writes to, a local directory and S3
//!   (feature `s3`, on by default), and [`objstore::AnyStore`], either one
//!   chosen from configuration.
//!
//! The archive is generic over the object-store port
//! ([`walhook_pipeline::objstore::ObjectStore`]).

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod archiver;
pub mod catalog;
pub mod cold;
pub mod copy;
pub mod dates;
mod due;
pub mod encode;
pub mod failure;
pub mod index;
pub mod layout;
pub mod manifest;
mod merge;
pub mod objstore;
pub mod part;
mod retention;
pub mod schedule;
pub mod table;
pub mod verify;

pub use archiver::{Archiver, Outcome, PartitionReport, Progress, Settings};
pub use catalog::PartitionState;

use walhook_pipeline::objstore::ObjectStoreError;
use walhook_sql::StoreError;

use crate::table::Table;

/// An archive failure.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The platform database failed.
    #[error(transparent)]
    Db(#[from] StoreError),
    /// A query of the archive failed.
    #[error("{what}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The object store failed.
    #[error(transparent)]
    Store(#[from] ObjectStoreError),
    /// A hot value does not have the shape its column needs.
    #[error("column {column} of {table}: {detail}")]
    Shape {
        /// The table.
        table: Table,
        /// The column.
        column: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// Parquet could not be written or read.
    #[error("parquet")]
    Parquet(#[source] parquet::errors::ParquetError),
    /// Arrow could not build or read a batch.
    #[error("arrow")]
    Arrow(#[source] arrow_schema::ArrowError),
    /// A tenant has as many archive reads in progress as it may
    /// (`[api].cold_reads_per_tenant`); this one was refused, nothing read.
    #[error(
        "tenant {tenant:?} has {current} archive reads in progress, the most it may have at once ({limit})"
    )]
    TenantReadsBusy {
        /// The tenant.
        tenant: String,
        /// The cap.
        limit: usize,
        /// Its reads in progress.
        current: usize,
    },
    /// Another archive round holds the platform database's archive lock.
    #[error(
        "another archive round is running on this platform database (`walhook run`'s [archive] schedule or another `walhook archive`); run again when it has ended"
    )]
    Busy,
    /// An object does not match its manifest, or the manifest does not match
    /// the hot rows: nothing was dropped.
    #[error("verification of {table} {day} failed: {object}: {problem}. {fix}")]
    Verification {
        /// The table.
        table: Table,
        /// The day.
        day: chrono::NaiveDate,
        /// The object (or the hot table) that does not match.
        object: String,
        /// Whether the object is absent or present but wrong.
        kind: VerificationKind,
        /// What does not match.
        problem: String,
        /// What the operator should do.
        fix: String,
    },
    /// A catalog row holds a state this version does not know (a newer
    /// version wrote it, or it was edited by hand): the day is left alone.
    #[error(
        "the archive catalog (walhook.archive_partitions) row of {table} {day}, generation {generation}: {unknown}"
    )]
    UnknownState {
        /// The table.
        table: Table,
        /// The day.
        day: chrono::NaiveDate,
        /// The generation.
        generation: u32,
        /// The state found, and the ones this version knows.
        unknown: walhook_pipeline::stored::UnknownName,
    },
}

/// What kind of mismatch an [`ArchiveError::Verification`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerificationKind {
    /// An object or manifest the catalog or a manifest names is absent
    /// from the store.
    Missing,
    /// Everything is there but something does not match: a SHA-256, a
    /// size, a row count, a manifest or Parquet footer that does not parse
    /// or is of another table or version, or hot rows the export refuses.
    Mismatch,
}

impl ArchiveError {
    /// A mapper for `map_err` on queries.
    pub fn query(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> ArchiveError {
        move |source| ArchiveError::Query { what, source }
    }

    /// Whether retrying may help (connection trouble, a lock not granted in
    /// time, a store that timed out) rather than the operator having to act.
    pub fn is_transient(&self) -> bool {
        match self {
            ArchiveError::Db(e) => e.is_transient(),
            ArchiveError::Query { source, .. } => {
                walhook_sql::kind_of(source) == walhook_pipeline::store::ErrorKind::Transient
            }
            ArchiveError::Store(e) => e.is_transient(),
            ArchiveError::Busy | ArchiveError::TenantReadsBusy { .. } => true,
            _ => false,
        }
    }
}
