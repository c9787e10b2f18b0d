//! The Fluvio log: the log port over a Fluvio cluster, with the official
//! `fluvio` client.
//!
//! ```text
//!  producer ──send (our partitioner)──▶ SPU ──Isolation::ReadCommitted──▶ receipt
//!  consumer ◀── reader task (one per partition, owns the stream, never cancelled)
//!  commit(n) ──▶ a one-shot stream at offset n-1, offset_commit + offset_flush
//! ```
//!
//! How the port's contract maps onto Fluvio:
//! - **Topics** are created at start with the partitions of their
//!   [`TopicSpec`](walhook_pipeline::log::TopicSpec) and the replication of [`FluvioSettings`], or checked
//!   when they exist: a topic with another partition count is refused, since
//!   keys would then map elsewhere (see [`FluvioLog::connect`]).
//! - **Keys** map to partitions with the port's own [`partition_for`](walhook_pipeline::log::partition_for), not
//!   Fluvio's default hash, so every process (and the embedded log) agrees.
//! - **Receipts** resolve once the cluster stored the records: the producer
//!   asks for `Isolation::ReadCommitted` and a receipt awaits every record's
//!   metadata. `send_all` returns once the records are queued in the
//!   producer (it waits while the producer's queue is full).
//! - **Consumers** read with a stream whose start is the group's committed
//!   offset (a Fluvio consumer offset named after the group, one per topic
//!   and partition). A task of its own owns the stream and keeps its
//!   `next()` running (a cancelled `next()` leaves the client's retry stream
//!   holding a lock that offset operations then wait for), and hands records
//!   over through a bounded queue, so `poll` is cancel-safe.
//! - **Commits** are exact, and made by a task of the consumer's own, so
//!   that the caller does not wait a broker round trip per batch. Fluvio
//!   commits "the last record the stream yielded", and the reader is ahead
//!   of what the caller has finished; so a commit of `n` opens a short
//!   stream of the same consumer at offset `n - 1` (a record that exists:
//!   the reader has read it), takes that record, commits and flushes (the
//!   server acknowledges), and closes it. A newer commit supersedes one not
//!   yet made; commits below the first record this consumer read (where the
//!   group's position was) are no-ops. A new consumer of the same group and
//!   partition in this process starts once the earlier one's commits are
//!   stored (or its committer gave up). After a crash the group resumes at
//!   the last stored commit and what follows is read again (at least once).
//!   One member reads a partition for a group at a time (static
//!   assignment), so nothing else moves it.
//!
//! A broker crash heals without a process restart:
//! - producers retry their batches (`DeliverySemantic::AtLeastOnce`); a
//!   producer that failed anyway refuses every later record, so it is
//!   dropped and the next send makes a new one on a new connection (capture
//!   restarts from the slot after a failed receipt, and its next run sends
//!   again what the failed one had not stored);
//! - the reader's stream reconnects by itself, and is reopened on a new
//!   connection at the next offset not read should it fail or end;
//! - commits and the opening of a partition retry on new connections.
//!
//! Records sent twice by a producer retry are read twice; every stage
//! downstream de-duplicates on ids, as the contract says. How long the
//! cluster has failed to answer (operations, and a probe of the partitions'
//! leaders) is kept ([`FluvioLog::reachability`]); the runtime stops a
//! process once it exceeds [`FluvioSettings::give_up_after`].
//!
//! This file holds the settings, the state the parts share ([`FluvioLog`])
//! and the port's entry points ([`Log`] for it). The other parts:
//! - `connection`: the client, replaced by a new connection after a
//!   failure, and operations retried on new connections;
//! - `topics`: [`FluvioLog::connect`]: topics created or checked (partitions,
//!   retention) and waited for;
//! - `producer`: [`FluvioProducer`], remade after a failure;
//! - `consumer`: [`FluvioConsumer`] and the partition a group reads;
//! - `reader`: the reader task that owns a partition's stream;
//! - `committer`: the task that makes a consumer's exact commits;
//! - `watch`: reachability, watermarks and consumer lag; `tls`: TLS to the
//!   cluster.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant, SystemTime};

use fluvio::consumer::{ConsumerConfigExt, OffsetManagementStrategy};
use fluvio::{Fluvio, Isolation, Offset as FluvioOffset};
use tokio::sync::mpsc;
use walhook_pipeline::log::{Log, LogError, Message};

mod committer;
mod connection;
mod consumer;
mod control;
mod producer;
mod reader;
mod tls;
mod topics;
mod watch;

use committer::{CommitState, Committer, run_committer};
pub use consumer::FluvioConsumer;
use consumer::{Place, stored_position};
pub use producer::FluvioProducer;
use reader::{FETCH_MAX_BYTES, open_stream, read};
pub use tls::{ClientIdentity, FluvioTls, TlsVerify, check_domain};
pub use topics::TopicReport;
use watch::Health;
pub use watch::{ConsumerLag, Reachability, Watermarks};

/// How to reach the cluster and shape the topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FluvioSettings {
    /// The streaming controller's public address, `host:port`.
    pub endpoint: String,
    /// Replicas per partition for topics walhook creates (1 on a one-SPU
    /// cluster; 3 in production).
    pub replication: u32,
    /// How long to wait for the cluster at start (connecting, topics
    /// becoming ready) before giving up with an error.
    pub connect_timeout: Duration,
    /// Records read ahead per partition and consumer.
    pub read_ahead: usize,
    /// How long the cluster may fail to answer (operations failing, or a
    /// partition of walhook's topics without a live leader) before
    /// [`FluvioLog::unreachable_past_limit`] says so and the process
    /// stops rather than waiting for ever.
    pub give_up_after: Duration,
    /// TLS to the cluster; plain TCP when `None`.
    pub tls: Option<FluvioTls>,
    /// How long the cluster keeps a topic's records (set on the topics
    /// walhook creates, checked on those that exist). A consumer that
    /// falls further behind stops with [`LogError::Gap`].
    pub retention: Duration,
    /// The size of a partition's log segments, in bytes: retention removes
    /// whole segments whose last write is older than `retention`.
    pub segment_size: u32,
}

