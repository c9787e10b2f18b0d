//! Dispatch: schedule, sign, send, record.
//!
//! ```text
//!  log:deliveries ─┐                      ┌─▶ attempt task: sign ─▶ Egress ─┐
//!  sweeper (claims ├─▶ Scheduler ─next_job┤                                 │
//!  due, expired    │   (timers, endpoint  └─▶ …                             │
//!  leases) ────────┘    FIFOs, ready ring) ◀── finished: DeliveryState::next┘
//!                                   │
//!                                   └─▶ recorder: attempts + states, batched, under leases
//! ```
//!
//! A delivery is sent only by the holder of its lease; results are recorded
//! with `WHERE lease_version = held`, so a worker whose lease moved on cannot
//! overwrite a newer state. Everything needed to resume lives in Postgres: a
//! restarted dispatcher reclaims what its node held and what is due.

pub mod egress;
pub mod outcome;
pub mod policy;
pub mod scheduler;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::egress::{Egress, EgressResult, build_request};
use self::outcome::{AttemptOutcome, ErrorClass};
use self::policy::{DeliveryState, RetryPolicy};
use self::scheduler::Scheduler;
use crate::delivery::{AttemptRecord, DeliveryJob, DeliveryStatus, Trigger};
use crate::endpoint::SubscriptionCache;
use crate::ids::{AttemptId, DeliveryId};
use crate::store::{DispatchStore, StoreError, Transition};
use crate::time::Timestamp;

/// Dispatch settings.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// This dispatcher's node id (unique among running processes; stable
    /// across restarts so that a restart reclaims its own leases at once).
    pub node_id: String,
    /// Attempts in flight at most, over all endpoints.
    pub max_in_flight: usize,
    /// Attempts in flight per endpoint unless the endpoint sets its own.
    pub endpoint_max_in_flight: u32,
    /// The retry schedule.
    pub retry: RetryPolicy,
    /// How long a claim lasts (longer than the request timeout).
    pub lease: Duration,
    /// Retries due sooner than this stay in memory; later ones are released
    /// to be claimed when due.
    pub hold_horizon: Duration,
    /// How often to claim due deliveries.
    pub sweep_interval: Duration,
    /// Deliveries claimed per sweep.
    pub sweep_batch: usize,
    /// Deliveries held in memory before new work waits.
    pub max_held: usize,
    /// How long to wait for attempts in flight at shutdown.
    pub drain_timeout: Duration,
    /// How often a paused delivery (endpoint disabled) is looked at again.
    pub pause_recheck: Duration,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        DispatchSettings {
            node_id: "local".into(),
            max_in_flight: 512,
            endpoint_max_in_flight: 16,
            retry: RetryPolicy::default(),
            lease: Duration::from_secs(120),
            hold_horizon: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(1),
            sweep_batch: 1000,
            max_held: 200_000,
            drain_timeout: Duration::from_secs(10),
            pause_recheck: Duration::from_secs(5),
        }
    }
}

/// Counters for metrics and the demo's summary.
#[derive(Debug, Default)]
pub struct DispatchCounters {
    /// Attempts made.
    pub attempts: AtomicU64,
    /// Attempts that were retries.
    pub retries: AtomicU64,
    /// Deliveries that succeeded.
    pub succeeded: AtomicU64,
    /// Deliveries that failed permanently or ran out of retries.
    pub failed: AtomicU64,
    /// Results not recorded because the lease had moved on.
    pub stale: AtomicU64,
}

/// Why dispatch stopped.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The store failed with an error retrying cannot fix.
    #[error("dispatch: platform database error")]
    Store(#[from] StoreError),
}

struct Finished {
    job: DeliveryJob,
    number: u32,
    config_version: i32,
    started_at: Timestamp,
    finished_at: Timestamp,
    result: EgressResult,
}

