//! The port capture reads from: a replication source.
//!
//! A [`ChangeSource`] pushes committed transactions into a
//! [`TransactionSink`] in commit order, starting after the last position it
//! confirmed, and confirms a transaction's `end_lsn` only once its receipt
//! and every receipt before it resolved (with [`RunOptions::confirm`]). So
//! what was handed off but not confirmed when a run ends (a failed receipt,
//! a crash, a stop before the receipts came) is handed off again by the
//! next run, with the same ids and bytes: at least once, never skipped.
//!
//! A run ends on `shutdown`, at the position current at its start (with
//! [`RunOptions::stop_when_caught_up`]), or on an error whose
//! [`SourceError::kind`] tells the runtime whether to start it again
//! ([`SourceErrorKind::Transient`]) or stop and tell the operator. One run
//! reads a source at a time: a second one fails, transiently, while the
//! first holds it.
//!
//! The Postgres source (`walhook_connectors::postgres::PostgresSource`, a
//! logical replication slot read with pgoutput) implements it;
//! [`memory::MemorySource`] is its twin for unit tests, and
//! [`contract`] states the rules both keep.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{CapturedTransaction, Incident, TransactionSink};
use crate::ids::Lsn;

#[cfg(any(test, feature = "testing"))]
pub mod contract;
#[cfg(any(test, feature = "testing"))]
pub mod memory;

/// Observes capture for checkpoints, incidents and metrics. Called on the
/// capture task: implementations must not block.
pub trait CaptureObserver: Send + Sync {
    /// The source now confirms `lsn`.
    fn confirmed(&self, _lsn: Lsn) {}
    /// A transaction was read (before hand-off).
    fn transaction(&self, _tx: &CapturedTransaction) {}
    /// Something did not become an event.
    fn incident(&self, _incident: &Incident) {}
    /// The source's lag (bytes retained behind its confirmed position),
    /// read periodically.
    fn slot_lag(&self, _lag_bytes: i64) {}
}

/// An observer that only logs.
#[derive(Debug, Default)]
pub struct LogObserver;

impl CaptureObserver for LogObserver {}

/// How a capture run behaves.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Confirm durable positions to the source (off for dry runs).
    pub confirm: bool,
    /// Stop once everything committed before the run started was read.
    pub stop_when_caught_up: bool,
}

/// Counters of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Transactions read.
    pub transactions: u64,
    /// Row changes read.
    pub changes: u64,
    /// Events handed off.
    pub events: u64,
    /// Incidents recorded.
    pub incidents: u64,
    /// The last confirmed position.
    pub confirmed: Lsn,
}

/// Whether a source's failure may pass without the operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceErrorKind {
    /// Starting the run again may succeed (the database restarted, the
    /// network blinked, the sink refused for a while, another run still
    /// holds the source).
    Transient,
    /// It will fail the same way until someone acts (a setting, a right, a
    /// rule that does not fit, a slot that lost its WAL).
    Definite,
}

/// A source's error, classified.
pub trait SourceError: std::error::Error + Send + Sync + 'static {
    /// Whether a new run may succeed.
    fn kind(&self) -> SourceErrorKind;
}

/// A replication source capture reads from (see the module docs).
pub trait ChangeSource: Send + Sync + 'static {
    /// Why a run failed.
    type Error: SourceError;

    /// The source's name: events, checkpoints and the ledger carry it.
    fn name(&self) -> &str;

    /// Hands every transaction committed after the confirmed position to
    /// `sink`, in commit order, until `shutdown`, a failure, or (with
    /// `stop_when_caught_up`) the position current at the start; confirms
    /// what is durable when `options.confirm`.
    fn run<S: TransactionSink + 'static>(
        &self,
        sink: S,
        observer: Arc<dyn CaptureObserver>,
        options: RunOptions,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<RunStats, Self::Error>> + Send;
}

/// A shared source reads as the source it shares (a test keeps a handle on
/// the twin the process runs).
impl<C: ChangeSource> ChangeSource for Arc<C> {
    type Error = C::Error;

    fn name(&self) -> &str {
        (**self).name()
    }

    fn run<S: TransactionSink + 'static>(
        &self,
        sink: S,
        observer: Arc<dyn CaptureObserver>,
        options: RunOptions,
        shutdown: CancellationToken,
    ) -> impl Future<Output = Result<RunStats, Self::Error>> + Send {
        (**self).run(sink, observer, options, shutdown)
    }
}
