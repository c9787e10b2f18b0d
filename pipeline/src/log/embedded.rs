//! The embedded log: in-process topics whose durability is downstream's.
//!
//! Nothing here is written to disk. A record counts as durable once every
//! consumer group in its topic's `durable_groups` has committed past it, and
//! those groups commit only after their effects are committed in Postgres.
//! So when capture's receipt resolves, the events' deliveries are in the
//! platform database, and confirming the slot's LSN cannot lose anything: a
//! crash before that point re-reads the transaction from the slot.
//!
//! Memory is bounded: each partition holds at most `capacity` records that
//! some group still needs, and senders wait for room. Records every group has
//! committed are dropped.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use super::{
    Consumer, Log, LogError, Message, Producer, Receipt, Record, TopicSpec, partition_for,
};
use crate::ids::Offset;

/// An in-process log; cheap to clone (all clones share the topics).
#[derive(Clone)]
pub struct EmbeddedLog {
    inner: Arc<Inner>,
}

struct Inner {
    specs: HashMap<String, TopicSpec>,
    /// Topics are typed on first use; `Arc<Topic<M>>` behind `Any`.
    topics: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
    closed: Arc<AtomicBool>,
    /// Cancelled on close: receipts still waiting fail at once (a consumer
    /// that will never commit must not hold its producers' receipts).
    shut: CancellationToken,
    /// Every partition's notifier, to wake everyone on close.
    wakers: Mutex<Vec<Arc<Partition>>>,
}

struct Topic<M> {
    spec: TopicSpec,
    partitions: Vec<Arc<Partition>>,
    states: Vec<Mutex<PartitionState<M>>>,
}

/// The notifiers of one partition (untyped so that `close` can reach them).
#[derive(Default)]
struct Partition {
    readable: Notify,
    writable: Notify,
}

struct PartitionState<M> {
    /// Offset of `records[0]`.
    base: u64,
    records: VecDeque<M>,
    /// Next offset to read for each group that has consumed or committed.
    committed: HashMap<String, u64>,
    /// Senders waiting for their last offset to become durable, in offset
    /// order (appends are ordered, so pushes keep the order).
    waiters: VecDeque<(u64, oneshot::Sender<()>)>,
}

impl<M> PartitionState<M> {
    fn next_offset(&self) -> u64 {
        self.base + self.records.len() as u64
    }

    /// Everything below this offset is durable.
    fn durable_mark(&self, spec: &TopicSpec) -> u64 {
        if spec.durable_groups.is_empty() {
            return u64::MAX;
        }
        spec.durable_groups
            .iter()
            .map(|g| self.committed.get(g).copied().unwrap_or(0))
            .min()
            .unwrap_or(0)
    }

    /// Resolves waiters below the durable mark and drops records that no
    /// group still needs.
    fn settle(&mut self, spec: &TopicSpec) -> bool {
        let mark = self.durable_mark(spec);
        while self
            .waiters
            .front()
            .is_some_and(|(offset, _)| *offset < mark)
        {
            if let Some((_, tx)) = self.waiters.pop_front() {
                // The receipt's holder may have gone (a sink that gave up
                // waiting): the records are durable either way, which is
                // all the receipt would have said.
                let _ = tx.send(());
            }
        }
        // Keep what a durable group has not committed and what any group
        // that has read the partition still needs.
        let needed = spec
            .durable_groups
            .iter()
            .map(|g| self.committed.get(g).copied().unwrap_or(0))
            .chain(self.committed.values().copied())
            .min();
        let Some(needed) = needed else {
            return false;
        };
        let mut freed = false;
        while self.base < needed && !self.records.is_empty() {
            self.records.pop_front();
            self.base += 1;
            freed = true;
        }
        freed
    }
}

