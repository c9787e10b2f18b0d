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
//! rows stay as they are and only new ones become jobs.
//!
//! The directory is never older than the events it decides for: after a
//! poll, fan-out waits until a directory check that began after the poll
//! succeeded ([`SubscriptionCache::fresh_since`]), so an endpoint created,
//! changed or deleted before an event's commit is honoured for that event.
//!
//! One bad event never stops the stage: when the platform database refuses
//! a batch's values (a data error), the batch is split until the event at
//! fault is found; it becomes an incident and the rest is stored. Events of
//! a tenant that is not registered are stored, reach no endpoint, and are
//! counted in one incident per tenant.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::delivery::{DeliveryJob, NewDelivery, ObjectOrder};
use crate::dispatch::observe::{AttemptObserver, NoObserver};
use crate::endpoint::{SubscriptionCache, TenantStatus};
use crate::event::Event;
use crate::failpoint;
use crate::ids::{DeliveryId, EventId, Offset};
use crate::incident::{IncidentKind, Stage, StageIncident};
use crate::log::{Consumer, LogError, Producer};
use crate::store::{FanoutStore, StoreError};
use crate::time::Timestamp;

/// Deliveries made in one transaction at most (one event's are never split).
const MAX_DELIVERIES_PER_TX: usize = 2000;

/// Event bytes stored in one transaction at most (one event is never
/// split): events may be up to `[source].max_event_bytes` each, and a batch
/// of large ones must not become one huge statement.
const MAX_EVENT_BYTES_PER_TX: usize = 32 << 20;

/// A batch of two or more records but fewer than this is followed by
/// [`FanoutSettings::linger`] before the next read.
pub const LINGER_BELOW: usize = 32;

/// The default of [`FanoutSettings::linger`].
pub const DEFAULT_LINGER: Duration = Duration::from_millis(10);

