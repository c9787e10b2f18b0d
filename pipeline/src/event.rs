//! Events: committed business facts, serialised once.
//!
//! Capture turns a row change into an [`Event`] whose `payload` is the exact
//! body that every delivery of it sends. [`Envelope`] writes that body; the
//! key order below is fixed (alphabetical), so the bytes depend only on the
//! change and the rule.
//!
//! ```text
//! {"data":{…},"id":"evt_…","object_id":"42","object_version":7,
//!  "occurred_at":"2026-11-29T10:11:44.123456Z","schema_version":1,
//!  "tenant_id":"acme","type":"invoice.paid"}
//! ```

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use crate::canonical::JsonWriter;
use crate::ids::{EventId, IdError, Lsn, TenantId};
use crate::time::Timestamp;

/// The longest object id an event carries, in bytes.
pub const MAX_OBJECT_ID_BYTES: usize = 512;

/// The longest object version an event carries (its JSON text), in bytes.
pub const MAX_OBJECT_VERSION_BYTES: usize = 256;

/// Checks an object id from a row or a message: at most
/// [`MAX_OBJECT_ID_BYTES`], no NUL or other control character (it is stored
/// as text, sent in the body and shown in logs and the API). The error
/// names the problem and where it is.
pub fn check_object_id(id: &str) -> Result<(), String> {
    if id.len() > MAX_OBJECT_ID_BYTES {
        return Err(format!(
            "the object id is {} bytes long; at most {MAX_OBJECT_ID_BYTES} are allowed",
            id.len()
        ));
    }
    match crate::sanitize::first_unsafe(id, crate::sanitize::Lines::Escape) {
        Some((at, c)) => Err(format!(
            "the object id holds the control character U+{:04X} at byte {at}; object ids must be \
             text without control characters",
            c as u32
        )),
        None => Ok(()),
    }
}

/// A dotted event type name such as `invoice.paid`.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct EventType(Arc<str>);

impl EventType {
    /// The longest type name accepted.
    pub const MAX_LEN: usize = 128;

