//! Deliveries: one event for one endpoint, and the records about them.

use bytes::Bytes;

use crate::event::EventType;
use crate::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};
use crate::log::{LogError, Message};
use crate::time::Timestamp;

crate::stored_names! {
    /// Where a delivery stands. Set by dispatch (and by operators through
    /// the API for `Cancelled`); terminal states never change again.
    pub enum DeliveryStatus as "delivery status" {
        /// Waiting for an attempt (first, retry, or paused by a circuit).
        Pending = "pending",
        /// An attempt got a 2xx.
        Succeeded = "succeeded",
        /// A permanent failure (4xx other than 408/429, 410, 3xx): no
        /// retries.
        Failed = "failed",
        /// Retries ran out (attempt count or the 24 h deadline).
        Exhausted = "exhausted",
        /// Stopped by an operator or because the endpoint was deleted.
        Cancelled = "cancelled",
    }
}

impl DeliveryStatus {
    /// Whether nothing more will happen automatically.
    pub fn is_terminal(self) -> bool {
        self != DeliveryStatus::Pending
    }
}

/// A delivery row fan-out makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// `DeliveryId::derive(event_id, endpoint_id)`.
    pub id: DeliveryId,
    /// The event.
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The tenant.
    pub tenant_id: TenantId,
    /// The event's type.
    pub event_type: EventType,
    /// The event's time (locates its partition).
    pub event_occurred_at: Timestamp,
    /// The endpoint's config version at fan-out.
    pub endpoint_config_version: i32,
    /// When it was made.
    pub created_at: Timestamp,
    /// When automatic retries stop.
    pub expires_at: Timestamp,
    /// The dispatcher node that holds it, when fan-out and dispatch share a
    /// process.
    pub lease_owner: Option<String>,
    /// Until when that node holds it.
    pub lease_expires_at: Option<Timestamp>,
}

/// Work for dispatch: a delivery with the bytes it sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryJob {
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// Its event.
    pub event_id: EventId,
    /// Its endpoint.
    pub endpoint_id: EndpointId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The event type.
    pub event_type: EventType,
    /// The event body, sent unchanged.
    pub payload: Bytes,
    /// Automatic attempts already made (what the retry policy counts).
    pub attempt_count: u32,
    /// Manual attempts already made (replays; for a replay, its own
    /// included). Attempt numbers count both kinds.
    pub manual_attempt_count: u32,
    /// The dispatcher that held this delivery stopped without a clean
    /// drain: an attempt may have been sent and not recorded, so the next
    /// attempt skips a number and says so ([`AttemptNote::PreviousOutcomeUnknown`]).
    pub after_unknown: bool,
    /// Whether the delivery has its row yet. Fan-out stores an event's plan
    /// (which endpoints get it), not a row per delivery: the row is written
    /// once there is something to say about it, usually with the outcome of
    /// its first attempt ([`FirstWrite`]).
    pub materialized: bool,
    /// When it was made.
    pub created_at: Timestamp,
    /// When the next attempt is due.
    pub next_attempt_at: Timestamp,
    /// When automatic retries stop.
    pub expires_at: Timestamp,
    /// The lease this holder has; results are recorded only under it.
    pub lease_version: i64,
    /// The endpoint config version recorded at fan-out.
    pub endpoint_config_version: i32,
    /// The event's commit time (for first-attempt latency, and the
    /// `walhook-event-occurred-at` header).
    pub event_occurred_at: Timestamp,
    /// The event type's schema version (the `walhook-schema-version`
    /// header).
    pub schema_version: u32,
    /// Set when this is a manual attempt asked for through the API.
    pub replay: Option<Replay>,
    /// The business object the event is about and the event's place in
    /// commit order, when the event names an object: an endpoint with
    /// per-object ordering attempts one object's deliveries in that order.
    pub order: Option<ObjectOrder>,
}

/// An event's object and its place in commit order: what per-object
/// ordering compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectOrder {
    /// The object's id (the rule's `object_id_column`).
    pub object_id: std::sync::Arc<str>,
    /// The change's place in the captured WAL.
    pub key: crate::event::EventKey,
}

impl ObjectOrder {
    /// The object `event` is about and its place in commit order, when the
    /// event names an object.
    pub fn of(event: &crate::event::Event) -> Option<Self> {
        event.object_id.as_deref().map(|object| ObjectOrder {
            object_id: object.into(),
            key: event.key,
        })
    }
}

