//! walhook's reconciliation: for one window (and tenant), every stage is
//! counted from its own table and compared with the one before it, every
//! difference is explained or classified as a gap with an id, `--repair`
//! fixes what it can, and the result is a report for machines (JSON) and
//! for auditors (HTML).
//!
//! ```text
//!  source WAL ─(slot confirmed past the window's end?)─▶
//!  capture ledger ──▶ events ──▶ expected deliveries (fan-out's planner over
//!   (per source,        │          the subscription versions in force)
//!    rule, minute)      ▼                  │ compare
//!                  materialised deliveries ◀┘
//!                       │ attempted / terminal / pending (due, overdue)
//!                       ▼
//!                  attempts (hot and archived)
//!   (each stage's rows of archived days read from their Parquet parts,
//!    verified object by object, and judged with the hot rows)
//! ```
//!
//! - [`reconciler`]: one run, from the snapshot to the sealed report.
//! - [`coverage`]: whether capture had confirmed each source past the
//!   window's end.
//! - [`ledger`]: capture's ledger against the stored events, incidents.
//! - [`hot`]: events, deliveries and attempts of the hot tables.
//! - [`history`]: the subscription history fan-out's planner decides from.
//! - [`cold`]: archived days, verified object by object.
//! - [`archived`]: the window's rows of archived days, from Parquet.
//! - [`repair`]: re-driving missing deliveries, re-enqueuing overdue ones.
//! - [`report`] and [`html`]: the results; [`tenant_view`]: what one
//!   tenant may read of a report over every tenant.

// Tests spawn freely; production code spawns through the supervisor.
#![cfg_attr(test, allow(clippy::disallowed_methods))]

pub mod archived;
pub mod cold;
pub mod coverage;
pub mod findings;
pub mod history;
pub mod hot;
pub mod html;
pub mod ledger;
pub mod reconciler;
pub mod repair;
pub mod report;
pub mod schedule;
pub mod tenant_view;
pub mod text;
pub mod window;

pub use reconciler::{Progress, Reconciler, Request, Settings};
pub use report::{Gap, GapClass, Report};
pub use window::Window;

/// Why a reconciliation could not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The platform database failed.
    #[error(transparent)]
    Db(#[from] walhook_sql::StoreError),
    /// A query failed.
    #[error("{what}")]
    Query {
        /// What was being done.
        what: &'static str,
        /// The database error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Reading the archive failed (not a mismatch: those are gaps).
    #[error("reading the archive failed")]
    Archive(#[source] walhook_archive::ArchiveError),
    /// A repair's write failed.
    #[error("a repair failed")]
    Repair(#[source] walhook_pipeline::store::StoreError),
    /// A stored name (a delivery's status) this version does not know.
    #[error("{row}: {source}")]
    Stored {
        /// The row (`delivery dlv_…`).
        row: String,
        /// The value and the names this version knows.
        #[source]
        source: walhook_pipeline::stored::UnknownName,
    },
}

impl ReconcileError {
    /// A mapper for `map_err` on queries.
    pub fn query(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> ReconcileError {
        move |source| ReconcileError::Query { what, source }
    }

    /// Whether running again may succeed without anyone acting.
    pub fn is_transient(&self) -> bool {
        match self {
            ReconcileError::Db(e) => e.is_transient(),
            ReconcileError::Query { source, .. } => {
                walhook_sql::kind_of(source) == walhook_pipeline::store::ErrorKind::Transient
            }
            ReconcileError::Archive(e) => e.is_transient(),
            ReconcileError::Repair(e) => e.is_transient(),
            ReconcileError::Stored { .. } => false,
        }
    }
}
