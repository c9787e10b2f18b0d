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
//!
//! The recorder and the sweeper are watched: if either ends while dispatch
//! runs, dispatch stops with an error naming it (results it could not write
//! are attempted again after the restart). Attempt numbers are one sequence
//! per delivery across automatic and manual attempts ([`numbering`]); a
//! manual attempt that succeeds ends the automatic schedule (one already
//! out finishes and is recorded, none follows; docs/scheduling.md). At a
//! clean stop, attempts still in flight after the drain timeout are recorded
//! with an unknown outcome; after an unclean one, the next attempt of every
//! reclaimed delivery notes that an earlier one may have gone out.

pub mod breaker;
pub mod bucket;
pub mod clock;
pub mod egress;
mod health;
#[cfg(test)]
mod isolation_tests;
#[cfg(test)]
mod model_tests;
pub mod numbering;
pub mod observe;
#[cfg(test)]
mod ordering_tests;
pub mod outcome;
pub mod recorder;
pub mod scheduler;
pub mod sweeper;
pub mod verify;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use self::breaker::{BreakerConfig, Circuit, Health};
use self::clock::Clock;
use self::egress::{Egress, EgressResult, build_request};
use self::numbering::Numbering;
use self::observe::{AttemptObserver, AttemptSeen, NoObserver};
use self::outcome::{AttemptOutcome, ErrorClass};
use self::recorder::Record;
use self::scheduler::{Limits, Scheduler, SchedulerConfig};
use self::sweeper::Claimed;
use crate::delivery::{
    ATTEMPT_NOTE_PREDECESSOR_FAILED, ATTEMPT_NOTE_UNKNOWN, AttemptRecord, DeliveryJob,
    DeliveryStatus, Trigger,
};
use crate::endpoint::SubscriptionCache;
use crate::ids::{AttemptId, EndpointId};
use crate::retry::{DeliveryState, RetryOverride, RetryPolicy};
use crate::signing::VersionedSecret;
use crate::store::{DispatchStore, Release, StoreError, Transition};
use crate::time::Timestamp;

/// How long dispatch waits for the endpoint directory to catch up with
/// deliveries claimed from Postgres (see `catch_up_directory`).
const DIRECTORY_CATCH_UP: Duration = Duration::from_secs(5);

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
    /// Attempts in flight per tenant at most.
    pub tenant_max_in_flight: u32,
    /// Jobs queued in memory per endpoint whose circuit is open; beyond, new
    /// ones are handed back to Postgres until it may probe (a stuck endpoint
    /// cannot fill memory).
    pub endpoint_max_queued: usize,
    /// The retry schedule.
    pub retry: RetryPolicy,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
    /// An endpoint failing without a success for this long is disabled.
    pub disable_after: Duration,
    /// How long a claim lasts (longer than the request timeout).
    pub lease: Duration,
    /// Retries due sooner than this stay in memory; later ones are released
    /// to be claimed when due.
    pub hold_horizon: Duration,
    /// How often to claim due deliveries and replays.
    pub sweep_interval: Duration,
    /// Deliveries claimed per sweep.
    pub sweep_batch: usize,
    /// Deliveries held in memory before new work waits.
    pub max_held: usize,
    /// How long to wait for attempts in flight at shutdown.
    pub drain_timeout: Duration,
    /// How often a paused delivery (endpoint disabled or not verified) is
    /// looked at again.
    pub pause_recheck: Duration,
    /// How long after a failed ownership check it is sent again.
    pub verification_retry: Duration,
    /// Where time comes from.
    pub clock: Clock,
    /// The dispatcher of one partition of the deliveries topic claims only
    /// that partition's deliveries ([`crate::routing`]); `None`: any.
    pub scope: Option<crate::routing::Scope>,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        DispatchSettings {
            node_id: "local".into(),
            max_in_flight: 512,
            endpoint_max_in_flight: 16,
            tenant_max_in_flight: 128,
            endpoint_max_queued: 2000,
            retry: RetryPolicy::default(),
            breaker: BreakerConfig::default(),
            disable_after: Duration::from_secs(5 * 24 * 3600),
            lease: Duration::from_secs(120),
            hold_horizon: Duration::from_secs(60),
            sweep_interval: Duration::from_secs(1),
            sweep_batch: 1000,
            max_held: 200_000,
            drain_timeout: Duration::from_secs(10),
            pause_recheck: Duration::from_secs(5),
            verification_retry: Duration::from_secs(60),
            clock: Clock::System,
            scope: None,
        }
    }
}

