//! The committer task of a consumer: exact commits made off the caller's
//! path, newest first, each by a one-shot stream at the offset before the
//! position (see the `fluvio` module's notes), tried again on new
//! connections until `[log] give_up_after`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fluvio::consumer::{ConsumerConfigExt, ConsumerStream, OffsetManagementStrategy, RetryMode};
use fluvio::{Fluvio, Offset as FluvioOffset};
use futures::StreamExt;
use tokio::sync::mpsc;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::LogError;

use super::{Inner, backend, broken};

/// What the committer task of one consumer was asked and has done.
pub(super) struct CommitState {
    /// The highest position asked for.
    pub(super) want: AtomicU64,
    /// The highest position stored.
    pub(super) done: tokio::sync::watch::Sender<u64>,
    /// Why the task gave up, if it did.
    pub(super) failed: parking_lot::Mutex<Option<String>>,
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
    pub(super) async fn settled(&self) {
        let mut done = self.done.subscribe();
        let _ = done
            .wait_for(|d| *d >= self.want.load(Ordering::Acquire) || self.failed.lock().is_some())
            .await;
    }
}

/// Makes the commits of one consumer, newest first, until it is dropped
/// and nothing is left to do.
pub(super) async fn run_committer(
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

/// Moves a consumer offset to exact positions (see the `fluvio` module's
/// notes).
pub(super) struct Committer {
    pub(super) inner: Arc<Inner>,
    pub(super) client: Arc<Fluvio>,
    pub(super) topic: String,
    pub(super) partition: u32,
    pub(super) group: String,
}

impl Committer {
    /// How long one try of a commit may take.
    pub(super) const TRY_TIMEOUT: Duration = Duration::from_secs(5);
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
