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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::breaker::{BreakerConfig, Circuit, Health, Transition};
use super::bucket::TokenBucket;
use super::observe::Throttle;
use crate::delivery::DeliveryJob;
use crate::event::EventKey;
use crate::ids::{DeliveryId, EndpointId, TenantId};
use crate::time::Timestamp;

/// The largest tenant weight (the API's bound).
pub const MAX_WEIGHT: u32 = 1000;

/// A tenant's place among tenants with work: attempts in flight per unit of
/// weight, scaled so that weights up to [`MAX_WEIGHT`] order exactly.
fn share_key(in_flight: u32, weight: u32) -> u64 {
    u64::from(in_flight) * u64::from(MAX_WEIGHT) * 1000 / u64::from(weight.max(1))
}

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

/// One object at an endpoint with per-object ordering.
type ChainKey = (EndpointId, Arc<str>);

/// A delivery's place in its chain: commit order, then the id (two capture
/// sources may share a position).
type ChainPos = (EventKey, DeliveryId);

/// The deliveries of one object at an ordered endpoint that this node holds.
#[derive(Debug)]
struct Chain {
    /// The one that may be attempted (queued, waiting or in flight).
    head: DeliveryId,
    head_pos: ChainPos,
    /// Whether an attempt of the head is out (it can no longer give way to
    /// an earlier delivery).
    head_out: bool,
    /// Whether the head ended without success: the next one goes, and its
    /// first attempt says so.
    head_failed: bool,
    /// The later ones, in commit order.
    blocked: BTreeMap<ChainPos, DeliveryJob>,
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

    /// The chain an automatic job of an ordered endpoint belongs to.
    fn chain_key(&self, job: &DeliveryJob) -> Option<ChainKey> {
        if self.ordered.is_empty()
            || job.replay.is_some()
            || !self.ordered.contains(&job.endpoint_id)
        {
            return None;
        }
        job.order
            .as_ref()
            .map(|o| (job.endpoint_id, o.object_id.clone()))
    }