impl EmbeddedLog {
    /// A log with the given topics.
    pub fn new(specs: impl IntoIterator<Item = TopicSpec>) -> Self {
        EmbeddedLog {
            inner: Arc::new(Inner {
                specs: specs.into_iter().map(|s| (s.name.clone(), s)).collect(),
                topics: Mutex::new(HashMap::new()),
                closed: Arc::new(AtomicBool::new(false)),
                shut: CancellationToken::new(),
                wakers: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Wakes every waiting sender and consumer with [`LogError::Closed`].
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.shut.cancel();
        for p in self.inner.wakers.lock().iter() {
            p.readable.notify_waiters();
            p.writable.notify_waiters();
        }
    }

    fn topic<M: Message>(&self, name: &str) -> Result<Arc<Topic<M>>, LogError> {
        let spec = self
            .inner
            .specs
            .get(name)
            .ok_or_else(|| LogError::UnknownTopic(name.to_owned()))?;
        let mut topics = self.inner.topics.lock();
        let entry = topics.entry(name.to_owned()).or_insert_with(|| {
            let partitions: Vec<Arc<Partition>> = (0..spec.partitions.max(1))
                .map(|_| Arc::new(Partition::default()))
                .collect();
            self.inner.wakers.lock().extend(partitions.iter().cloned());
            let states = (0..spec.partitions.max(1))
                .map(|_| {
                    Mutex::new(PartitionState::<M> {
                        base: 0,
                        records: VecDeque::new(),
                        committed: HashMap::new(),
                        waiters: VecDeque::new(),
                    })
                })
                .collect();
            Arc::new(Topic {
                spec: spec.clone(),
                partitions,
                states,
            })
        });
        entry
            .clone()
            .downcast::<Topic<M>>()
            .map_err(|_| LogError::WrongType(name.to_owned()))
    }
}

impl Log for EmbeddedLog {
    type Producer<M: Message> = EmbeddedProducer<M>;
    type Consumer<M: Message> = EmbeddedConsumer<M>;

    fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        self.inner
            .specs
            .get(topic)
            .map(|s| s.partitions.max(1))
            .ok_or_else(|| LogError::UnknownTopic(topic.to_owned()))
    }

    fn producer<M: Message>(&self, topic: &str) -> Result<EmbeddedProducer<M>, LogError> {
        Ok(EmbeddedProducer {
            topic: self.topic(topic)?,
            closed: self.inner.closed.clone(),
            shut: self.inner.shut.clone(),
        })
    }

    async fn consumer<M: Message>(
        &self,
        topic: &str,
        partition: u32,
        group: &str,
    ) -> Result<EmbeddedConsumer<M>, LogError> {
        let topic = self.topic::<M>(topic)?;
        if partition as usize >= topic.states.len() {
            return Err(LogError::NoPartition {
                topic: topic.spec.name.clone(),
                partition,
            });
        }
        let position = {
            let mut state = topic.states[partition as usize].lock();
            let base = state.base;
            *state.committed.entry(group.to_owned()).or_insert(base)
        };
        Ok(EmbeddedConsumer {
            topic,
            partition,
            group: group.to_owned(),
            position,
            closed: self.inner.closed.clone(),
        })
    }
}

/// Sends to one embedded topic.
pub struct EmbeddedProducer<M> {
    topic: Arc<Topic<M>>,
    closed: Arc<AtomicBool>,
    shut: CancellationToken,
}

impl<M> Clone for EmbeddedProducer<M> {
    fn clone(&self) -> Self {
        EmbeddedProducer {
            topic: self.topic.clone(),
            closed: self.closed.clone(),
            shut: self.shut.clone(),
        }
    }
}

impl<M: Message> EmbeddedProducer<M> {
    /// Appends one record, waiting for room; returns its offset.
    async fn append(&self, partition: usize, message: M) -> Result<u64, LogError> {
        let notify = &self.topic.partitions[partition];
        loop {
            let writable = notify.writable.notified();
            tokio::pin!(writable);
            writable.as_mut().enable();
            if self.closed.load(Ordering::SeqCst) {
                return Err(LogError::Closed);
            }
            {
                let mut state = self.topic.states[partition].lock();
                if state.records.len() < self.topic.spec.capacity.max(1) {
                    let offset = state.next_offset();
                    state.records.push_back(message);
                    drop(state);
                    notify.readable.notify_waiters();
                    return Ok(offset);
                }
            }
            writable.await;
        }
    }
}

impl<M: Message> Producer<M> for EmbeddedProducer<M> {
    async fn send_all(&self, records: Vec<(Vec<u8>, M)>) -> Result<Receipt, LogError> {
        let partitions = self.topic.states.len() as u32;
        let mut last: HashMap<usize, u64> = HashMap::new();
        for (key, message) in records {
            let p = partition_for(&key, partitions) as usize;
            let offset = self.append(p, message).await?;
            last.insert(p, offset);
        }
        let mut pending = Vec::new();
        for (p, offset) in last {
            let mut state = self.topic.states[p].lock();
            if offset >= state.durable_mark(&self.topic.spec) {
                let (tx, rx) = oneshot::channel();
                state.waiters.push_back((offset, tx));
                pending.push(rx);
            }
        }
        if pending.is_empty() {
            return Ok(Receipt::ready());
        }
        let shut = self.shut.clone();
        Ok(Receipt::new(async move {
            for rx in pending {
                tokio::select! {
                    biased;
                    durable = rx => durable.map_err(|_| LogError::Closed)?,
                    _ = shut.cancelled() => return Err(LogError::Closed),
                }
            }
            Ok(())
        }))
    }
}

/// Reads one partition of an embedded topic.
pub struct EmbeddedConsumer<M> {
    topic: Arc<Topic<M>>,
    partition: u32,
    group: String,
    position: u64,
    closed: Arc<AtomicBool>,
}

impl<M: Message> Consumer<M> for EmbeddedConsumer<M> {
    fn partition(&self) -> u32 {
        self.partition
    }

    async fn poll(&mut self, max: usize) -> Result<Vec<Record<M>>, LogError> {
        let p = self.partition as usize;
        let notify = &self.topic.partitions[p];
        loop {
            let readable = notify.readable.notified();
            tokio::pin!(readable);
            readable.as_mut().enable();
            {
                let state = self.topic.states[p].lock();
                // Records below `base` were committed by every group that
                // keeps them, this one included; skip to what is held.
                let from = self.position.max(state.base);
                let end = state.next_offset();
                if from < end {
                    let take = (end - from).min(max.max(1) as u64);
                    let start = (from - state.base) as usize;
                    let out = state
                        .records
                        .range(start..start + take as usize)
                        .enumerate()
                        .map(|(i, m)| Record {
                            offset: Offset(from + i as u64),
                            message: m.clone(),
                        })
                        .collect();
                    self.position = from + take;
                    return Ok(out);
                }
            }
            if self.closed.load(Ordering::SeqCst) {
                return Err(LogError::Closed);
            }
            readable.await;
        }
    }

    async fn commit(&mut self, next: Offset) -> Result<(), LogError> {
        let p = self.partition as usize;
        let freed = {
            let mut state = self.topic.states[p].lock();
            let entry = state.committed.entry(self.group.clone()).or_insert(0);
            if next.0 > *entry {
                *entry = next.0;
            }
            state.settle(&self.topic.spec)
        };
        if freed {
            self.topic.partitions[p].writable.notify_waiters();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::contract::{self, TestRecord};
    use std::time::Duration;

    fn spec(name: &str, partitions: u32, capacity: usize, durable: &[&str]) -> TopicSpec {
        TopicSpec {
            name: name.into(),
            partitions,
            capacity,
            durable_groups: durable.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[tokio::test]
    async fn contract_suite_passes() {
        contract::run_all(|specs| async move { Ok(EmbeddedLog::new(specs)) })
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn receipt_waits_for_the_durable_group() {
        let log = EmbeddedLog::new([spec("events", 1, 16, &["fanout"])]);
        let producer = log.producer::<TestRecord>("events").unwrap();
        let mut receipt = producer
            .send_all(vec![(b"k".to_vec(), TestRecord(1, "a".into()))])
            .await
            .unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut receipt)
                .await
                .is_err(),
            "durable before the fan-out group committed"
        );
        let mut consumer = log
            .consumer::<TestRecord>("events", 0, "fanout")
            .await
            .unwrap();
        let got = consumer.poll(10).await.unwrap();
        assert_eq!(got.len(), 1);
        consumer.commit(Offset(got[0].offset.0 + 1)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), receipt)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn senders_wait_for_room() {
        let log = EmbeddedLog::new([spec("t", 1, 2, &["g"])]);
        let producer = log.producer::<TestRecord>("t").unwrap();
        for i in 0..2 {
            // The receipts are not awaited: nobody commits here.
            drop(
                producer
                    .send_all(vec![(vec![], TestRecord(i, String::new()))])
                    .await
                    .unwrap(),
            );
        }
        let blocked = producer.send_all(vec![(vec![], TestRecord(2, String::new()))]);
        tokio::pin!(blocked);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut blocked)
                .await
                .is_err()
        );
        let mut consumer = log.consumer::<TestRecord>("t", 0, "g").await.unwrap();
        let got = consumer.poll(1).await.unwrap();
        consumer.commit(Offset(got[0].offset.0 + 1)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), blocked)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn close_wakes_waiting_consumers() {
        let log = EmbeddedLog::new([spec("t", 1, 2, &[])]);
        let mut consumer = log.consumer::<TestRecord>("t", 0, "g").await.unwrap();
        let closer = log.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            closer.close();
        });
        assert!(matches!(consumer.poll(1).await, Err(LogError::Closed)));
    }
}
