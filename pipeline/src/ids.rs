//! Identities and positions that cross module boundaries.
//!
//! Ids are 16 bytes, shown as a type prefix and 26 lower-case Crockford
//! base32 characters (`evt_…`, `dlv_…`, `ep_…`, `att_…`), like Svix's
//! prefixed ids: an id pasted into a support ticket says what it is. The ids
//! of facts that the WAL determines (events, deliveries, attempts) are derived
//! from their inputs with SHA-256, so reading the slot again after a crash, or
//! fanning an event out twice, produces the same ids and every later stage can
//! de-duplicate on them.

use std::fmt;
use std::str::FromStr;

use sha2::{Digest, Sha256};

/// A position in the write-ahead log of the captured database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    /// The invalid position `0/0`.
    pub const ZERO: Lsn = Lsn(0);
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xffff_ffff)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for Lsn {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdError::malformed("LSN", s);
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// An offset in a partition of a log topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Offset(pub u64);

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a string is not an id of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The text does not have the id's form.
    #[error("{value:?} is not a valid {kind}")]
    Malformed {
        /// What kind of id was expected.
        kind: &'static str,
        /// The text that was given: cleaned (no NUL or control characters)
        /// and cut to 80 bytes, since it may be hostile input that ends up
        /// in a log line, an incident or an API answer.
        value: String,
    },
}

impl IdError {
    /// A malformed `kind` made of `value` (cleaned and bounded).
    pub fn malformed(kind: &'static str, value: &str) -> Self {
        IdError::Malformed {
            kind,
            value: crate::sanitize::clean_str(value, crate::sanitize::Lines::Escape, 80),
        }
    }
}

const CROCKFORD: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

fn encode_base32(bytes: &[u8; 16], out: &mut String) {
    // 128 bits as 26 five-bit groups, most significant first; the first
    // group carries the top 3 bits so that the encoding is fixed-width.
    let value = u128::from_be_bytes(*bytes);
    for i in (0..26).rev() {
        let digit = ((value >> (i * 5)) & 0x1f) as usize;
        out.push(CROCKFORD[digit] as char);
    }
}

fn decode_base32(text: &str) -> Option<[u8; 16]> {
    if text.len() != 26 {
        return None;
    }
    let mut value: u128 = 0;
    for (i, c) in text.bytes().enumerate() {
        let digit = CROCKFORD
            .iter()
            .position(|&d| d == c.to_ascii_lowercase())? as u128;
        if i == 0 && digit > 7 {
            return None;
        }
        value = (value << 5) | digit;
    }
    Some(value.to_be_bytes())
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub [u8; 16]);

        impl $name {
            /// The prefix of the textual form, including the underscore.
            pub const PREFIX: &'static str = $prefix;

            /// The id's 16 bytes, as stored in Postgres (`uuid`).
            pub fn as_bytes(&self) -> &[u8; 16] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut s = String::with_capacity(Self::PREFIX.len() + 26);
                s.push_str(Self::PREFIX);
                encode_base32(&self.0, &mut s);
                f.write_str(&s)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                s.strip_prefix(Self::PREFIX)
                    .and_then(decode_base32)
                    .map($name)
                    .ok_or_else(|| IdError::malformed($kind, s))
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// One committed business fact, derived from the WAL position that
    /// recorded it ([`EventId::derive`]).
    EventId,
    "evt_",
    "event id"
);
prefixed_id!(
    /// One event for one endpoint, derived from both ([`DeliveryId::derive`]).
    /// Sent as `webhook-id`: stable across retries and replays.
    DeliveryId,
    "dlv_",
    "delivery id"
);
prefixed_id!(
    /// A customer's webhook endpoint; random, made by the control plane.
    EndpointId,
    "ep_",
    "endpoint id"
);
prefixed_id!(
    /// One HTTP try of a delivery ([`AttemptId::derive`]).
    AttemptId,
    "att_",
    "attempt id"
);

