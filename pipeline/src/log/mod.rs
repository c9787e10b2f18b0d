//! The log port: partitioned topics between the stages.
//!
//! ```text
//!  capture ──send_all──▶ events ──poll/commit──▶ fan-out ──send──▶ deliveries ──▶ dispatch
//!     ▲                                             │
//!     └──────── receipt resolves: durable ◀─────────┘ (embedded: fan-out committed)
//! ```
//!
//! Contract (every implementation; checked by [`contract`]):
//! - A topic has a fixed number of partitions; a key always maps to the same
//!   partition, and records of one partition are read in append order with
//!   consecutive offsets.
//! - [`Producer::send_all`] returns once the log has *accepted* the records
//!   (it waits while the log applies back-pressure). The returned [`Receipt`]
//!   resolves once they are *durable*: for Fluvio, stored by the cluster
//!   (read-committed); for the embedded log, which keeps nothing on disk,
//!   once every consumer group named in the topic's `durable_groups` has
//!   committed past them — their effects are then in Postgres. Upstream
//!   acknowledges (the slot's LSN) only after the receipt resolves.
//! - Delivery is at least once: a consumer of a group starts at the group's
//!   committed position, so records read but not committed are read again by
//!   the next consumer of that group. Duplicates are expected; every stage
//!   downstream de-duplicates on ids.
//! - Commit positions only move forward; committing an older position is a
//!   no-op.

pub mod contract;
pub mod embedded;

use std::future::Future;
use std::pin::Pin;

use crate::ids::Offset;

/// A record type carried by a topic.
pub trait Message: Clone + Send + Sync + 'static {
    /// Appends the record's bytes (used by logs that store bytes).
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads a record written by [`Message::encode`].
    fn decode(bytes: &[u8]) -> Result<Self, LogError>;
}

/// The settings of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    /// The topic's name.
    pub name: String,
    /// How many partitions it has.
    pub partitions: u32,
    /// Records held per partition before senders wait (embedded log).
    pub capacity: usize,
    /// Consumer groups whose commit makes a record durable (embedded log).
    pub durable_groups: Vec<String>,
}

/// Where a record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// The partition.
    pub partition: u32,
    /// Its offset there.
    pub offset: Offset,
}

/// A record read from a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<M> {
    /// The record's offset; commit `offset + 1` once its effect is durable.
    pub offset: Offset,
    /// The record.
    pub message: M,
}

/// Errors of a log implementation.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// No topic of that name was declared.
    #[error("unknown topic {0:?}")]
    UnknownTopic(String),
    /// The topic exists with another record type.
    #[error("topic {0:?} carries another record type")]
    WrongType(String),
    /// The partition number is out of range.
    #[error("topic {topic:?} has no partition {partition}")]
    NoPartition {
        /// The topic.
        topic: String,
        /// The partition asked for.
        partition: u32,
    },
    /// The log was shut down.
    #[error("the log is closed")]
    Closed,
    /// A record's bytes could not be read.
    #[error("undecodable record: {0}")]
    Decode(String),
    /// Records a consumer had not read are gone from the log (its
    /// retention removed them): reading on would skip them, so the
    /// consumer stops here. Definite: reading again cannot bring them back.
    #[error(
        "records {expected} to {last} of topic {topic:?} partition {partition} are gone from the log before \
         group {group:?} read them ({count} records: the log's retention removed them; the next record there is \
         {found}). Nothing was skipped: this consumer stops here. Their events never reached fan-out; \
         `walhook reconcile` over the window shows them as lost. To go on past them, delete the group's stored \
         position (`fluvio consumer delete {group} --topic {topic} --partition {partition}`): the next start \
         reads from {found}. To keep this from happening, raise [log] retention above the longest time a \
         member may be down",
        last = found - 1,
        count = found - expected
    )]
    Gap {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The consumer group.
        group: String,
        /// The offset the group was to read next.
        expected: u64,
        /// The first offset the log still has.
        found: u64,
    },
    /// This consumer's member no longer holds the partition (its lease
    /// lapsed and another member took it, or the member gave it up): its
    /// position was not committed. Definite for this consumer; the holder
    /// reads on from the last committed position.
    #[error(
        "this member no longer holds partition {partition} of topic {topic:?} for group {group:?} (it gave \
         the partition up, or its lease lapsed and another member took it): the group's position was not \
         moved to {next}; the partition's holder reads on from the last committed position"
    )]
    Fenced {
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// The consumer group.
        group: String,
        /// The position that was not committed.
        next: u64,
    },
    /// The backing system failed; retrying may help.
    #[error("log backend error")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl LogError {
    /// Whether retrying the operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, LogError::Backend(_))
    }
}

/// Resolves when the records of one [`Producer::send_all`] are durable.
pub struct Receipt(Pin<Box<dyn Future<Output = Result<(), LogError>> + Send>>);

impl Receipt {
    /// Wraps a future that resolves when the records are durable.
    pub fn new(fut: impl Future<Output = Result<(), LogError>> + Send + 'static) -> Self {
        Receipt(Box::pin(fut))
    }

    /// A receipt for records that are already durable.
    pub fn ready() -> Self {
        Receipt::new(std::future::ready(Ok(())))
    }
}

impl Future for Receipt {
    type Output = Result<(), LogError>;
    fn poll(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl std::fmt::Debug for Receipt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Receipt(..)")
    }
}

/// Appends records to one topic.
pub trait Producer<M: Message>: Clone + Send + Sync + 'static {
    /// Appends `records` (key, record), each to the partition its key maps
    /// to, in order. Returns once accepted; the receipt resolves once all of
    /// them are durable.
    fn send_all(
        &self,
        records: Vec<(Vec<u8>, M)>,
    ) -> impl Future<Output = Result<Receipt, LogError>> + Send;
}

/// Reads one partition of a topic for a consumer group.
pub trait Consumer<M: Message>: Send + Sync + 'static {
    /// The partition read.
    fn partition(&self) -> u32;

    /// Waits for at least one record and returns up to `max` of them.
    fn poll(&mut self, max: usize)
    -> impl Future<Output = Result<Vec<Record<M>>, LogError>> + Send;

    /// Records that everything before `next` is done for this group.
    fn commit(&mut self, next: Offset) -> impl Future<Output = Result<(), LogError>> + Send;
}

/// A log: a set of topics.
pub trait Log: Clone + Send + Sync + 'static {
    /// The producer type for records of type `M`.
    type Producer<M: Message>: Producer<M>;
    /// The consumer type for records of type `M`.
    type Consumer<M: Message>: Consumer<M>;

    /// The number of partitions of `topic`.
    fn partitions(&self, topic: &str) -> Result<u32, LogError>;

    /// A producer for `topic`.
    fn producer<M: Message>(&self, topic: &str) -> Result<Self::Producer<M>, LogError>;

    /// A consumer of one partition of `topic` for `group`, starting at the
    /// group's committed position.
    fn consumer<M: Message>(
        &self,
        topic: &str,
        partition: u32,
        group: &str,
    ) -> impl Future<Output = Result<Self::Consumer<M>, LogError>> + Send;
}

/// The partition that `key` maps to among `partitions` (FNV-1a, stable
/// across processes and versions).
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % u64::from(partitions.max(1))) as u32
}
