//! How the cluster answers: the health kept from operations and probes,
//! the probe of walhook's partitions, and each consumer group's lag and
//! the age of its oldest unread record.

use std::time::{Duration, Instant, SystemTime};

use fluvio::consumer::ConsumerConfigExt;
use fluvio::metadata::partition::{PartitionResolution, PartitionSpec};
use fluvio::{Fluvio, Isolation, Offset as FluvioOffset};
use futures::StreamExt;
use walhook_pipeline::log::LogError;

use super::committer::Committer;
use super::connection::within;
use super::consumer::stored_offset;
use super::{FluvioLog, broken};

/// Since when the cluster has failed to answer, if it has.
///
/// Two witnesses, each cleared by its own success: the operations
/// (a producer's send or receipt, a consumer's read, an offset commit)
/// and the probe (the SC lists walhook's partitions, each with a live
/// leader). A stage that does nothing while the cluster is down (an idle
/// fan-out member) still learns of it from the probe; a producer that
/// keeps failing while the SC answers still counts.
#[derive(Default)]
pub(super) struct Health {
    ops: parking_lot::Mutex<Option<Trouble>>,
    probe: parking_lot::Mutex<Option<Trouble>>,
}

/// The first failure of a run of failures, and the latest error.
#[derive(Debug, Clone)]
struct Trouble {
    since: Instant,
    last: String,
    /// When the latest failure happened.
    last_at: Instant,
}

/// A failed operation followed by none (a reader's error, then a quiet
/// partition) stops counting once the probe has passed for this long since
/// it; an operation that keeps failing (capture retries at least every
/// 10 s) keeps counting.
const STALE_AFTER: Duration = Duration::from_secs(30);

impl Health {
    fn note(slot: &parking_lot::Mutex<Option<Trouble>>, outcome: Result<(), &str>) {
        let mut slot = slot.lock();
        match outcome {
            Ok(()) => *slot = None,
            Err(error) => match &mut *slot {
                Some(t) => {
                    t.last = error.to_owned();
                    t.last_at = Instant::now();
                }
                None => {
                    *slot = Some(Trouble {
                        since: Instant::now(),
                        last: error.to_owned(),
                        last_at: Instant::now(),
                    })
                }
            },
        }
    }

    pub(super) fn op(&self, outcome: Result<(), &str>) {
        Self::note(&self.ops, outcome);
    }

    /// The probe passed: a run of failed operations that ended long ago
    /// (nothing failed since) is over.
    fn probe_passed(&self) {
        Self::note(&self.probe, Ok(()));
        let mut ops = self.ops.lock();
        if ops
            .as_ref()
            .is_some_and(|t| t.last_at.elapsed() > STALE_AFTER)
        {
            *ops = None;
        }
    }