    /// Checks `name`: 1 to 128 characters from `a-z A-Z 0-9 . _ -`, starting
    /// with a letter.
    pub fn new(name: &str) -> Result<Self, IdError> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_LEN
            && name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok {
            Ok(EventType(name.into()))
        } else {
            Err(IdError::malformed("event type", name))
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for EventType {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        EventType::new(&value)
    }
}

impl From<EventType> for String {
    fn from(t: EventType) -> String {
        t.0.to_string()
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where in the captured WAL an event came from: its de-duplication key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventKey {
    /// The commit LSN of the transaction.
    pub commit_lsn: Lsn,
    /// The position of the change among the transaction's changes, from 0.
    pub tx_ordinal: u32,
}

/// A committed business fact with its immutable body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Derived from the source, the key and the rule.
    pub id: EventId,
    /// The capture source's name.
    pub source: Arc<str>,
    /// Where the change was read.
    pub key: EventKey,
    /// The tenant whose endpoints may receive it.
    pub tenant_id: TenantId,
    /// The type endpoints subscribe to.
    pub event_type: EventType,
    /// The version of the type's payload schema.
    pub schema_version: u32,
    /// The business object the event is about, when the rule names one.
    pub object_id: Option<String>,
    /// The object's version (a column, or the commit LSN), as JSON text.
    pub object_version: Option<String>,
    /// The commit time of the transaction.
    pub occurred_at: Timestamp,
    /// The canonical envelope bytes: sent, signed and archived unchanged.
    pub payload: Bytes,
    /// SHA-256 of `payload`.
    pub payload_hash: [u8; 32],
}

/// Writes the canonical envelope of an event.
#[derive(Debug)]
pub struct Envelope<'a> {
    /// The event's id.
    pub id: EventId,
    /// The event type.
    pub event_type: &'a EventType,
    /// The tenant.
    pub tenant_id: &'a TenantId,
    /// The object id, when known.
    pub object_id: Option<&'a str>,
    /// The object version as a JSON value token (a number or a string
    /// literal), when known.
    pub object_version_json: Option<&'a str>,
    /// The commit time.
    pub occurred_at: Timestamp,
    /// The schema version.
    pub schema_version: u32,
    /// Columns whose values the WAL did not carry (unchanged TOAST under a
    /// replica identity other than FULL); listed under `unavailable`, never
    /// sent as null.
    pub unavailable: &'a [String],
}

impl Envelope<'_> {
    /// Writes the envelope around the `data` object that `write_data` writes
    /// (it must write exactly one JSON value), returning the bytes and their
    /// SHA-256.
    pub fn write(&self, write_data: impl FnOnce(&mut JsonWriter<'_>)) -> (Bytes, [u8; 32]) {
        let mut out = Vec::with_capacity(256);
        let mut w = JsonWriter::new(&mut out);
        w.begin_object();
        w.key("data");
        write_data(&mut w);
        w.key("id");
        w.string(&self.id.to_string());
        w.key("object_id");
        match self.object_id {
            Some(id) => w.string(id),
            None => w.null(),
        }
        w.key("object_version");
        match self.object_version_json {
            Some(v) => w.raw_number(v),
            None => w.null(),
        }
        w.key("occurred_at");
        w.string(&self.occurred_at.to_string());
        w.key("schema_version");
        w.integer(i64::from(self.schema_version));
        w.key("tenant_id");
        w.string(self.tenant_id.as_str());
        w.key("type");
        w.string(self.event_type.as_str());
        if !self.unavailable.is_empty() {
            w.key("unavailable");
            w.begin_array();
            for column in self.unavailable {
                w.string(column);
            }
            w.end_array();
        }
        w.end_object();
        let hash: [u8; 32] = Sha256::digest(&out).into();
        (Bytes::from(out), hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_is_canonical_json() {
        let t = EventType::new("invoice.paid").unwrap();
        let tenant = TenantId::new("acme").unwrap();
        let env = Envelope {
            id: EventId([0; 16]),
            event_type: &t,
            tenant_id: &tenant,
            object_id: Some("42"),
            object_version_json: Some("7"),
            occurred_at: Timestamp(0),
            schema_version: 1,
            unavailable: &[],
        };
        let (bytes, hash) = env.write(|w| {
            w.begin_object();
            w.key("amount");
            w.raw_number("10.50");
            w.end_object();
        });
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(
            text,
            r#"{"data":{"amount":10.50},"id":"evt_00000000000000000000000000","object_id":"42","object_version":7,"occurred_at":"1970-01-01T00:00:00.000000Z","schema_version":1,"tenant_id":"acme","type":"invoice.paid"}"#
        );
        assert_eq!(hash, <[u8; 32]>::from(Sha256::digest(text.as_bytes())));
        let parsed: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed["data"]["amount"], serde_json::json!(10.5));
    }

    #[test]
    fn event_types_are_checked() {
        assert!(EventType::new("order.shipped").is_ok());
        for bad in ["", "1abc", "a b", "a/b", &"x".repeat(129)] {
            assert!(EventType::new(bad).is_err(), "{bad}");
        }
    }
}

mod codec {
    //! The byte form of an [`Event`] for logs that store bytes: fixed-width
    //! fields, then length-prefixed strings and the payload.

    use super::*;
    use crate::log::{LogError, Message};

    fn put_str(out: &mut Vec<u8>, s: Option<&str>) {
        match s {
            None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
            Some(s) => {
                out.extend_from_slice(&(s.len() as u32).to_be_bytes());
                out.extend_from_slice(s.as_bytes());
            }
        }
    }

    struct Cursor<'a>(&'a [u8]);

    impl<'a> Cursor<'a> {
        fn take(&mut self, n: usize) -> Result<&'a [u8], LogError> {
            if n > self.0.len() {
                return Err(LogError::Decode("event record truncated".into()));
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Ok(head)
        }
        fn u32(&mut self) -> Result<u32, LogError> {
            let b = self.take(4)?;
            Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        }
        fn u64(&mut self) -> Result<u64, LogError> {
            let mut a = [0u8; 8];
            a.copy_from_slice(self.take(8)?);
            Ok(u64::from_be_bytes(a))
        }
        fn opt_str(&mut self) -> Result<Option<String>, LogError> {
            let n = self.u32()?;
            if n == u32::MAX {
                return Ok(None);
            }
            let b = self.take(n as usize)?;
            String::from_utf8(b.to_vec())
                .map(Some)
                .map_err(|_| LogError::Decode("event record string is not UTF-8".into()))
        }
        fn str(&mut self) -> Result<String, LogError> {
            self.opt_str()?
                .ok_or_else(|| LogError::Decode("missing string".into()))
        }
    }

    impl Message for Event {
        fn encode(&self, out: &mut Vec<u8>) {
            out.push(1); // format version
            out.extend_from_slice(&self.id.0);
            out.extend_from_slice(&self.key.commit_lsn.0.to_be_bytes());
            out.extend_from_slice(&self.key.tx_ordinal.to_be_bytes());
            out.extend_from_slice(&self.schema_version.to_be_bytes());
            out.extend_from_slice(&self.occurred_at.0.to_be_bytes());
            out.extend_from_slice(&self.payload_hash);
            put_str(out, Some(&self.source));
            put_str(out, Some(self.tenant_id.as_str()));
            put_str(out, Some(self.event_type.as_str()));
            put_str(out, self.object_id.as_deref());
            put_str(out, self.object_version.as_deref());
            out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
            out.extend_from_slice(&self.payload);
        }

        fn decode(bytes: &[u8]) -> Result<Self, LogError> {
            let mut c = Cursor(bytes);
            if c.take(1)? != [1] {
                return Err(LogError::Decode("unknown event record version".into()));
            }
            let mut id = [0u8; 16];
            id.copy_from_slice(c.take(16)?);
            let commit_lsn = Lsn(c.u64()?);
            let tx_ordinal = c.u32()?;
            let schema_version = c.u32()?;
            let occurred_at = Timestamp(c.u64()? as i64);
            let mut payload_hash = [0u8; 32];
            payload_hash.copy_from_slice(c.take(32)?);
            let bad = |e: IdError| LogError::Decode(e.to_string());
            let source: Arc<str> = c.str()?.into();
            let tenant_id = TenantId::new(c.str()?).map_err(bad)?;
            let event_type = EventType::new(&c.str()?).map_err(bad)?;
            let object_id = c.opt_str()?;
            let object_version = c.opt_str()?;
            let n = c.u32()? as usize;
            let payload = Bytes::copy_from_slice(c.take(n)?);
            Ok(Event {
                id: EventId(id),
                source,
                key: EventKey {
                    commit_lsn,
                    tx_ordinal,
                },
                tenant_id,
                event_type,
                schema_version,
                object_id,
                object_version,
                occurred_at,
                payload,
                payload_hash,
            })
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn events_round_trip_through_bytes() {
            let e = Event {
                id: EventId([3; 16]),
                source: "main".into(),
                key: EventKey {
                    commit_lsn: Lsn(99),
                    tx_ordinal: 4,
                },
                tenant_id: TenantId::new("acme").unwrap(),
                event_type: EventType::new("order.shipped").unwrap(),
                schema_version: 2,
                object_id: Some("o-1".into()),
                object_version: None,
                occurred_at: Timestamp(-5),
                payload: Bytes::from_static(b"{}"),
                payload_hash: [9; 32],
            };
            let mut bytes = Vec::new();
            e.encode(&mut bytes);
            assert_eq!(Event::decode(&bytes).unwrap(), e);
            for cut in 0..bytes.len() {
                assert!(Event::decode(&bytes[..cut]).is_err());
            }
        }
    }
}