/// The dispatcher of one node.
pub struct Dispatcher<E, S> {
    egress: Arc<E>,
    store: Arc<S>,
    directory: Arc<SubscriptionCache>,
    settings: DispatchSettings,
    counters: Arc<DispatchCounters>,
}

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    /// A dispatcher.
    pub fn new(
        egress: Arc<E>,
        store: Arc<S>,
        directory: Arc<SubscriptionCache>,
        settings: DispatchSettings,
        counters: Arc<DispatchCounters>,
    ) -> Self {
        Dispatcher {
            egress,
            store,
            directory,
            settings,
            counters,
        }
    }

    /// Runs until `shutdown`: stops taking work, waits for attempts in
    /// flight (up to the drain timeout) and records their results.
    pub async fn run(
        self,
        mut jobs: mpsc::Receiver<DeliveryJob>,
        shutdown: CancellationToken,
    ) -> Result<(), DispatchError> {
        let (record_tx, record_rx) = mpsc::channel::<Record>(8192);
        let recorder = tokio::spawn(recorder(
            self.store.clone(),
            record_rx,
            self.counters.clone(),
        ));
        let (claimed_tx, mut claimed_rx) = mpsc::channel::<Vec<DeliveryJob>>(4);
        let sweep_stop = CancellationToken::new();
        let sweeper = tokio::spawn(sweeper(
            self.store.clone(),
            self.settings.clone(),
            claimed_tx,
            sweep_stop.clone(),
        ));

        let mut sched = Scheduler::default();
        let mut attempts: JoinSet<Finished> = JoinSet::new();
        let mut draining: Option<Instant> = None;
        let far = Duration::from_secs(3600);

        loop {
            let now = Timestamp::now();
            sched.release_due(now);
            if draining.is_none() {
                self.start_attempts(&mut sched, &mut attempts, &record_tx)
                    .await;
            }
            if let Some(since) = draining
                && (attempts.is_empty() || since.elapsed() >= self.settings.drain_timeout)
            {
                break;
            }
            let wait = sched
                .next_due()
                .map(|t| t.since(Timestamp::now()))
                .unwrap_or(far)
                .min(far);
            let room = sched.held() < self.settings.max_held && draining.is_none();
            tokio::select! {
                _ = shutdown.cancelled(), if draining.is_none() => {
                    tracing::info!(in_flight = attempts.len(), "dispatch draining");
                    draining = Some(Instant::now());
                    sweep_stop.cancel();
                }
                Some(done) = attempts.join_next(), if !attempts.is_empty() => {
                    match done {
                        Ok(f) => self.on_finished(&mut sched, f, &record_tx).await,
                        Err(e) => tracing::error!(error = %e, "an attempt task failed"),
                    }
                }
                job = jobs.recv(), if room => match job {
                    Some(job) => sched.add(job, Timestamp::now()),
                    None => {
                        draining.get_or_insert_with(Instant::now);
                        sweep_stop.cancel();
                    }
                },
                Some(batch) = claimed_rx.recv(), if room => {
                    let now = Timestamp::now();
                    for job in batch {
                        sched.add(job, now);
                    }
                }
                _ = tokio::time::sleep(wait), if draining.is_none() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)), if draining.is_some() => {}
            }
        }
        if !attempts.is_empty() {
            tracing::warn!(
                in_flight = attempts.len(),
                "attempts still in flight at shutdown; they will be retried"
            );
            attempts.abort_all();
        }
        sweep_stop.cancel();
        let _ = sweeper.await;
        drop(record_tx);
        match recorder.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "the recorder failed");
                Ok(())
            }
        }
    }

    async fn start_attempts(
        &self,
        sched: &mut Scheduler,
        attempts: &mut JoinSet<Finished>,
        record_tx: &mpsc::Sender<Record>,
    ) {
        let directory = self.directory.snapshot();
        let default_cap = self.settings.endpoint_max_in_flight;
        loop {
            let job = sched.next_job(self.settings.max_in_flight, |id| {
                directory
                    .endpoint(id)
                    .and_then(|e| e.max_in_flight)
                    .unwrap_or(default_cap)
                    .max(1)
            });
            let Some(mut job) = job else {
                return;
            };
            if let Some(lease) = sched.lease(&job.delivery_id) {
                job.lease_version = lease;
            }
            let now = Timestamp::now();
            let endpoint = directory.endpoint(&job.endpoint_id).cloned();
            let usable = endpoint
                .as_ref()
                .filter(|e| e.enabled && !e.secrets.is_empty());
            let Some(endpoint) = usable else {
                sched.finished(job.endpoint_id, job.delivery_id);
                if endpoint.is_none() || now >= job.expires_at {
                    // Deleted, or paused past its deadline: it ends here.
                    let status = if endpoint.is_none() {
                        DeliveryStatus::Cancelled
                    } else {
                        DeliveryStatus::Exhausted
                    };
                    let reason = if endpoint.is_none() {
                        "endpoint_deleted"
                    } else {
                        "deadline_while_paused"
                    };
                    let _ = record_tx
                        .send(Record::Transition(Transition {
                            delivery_id: job.delivery_id,
                            lease_version: job.lease_version,
                            status,
                            reason,
                        }))
                        .await;
                } else {
                    // Disabled: the delivery stays pending and visible.
                    let at = now.plus(self.settings.pause_recheck);
                    sched.reschedule(job, at);
                }
                continue;
            };
            let number = job.attempt_count + 1;
            let url = endpoint.url.clone();
            let secrets = endpoint.secrets.clone();
            let config_version = endpoint.config_version;
            let egress = self.egress.clone();
            attempts.spawn(async move {
                let started_at = Timestamp::now();
                let request =
                    build_request(&job, &url, &secrets, number, started_at.unix_seconds());
                let result = egress.send(request).await;
                Finished {
                    job,
                    number,
                    config_version,
                    started_at,
                    finished_at: Timestamp::now(),
                    result,
                }
            });
        }
    }

    async fn on_finished(
        &self,
        sched: &mut Scheduler,
        f: Finished,
        record_tx: &mpsc::Sender<Record>,
    ) {
        let job = f.job;
        sched.finished(job.endpoint_id, job.delivery_id);
        let policy = &self.settings.retry;
        let state = DeliveryState {
            status: DeliveryStatus::Pending,
            attempts: job.attempt_count,
            created_at: job.created_at,
            expires_at: job.expires_at,
            next_attempt_at: job.next_attempt_at,
        };
        let next = state.next(
            &f.result.outcome,
            policy,
            f.finished_at,
            rand::random::<f64>(),
        );
        self.counters.attempts.fetch_add(1, Ordering::Relaxed);
        if f.number > 1 {
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        match next.status {
            DeliveryStatus::Succeeded => {
                self.counters.succeeded.fetch_add(1, Ordering::Relaxed);
            }
            DeliveryStatus::Failed | DeliveryStatus::Exhausted => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if let AttemptOutcome::Retryable { class, .. } = f.result.outcome {
            tracing::debug!(delivery_id = %job.delivery_id, attempt = f.number, class = class.as_str(), "attempt failed; retrying");
        }
        let hold = next.status == DeliveryStatus::Pending
            && next.next_attempt_at.since(Timestamp::now()) <= self.settings.hold_horizon;
        let record = AttemptRecord {
            attempt_id: AttemptId::derive(job.delivery_id, f.number),
            delivery_id: job.delivery_id,
            endpoint_id: job.endpoint_id,
            tenant_id: job.tenant_id.clone(),
            number: f.number,
            trigger: Trigger::Auto,
            endpoint_config_version: f.config_version,
            started_at: f.started_at,
            finished_at: f.finished_at,
            http_status: f.result.outcome.status(),
            outcome: f.result.outcome.name(),
            error_class: f.result.outcome.error_class().map(ErrorClass::as_str),
            response_sha256: f.result.response_sha256,
            response_excerpt: f.result.response_excerpt.clone(),
            status: next.status,
            attempt_count: next.attempts,
            next_attempt_at: next.next_attempt_at,
            lease_version: job.lease_version,
            hold_until: hold.then(|| next.next_attempt_at.plus(self.settings.lease)),
        };
        let _ = record_tx.send(Record::Attempt(record)).await;
        if hold {
            let mut job = job;
            job.attempt_count = next.attempts;
            sched.reschedule(job, next.next_attempt_at);
        }
    }
}

enum Record {
    Attempt(AttemptRecord),
    Transition(Transition),
}

/// Writes results in batches; retries transient errors (never drops one).
async fn recorder<S: DispatchStore>(
    store: Arc<S>,
    mut rx: mpsc::Receiver<Record>,
    counters: Arc<DispatchCounters>,
) -> Result<(), DispatchError> {
    const BATCH: usize = 1000;
    let mut attempts: Vec<AttemptRecord> = Vec::with_capacity(BATCH);
    let mut transitions: Vec<Transition> = Vec::new();
    loop {
        let Some(first) = rx.recv().await else {
            return Ok(());
        };
        let push = |r: Record,
                    attempts: &mut Vec<AttemptRecord>,
                    transitions: &mut Vec<Transition>| match r {
            Record::Attempt(a) => attempts.push(a),
            Record::Transition(t) => transitions.push(t),
        };
        push(first, &mut attempts, &mut transitions);
        while attempts.len() + transitions.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => push(r, &mut attempts, &mut transitions),
                Err(_) => break,
            }
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            let result = async {
                let stale = if attempts.is_empty() {
                    Vec::new()
                } else {
                    store.record(&attempts).await?
                };
                if !transitions.is_empty() {
                    store.transition(&transitions).await?;
                }
                Ok::<Vec<DeliveryId>, StoreError>(stale)
            }
            .await;
            match result {
                Ok(stale) => {
                    if !stale.is_empty() {
                        counters
                            .stale
                            .fetch_add(stale.len() as u64, Ordering::Relaxed);
                        tracing::warn!(
                            count = stale.len(),
                            "results of deliveries whose lease moved on were not applied"
                        );
                    }
                    break;
                }
                Err(e) if e.transient => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "could not record attempts; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
        attempts.clear();
        transitions.clear();
    }
}

/// Claims due deliveries: first everything this node held before a restart,
/// then, every interval, whatever is due with an expired lease.
async fn sweeper<S: DispatchStore>(
    store: Arc<S>,
    settings: DispatchSettings,
    out: mpsc::Sender<Vec<DeliveryJob>>,
    stop: CancellationToken,
) {
    let mut reclaim_own = true;
    loop {
        loop {
            match store
                .claim_due(
                    &settings.node_id,
                    settings.sweep_batch,
                    settings.lease,
                    reclaim_own,
                )
                .await
            {
                Ok(jobs) => {
                    let full = jobs.len() >= settings.sweep_batch;
                    if !jobs.is_empty() {
                        tracing::debug!(count = jobs.len(), reclaim_own, "claimed due deliveries");
                        if out.send(jobs).await.is_err() {
                            return;
                        }
                    }
                    if !full {
                        reclaim_own = false;
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim due deliveries");
                    break;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}
