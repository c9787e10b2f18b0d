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
//!   [`TopicSpec`] and the replication of [`FluvioSettings`], or checked
//!   when they exist: a topic with another partition count is refused, since
//!   keys would then map elsewhere (see [`FluvioLog::connect`]).
//! - **Keys** map to partitions with the port's own [`partition_for`], not
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

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use fluvio::consumer::{
    ConsumerConfigExt, ConsumerOffset, ConsumerRecord, ConsumerStream, OffsetManagementStrategy,
    RetryMode,
};
use fluvio::metadata::topic::{
    CleanupPolicy, SegmentBasedPolicy, TopicResolution, TopicSpec as FluvioTopicSpec,
    TopicStorageConfig,
};
use fluvio::{
    Fluvio, FluvioClusterConfig, Isolation, Offset as FluvioOffset, PartitionId, Partitioner,
    PartitionerConfig, TopicProducerConfigBuilder, TopicProducerPool,
};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::{
    Consumer, Log, LogError, Message, Producer, Receipt, Record, TopicSpec, partition_for,
};

mod tls;
mod watch;

pub use tls::{ClientIdentity, FluvioTls, TlsVerify, check_domain};
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

/// Runs one try of a cluster operation within [`Committer::TRY_TIMEOUT`];
/// its error, or the timeout, as text.
async fn within<T, E: std::fmt::Display>(
    op: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(Committer::TRY_TIMEOUT, op).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err(format!("no answer within {:?}", Committer::TRY_TIMEOUT)),
    }
}

