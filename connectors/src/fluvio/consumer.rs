//! The consumer: one partition read for a group. Records come from the
//! reader task through a bounded queue (so `poll` is cancel-safe) and
//! commits go to the committer task; [`Place`] names the partition and
//! group, and the group's stored position is where reading starts.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use fluvio::consumer::ConsumerOffset;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::{Consumer, LogError, Message, Record};

use super::committer::CommitState;
use super::connection::{on_new_connections, within};
use super::{Inner, broken};

/// Reads one partition of a Fluvio topic for a consumer group.
pub struct FluvioConsumer<M> {
    pub(super) partition: u32,
    pub(super) records: mpsc::Receiver<Result<Record<M>, LogError>>,
    pub(super) reader: JoinHandle<()>,
    /// Below this the group's position cannot move: the offset of the
    /// first record this consumer handed out (the group's stored position
    /// or later). `None` until a record was handed out: nothing read,
    /// nothing to commit.
    pub(super) floor: Option<u64>,
    pub(super) commits: Arc<CommitState>,
    /// Wakes the committer task; dropped with the consumer, which lets the
    /// task finish what was asked and end.
    pub(super) wake: mpsc::Sender<()>,
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

/// One partition as one consumer group reads it.
pub(super) struct Place {
    pub(super) topic: String,
    pub(super) partition: u32,
    pub(super) group: String,
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
pub(super) fn stored_offset(
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

/// The group's stored position on the partition (see [`stored_offset`]),
/// asked again on new connections until `deadline`.
pub(super) async fn stored_position(
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