/// Counters for metrics and the demo's summary.
#[derive(Debug, Default)]
pub struct DispatchCounters {
    /// Attempts that were automatic retries.
    pub retries: AtomicU64,
    /// Manual attempts (replays).
    pub manual: AtomicU64,
    /// Deliveries that succeeded.
    pub succeeded: AtomicU64,
    /// Deliveries that failed permanently or ran out of retries.
    pub failed: AtomicU64,
    /// Results not recorded because the lease had moved on.
    pub stale: AtomicU64,
    /// Circuits opened.
    pub circuits_opened: AtomicU64,
    /// Endpoints disabled by dispatch (410, failing too long).
    pub endpoints_disabled: AtomicU64,
    /// Results the platform database refused (incidents; the delivery was
    /// handed back to be attempted again).
    pub unstorable: AtomicU64,
}

/// Why dispatch stopped.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The store failed with an error retrying cannot fix.
    #[error("dispatch: platform database error")]
    Store(#[from] StoreError),
    /// One of dispatch's own tasks ended while dispatch was running.
    #[error("dispatch: the {task} stopped while dispatch was running")]
    TaskEnded {
        /// `recorder` or `sweeper`.
        task: &'static str,
        /// Why, when it said.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

struct Finished {
    job: DeliveryJob,
    number: u32,
    config_version: i32,
    /// The secrets that signed it.
    secrets: Arc<[VersionedSecret]>,
    /// The endpoint's retry overrides when it was sent.
    retry: RetryOverride,
    started_at: Timestamp,
    finished_at: Timestamp,
    result: EgressResult,
}

/// An attempt out, as known before its outcome.
struct InFlight {
    job: DeliveryJob,
    number: u32,
    config_version: i32,
    secrets: Arc<[VersionedSecret]>,
    retry: RetryOverride,
    started_at: Timestamp,
}

/// The dispatcher of one node.
pub struct Dispatcher<E, S> {
    egress: Arc<E>,
    store: Arc<S>,
    directory: Arc<SubscriptionCache>,
    settings: DispatchSettings,
    counters: Arc<DispatchCounters>,
    observer: Arc<dyn AttemptObserver>,
    /// When this run began (wall clock, as fan-out stamps its plans), taken
    /// before the fan-out beside it can make a plan: the restart's retake
    /// leaves this run's own plans alone.
    made_at: Timestamp,
}

/// Mutable state of a run, beside the schedule.
struct RunState {
    sched: Scheduler,
    /// Endpoints failing without a success since then.
    failing_since: HashMap<EndpointId, Timestamp>,
    /// Endpoints we asked to disable (so that we ask once).
    disabling: std::collections::HashSet<EndpointId>,
    /// Shared with the sweeper: endpoints whose deliveries it leaves alone
    /// until their circuit may probe.
    exclude: Arc<Mutex<HashMap<EndpointId, Timestamp>>>,
    /// Attempt numbers started and not yet settled.
    numbering: Numbering,
    /// Attempts out, by task.
    in_flight: HashMap<tokio::task::Id, InFlight>,
    /// The directory epoch the scheduler's tenant weights and budgets come
    /// from.
    weights_epoch: Option<i64>,
    /// Deliveries cancelled while an attempt of theirs was out: when it
    /// finishes it is recorded (as history: the cancel moved the lease on)
    /// and never rescheduled.
    cancelled: std::collections::HashSet<crate::ids::DeliveryId>,
    /// Replay requests accepted and not yet attempted or refused: one
    /// request makes one attempt, even when claimed again.
    replays: std::collections::HashSet<i64>,
}

impl RunState {
    /// Whether an automatic attempt of `id` is out now (a manual one does
    /// not count: it ends on its own).
    fn automatic_attempt_out(&self, id: crate::ids::DeliveryId) -> bool {
        self.in_flight
            .values()
            .any(|f| f.job.delivery_id == id && f.job.replay.is_none())
    }
}

fn health_of(outcome: &AttemptOutcome) -> Health {
    match outcome {
        AttemptOutcome::Delivered { .. } => Health::Success,
        AttemptOutcome::Retryable { .. } => Health::Failure,
        AttemptOutcome::Rejected { .. } | AttemptOutcome::Gone => Health::Neutral,
    }
}

/// Hands `record` to the recorder. When the recorder is gone, the run loop
/// notices its end and stops dispatch with its error; the result is not
/// lost either way: the delivery is still pending under this node's lease
/// and is attempted again after the restart.
async fn send(tx: &mpsc::Sender<Record>, record: Record) {
    if tx.send(record).await.is_err() {
        tracing::error!(
            "the dispatch recorder has stopped; this result will be redone after a restart"
        );
    }
}

fn seen(job: &DeliveryJob, number: u32, started_at: Timestamp) -> AttemptSeen<'_> {
    AttemptSeen {
        job,
        trigger: if job.replay.is_some() {
            Trigger::Manual
        } else {
            Trigger::Auto
        },
        number,
        first: job.replay.is_none() && job.attempt_count == 0,
        started_at,
    }
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
            observer: Arc::new(NoObserver),
            made_at: Timestamp::now(),
        }
    }

    /// The same dispatcher, telling `observer` about every attempt.
    pub fn with_observer(mut self, observer: Arc<dyn AttemptObserver>) -> Self {
        self.observer = observer;
        self
    }

    fn now(&self) -> Timestamp {
        self.settings.clock.now()
    }

    /// Runs until `shutdown`: stops taking work, waits for attempts in
    /// flight (up to the drain timeout) and records their results.
    pub async fn run(
        self,
        mut jobs: mpsc::Receiver<DeliveryJob>,
        shutdown: CancellationToken,
    ) -> Result<(), DispatchError> {
        let node = self.settings.node_id.clone();
        // Whether the previous run of this node drained cleanly decides
        // whether what it held may have had attempts out.
        let previous_clean = match self.store.node_started(&node, self.settings.lease).await {
            Ok(clean) => clean,
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e.chain(), "could not read how this node stopped last; assuming it did not drain");
                false
            }
            Err(e) => return Err(e.into()),
        };
        let (record_tx, record_rx) = mpsc::channel::<Record>(8192);
        let mut recorder = tokio::spawn(recorder::run(
            self.store.clone(),
            record_rx,
            self.counters.clone(),
        ));
        let mut state = RunState {
            sched: Scheduler::new(SchedulerConfig {
                max_in_flight: self.settings.max_in_flight,
                tenant_max_in_flight: self.settings.tenant_max_in_flight,
                retry_share: 4,
                breaker: self.settings.breaker.clone(),
            }),
            failing_since: HashMap::new(),
            disabling: Default::default(),
            exclude: Arc::default(),
            numbering: Numbering::default(),
            in_flight: HashMap::new(),
            weights_epoch: None,
            cancelled: Default::default(),
            replays: Default::default(),
        };
        self.restore_health(&mut state).await;
        let (claimed_tx, mut claimed_rx) = mpsc::channel::<Claimed>(4);
        let sweep_stop = CancellationToken::new();
        let mut sweeper = tokio::spawn(sweeper::run(
            self.store.clone(),
            self.settings.clone(),
            claimed_tx,
            state.exclude.clone(),
            sweeper::Retake {
                after_unknown: !previous_clean,
                before: self.made_at,
            },
            sweep_stop.clone(),
        ));

        let verify_stop = CancellationToken::new();
        let verifier = tokio::spawn(verify::run(
            self.egress.clone(),
            self.store.clone(),
            self.directory.clone(),
            verify::VerifySettings {
                interval: self.settings.sweep_interval,
                retry_every: self.settings.verification_retry,
            },
            verify_stop.clone(),
        ));
        // Stops it on every way out of this function.
        let stop_verifier = verify_stop.drop_guard();

        let mut attempts: JoinSet<Finished> = JoinSet::new();
        let mut draining: Option<Instant> = None;
        let idle = Duration::from_secs(3600);

        loop {
            let now = self.now();
            state.sched.release_due(now);
            if draining.is_none() {
                self.start_attempts(&mut state, &mut attempts, &record_tx)
                    .await;
            }
            if let Some(since) = draining
                && (attempts.is_empty() || since.elapsed() >= self.settings.drain_timeout)
            {
                break;
            }
            let next_due = state.sched.next_due().unwrap_or(now.plus(idle));
            let room = state.sched.held() < self.settings.max_held && draining.is_none();
            tokio::select! {
                _ = shutdown.cancelled(), if draining.is_none() => {
                    tracing::info!(in_flight = attempts.len(), "dispatch draining");
                    draining = Some(Instant::now());
                    sweep_stop.cancel();
                }
                ended = &mut recorder => {
                    return Err(task_ended("recorder", ended));
                }
                ended = &mut sweeper, if !sweep_stop.is_cancelled() => {
                    let ended = ended.map(Ok::<(), DispatchError>);
                    return Err(task_ended("sweeper", ended));
                }
                Some(done) = attempts.join_next_with_id(), if !attempts.is_empty() => {
                    match done {
                        Ok((id, f)) => {
                            state.in_flight.remove(&id);
                            self.on_finished(&mut state, f, &record_tx).await;
                        }
                        Err(e) => {
                            // A panic while sending: the attempt is as good
                            // as one whose outcome is unknown.
                            tracing::error!(error = %e, "an attempt task failed");
                            if let Some(out) = state.in_flight.remove(&e.id()) {
                                self.record_unknown(&mut state, out, &record_tx).await;
                            }
                        }
                    }
                }
                job = jobs.recv(), if room => match job {
                    Some(job) => self.accept(&mut state, job, &record_tx).await,
                    None => {
                        draining.get_or_insert_with(Instant::now);
                        sweep_stop.cancel();
                    }
                },
                Some(claimed) = claimed_rx.recv(), if room => match claimed {
                    Claimed::Due(batch) => {
                        self.catch_up_directory(&batch, Instant::now(), &shutdown).await;
                        for job in batch {
                            self.accept(&mut state, job, &record_tx).await;
                        }
                    }
                    Claimed::Replays(batch) => {
                        for job in batch {
                            if let Some(replay) = job.replay
                                && !state.replays.insert(replay.request_id)
                            {
                                // Claimed again while this node holds it
                                // (claims are renewed while the node lives;
                                // this is the belt): one request, one attempt.
                                tracing::debug!(request = replay.request_id, "a replay request this node holds was claimed again; ignored");
                                continue;
                            }
                            state.numbering.expect(job.delivery_id);
                            state.sched.add_manual(job);
                        }
                    }
                    Claimed::Cancelled(ids) => {
                        for id in ids {
                            if state.sched.cancel(&id) {
                                if state.automatic_attempt_out(id) {
                                    state.cancelled.insert(id);
                                } else {
                                    state.numbering.forget(id);
                                }
                            }
                        }
                    }
                },
                _ = self.settings.clock.wait_until(next_due), if draining.is_none() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)), if draining.is_some() => {}
            }
        }
        if !attempts.is_empty() {
            tracing::warn!(
                in_flight = attempts.len(),
                "attempts still in flight at shutdown: recorded with an unknown outcome; they will be retried"
            );
            attempts.abort_all();
            while attempts.join_next().await.is_some() {}
            let out: Vec<InFlight> = state.in_flight.drain().map(|(_, f)| f).collect();
            for f in out {
                self.record_unknown(&mut state, f, &record_tx).await;
            }
        }
        sweep_stop.cancel();
        drop(stop_verifier);
        if let Err(e) = verifier.await {
            tracing::error!(error = %e, "the endpoint verifier panicked; endpoints waiting for a check were not checked");
        }
        if let Err(e) = (&mut sweeper).await {
            tracing::error!(error = %e, "the sweeper panicked");
        }
        drop(record_tx);
        match recorder.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => {
                return Err(DispatchError::TaskEnded {
                    task: "recorder",
                    source: Some(Box::new(e)),
                });
            }
        }
        // Everything this run started is recorded: the next start of this
        // node need not suspect unrecorded attempts.
        if let Err(e) = self.store.node_stopped(&node).await {
            tracing::warn!(error = %e.chain(), "could not record this node's clean stop; its next start will note possible unrecorded attempts");
        }
        Ok(())
    }

    async fn restore_health(&self, state: &mut RunState) {
        match self.store.load_health().await {
            Ok(all) => {
                for h in all {
                    if let Some(since) = h.failing_since {
                        state.failing_since.insert(h.endpoint_id, since);
                    }
                    if let (Some(until), "open") = (h.open_until, h.circuit) {
                        let cool_down =
                            until.since(self.now()).max(self.settings.breaker.cool_down);
                        state.sched.restore_circuit(
                            h.endpoint_id,
                            h.tenant_id,
                            Circuit::Open { until, cool_down },
                        );
                        state.exclude.lock().insert(h.endpoint_id, until);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not load endpoint health; circuits start closed")
            }
        }
    }

    /// Takes an automatic job into the schedule, or hands it back to
    /// Postgres when its endpoint's circuit is open and its queue is full (a
    /// stuck endpoint must not fill memory). A healthy endpoint's backlog
    /// stays in memory up to `max_held`, beyond which new work waits upstream:
    /// handing it back would only be claimed again, a loop that costs
    /// Postgres everything exactly when it has least to spare.
    async fn accept(
        &self,
        state: &mut RunState,
        job: DeliveryJob,
        record_tx: &mpsc::Sender<Record>,
    ) {
        // The job was planned from a directory at least this new: an
        // endpoint that orders per object must be known as ordered before
        // its first job is placed, or that job would skip its chain.
        self.refresh_directory(state);
        // A job kept in its object's order stays here: handed back, a later
        // delivery of its object could be claimed and sent before it.
        if let Circuit::Open { until, .. } = state.sched.circuit(&job.endpoint_id)
            && !state.sched.holds(&job.delivery_id)
            && !state.sched.orders(&job)
            && state.sched.queued_at(&job.endpoint_id) >= self.settings.endpoint_max_queued
        {
            let release = Release {
                first_write: job.first_write(),
                delivery_id: job.delivery_id,
                lease_version: job.lease_version,
                not_before: until,
            };
            send(record_tx, Record::Release(release)).await;
            return;
        }
        state.sched.add(job, self.now());
    }

    /// Jobs claimed from Postgres may have been planned by another node
    /// under endpoint configurations this node has not read yet (a new
    /// endpoint would look deleted, one switched to per-object ordering
    /// unordered): when any names an endpoint unknown here or a newer
    /// version of one, the directory is read again before they are placed.
    /// Bounded, so that a refresher that cannot reach Postgres delays
    /// dispatch rather than stopping it (it says so).
    async fn catch_up_directory(
        &self,
        batch: &[DeliveryJob],
        claimed: Instant,
        shutdown: &CancellationToken,
    ) {
        let directory = self.directory.snapshot();
        let behind = batch.iter().any(|j| {
            directory
                .endpoint(&j.endpoint_id)
                .is_none_or(|e| e.config_version < j.endpoint_config_version)
        });
        if behind
            && tokio::time::timeout(
                DIRECTORY_CATCH_UP,
                self.directory.fresh_since(claimed, shutdown),
            )
            .await
            .is_err()
        {
            tracing::warn!(
                waited = ?DIRECTORY_CATCH_UP,
                "claimed deliveries name endpoint configurations newer than the directory read here, and reading it again did not finish in time; going on with the one in hand"
            );
        }
    }

    /// Gives the schedule the tenants' weights and budgets and the ordered
    /// endpoints of a newer directory.
    fn refresh_directory(&self, state: &mut RunState) {
        let directory = self.directory.snapshot();
        if state.weights_epoch != Some(directory.epoch) {
            state.weights_epoch = Some(directory.epoch);
            state
                .sched
                .set_tenants(directory.weights().clone(), directory.budgets().clone());
            state
                .sched
                .set_ordered(directory.ordered().clone(), self.now());
        }
    }

    async fn start_attempts(
        &self,
        state: &mut RunState,
        attempts: &mut JoinSet<Finished>,
        record_tx: &mpsc::Sender<Record>,
    ) {
        self.refresh_directory(state);
        let directory = self.directory.snapshot();
        let default_cap = self.settings.endpoint_max_in_flight;
        loop {
            let now = self.now();
            let job = state.sched.next_job(now, |id| {
                let ep = directory.endpoint(id);
                Limits {
                    max_in_flight: ep
                        .and_then(|e| e.max_in_flight)
                        .unwrap_or(default_cap)
                        .max(1),
                    rate_per_sec: ep.and_then(|e| e.rate_limit_per_sec),
                }
            });
            let Some(mut job) = job else {
                for (tenant, limit, times) in state.sched.take_throttles() {
                    self.observer.throttled(&tenant, limit, times);
                }
                return;
            };
            let manual = job.replay;
            if manual.is_none()
                && let Some(lease) = state.sched.lease(&job.delivery_id)
            {
                job.lease_version = lease;
            }
            let endpoint = directory.endpoint(&job.endpoint_id).cloned();
            let usable = endpoint.as_ref().filter(|e| {
                e.enabled
                    && e.quarantine.is_none()
                    && e.verification.is_none()
                    && !e.secrets.is_empty()
            });
            let Some(endpoint) = usable else {
                let held = manual.is_none().then_some(job.delivery_id);
                state
                    .sched
                    .finished(job.endpoint_id, held, Health::Neutral, now);
                let why = match &endpoint {
                    None => "the endpoint was deleted",
                    Some(e) if !e.enabled => "the endpoint is disabled",
                    Some(e) if e.quarantine.is_some() => {
                        "the endpoint is quarantined (its configuration cannot be loaded)"
                    }
                    Some(e) if e.verification.is_some() => {
                        "the endpoint has not passed its ownership check (verification pending)"
                    }
                    Some(_) => "the endpoint has no active secret",
                };
                if let Some(replay) = manual {
                    state.replays.remove(&replay.request_id);
                    let held = state.sched.holds(&job.delivery_id);
                    state.numbering.unexpect(job.delivery_id, held);
                    self.observer.replay_refused(&job);
                    send(
                        record_tx,
                        Record::RejectReplay(replay.request_id, why.into()),
                    )
                    .await;
                } else if endpoint.is_none() || now >= job.expires_at {
                    // Deleted, or paused past its deadline: it ends here.
                    state.numbering.forget(job.delivery_id);
                    let (status, reason) = if endpoint.is_none() {
                        (DeliveryStatus::Cancelled, "endpoint_deleted")
                    } else {
                        (DeliveryStatus::Exhausted, "deadline_while_paused")
                    };
                    if status == DeliveryStatus::Exhausted {
                        self.let_next_in_order_go(state, &job);
                    }
                    self.observer.ended(&job, status, job.attempt_count);
                    send(
                        record_tx,
                        Record::Transition(Transition {
                            first_write: job.first_write(),
                            delivery_id: job.delivery_id,
                            lease_version: job.lease_version,
                            status,
                            reason,
                        }),
                    )
                    .await;
                } else {
                    // Disabled, quarantined or not verified: the delivery
                    // stays pending and visible.
                    state
                        .sched
                        .reschedule(job, now.plus(self.settings.pause_recheck));
                }
                continue;
            };
            let number = state.numbering.start(&job);
            let url = endpoint.url.clone();
            let secrets = endpoint.secrets.clone();
            let config_version = endpoint.config_version;
            let retry = endpoint.retry;
            let egress = self.egress.clone();
            let clock = self.settings.clock.clone();
            let started_at = clock.now();
            self.observer.started(&seen(&job, number, started_at));
            let out = InFlight {
                job: job.clone(),
                number,
                config_version,
                secrets: secrets.clone(),
                retry,
                started_at,
            };
            // Taken (held, leased, numbered) and not sent yet: a crash here
            // must end in the attempt being made after the restart.
            crate::failpoint::hit("dispatch.before_send");
            let handle = attempts.spawn(async move {
                let request =
                    build_request(&job, &url, &secrets, number, started_at.unix_seconds());
                let result = egress.send(request).await;
                // The receiver may have processed the POST; nothing is
                // recorded yet. A crash here must end in a second attempt
                // with the same webhook-id, never in a lost delivery.
                crate::failpoint::hit("dispatch.after_send");
                Finished {
                    job,
                    number,
                    config_version,
                    secrets,
                    retry,
                    started_at,
                    finished_at: clock.now(),
                    result,
                }
            });
            state.in_flight.insert(handle.id(), out);
        }
    }

    /// Records an attempt whose outcome nobody will know (still out at the
    /// end of the drain, or its task failed): the delivery is attempted
    /// again, and the history says this one may have reached the receiver.
    async fn record_unknown(
        &self,
        state: &mut RunState,
        out: InFlight,
        record_tx: &mpsc::Sender<Record>,
    ) {
        let now = self.now();
        let f = Finished {
            job: out.job,
            number: out.number,
            config_version: out.config_version,
            secrets: out.secrets,
            retry: out.retry,
            started_at: out.started_at,
            finished_at: now,
            result: EgressResult::bare(AttemptOutcome::Retryable {
                status: None,
                class: ErrorClass::Shutdown,
                retry_after: None,
            }),
        };
        self.on_finished(state, f, record_tx).await;
    }

    async fn on_finished(
        &self,
        state: &mut RunState,
        mut f: Finished,
        record_tx: &mpsc::Sender<Record>,
    ) {
        // This node may have claimed the delivery again while the attempt
        // was out (another node had taken it over and handed it back): the
        // result is recorded under the newest lease this node holds, so that
        // the delivery is not left owned by this node yet forgotten.
        if f.job.replay.is_none()
            && let Some(newer) = state.sched.lease(&f.job.delivery_id)
        {
            f.job.lease_version = f.job.lease_version.max(newer);
        }
        // The endpoint's (or its tenant's) schedule; a deadline of its own
        // moves the delivery's expiry (written with its first attempt).
        let policy = self.settings.retry.with(&f.retry);
        if f.retry.deadline_seconds.is_some() {
            f.job.expires_at = f.job.created_at.plus(policy.deadline);
        }
        let job = &f.job;
        let outcome = f.result.outcome;
        self.observer
            .finished(&seen(job, f.number, f.started_at), &outcome, f.finished_at);
        let health = health_of(&outcome);
        let manual = job.replay;
        let report = state.sched.finished(
            job.endpoint_id,
            manual.is_none().then_some(job.delivery_id),
            health,
            f.finished_at,
        );
        self.track_health(state, job, health, &report, f.finished_at, record_tx)
            .await;
        if outcome == AttemptOutcome::Gone {
            self.disable(state, job, "the endpoint answered 410 Gone", record_tx)
                .await;
        }

        let base = AttemptRecord {
            attempt_id: AttemptId::derive(job.delivery_id, f.number),
            delivery_id: job.delivery_id,
            endpoint_id: job.endpoint_id,
            tenant_id: job.tenant_id.clone(),
            number: f.number,
            trigger: if manual.is_some() {
                Trigger::Manual
            } else {
                Trigger::Auto
            },
            endpoint_config_version: f.config_version,
            secret_versions: f.secrets.iter().map(|s| s.version).collect(),
            event_occurred_at: job.event_occurred_at,
            delivery_created_at: job.created_at,
            started_at: f.started_at,
            finished_at: f.finished_at,
            http_status: outcome.status(),
            outcome: outcome.name(),
            error_class: outcome.error_class().map(ErrorClass::as_str),
            response_sha256: f.result.response_sha256,
            response_excerpt: f.result.response_excerpt.clone(),
            status: DeliveryStatus::Pending,
            attempt_count: job.attempt_count,
            next_attempt_at: job.next_attempt_at,
            lease_version: job.lease_version,
            hold_until: None,
            replay_request: manual.map(|r| r.request_id),
            note: if job.after_unknown {
                Some(ATTEMPT_NOTE_UNKNOWN)
            } else if manual.is_none() && state.sched.take_after_failure(&job.delivery_id) {
                Some(ATTEMPT_NOTE_PREDECESSOR_FAILED)
            } else {
                None
            },
            first_write: job.first_write().map(|mut w| {
                if self.settings.scope.is_some() {
                    w.holder = Some(self.settings.node_id.clone());
                }
                w
            }),
        };
        if let Some(replay) = manual {
            // A failed replay leaves the automatic schedule as it is; a
            // successful one ends it (the store ends the delivery as
            // succeeded with this record).
            state.replays.remove(&replay.request_id);
            self.counters.manual.fetch_add(1, Ordering::Relaxed);
            if matches!(outcome, AttemptOutcome::Delivered { .. }) {
                self.end_schedule(state, job);
            }
            let held = state.sched.holds(&job.delivery_id);
            state.numbering.finish(job.delivery_id, held);
            send(record_tx, Record::Attempt(base)).await;
            return;
        }
        if f.number > 1 {
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        let before = DeliveryState {
            status: DeliveryStatus::Pending,
            attempts: job.attempt_count,
            created_at: job.created_at,
            expires_at: job.expires_at,
            next_attempt_at: job.next_attempt_at,
        };
        let next = before.next(&outcome, &policy, f.finished_at, rand::random::<f64>());
        if next.status.is_terminal() {
            self.observer.ended(&f.job, next.status, next.attempts);
        }
        if matches!(
            next.status,
            DeliveryStatus::Failed | DeliveryStatus::Exhausted
        ) {
            self.let_next_in_order_go(state, &f.job);
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
        let cancelled = state.cancelled.remove(&f.job.delivery_id);
        // A delivery kept in its object's order is held however far its
        // retry is: released, the next of its object would go first.
        let hold = next.status == DeliveryStatus::Pending
            && !cancelled
            && (next.next_attempt_at.since(f.finished_at) <= self.settings.hold_horizon
                || state.sched.orders(&f.job));
        let record = AttemptRecord {
            status: next.status,
            attempt_count: next.attempts,
            next_attempt_at: next.next_attempt_at,
            hold_until: hold.then(|| next.next_attempt_at.plus(self.settings.lease)),
            ..base
        };
        send(record_tx, Record::Attempt(record)).await;
        state.numbering.finish(f.job.delivery_id, hold);
        if hold {
            let mut job = f.job;
            job.attempt_count = next.attempts;
            // Recorded now: the next attempt follows this one, and the
            // delivery has its row.
            job.after_unknown = false;
            job.materialized = true;
            state.sched.reschedule(job, next.next_attempt_at);
        }
    }
}

impl<E, S> Dispatcher<E, S> {
    /// A manual attempt of `job`'s delivery succeeded: no automatic attempt
    /// follows. The delivery leaves the schedule (waiting, queued, or in its
    /// object's chain, whose next delivery then goes); an automatic attempt
    /// already out finishes and is recorded as history, never rescheduled.
    /// Replays are claimed only by the node that holds the delivery (or
    /// when no live node does), and claims of due deliveries skip one whose
    /// replay is claimed, so this node's schedule is the only one to end.
    fn end_schedule(&self, state: &mut RunState, job: &DeliveryJob) {
        let id = job.delivery_id;
        if !state.sched.cancel(&id) {
            return;
        }
        let out = state.automatic_attempt_out(id);
        if out {
            state.cancelled.insert(id);
        }
        tracing::info!(delivery = %id, endpoint = %job.endpoint_id, auto_attempt_out = out, "a manual attempt succeeded; the automatic schedule of the delivery ends");
    }

    /// A delivery ended without success: when later deliveries of its
    /// object wait behind it, the next goes now (its first attempt notes
    /// [`ATTEMPT_NOTE_PREDECESSOR_FAILED`]).
    fn let_next_in_order_go(&self, state: &mut RunState, job: &DeliveryJob) {
        let waiting = state.sched.head_failed(&job.delivery_id);
        if waiting > 0 {
            tracing::warn!(
                delivery = %job.delivery_id,
                endpoint = %job.endpoint_id,
                object = job.order.as_ref().map(|o| &*o.object_id),
                waiting,
                "a delivery kept in its object's order ended without success; the next delivery of the object goes without it"
            );
        }
    }
}

/// The error for a dispatch task that ended while dispatch ran.
fn task_ended(
    task: &'static str,
    ended: Result<Result<(), DispatchError>, tokio::task::JoinError>,
) -> DispatchError {
    let source: Option<Box<dyn std::error::Error + Send + Sync>> = match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(Box::new(e)),
        Err(e) => Some(Box::new(e)),
    };
    let err = DispatchError::TaskEnded { task, source };
    tracing::error!(error = %crate::supervise::error_chain(&err), "dispatch stops");
    err
}