/// A manual attempt's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// The replay request's id.
    pub request_id: i64,
    /// The manual attempt's number, in the delivery's one sequence of
    /// attempts (automatic and manual): never 1 unless it is the first.
    pub number: u32,
}

/// What a delivery's row needs when it is written for the first time (its
/// job was planned by fan-out and had no row yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstWrite {
    /// The event.
    pub event_id: EventId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The tenant.
    pub tenant_id: TenantId,
    /// The event's type.
    pub event_type: EventType,
    /// The event's commit time.
    pub event_occurred_at: Timestamp,
    /// The endpoint config version the plan decided with.
    pub config_version: i32,
    /// When fan-out planned it.
    pub created_at: Timestamp,
    /// When automatic retries stop.
    pub expires_at: Timestamp,
    /// The node that holds the row when it is written held (a near
    /// retry); `None`: the plan's holder. Set by the dispatcher of a
    /// deliveries partition, whose plans the topic holds
    /// ([`crate::routing::TOPIC_HELD`]).
    pub holder: Option<String>,
}

impl DeliveryJob {
    /// The job fan-out hands dispatch for `delivery`, planned for `event`:
    /// no attempt yet, no row yet, the plan's first lease, due at once;
    /// `order` is [`ObjectOrder::of`] the event (made once per event, shared
    /// by its deliveries).
    pub fn planned(
        event: &crate::event::Event,
        delivery: &NewDelivery,
        order: Option<ObjectOrder>,
    ) -> Self {
        DeliveryJob {
            delivery_id: delivery.id,
            event_id: event.id,
            endpoint_id: delivery.endpoint_id,
            tenant_id: delivery.tenant_id.clone(),
            event_type: delivery.event_type.clone(),
            payload: event.payload.clone(),
            attempt_count: 0,
            manual_attempt_count: 0,
            after_unknown: false,
            materialized: false,
            created_at: delivery.created_at,
            next_attempt_at: delivery.created_at,
            expires_at: delivery.expires_at,
            lease_version: 1,
            endpoint_config_version: delivery.endpoint_config_version,
            event_occurred_at: event.occurred_at,
            schema_version: event.schema_version,
            replay: None,
            order,
        }
    }

    /// What writing this job's row for the first time needs, when it has
    /// none yet.
    pub fn first_write(&self) -> Option<Box<FirstWrite>> {
        (!self.materialized).then(|| {
            Box::new(FirstWrite {
                event_id: self.event_id,
                endpoint_id: self.endpoint_id,
                tenant_id: self.tenant_id.clone(),
                event_type: self.event_type.clone(),
                event_occurred_at: self.event_occurred_at,
                config_version: self.endpoint_config_version,
                created_at: self.created_at,
                expires_at: self.expires_at,
                holder: None,
            })
        })
    }

    /// The number the next automatic attempt takes from what is recorded:
    /// one past every recorded attempt, automatic and manual, and one more
    /// when an unrecorded attempt may have gone out.
    pub fn next_auto_number(&self) -> u32 {
        self.attempt_count + self.manual_attempt_count + 1 + u32::from(self.after_unknown)
    }
}

crate::stored_names! {
    /// What started an attempt.
    pub enum Trigger as "attempt trigger" {
        /// The automatic schedule.
        Auto = "auto",
        /// A replay asked for through the API.
        Manual = "manual",
    }
}

crate::stored_names! {
    /// An attempt's outcome as stored: what [`AttemptOutcome`] says, without
    /// its details.
    ///
    /// [`AttemptOutcome`]: crate::dispatch::outcome::AttemptOutcome
    pub enum OutcomeKind as "attempt outcome" {
        /// A 2xx.
        Succeeded = "succeeded",
        /// Worth trying again (5xx, 408, 429, network, timeout).
        Retryable = "retryable",
        /// Will not succeed by retrying (3xx, other 4xx, a refused URL).
        Rejected = "rejected",
        /// 410: the receiver asked never to be called again.
        Gone = "gone",
    }
}

