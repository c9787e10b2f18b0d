//! What a stage set aside instead of failing: one bad record, one broken
//! endpoint, one unknown tenant, one day the archive could not write. Never
//! dropped silently: counted, logged, stored (table `walhook.incidents`, one
//! open row per stage, kind and subject, with an occurrence count) and shown
//! by reconciliation.
//!
//! Capture's own incidents (truncates, rows a rule could not turn into an
//! event) carry WAL positions and live in [`crate::capture::Incident`].

use std::future::Future;

use crate::sanitize::{Lines, clean_str};
use crate::store::StoreError;

/// The longest incident detail stored, in bytes.
pub const MAX_DETAIL_BYTES: usize = 1024;

/// The stage that set something aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Fan-out (events into deliveries).
    Fanout,
    /// Dispatch (attempts, their records, claims).
    Dispatch,
    /// The endpoint directory (loading endpoints and secrets).
    Directory,
    /// The archive (day partitions into Parquet).
    Archive,
}

impl Stage {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Fanout => "fanout",
            Stage::Dispatch => "dispatch",
            Stage::Directory => "directory",
            Stage::Archive => "archive",
        }
    }
}

/// What was set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IncidentKind {
    /// Events for a tenant that is not registered: stored, but no endpoint
    /// can receive them (subject: the tenant id).
    UnknownTenant,
    /// An event the platform database refused (subject: the event id).
    UnstorableEvent,
    /// An attempt's result the platform database refused; the delivery was
    /// handed back to be attempted again (subject: the delivery id).
    UnstorableResult,
    /// A delivery row that could not be read back after a claim; it was
    /// ended as failed (subject: the delivery id).
    UnreadableDelivery,
    /// An endpoint whose row or secret could not be loaded: its deliveries
    /// wait, every other endpoint goes on (subject: the endpoint id).
    EndpointQuarantined,
    /// A table's day that could not be archived: its rows stay hot, later
    /// days and other tables go on; resolved when a run archives it
    /// (subject: `table/YYYY-MM-DD`).
    ArchiveDayFailed,
    /// Records of the events topic were gone from the log before fan-out
    /// read them (its retention removed them): the member stopped there
    /// rather than skip them (subject: `topic/partition`).
    LogGap,
}

impl IncidentKind {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::UnknownTenant => "unknown_tenant",
            IncidentKind::UnstorableEvent => "unstorable_event",
            IncidentKind::UnstorableResult => "unstorable_result",
            IncidentKind::UnreadableDelivery => "unreadable_delivery",
            IncidentKind::EndpointQuarantined => "endpoint_quarantined",
            IncidentKind::ArchiveDayFailed => "archive_day_failed",
            IncidentKind::LogGap => "log_gap",
        }
    }
}

/// One thing a stage set aside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageIncident {
    /// Which stage.
    pub stage: Stage,
    /// What happened.
    pub kind: IncidentKind,
    /// What it is about (an event, delivery, endpoint or tenant id).
    pub subject: String,
    /// A sentence for the operator: cleaned and bounded, see [`Self::new`].
    pub detail: String,
    /// How many times it happened (folded into one row).
    pub occurrences: u64,
}

impl StageIncident {
    /// An incident; `subject` and `detail` may quote hostile input, so both
    /// are cleaned (no NUL or control characters) and bounded here, once.
    pub fn new(stage: Stage, kind: IncidentKind, subject: &str, detail: &str) -> Self {
        StageIncident {
            stage,
            kind,
            subject: clean_str(subject, Lines::Escape, 256),
            detail: clean_str(detail, Lines::Escape, MAX_DETAIL_BYTES),
            occurrences: 1,
        }
    }

    /// Logs it (at `warn`: it needs an operator's look).
    pub fn log(&self) {
        tracing::warn!(
            stage = self.stage.as_str(),
            kind = self.kind.as_str(),
            subject = %self.subject,
            occurrences = self.occurrences,
            "{}",
            self.detail
        );
    }
}

/// Where incidents are stored (the platform database).
pub trait IncidentStore: Send + Sync + 'static {
    /// Stores `incidents`: an open incident of the same stage, kind and
    /// subject is updated (occurrences added, detail replaced) rather than
    /// repeated. Durable when the future resolves `Ok`.
    fn record_incidents(
        &self,
        incidents: &[StageIncident],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}