    /// The older of the two runs of failures.
    fn failing(&self) -> Option<Trouble> {
        let ops = self.ops.lock().clone();
        let probe = self.probe.lock().clone();
        match (ops, probe) {
            (Some(a), Some(b)) => Some(if a.since <= b.since { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

/// How the cluster answers, as [`FluvioLog::reachability`] tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reachability {
    /// The latest operations and probe succeeded.
    Answering,
    /// Operations or probes have failed for `for_` (the latest error).
    Failing {
        /// How long, since the first failure of the run.
        for_: Duration,
        /// The latest error.
        error: String,
    },
}

impl FluvioLog {
    /// The cluster's address, as configured.
    pub fn endpoint(&self) -> &str {
        &self.inner.settings.endpoint
    }

    /// Whether the cluster has answered the latest operations and probe.
    pub fn reachability(&self) -> Reachability {
        match self.inner.health.failing() {
            None => Reachability::Answering,
            Some(t) => Reachability::Failing {
                for_: t.since.elapsed(),
                error: t.last,
            },
        }
    }

    /// An error naming the cluster once it has failed to answer for longer
    /// than [`FluvioSettings::give_up_after`]; `None` before.
    pub fn unreachable_past_limit(&self) -> Option<String> {
        match self.reachability() {
            Reachability::Failing { for_, error } if for_ > self.inner.settings.give_up_after => {
                Some(format!(
                    "the Fluvio cluster at {} has not answered for {} s (more than [log] give_up_after = {:?}): \
                     {error}; check that its SC and SPUs run and can be reached from here",
                    self.inner.settings.endpoint,
                    for_.as_secs(),
                    self.inner.settings.give_up_after
                ))
            }
            _ => None,
        }
    }

    /// Asks the SC for the partitions of walhook's topics and checks that
    /// each has a live leader; the outcome feeds [`Self::reachability`]. A
    /// failure to reach the SC makes a new connection for what follows.
    /// Returns each partition's high watermark, for [`Self::consumer_lag`].
    pub async fn probe(&self) -> Result<Watermarks, LogError> {
        let client = self.inner.client();
        let outcome = within(self.try_probe(&client)).await;
        match &outcome {
            Ok(_) => self.inner.health.probe_passed(),
            Err(e) => Health::note(&self.inner.health.probe, Err(e)),
        }
        match outcome {
            Ok(marks) => Ok(marks),
            Err(error) => {
                let _ = self.inner.reconnect(&client).await;
                Err(broken(error))
            }
        }
    }

    async fn try_probe(&self, client: &Fluvio) -> Result<Watermarks, String> {
        let admin = client.admin().await;
        let found = admin
            .all::<PartitionSpec>()
            .await
            .map_err(|e| format!("cannot list the partitions: {e:#}"))?;
        let mut topics: Vec<_> = self.inner.partitions.iter().collect();
        topics.sort();
        let mut marks = Vec::new();
        for (topic, count) in topics {
            for p in 0..*count {
                let name = format!("{topic}-{p}");
                let Some(m) = found.iter().find(|m| m.name == name) else {
                    return Err(format!("partition {name} is not on the cluster"));
                };
                if m.status.resolution != PartitionResolution::Online {
                    return Err(format!(
                        "partition {name} has no live leader ({:?}; leader SPU {})",
                        m.status.resolution, m.spec.leader
                    ));
                }
                marks.push((topic.clone(), p, m.status.leader.hw));
            }
        }
        Ok(Watermarks(marks))
    }
}

/// Each partition's high watermark (the offset the next record gets), as
/// the SC reported it to a [`FluvioLog::probe`].
#[derive(Debug, Clone)]
pub struct Watermarks(Vec<(String, u32, i64)>);

/// How far a consumer group is behind on one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerLag {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
    /// The consumer group.
    pub group: String,
    /// Records stored after the group's committed position.
    pub lag: u64,
    /// How long the oldest of those records has waited since its producer
    /// sent it; zero when the group is caught up (or the record carries no
    /// time).
    pub oldest_unread_age: Duration,
}

impl FluvioLog {
    /// The lag of each consumer group on each partition of walhook's topics:
    /// the partition's high watermark (`marks`, from a probe) less the
    /// group's stored position. Every group that stored a position on
    /// these topics is listed, and those of this process, on every
    /// partition (one never read counts all its records), so any member
    /// shows a partition nobody reads.
    pub async fn consumer_lag(&self, marks: &Watermarks) -> Result<Vec<ConsumerLag>, LogError> {
        let offsets = within(self.inner.client().consumer_offsets())
            .await
            .map_err(|e| {
                broken(format!(
                    "the Fluvio cluster at {} did not report its consumer offsets: {e}",
                    self.inner.settings.endpoint
                ))
            })?;
        let mut groups: std::collections::BTreeSet<String> = offsets
            .iter()
            .filter(|o| self.inner.partitions.contains_key(&o.topic))
            .map(|o| o.consumer_id.clone())
            .collect();
        groups.extend(self.inner.commits.lock().keys().map(|k| k.2.clone()));
        let mut lags = Vec::new();
        let mut waiting = std::collections::HashSet::new();
        for (topic, partition, high) in &marks.0 {
            for group in &groups {
                // A stored offset is the last record done: the group's next
                // record follows it.
                let next = stored_offset(&offsets, topic, *partition, group).map_or(0, |o| o + 1);
                let lag = u64::try_from(high - next).unwrap_or(0);
                let oldest_unread_age = if lag == 0 {
                    Duration::ZERO
                } else {
                    waiting.insert((topic.clone(), *partition, next));
                    self.record_time(topic, *partition, next)
                        .await
                        .and_then(|at| SystemTime::now().duration_since(at).ok())
                        .unwrap_or_default()
                };
                lags.push(ConsumerLag {
                    topic: topic.clone(),
                    partition: *partition,
                    group: group.clone(),
                    lag,
                    oldest_unread_age,
                });
            }
        }
        // Forget the times of records that no group waits on any more.
        self.inner
            .record_times
            .lock()
            .retain(|key, _| waiting.contains(key));
        Ok(lags)
    }

    /// When the record at `offset` was produced: asked of the cluster once
    /// (a short read of that one record), then remembered.
    async fn record_time(&self, topic: &str, partition: u32, offset: i64) -> Option<SystemTime> {
        let key = (topic.to_owned(), partition, offset);
        if let Some(at) = self.inner.record_times.lock().get(&key) {
            return Some(*at);
        }
        let config = ConsumerConfigExt::builder()
            .topic(topic.to_owned())
            .partition(partition)
            .offset_start(FluvioOffset::absolute(offset).ok()?)
            .isolation(Isolation::ReadCommitted)
            .build()
            .ok()?;
        let client = self.inner.client();
        let mut stream = within(client.consumer_with_config(config)).await.ok()?;
        let record = tokio::time::timeout(Committer::TRY_TIMEOUT, stream.next())
            .await
            .ok()??
            .ok()?;
        let millis = u64::try_from(record.timestamp())
            .ok()
            .filter(|ms| *ms > 0)?;
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(millis);
        if record.offset == offset {
            self.inner.record_times.lock().insert(key, at);
        }
        Some(at)
    }
}
