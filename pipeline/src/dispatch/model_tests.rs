//! Model-based property tests of the delivery state machine, the scheduler
//! and the lease protocol, driven by random sequences of operations:
//! deliveries arrive, time passes, attempts start and finish with random
//! outcomes, the process crashes and reclaims, the sweeper claims. The
//! "database" is a map of rows updated the way the Postgres store updates
//! them (claims bump the lease version; results apply only under the
//! current lease).
//!
//! Invariants checked after every step: at most one live lease per
//! delivery; no delivery in flight twice; attempts never exceed the maximum;
//! terminal states are final; every delay stays within its cap. At the end,
//! every pending delivery gets an attempt within max backoff (+ a sweep).
//!
//! Leases: the node holds the deliveries whose owner is it while its node
//! lease lives; a `Steal` step plays another node taking one over (as after
//! a lapsed node lease), so results of the old holder must be fenced off.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};

use super::breaker::{BreakerConfig, Health};
use super::outcome::{AttemptOutcome, ErrorClass};
use super::scheduler::{Limits, Scheduler, SchedulerConfig};
use crate::delivery::{DeliveryJob, DeliveryStatus};
use crate::event::EventType;
use crate::ids::{DeliveryId, EndpointId, EventId, TenantId};
use crate::retry::{DeliveryState, RetryPolicy};
use crate::time::Timestamp;

const SEC: i64 = 1_000_000;
const HORIZON: Duration = Duration::from_secs(30);

fn policy() -> RetryPolicy {
    RetryPolicy {
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(60),
        max_attempts: 3,
        deadline: Duration::from_secs(3600),
        retry_after_cap: Duration::from_secs(120),
        slow_down_floor: Duration::from_secs(5),
        ..RetryPolicy::default()
    }
}

fn sched_config() -> SchedulerConfig {
    SchedulerConfig {
        max_in_flight: 5,
        tenant_max_in_flight: 3,
        retry_share: 3,
        breaker: BreakerConfig {
            failure_threshold: 3,
            cool_down: Duration::from_secs(10),
            max_cool_down: Duration::from_secs(40),
        },
    }
}

fn limits(_: &EndpointId) -> Limits {
    Limits {
        max_in_flight: 2,
        rate_per_sec: None,
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        endpoint: u8,
        tenant: u8,
    },
    Advance {
        secs: u16,
    },
    Start,
    Finish {
        slot: usize,
        kind: u8,
        retry_after: u16,
        jitter: f64,
    },
    Crash,
    Sweep,
    Steal {
        pick: usize,
    },
}

/// The reference only tracks what makes an operation meaningful.
#[derive(Debug, Clone, Default)]
struct RefState {
    deliveries: usize,
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = RefState;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<RefState> {
        Just(RefState::default()).boxed()
    }

    fn transitions(_: &RefState) -> BoxedStrategy<Op> {
        prop_oneof![
            3 => (0u8..4, 0u8..3).prop_map(|(endpoint, tenant)| Op::Add { endpoint, tenant }),
            2 => (0u16..200).prop_map(|secs| Op::Advance { secs }),
            3 => Just(Op::Start),
            4 => (0usize..8, 0u8..5, 0u16..300, 0.0f64..1.0).prop_map(|(slot, kind, retry_after, jitter)| Op::Finish { slot, kind, retry_after, jitter }),
            1 => Just(Op::Crash),
            1 => Just(Op::Sweep),
            1 => (0usize..64).prop_map(|pick| Op::Steal { pick }),
        ]
        .boxed()
    }

    fn apply(mut state: RefState, op: &Op) -> RefState {
        if let Op::Add { .. } = op {
            state.deliveries += 1;
        }
        state
    }
}

/// A delivery row as the platform database holds it.
#[derive(Debug, Clone)]
struct Row {
    job: DeliveryJob,
    status: DeliveryStatus,
    attempts: u32,
    next_at: Timestamp,
    lease: i64,
    /// The node holding it (0 is the node under test).
    owner: Option<u32>,
}

struct Sut {
    now: Timestamp,
    sched: Scheduler,
    rows: HashMap<DeliveryId, Row>,
    in_flight: Vec<DeliveryJob>,
    terminal: HashMap<DeliveryId, (DeliveryStatus, u32)>,
    next_id: u32,
}

