//! What capture hands downstream, and the contract of that hand-off.
//!
//! Capture reads one committed transaction at a time from the slot and hands
//! its events to a [`TransactionSink`]. The slot's confirmed LSN moves to a
//! transaction's `end_lsn` only after the receipt of that transaction, and of
//! every transaction before it, resolved. A crash anywhere before that point
//! makes Postgres send the transaction again, and the events come out with
//! the same ids and bytes.
//!
//! Each transaction part also carries what every rule did with its changes;
//! [`ledger::sink::LedgerSink`] records that in the capture [`ledger`] once
//! the part's events are durable, exactly once per part.
//!
//! Where the transactions come from is the [`source::ChangeSource`] port.

pub mod ledger;
pub mod source;

use std::future::Future;
use std::sync::Arc;

use crate::event::Event;
use crate::ids::Lsn;
use crate::log::{LogError, Producer, Receipt};
use crate::time::Timestamp;

pub use ledger::sink::LedgerSink;
pub use ledger::{CaptureLedgerStore, RuleTally};
pub use source::{
    CaptureObserver, ChangeSource, LogObserver, RunOptions, RunStats, SourceError, SourceErrorKind,
};

/// Something capture saw that did not become an event, kept so that nothing
/// is dropped silently: counted, logged, stored and shown by reconciliation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Incident {
    /// What happened.
    pub kind: IncidentKind,
    /// The commit LSN of the transaction, when there was one.
    pub commit_lsn: Option<Lsn>,
    /// The position of the change in its transaction.
    pub tx_ordinal: Option<u32>,
    /// The rule involved, if any.
    pub rule: Option<String>,
    /// The table involved, if any (`schema.table`).
    pub table: Option<String>,
    /// A sentence for the operator.
    pub detail: String,
}

impl Incident {
    /// The incident with its texts cleaned (no NUL or control characters:
    /// they may quote row data) and bounded, so that it can be stored and
    /// logged whatever the row held.
    pub fn bounded(mut self) -> Self {
        use crate::sanitize::{Lines, clean_str};
        self.detail = clean_str(
            &self.detail,
            Lines::Escape,
            crate::incident::MAX_DETAIL_BYTES,
        );
        self.rule = self.rule.map(|r| clean_str(&r, Lines::Escape, 256));
        self.table = self.table.map(|t| clean_str(&t, Lines::Escape, 512));
        self
    }
}

/// The kinds of [`Incident`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentKind {
    /// A captured table was truncated: its rows vanished without row events.
    Truncate,
    /// A captured table's columns changed (a column added, dropped or
    /// retyped). Nothing is lost: the rows that follow become events of the
    /// new shape, under a new schema version that the detail names
    /// ([`schema_change_detail`]). Reconciliation explains it
    /// (`schema_changed`); it is no gap.
    SchemaChange,
    /// A row matched a rule but could not become an event (null tenant,
    /// invalid outbox type or payload, …).
    InvalidRow,
    /// A logical message with a rule's prefix was not transactional, or its
    /// content was not the expected JSON.
    InvalidMessage,
    /// A condition could not be decided because a value was not in the WAL.
    UndecidedCondition,
    /// The event would be larger than `[source].max_event_bytes`.
    OversizedEvent,
    /// Further incidents of one transaction, past the number stored one by
    /// one, counted in a single row.
    Summarised,
    /// The slot was gone (dropped or lost) and the operator let capture
    /// start a new one at the current position: changes committed after
    /// the incident's LSN, up to where the new slot starts, were not read.
    SlotReset,
}

impl IncidentKind {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            IncidentKind::Truncate => "truncate",
            IncidentKind::SchemaChange => "schema_change",
            IncidentKind::InvalidRow => "invalid_row",
            IncidentKind::InvalidMessage => "invalid_message",
            IncidentKind::UndecidedCondition => "undecided_condition",
            IncidentKind::OversizedEvent => "oversized_event",
            IncidentKind::Summarised => "incidents_summarised",
            IncidentKind::SlotReset => "slot_reset",
        }
    }
}