fn derive16(parts: &[&[u8]]) -> [u8; 16] {
    let mut hasher = Sha256::new();
    for part in parts {
        // Length-prefix every part so that no two inputs collide by
        // shifting bytes between neighbouring parts.
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    let digest = hasher.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

/// An id led by `order` (8 bytes, big-endian) and completed by the first 8
/// bytes of [`derive16`] of `parts`.
///
/// Ids in primary keys that grow with time keep B-tree inserts at the
/// right edge of the index: a random id puts every insert on a random leaf
/// page, so once an index outgrows memory each insert costs a page read and
/// a page write (docs/performance.md). The hash half keeps ids unique among
/// those that share the leading half.
fn ordered16(order: u64, parts: &[&[u8]]) -> [u8; 16] {
    let digest = derive16(parts);
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&order.to_be_bytes());
    out[8..].copy_from_slice(&digest[..8]);
    out
}

impl EventId {
    /// The id of the event that `rule` made from the change at `tx_ordinal`
    /// in the transaction committed at `commit_lsn` on `source`: led by the
    /// commit LSN, so event ids grow with the WAL.
    pub fn derive(source: &str, commit_lsn: Lsn, tx_ordinal: u32, rule: &str) -> Self {
        EventId(ordered16(
            commit_lsn.0,
            &[
                b"walhook.event.v2",
                source.as_bytes(),
                &commit_lsn.0.to_be_bytes(),
                &tx_ordinal.to_be_bytes(),
                rule.as_bytes(),
            ],
        ))
    }
}

impl EventId {
    /// The id of an operational event walhook itself emits (such as
    /// `endpoint.disabled`) about `subject` at `version`.
    pub fn derive_operational(event_type: &str, subject: &[u8], version: u32) -> Self {
        EventId(derive16(&[
            b"walhook.operational.v1",
            event_type.as_bytes(),
            subject,
            &version.to_be_bytes(),
        ]))
    }
}

impl DeliveryId {
    /// The id of `event`'s delivery to `endpoint`: led by the event id's
    /// leading half (its commit LSN), so delivery ids grow with the WAL too.
    /// The platform database checks this derivation
    /// (`deliveries_id_is_derived`).
    pub fn derive(event: EventId, endpoint: EndpointId) -> Self {
        let mut lead = [0u8; 8];
        lead.copy_from_slice(&event.0[..8]);
        DeliveryId(ordered16(
            u64::from_be_bytes(lead),
            &[b"walhook.delivery.v2", &event.0, &endpoint.0],
        ))
    }
}

impl AttemptId {
    /// The id of attempt `number` (from 1) of `delivery`.
    pub fn derive(delivery: DeliveryId, number: u32) -> Self {
        AttemptId(derive16(&[
            b"walhook.attempt.v1",
            &delivery.0,
            &number.to_be_bytes(),
        ]))
    }
}

impl AttemptId {
    /// The id of manual attempt `number` (from 1) of `delivery`.
    pub fn derive_manual(delivery: DeliveryId, number: u32) -> Self {
        AttemptId(derive16(&[
            b"walhook.attempt.manual.v1",
            &delivery.0,
            &number.to_be_bytes(),
        ]))
    }
}

impl EndpointId {
    /// A fresh random endpoint id.
    pub fn random() -> Self {
        EndpointId(rand::random())
    }

    /// The id of the endpoint that the request with `idempotency_key` from
    /// the caller `scope` creates: a request retried after its first run
    /// did the work but lost the response names the same endpoint again,
    /// so it cannot create a second one.
    pub fn derive_for_request(scope: &str, idempotency_key: &str) -> Self {
        EndpointId(derive16(&[
            b"walhook.endpoint.request.v1",
            scope.as_bytes(),
            idempotency_key.as_bytes(),
        ]))
    }
}

/// A tenant: the value of the capture rule's tenant column, registered by an
/// operator. Tenants are named by the business database, so the id is text.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId(String);

impl TenantId {
    /// The longest tenant id accepted.
    pub const MAX_LEN: usize = 128;

    /// Checks `value`: 1 to 128 characters, none of them a control character.
    pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
        let value = value.into();
        if value.is_empty() || value.len() > Self::MAX_LEN || value.chars().any(char::is_control) {
            return Err(IdError::malformed("tenant id", &value));
        }
        Ok(TenantId(value))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TenantId {
    type Error = IdError;
    fn try_from(value: String) -> Result<Self, IdError> {
        TenantId::new(value)
    }
}

impl From<TenantId> for String {
    fn from(id: TenantId) -> String {
        id.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lsn_round_trips_in_postgres_notation() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert!("16B374D848".parse::<Lsn>().is_err());
    }

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let a = EventId::derive("main", Lsn(42), 0, "invoice_paid");
        assert_eq!(a, EventId::derive("main", Lsn(42), 0, "invoice_paid"));
        assert_ne!(a, EventId::derive("main", Lsn(42), 1, "invoice_paid"));
        assert_ne!(a, EventId::derive("other", Lsn(42), 0, "invoice_paid"));
        let ep = EndpointId([7; 16]);
        assert_eq!(DeliveryId::derive(a, ep), DeliveryId::derive(a, ep));
        assert_ne!(
            DeliveryId::derive(a, ep),
            DeliveryId::derive(a, EndpointId([8; 16]))
        );
    }

    #[test]
    fn ids_grow_with_the_wal() {
        let ep = EndpointId([7; 16]);
        let mut last: Option<(EventId, DeliveryId)> = None;
        for lsn in [0x100u64, 0x101, 0x1_0000_0000, 0x1_0000_0001] {
            let e = EventId::derive("main", Lsn(lsn), 0, "r");
            let d = DeliveryId::derive(e, ep);
            assert_eq!(&e.0[..8], &lsn.to_be_bytes());
            assert_eq!(&d.0[..8], &e.0[..8]);
            if let Some((pe, pd)) = last {
                assert!(pe < e && pd < d, "ids do not grow with the LSN");
            }
            last = Some((e, d));
        }
    }

    proptest! {
        #[test]
        fn ids_round_trip_through_text(bytes in any::<[u8; 16]>()) {
            let id = DeliveryId(bytes);
            let text = id.to_string();
            prop_assert!(text.starts_with("dlv_"));
            prop_assert_eq!(text.len(), 30);
            prop_assert_eq!(text.parse::<DeliveryId>().unwrap(), id);
            prop_assert!(text.parse::<EventId>().is_err());
        }
    }
}
