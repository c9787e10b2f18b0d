//! The in-memory schedule of one dispatcher: who is due, who may go next.
//!
//! Jobs wait in a timer heap until due, then in their endpoint's FIFO. An
//! endpoint with queued work and a free in-flight slot sits in the ready
//! ring; the dispatcher takes endpoints from the ring in turn, so one busy
//! endpoint cannot take every slot while others wait. Nothing here does I/O;
//! the dispatcher drives it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::delivery::DeliveryJob;
use crate::ids::{DeliveryId, EndpointId};
use crate::time::Timestamp;

#[derive(Debug, Default)]
struct EndpointQueue {
    jobs: VecDeque<DeliveryJob>,
    in_flight: u32,
    in_ready: bool,
}

/// The schedule.
#[derive(Debug, Default)]
pub struct Scheduler {
    queues: HashMap<EndpointId, EndpointQueue>,
    ready: VecDeque<EndpointId>,
    timers: BinaryHeap<Reverse<(Timestamp, u64, DeliveryId)>>,
    waiting: HashMap<DeliveryId, DeliveryJob>,
    /// Every delivery held (waiting, queued or in flight) and its lease.
    held: HashMap<DeliveryId, i64>,
    seq: u64,
    in_flight: usize,
}

impl Scheduler {
    /// Deliveries held.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Attempts in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether `id` is held.
    pub fn holds(&self, id: &DeliveryId) -> bool {
        self.held.contains_key(id)
    }

    /// The lease a held delivery is under.
    pub fn lease(&self, id: &DeliveryId) -> Option<i64> {
        self.held.get(id).copied()
    }

    /// Adds a job; a delivery already held only takes the newer lease.
    pub fn add(&mut self, job: DeliveryJob, now: Timestamp) {
        if let Some(lease) = self.held.get_mut(&job.delivery_id) {
            *lease = (*lease).max(job.lease_version);
            return;
        }
        self.held.insert(job.delivery_id, job.lease_version);
        if job.next_attempt_at > now {
            self.wait(job);
        } else {
            self.enqueue(job);
        }
    }

    fn wait(&mut self, job: DeliveryJob) {
        self.seq += 1;
        self.timers
            .push(Reverse((job.next_attempt_at, self.seq, job.delivery_id)));
        self.waiting.insert(job.delivery_id, job);
    }

    /// Puts a held job back to wait until `at` (a retry, or a pause).
    pub fn reschedule(&mut self, mut job: DeliveryJob, at: Timestamp) {
        job.next_attempt_at = at;
        self.held
            .entry(job.delivery_id)
            .or_insert(job.lease_version);
        self.wait(job);
    }

    fn enqueue(&mut self, job: DeliveryJob) {
        let endpoint = job.endpoint_id;
        let q = self.queues.entry(endpoint).or_default();
        q.jobs.push_back(job);
        if !q.in_ready {
            q.in_ready = true;
            self.ready.push_back(endpoint);
        }
    }

    /// The next time a waiting job becomes due.
    pub fn next_due(&self) -> Option<Timestamp> {
        self.timers.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Moves every job due at `now` to its endpoint's queue.
    pub fn release_due(&mut self, now: Timestamp) {
        while let Some(Reverse((t, _, id))) = self.timers.peek().copied() {
            if t > now {
                break;
            }
            self.timers.pop();
            if let Some(job) = self.waiting.remove(&id) {
                self.enqueue(job);
            }
        }
    }

    /// The next job to start, taking endpoints in turn; `cap` gives each
    /// endpoint's in-flight limit. `None` when nothing may start.
    pub fn next_job(
        &mut self,
        max_in_flight: usize,
        cap: impl Fn(&EndpointId) -> u32,
    ) -> Option<DeliveryJob> {
        if self.in_flight >= max_in_flight {
            return None;
        }
        while let Some(endpoint) = self.ready.pop_front() {
            let Some(q) = self.queues.get_mut(&endpoint) else {
                continue;
            };
            if q.jobs.is_empty() || q.in_flight >= cap(&endpoint) {
                q.in_ready = false;
                if q.jobs.is_empty() && q.in_flight == 0 {
                    self.queues.remove(&endpoint);
                }
                continue;
            }
            let job = q.jobs.pop_front()?;
            q.in_flight += 1;
            if !q.jobs.is_empty() && q.in_flight < cap(&endpoint) {
                self.ready.push_back(endpoint);
            } else {
                q.in_ready = false;
            }
            self.in_flight += 1;
            return Some(job);
        }
        None
    }

    /// An attempt of `endpoint` finished; its delivery is released unless the
    /// caller reschedules it.
    pub fn finished(&mut self, endpoint: EndpointId, delivery: DeliveryId) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.held.remove(&delivery);
        if let Some(q) = self.queues.get_mut(&endpoint) {
            q.in_flight = q.in_flight.saturating_sub(1);
            if !q.jobs.is_empty() && !q.in_ready {
                q.in_ready = true;
                self.ready.push_back(endpoint);
            } else if q.jobs.is_empty() && q.in_flight == 0 && !q.in_ready {
                self.queues.remove(&endpoint);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;
    use crate::ids::{EventId, TenantId};

    fn job(n: u8, endpoint: u8, at: i64) -> DeliveryJob {
        DeliveryJob {
            delivery_id: DeliveryId([n; 16]),
            event_id: EventId([n; 16]),
            endpoint_id: EndpointId([endpoint; 16]),
            tenant_id: TenantId::new("t").unwrap(),
            event_type: EventType::new("a").unwrap(),
            payload: bytes::Bytes::new(),
            attempt_count: 0,
            created_at: Timestamp(0),
            next_attempt_at: Timestamp(at),
            expires_at: Timestamp(i64::MAX),
            lease_version: 1,
            endpoint_config_version: 1,
            event_occurred_at: Timestamp(0),
        }
    }

    #[test]
    fn endpoints_take_turns_and_respect_their_cap() {
        let mut s = Scheduler::default();
        for n in 0..4 {
            s.add(job(n, 1, 0), Timestamp(0));
        }
        s.add(job(10, 2, 0), Timestamp(0));
        let a = s.next_job(10, |_| 1).unwrap();
        let b = s.next_job(10, |_| 1).unwrap();
        assert_eq!((a.endpoint_id.0[0], b.endpoint_id.0[0]), (1, 2));
        assert!(s.next_job(10, |_| 1).is_none(), "endpoint 1 is at its cap");
        s.finished(a.endpoint_id, a.delivery_id);
        assert_eq!(
            s.next_job(10, |_| 1).unwrap().delivery_id,
            DeliveryId([1; 16])
        );
    }

    #[test]
    fn waiting_jobs_become_due() {
        let mut s = Scheduler::default();
        s.add(job(1, 1, 100), Timestamp(0));
        assert!(s.next_job(10, |_| 4).is_none());
        assert_eq!(s.next_due(), Some(Timestamp(100)));
        s.release_due(Timestamp(100));
        assert!(s.next_job(10, |_| 4).is_some());
    }

    #[test]
    fn a_held_delivery_only_takes_the_newer_lease() {
        let mut s = Scheduler::default();
        s.add(job(1, 1, 0), Timestamp(0));
        let mut again = job(1, 1, 0);
        again.lease_version = 5;
        s.add(again, Timestamp(0));
        assert_eq!(s.lease(&DeliveryId([1; 16])), Some(5));
        assert!(s.next_job(10, |_| 4).is_some());
        assert!(
            s.next_job(10, |_| 4).is_none(),
            "the delivery was queued twice"
        );
    }
}