/// The detail of a [`IncidentKind::SchemaChange`]: the schema version each
/// rule's events carry from the change on, then the table's new columns
/// (last, so that bounding a long column list never cuts a version).
/// [`schema_change_versions`] reads the versions back.
pub fn schema_change_detail(table: &str, columns: &[&str], versions: &[(String, u32)]) -> String {
    let mut detail = String::new();
    for (event_type, version) in versions {
        detail.push_str(&format!(
            "{SCHEMA_VERSION_LEAD}{event_type}{SCHEMA_VERSION_MID}{version}; "
        ));
    }
    detail.push_str(&format!(
        "table {table} changed: columns are now {}",
        columns.join(", ")
    ));
    detail
}

const SCHEMA_VERSION_LEAD: &str = "events of type ";
const SCHEMA_VERSION_MID: &str = " now carry schema version ";

/// The (event type, schema version) pairs a [`schema_change_detail`] names.
pub fn schema_change_versions(detail: &str) -> Vec<(String, u32)> {
    detail
        .split("; ")
        .map_while(|part| {
            let rest = part.strip_prefix(SCHEMA_VERSION_LEAD)?;
            let (event_type, version) = rest.rsplit_once(SCHEMA_VERSION_MID)?;
            Some((event_type.to_string(), version.parse().ok()?))
        })
        .collect()
}

/// One committed transaction's worth of capture output, or one part of a
/// large transaction (handed off in chunks while it is read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedTransaction {
    /// The source's name.
    pub source: Arc<str>,
    /// The commit LSN.
    pub commit_lsn: Lsn,
    /// The end of the commit record: what the slot confirms.
    pub end_lsn: Lsn,
    /// The commit time.
    pub commit_time: Timestamp,
    /// Row changes (and transactional messages) read in the transaction
    /// (in this part of it).
    pub change_count: u32,
    /// Which part of the transaction this is: 0 for the first chunk, the
    /// highest for the one handed off at the commit. The same WAL read
    /// again gives the same parts, so (`commit_lsn`, `part`) names a part
    /// across restarts.
    pub part: u32,
    /// What each rule did with the changes of this part; rules that saw
    /// nothing are absent.
    pub ledger: Vec<RuleTally>,
    /// The events made, in change order.
    pub events: Vec<Event>,
    /// What did not become an event.
    pub incidents: Vec<Incident>,
}

/// Why a sink could not take a transaction.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The log refused or failed.
    #[error("the log did not accept the events")]
    Log(#[from] LogError),
    /// Writing failed.
    #[error("the sink failed to write")]
    Io(#[from] std::io::Error),
    /// The sink is shutting down.
    #[error("the sink is closed")]
    Closed,
    /// The transaction's incidents could not be stored.
    #[error("could not store capture incidents")]
    Store(#[source] crate::store::StoreError),
}

impl SinkError {
    /// Whether handing the transaction off again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            SinkError::Store(e) => e.is_transient(),
            SinkError::Log(e) => e.is_transient() || matches!(e, LogError::Closed),
            SinkError::Io(_) | SinkError::Closed => true,
        }
    }
}

/// Takes captured transactions downstream.
///
/// `hand_off` returns once the sink accepted the transaction (it may wait to
/// apply back-pressure); the receipt resolves once the transaction's events
/// are durable downstream. Sinks see transactions in commit order and may
/// see one again after a restart (same ids, same bytes).
pub trait TransactionSink: Send {
    /// Hands over one transaction.
    fn hand_off(
        &mut self,
        tx: CapturedTransaction,
    ) -> impl Future<Output = Result<Receipt, SinkError>> + Send;
}

/// The events topic of a log as a [`TransactionSink`]: events are keyed by
/// tenant and object (one object's events stay on one partition, in commit
/// order, while a busy tenant spreads over all of them; an event without an
/// object is keyed by its id), and a transaction without events is durable
/// at once.
pub struct LogSink<P> {
    producer: P,
}

impl<P> LogSink<P> {
    /// A sink sending to `producer`.
    pub fn new(producer: P) -> Self {
        LogSink { producer }
    }
}

impl<P: Producer<Event>> TransactionSink for LogSink<P> {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        if tx.events.is_empty() {
            return Ok(Receipt::ready());
        }
        let records = tx.events.into_iter().map(|e| (event_key(&e), e)).collect();
        Ok(self.producer.send_all(records).await?)
    }
}

