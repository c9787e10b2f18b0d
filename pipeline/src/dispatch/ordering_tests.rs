//! Property tests of per-object ordering in the scheduler: random
//! arrivals (some out of commit order), starts, successes, retries,
//! terminal failures and cancels at an ordered and an unordered endpoint.
//!
//! Checked throughout: at the ordered endpoint at most one delivery of an
//! object is out at a time, and an object's deliveries start in commit
//! order, except one that arrived after a later delivery of its object had
//! started (nothing can make it go first then). At the end, with every
//! failure turned into success, everything not cancelled has finished and
//! the scheduler holds nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;

use super::breaker::Health;
use super::scheduler::tests::job;
use super::scheduler::{Limits, Scheduler, SchedulerConfig};
use crate::delivery::{DeliveryJob, ObjectOrder};
use crate::event::EventKey;
use crate::ids::{DeliveryId, EndpointId, Lsn};
use crate::time::Timestamp;

const ORDERED: u8 = 1;
const UNORDERED: u8 = 2;

#[derive(Debug, Clone)]
enum Op {
    /// A delivery of `object` at `endpoint`; `back` > 0 makes it arrive
    /// with a commit position that many places before the newest.
    Add {
        endpoint: u8,
        object: u8,
        back: u8,
    },
    Start,
    /// The `slot`-th attempt out finishes: 0 success, 1 retry, 2 failed for
    /// good.
    Finish {
        slot: usize,
        how: u8,
    },
    Cancel {
        pick: usize,
    },
    Advance {
        ms: u16,
    },
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (prop_oneof![Just(ORDERED), Just(UNORDERED)], 0u8..3, prop_oneof![8 => Just(0u8), 1 => 1u8..4])
                .prop_map(|(endpoint, object, back)| Op::Add { endpoint, object, back }),
            4 => Just(Op::Start),
            4 => (0usize..8, 0u8..3).prop_map(|(slot, how)| Op::Finish { slot, how }),
            1 => (0usize..64).prop_map(|pick| Op::Cancel { pick }),
            2 => (0u16..500).prop_map(|ms| Op::Advance { ms }),
        ],
        1..200,
    )
}

fn limits(_: &EndpointId) -> Limits {
    Limits {
        max_in_flight: 8,
        rate_per_sec: None,
    }
}

struct Model {
    s: Scheduler,
    now: i64,
    next_n: u32,
    next_pos: u64,
    /// Every automatic delivery added and not yet ended: its job.
    live: BTreeMap<u32, DeliveryJob>,
    out: Vec<DeliveryJob>,
    /// Ordered endpoint: positions started per object.
    started: HashMap<String, Vec<EventKey>>,
    /// Deliveries that arrived after a later one of their object started.
    late: HashSet<DeliveryId>,
    ended: HashSet<u32>,
}

fn n_of(j: &DeliveryJob) -> u32 {
    u32::from_be_bytes(j.delivery_id.0[..4].try_into().unwrap())
}

impl Model {
    fn new() -> Self {
        let mut s = Scheduler::new(SchedulerConfig::default());
        s.set_ordered(HashSet::from([EndpointId([ORDERED; 16])]), Timestamp(0));
        Model {
            s,
            now: 0,
            next_n: 0,
            next_pos: 1000,
            live: BTreeMap::new(),
            out: Vec::new(),
            started: HashMap::new(),
            late: HashSet::new(),
            ended: HashSet::new(),
        }
    }

    fn add(&mut self, endpoint: u8, object: u8, back: u8) {
        self.next_n += 1;
        self.next_pos += 10;
        let key = EventKey {
            commit_lsn: Lsn(self.next_pos - u64::from(back) * 10 - u64::from(back > 0)),
            tx_ordinal: 0,
        };
        let mut j = job(self.next_n, endpoint, "t", self.now);
        j.order = Some(ObjectOrder {
            object_id: object.to_string().into(),
            key,
        });
        if endpoint == ORDERED {
            let obj = object.to_string();
            if self
                .started
                .get(&obj)
                .is_some_and(|v| v.iter().any(|k| *k > key))
            {
                self.late.insert(j.delivery_id);
            }
        }
        self.live.insert(self.next_n, j.clone());
        self.s.add(j, Timestamp(self.now));
    }

    fn start_all(&mut self) {
        while let Some(j) = self.s.next_job(Timestamp(self.now), limits) {
            if j.endpoint_id.0[0] == ORDERED {
                let order = j.order.clone().unwrap();
                let obj = order.object_id.to_string();
                let out_of_same = self
                    .out
                    .iter()
                    .filter(|o| {
                        // A cancelled delivery's attempt may still be out.
                        o.endpoint_id == j.endpoint_id
                            && o.order.as_ref().unwrap().object_id == order.object_id
                            && self.live.contains_key(&n_of(o))
                    })
                    .count();
                assert_eq!(out_of_same, 0, "two deliveries of object {obj} out at once");
                let starts = self.started.entry(obj.clone()).or_default();
                let first_start = !starts.contains(&order.key);
                if first_start && !self.late.contains(&j.delivery_id) {
                    assert!(
                        starts.iter().all(|k| *k < order.key),
                        "object {obj}: {:?} started after {starts:?}",
                        order.key
                    );
                }
                if first_start {
                    starts.push(order.key);
                }
            }
            self.out.push(j);
        }
    }

    fn finish(&mut self, slot: usize, how: u8) {
        if self.out.is_empty() {
            return;
        }
        let j = self.out.remove(slot % self.out.len());
        let n = n_of(&j);
        let health = if how == 0 {
            Health::Success
        } else {
            Health::Failure
        };
        self.s.finished(
            j.endpoint_id,
            Some(j.delivery_id),
            health,
            Timestamp(self.now),
        );
        match how {
            1 if self.live.contains_key(&n) => {
                let mut again = j;
                again.attempt_count += 1;
                self.s.reschedule(again, Timestamp(self.now + 100));
            }
            _ => {
                if how == 2 {
                    self.s.head_failed(&j.delivery_id);
                }
                self.live.remove(&n);
                self.ended.insert(n);
            }
        }
    }

    fn cancel(&mut self, pick: usize) {
        if self.live.is_empty() {
            return;
        }
        let n = *self.live.keys().nth(pick % self.live.len()).unwrap();
        let j = self.live.remove(&n).unwrap();
        self.s.cancel(&j.delivery_id);
        self.ended.insert(n);
        // An attempt of it already out still finishes; not rescheduled.
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn ordered_objects_go_one_at_a_time_in_commit_order(ops in ops()) {
        let mut m = Model::new();
        for op in ops {
            match op {
                Op::Add { endpoint, object, back } => m.add(endpoint, object, back),
                Op::Start => m.start_all(),
                Op::Finish { slot, how } => m.finish(slot, how),
                Op::Cancel { pick } => m.cancel(pick),
                Op::Advance { ms } => {
                    m.now += i64::from(ms) * 1000;
                    m.s.release_due(Timestamp(m.now));
                }
            }
        }
        // Everything succeeds from now on.
        for _ in 0..10_000 {
            m.now += 200_000;
            m.s.release_due(Timestamp(m.now));
            m.start_all();
            if m.out.is_empty() && m.s.held() == 0 {
                break;
            }
            while !m.out.is_empty() {
                m.finish(0, 0);
            }
        }
        prop_assert!(m.out.is_empty());
        prop_assert_eq!(m.s.held(), 0, "still held: {:?}", m.live.keys().collect::<Vec<_>>());
        prop_assert!(m.live.is_empty(), "never finished: {:?}", m.live.keys().collect::<Vec<_>>());
    }
}
