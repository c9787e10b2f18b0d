//! The in-memory schedule of one dispatcher: who is due, who may go next.
//!
//! ```text
//!  timers (due jobs, parked endpoints)
//!        │ due
//!        ▼
//!  endpoint: fresh FIFO + retry FIFO ── eligible? (jobs, in-flight < cap, circuit admits, token)
//!        │                                   │ no: park until the circuit or bucket allows
//!        ▼                                   ▼
//!  tenant: ring of eligible endpoints ── tenant in-flight < tenant budget?
//!        │
//!        ▼
//!  tenants with work, ordered by attempts in flight per unit of weight:
//!  the next free slot goes to the tenant that holds the fewest for its
//!  weight (weighted max-min fairness)
//! ```
//!
//! A tenant's weight (`tenants.weight`, 1 to 1,000, default 1) is its share:
//! under contention, tenants with work hold slots in proportion to their
//! weights (weight 3 holds three slots for every one of a tenant of weight
//! 1), each still within the tenant budget.
//!
//! Tenants share by concurrency, not by turns: a tenant whose attempts are
//! slow (timeouts, 5xx after long waits) would win a turn-based share of
//! slot-time, so each freed slot goes to the tenant with the fewest attempts
//! in flight, and a healthy tenant that needs two slots gets them while a
//! noisy one holds ten. One slow or broken endpoint can hold at most its
//! in-flight cap; one tenant with thousands of bad endpoints at most its
//! tenant budget; an open circuit holds nothing. Within an endpoint, new deliveries go first and retries get
//! one turn in `retry_share`, so new work never waits behind a retry storm
//! beyond that bound, and retries are never starved. Nothing here does I/O
//! or reads a clock: every call takes `now`.
//!
//! An endpoint with per-object ordering gets one more gate before its
//! queues: of one object's deliveries only the earliest in commit order (the
//! chain's head) is scheduled; the rest wait in the chain, in order, and the
//! next becomes the head once the head ends (succeeded, failed, exhausted,
//! cancelled). A head that is retried stays the head. When an earlier
//! delivery arrives after a later one (claimed back from Postgres in another
//! order), it takes the head's place unless the head's attempt is already
//! out.
//!
//! The parts: this file holds the schedule's state and a held delivery's
//! way through it (added, waiting on a timer, cancelled, rescheduled,
//! finished); `pick` the rings of ready endpoints and tenants and the
//! pick of the next job; `chain` the per-object chains of ordered
//! endpoints.

mod chain;
mod pick;
#[cfg(test)]
pub(crate) mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};

use self::chain::{Chain, ChainKey};
use super::breaker::{BreakerConfig, Circuit, Health, Transition};
use super::bucket::TokenBucket;
use super::observe::Throttle;
use crate::delivery::DeliveryJob;
use crate::ids::{DeliveryId, EndpointId, TenantId};
use crate::time::Timestamp;

/// The largest tenant weight (the API's bound).
pub const MAX_WEIGHT: u32 = 1000;

/// Scheduler settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Attempts in flight at most.
    pub max_in_flight: usize,
    /// Attempts in flight per tenant at most.
    pub tenant_max_in_flight: u32,
    /// Of consecutive picks at an endpoint with both kinds waiting, one in
    /// this many goes to a retry.
    pub retry_share: u32,
    /// The circuit breaker.
    pub breaker: BreakerConfig,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_in_flight: 512,
            tenant_max_in_flight: 128,
            retry_share: 4,
            breaker: BreakerConfig::default(),
        }
    }
}

/// An endpoint's limits, from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Attempts in flight at most.
    pub max_in_flight: u32,
    /// Requests per second, if limited.
    pub rate_per_sec: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Timer {
    Job(DeliveryId),
    Wake(EndpointId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Not in its tenant's ring (no jobs, at its cap, or probe out).
    Idle,
    /// In its tenant's ring.
    Ready,
    /// Waiting for its circuit or bucket until a wake timer.
    Parked,
}

#[derive(Debug)]
struct Endpoint {
    tenant: TenantId,
    fresh: VecDeque<DeliveryJob>,
    retries: VecDeque<DeliveryJob>,
    picks: u32,
    in_flight: u32,
    bucket: Option<TokenBucket>,
    circuit: Circuit,
    place: Place,
}

impl Endpoint {
    fn queued(&self) -> usize {
        self.fresh.len() + self.retries.len()
    }
}

#[derive(Debug, Default)]
struct Tenant {
    ready: VecDeque<EndpointId>,
    in_flight: u32,
    /// Its key in the set of tenants with work, when it is there.
    queued_as: Option<(u64, u64)>,
}

/// What the scheduler reports about an endpoint after a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointReport {
    /// A circuit change, if any.
    pub transition: Option<Transition>,
    /// The circuit now.
    pub circuit: Circuit,
}