/// The log key of `event`: tenant, a zero byte, then the object id (or the
/// event id when there is no object).
pub fn event_key(event: &Event) -> Vec<u8> {
    let tenant = event.tenant_id.as_str().as_bytes();
    let mut key = Vec::with_capacity(tenant.len() + 33);
    key.extend_from_slice(tenant);
    key.push(0);
    match &event.object_id {
        Some(object) => key.extend_from_slice(object.as_bytes()),
        None => key.extend_from_slice(&event.id.0),
    }
    key
}

/// Where capture's incidents are stored (the platform database).
pub trait CaptureIncidentStore: Send + Sync + 'static {
    /// Stores `incidents` of `source`; one stored before (the slot was read
    /// again after a crash) is kept once. Durable when it resolves `Ok`.
    fn record_capture_incidents(
        &self,
        source: &str,
        incidents: &[Incident],
    ) -> impl Future<Output = Result<(), crate::store::StoreError>> + Send;
}

/// Stores each transaction's incidents, then hands its events to `inner`.
/// The incidents are durable before the receipt exists, so the slot never
/// moves past a change whose incident could still be lost.
pub struct RecordingSink<S, R> {
    inner: S,
    store: Arc<R>,
}

impl<S, R> RecordingSink<S, R> {
    /// Wraps `inner`, storing incidents in `store`.
    pub fn new(inner: S, store: Arc<R>) -> Self {
        RecordingSink { inner, store }
    }
}

impl<S: TransactionSink, R: CaptureIncidentStore> TransactionSink for RecordingSink<S, R> {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        if !tx.incidents.is_empty() {
            // Transient trouble is retried for a while (capture waits,
            // which is back-pressure); past that, capture restarts and
            // reads the transaction again.
            let mut backoff = std::time::Duration::from_millis(50);
            let mut tries = 0;
            loop {
                match self
                    .store
                    .record_capture_incidents(&tx.source, &tx.incidents)
                    .await
                {
                    Ok(()) => break,
                    Err(e) if e.is_transient() && tries < 10 => {
                        tracing::warn!(error = %e.chain(), retry_in = ?backoff, "could not store capture incidents; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                        tries += 1;
                    }
                    Err(e) => return Err(SinkError::Store(e)),
                }
            }
        }
        self.inner.hand_off(tx).await
    }
}

/// Writes each event's body as one line (canonical JSON) to a writer; used by
/// `walhook capture --stdout` so users can try rules before going live. A
/// line is durable once written and flushed.
pub struct WriterSink<W> {
    out: W,
}

impl<W> WriterSink<W> {
    /// A sink writing to `out`.
    pub fn new(out: W) -> Self {
        WriterSink { out }
    }
}

impl<W: std::io::Write + Send> TransactionSink for WriterSink<W> {
    async fn hand_off(&mut self, tx: CapturedTransaction) -> Result<Receipt, SinkError> {
        for event in &tx.events {
            self.out.write_all(&event.payload)?;
            self.out.write_all(b"\n")?;
        }
        self.out.flush()?;
        Ok(Receipt::ready())
    }
}

/// The schema versions of table rules' event shapes: capture asks for the
/// version of each shape when it first sees a relation's columns, and the
/// answer must be the same every time for the same shape (a re-read of the
/// slot after a crash makes the same bytes).
pub trait SchemaCatalog: Send + Sync + 'static {
    /// The version of `event_type`'s shape `fingerprint`: the one it was
    /// given before, or a new one (at least `base`, after every earlier
    /// version) whose JSON Schema `schema_of(version)` is stored with it.
    fn version_for<'a>(
        &'a self,
        event_type: &'a str,
        base: u32,
        fingerprint: &'a str,
        schema_of: &'a (dyn Fn(u32) -> serde_json::Value + Send + Sync),
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<u32, crate::store::StoreError>> + Send + 'a>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_change_detail_names_its_versions_and_gives_them_back() {
        let versions = vec![
            ("order.created".to_string(), 3),
            ("order.v2".to_string(), 12),
        ];
        let detail = schema_change_detail("public.orders", &["id", "note; x"], &versions);
        assert!(detail.ends_with("columns are now id, note; x"), "{detail}");
        assert_eq!(schema_change_versions(&detail), versions);
        // Cut short (bounded) after the versions: they are still read.
        assert_eq!(
            schema_change_versions(&detail[..detail.len() - 5]),
            versions
        );
        assert!(schema_change_versions("table t changed: columns are now a").is_empty());
    }
}
