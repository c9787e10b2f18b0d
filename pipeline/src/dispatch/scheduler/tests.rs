//! Unit tests of the schedule: turns and caps, tenant weights and budgets,
//! timers, circuits, rate limits, and per-object chains. [`job`] is shared
//! with the other dispatch tests.

use super::*;
use crate::event::{EventKey, EventType};
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
    let held =
        |jobs: &[DeliveryJob], t: &str| jobs.iter().filter(|j| j.tenant_id.as_str() == t).count();
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
