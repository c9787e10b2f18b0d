//! Deliveries routed by endpoint through the log (`[log] dispatch =
//! "by-endpoint"`, on Fluvio).
//!
//! ```text
//!  events ─▶ fan-out members ──plans (held by the topic)──▶ Postgres
//!                  └──jobs, partition = route(endpoint, delivery)──▶ log:deliveries
//!                                                                        │ one reader per partition
//!                                   dispatch members (walhook dispatch) ◀┘ each partition: one dispatcher
//! ```
//!
//! Every delivery of an endpoint goes to one partition of the deliveries
//! topic (a hot endpoint configured with K shards to K neighbouring
//! partitions, the shard chosen by the delivery id, which is a hash of the
//! event). Each partition is read by exactly one member of the dispatch
//! group at a time (the membership of [`crate::membership`]), and each
//! partition it holds has a dispatcher of its own: so an endpoint's
//! in-flight cap, rate limit and circuit are decided in one place, whatever
//! the number of members.
//!
//! Who holds what:
//! - fan-out stores one plan per event as in every mode, held by the topic
//!   ([`TOPIC_HELD`], a name no dispatcher node has: no sweep claims it),
//!   and commits its events offset only once the jobs are stored in the
//!   deliveries topic;
//! - the dispatcher of partition p runs as node `<member node>-p<p>.<token>`
//!   (the token of the member's holding of p): its retries are rows leased
//!   to that node, and its sweeps claim only deliveries of partition p
//!   ([`Scope`]): due ones nobody holds, and those of any other node (an
//!   earlier holder of p);
//! - a member that takes a partition first takes the planned deliveries of
//!   p that have no row yet (an earlier holder may have read their jobs and
//!   died before the first attempt was recorded), then reads the topic
//!   from the committed offset, leaving out the jobs of deliveries that got
//!   their row meanwhile.
//!
//! `docs/scale-out.md` gives the failure model.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::delivery::DeliveryJob;
use crate::dispatch::egress::Egress;
use crate::dispatch::observe::AttemptObserver;
use crate::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use crate::endpoint::SubscriptionCache;
use crate::ids::{DeliveryId, EndpointId, Offset};
use crate::log::{Consumer, Log, LogError, partition_for};
use crate::membership::{BoxError, Fence, FencedConsumer, StartReader};
use crate::store::DispatchStore;
use crate::time::Timestamp;

/// The consumer group (and membership group) of dispatch on the
/// deliveries topic.
pub const DISPATCH_GROUP: &str = "dispatch";

/// The holder of plans whose jobs are in the deliveries topic: not a
/// dispatcher node, so no sweep takes them; the topic carries them to the
/// dispatcher of their partition.
pub const TOPIC_HELD: &str = "log:deliveries";

/// Shards an endpoint may be split into at most.
pub const MAX_SHARDS: u32 = 64;

/// Jobs made by fan-out before a partition's dispatcher started, plus
/// this margin (clocks of two machines), are checked against the rows
/// before they are sent: an earlier holder may have sent and recorded them.
const CHECK_MARGIN: Duration = Duration::from_secs(10);

/// The four bytes of an id that decide its partition (random in endpoint
/// ids, and part of the hash half of delivery ids).
fn tail(id: &[u8; 16]) -> u64 {
    u64::from(u32::from_be_bytes([id[12], id[13], id[14], id[15]]))
}

/// The partition of `delivery` to `endpoint` among `partitions`, the
/// endpoint split into `shards`. The platform database computes the same
/// (`walhook.delivery_partition`, migration 0026): its sweeps pick a
/// partition's deliveries with it.
pub fn partition_of(
    endpoint: EndpointId,
    delivery: DeliveryId,
    partitions: u32,
    shards: u32,
) -> u32 {
    let partitions = u64::from(partitions.max(1));
    let base = tail(&endpoint.0) % partitions;
    let shard = tail(&delivery.0) % u64::from(shards.max(1));
    ((base + shard) % partitions) as u32
}

