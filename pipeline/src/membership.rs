//! Members of a stage on a shared log, and who reads which partition.
//!
//! ```text
//!  join ─▶ slot k, epoch e ─▶ every lease/4: renew ─▶ live slots ─▶ this member's share
//!                                                  └▶ held partitions (each with its token)
//!            share − held: claim (free ones only) ─▶ start a reader with the new token
//!            held − share: stop the reader ─▶ release
//!            a reader's commit ─▶ fence (token still current, lease live?) ─▶ the log
//! ```
//!
//! `walhook fanout` without `--member` joins its group here instead of
//! being told its share. The platform database is the referee:
//! - A member holds a *slot* (the lowest one whose lease lapsed, taken at
//!   join; taking it bumps the slot's epoch) and renews its lease four
//!   times per lease. A process whose slot was taken over (it was frozen or
//!   cut off for longer than its lease, and a new process joined in its
//!   place) is out: [`MembershipError::Out`] stops it.
//! - The share of a member is a pure function of the live slots
//!   ([`share`]): every member computes the same split.
//! - A partition is claimed only when its holder is no live member, and
//!   every claim gives it a new *token* (the count of its changes of hands).
//!   So two members never hold one partition, and a member gives up what is
//!   no longer its share before another may take it.
//! - A reader commits its position only through the [`Fence`]: the store
//!   records the commit only if the reader's token is still the
//!   partition's and its member's lease is live, in one statement. A
//!   member that lost a partition (frozen past its lease, resumed) cannot
//!   move its group's position; its reads are repeated by the holder,
//!   which the stages downstream de-duplicate (ids are derived).
//!
//! What the fence cannot cover: the log's own commit follows the store's
//! check by one round trip, so a commit sent just before the lease lapsed
//! may land just after. It only ever records work that was done.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

pub use futures::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ids::Offset;
use crate::log::{Consumer, LogError, Message, Record};
use crate::store::StoreError;

/// An error of a partition's reader, whatever its stage.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A member of a group: the slot it holds and the epoch it took it at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    /// The slot: 0 for the first member, and so on.
    pub slot: u32,
    /// Bumped every time the slot is taken.
    pub epoch: i64,
}

/// The partitions a member holds, each with its token.
pub type Held = BTreeMap<u32, i64>;

/// Where members and holdings are kept (the platform database).
///
/// Every method takes the group's key (topic and consumer group); the
/// futures are boxed so that runtimes hold the store as a trait object.
pub trait MembershipStore: Send + Sync + 'static {
    /// Joins: takes the lowest slot held by no live member (a new one when
    /// every slot is live), with a lease of `lease`, as `holder` (for
    /// operators: host and process). Makes sure partitions
    /// `0..partitions` exist.
    fn join<'a>(
        &'a self,
        group: &'a str,
        holder: &'a str,
        partitions: u32,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Member, StoreError>>;

    /// Renews the lease; the partitions the member holds, or `None` once
    /// its slot was taken by another process (the member is out).
    fn renew<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        lease: Duration,
    ) -> BoxFuture<'a, Result<Option<Held>, StoreError>>;

    /// The slots of the live members, in order.
    fn live<'a>(&'a self, group: &'a str) -> BoxFuture<'a, Result<Vec<u32>, StoreError>>;

    /// Takes `partition` if no live member holds it (and this member is
    /// live): its new token, or `None`.
    fn claim<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
    ) -> BoxFuture<'a, Result<Option<i64>, StoreError>>;

    /// Gives `partition` back, if this holding (its token) is still the
    /// member's.
    fn release<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
        token: i64,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records that the reader holding `partition` with `token` commits
    /// `next`, if the holding is still current and the member's lease
    /// live; `false` otherwise (the reader must not commit).
    fn fence_commit<'a>(
        &'a self,
        group: &'a str,
        member: Member,
        partition: u32,
        token: i64,
        next: Offset,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Leaves: gives back every partition and lets the lease lapse now.
    fn leave<'a>(&'a self, group: &'a str, member: Member)
    -> BoxFuture<'a, Result<(), StoreError>>;
}