fn job(n: u32, endpoint: u8, tenant: u8, now: Timestamp) -> DeliveryJob {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&n.to_be_bytes());
    DeliveryJob {
        delivery_id: DeliveryId(id),
        event_id: EventId(id),
        endpoint_id: EndpointId([endpoint; 16]),
        tenant_id: TenantId::new(format!("t{tenant}")).unwrap(),
        event_type: EventType::new("x.y").unwrap(),
        payload: bytes::Bytes::new(),
        attempt_count: 0,
        manual_attempt_count: 0,
        after_unknown: false,
        materialized: true,
        created_at: now,
        next_attempt_at: now,
        expires_at: now.plus(policy().deadline),
        lease_version: 1,
        endpoint_config_version: 1,
        event_occurred_at: now,
        schema_version: 1,
        replay: None,
        order: None,
    }
}

fn outcome(kind: u8, retry_after: u16) -> AttemptOutcome {
    match kind {
        0 => AttemptOutcome::Delivered { status: 200 },
        1 => AttemptOutcome::Retryable {
            status: Some(503),
            class: ErrorClass::ServerError,
            retry_after: Some(Duration::from_secs(u64::from(retry_after))),
        },
        2 => AttemptOutcome::Retryable {
            status: Some(429),
            class: ErrorClass::RateLimited,
            retry_after: None,
        },
        3 => AttemptOutcome::Rejected {
            status: Some(400),
            class: ErrorClass::ClientError,
        },
        _ => AttemptOutcome::Retryable {
            status: None,
            class: ErrorClass::Timeout,
            retry_after: None,
        },
    }
}

impl Sut {
    /// Claims rows the way the store does: after a restart the node's own
    /// rows; otherwise rows that are due and held by nobody.
    fn claim(&mut self, reclaim_own: bool) {
        let now = self.now;
        let mut claimed = Vec::new();
        for row in self.rows.values_mut() {
            let wanted = if reclaim_own {
                row.owner == Some(0)
            } else {
                row.owner.is_none() && row.next_at <= now
            };
            if row.status == DeliveryStatus::Pending && wanted {
                row.lease += 1;
                row.owner = Some(0);
                let mut j = row.job.clone();
                j.lease_version = row.lease;
                j.attempt_count = row.attempts;
                j.next_attempt_at = row.next_at;
                claimed.push(j);
            }
        }
        claimed.sort_by_key(|j| j.delivery_id);
        for j in claimed {
            self.sched.add(j, now);
        }
    }

    /// Another node takes a delivery over and hands it back unattempted.
    fn steal(&mut self, pick: usize) {
        let mut pending: Vec<DeliveryId> = self
            .rows
            .iter()
            .filter(|(_, r)| r.status == DeliveryStatus::Pending)
            .map(|(id, _)| *id)
            .collect();
        if pending.is_empty() {
            return;
        }
        pending.sort();
        let row = self
            .rows
            .get_mut(&pending[pick % pending.len()])
            .expect("row");
        row.lease += 1;
        row.owner = None;
    }

    fn start(&mut self) {
        self.sched.release_due(self.now);
        while let Some(mut j) = self.sched.next_job(self.now, limits) {
            if let Some(lease) = self.sched.lease(&j.delivery_id) {
                j.lease_version = lease;
            }
            assert!(
                !self
                    .in_flight
                    .iter()
                    .any(|f| f.delivery_id == j.delivery_id),
                "a delivery was started while already in flight"
            );
            let row = &self.rows[&j.delivery_id];
            assert!(j.next_attempt_at <= self.now, "started before it was due");
            assert_eq!(
                row.status,
                DeliveryStatus::Pending,
                "a terminal delivery was started"
            );
            self.in_flight.push(j);
        }
    }

    fn finish(&mut self, slot: usize, o: AttemptOutcome, jitter: f64) {
        if self.in_flight.is_empty() {
            return;
        }
        let mut j = self.in_flight.remove(slot % self.in_flight.len());
        // As the dispatcher does: record under the newest lease held.
        if let Some(newer) = self.sched.lease(&j.delivery_id) {
            j.lease_version = j.lease_version.max(newer);
        }
        let health = match o {
            AttemptOutcome::Delivered { .. } => Health::Success,
            AttemptOutcome::Retryable { .. } => Health::Failure,
            _ => Health::Neutral,
        };
        self.sched
            .finished(j.endpoint_id, Some(j.delivery_id), health, self.now);
        let p = policy();
        let before = DeliveryState {
            status: DeliveryStatus::Pending,
            attempts: j.attempt_count,
            created_at: j.created_at,
            expires_at: j.expires_at,
            next_attempt_at: j.next_attempt_at,
        };
        let next = before.next(&o, &p, self.now, jitter);
        if next.status == DeliveryStatus::Pending {
            let delay = next.next_attempt_at.since(self.now);
            let cap = p.max_delay.max(p.retry_after_cap).max(p.slow_down_floor);
            assert!(delay <= cap, "delay {delay:?} above every cap");
            if let AttemptOutcome::Retryable {
                retry_after: Some(ra),
                ..
            } = o
            {
                assert!(
                    delay >= ra.min(p.retry_after_cap),
                    "Retry-After not honoured"
                );
            }
        }
        let hold = next.status == DeliveryStatus::Pending
            && next.next_attempt_at.since(self.now) <= HORIZON;
        let row = self.rows.get_mut(&j.delivery_id).expect("row");
        // The store applies a result only under the current lease.
        if row.lease == j.lease_version && row.status == DeliveryStatus::Pending {
            row.status = next.status;
            row.attempts = row.attempts.max(next.attempts);
            row.next_at = next.next_attempt_at;
            if !hold {
                row.owner = None;
            }
            if hold {
                let mut again = j;
                again.attempt_count = next.attempts;
                self.sched.reschedule(again, next.next_attempt_at);
            }
        }
    }