/// The schedule.
#[derive(Debug, Default)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    endpoints: HashMap<EndpointId, Endpoint>,
    tenants: HashMap<TenantId, Tenant>,
    /// Tenants with ready endpoints: (in flight per unit of weight, arrival
    /// order, tenant).
    ready_tenants: BTreeSet<(u64, u64, TenantId)>,
    /// Tenants' weights other than 1.
    weights: HashMap<TenantId, u32>,
    /// Tenants' own in-flight budgets, where set.
    budgets: HashMap<TenantId, u32>,
    /// Waits for a limit since [`Scheduler::take_throttles`] was last
    /// called, by tenant and limit (metrics).
    throttles: HashMap<(TenantId, Throttle), u64>,
    timers: BinaryHeap<Reverse<(Timestamp, u64, Timer)>>,
    waiting: HashMap<DeliveryId, DeliveryJob>,
    /// Automatic deliveries held (waiting, queued, in flight, or waiting in
    /// a chain) and their lease.
    held: HashMap<DeliveryId, i64>,
    /// Endpoints with per-object ordering.
    ordered: HashSet<EndpointId>,
    /// Their objects with deliveries held here.
    chains: HashMap<ChainKey, Chain>,
    /// Every delivery in a chain (head or waiting in it), and its chain.
    in_chain: HashMap<DeliveryId, ChainKey>,
    /// Chains whose head may have ended: looked at before the next pick.
    settle: Vec<ChainKey>,
    /// Deliveries that became their chain's head after an earlier one
    /// ended without success, until their first attempt is recorded.
    after_failure: HashSet<DeliveryId>,
    seq: u64,
    in_flight: usize,
}

impl Scheduler {
    /// An empty schedule.
    pub fn new(cfg: SchedulerConfig) -> Self {
        Scheduler {
            cfg,
            ..Scheduler::default()
        }
    }

    /// The waits for limits since the last call, by tenant and limit.
    pub fn take_throttles(&mut self) -> Vec<(TenantId, Throttle, u64)> {
        if self.throttles.is_empty() {
            return Vec::new();
        }
        self.throttles
            .drain()
            .map(|((tenant, limit), n)| (tenant, limit, n))
            .collect()
    }

    /// Automatic deliveries held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Whether automatic delivery `id` is held.
    pub fn holds(&self, id: &DeliveryId) -> bool {
        self.held.contains_key(id)
    }

    /// The lease a held delivery is under.
    pub fn lease(&self, id: &DeliveryId) -> Option<i64> {
        self.held.get(id).copied()
    }

    /// Jobs queued (not waiting, not in flight) at `endpoint`.
    pub fn queued_at(&self, endpoint: &EndpointId) -> usize {
        self.endpoints.get(endpoint).map_or(0, Endpoint::queued)
    }

    /// The circuit of `endpoint`.
    pub fn circuit(&self, endpoint: &EndpointId) -> Circuit {
        self.endpoints
            .get(endpoint)
            .map(|e| e.circuit)
            .unwrap_or_default()
    }

    /// Restores a circuit after a restart.
    pub fn restore_circuit(&mut self, endpoint: EndpointId, tenant: TenantId, circuit: Circuit) {
        self.endpoint_mut(endpoint, &tenant).circuit = circuit;
    }

    fn endpoint_mut(&mut self, id: EndpointId, tenant: &TenantId) -> &mut Endpoint {
        self.endpoints.entry(id).or_insert_with(|| Endpoint {
            tenant: tenant.clone(),
            fresh: VecDeque::new(),
            retries: VecDeque::new(),
            picks: 0,
            in_flight: 0,
            bucket: None,
            circuit: Circuit::default(),
            place: Place::Idle,
        })
    }

    fn timer(&mut self, at: Timestamp, t: Timer) {
        self.seq += 1;
        self.timers.push(Reverse((at, self.seq, t)));
    }

    /// Adds an automatic job; a delivery already held only takes the newer
    /// lease.
    pub fn add(&mut self, job: DeliveryJob, now: Timestamp) {
        if let Some(lease) = self.held.get_mut(&job.delivery_id) {
            *lease = (*lease).max(job.lease_version);
            return;
        }
        self.held.insert(job.delivery_id, job.lease_version);
        let job = match self.chain_key(&job) {
            Some(key) => match self.join_chain(key, job) {
                Some(head) => head,
                None => return,
            },
            None => job,
        };
        self.schedule(job, now);
    }

    /// Queues `job`, or lets it wait for its time.
    fn schedule(&mut self, job: DeliveryJob, now: Timestamp) {
        if job.next_attempt_at > now {
            self.timer(job.next_attempt_at, Timer::Job(job.delivery_id));
            self.waiting.insert(job.delivery_id, job);
        } else {
            self.enqueue(job);
        }
    }