/// The partitions of `partitions` that the member at `index` of `members`
/// live members reads: those whose number is `index` modulo `members`.
pub fn share(partitions: u32, index: usize, members: usize) -> BTreeSet<u32> {
    (0..partitions)
        .filter(|&p| p as usize % members.max(1) == index)
        .collect()
}

/// What a member of a group needs to know.
#[derive(Debug, Clone)]
pub struct MembershipSettings {
    /// The topic read.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// The topic's partitions.
    pub partitions: u32,
    /// The member's lease; renewed four times per lease.
    pub lease: Duration,
}

impl MembershipSettings {
    /// The group's key in the store: topic and consumer group.
    pub fn key(&self) -> String {
        format!("{}/{}", self.topic, self.group)
    }
}

/// Counters of one member, for metrics.
#[derive(Debug)]
pub struct MembershipCounters {
    /// The consumer group.
    pub group: String,
    /// The member's slot.
    pub slot: u32,
    /// Partitions held now.
    pub held: AtomicU64,
    /// Partitions taken or given up (or lost) since the start.
    pub changes: AtomicU64,
    /// Commits refused because the partition was no longer this member's.
    pub fenced: AtomicU64,
}

impl MembershipCounters {
    /// Zeroed counters of `member` in `group`.
    pub fn new(group: &str, member: Member) -> Self {
        MembershipCounters {
            group: group.to_owned(),
            slot: member.slot,
            held: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
        }
    }
}

