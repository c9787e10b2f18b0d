//! Isolation under a controlled clock: a discrete-event simulation of the
//! scheduler with a healthy tenant, a noisy tenant whose 500 endpoints all
//! answer 500, and one endpoint that hangs until the request timeout. Time
//! is virtual, so the assertions are about order and shares, not wall time.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use super::breaker::{BreakerConfig, Health};
use super::outcome::{AttemptOutcome, ErrorClass};
use super::scheduler::{Limits, Scheduler, SchedulerConfig};
use crate::delivery::{DeliveryJob, DeliveryStatus};
use crate::event::EventType;
use crate::ids::{DeliveryId, EndpointId, EventId, TenantId};
use crate::retry::{DeliveryState, RetryPolicy};
use crate::time::Timestamp;

const MS: i64 = 1000;

struct Sim {
    sched: Scheduler,
    now: Timestamp,
    /// (finish time, seq, job)
    running: BinaryHeap<Reverse<(Timestamp, u64, u32)>>,
    jobs: HashMap<u32, DeliveryJob>,
    seq: u64,
    /// First-attempt latency of the healthy tenant's deliveries, in ms.
    healthy_latency: Vec<i64>,
    max_noisy_in_flight: u32,
    noisy_in_flight: u32,
    healthy_done: usize,
}

fn endpoint_kind(id: &EndpointId) -> &'static str {
    match id.0[0] {
        0 => "healthy",
        1 => "hang",
        _ => "noisy",
    }
}

fn endpoint(kind: u8, n: u16) -> EndpointId {
    let mut id = [0u8; 16];
    id[0] = kind;
    id[1..3].copy_from_slice(&n.to_be_bytes());
    EndpointId(id)
}

fn job(n: u32, endpoint: EndpointId, tenant: &str, now: Timestamp) -> DeliveryJob {
    let mut id = [0u8; 16];
    id[..4].copy_from_slice(&n.to_be_bytes());
    DeliveryJob {
        delivery_id: DeliveryId(id),
        event_id: EventId(id),
        endpoint_id: endpoint,
        tenant_id: TenantId::new(tenant).unwrap(),
        event_type: EventType::new("x.y").unwrap(),
        payload: bytes::Bytes::new(),
        attempt_count: 0,
        manual_attempt_count: 0,
        after_unknown: false,
        materialized: true,
        created_at: now,
        next_attempt_at: now,
        expires_at: now.plus(Duration::from_secs(24 * 3600)),
        lease_version: 1,
        endpoint_config_version: 1,
        event_occurred_at: now,
        schema_version: 1,
        replay: None,
        order: None,
    }
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        base_delay: Duration::from_secs(1),
        max_delay: Duration::from_secs(30),
        ..RetryPolicy::default()
    }
}

fn limits(_: &EndpointId) -> Limits {
    Limits {
        max_in_flight: 4,
        rate_per_sec: None,
    }
}

impl Sim {
    fn new() -> Sim {
        Sim {
            sched: Scheduler::new(SchedulerConfig {
                max_in_flight: 8,
                tenant_max_in_flight: 6,
                retry_share: 4,
                breaker: BreakerConfig::default(),
            }),
            now: Timestamp(0),
            running: BinaryHeap::new(),
            jobs: HashMap::new(),
            seq: 0,
            healthy_latency: Vec::new(),
            max_noisy_in_flight: 0,
            noisy_in_flight: 0,
            healthy_done: 0,
        }
    }

    fn start(&mut self) {
        self.sched.release_due(self.now);
        while let Some(j) = self.sched.next_job(self.now, limits) {
            let took = match endpoint_kind(&j.endpoint_id) {
                "healthy" => 20 * MS,
                "hang" => 15_000 * MS,
                _ => 50 * MS,
            };
            if endpoint_kind(&j.endpoint_id) == "healthy" && j.attempt_count == 0 {
                self.healthy_latency
                    .push(self.now.since(j.created_at).as_millis() as i64);
            }
            if endpoint_kind(&j.endpoint_id) == "noisy" {
                self.noisy_in_flight += 1;
                self.max_noisy_in_flight = self.max_noisy_in_flight.max(self.noisy_in_flight);
            }
            self.seq += 1;
            let key = self.seq as u32;
            self.running.push(Reverse((
                self.now.plus(Duration::from_micros(took as u64)),
                self.seq,
                key,
            )));
            self.jobs.insert(key, j);
        }
    }