/// Fan-out settings.
#[derive(Debug, Clone)]
pub struct FanoutSettings {
    /// Events per batch (one database transaction).
    pub batch_size: usize,
    /// After a batch of 2 to [`LINGER_BELOW`] − 1 events, how long to wait
    /// before reading the next: each transaction costs the database a round trip,
    /// a statement start and a commit whatever its size, so that under
    /// load fewer, larger ones are cheaper; a quiet moment's event waits at
    /// most this long. The wait is before the read, never during it (a
    /// read abandoned half-way could lose its records on some logs).
    pub linger: Duration,
    /// When automatic retries stop, from creation.
    pub deadline: Duration,
    /// The dispatcher node in this process: deliveries are made already
    /// leased to it, which saves a claim per delivery. `None` when dispatch
    /// runs elsewhere.
    pub lease_owner: Option<String>,
    /// How long that lease lasts before another node may claim.
    pub lease: Duration,
    /// Jobs go to the deliveries topic partitioned by endpoint
    /// ([`crate::routing`]): plans are held by the topic
    /// ([`crate::routing::TOPIC_HELD`]), each job is keyed to its route,
    /// and the events offset moves only once the jobs are stored in the
    /// topic. `None`: keyed by endpoint for a dispatcher in this process.
    pub route: Option<Arc<crate::routing::Routes>>,
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
    observer: Arc<dyn AttemptObserver>,
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct FanoutCounters {
    /// Events fanned out.
    pub events: std::sync::atomic::AtomicU64,
    /// Deliveries made.
    pub deliveries: std::sync::atomic::AtomicU64,
    /// Events set aside as incidents (refused by the platform database).
    pub incidents: std::sync::atomic::AtomicU64,
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
            observer: Arc::new(NoObserver),
        }
    }

    /// Tells `observer` when each event's deliveries are durable.
    pub fn with_observer(mut self, observer: Arc<dyn AttemptObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Runs until `shutdown` (after finishing the batch in hand) or a
    /// definite error.
    pub async fn run(
        mut self,
        counters: Arc<FanoutCounters>,
        shutdown: CancellationToken,
    ) -> Result<(), FanoutError> {
        let mut small = false;
        loop {
            // Supervision tests end the operator here.
            if failpoint::hit("fanout.poll") {
                return Ok(());
            }
            if small && !self.settings.linger.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(self.settings.linger) => {}
                }
            }
            let records = tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                polled = self.consumer.poll(self.settings.batch_size) => match polled {
                    Ok(r) => r,
                    Err(LogError::Closed) => return Ok(()),
                    Err(gap @ LogError::Gap { .. }) => return Err(self.stop_at_gap(gap, &shutdown).await),
                    Err(e) => return Err(e.into()),
                },
            };
            // A single record says nothing was waiting behind it: no load
            // to gather, so the next read goes at once (a quiet stream
            // keeps its latency); two or more say events arrive faster
            // than they are written.
            small = (2..LINGER_BELOW).contains(&records.len());
            // Every endpoint change committed before these events' commits
            // was committed before this instant.
            let polled_at = std::time::Instant::now();
            if !self.directory.fresh_since(polled_at, &shutdown).await {
                return Ok(());
            }
            // Bounded transactions: an event for a tenant with a thousand
            // endpoints goes in a transaction of its own instead of holding
            // up the events polled with it.
            let directory = self.directory.snapshot();
            let mut chunk: Vec<crate::log::Record<Event>> = Vec::new();
            let (mut planned, mut bytes) = (0usize, 0usize);
            for record in records {
                let e = &record.message;
                let n = directory
                    .subscribers(&e.tenant_id, &e.event_type, e.occurred_at)
                    .count();
                let size = e.payload.len();
                if !chunk.is_empty()
                    && (planned + n > MAX_DELIVERIES_PER_TX
                        || bytes + size > MAX_EVENT_BYTES_PER_TX)
                {
                    self.process(std::mem::take(&mut chunk), &counters, &shutdown)
                        .await?;
                    (planned, bytes) = (0, 0);
                }
                planned += n;
                bytes += size;
                chunk.push(record);
            }
            if !chunk.is_empty() {
                self.process(chunk, &counters, &shutdown).await?;
            }
        }
    }

    /// Records an incident for records gone from the log (reconciliation
    /// and the console show it), and returns the error that stops this
    /// worker: reading on would skip them.
    async fn stop_at_gap(&self, gap: LogError, shutdown: &CancellationToken) -> FanoutError {
        if let LogError::Gap {
            topic, partition, ..
        } = &gap
        {
            let incident = StageIncident::new(
                Stage::Fanout,
                IncidentKind::LogGap,
                &format!("{topic}/{partition}"),
                &gap.to_string(),
            );
            incident.log();
            if let Err(e) = retry_transient(shutdown, "record a log gap", || {
                self.store.record_incidents(std::slice::from_ref(&incident))
            })
            .await
            {
                tracing::error!(error = %e, "the log gap could not be recorded as an incident");
            }
        }
        gap.into()
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
        // A log that delivers at least once may hand one event twice in a
        // chunk (a producer's retried batch stored twice, seen after a
        // broker crash): planned twice, its deliveries went to dispatch
        // twice and their first attempts were sent twice. Each event once.
        let mut seen = std::collections::HashSet::new();
        let events: Vec<Event> = records
            .into_iter()
            .map(|r| r.message)
            .filter(|e| seen.insert(e.id))
            .collect();
        let (deliveries, jobs) = self.plan(&events);
        let mut incidents = self.unknown_tenants(&events);
        failpoint::hit("fanout.before_materialize");
        let made = self
            .materialize_isolating(&events, &deliveries, &mut incidents, shutdown)
            .await?;
        // Incidents are durable before the offset moves past their events.
        if !incidents.is_empty() {
            counters.incidents.fetch_add(
                incidents
                    .iter()
                    .filter(|i| i.kind == IncidentKind::UnstorableEvent)
                    .count() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            for i in &incidents {
                i.log();
            }
            retry_transient(shutdown, "record fan-out incidents", || {
                self.store.record_incidents(&incidents)
            })
            .await?;
        }
        failpoint::hit("fanout.after_materialize");
        let made: std::collections::HashSet<DeliveryId> = made.into_iter().collect();
        let mut fresh: Vec<(Vec<u8>, DeliveryJob)> = jobs
            .into_iter()
            .filter(|j| made.contains(&j.delivery_id))
            .map(|j| {
                let key = match &self.settings.route {
                    Some(routes) => routes.key_of(j.endpoint_id, j.delivery_id),
                    None => j.endpoint_id.0.to_vec(),
                };
                (key, j)
            })
            .collect();
        if self.settings.route.is_some() && !fresh.is_empty() {
            // The topic holds these plans' jobs: stored there before the
            // events offset moves (a crash before that reads the events
            // again, and the redo sends the plans' jobs again).
            self.send_stored(std::mem::take(&mut fresh), shutdown)
                .await?;
        }
        // A member that lost this partition may not move its offset (the
        // holder reads these events again); the deliveries it made are
        // leased to its own dispatcher all the same, and only it knows of
        // them until that lease lapses: they go to dispatch, then this
        // reader stops.
        let fenced = match self.consumer.commit(Offset(last.0 + 1)).await {
            Ok(()) => None,
            Err(e @ LogError::Fenced { .. }) => Some(e),
            Err(e) => return Err(e.into()),
        };
        if fenced.is_none() {
            // The offset moved on; the jobs are not yet with dispatch.
            failpoint::hit("fanout.after_commit");
            let now = Timestamp::now();
            for e in &events {
                self.observer.fanned_out(e.occurred_at, now);
            }
            counters
                .events
                .fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);
            counters
                .deliveries
                .fetch_add(made.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
        if !fresh.is_empty() {
            // Durability of jobs is the deliveries table's; the receipt
            // is not awaited.
            drop(self.jobs.send_all(fresh).await?);
        }
        match fenced {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Sends `jobs` to the deliveries topic and waits until it stored them,
    /// trying again while the log fails for a reason that may pass (a
    /// broker restarting): the topic may then hold some twice, which its
    /// dispatcher tells apart.
    async fn send_stored(
        &self,
        jobs: Vec<(Vec<u8>, DeliveryJob)>,
        shutdown: &CancellationToken,
    ) -> Result<(), FanoutError> {
        let mut pause = Duration::from_millis(100);
        loop {
            let sent = match self.jobs.send_all(jobs.clone()).await {
                Ok(receipt) => receipt.await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() && !shutdown.is_cancelled() => {
                    tracing::warn!(error = %e, retry_in = ?pause, "fan-out could not store jobs in the deliveries topic; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One incident per tenant that is not registered, counting its events
    /// in this chunk.
    fn unknown_tenants(&self, events: &[Event]) -> Vec<StageIncident> {
        let directory = self.directory.snapshot();
        let mut out: Vec<StageIncident> = Vec::new();
        for e in events {
            if directory.tenant(&e.tenant_id) != TenantStatus::Unknown {
                continue;
            }
            match out.iter_mut().find(|i| i.subject == e.tenant_id.as_str()) {
                Some(i) => i.occurrences += 1,
                None => out.push(StageIncident::new(
                    Stage::Fanout,
                    IncidentKind::UnknownTenant,
                    e.tenant_id.as_str(),
                    &format!(
                        "events for tenant {:?} (the latest {}, type {}) reach no endpoint: the tenant is \
                         not registered; create it (POST /v1/tenants) or fix the capture rule's tenant column",
                        e.tenant_id.as_str(),
                        e.id,
                        e.event_type
                    ),
                )),
            }
        }
        out
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
            let order = ObjectOrder::of(event);
            for (endpoint, config_version) in
                directory.subscribers(&event.tenant_id, &event.event_type, event.occurred_at)
            {
                let delivery = NewDelivery {
                    id: DeliveryId::derive(event.id, endpoint.id),
                    event_id: event.id,
                    endpoint_id: endpoint.id,
                    tenant_id: event.tenant_id.clone(),
                    event_type: event.event_type.clone(),
                    event_occurred_at: event.occurred_at,
                    endpoint_config_version: config_version,
                    created_at: now,
                    expires_at,
                    lease_owner: self.settings.lease_owner.clone(),
                    lease_expires_at,
                };
                jobs.push(DeliveryJob::planned(event, &delivery, order.clone()));
                deliveries.push(delivery);
            }
        }
        (deliveries, jobs)
    }

    /// Stores `events` and `deliveries`; when the database refuses a
    /// value, splits the chunk until the events at fault are found, sets
    /// them aside as incidents and stores the rest. Returns the deliveries
    /// made.
    async fn materialize_isolating(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
        incidents: &mut Vec<StageIncident>,
        shutdown: &CancellationToken,
    ) -> Result<Vec<DeliveryId>, FanoutError> {
        let first = retry_transient(shutdown, "store events and deliveries", || {
            self.store.materialize(events, deliveries)
        })
        .await;
        let whole = match first {
            Ok(made) => return Ok(made),
            Err(FanoutError::Store(e)) if e.is_data() => {
                tracing::warn!(error = %e.chain(), events = events.len(), "the platform database refused a fan-out batch; looking for the events at fault");
                e.chain()
            }
            Err(e) => return Err(e),
        };
        // Rare: split by halves (ranges of `events`) until each refused
        // range is one event.
        let mut made = Vec::new();
        let mut todo: Vec<std::ops::Range<usize>> = Vec::new();
        todo.push(0..events.len());
        while let Some(range) = todo.pop() {
            let part = &events[range.clone()];
            let ids: std::collections::HashSet<EventId> = part.iter().map(|e| e.id).collect();
            let dels: Vec<NewDelivery> = deliveries
                .iter()
                .filter(|d| ids.contains(&d.event_id))
                .cloned()
                .collect();
            let result = if range.len() == events.len() {
                // Already known to fail as a whole.
                Err(FanoutError::Store(StoreError::data(whole.clone())))
            } else {
                retry_transient(shutdown, "store events and deliveries", || {
                    self.store.materialize(part, &dels)
                })
                .await
            };
            match result {
                Ok(ids) => made.extend(ids),
                Err(FanoutError::Store(e)) if e.is_data() && range.len() > 1 => {
                    let mid = range.start + range.len() / 2;
                    todo.push(mid..range.end);
                    todo.push(range.start..mid);
                }
                Err(FanoutError::Store(e)) if e.is_data() => {
                    let event = &part[0];
                    incidents.push(StageIncident::new(
                        Stage::Fanout,
                        IncidentKind::UnstorableEvent,
                        &event.id.to_string(),
                        &format!(
                            "event {} (tenant {:?}, type {}, commit LSN {}) was refused by the platform \
                             database and set aside with its {} deliveries: {}",
                            event.id,
                            event.tenant_id.as_str(),
                            event.event_type,
                            event.key.commit_lsn,
                            dels.len(),
                            e.chain()
                        ),
                    ));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(made)
    }
}

/// Runs `op` until it succeeds or fails for a reason other than a
/// transient one, backing off between tries; shutdown ends the retries.
async fn retry_transient<T, F, Fut>(
    shutdown: &CancellationToken,
    what: &str,
    mut op: F,
) -> Result<T, FanoutError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() && !shutdown.is_cancelled() => {
                tracing::warn!(error = %e.chain(), retry_in = ?backoff, "fan-out could not {what}; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