impl FluvioSettings {
    /// Settings for `endpoint` with the defaults of a one-SPU cluster.
    pub fn new(endpoint: impl Into<String>) -> Self {
        FluvioSettings {
            endpoint: endpoint.into(),
            replication: 1,
            connect_timeout: Duration::from_secs(30),
            read_ahead: 1024,
            give_up_after: Duration::from_secs(300),
            tls: None,
            retention: Duration::from_secs(7 * 24 * 3600),
            segment_size: 100 << 20,
        }
    }
}

/// A log over a Fluvio cluster; cheap to clone.
#[derive(Clone)]
pub struct FluvioLog {
    inner: Arc<Inner>,
}

struct Inner {
    /// The client new producers and consumers use; replaced by a new
    /// connection when an operation on it failed (a broker restart leaves
    /// the old one's sockets dead).
    client: parking_lot::Mutex<Arc<Fluvio>>,
    settings: FluvioSettings,
    health: Health,
    partitions: HashMap<String, u32>,
    /// The commit state of the latest consumer per (topic, partition,
    /// group).
    commits: parking_lot::Mutex<HashMap<(String, u32, String), Arc<CommitState>>>,
    /// When records that some group has not read yet were produced, by
    /// (topic, partition, offset), for [`FluvioLog::consumer_lag`].
    record_times: parking_lot::Mutex<HashMap<(String, u32, i64), SystemTime>>,
}

fn backend(e: impl Into<anyhow::Error>) -> LogError {
    let e: anyhow::Error = e.into();
    LogError::Backend(e.into())
}

fn broken(msg: String) -> LogError {
    LogError::Backend(msg.into())
}

impl Log for FluvioLog {
    type Producer<M: Message> = FluvioProducer<M>;
    type Consumer<M: Message> = FluvioConsumer<M>;

    fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        self.inner
            .partitions
            .get(topic)
            .copied()
            .ok_or_else(|| LogError::UnknownTopic(topic.to_owned()))
    }

    fn producer<M: Message>(&self, topic: &str) -> Result<FluvioProducer<M>, LogError> {
        self.partitions(topic)?;
        Ok(FluvioProducer {
            inner: self.inner.clone(),
            topic: topic.to_owned(),
            slot: Arc::default(),
            _record: PhantomData,
        })
    }

    #[allow(clippy::disallowed_methods)] // bare spawn: the reader and committer end with their consumer, which owns them
    async fn consumer<M: Message>(
        &self,
        topic: &str,
        partition: u32,
        group: &str,
    ) -> Result<FluvioConsumer<M>, LogError> {
        let count = self.partitions(topic)?;
        if partition >= count {
            return Err(LogError::NoPartition {
                topic: topic.to_owned(),
                partition,
            });
        }
        // No offset management on the reading stream: it starts at the
        // group's stored offset and never commits (the committer does).
        let config = ConsumerConfigExt::builder()
            .topic(topic.to_owned())
            .partition(partition)
            .offset_consumer(group.to_owned())
            .offset_start(FluvioOffset::beginning())
            .offset_strategy(OffsetManagementStrategy::None)
            .isolation(Isolation::ReadCommitted)
            .max_bytes(FETCH_MAX_BYTES)
            .build()
            .map_err(backend)?;
        // Commits asked for by an earlier consumer of this group and
        // partition land before this one reads its start position.
        let key = (topic.to_owned(), partition, group.to_owned());
        let earlier = self.inner.commits.lock().get(&key).cloned();
        if let Some(earlier) = earlier {
            earlier.settled().await;
        }
        // The partition's leader may be restarting (a member starting
        // while a broker crashes): keep trying, on a new connection, as
        // commits do, rather than fail the whole process's start.
        let place = Place {
            topic: topic.to_owned(),
            partition,
            group: group.to_owned(),
        };
        let name = place.to_string();
        let deadline = Instant::now() + self.inner.settings.give_up_after;
        // Where the group is to read next: the record after its stored
        // position. A group with none starts at the first record the
        // partition still has.
        let stored = stored_position(&self.inner, &place, deadline).await?;
        let opened = open_stream(
            &self.inner,
            &config,
            self.inner.client(),
            &name,
            Some(deadline),
        )
        .await?;
        let client = opened.0.clone();
        let (tx, rx) = mpsc::channel(self.inner.settings.read_ahead.max(1));
        let reader = tokio::spawn(read::<M>(
            self.inner.clone(),
            config,
            opened,
            tx,
            (place, stored.map(|o| o + 1)),
        ));
        let commits = Arc::new(CommitState {
            want: AtomicU64::new(0),
            done: tokio::sync::watch::Sender::new(0),
            failed: parking_lot::Mutex::new(None),
        });
        self.inner.commits.lock().insert(key, commits.clone());
        let (wake, woken) = mpsc::channel(1);
        let committer = Committer {
            inner: self.inner.clone(),
            client,
            topic: topic.to_owned(),
            partition,
            group: group.to_owned(),
        };
        tokio::spawn(run_committer(committer, commits.clone(), woken));
        Ok(FluvioConsumer {
            partition,
            records: rx,
            reader,
            floor: None,
            commits,
            wake,
        })
    }
}