crate::stored_names! {
    /// Why an attempt is special, when it is: what a reader of its history
    /// must know about it.
    pub enum AttemptNote as "attempt note" {
        /// Made after one whose outcome is unknown (sent, perhaps received,
        /// never recorded: its dispatcher stopped first), so the receiver
        /// may see the event twice; the attempt skips a number.
        PreviousOutcomeUnknown = "previous_outcome_unknown",
        /// The first attempt of a delivery to an endpoint with per-object
        /// ordering that went out after an earlier delivery of the same
        /// object ended without success (failed, exhausted): the receiver
        /// sees this event without the one before it.
        PreviousInOrderFailed = "previous_in_order_failed",
    }
}

crate::stored_names! {
    /// Why a delivery ended without an attempt deciding it, stored where an
    /// attempt's error class would be (`deliveries.last_error_class`).
    pub enum EndReason as "delivery end reason" {
        /// Its endpoint was deleted.
        EndpointDeleted = "endpoint_deleted",
        /// Its deadline passed while its endpoint was paused (disabled,
        /// quarantined, unverified).
        DeadlineWhilePaused = "deadline_while_paused",
        /// Its job could not be read back from the log or the store.
        Unreadable = "unreadable",
        /// An operator cancelled it.
        Cancelled = "cancelled",
    }
}

/// A delivery's last error: the class of its last failed attempt, or the
/// reason it ended without one. Stored as one text column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LastError {
    /// Its last attempt failed so.
    Attempt(crate::dispatch::outcome::ErrorClass),
    /// It ended without an attempt.
    Ended(EndReason),
}

impl LastError {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LastError::Attempt(c) => c.as_str(),
            LastError::Ended(r) => r.as_str(),
        }
    }
}

impl TryFrom<&str> for LastError {
    type Error = crate::stored::UnknownName;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        use crate::dispatch::outcome::ErrorClass;
        ErrorClass::try_from(value)
            .map(LastError::Attempt)
            .or_else(|_| EndReason::try_from(value).map(LastError::Ended))
            .map_err(|_| crate::stored::UnknownName {
                what: "delivery error class",
                value: value.to_owned(),
                known: "an attempt's error class or a delivery end reason",
            })
    }
}

crate::stored_text!(LastError);

/// One finished attempt and the delivery's state after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// `AttemptId::derive(delivery, number)`.
    pub attempt_id: AttemptId,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The endpoint.
    pub endpoint_id: EndpointId,
    /// The tenant.
    pub tenant_id: TenantId,
    /// The attempt's number: unique and increasing per delivery across
    /// automatic and manual attempts.
    pub number: u32,
    /// What started it.
    pub trigger: Trigger,
    /// The endpoint config version used to send it.
    pub endpoint_config_version: i32,
    /// The versions of the secrets that signed it, newest first.
    pub secret_versions: Vec<i32>,
    /// When the event committed (first-attempt latency is measured from
    /// it).
    pub event_occurred_at: Timestamp,
    /// When the delivery was made: its row's day partition, so that the
    /// state update probes one partition instead of every hot day's.
    pub delivery_created_at: Timestamp,
    /// When the request started.
    pub started_at: Timestamp,
    /// When the outcome was known.
    pub finished_at: Timestamp,
    /// The HTTP status, if a response arrived.
    pub http_status: Option<u16>,
    /// What it came to.
    pub outcome: OutcomeKind,
    /// Why it failed, when it did.
    pub error_class: Option<crate::dispatch::outcome::ErrorClass>,
    /// SHA-256 of the first 64 KiB of the response body.
    pub response_sha256: Option<[u8; 32]>,
    /// The start of the response body, as text, for people.
    pub response_excerpt: Option<String>,
    /// The delivery's status after the attempt.
    pub status: DeliveryStatus,
    /// Automatic attempts made so far.
    pub attempt_count: u32,
    /// The next attempt, when pending.
    pub next_attempt_at: Timestamp,
    /// The lease the attempt ran under.
    pub lease_version: i64,
    /// Keep holding the delivery until then (a near retry stays in memory);
    /// `None` releases it to whichever node claims it when due.
    pub hold_until: Option<Timestamp>,
    /// For a manual attempt: the replay request it answers.
    pub replay_request: Option<i64>,
    /// Why the attempt is special, when it is.
    pub note: Option<AttemptNote>,
    /// Set when the delivery has no row yet: this record writes it.
    pub first_write: Option<Box<FirstWrite>>,
}

mod codec {
    use super::*;