    fn check(&mut self) {
        let p = policy();
        for (id, row) in &self.rows {
            assert!(row.attempts <= p.max_attempts, "attempts above the maximum");
            let live = self
                .in_flight
                .iter()
                .filter(|j| j.delivery_id == *id && j.lease_version == row.lease)
                .count();
            assert!(live <= 1, "two live leases on one delivery");
            if let Some(&(status, attempts)) = self.terminal.get(id) {
                assert_eq!(
                    (row.status, row.attempts),
                    (status, attempts),
                    "a terminal delivery changed"
                );
            } else if row.status.is_terminal() {
                self.terminal.insert(*id, (row.status, row.attempts));
            }
        }
    }
}

struct DispatchModel;

impl StateMachineTest for DispatchModel {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(_: &RefState) -> Sut {
        Sut {
            now: Timestamp(1_000 * SEC),
            sched: Scheduler::new(sched_config()),
            rows: HashMap::new(),
            in_flight: Vec::new(),
            terminal: HashMap::new(),
            next_id: 0,
        }
    }

    fn apply(mut sut: Sut, _: &RefState, op: Op) -> Sut {
        match op {
            Op::Add { endpoint, tenant } => {
                sut.next_id += 1;
                let j = job(sut.next_id, endpoint, tenant, sut.now);
                sut.rows.insert(
                    j.delivery_id,
                    Row {
                        job: j.clone(),
                        status: DeliveryStatus::Pending,
                        attempts: 0,
                        next_at: sut.now,
                        lease: 1,
                        owner: Some(0),
                    },
                );
                sut.sched.add(j, sut.now);
            }
            Op::Advance { secs } => {
                sut.now = sut.now.plus(Duration::from_secs(u64::from(secs)));
                sut.sched.release_due(sut.now);
            }
            Op::Start => sut.start(),
            Op::Finish {
                slot,
                kind,
                retry_after,
                jitter,
            } => sut.finish(slot, outcome(kind, retry_after), jitter),
            Op::Crash => {
                // In-flight results are lost; memory starts empty; the node
                // reclaims what it held.
                sut.in_flight.clear();
                sut.sched = Scheduler::new(sched_config());
                sut.claim(true);
            }
            Op::Sweep => sut.claim(false),
            Op::Steal { pick } => sut.steal(pick),
        }
        sut.check();
        sut
    }

    fn teardown(mut sut: Sut, _: RefState) {
        // Liveness: with every attempt now succeeding at once, each pending
        // delivery gets an attempt within max backoff (+ a sweep).
        let p = policy();
        let bound = p.max_delay.max(p.retry_after_cap) + Duration::from_secs(2);
        let start = sut.now;
        let mut waiting: HashMap<DeliveryId, Timestamp> = sut
            .rows
            .iter()
            .filter(|(_, r)| r.status == DeliveryStatus::Pending)
            .map(|(id, r)| (*id, r.next_at.max(start)))
            .collect();
        for _ in 0..(bound.as_secs() * 2) {
            sut.claim(false);
            sut.start();
            let now = sut.now;
            for j in &sut.in_flight {
                if let Some(due) = waiting.remove(&j.delivery_id) {
                    assert!(
                        now.since(due) <= bound,
                        "waited {:?} for an attempt",
                        now.since(due)
                    );
                }
            }
            while !sut.in_flight.is_empty() {
                sut.finish(0, AttemptOutcome::Delivered { status: 200 }, 0.5);
            }
            sut.check();
            if waiting.is_empty() {
                break;
            }
            sut.now = sut.now.plus(Duration::from_secs(1));
        }
        assert!(
            waiting.is_empty(),
            "{} pending deliveries never got an attempt",
            waiting.len()
        );
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 10_000, max_shrink_iters: 2_000, .. ProptestConfig::default() })]

    #[test]
    fn dispatch_state_machine_holds_its_invariants(sequential 1..60 => DispatchModel);
}