/// The check a reader's commit passes first: its holding is still
/// current.
#[derive(Clone)]
pub struct Fence {
    store: Arc<dyn MembershipStore>,
    key: String,
    topic: String,
    group: String,
    member: Member,
    partition: u32,
    token: i64,
    lease: Duration,
    counters: Arc<MembershipCounters>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("key", &self.key)
            .field("member", &self.member)
            .field("partition", &self.partition)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl Fence {
    /// The token of the holding: a new one each time the partition is
    /// claimed.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Lets `next` be committed, or refuses with [`LogError::Fenced`].
    /// The store's transient failures are retried for up to a lease (the
    /// holding cannot outlive it anyway).
    pub async fn admit(&self, next: Offset) -> Result<(), LogError> {
        let give_up = tokio::time::Instant::now() + self.lease;
        let mut pause = Duration::from_millis(50);
        loop {
            match self
                .store
                .fence_commit(&self.key, self.member, self.partition, self.token, next)
                .await
            {
                Ok(true) => return Ok(()),
                Ok(false) => {
                    self.counters.fenced.fetch_add(1, Relaxed);
                    let e = LogError::Fenced {
                        topic: self.topic.clone(),
                        partition: self.partition,
                        group: self.group.clone(),
                        next: next.0,
                    };
                    tracing::warn!(slot = self.member.slot, "{e}");
                    return Err(e);
                }
                Err(e) if e.is_transient() && tokio::time::Instant::now() + pause < give_up => {
                    tracing::warn!(error = %e.chain(), partition = self.partition, "could not check this member's holding before a commit; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(LogError::Backend(Box::new(e))),
            }
        }
    }
}

/// A consumer whose commits pass a [`Fence`] first.
pub struct FencedConsumer<C> {
    inner: C,
    fence: Fence,
}

impl<C> FencedConsumer<C> {
    /// `inner`, committing through `fence`.
    pub fn new(inner: C, fence: Fence) -> Self {
        FencedConsumer { inner, fence }
    }
}

impl<M: Message, C: Consumer<M>> Consumer<M> for FencedConsumer<C> {
    fn partition(&self) -> u32 {
        self.inner.partition()
    }

    async fn poll(&mut self, max: usize) -> Result<Vec<Record<M>>, LogError> {
        self.inner.poll(max).await
    }

    async fn commit(&mut self, next: Offset) -> Result<(), LogError> {
        self.fence.admit(next).await?;
        self.inner.commit(next).await
    }
}

/// Why a member stopped.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    /// Its slot was taken by another process.
    #[error(
        "member slot {slot} of group {group:?} was taken by another process: this one did not renew its lease \
         for longer than {lease:?} (it was frozen, or cut off from the platform database) and has stopped \
         reading; a restart joins the group again"
    )]
    Out {
        /// The group's key.
        group: String,
        /// The slot.
        slot: u32,
        /// The lease.
        lease: Duration,
    },
    /// The store refused an operation for good.
    #[error("the membership of group {group:?} could not be kept in the platform database")]
    Store {
        /// The group's key.
        group: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// A partition's reader failed.
    #[error("the reader of partition {partition} failed")]
    Reader {
        /// The partition.
        partition: u32,
        /// Its error.
        #[source]
        source: BoxError,
    },
    /// A partition's reader returned while the member ran.
    #[error("the reader of partition {partition} ended while the member was running")]
    Ended {
        /// The partition.
        partition: u32,
    },
}

/// Starts the reader of one partition: `(partition, fence, stop)` to a
/// future that opens the partition and reads it until `stop` (after its
/// batch in hand), committing through the fence.
pub type StartReader = Box<
    dyn FnMut(u32, Fence, CancellationToken) -> BoxFuture<'static, Result<(), BoxError>> + Send,
>;

struct Reader {
    token: i64,
    stop: CancellationToken,
    /// Ends with the reader, with how it ended.
    task: JoinHandle<Result<(), BoxError>>,
    abort: tokio::task::AbortHandle,
}

/// That a reader ended: its partition and its token (how it ended is in
/// its task's handle).
type Ended = (u32, i64);

/// Holds the partitions that are this member's share until `stop`,
/// starting a reader on each (with `start`) and stopping the readers of
/// the partitions it gives up or lost; then gives everything back and
/// leaves. Ends with an error when the member is out or a reader failed
/// (other than by the fence).
pub async fn hold_partitions(
    store: Arc<dyn MembershipStore>,
    member: Member,
    settings: MembershipSettings,
    counters: Arc<MembershipCounters>,
    mut start: StartReader,
    stop: CancellationToken,
) -> Result<(), MembershipError> {
    let key = settings.key();
    let tick = settings.lease / 4;
    let mut readers: HashMap<u32, Reader> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<Ended>();
    let mut renewed = tokio::time::Instant::now();
    let store_error = |source: StoreError| MembershipError::Store {
        group: key.clone(),
        source,
    };
    let mut result = loop {
        let asked = tokio::time::Instant::now();
        let held = match tokio::time::timeout(tick, store.renew(&key, member, settings.lease)).await
        {
            Ok(Ok(Some(held))) => {
                renewed = asked;
                Some(held)
            }
            Ok(Ok(None)) => {
                break Err(MembershipError::Out {
                    group: key.clone(),
                    slot: member.slot,
                    lease: settings.lease,
                });
            }
            Ok(Err(e)) if !e.is_transient() => break Err(store_error(e)),
            Ok(Err(e)) => {
                tracing::warn!(error = %e.chain(), slot = member.slot, "could not renew this member's lease; retrying");
                None
            }
            Err(_) => {
                tracing::warn!(
                    slot = member.slot,
                    "renewing this member's lease took longer than {tick:?}; retrying"
                );
                None
            }
        };
        match held {
            Some(held) => {
                if let Err(e) = rebalance(
                    &store,
                    &key,
                    member,
                    &settings,
                    held,
                    &mut readers,
                    &mut start,
                    &ended_tx,
                    &counters,
                )
                .await
                {
                    if e.is_transient() {
                        tracing::warn!(error = %e.chain(), slot = member.slot, "could not rebalance this member's partitions; retrying");
                    } else {
                        break Err(store_error(e));
                    }
                }
            }
            None if renewed.elapsed() >= settings.lease && !readers.is_empty() => {
                // The lease may have lapsed: another member may hold these
                // partitions by now. Stop reading them; the fence refuses
                // the commits of a reader that had not noticed.
                tracing::warn!(
                    slot = member.slot,
                    partitions = ?readers.keys().collect::<Vec<_>>(),
                    "this member's lease could not be renewed within {:?}; it stops reading its partitions until it can",
                    settings.lease
                );
                for (p, r) in readers.drain() {
                    note_end(p, stop_reader(p, r, settings.lease).await);
                    counters.changes.fetch_add(1, Relaxed);
                }
            }
            None => {}
        }
        counters.held.store(readers.len() as u64, Relaxed);
        let wait = tokio::time::sleep(tick);
        tokio::pin!(wait);
        let ended = loop {
            tokio::select! {
                _ = stop.cancelled() => break None,
                _ = &mut wait => break Some(None),
                Some((p, token)) = ended_rx.recv() => {
                    // An end already dealt with (its reader was stopped).
                    if readers.get(&p).is_none_or(|r| r.token != token) {
                        continue;
                    }
                    let Some(r) = readers.remove(&p) else { continue };
                    counters.held.store(readers.len() as u64, Relaxed);
                    break Some(Some((p, joined(r.task).await)));
                }
            }
        };
        match ended {
            None => break Ok(()),
            Some(None) => {}
            Some(Some((p, Err(e)))) if fenced(&*e) => {
                // The holding moved on; the next renewal says to whom.
                tracing::warn!(partition = p, slot = member.slot, "a reader was fenced off");
                counters.changes.fetch_add(1, Relaxed);
            }
            Some(Some((partition, Err(source)))) => {
                break Err(MembershipError::Reader { partition, source });
            }
            Some(Some((partition, Ok(())))) => break Err(MembershipError::Ended { partition }),
        }
    };
    // Give everything back: readers first (each finishes its batch and
    // commits it), then the holdings and the lease, so that the other
    // members take over at their next renewal.
    let mut gave_back = Vec::new();
    for (p, r) in readers.drain() {
        let token = r.token;
        match stop_reader(p, r, settings.lease).await {
            Err(source) if !fenced(&*source) && result.is_ok() => {
                result = Err(MembershipError::Reader {
                    partition: p,
                    source,
                });
            }
            how => note_end(p, how),
        }
        gave_back.push((p, token));
    }
    if !matches!(result, Err(MembershipError::Out { .. })) {
        for (p, token) in gave_back {
            if let Err(e) = store.release(&key, member, p, token).await {
                tracing::warn!(error = %e.chain(), partition = p, "could not give a partition back; it goes to another member when this lease lapses");
            }
        }
        if let Err(e) = store.leave(&key, member).await {
            tracing::warn!(error = %e.chain(), slot = member.slot, "could not leave the group; its partitions move when the lease lapses");
        }
    }
    counters.held.store(0, Relaxed);
    result
}

/// One round: stop the readers of partitions lost, give back what is no
/// longer this member's share, claim the share's free partitions and
/// start readers on every partition held without one.
#[allow(clippy::too_many_arguments)]
#[allow(clippy::disallowed_methods)] // bare spawn: each partition's reader is awaited by the membership that started it
async fn rebalance(
    store: &Arc<dyn MembershipStore>,
    key: &str,
    member: Member,
    settings: &MembershipSettings,
    mut held: Held,
    readers: &mut HashMap<u32, Reader>,
    start: &mut StartReader,
    ended: &mpsc::UnboundedSender<Ended>,
    counters: &Arc<MembershipCounters>,
) -> Result<(), StoreError> {
    // Lost: read here, held by someone else (or by another holding of ours).
    let lost: Vec<u32> = readers
        .iter()
        .filter(|(p, r)| held.get(p) != Some(&r.token))
        .map(|(&p, _)| p)
        .collect();
    for p in lost {
        if let Some(r) = readers.remove(&p) {
            tracing::warn!(
                partition = p,
                slot = member.slot,
                "partition taken over by another member while this one could not renew its lease; stopped reading it"
            );
            note_end(p, stop_reader(p, r, settings.lease).await);
            counters.changes.fetch_add(1, Relaxed);
        }
    }
    let live = store.live(key).await?;
    let mine = match live.iter().position(|&s| s == member.slot) {
        Some(index) => share(settings.partitions, index, live.len()),
        None => BTreeSet::new(),
    };
    // Given back: held but no longer the share.
    let surplus: Vec<(u32, i64)> = held
        .iter()
        .filter(|(p, _)| !mine.contains(p))
        .map(|(&p, &t)| (p, t))
        .collect();
    for (p, token) in surplus {
        if let Some(r) = readers.remove(&p) {
            note_end(p, stop_reader(p, r, settings.lease).await);
        }
        store.release(key, member, p, token).await?;
        held.remove(&p);
        counters.changes.fetch_add(1, Relaxed);
        tracing::info!(
            partition = p,
            slot = member.slot,
            members = live.len(),
            "gave a partition back for the new share"
        );
    }
    // Taken: the share's partitions that are free.
    for &p in &mine {
        if held.contains_key(&p) {
            continue;
        }
        if let Some(token) = store.claim(key, member, p).await? {
            held.insert(p, token);
            counters.changes.fetch_add(1, Relaxed);
            tracing::info!(
                partition = p,
                slot = member.slot,
                members = live.len(),
                "took a partition"
            );
        }
    }
    // Read: every partition held without a reader.
    for (&p, &token) in &held {
        if readers.contains_key(&p) {
            continue;
        }
        let fence = Fence {
            store: store.clone(),
            key: key.to_owned(),
            topic: settings.topic.clone(),
            group: settings.group.clone(),
            member,
            partition: p,
            token,
            lease: settings.lease,
            counters: counters.clone(),
        };
        let stop = CancellationToken::new();
        let inner = tokio::spawn(start(p, fence, stop.clone()));
        let abort = inner.abort_handle();
        let ended = ended.clone();
        let task = tokio::spawn(async move {
            let how = joined(inner).await;
            // Only a wake-up: once the member stopped listening, the
            // outcome is still read from this task's handle.
            let _ = ended.send((p, token));
            how
        });
        readers.insert(
            p,
            Reader {
                token,
                stop,
                task,
                abort,
            },
        );
    }
    Ok(())
}

/// Stops a reader and says how it ended: it finishes its batch, or is
/// abandoned after `within` (its commit, if it comes, is refused by the
/// fence).
async fn stop_reader(partition: u32, mut r: Reader, within: Duration) -> Result<(), BoxError> {
    r.stop.cancel();
    match tokio::time::timeout(within, &mut r.task).await {
        Ok(joined) => joined.unwrap_or_else(|e| Err(format!("panicked: {e}").into())),
        Err(_) => {
            r.abort.abort();
            let _ = r.task.await;
            Err(format!(
                "the reader of partition {partition} did not stop within {within:?} and was abandoned"
            )
            .into())
        }
    }
}

/// How a reader's task ended (an abort is a stop).
async fn joined(task: JoinHandle<Result<(), BoxError>>) -> Result<(), BoxError> {
    match task.await {
        Ok(how) => how,
        Err(e) if e.is_cancelled() => Ok(()),
        Err(e) => Err(format!("panicked: {e}").into()),
    }
}

/// Logs how a reader stopped on purpose (given back, lost, or at a lapse)
/// ended, unless it ended well or by the fence: its offset was not
/// committed, and the next holder reads its records again.
fn note_end(partition: u32, how: Result<(), BoxError>) {
    if let Err(e) = how
        && !fenced(&*e)
    {
        tracing::error!(
            partition,
            error = %crate::supervise::error_chain(&*e),
            "a partition's reader failed while it was being stopped; the next holder reads its records again"
        );
    }
}

/// Whether `e` (or what caused it) is the fence's refusal.
pub fn fenced(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if matches!(e.downcast_ref::<LogError>(), Some(LogError::Fenced { .. })) {
            return true;
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_share_the_partitions_without_overlap() {
        for members in 1..=9 {
            let mut seen = BTreeSet::new();
            for index in 0..members {
                for p in share(8, index, members) {
                    assert!(seen.insert(p), "partition {p} in two shares of {members}");
                }
            }
            assert_eq!(seen, (0..8).collect(), "{members} members");
        }
        assert_eq!(share(8, 1, 3), BTreeSet::from([1, 4, 7]));
        assert_eq!(share(4, 0, 1), BTreeSet::from([0, 1, 2, 3]));
        assert!(share(4, 5, 6).is_empty());
    }

    #[test]
    fn the_fence_refusal_is_found_through_the_causes() {
        let refusal = LogError::Fenced {
            topic: "events".into(),
            partition: 2,
            group: "fanout".into(),
            next: 10,
        };
        let wrapped = crate::fanout::FanoutError::Log(refusal);
        assert!(fenced(&wrapped));
        let other = crate::fanout::FanoutError::Log(LogError::Closed);
        assert!(!fenced(&other));
        let text = std::error::Error::source(&wrapped).unwrap().to_string();
        assert!(
            text.contains("partition 2") && text.contains("\"fanout\""),
            "{text}"
        );
    }
}