/// What the node ids of a partition's dispatchers have between the
/// member's node id and the holding's token: `<member>-p<partition>.<token>`.
pub fn node_suffix(partition: u32) -> String {
    format!("-p{partition}.")
}

/// Where each delivery goes in the deliveries topic.
#[derive(Debug, Clone)]
pub struct Routes {
    partitions: u32,
    shards: BTreeMap<EndpointId, u32>,
    /// A key that the log's partitioner maps to each partition.
    keys: Vec<Vec<u8>>,
}

impl Routes {
    /// Routes over `partitions` partitions; `shards` splits the endpoints
    /// named into that many partitions each (1 to [`MAX_SHARDS`], at most
    /// `partitions`).
    pub fn new(partitions: u32, shards: BTreeMap<EndpointId, u32>) -> Result<Routes, String> {
        if partitions == 0 {
            return Err("the deliveries topic needs at least one partition".into());
        }
        for (endpoint, &k) in &shards {
            if k == 0 || k > MAX_SHARDS.min(partitions) {
                return Err(format!(
                    "endpoint {endpoint}: {k} shards; give 1 to {} (at most the deliveries topic's {partitions} partitions)",
                    MAX_SHARDS.min(partitions)
                ));
            }
        }
        let mut keys = vec![Vec::new(); partitions as usize];
        let mut missing = partitions;
        let mut n: u32 = 0;
        while missing > 0 {
            let key = n.to_be_bytes().to_vec();
            let p = partition_for(&key, partitions) as usize;
            if keys[p].is_empty() {
                keys[p] = key;
                missing -= 1;
            }
            n += 1;
        }
        Ok(Routes {
            partitions,
            shards,
            keys,
        })
    }

    /// The number of partitions.
    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    /// The shards of `endpoint` (1 unless configured).
    pub fn shards(&self, endpoint: EndpointId) -> u32 {
        self.shards.get(&endpoint).copied().unwrap_or(1)
    }

    /// The partition of `delivery` to `endpoint`.
    pub fn partition(&self, endpoint: EndpointId, delivery: DeliveryId) -> u32 {
        partition_of(endpoint, delivery, self.partitions, self.shards(endpoint))
    }

    /// The record key that lands in `partition`.
    pub fn key(&self, partition: u32) -> Vec<u8> {
        self.keys[partition as usize].clone()
    }

    /// The record key of `delivery` to `endpoint`.
    pub fn key_of(&self, endpoint: EndpointId, delivery: DeliveryId) -> Vec<u8> {
        self.key(self.partition(endpoint, delivery))
    }

    /// What the dispatcher of `partition` may claim.
    pub fn scope(&self, partition: u32) -> Scope {
        Scope {
            partition,
            partitions: self.partitions,
            shards: self.shards.iter().map(|(e, k)| (*e, *k)).collect(),
        }
    }
}

/// The deliveries a dispatcher of one partition may claim: those whose
/// [`partition_of`] is `partition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The partition.
    pub partition: u32,
    /// The topic's partitions.
    pub partitions: u32,
    /// Endpoints split into more than one shard, and their shards.
    pub shards: Vec<(EndpointId, u32)>,
}

/// What the dispatcher of each held partition is made of.
pub struct PartitionDispatch<L, E, S> {
    /// The log with the deliveries topic.
    pub log: L,
    /// The deliveries topic.
    pub topic: String,
    /// Where requests go out.
    pub egress: Arc<E>,
    /// The platform store.
    pub store: Arc<S>,
    /// The endpoint directory.
    pub directory: Arc<SubscriptionCache>,
    /// The dispatchers' settings; each gets its own node id and scope.
    pub settings: DispatchSettings,
    /// The routes (the same as fan-out's).
    pub routes: Arc<Routes>,
    /// Shared by the partitions' dispatchers (metrics).
    pub counters: Arc<DispatchCounters>,
    /// Told about every attempt (metrics), when given.
    pub observer: Option<Arc<dyn AttemptObserver>>,
}