    fn put(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u32).to_be_bytes());
        out.extend_from_slice(b);
    }

    struct Cursor<'a>(&'a [u8]);

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], LogError> {
            if n > self.0.len() {
                return Err(LogError::Decode("delivery job truncated".into()));
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        fn arr16(&mut self) -> Result<[u8; 16], LogError> {
            let mut a = [0u8; 16];
            a.copy_from_slice(self.take(16)?);
            Ok(a)
        }
        fn u64(&mut self) -> Result<u64, LogError> {
            let mut a = [0u8; 8];
            a.copy_from_slice(self.take(8)?);
            Ok(u64::from_be_bytes(a))
        }
        fn u32(&mut self) -> Result<u32, LogError> {
            let mut a = [0u8; 4];
            a.copy_from_slice(self.take(4)?);
            Ok(u32::from_be_bytes(a))
        }
        fn bytes(&mut self) -> Result<&'a [u8], LogError> {
            let n = self.u32()? as usize;
            self.take(n)
        }
        fn text(&mut self) -> Result<&'a str, LogError> {
            std::str::from_utf8(self.bytes()?)
                .map_err(|_| LogError::Decode("delivery job text".into()))
        }
    }

    impl Message for DeliveryJob {
        fn encode(&self, out: &mut Vec<u8>) {
            out.push(4);
            out.extend_from_slice(&self.delivery_id.0);
            out.extend_from_slice(&self.event_id.0);
            out.extend_from_slice(&self.endpoint_id.0);
            for t in [
                self.created_at,
                self.next_attempt_at,
                self.expires_at,
                self.event_occurred_at,
            ] {
                out.extend_from_slice(&t.0.to_be_bytes());
            }
            out.extend_from_slice(&self.lease_version.to_be_bytes());
            out.extend_from_slice(&self.attempt_count.to_be_bytes());
            out.extend_from_slice(&self.endpoint_config_version.to_be_bytes());
            put(out, self.tenant_id.as_str().as_bytes());
            put(out, self.event_type.as_str().as_bytes());
            put(out, &self.payload);
            match self.replay {
                None => out.push(0),
                Some(r) => {
                    out.push(1);
                    out.extend_from_slice(&r.request_id.to_be_bytes());
                    out.extend_from_slice(&r.number.to_be_bytes());
                }
            }
            out.extend_from_slice(&self.manual_attempt_count.to_be_bytes());
            out.push(u8::from(self.after_unknown) | (u8::from(self.materialized) << 1));
            out.extend_from_slice(&self.schema_version.to_be_bytes());
            match &self.order {
                None => out.push(0),
                Some(o) => {
                    out.push(1);
                    out.extend_from_slice(&o.key.commit_lsn.0.to_be_bytes());
                    out.extend_from_slice(&o.key.tx_ordinal.to_be_bytes());
                    put(out, o.object_id.as_bytes());
                }
            }
        }

        fn decode(bytes: &[u8]) -> Result<Self, LogError> {
            let mut c = Cursor(bytes);
            let version = c.take(1)?[0];
            if !matches!(version, 1..=4) {
                return Err(LogError::Decode("unknown delivery job version".into()));
            }
            let delivery_id = DeliveryId(c.arr16()?);
            let event_id = EventId(c.arr16()?);
            let endpoint_id = EndpointId(c.arr16()?);
            let created_at = Timestamp(c.u64()? as i64);
            let next_attempt_at = Timestamp(c.u64()? as i64);
            let expires_at = Timestamp(c.u64()? as i64);
            let event_occurred_at = Timestamp(c.u64()? as i64);
            let lease_version = c.u64()? as i64;
            let attempt_count = c.u32()?;
            let endpoint_config_version = c.u32()? as i32;
            let bad = |e: crate::ids::IdError| LogError::Decode(e.to_string());
            let tenant_id = TenantId::new(c.text()?).map_err(bad)?;
            let event_type = EventType::new(c.text()?).map_err(bad)?;
            let payload = Bytes::copy_from_slice(c.bytes()?);
            let replay = match c.take(1)? {
                [0] => None,
                _ => Some(Replay {
                    request_id: c.u64()? as i64,
                    number: c.u32()?,
                }),
            };
            let (manual_attempt_count, after_unknown, materialized) = match version {
                1 => (0, false, true),
                _ => {
                    let count = c.u32()?;
                    let flags = c.take(1)?[0];
                    (count, flags & 1 != 0, flags & 2 != 0)
                }
            };
            let schema_version = if version >= 3 { c.u32()? } else { 1 };
            let order = match (version >= 4).then(|| c.take(1)).transpose()? {
                None | Some([0]) => None,
                Some(_) => {
                    let commit_lsn = crate::ids::Lsn(c.u64()?);
                    let tx_ordinal = c.u32()?;
                    Some(ObjectOrder {
                        key: crate::event::EventKey {
                            commit_lsn,
                            tx_ordinal,
                        },
                        object_id: c.text()?.into(),
                    })
                }
            };
            Ok(DeliveryJob {
                delivery_id,
                event_id,
                endpoint_id,
                tenant_id,
                event_type,
                payload,
                attempt_count,
                manual_attempt_count,
                after_unknown,
                materialized,
                created_at,
                next_attempt_at,
                expires_at,
                lease_version,
                endpoint_config_version,
                event_occurred_at,
                schema_version,
                replay,
                order,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn jobs_round_trip() {
            let job = DeliveryJob {
                delivery_id: DeliveryId([1; 16]),
                event_id: EventId([2; 16]),
                endpoint_id: EndpointId([3; 16]),
                tenant_id: TenantId::new("acme").unwrap(),
                event_type: EventType::new("a.b").unwrap(),
                payload: Bytes::from_static(b"{\"x\":1}"),
                attempt_count: 2,
                manual_attempt_count: 1,
                after_unknown: true,
                materialized: false,
                created_at: Timestamp(5),
                next_attempt_at: Timestamp(6),
                expires_at: Timestamp(7),
                lease_version: 9,
                endpoint_config_version: 3,
                event_occurred_at: Timestamp(-1),
                schema_version: 4,
                replay: Some(Replay {
                    request_id: 7,
                    number: 2,
                }),
                order: Some(ObjectOrder {
                    object_id: "inv-1".into(),
                    key: crate::event::EventKey {
                        commit_lsn: crate::ids::Lsn(77),
                        tx_ordinal: 3,
                    },
                }),
            };
            let mut b = Vec::new();
            job.encode(&mut b);
            assert_eq!(DeliveryJob::decode(&b).unwrap(), job);
            assert!(DeliveryJob::decode(&b[..b.len() - 1]).is_err());
            let unordered = DeliveryJob { order: None, ..job };
            let mut b = Vec::new();
            unordered.encode(&mut b);
            assert_eq!(DeliveryJob::decode(&b).unwrap(), unordered);
        }
    }
}

#[cfg(test)]
mod stored_tests {
    use super::*;
    use crate::dispatch::outcome::ErrorClass;

    #[test]
    fn a_last_error_reads_back_as_the_class_or_the_reason_it_was_written_from() {
        let all = ErrorClass::ALL
            .iter()
            .map(|c| LastError::Attempt(*c))
            .chain(EndReason::ALL.iter().map(|r| LastError::Ended(*r)));
        let mut seen = std::collections::HashSet::new();
        for e in all {
            assert!(seen.insert(e.as_str()), "{} is spelled twice", e.as_str());
            assert_eq!(LastError::try_from(e.as_str()), Ok(e));
            let json = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<LastError>(&json).unwrap(), e);
        }
        let err = LastError::try_from("http_6xx").unwrap_err();
        assert_eq!(err.value, "http_6xx");
        assert!(err.to_string().contains("delivery error class"), "{err}");
    }

    #[test]
    fn stored_spellings_are_the_ones_rows_already_hold() {
        // Rows written by earlier versions keep these words: renaming a
        // variant must not change them.
        assert_eq!(
            DeliveryStatus::NAMES,
            ["pending", "succeeded", "failed", "exhausted", "cancelled"]
        );
        assert_eq!(
            OutcomeKind::NAMES,
            ["succeeded", "retryable", "rejected", "gone"]
        );
        assert_eq!(Trigger::NAMES, ["auto", "manual"]);
        assert_eq!(
            AttemptNote::NAMES,
            ["previous_outcome_unknown", "previous_in_order_failed"]
        );
        assert_eq!(
            EndReason::NAMES,
            [
                "endpoint_deleted",
                "deadline_while_paused",
                "unreadable",
                "cancelled"
            ]
        );
        assert_eq!(ErrorClass::Shutdown.as_str(), "shutdown");
        assert_eq!(ErrorClass::ServerError.as_str(), "http_5xx");
    }
}
