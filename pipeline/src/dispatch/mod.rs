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
//!
//! The dispatcher's own files: this one holds its settings, counters,
//! errors and the state of a run; `run` the loop that feeds the schedule
//! and watches the tasks beside it; `intake` how jobs enter the schedule;
//! `attempt` how an attempt starts and goes out; `finished` what follows
//! its result; `health` endpoint health, circuits and disabling.

mod attempt;
pub mod breaker;
pub mod bucket;
pub mod clock;
pub mod egress;
mod finished;
mod health;
mod intake;
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
mod run;
pub mod scheduler;
pub mod sweeper;
#[cfg(test)]
mod takeover_tests;
pub mod verify;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;

use self::attempt::InFlight;
use self::breaker::BreakerConfig;
use self::clock::Clock;
use self::egress::Egress;
use self::numbering::Numbering;
use self::observe::{AttemptObserver, NoObserver};
use self::recorder::Record;
use self::scheduler::Scheduler;
use crate::endpoint::SubscriptionCache;
use crate::ids::EndpointId;
use crate::retry::RetryPolicy;
use crate::store::{DispatchStore, StoreError};
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
}
