//! Fan-out: each event becomes one delivery per subscribed endpoint.
//!
//! ```text
//!  log:events ──poll──▶ FanoutOperator ──materialize(events, deliveries)──▶ Postgres
//!                            │  (one transaction; ON CONFLICT DO NOTHING)
//!                            ├──commit(events offset)──▶ capture's receipt resolves
//!                            └──send(new jobs, key = endpoint)──▶ log:deliveries
//! ```
//!
//! Delivery ids are derived from (event, endpoint), so fanning out the same
//! events again (after a crash before the commit) only fills gaps: existing
//! rows stay as they are and only new ones become jobs. The subscription
//! directory is read once per batch.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::delivery::{DeliveryJob, NewDelivery};
use crate::endpoint::SubscriptionCache;
use crate::event::Event;
use crate::failpoint;
use crate::ids::{DeliveryId, Offset};
use crate::log::{Consumer, LogError, Producer};
use crate::store::{FanoutStore, StoreError};
use crate::time::Timestamp;

/// Deliveries made in one transaction at most (one event's are never split).
const MAX_DELIVERIES_PER_TX: usize = 2000;

/// Fan-out settings.
#[derive(Debug, Clone)]
pub struct FanoutSettings {
    /// Events per batch (one database transaction).
    pub batch_size: usize,
    /// When automatic retries stop, from creation.
    pub deadline: Duration,
    /// The dispatcher node in this process: deliveries are made already
    /// leased to it, which saves a claim per delivery. `None` when dispatch
    /// runs elsewhere.
    pub lease_owner: Option<String>,
    /// How long that lease lasts before another node may claim.
    pub lease: Duration,
}

/// Why fan-out stopped.
#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    /// The log failed.
    #[error("fan-out: log error")]
    Log(#[from] LogError),
    /// The store failed with an error retrying cannot fix.
    #[error("fan-out: platform database error")]
    Store(#[from] StoreError),
}

/// Reads one partition of the events topic.
pub struct FanoutOperator<C, P, S> {
    consumer: C,
    jobs: P,
    store: Arc<S>,
    directory: Arc<SubscriptionCache>,
    settings: FanoutSettings,
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct FanoutCounters {
    /// Events fanned out.
    pub events: std::sync::atomic::AtomicU64,
    /// Deliveries made.
    pub deliveries: std::sync::atomic::AtomicU64,
}

impl<C, P, S> FanoutOperator<C, P, S>
where
    C: Consumer<Event>,
    P: Producer<DeliveryJob>,
    S: FanoutStore,
{
    /// An operator over one events partition.
    pub fn new(
        consumer: C,
        jobs: P,
        store: Arc<S>,
        directory: Arc<SubscriptionCache>,
        settings: FanoutSettings,
    ) -> Self {
        FanoutOperator {
            consumer,
            jobs,
            store,
            directory,
            settings,
        }
    }

    /// Runs until `shutdown` (after finishing the batch in hand) or a
    /// definite error.
    pub async fn run(
        mut self,
        counters: Arc<FanoutCounters>,
        shutdown: CancellationToken,
    ) -> Result<(), FanoutError> {
        loop {
            let records = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                polled = self.consumer.poll(self.settings.batch_size) => match polled {
                    Ok(r) => r,
                    Err(LogError::Closed) => return Ok(()),
                    Err(e) => return Err(e.into()),
                },
            };
            // Bounded transactions: an event for a tenant with a thousand
            // endpoints goes in a transaction of its own instead of holding
            // up the events polled with it.
            let directory = self.directory.snapshot();
            let mut chunk: Vec<crate::log::Record<Event>> = Vec::new();
            let mut planned = 0usize;
            for record in records {
                let e = &record.message;
                let n = directory
                    .subscribers(&e.tenant_id, &e.event_type, e.occurred_at)
                    .count();
                if !chunk.is_empty() && planned + n > MAX_DELIVERIES_PER_TX {
                    self.process(std::mem::take(&mut chunk), &counters, &shutdown)
                        .await?;
                    planned = 0;
                }
                planned += n;
                chunk.push(record);
            }
            if !chunk.is_empty() {
                self.process(chunk, &counters, &shutdown).await?;
            }
        }
    }

    /// Materialises one chunk of events, commits their offset, then sends
    /// the jobs of the deliveries that did not exist before.
    async fn process(
        &mut self,
        records: Vec<crate::log::Record<Event>>,
        counters: &FanoutCounters,
        shutdown: &CancellationToken,
    ) -> Result<(), FanoutError> {
        let Some(last) = records.last().map(|r| r.offset) else {
            return Ok(());
        };
        let events: Vec<Event> = records.into_iter().map(|r| r.message).collect();
        let (deliveries, jobs) = self.plan(&events);
        let made = self
            .materialize_with_retry(&events, &deliveries, shutdown)
            .await?;
        failpoint::hit("fanout.after_materialize");
        self.consumer.commit(Offset(last.0 + 1)).await?;
        counters
            .events
            .fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);
        counters
            .deliveries
            .fetch_add(made.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let made: std::collections::HashSet<DeliveryId> = made.into_iter().collect();
        let fresh: Vec<(Vec<u8>, DeliveryJob)> = jobs
            .into_iter()
            .filter(|j| made.contains(&j.delivery_id))
            .map(|j| (j.endpoint_id.0.to_vec(), j))
            .collect();
        if !fresh.is_empty() {
            // Durability of jobs is the deliveries table's; the receipt
            // is not awaited.
            drop(self.jobs.send_all(fresh).await?);
        }
        Ok(())
    }

    /// The deliveries and jobs for `events` under the current directory.
    fn plan(&self, events: &[Event]) -> (Vec<NewDelivery>, Vec<DeliveryJob>) {
        let directory = self.directory.snapshot();
        let now = Timestamp::now();
        let expires_at = now.plus(self.settings.deadline);
        let lease_expires_at = self
            .settings
            .lease_owner
            .as_ref()
            .map(|_| now.plus(self.settings.lease));
        let mut deliveries = Vec::new();
        let mut jobs = Vec::new();
        for event in events {
            for endpoint in
                directory.subscribers(&event.tenant_id, &event.event_type, event.occurred_at)
            {
                let id = DeliveryId::derive(event.id, endpoint.id);
                deliveries.push(NewDelivery {
                    id,
                    event_id: event.id,
                    endpoint_id: endpoint.id,
                    tenant_id: event.tenant_id.clone(),
                    event_type: event.event_type.clone(),
                    event_occurred_at: event.occurred_at,
                    endpoint_config_version: endpoint.config_version,
                    created_at: now,
                    expires_at,
                    lease_owner: self.settings.lease_owner.clone(),
                    lease_expires_at,
                });
                jobs.push(DeliveryJob {
                    delivery_id: id,
                    event_id: event.id,
                    endpoint_id: endpoint.id,
                    tenant_id: event.tenant_id.clone(),
                    event_type: event.event_type.clone(),
                    payload: event.payload.clone(),
                    attempt_count: 0,
                    created_at: now,
                    next_attempt_at: now,
                    expires_at,
                    lease_version: 1,
                    endpoint_config_version: endpoint.config_version,
                    event_occurred_at: event.occurred_at,
                    replay: None,
                });
            }
        }
        (deliveries, jobs)
    }

    async fn materialize_with_retry(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
        shutdown: &CancellationToken,
    ) -> Result<Vec<DeliveryId>, FanoutError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.store.materialize(events, deliveries).await {
                Ok(made) => return Ok(made),
                Err(e) if e.transient && !shutdown.is_cancelled() => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "fan-out could not write; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}