    fn finish_due(&mut self) {
        while let Some(Reverse((t, _, key))) = self.running.peek().copied() {
            if t > self.now {
                break;
            }
            self.running.pop();
            let j = self.jobs.remove(&key).unwrap();
            let (outcome, health) = match endpoint_kind(&j.endpoint_id) {
                "healthy" => (AttemptOutcome::Delivered { status: 200 }, Health::Success),
                "hang" => (
                    AttemptOutcome::Retryable {
                        status: None,
                        class: ErrorClass::Timeout,
                        retry_after: None,
                    },
                    Health::Failure,
                ),
                _ => (
                    AttemptOutcome::Retryable {
                        status: Some(500),
                        class: ErrorClass::ServerError,
                        retry_after: None,
                    },
                    Health::Failure,
                ),
            };
            if endpoint_kind(&j.endpoint_id) == "noisy" {
                self.noisy_in_flight -= 1;
            }
            self.sched
                .finished(j.endpoint_id, Some(j.delivery_id), health, self.now);
            let state = DeliveryState {
                status: DeliveryStatus::Pending,
                attempts: j.attempt_count,
                created_at: j.created_at,
                expires_at: j.expires_at,
                next_attempt_at: j.next_attempt_at,
            };
            let next = state.next(&outcome, &policy(), self.now, 0.5);
            if next.status == DeliveryStatus::Pending {
                let mut again = j;
                again.attempt_count = next.attempts;
                self.sched.reschedule(again, next.next_attempt_at);
            } else if endpoint_kind(&j.endpoint_id) == "healthy" {
                self.healthy_done += 1;
            }
        }
    }

    /// Runs 60 virtual seconds: 100 healthy deliveries a second over 5
    /// endpoints, and (when `noisy`) a flood for the noisy tenant and the
    /// hanging endpoint from the start.
    fn run(noisy: bool) -> Sim {
        let mut sim = Sim::new();
        let mut n = 0u32;
        if noisy {
            for e in 0..500u16 {
                for _ in 0..20 {
                    n += 1;
                    sim.sched
                        .add(job(n, endpoint(2, e), "noisy", sim.now), sim.now);
                }
            }
            for _ in 0..200 {
                n += 1;
                sim.sched
                    .add(job(n, endpoint(1, 0), "slowpoke", sim.now), sim.now);
            }
        }
        let step = Duration::from_millis(1);
        for tick in 0..60_000i64 {
            sim.now = Timestamp(tick * MS);
            if tick % 10 == 0 {
                n += 1;
                sim.sched.add(
                    job(n, endpoint(0, (tick % 5) as u16), "healthy", sim.now),
                    sim.now,
                );
            }
            sim.finish_due();
            sim.start();
            let _ = step;
        }
        sim.now = Timestamp(61_000 * MS);
        sim.finish_due();
        sim
    }
}

fn percentile(v: &mut [i64], p: f64) -> i64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn a_noisy_tenant_and_a_hanging_endpoint_do_not_delay_a_healthy_tenant() {
    let mut quiet = Sim::run(false);
    let mut loud = Sim::run(true);
    assert_eq!(quiet.healthy_latency.len(), 6000);
    assert_eq!(
        loud.healthy_latency.len(),
        6000,
        "healthy deliveries were not all attempted"
    );
    assert!(
        loud.healthy_done >= 5990,
        "healthy deliveries did not complete: {}",
        loud.healthy_done
    );
    let (q50, q99) = (
        percentile(&mut quiet.healthy_latency, 0.5),
        percentile(&mut quiet.healthy_latency, 0.99),
    );
    let (l50, l99) = (
        percentile(&mut loud.healthy_latency, 0.5),
        percentile(&mut loud.healthy_latency, 0.99),
    );
    // The noisy tenant never holds more than its budget of the 8 slots.
    assert!(
        loud.max_noisy_in_flight <= 6,
        "noisy tenant held {} slots",
        loud.max_noisy_in_flight
    );
    // First attempts start at once without the noise; with it, within a
    // few milliseconds of virtual time (one slot turnover), not seconds.
    assert!(q99 <= 1, "unloaded p99 {q99} ms");
    eprintln!(
        "healthy first-attempt latency: quiet p50 {q50} ms p99 {q99} ms; noisy p50 {l50} ms p99 {l99} ms"
    );
    assert!(
        l50 <= q50 + 1 && l99 <= q99 + 20,
        "healthy first-attempt latency with noise: p50 {l50} ms, p99 {l99} ms"
    );
}