    /// Takes automatic delivery `id` out of the waiting set or its
    /// endpoint's queue.
    fn unschedule(&mut self, id: &DeliveryId) -> Option<DeliveryJob> {
        if let Some(job) = self.waiting.remove(id) {
            return Some(job);
        }
        for ep in self.endpoints.values_mut() {
            for q in [&mut ep.fresh, &mut ep.retries] {
                if let Some(i) = q
                    .iter()
                    .position(|j| j.delivery_id == *id && j.replay.is_none())
                {
                    return q.remove(i);
                }
            }
        }
        None
    }

    /// Forgets automatic delivery `id` (cancelled): it leaves the held set,
    /// the waiting set and its endpoint's queue, so it is never started
    /// again. Returns whether it was held. An attempt of it already out
    /// still finishes (the caller must not reschedule it).
    pub fn cancel(&mut self, id: &DeliveryId) -> bool {
        let held = self.held.remove(id).is_some();
        if !held {
            return false;
        }
        if let Some(key) = self.in_chain.get(id).cloned()
            && let Some(chain) = self.chains.get_mut(&key)
            && chain.head != *id
        {
            // Waiting behind the head: it leaves the chain.
            let pos = chain
                .blocked
                .iter()
                .find(|(_, j)| j.delivery_id == *id)
                .map(|(p, _)| *p);
            if let Some(pos) = pos {
                chain.blocked.remove(&pos);
            }
            self.in_chain.remove(id);
            return true;
        }
        self.unsettle(id);
        if self.waiting.remove(id).is_none() {
            // Queued, or in flight: drop it from its endpoint's queue.
            for ep in self.endpoints.values_mut() {
                let keep = |j: &DeliveryJob| j.delivery_id != *id || j.replay.is_some();
                ep.fresh.retain(keep);
                ep.retries.retain(keep);
            }
        }
        true
    }

    /// Adds a manual job (a replay): queued at once with new work, not held
    /// (the automatic schedule of the delivery is not touched).
    pub fn add_manual(&mut self, job: DeliveryJob) {
        self.enqueue(job);
    }

    /// Puts a held automatic job back to wait until `at`.
    pub fn reschedule(&mut self, mut job: DeliveryJob, at: Timestamp) {
        job.next_attempt_at = at;
        self.held
            .entry(job.delivery_id)
            .or_insert(job.lease_version);
        self.timer(at, Timer::Job(job.delivery_id));
        self.waiting.insert(job.delivery_id, job);
    }

    /// The next time a timer fires.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.timers.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Fires every timer due at `now`.
    pub fn release_due(&mut self, now: Timestamp) {
        self.settle_chains(now);
        while let Some(Reverse((t, _, timer))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            match timer {
                Timer::Job(id) => {
                    if let Some(job) = self.waiting.remove(&id) {
                        if job.next_attempt_at > now {
                            // An older timer of a job that waits again.
                            self.waiting.insert(id, job);
                        } else {
                            self.enqueue(job);
                        }
                    }
                }
                Timer::Wake(id) => {
                    if let Some(ep) = self.endpoints.get_mut(&id)
                        && ep.place == Place::Parked
                    {
                        ep.place = Place::Idle;
                        self.activate(id);
                    }
                }
            }
        }
    }

    /// An attempt at `endpoint` finished with `health`; `delivery` is
    /// released from the held set unless the caller reschedules it (manual
    /// jobs pass `None`).
    pub fn finished(
        &mut self,
        endpoint: EndpointId,
        delivery: Option<DeliveryId>,
        health: Health,
        now: Timestamp,
    ) -> EndpointReport {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(d) = delivery {
            self.held.remove(&d);
            self.unsettle(&d);
        }
        let cfg = self.cfg.breaker.clone();
        let Some(ep) = self.endpoints.get_mut(&endpoint) else {
            return EndpointReport {
                transition: None,
                circuit: Circuit::default(),
            };
        };
        ep.in_flight = ep.in_flight.saturating_sub(1);
        let transition = ep.circuit.record(health, now, &cfg);
        let circuit = ep.circuit;
        let tenant_id = ep.tenant.clone();
        if let Some(t) = self.tenants.get_mut(&tenant_id) {
            t.in_flight = t.in_flight.saturating_sub(1);
        }
        self.queue_tenant(&tenant_id);
        if let Some(Transition::Opened(until)) = transition {
            // Whatever is queued waits for the probe.
            if let Some(ep) = self.endpoints.get_mut(&endpoint)
                && ep.place == Place::Idle
            {
                ep.place = Place::Parked;
                self.timer(until, Timer::Wake(endpoint));
            }
        } else {
            self.activate(endpoint);
        }
        self.queue_tenant(&tenant_id);
        // Drop empty state so memory follows the work.
        if let Some(ep) = self.endpoints.get(&endpoint)
            && ep.queued() == 0
            && ep.in_flight == 0
            && ep.place == Place::Idle
            && matches!(ep.circuit, Circuit::Closed { failures: 0 })
        {
            self.endpoints.remove(&endpoint);
        }
        EndpointReport {
            transition,
            circuit,
        }
    }
}