impl FluvioLog {
    /// Connects to the cluster, creates the topics that do not exist and
    /// checks those that do, and waits until every partition has a leader.
    ///
    /// A topic that exists with another number of partitions is refused
    /// with an error naming both figures: keys would map to other
    /// partitions than the ones already written, and one object's events
    /// would lose their order.
    pub async fn connect(
        settings: FluvioSettings,
        topics: Vec<TopicSpec>,
    ) -> Result<FluvioLog, LogError> {
        let deadline = Instant::now() + settings.connect_timeout;
        let client = tokio::time::timeout(settings.connect_timeout, open_client(&settings))
            .await
            .map_err(|_| {
                broken(format!(
                    "no Fluvio cluster answered at {} within {:?}: check [log] endpoint and that the cluster runs{}",
                    settings.endpoint,
                    settings.connect_timeout,
                    tls_hint(&settings)
                ))
            })?
            .map_err(broken)?;
        let admin = client.admin().await;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let existing = admin
            .list::<FluvioTopicSpec, String>(names.clone())
            .await
            .map_err(backend)?;
        let mut partitions = HashMap::new();
        for spec in &topics {
            match existing.iter().find(|m| m.name == spec.name) {
                Some(found) => {
                    check_retention(&spec.name, &found.spec, &settings)?;
                    let have = found.spec.partitions();
                    if have != spec.partitions {
                        return Err(broken(format!(
                            "Fluvio topic {:?} has {have} partitions but the configuration asks for {}: \
                             set the [log] partition count back to {have}, or use new topic names \
                             ([log] topic_prefix) once the old topics are drained",
                            spec.name, spec.partitions
                        )));
                    }
                }
                None => {
                    let mut create =
                        FluvioTopicSpec::new_computed(spec.partitions, settings.replication, None);
                    create.set_cleanup_policy(CleanupPolicy::Segment(SegmentBasedPolicy {
                        time_in_seconds: retention_secs(settings.retention),
                    }));
                    create.set_storage(TopicStorageConfig {
                        segment_size: Some(settings.segment_size),
                        max_partition_size: None,
                    });
                    if let Err(e) = admin.create(spec.name.clone(), false, create).await {
                        // Another process may have created it meanwhile.
                        let again = admin
                            .list::<FluvioTopicSpec, String>(vec![spec.name.clone()])
                            .await
                            .map_err(backend)?;
                        if !again.iter().any(|m| m.name == spec.name) {
                            return Err(LogError::Backend(
                                e.context(format!("cannot create Fluvio topic {:?}", spec.name))
                                    .into(),
                            ));
                        }
                    }
                }
            }
            partitions.insert(spec.name.clone(), spec.partitions);
        }
        // Wait until every topic is provisioned (its partitions have
        // leaders); producers and consumers fail before that.
        loop {
            let found = admin
                .list::<FluvioTopicSpec, String>(names.clone())
                .await
                .map_err(backend)?;
            let waiting = topics.iter().find(|spec| {
                !found.iter().any(|m| {
                    m.name == spec.name
                        && matches!(m.status.resolution, TopicResolution::Provisioned)
                })
            });
            let Some(spec) = waiting else { break };
            if Instant::now() > deadline {
                return Err(broken(format!(
                    "Fluvio topic {:?} was not provisioned within {:?}: check that the cluster has an SPU online \
                     (`fluvio cluster spu list`) and enough SPUs for replication {}",
                    spec.name, settings.connect_timeout, settings.replication
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Consumer offsets live in a system topic the SC makes after it
        // starts; until then every consumer of a group fails and backs off
        // for a second or more. Wait for it here, once.
        loop {
            match client.consumer_offsets().await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(LogError::Backend(
                        e.context(format!(
                            "the Fluvio cluster at {} cannot store consumer offsets yet (its system topic \
                             `consumer-offset` is missing); check the SC's log",
                            settings.endpoint
                        ))
                        .into(),
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(FluvioLog {
            inner: Arc::new(Inner {
                client: parking_lot::Mutex::new(Arc::new(client)),
                settings,
                health: Health::default(),
                partitions,
                commits: parking_lot::Mutex::new(HashMap::new()),
                record_times: parking_lot::Mutex::new(HashMap::new()),
            }),
        })
    }
}

impl Inner {
    /// The client for new producers and consumers.
    fn client(&self) -> Arc<Fluvio> {
        self.client.lock().clone()
    }

    /// A new connection in place of `failed` (one that an operation failed
    /// on), unless another caller replaced it already: then that one.
    async fn reconnect(&self, failed: &Arc<Fluvio>) -> Result<Arc<Fluvio>, LogError> {
        {
            let current = self.client.lock();
            if !Arc::ptr_eq(&current, failed) {
                return Ok(current.clone());
            }
        }
        let fresh = match within(open_client(&self.settings)).await {
            Ok(client) => Arc::new(client),
            Err(error) => {
                self.health.op(Err(&error));
                return Err(broken(error));
            }
        };
        let mut current = self.client.lock();
        if Arc::ptr_eq(&current, failed) {
            *current = fresh.clone();
            Ok(fresh)
        } else {
            Ok(current.clone())
        }
    }
}

/// How long the leader may take to store a produced batch on its replicas.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a receipt waits for a record's answer before the producer is
/// given up (longer than [`PRODUCE_TIMEOUT`] plus a batch's linger).
const RECEIPT_TIMEOUT: Duration = Duration::from_secs(15);

/// The segment size of a topic created without one (Fluvio's
/// `SPU_LOG_SEGMENT_MAX_BYTES`, 1 GiB).
const FLUVIO_DEFAULT_SEGMENT_SIZE: u32 = 1 << 30;

/// `retention` in whole seconds, as Fluvio keeps it.
fn retention_secs(retention: Duration) -> u32 {
    u32::try_from(retention.as_secs()).unwrap_or(u32::MAX)
}

/// Checks an existing topic's retention against the settings: a topic that
/// keeps its records for less time than `[log] retention` is refused (a
/// consumer down for longer than the topic keeps records would find them
/// gone); one that keeps them longer, or other segments, is only noted.
fn check_retention(
    name: &str,
    found: &FluvioTopicSpec,
    settings: &FluvioSettings,
) -> Result<(), LogError> {
    let (have, want) = (found.retention_secs(), retention_secs(settings.retention));
    if have < want {
        return Err(broken(format!(
            "Fluvio topic {name:?} keeps its records for {have} s, less than [log] retention = {:?} ({want} s): \
             a member down for longer than the topic keeps records would find them gone. Set [log] retention \
             to at most \"{have}s\", or use new topics ([log] topic_prefix) created with the longer retention",
            settings.retention
        )));
    }
    if have > want {
        tracing::info!(
            topic = name,
            topic_retention_secs = have,
            configured_secs = want,
            "the Fluvio topic keeps its records longer than [log] retention; it was created so"
        );
    }
    let segment = found
        .get_storage()
        .and_then(|s| s.segment_size)
        .unwrap_or(FLUVIO_DEFAULT_SEGMENT_SIZE);
    if segment != settings.segment_size {
        tracing::info!(
            topic = name,
            topic_segment_size = segment,
            configured = settings.segment_size,
            "the Fluvio topic's segment size differs from [log] segment_size; it was created so"
        );
    }
    Ok(())
}

/// What a failure to connect without TLS may mean.
fn tls_hint(settings: &FluvioSettings) -> &'static str {
    if settings.tls.is_none() {
        " (a cluster that speaks TLS needs [log.tls])"
    } else {
        ""
    }
}

/// A new client of the cluster, over TLS when the settings ask for it.
/// The error names the cluster and, for a TLS failure, the setting to
/// change.
async fn open_client(settings: &FluvioSettings) -> Result<Fluvio, String> {
    let connector = tls::connector(settings.tls.as_ref())
        .map_err(|e| format!("cannot connect to Fluvio at {}: {e:#}", settings.endpoint))?;
    let config = FluvioClusterConfig::new(settings.endpoint.clone());
    Fluvio::connect_with_connector(connector, &config)
        .await
        .map_err(|e| {
            let why = settings
                .tls
                .as_ref()
                .and_then(|t| tls::explain(&e, t))
                .unwrap_or_else(|| {
                    format!(
                        "{e:#}; check [log] endpoint and that the cluster's SC listens there{}",
                        tls_hint(settings)
                    )
                });
            format!("cannot connect to Fluvio at {}: {why}", settings.endpoint)
        })
}

/// Maps keys with the port's own hash (see [`partition_for`]).
struct PortPartitioner;

impl Partitioner for PortPartitioner {
    fn partition(&self, config: &PartitionerConfig, key: Option<&[u8]>, _: &[u8]) -> PartitionId {
        partition_for(key.unwrap_or_default(), config.partition_count())
    }
}

/// Appends to one Fluvio topic. The client's producer is made on the
/// first send (making it talks to the cluster; the port's `producer` call
/// does not wait), shared by the clones, and made again after it failed:
/// a Fluvio producer that met an error refuses every later record (seen
/// after a broker crash: capture's every restart failed at once, for as
/// long as the process lived), so a failed one is dropped, and the next
/// send makes a new one on a new connection.
pub struct FluvioProducer<M> {
    inner: Arc<Inner>,
    topic: String,
    slot: Arc<parking_lot::Mutex<ProducerSlot>>,
    _record: PhantomData<fn(M)>,
}

/// The producer in use, or why the next send makes a new one.
#[derive(Default)]
struct ProducerSlot {
    current: Option<Arc<Pooled>>,
    /// The client of a producer that failed: the next producer is made on
    /// a new connection.
    failed_client: Option<Arc<Fluvio>>,
}

/// A producer and the client it was made on.
struct Pooled {
    pool: TopicProducerPool,
    client: Arc<Fluvio>,
}

impl<M> Clone for FluvioProducer<M> {
    fn clone(&self) -> Self {
        FluvioProducer {
            inner: self.inner.clone(),
            topic: self.topic.clone(),
            slot: self.slot.clone(),
            _record: PhantomData,
        }
    }
}

/// Drops `failed` from `slot` (unless a newer producer replaced it), so
/// that the next send makes a new one on a new connection.
fn discard(slot: &parking_lot::Mutex<ProducerSlot>, failed: &Arc<Pooled>) {
    let mut slot = slot.lock();
    if slot
        .current
        .as_ref()
        .is_some_and(|current| Arc::ptr_eq(current, failed))
    {
        slot.current = None;
        slot.failed_client = Some(failed.client.clone());
    }
}

impl<M> FluvioProducer<M> {
    async fn get(&self) -> Result<Arc<Pooled>, LogError> {
        let failed_client = {
            let mut slot = self.slot.lock();
            if let Some(current) = &slot.current {
                return Ok(current.clone());
            }
            slot.failed_client.take()
        };
        let client = match failed_client {
            Some(failed) => self.inner.reconnect(&failed).await?,
            None => self.inner.client(),
        };
        let config = TopicProducerConfigBuilder::default()
            .partitioner(Arc::new(PortPartitioner))
            .isolation(Isolation::ReadCommitted)
            // How long the leader may take to have a batch stored by its
            // replicas (Fluvio's 1.5 s is often too short for followers
            // that are catching up, e.g. after a failover).
            .timeout(PRODUCE_TIMEOUT)
            .build()
            .map_err(backend)?;
        let made = within(client.topic_producer_with_config(self.topic.clone(), config)).await;
        let pool = match made {
            Ok(pool) => pool,
            Err(error) => {
                self.slot.lock().failed_client = Some(client);
                let error = format!(
                    "cannot make a producer for Fluvio topic {:?} at {}: {error}",
                    self.topic, self.inner.settings.endpoint
                );
                self.inner.health.op(Err(&error));
                return Err(broken(error));
            }
        };
        let pooled = Arc::new(Pooled { pool, client });
        let mut slot = self.slot.lock();
        // Another send may have made one meanwhile: use that one.
        Ok(slot.current.get_or_insert(pooled).clone())
    }
}

impl<M: Message> Producer<M> for FluvioProducer<M> {
    async fn send_all(&self, records: Vec<(Vec<u8>, M)>) -> Result<Receipt, LogError> {
        let pooled = self.get().await?;
        let mut outputs = Vec::with_capacity(records.len());
        for (key, record) in records {
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            match pooled.pool.send(key, bytes).await {
                Ok(output) => outputs.push(output),
                Err(e) => {
                    let error = format!("{e:#}");
                    tracing::warn!(topic = %self.topic, %error, "a Fluvio producer failed; the next send makes a new one");
                    self.inner.health.op(Err(&error));
                    discard(&self.slot, &pooled);
                    return Err(backend(e));
                }
            }
        }
        let (inner, slot, topic) = (self.inner.clone(), self.slot.clone(), self.topic.clone());
        Ok(Receipt::new(async move {
            for output in outputs {
                // A produce request in flight when its SPU died is answered
                // only by the client's 60 s request timeout: a waiter
                // (fan-out storing jobs before its offset moves) would
                // stall that long. Past the leader's own time to store a
                // batch, the producer is given up and the records are sent
                // again (at least once) by a new one.
                let error = match tokio::time::timeout(RECEIPT_TIMEOUT, output.wait()).await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(_) => format!(
                        "no answer within {} s (the partition's leader may have died)",
                        RECEIPT_TIMEOUT.as_secs()
                    ),
                };
                tracing::warn!(%topic, %error, "a Fluvio producer's records were not stored; the next send makes a new producer");
                inner.health.op(Err(&error));
                discard(&slot, &pooled);
                return Err(broken(error));
            }
            inner.health.op(Ok(()));
            Ok(())
        }))
    }
}

/// Reads one partition of a Fluvio topic for a consumer group.
pub struct FluvioConsumer<M> {
    partition: u32,
    records: mpsc::Receiver<Result<Record<M>, LogError>>,
    reader: JoinHandle<()>,
    /// Below this the group's position cannot move: the offset of the
    /// first record this consumer handed out (the group's stored position
    /// or later). `None` until a record was handed out: nothing read,
    /// nothing to commit.
    floor: Option<u64>,
    commits: Arc<CommitState>,
    /// Wakes the committer task; dropped with the consumer, which lets the
    /// task finish what was asked and end.
    wake: mpsc::Sender<()>,
}

impl<M> Drop for FluvioConsumer<M> {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl<M: Message> Consumer<M> for FluvioConsumer<M> {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn poll(&mut self, max: usize) -> Result<Vec<Record<M>>, LogError> {
        let first = self.records.recv().await.ok_or(LogError::Closed)??;
        self.floor.get_or_insert(first.offset.0);
        let mut out = vec![first];
        while out.len() < max.max(1) {
            match self.records.try_recv() {
                Ok(record) => out.push(record?),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Asks the committer task to move the group to `next` and returns:
    /// fan-out does not wait a broker round trip per batch. A later commit
    /// supersedes one not yet made; a new consumer of the same group and
    /// partition in this process starts only once every commit asked for
    /// here is stored. A commit the task gave up on fails the next call.
    async fn commit(&mut self, next: Offset) -> Result<(), LogError> {
        if let Some(error) = self.commits.failed.lock().clone() {
            return Err(broken(error));
        }
        match self.floor {
            Some(floor) if next.0 > floor => {}
            _ => return Ok(()),
        }
        self.commits.want.fetch_max(next.0, Ordering::AcqRel);
        // A full queue means a wake-up is already pending.
        let _ = self.wake.try_send(());
        Ok(())
    }
}

/// What the committer task of one consumer was asked and has done.
struct CommitState {
    /// The highest position asked for.
    want: AtomicU64,
    /// The highest position stored.
    done: tokio::sync::watch::Sender<u64>,
    /// Why the task gave up, if it did.
    failed: parking_lot::Mutex<Option<String>>,
}

/// Marks the commits left undone when the committer task ends.
struct Unfinished(Arc<CommitState>);

impl Drop for Unfinished {
    fn drop(&mut self) {
        let state = &self.0;
        if state.want.load(Ordering::Acquire) > *state.done.borrow()
            && state.failed.lock().is_none()
        {
            state.fail("the commit task ended before storing every commit".into());
        }
    }
}

impl CommitState {
    /// Records why commits stop, and wakes whoever waits for them.
    fn fail(&self, why: String) {
        *self.failed.lock() = Some(why);
        self.done.send_modify(|_| {});
    }

    /// Waits until every position asked for is stored, or the task gave up.
    async fn settled(&self) {
        let mut done = self.done.subscribe();
        let _ = done
            .wait_for(|d| *d >= self.want.load(Ordering::Acquire) || self.failed.lock().is_some())
            .await;
    }
}

/// Makes the commits of one consumer, newest first, until it is dropped
/// and nothing is left to do.
async fn run_committer(
    mut committer: Committer,
    state: Arc<CommitState>,
    mut wake: mpsc::Receiver<()>,
) {
    // However the task ends (a panic included), what was asked and not
    // stored becomes a failure: the next commit says so, and a new
    // consumer of the group does not wait for it.
    let _unfinished = Unfinished(state.clone());
    loop {
        let want = state.want.load(Ordering::Acquire);
        if want > *state.done.borrow() {
            match committer.commit(Offset(want)).await {
                Ok(()) => {
                    state.done.send_replace(want);
                }
                Err(e) => {
                    let text = format!("{:#}", anyhow::Error::from(e));
                    tracing::error!(error = %text, "a Fluvio offset commit failed for good");
                    state.fail(text);
                    return;
                }
            }
            continue;
        }
        if wake.recv().await.is_none() && state.want.load(Ordering::Acquire) <= *state.done.borrow()
        {
            return;
        }
    }
}

/// Moves a consumer offset to exact positions (see the module's notes).
struct Committer {
    inner: Arc<Inner>,
    client: Arc<Fluvio>,
    topic: String,
    partition: u32,
    group: String,
}

impl Committer {
    /// How long one try of a commit may take.
    const TRY_TIMEOUT: Duration = Duration::from_secs(5);
    /// Stores `next`, trying again on a new connection after failures, for
    /// as long as the cluster may be away (`[log] give_up_after`).
    async fn commit(&mut self, next: Offset) -> Result<(), LogError> {
        let give_up = self.inner.settings.give_up_after;
        let deadline = Instant::now() + give_up;
        let mut pause = Duration::from_millis(100);
        loop {
            let tried = tokio::time::timeout(Self::TRY_TIMEOUT, self.try_commit(next)).await;
            let error = match tried {
                Ok(Ok(())) => {
                    self.inner.health.op(Ok(()));
                    return Ok(());
                }
                Ok(Err(e)) => format!("{:#}", anyhow::Error::from(e)),
                Err(_) => format!("no answer within {:?}", Self::TRY_TIMEOUT),
            };
            self.inner.health.op(Err(&error));
            if Instant::now() + pause > deadline {
                return Err(broken(format!(
                    "could not commit offset {next} of {}/{} for group {:?} within {give_up:?} \
                     ([log] give_up_after): {error}",
                    self.topic, self.partition, self.group,
                )));
            }
            tracing::warn!(topic = %self.topic, partition = self.partition, group = %self.group, %error, retry_in = ?pause, "a Fluvio offset commit failed; retrying on a new connection");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
            // A broker restart leaves the client's pooled sockets dead.
            if let Ok(client) = self.inner.reconnect(&self.client).await {
                self.client = client;
            }
        }
    }

    async fn try_commit(&self, next: Offset) -> Result<(), LogError> {
        let last = i64::try_from(next.0 - 1).map_err(backend)?;
        let config = ConsumerConfigExt::builder()
            .topic(self.topic.clone())
            .partition(self.partition)
            .offset_consumer(self.group.clone())
            .offset_start(FluvioOffset::absolute(last).map_err(backend)?)
            .offset_strategy(OffsetManagementStrategy::Manual)
            .retry_mode(RetryMode::Disabled)
            .build()
            .map_err(backend)?;
        let mut stream = self
            .client
            .consumer_with_config(config)
            .await
            .map_err(backend)?;
        let record = stream
            .next()
            .await
            .ok_or_else(|| broken(format!("offset {last} of {} is gone", self.topic)))?
            .map_err(backend)?;
        if record.offset != last {
            return Err(broken(format!(
                "committing {next} on {}/{}: the stream started at {} instead of {last}",
                self.topic, self.partition, record.offset
            )));
        }
        stream.offset_commit().await.map_err(backend)?;
        stream.offset_flush().await.map_err(backend)?;
        Ok(())
    }
}

/// The records of one partition as the client's stream yields them.
type Records =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<ConsumerRecord, String>> + Send>>;

/// One partition as one consumer group reads it.
struct Place {
    topic: String,
    partition: u32,
    group: String,
}

impl std::fmt::Display for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} partition {} (group {:?})",
            self.topic, self.partition, self.group
        )
    }
}

/// The group's stored position on the partition (the last record it is
/// done with) among `offsets`, `None` when it has none.
fn stored_offset(
    offsets: &[ConsumerOffset],
    topic: &str,
    partition: u32,
    group: &str,
) -> Option<i64> {
    offsets
        .iter()
        .find(|o| o.consumer_id == group && o.topic == topic && o.partition == partition)
        .map(|o| o.offset)
}

/// Runs `op` on `client`, and again on a new connection after each
/// failure, pausing longer each time, until it succeeds or `deadline`
/// passes (`None`: until it succeeds; the log's health watch stops the
/// process if the cluster stays away). `what` says what it does, for the
/// log and the error.
async fn on_new_connections<T, Fut>(
    inner: &Inner,
    mut client: Arc<Fluvio>,
    what: &str,
    deadline: Option<Instant>,
    mut op: impl FnMut(Arc<Fluvio>) -> Fut,
) -> Result<(Arc<Fluvio>, T), LogError>
where
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut pause = Duration::from_millis(100);
    loop {
        let error = match op(client.clone()).await {
            Ok(done) => return Ok((client, done)),
            Err(error) => error,
        };
        inner.health.op(Err(&error));
        if deadline.is_some_and(|d| Instant::now() + pause > d) {
            return Err(broken(format!(
                "could not {what} on the Fluvio cluster at {} within [log] give_up_after = {:?}: {error}",
                inner.settings.endpoint, inner.settings.give_up_after
            )));
        }
        tracing::warn!(%error, retry_in = ?pause, "could not {what} on the Fluvio cluster; retrying on a new connection");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
        if let Ok(fresh) = inner.reconnect(&client).await {
            client = fresh;
        }
    }
}

/// The group's stored position on the partition (see [`stored_offset`]),
/// asked again on new connections until `deadline`.
async fn stored_position(
    inner: &Inner,
    place: &Place,
    deadline: Instant,
) -> Result<Option<i64>, LogError> {
    let what = format!("read the stored position of {place}");
    let (_, offsets) = on_new_connections(
        inner,
        inner.client(),
        &what,
        Some(deadline),
        |c| async move { within(c.consumer_offsets()).await },
    )
    .await?;
    Ok(stored_offset(
        &offsets,
        &place.topic,
        place.partition,
        &place.group,
    ))
}

/// Opens a stream of `config` on `client`, and again on a new connection
/// after each failure (see [`on_new_connections`]).
async fn open_stream(
    inner: &Inner,
    config: &ConsumerConfigExt,
    client: Arc<Fluvio>,
    what: &str,
    deadline: Option<Instant>,
) -> Result<(Arc<Fluvio>, Records), LogError> {
    on_new_connections(
        inner,
        client,
        &format!("open {what}"),
        deadline,
        |c| async move {
            let stream = within(c.consumer_with_config(config.clone())).await?;
            let records: Records = Box::pin(stream.map(|r| r.map_err(|e| e.to_string())));
            Ok(records)
        },
    )
    .await
}

/// The most bytes one fetch of a partition's stream returns. The client's
/// default (about 1 MB) cuts a busy partition's fetches inside a batch,
/// and this client then passes over the rest of that batch (see [`read`]):
/// with 32 MiB the deliveries topic at 8,000 jobs/s was read without one
/// such jump, where 1 MB gave 75 in 30 s. Memory is taken only as records
/// wait.
const FETCH_MAX_BYTES: i32 = 32 << 20;

/// Reads the partition into `out` until the consumer is dropped. The
/// client's stream reconnects by itself; should it fail or end anyway, a
/// new stream opens on a new connection at the next offset not read, so a
/// broker crash costs a pause, never the consumer. A record that cannot
/// be decoded is handed on as an error (definite: reading again would not
/// change it).
///
/// Offsets of a partition follow one another; a record past the one
/// expected (the group's next, then the one after the last read) means
/// the records between are gone (retention removed them): the reader hands
/// on [`LogError::Gap`] and stops, never skipping them. The client itself
/// may pass over the rest of a batch that a fetch response cut off (seen
/// under load with large records; Fluvio fixed it in a later client), so a
/// jump is first read again from the expected offset on a new stream; only
/// a jump that repeats there is a gap.
async fn read<M: Message>(
    inner: Arc<Inner>,
    config: ConsumerConfigExt,
    (mut client, mut stream): (Arc<Fluvio>, Records),
    out: mpsc::Sender<Result<Record<M>, LogError>>,
    (place, mut next): (Place, Option<i64>),
) {
    let what = place.to_string();
    // The offset a jump was last read again from.
    let mut reread: Option<i64> = None;
    loop {
        let error = match stream.next().await {
            Some(Ok(r)) => {
                inner.health.op(Ok(()));
                if let Some(want) = next
                    && r.offset > want
                    && reread != Some(want)
                {
                    tracing::warn!(partition = %what, expected = want, found = r.offset, "the Fluvio stream passed over records; reading them again from the expected offset");
                    reread = Some(want);
                    let on = client.clone();
                    if !reopen(
                        &inner,
                        &config,
                        (&mut client, &mut stream),
                        on,
                        &what,
                        Some(want),
                        &out,
                    )
                    .await
                    {
                        return;
                    }
                    continue;
                }
                if let Some(want) = next
                    && r.offset > want
                {
                    let gap = LogError::Gap {
                        topic: place.topic,
                        partition: place.partition,
                        group: place.group,
                        expected: u64::try_from(want).unwrap_or(0),
                        found: u64::try_from(r.offset).unwrap_or(0),
                    };
                    tracing::error!(partition = %what, error = %gap, "records of a Fluvio partition are gone before they were read");
                    let _ = out.send(Err(gap)).await;
                    return;
                }
                next = Some(r.offset + 1);
                reread = None;
                let record = u64::try_from(r.offset).map_err(backend).and_then(|offset| {
                    Ok(Record {
                        offset: Offset(offset),
                        message: M::decode(r.value())?,
                    })
                });
                if out.send(record).await.is_err() {
                    // The consumer is gone: nobody reads any more.
                    return;
                }
                continue;
            }
            Some(Err(e)) => e,
            None => "the stream ended".to_owned(),
        };
        inner.health.op(Err(&error));
        tracing::warn!(partition = %what, %error, "a Fluvio partition's stream failed; reopening it");
        // Where this stream stopped, or the group's stored position when
        // nothing was read yet, on a new connection.
        let fresh = match inner.reconnect(&client).await {
            Ok(fresh) => fresh,
            Err(_) => client.clone(),
        };
        if !reopen(
            &inner,
            &config,
            (&mut client, &mut stream),
            fresh,
            &what,
            next,
            &out,
        )
        .await
        {
            return;
        }
    }
}

/// Replaces the stream (and its client) with one opened on `on` that starts
/// at `at` (the group's stored position when `None`); `false` after
/// handing a failure on to `out`, which the reader then ends on (its
/// consumer reads the error; a consumer already gone needs nothing).
async fn reopen<M: Message>(
    inner: &Arc<Inner>,
    config: &ConsumerConfigExt,
    (client, stream): (&mut Arc<Fluvio>, &mut Records),
    on: Arc<Fluvio>,
    what: &str,
    at: Option<i64>,
    out: &mpsc::Sender<Result<Record<M>, LogError>>,
) -> bool {
    let mut config = config.clone();
    let opened = match at.map(FluvioOffset::absolute).transpose() {
        Ok(at) => {
            if let Some(at) = at {
                config.offset_start = at;
            }
            open_stream(inner, &config, on, what, None).await
        }
        Err(e) => Err(backend(e)),
    };
    match opened {
        Ok(opened) => {
            (*client, *stream) = opened;
            true
        }
        Err(e) => {
            let _ = out.send(Err(e)).await;
            false
        }
    }
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
