//! What applying a rule gives ([`Outcome`]) in the transaction it belongs
//! to ([`TxContext`]), and [`EventParts`]: the one place an event's id is
//! derived and its envelope written, for table, outbox and message rules.

use walhook_pipeline::canonical::JsonWriter;
use walhook_pipeline::capture::Incident;
use walhook_pipeline::event::{Envelope, Event, EventKey, EventType};
use walhook_pipeline::ids::{EventId, Lsn, TenantId};
use walhook_pipeline::time::Timestamp;

/// The transaction a change belongs to.
#[derive(Debug, Clone, Copy)]
pub struct TxContext<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The commit LSN.
    pub commit_lsn: Lsn,
    /// The commit time.
    pub commit_time: Timestamp,
    /// The largest event body allowed (`[source].max_event_bytes`).
    pub max_event_bytes: usize,
}

/// What applying a rule to a change gave.
#[derive(Debug)]
pub enum Outcome {
    /// The rule does not apply.
    Skip,
    /// An event.
    Event(Box<Event>),
    /// The rule applies but no event could be made.
    Incident(Incident),
}

/// What a rule decided about a change; [`EventParts::build`] derives the
/// id, writes the envelope once and makes the event.
pub(super) struct EventParts<'a> {
    pub(super) rule: &'a str,
    pub(super) tenant: TenantId,
    pub(super) event_type: EventType,
    pub(super) schema_version: u32,
    pub(super) object_id: Option<String>,
    pub(super) object_version: Option<String>,
    pub(super) unavailable: Vec<String>,
}

impl EventParts<'_> {
    pub(super) fn build(
        self,
        tx: &TxContext<'_>,
        ordinal: u32,
        write_data: impl FnOnce(&mut JsonWriter<'_>),
    ) -> Outcome {
        let id = EventId::derive(tx.source, tx.commit_lsn, ordinal, self.rule);
        let (payload, payload_hash) = Envelope {
            id,
            event_type: &self.event_type,
            tenant_id: &self.tenant,
            object_id: self.object_id.as_deref(),
            object_version_json: self.object_version.as_deref(),
            occurred_at: tx.commit_time,
            schema_version: self.schema_version,
            unavailable: &self.unavailable,
        }
        .write(write_data);
        Outcome::Event(Box::new(Event {
            id,
            source: tx.source.into(),
            key: EventKey {
                commit_lsn: tx.commit_lsn,
                tx_ordinal: ordinal,
            },
            tenant_id: self.tenant,
            event_type: self.event_type,
            schema_version: self.schema_version,
            object_id: self.object_id,
            object_version: self.object_version,
            occurred_at: tx.commit_time,
            payload,
            payload_hash,
        }))
    }
}