    /// Puts `job` into its chain; returns it when it is the head (to be
    /// scheduled), `None` when it waits behind an earlier one.
    fn join_chain(&mut self, key: ChainKey, job: DeliveryJob) -> Option<DeliveryJob> {
        let id = job.delivery_id;
        let pos = (
            job.order.as_ref().expect("chained jobs have an order").key,
            id,
        );
        self.in_chain.insert(id, key.clone());
        let Some(chain) = self.chains.get_mut(&key) else {
            self.chains.insert(
                key,
                Chain {
                    head: id,
                    head_pos: pos,
                    head_out: false,
                    head_failed: false,
                    blocked: BTreeMap::new(),
                },
            );
            return Some(job);
        };
        if chain.head_out || pos > chain.head_pos {
            chain.blocked.insert(pos, job);
            return None;
        }
        // Earlier than a head not yet attempted: it goes first.
        let old = std::mem::replace(&mut chain.head, id);
        chain.head_pos = pos;
        if let Some(old_job) = self.unschedule(&old) {
            let old_pos = (
                old_job
                    .order
                    .as_ref()
                    .expect("chained jobs have an order")
                    .key,
                old,
            );
            if let Some(chain) = self.chains.get_mut(&key) {
                chain.blocked.insert(old_pos, old_job);
            }
        }
        Some(job)
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

    /// Sets the endpoints with per-object ordering. Deliveries waiting in
    /// the chains of an endpoint that no longer orders are scheduled.
    pub fn set_ordered(&mut self, ordered: HashSet<EndpointId>, now: Timestamp) {
        self.ordered = ordered;
        let gone: Vec<ChainKey> = self
            .chains
            .keys()
            .filter(|(ep, _)| !self.ordered.contains(ep))
            .cloned()
            .collect();
        for key in gone {
            let Some(chain) = self.chains.remove(&key) else {
                continue;
            };
            self.in_chain.remove(&chain.head);
            for (_, job) in chain.blocked {
                self.in_chain.remove(&job.delivery_id);
                self.schedule(job, now);
            }
        }
    }

    /// Whether `job` is (or would be) kept in order with its object's other
    /// deliveries: such a job stays with this node until it ends, since a
    /// later one of its object could otherwise be claimed and sent first.
    pub fn orders(&self, job: &DeliveryJob) -> bool {
        self.chain_key(job).is_some()
    }

    /// Notes that held delivery `id` ended without success: when it heads a
    /// chain, the next delivery of its object goes anyway and its first
    /// attempt says so. Returns how many wait behind it.
    pub fn head_failed(&mut self, id: &DeliveryId) -> usize {
        let Some(chain) = self.in_chain.get(id).and_then(|k| self.chains.get_mut(k)) else {
            return 0;
        };
        if chain.head != *id {
            return 0;
        }
        chain.head_failed = true;
        chain.blocked.len()
    }

    /// Whether `id` went out after an earlier delivery of its object ended
    /// without success (asked once, when its first attempt is recorded).
    pub fn take_after_failure(&mut self, id: &DeliveryId) -> bool {
        !self.after_failure.is_empty() && self.after_failure.remove(id)
    }

    /// Advances the chains whose head ended: the next delivery of the
    /// object becomes the head and is scheduled.
    fn settle_chains(&mut self, now: Timestamp) {
        if self.settle.is_empty() {
            return;
        }
        for key in std::mem::take(&mut self.settle) {
            let Some(chain) = self.chains.get_mut(&key) else {
                continue;
            };
            if self.held.contains_key(&chain.head) {
                // Rescheduled (a retry): still the head.
                continue;
            }
            let ended = chain.head;
            let failed = std::mem::take(&mut chain.head_failed);
            self.in_chain.remove(&ended);
            let Some((pos, next)) = chain.blocked.pop_first() else {
                self.chains.remove(&key);
                continue;
            };
            chain.head = next.delivery_id;
            chain.head_pos = pos;
            chain.head_out = false;
            if failed {
                self.after_failure.insert(next.delivery_id);
            }
            self.schedule(next, now);
        }
    }

    /// Marks the chain of held delivery `id`, if it has one, to be looked at.
    fn unsettle(&mut self, id: &DeliveryId) {
        if self.in_chain.is_empty() {
            return;
        }
        if let Some(key) = self.in_chain.get(id) {
            if let Some(chain) = self.chains.get_mut(key)
                && chain.head == *id
            {
                chain.head_out = false;
            }
            self.settle.push(key.clone());
        }
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

    fn enqueue(&mut self, job: DeliveryJob) {
        let endpoint = job.endpoint_id;
        let tenant = job.tenant_id.clone();
        let ep = self.endpoint_mut(endpoint, &tenant);
        if job.attempt_count == 0 {
            ep.fresh.push_back(job);
        } else {
            ep.retries.push_back(job);
        }
        self.activate(endpoint);
    }

    /// Puts an idle endpoint with work into its tenant's ring, and the
    /// tenant into the ring of tenants.
    fn activate(&mut self, id: EndpointId) {
        let Some(ep) = self.endpoints.get_mut(&id) else {
            return;
        };
        if ep.place != Place::Idle || ep.queued() == 0 {
            return;
        }
        ep.place = Place::Ready;
        let tenant_id = ep.tenant.clone();
        self.tenants
            .entry(tenant_id.clone())
            .or_default()
            .ready
            .push_back(id);
        self.queue_tenant(&tenant_id);
    }

    /// Puts a tenant with ready endpoints, under its budget, into the set of
    /// tenants with work (or moves it to match its in-flight count).
    fn queue_tenant(&mut self, id: &TenantId) {
        let budget = self
            .budgets
            .get(id)
            .copied()
            .unwrap_or(self.cfg.tenant_max_in_flight);
        let weight = self.weights.get(id).copied().unwrap_or(1);
        let Some(t) = self.tenants.get_mut(id) else {
            return;
        };
        let want = !t.ready.is_empty() && t.in_flight < budget;
        if !t.ready.is_empty() && t.in_flight >= budget {
            *self
                .throttles
                .entry((id.clone(), Throttle::TenantBudget))
                .or_default() += 1;
        }
        let share = share_key(t.in_flight, weight);
        match (t.queued_as, want) {
            (Some((n, _)), true) if n == share => {}
            (old, want) => {
                if let Some((n, seq)) = old {
                    self.ready_tenants.remove(&(n, seq, id.clone()));
                    t.queued_as = None;
                }
                if want {
                    self.seq += 1;
                    t.queued_as = Some((share, self.seq));
                    self.ready_tenants.insert((share, self.seq, id.clone()));
                }
            }
        }
    }

    /// Sets the tenants' weights (absent: 1) and their own in-flight
    /// budgets (absent: the configured one); tenants move to their new
    /// place among those with work.
    pub fn set_tenants(
        &mut self,
        weights: HashMap<TenantId, u32>,
        budgets: HashMap<TenantId, u32>,
    ) {
        self.weights = weights
            .into_iter()
            .filter(|(_, w)| *w != 1)
            .map(|(t, w)| (t, w.clamp(1, MAX_WEIGHT)))
            .collect();
        self.budgets = budgets.into_iter().map(|(t, b)| (t, b.max(1))).collect();
        let known: Vec<TenantId> = self.tenants.keys().cloned().collect();
        for t in known {
            self.queue_tenant(&t);
        }
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

    /// The next job to start at `now`, or `None` when nothing may start.
    /// `limits` gives each endpoint's cap and rate.
    pub fn next_job(
        &mut self,
        now: Timestamp,
        limits: impl Fn(&EndpointId) -> Limits,
    ) -> Option<DeliveryJob> {
        self.settle_chains(now);
        if self.in_flight >= self.cfg.max_in_flight {
            return None;
        }
        // Tenants in order of attempts in flight; one that has nothing it
        // may start now leaves the set until something changes for it.
        let mut skipped: Vec<TenantId> = Vec::new();
        let mut found = None;
        while let Some((_, _, tenant_id)) = self.ready_tenants.first().cloned() {
            let t = self
                .tenants
                .get_mut(&tenant_id)
                .expect("queued tenants exist");
            let key = t.queued_as.take().expect("queued tenants have a key");
            self.ready_tenants
                .remove(&(key.0, key.1, tenant_id.clone()));
            if let Some(job) = self.pick_in_tenant(&tenant_id, now, &limits) {
                let tenant = self.tenants.get_mut(&tenant_id).expect("present");
                tenant.in_flight += 1;
                self.in_flight += 1;
                self.queue_tenant(&tenant_id);
                if !self.in_chain.is_empty()
                    && job.replay.is_none()
                    && let Some(chain) = self
                        .in_chain
                        .get(&job.delivery_id)
                        .and_then(|k| self.chains.get_mut(k))
                    && chain.head == job.delivery_id
                {
                    chain.head_out = true;
                }
                found = Some(job);
                break;
            }
            skipped.push(tenant_id);
        }
        // Tenants whose endpoints were all parked or capped: their endpoints
        // come back through `activate` (timers, finished attempts).
        for t in skipped {
            self.queue_tenant(&t);
        }
        found
    }

    fn pick_in_tenant(
        &mut self,
        tenant_id: &TenantId,
        now: Timestamp,
        limits: &impl Fn(&EndpointId) -> Limits,
    ) -> Option<DeliveryJob> {
        let mut endpoints_left = self.tenants.get(tenant_id)?.ready.len();
        while endpoints_left > 0 {
            endpoints_left -= 1;
            let id = self.tenants.get_mut(tenant_id)?.ready.pop_front()?;
            let lim = limits(&id);
            let retry_share = self.cfg.retry_share.max(1);
            let Some(ep) = self.endpoints.get_mut(&id) else {
                continue;
            };
            ep.place = Place::Idle;
            if ep.queued() == 0 {
                continue;
            }
            if ep.in_flight >= lim.max_in_flight.max(1) {
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::EndpointCap))
                    .or_default() += 1;
                continue;
            }
            if let Err(until) = ep.circuit.admits(now) {
                if let Some(until) = until {
                    ep.place = Place::Parked;
                    self.timer(until, Timer::Wake(id));
                }
                continue;
            }
            match (lim.rate_per_sec, &mut ep.bucket) {
                (None, bucket) => *bucket = None,
                (Some(rate), Some(b)) if b.rate() == rate => {}
                (Some(rate), bucket) => *bucket = Some(TokenBucket::new(rate, now)),
            }
            if let Some(bucket) = ep.bucket.as_mut()
                && let Err(at) = bucket.take(now)
            {
                ep.place = Place::Parked;
                self.timer(at, Timer::Wake(id));
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::RateLimit))
                    .or_default() += 1;
                continue;
            }
            ep.picks = ep.picks.wrapping_add(1);
            let retry_turn = ep.picks % retry_share == 0;
            let job = if (retry_turn && !ep.retries.is_empty()) || ep.fresh.is_empty() {
                ep.retries.pop_front()
            } else {
                ep.fresh.pop_front()
            }?;
            ep.in_flight += 1;
            ep.circuit.started();
            let capped = ep.in_flight >= lim.max_in_flight.max(1);
            let more = ep.queued() > 0
                && !capped
                && !matches!(ep.circuit, Circuit::HalfOpen { probing: true, .. });
            if capped && ep.queued() > 0 {
                // The rest wait for an attempt of this endpoint to finish.
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::EndpointCap))
                    .or_default() += 1;
            }
            if more {
                ep.place = Place::Ready;
                self.tenants.get_mut(tenant_id)?.ready.push_back(id);
            }
            return Some(job);
        }
        None
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::event::EventType;
    use crate::ids::EventId;

    pub(crate) fn job(n: u32, endpoint: u8, tenant: &str, at: i64) -> DeliveryJob {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&n.to_be_bytes());
        DeliveryJob {
            delivery_id: DeliveryId(id),
            event_id: EventId(id),
            endpoint_id: EndpointId([endpoint; 16]),
            tenant_id: TenantId::new(tenant).unwrap(),
            event_type: EventType::new("a").unwrap(),
            payload: bytes::Bytes::new(),
            attempt_count: 0,
            manual_attempt_count: 0,
            after_unknown: false,
            materialized: true,
            created_at: Timestamp(0),
            next_attempt_at: Timestamp(at),
            expires_at: Timestamp(i64::MAX),
            lease_version: 1,
            endpoint_config_version: 1,
            event_occurred_at: Timestamp(0),
            schema_version: 1,
            replay: None,
            order: None,
        }
    }

    fn lim(cap: u32) -> impl Fn(&EndpointId) -> Limits {
        move |_| Limits {
            max_in_flight: cap,
            rate_per_sec: None,
        }
    }

    #[test]
    fn a_cancelled_delivery_is_never_handed_out_whether_queued_or_waiting() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.add(job(1, 1, "t", 0), Timestamp(0)); // queued
        s.add(job(2, 1, "t", 0), Timestamp(0)); // queued
        s.add(job(3, 1, "t", 50), Timestamp(0)); // waiting for a retry
        assert!(s.cancel(&job(1, 1, "t", 0).delivery_id));
        assert!(s.cancel(&job(3, 1, "t", 0).delivery_id));
        assert!(!s.cancel(&job(9, 1, "t", 0).delivery_id), "not held");
        s.release_due(Timestamp(100));
        let mut out = Vec::new();
        while let Some(j) = s.next_job(Timestamp(100), lim(10)) {
            out.push(j.delivery_id);
        }
        assert_eq!(out, vec![job(2, 1, "t", 0).delivery_id]);
        assert_eq!(s.held(), 1);
    }

    #[test]
    fn endpoints_take_turns_and_respect_their_cap() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        for n in 0..4 {
            s.add(job(n, 1, "t", 0), Timestamp(0));
        }
        s.add(job(10, 2, "t", 0), Timestamp(0));
        let a = s.next_job(Timestamp(0), lim(1)).unwrap();
        let b = s.next_job(Timestamp(0), lim(1)).unwrap();
        assert_eq!((a.endpoint_id.0[0], b.endpoint_id.0[0]), (1, 2));
        assert!(
            s.next_job(Timestamp(0), lim(1)).is_none(),
            "endpoint 1 is at its cap"
        );
        s.finished(
            a.endpoint_id,
            Some(a.delivery_id),
            Health::Success,
            Timestamp(0),
        );
        assert_eq!(
            s.next_job(Timestamp(0), lim(1)).unwrap().delivery_id,
            job(1, 1, "t", 0).delivery_id
        );
    }

    #[test]
    fn tenants_take_turns() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        for n in 0..100 {
            s.add(job(n, (n % 50) as u8, "noisy", 0), Timestamp(0));
        }
        for n in 100..103 {
            s.add(job(n, 200, "quiet", 0), Timestamp(0));
        }
        let first: Vec<String> = (0..6)
            .map(|_| {
                s.next_job(Timestamp(0), lim(10))
                    .unwrap()
                    .tenant_id
                    .to_string()
            })
            .collect();
        assert_eq!(
            first.iter().filter(|t| *t == "quiet").count(),
            3,
            "{first:?}"
        );
    }

    #[test]
    fn tenants_hold_slots_in_proportion_to_their_weights() {
        let mut s = Scheduler::new(SchedulerConfig {
            max_in_flight: 12,
            ..SchedulerConfig::default()
        });
        s.set_tenants(
            HashMap::from([
                (TenantId::new("gold").unwrap(), 3),
                (TenantId::new("bronze").unwrap(), 1),
            ]),
            HashMap::new(),
        );
        for n in 0..200 {
            let tenant = if n % 2 == 0 { "gold" } else { "bronze" };
            s.add(job(n, (n % 100) as u8, tenant, 0), Timestamp(0));
        }
        let mut out: Vec<DeliveryJob> = Vec::new();
        while let Some(j) = s.next_job(Timestamp(0), lim(10)) {
            out.push(j);
        }
        let held = |jobs: &[DeliveryJob], t: &str| {
            jobs.iter().filter(|j| j.tenant_id.as_str() == t).count()
        };
        assert_eq!((held(&out, "gold"), held(&out, "bronze")), (9, 3));
        // Under steady contention (every finished slot refilled at once),
        // the shares stay 3 : 1.
        let mut started = (0usize, 0usize);
        for _ in 0..400 {
            let done = out.remove(0);
            s.finished(
                done.endpoint_id,
                Some(done.delivery_id),
                Health::Success,
                Timestamp(0),
            );
            let next = s.next_job(Timestamp(0), lim(10)).unwrap();
            match next.tenant_id.as_str() {
                "gold" => started.0 += 1,
                _ => started.1 += 1,
            }
            s.add(
                job(
                    1000 + (started.0 + started.1) as u32,
                    next.endpoint_id.0[0],
                    next.tenant_id.as_str(),
                    0,
                ),
                Timestamp(0),
            );
            out.push(next);
        }
        assert_eq!((held(&out, "gold"), held(&out, "bronze")), (9, 3));
        assert_eq!(started, (300, 100), "refills follow the weights");
        // Equal weights again: equal shares of what frees up.
        s.set_tenants(HashMap::new(), HashMap::new());
        let mut freed = 0;
        while held(&out, "gold") > held(&out, "bronze") && freed < 50 {
            let i = out
                .iter()
                .position(|j| j.tenant_id.as_str() == "gold")
                .unwrap();
            let done = out.remove(i);
            s.finished(
                done.endpoint_id,
                Some(done.delivery_id),
                Health::Success,
                Timestamp(0),
            );
            out.push(s.next_job(Timestamp(0), lim(10)).unwrap());
            freed += 1;
        }
        assert_eq!((held(&out, "gold"), held(&out, "bronze")), (6, 6));
    }

    #[test]
    fn a_tenant_s_own_budget_replaces_the_configured_one() {
        let mut s = Scheduler::new(SchedulerConfig {
            tenant_max_in_flight: 3,
            ..SchedulerConfig::default()
        });
        s.set_tenants(
            HashMap::new(),
            HashMap::from([
                (TenantId::new("big").unwrap(), 5),
                (TenantId::new("small").unwrap(), 1),
            ]),
        );
        for n in 0..30 {
            let tenant = ["big", "small", "plain"][(n % 3) as usize];
            s.add(job(n, n as u8, tenant, 0), Timestamp(0));
        }
        let mut held: HashMap<String, usize> = HashMap::new();
        while let Some(j) = s.next_job(Timestamp(0), lim(10)) {
            *held.entry(j.tenant_id.to_string()).or_default() += 1;
        }
        assert_eq!(
            (held["big"], held["small"], held["plain"]),
            (5, 1, 3),
            "{held:?}"
        );
        // A budget raised while work waits frees it at once.
        s.set_tenants(
            HashMap::new(),
            HashMap::from([(TenantId::new("small").unwrap(), 2)]),
        );
        let next = s.next_job(Timestamp(0), lim(10)).unwrap();
        assert_eq!(next.tenant_id.as_str(), "small");
    }

    #[test]
    fn waits_for_limits_are_counted_by_tenant_and_limit() {
        let mut s = Scheduler::new(SchedulerConfig {
            tenant_max_in_flight: 2,
            ..SchedulerConfig::default()
        });
        // Tenant a: one endpoint limited to one request a second.
        for n in 0..3 {
            s.add(job(n, 1, "a", 0), Timestamp(0));
        }
        let rated = |_: &EndpointId| Limits {
            max_in_flight: 10,
            rate_per_sec: Some(1),
        };
        assert!(s.next_job(Timestamp(0), rated).is_some());
        assert!(s.next_job(Timestamp(0), rated).is_none());
        let t = s.take_throttles();
        assert_eq!(
            t,
            vec![(TenantId::new("a").unwrap(), Throttle::RateLimit, 1)]
        );
        assert!(s.take_throttles().is_empty(), "taken once");
        // Tenant b: one endpoint capped at one in flight, then its budget.
        for n in 10..13 {
            s.add(job(n, 2, "b", 0), Timestamp(0));
        }
        assert!(s.next_job(Timestamp(0), lim(1)).is_some());
        assert!(s.next_job(Timestamp(0), lim(1)).is_none());
        let t = s.take_throttles();
        assert!(
            t.contains(&(TenantId::new("b").unwrap(), Throttle::EndpointCap, 1)),
            "{t:?}"
        );
    }

    #[test]
    fn the_tenant_budget_caps_a_tenant() {
        let mut s = Scheduler::new(SchedulerConfig {
            tenant_max_in_flight: 3,
            ..SchedulerConfig::default()
        });
        for n in 0..10 {
            s.add(job(n, n as u8, "noisy", 0), Timestamp(0));
        }
        let mut started = 0;
        while s.next_job(Timestamp(0), lim(10)).is_some() {
            started += 1;
        }
        assert_eq!(started, 3);
    }

    #[test]
    fn waiting_jobs_become_due() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.add(job(1, 1, "t", 100), Timestamp(0));
        assert!(s.next_job(Timestamp(0), lim(4)).is_none());
        assert_eq!(s.next_due(), Some(Timestamp(100)));
        s.release_due(Timestamp(100));
        assert!(s.next_job(Timestamp(100), lim(4)).is_some());
    }

    #[test]
    fn a_held_delivery_only_takes_the_newer_lease() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.add(job(1, 1, "t", 0), Timestamp(0));
        let mut again = job(1, 1, "t", 0);
        again.lease_version = 5;
        s.add(again, Timestamp(0));
        assert_eq!(s.lease(&job(1, 1, "t", 0).delivery_id), Some(5));
        assert!(s.next_job(Timestamp(0), lim(4)).is_some());
        assert!(
            s.next_job(Timestamp(0), lim(4)).is_none(),
            "the delivery was queued twice"
        );
    }

    #[test]
    fn an_open_circuit_holds_work_until_one_probe() {
        let cfg = SchedulerConfig {
            breaker: BreakerConfig {
                failure_threshold: 2,
                cool_down: std::time::Duration::from_secs(1),
                ..BreakerConfig::default()
            },
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(cfg);
        for n in 0..10 {
            s.add(job(n, 1, "t", 0), Timestamp(0));
        }
        for _ in 0..2 {
            let j = s.next_job(Timestamp(0), lim(1)).unwrap();
            s.finished(
                j.endpoint_id,
                Some(j.delivery_id),
                Health::Failure,
                Timestamp(0),
            );
        }
        assert!(matches!(
            s.circuit(&EndpointId([1; 16])),
            Circuit::Open { .. }
        ));
        assert!(
            s.next_job(Timestamp(500_000), lim(4)).is_none(),
            "sent while open"
        );
        s.release_due(Timestamp(1_000_000));
        let probe = s.next_job(Timestamp(1_000_000), lim(4)).unwrap();
        assert!(
            s.next_job(Timestamp(1_000_000), lim(4)).is_none(),
            "a second attempt during the probe"
        );
        s.finished(
            probe.endpoint_id,
            Some(probe.delivery_id),
            Health::Success,
            Timestamp(1_000_001),
        );
        assert_eq!(
            s.circuit(&EndpointId([1; 16])),
            Circuit::Closed { failures: 0 }
        );
        assert!(s.next_job(Timestamp(1_000_001), lim(4)).is_some());
    }

    #[test]
    fn new_work_goes_first_but_retries_get_their_share() {
        let mut s = Scheduler::new(SchedulerConfig {
            retry_share: 4,
            ..SchedulerConfig::default()
        });
        for n in 0..20 {
            let mut j = job(n, 1, "t", 0);
            j.attempt_count = 3;
            s.add(j, Timestamp(0));
        }
        for n in 100..120 {
            s.add(job(n, 1, "t", 0), Timestamp(0));
        }
        let mut kinds = Vec::new();
        for _ in 0..8 {
            let j = s.next_job(Timestamp(0), lim(100)).unwrap();
            kinds.push(j.attempt_count);
        }
        assert_eq!(kinds.iter().filter(|&&a| a == 0).count(), 6, "{kinds:?}");
    }

    #[test]
    fn rate_limits_park_the_endpoint() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        for n in 0..5 {
            s.add(job(n, 1, "t", 0), Timestamp(0));
        }
        let limited = |_: &EndpointId| Limits {
            max_in_flight: 10,
            rate_per_sec: Some(2),
        };
        assert!(s.next_job(Timestamp(0), limited).is_some());
        assert!(s.next_job(Timestamp(0), limited).is_some());
        assert!(s.next_job(Timestamp(0), limited).is_none());
        assert_eq!(s.next_due(), Some(Timestamp(500_000)));
        s.release_due(Timestamp(500_000));
        assert!(s.next_job(Timestamp(500_000), limited).is_some());
    }

    /// Job `n` of object `object` at `endpoint`, `n` also its commit order.
    fn of_object(n: u32, endpoint: u8, object: &str) -> DeliveryJob {
        let mut j = job(n, endpoint, "t", 0);
        j.order = Some(crate::delivery::ObjectOrder {
            object_id: object.into(),
            key: EventKey {
                commit_lsn: crate::ids::Lsn(u64::from(n)),
                tx_ordinal: 0,
            },
        });
        j
    }

    fn ordered(endpoints: &[u8]) -> HashSet<EndpointId> {
        endpoints.iter().map(|e| EndpointId([*e; 16])).collect()
    }

    /// Every job that may start now, without finishing any.
    fn drain(s: &mut Scheduler, now: i64) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(j) = s.next_job(Timestamp(now), lim(100)) {
            out.push(u32::from_be_bytes(j.delivery_id.0[..4].try_into().unwrap()));
        }
        out
    }

    fn done(s: &mut Scheduler, n: u32, endpoint: u8, now: i64) {
        let j = of_object(n, endpoint, "x");
        s.finished(
            j.endpoint_id,
            Some(j.delivery_id),
            Health::Success,
            Timestamp(now),
        );
    }

    #[test]
    fn an_objects_deliveries_go_one_at_a_time_in_commit_order() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(ordered(&[1]), Timestamp(0));
        for (n, object) in [(1, "a"), (2, "a"), (3, "b"), (4, "a"), (5, "b")] {
            s.add(of_object(n, 1, object), Timestamp(0));
        }
        // Endpoint 2 does not order: all of its deliveries go at once.
        for n in 10..13 {
            s.add(of_object(n, 2, "a"), Timestamp(0));
        }
        assert_eq!(drain(&mut s, 0), vec![1, 10, 3, 11, 12]);
        // The head of "a" fails and waits for a retry: "a" stays blocked,
        // "b" moves on.
        done(&mut s, 1, 1, 0);
        let mut retry = of_object(1, 1, "a");
        retry.attempt_count = 1;
        s.reschedule(retry, Timestamp(50));
        done(&mut s, 3, 1, 0);
        assert_eq!(drain(&mut s, 10), vec![5]);
        s.release_due(Timestamp(50));
        assert_eq!(drain(&mut s, 50), vec![1]);
        done(&mut s, 1, 1, 60);
        assert_eq!(drain(&mut s, 60), vec![2]);
        done(&mut s, 2, 1, 60);
        assert_eq!(drain(&mut s, 60), vec![4]);
        done(&mut s, 4, 1, 60);
        done(&mut s, 5, 1, 60);
        assert_eq!(drain(&mut s, 60), Vec::<u32>::new());
        assert_eq!(s.held(), 3, "only endpoint 2's three remain held");
        assert!(s.chains.is_empty() && s.in_chain.is_empty());
    }

    #[test]
    fn an_earlier_delivery_arriving_late_goes_first_unless_the_later_is_out() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(ordered(&[1]), Timestamp(0));
        s.add(of_object(3, 1, "a"), Timestamp(0));
        s.add(of_object(2, 1, "a"), Timestamp(0));
        s.add(of_object(1, 1, "a"), Timestamp(0));
        assert_eq!(drain(&mut s, 0), vec![1]);
        // Now the head is out: an even earlier one waits behind it.
        s.add(of_object(0, 1, "a"), Timestamp(0));
        assert_eq!(drain(&mut s, 0), Vec::<u32>::new());
        let mut order = Vec::new();
        for n in [1, 0, 2, 3] {
            done(&mut s, n, 1, 0);
            order.extend(drain(&mut s, 0));
        }
        assert_eq!(order, vec![0, 2, 3]);
    }

    #[test]
    fn after_a_failed_head_the_next_goes_and_says_so() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(ordered(&[1]), Timestamp(0));
        for n in 1..=3 {
            s.add(of_object(n, 1, "a"), Timestamp(0));
        }
        assert_eq!(drain(&mut s, 0), vec![1]);
        done(&mut s, 1, 1, 0);
        assert_eq!(s.head_failed(&of_object(1, 1, "a").delivery_id), 2);
        assert_eq!(drain(&mut s, 0), vec![2]);
        assert!(s.take_after_failure(&of_object(2, 1, "a").delivery_id));
        assert!(!s.take_after_failure(&of_object(2, 1, "a").delivery_id));
        done(&mut s, 2, 1, 0);
        assert_eq!(drain(&mut s, 0), vec![3]);
        assert!(!s.take_after_failure(&of_object(3, 1, "a").delivery_id));
    }

    #[test]
    fn cancelling_in_a_chain_never_hands_out_the_cancelled_and_moves_on() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(ordered(&[1]), Timestamp(0));
        for n in 1..=4 {
            s.add(of_object(n, 1, "a"), Timestamp(0));
        }
        // A waiting one leaves the chain; the head, queued, is cancelled too.
        assert!(s.cancel(&of_object(2, 1, "a").delivery_id));
        assert!(s.cancel(&of_object(1, 1, "a").delivery_id));
        assert_eq!(drain(&mut s, 0), vec![3]);
        done(&mut s, 3, 1, 0);
        assert_eq!(drain(&mut s, 0), vec![4]);
        done(&mut s, 4, 1, 0);
        assert_eq!(drain(&mut s, 0), Vec::<u32>::new());
        assert_eq!(s.held(), 0);
        assert!(s.chains.is_empty() && s.in_chain.is_empty());
    }

    #[test]
    fn an_endpoint_that_stops_ordering_lets_its_waiting_deliveries_go() {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(ordered(&[1]), Timestamp(0));
        for n in 1..=3 {
            s.add(of_object(n, 1, "a"), Timestamp(0));
        }
        assert_eq!(drain(&mut s, 0), vec![1]);
        s.set_ordered(HashSet::new(), Timestamp(0));
        assert_eq!(drain(&mut s, 0), vec![2, 3]);
        assert!(s.chains.is_empty() && s.in_chain.is_empty());
        // Replays and events without an object never wait in a chain.
        s.set_ordered(ordered(&[1]), Timestamp(0));
        let mut plain = job(9, 1, "t", 0);
        plain.order = None;
        s.add(of_object(7, 1, "a"), Timestamp(0));
        s.add(of_object(8, 1, "a"), Timestamp(0));
        s.add(plain, Timestamp(0));
        let mut replay = of_object(8, 1, "a");
        replay.replay = Some(crate::delivery::Replay {
            request_id: 1,
            number: 2,
        });
        s.add_manual(replay);
        let mut out = drain(&mut s, 0);
        out.sort_unstable();
        assert_eq!(out, vec![7, 8, 9], "7, the replay of 8, and 9");
    }
}