impl<L, E, S> PartitionDispatch<L, E, S>
where
    L: Log,
    E: Egress,
    S: DispatchStore,
{
    /// The reader of each partition a dispatch member holds: a dispatcher
    /// of its own, fed from the partition.
    pub fn into_reader(self) -> StartReader {
        let this = Arc::new(self);
        Box::new(move |partition, fence, stop| {
            let this = this.clone();
            Box::pin(async move { this.run(partition, fence, stop).await })
        })
    }

    async fn run(
        &self,
        partition: u32,
        fence: Fence,
        stop: CancellationToken,
    ) -> Result<(), BoxError> {
        let scope = self.routes.scope(partition);
        let mut settings = self.settings.clone();
        settings.node_id = format!(
            "{}{}{}",
            settings.node_id,
            node_suffix(partition),
            fence.token()
        );
        settings.scope = Some(scope.clone());
        let node = settings.node_id.clone();
        let mut consumer = self.open(partition, fence.clone()).await?;
        let started = Timestamp::now();
        let mut dispatcher = Dispatcher::new(
            self.egress.clone(),
            self.store.clone(),
            self.directory.clone(),
            settings,
            self.counters.clone(),
        );
        if let Some(observer) = self.observer.clone() {
            dispatcher = dispatcher.with_observer(observer);
        }
        let (jobs, jobs_rx) = mpsc::channel::<DeliveryJob>(4096);
        let dispatch_stop = CancellationToken::new();
        let dispatch_ended = CancellationToken::new();
        let dispatching = {
            let (stop, ended) = (dispatch_stop.clone(), dispatch_ended.clone());
            async move {
                let r = dispatcher.run(jobs_rx, stop).await;
                ended.cancel();
                r
            }
        };
        let taking = Mutex::new(Taking::Waiting(HashSet::new()));
        let reading_stop = stop.child_token();
        let forwarding = async {
            let r = self
                .forward(
                    &scope,
                    &node,
                    started,
                    (&mut consumer, &fence),
                    &jobs,
                    &taking,
                    &reading_stop,
                    &dispatch_ended,
                )
                .await;
            reading_stop.cancel();
            r
        };
        let take = async {
            let r = self
                .take(&scope, &node, &jobs, &taking, &reading_stop)
                .await;
            if r.is_err() {
                reading_stop.cancel();
            }
            r
        };
        let reading = async {
            let (forwarded, taken) = tokio::join!(forwarding, take);
            // Dispatch drains what it was given (what it does not finish
            // stays in Postgres for the next holder).
            dispatch_stop.cancel();
            forwarded.and(taken)
        };
        let (read, dispatched) = tokio::join!(reading, dispatching);
        tracing::info!(node = %node, partition, "the dispatcher of a deliveries partition stopped");
        dispatched?;
        read
    }

    /// Opens `partition` of the deliveries topic, committing through
    /// `fence`.
    async fn open(
        &self,
        partition: u32,
        fence: Fence,
    ) -> Result<FencedConsumer<L::Consumer<DeliveryJob>>, LogError> {
        let consumer = self
            .log
            .consumer::<DeliveryJob>(&self.topic, partition, DISPATCH_GROUP)
            .await?;
        Ok(FencedConsumer::new(consumer, fence))
    }

    /// Takes the planned deliveries of `scope` that have no row, once no
    /// earlier dispatcher of the partition may still send them (it stopped,
    /// or its `[dispatch] lease` lapsed), and hands them to dispatch,
    /// leaving out those the topic gave meanwhile. Ends when done or at
    /// `stop`.
    async fn take(
        &self,
        scope: &Scope,
        node: &str,
        jobs: &mpsc::Sender<DeliveryJob>,
        taking: &Mutex<Taking>,
        stop: &CancellationToken,
    ) -> Result<(), BoxError> {
        loop {
            let Some(found) = retry(stop, "take the partition's planned deliveries", || {
                self.store.take_partition(node, scope)
            })
            .await?
            else {
                return Ok(());
            };
            let Some(found) = found else {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(TAKE_AGAIN) => continue,
                }
            };
            let fresh: Vec<DeliveryJob> = {
                let mut taking = taking.lock();
                let Taking::Waiting(forwarded) = &*taking else {
                    return Ok(());
                };
                let fresh: Vec<DeliveryJob> = found
                    .into_iter()
                    .filter(|j| !forwarded.contains(&j.delivery_id))
                    .collect();
                *taking = Taking::Taken(fresh.iter().map(|j| j.delivery_id).collect());
                fresh
            };
            if !fresh.is_empty() {
                tracing::info!(
                    node,
                    partition = scope.partition,
                    count = fresh.len(),
                    "took over planned deliveries of this partition that had no row yet"
                );
            }
            for job in fresh {
                if jobs.send(job).await.is_err() {
                    return Ok(());
                }
            }
            return Ok(());
        }
    }

    /// Hands the topic's jobs to dispatch until `stop`, committing each
    /// batch once handed over (the plans and rows in Postgres hold the
    /// truth), leaving out the jobs of deliveries the take gave and those
    /// whose delivery got its row meanwhile.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        scope: &Scope,
        node: &str,
        started: Timestamp,
        (consumer, fence): (&mut FencedConsumer<L::Consumer<DeliveryJob>>, &Fence),
        jobs: &mpsc::Sender<DeliveryJob>,
        taking: &Mutex<Taking>,
        stop: &CancellationToken,
        dispatch_ended: &CancellationToken,
    ) -> Result<(), BoxError> {
        let check_before = started.plus(CHECK_MARGIN);
        loop {
            let records = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                _ = dispatch_ended.cancelled() => return Ok(()),
                r = consumer.poll(256) => match r {
                    Ok(r) => r,
                    Err(LogError::Closed) => return Ok(()),
                    Err(LogError::Gap { expected, found, .. }) => {
                        // Retention removed jobs this group had not read:
                        // their plans are in Postgres, taken from there;
                        // the topic is read on from what it still has.
                        tracing::warn!(
                            node,
                            partition = scope.partition,
                            expected,
                            found,
                            "the deliveries topic no longer has jobs this partition's dispatcher had not read \
                             (retention); taking their planned deliveries from the platform database instead"
                        );
                        {
                            let mut taking = taking.lock();
                            if let Taking::Taken(_) = &*taking {
                                *taking = Taking::Waiting(HashSet::new());
                            }
                        }
                        self.take(scope, node, jobs, taking, stop).await?;
                        consumer.commit(Offset(found)).await?;
                        *consumer = self.open(scope.partition, fence.clone()).await?;
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let Some(last) = records.last().map(|r| r.offset) else {
                continue;
            };
            let mut batch: Vec<DeliveryJob> = {
                let mut taking = taking.lock();
                records
                    .into_iter()
                    .map(|r| r.message)
                    .filter(|j| match &mut *taking {
                        Taking::Waiting(forwarded) => {
                            forwarded.insert(j.delivery_id);
                            true
                        }
                        Taking::Taken(taken) => !taken.remove(&j.delivery_id),
                    })
                    .collect()
            };
            // Jobs an earlier holder may have finished: those whose
            // deliveries have rows are left out.
            let older: Vec<DeliveryId> = batch
                .iter()
                .filter(|j| j.created_at < check_before)
                .map(|j| j.delivery_id)
                .collect();
            if !older.is_empty() {
                let Some(open) = retry(stop, "check jobs against the rows", || {
                    self.store.without_rows(&older)
                })
                .await?
                else {
                    return Ok(());
                };
                let open: HashSet<DeliveryId> = open.into_iter().collect();
                batch.retain(|j| j.created_at >= check_before || open.contains(&j.delivery_id));
            }
            for job in batch {
                if jobs.send(job).await.is_err() {
                    return Ok(());
                }
            }
            consumer.commit(Offset(last.0 + 1)).await?;
        }
    }
}

/// Where the take of a partition's planned deliveries stands.
enum Taking {
    /// Not yet: the jobs the topic gave meanwhile (left out of the take).
    Waiting(HashSet<DeliveryId>),
    /// Done: the deliveries it gave (their jobs in the topic are left out).
    Taken(HashSet<DeliveryId>),
}

/// How often a take waiting for an earlier dispatcher is tried again.
const TAKE_AGAIN: Duration = Duration::from_secs(2);

/// Runs `op` until it succeeds, fails for good, or `stop` (`None`).
async fn retry<T, F, Fut>(
    stop: &CancellationToken,
    what: &str,
    mut op: F,
) -> Result<Option<T>, BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let mut pause = Duration::from_millis(100);
    loop {
        match op().await {
            Ok(v) => return Ok(Some(v)),
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e.chain(), retry_in = ?pause, "dispatch could not {what}; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(pause) => {}
                }
                pause = (pause * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(Box::new(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(n: u8) -> EndpointId {
        let mut b = [7u8; 16];
        b[15] = n;
        EndpointId(b)
    }

    #[test]
    fn every_partition_has_a_key_that_lands_in_it() {
        for partitions in [1, 2, 3, 4, 8, 16, 64] {
            let routes = Routes::new(partitions, BTreeMap::new()).unwrap();
            for p in 0..partitions {
                assert_eq!(partition_for(&routes.key(p), partitions), p);
            }
        }
    }

    #[test]
    fn an_endpoint_keeps_one_partition_unless_sharded() {
        let e = endpoint(3);
        let routes = Routes::new(8, BTreeMap::new()).unwrap();
        let seen: std::collections::BTreeSet<u32> = (0..200u32)
            .map(|i| {
                let d = DeliveryId(rand_bytes(i));
                routes.partition(e, d)
            })
            .collect();
        assert_eq!(seen.len(), 1);
        let routes = Routes::new(8, BTreeMap::from([(e, 3)])).unwrap();
        let seen: std::collections::BTreeSet<u32> = (0..200u32)
            .map(|i| routes.partition(e, DeliveryId(rand_bytes(i))))
            .collect();
        assert_eq!(seen.len(), 3, "{seen:?}");
        let base = Routes::new(8, BTreeMap::new())
            .unwrap()
            .partition(e, DeliveryId(rand_bytes(0)));
        // The endpoint's own partition and its neighbours, wrapping.
        let want: std::collections::BTreeSet<u32> = (0..3).map(|k| (base + k) % 8).collect();
        assert_eq!(seen, want);
        // What a partition's dispatcher claims by (the database computes
        // the partition from it, sql/tests/plans.rs).
        let scope = routes.scope(5);
        assert_eq!((scope.partition, scope.partitions), (5, 8));
        assert_eq!(scope.shards, vec![(e, 3)]);
    }

    #[test]
    fn bad_shard_counts_are_refused_with_the_range() {
        let e = endpoint(1);
        for k in [0, 5, 65] {
            let err = Routes::new(4, BTreeMap::from([(e, k)])).unwrap_err();
            assert!(err.contains("give 1 to 4"), "{err}");
            assert!(err.contains(&e.to_string()), "{err}");
        }
        assert!(Routes::new(0, BTreeMap::new()).is_err());
    }

    fn rand_bytes(i: u32) -> [u8; 16] {
        let mut b = [0u8; 16];
        let h = i.wrapping_mul(2_654_435_761).to_be_bytes();
        b[12..16].copy_from_slice(&h);
        b[0..4].copy_from_slice(&i.to_be_bytes());
        b
    }
}
