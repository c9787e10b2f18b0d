//! The rules of claims and the rest: held, handed-back and ended
//! deliveries, nodes' clean stops, replays, cancellations, deliveries
//! partitions and endpoint health.

use std::time::Duration;

use super::{
    ContractError, ENDPOINTS, Fixture, TENANT, ago, attempt, batch, check, hand_back, held_by_a,
    ids, later, manual, retry, sorted,
};
use crate::delivery::{DeliveryJob, DeliveryStatus, EndReason, NewDelivery};
use crate::dispatch::breaker::CircuitState;
use crate::ids::{EndpointId, TenantId};
use crate::routing::{Scope, TOPIC_HELD, partition_of};
use crate::store::{DispatchStore, EndpointHealth, FanoutStore, Transition};
use crate::time::Timestamp;

pub(super) async fn retries_are_held_handed_back_and_ended<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let (store, _, jobs) = held_by_a(f, 5_000, &["a", "b"]).await?;
    let soon = later(Duration::from_secs(1));
    let stale = store
        .record(&[
            retry(&jobs[0], soon, true),
            retry(&jobs[1], Timestamp::now(), false),
        ])
        .await?;
    check(stale.is_empty(), || format!("stale {stale:?}"))?;

    // Delivery 1 was handed back due now: any node claims it.
    let b = store.claim_due("b", 100, &[jobs[1].endpoint_id]).await?;
    check(b.is_empty(), || {
        format!("a due delivery of an excluded endpoint (open circuit) stays: {b:?}")
    })?;
    let b = store.claim_due("b", 100, &[]).await?;
    check(
        ids(&b) == vec![jobs[1].delivery_id]
            && b[0].materialized
            && b[0].attempt_count == 1
            && !b[0].after_unknown,
        || format!("b claims the delivery handed back, with its one attempt: {b:?}"),
    )?;

    // Delivery 0 is held by a (live): nobody else takes it, a's restart
    // does.
    let own = store.reclaim_own("a", None, 100, false).await?;
    check(ids(&own) == vec![jobs[0].delivery_id], || {
        format!("a restart reclaims the retry it held: {own:?}")
    })?;
    let r = &own[0];
    check(
        r.attempt_count == 1 && r.lease_version > jobs[0].lease_version,
        || format!("reclaimed under a new lease with its attempt counted: {r:?}"),
    )?;
    let after = store
        .reclaim_own("a", Some(r.delivery_id), 100, false)
        .await?;
    check(after.is_empty(), || {
        format!("reclaim pages by delivery id: {after:?}")
    })?;

    // Handed back, not before `soon`: claimed once due.
    store.release(&[hand_back(r, soon)]).await?;
    let early = store.claim_due("b", 100, &[]).await?;
    check(early.is_empty(), || {
        format!("a delivery handed back is not due before its time: {early:?}")
    })?;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let due = store.claim_due("b", 100, &[]).await?;
    check(ids(&due) == vec![r.delivery_id], || {
        format!("once due, a delivery handed back is claimed: {due:?}")
    })?;

    // Ends: one under an old lease changes nothing; one under the current
    // lease ends it for good; a planned delivery ended gets its row.
    let end = |job: &DeliveryJob, lease: i64| Transition {
        first_write: job.first_write(),
        delivery_id: job.delivery_id,
        lease_version: lease,
        status: DeliveryStatus::Failed,
        reason: EndReason::EndpointDeleted,
    };
    store.transition(&[end(&due[0], r.lease_version)]).await?;
    store
        .release(&[hand_back(&due[0], Timestamp::now())])
        .await?;
    let back = store.claim_due("a", 100, &[]).await?;
    check(ids(&back) == vec![due[0].delivery_id], || {
        format!("an end under an old lease changes nothing: {back:?}")
    })?;
    store
        .transition(&[
            end(&back[0], back[0].lease_version),
            end(&jobs[2], jobs[2].lease_version),
        ])
        .await?;
    check(
        store.without_rows(&[jobs[2].delivery_id]).await?.is_empty(),
        || "a planned delivery ended before an attempt gets its row".into(),
    )?;
    for d in [&back[0], &b[0]] {
        store.release(&[hand_back(d, Timestamp::now())]).await?;
    }
    let left = store.claim_due("a", 100, &[]).await?;
    check(ids(&left) == vec![b[0].delivery_id], || {
        format!("an ended delivery is never claimed again; a pending one is: {left:?}")
    })?;
    let stale = store
        .record(&[attempt(&back[0], DeliveryStatus::Succeeded)])
        .await?;
    check(stale == vec![back[0].delivery_id], || {
        format!("a result for an ended delivery is stale: {stale:?}")
    })?;
    Ok(())
}

pub(super) async fn nodes_report_a_clean_stop<F: Fixture>(f: &F) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    let lease = Duration::from_secs(60);
    check(store.node_started("n", lease).await?, || {
        "a node never seen counts as clean".into()
    })?;
    store.heartbeat("n", lease).await?;
    check(!store.node_started("n", lease).await?, || {
        "a run that did not record its stop was not clean".into()
    })?;
    store.node_stopped("n").await?;
    check(store.node_started("n", lease).await?, || {
        "a run that recorded its stop was clean".into()
    })?;
    Ok(())
}

pub(super) async fn replays_are_claimed_once_and_closed<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let lease = Duration::from_secs(60);
    let (store, _, jobs) = held_by_a(f, 6_000, &["a", "h"]).await?;
    // 0 succeeded; 1 is held by a (live) for a retry.
    store
        .record(&[
            attempt(&jobs[0], DeliveryStatus::Succeeded),
            retry(&jobs[1], later(Duration::from_secs(3600)), true),
        ])
        .await?;
    let first = f.request_replay(&store, jobs[0].delivery_id).await?;
    let held = f.request_replay(&store, jobs[1].delivery_id).await?;

    let claimed = store.claim_replays("x", 100, lease).await?;
    check(ids(&claimed) == vec![jobs[0].delivery_id], || {
        format!(
            "x claims the replay of a delivery no live node holds, not of one a holds: {claimed:?}"
        )
    })?;
    let job = &claimed[0];
    check(
        job.replay
            .is_some_and(|r| r.request_id == first && r.number == 2)
            && job.manual_attempt_count == 1
            && job.materialized,
        || format!("the manual attempt takes the next number of the one sequence: {job:?}"),
    )?;
    check(
        store.claim_replays("y", 100, lease).await?.is_empty(),
        || "a claimed replay is not claimed again".into(),
    )?;
    let by_holder = store.claim_replays("a", 100, lease).await?;
    check(ids(&by_holder) == vec![jobs[1].delivery_id], || {
        format!("the holder claims the replay of its own delivery: {by_holder:?}")
    })?;
    store.reject_replay(held, "the endpoint is gone").await?;

    store.record(&[manual(job, true)]).await?;
    // The node restarts: claims of its previous run are free again, but
    // closed requests stay closed.
    store.node_started("x", lease).await?;
    store.node_started("a", lease).await?;
    let none = store.claim_replays("z", 100, lease).await?;
    check(none.is_empty(), || {
        format!("a replay closed by its attempt or its rejection is not claimed again: {none:?}")
    })?;
    let again = f.request_replay(&store, jobs[0].delivery_id).await?;
    let second = store.claim_replays("z", 100, lease).await?;
    check(
        second.len() == 1
            && second[0]
                .replay
                .is_some_and(|r| r.request_id == again && r.number == 3),
        || format!("a second replay numbers after the first: {second:?}"),
    )?;
    Ok(())
}

pub(super) async fn a_replays_success_ends_the_schedule<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let lease = Duration::from_secs(60);
    let (store, _, jobs) = held_by_a(f, 6_500, &["a"]).await?;
    // 0 handed back due now, 1 held by a for a retry.
    store
        .record(&[
            retry(&jobs[0], Timestamp::now(), false),
            retry(&jobs[1], later(Duration::from_secs(3600)), true),
        ])
        .await?;
    f.request_replay(&store, jobs[0].delivery_id).await?;
    f.request_replay(&store, jobs[1].delivery_id).await?;
    let replays = store.claim_replays("a", 100, lease).await?;
    check(replays.len() == 2, || {
        format!("the holder claims both replays: {replays:?}")
    })?;
    let due = store.claim_due("b", 100, &[]).await?;
    check(due.is_empty(), || {
        format!(
            "a due delivery whose replay is claimed and not recorded is not claimed (its success would end it): {due:?}"
        )
    })?;
    store
        .record(&replays.iter().map(|j| manual(j, true)).collect::<Vec<_>>())
        .await?;
    let due = store.claim_due("b", 100, &[]).await?;
    check(due.is_empty(), || {
        format!("a replay's success ends the automatic schedule: {due:?}")
    })?;
    let late = store
        .record(&[attempt(&jobs[1], DeliveryStatus::Pending)])
        .await?;
    check(late == vec![jobs[1].delivery_id], || {
        format!("the holder's later automatic result is stale once a replay succeeded: {late:?}")
    })?;
    let own = store.reclaim_own("a", None, 100, false).await?;
    check(own.is_empty(), || {
        format!("a delivery a replay ended is no longer its holder's: {own:?}")
    })?;
    Ok(())
}

pub(super) async fn cancellations_are_read_from_a_position<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let (store, _, jobs) = held_by_a(f, 7_000, &[]).await?;
    let (start_list, start) = store.cancellations_after(None, 10).await?;
    check(start_list.is_empty(), || {
        "with no position, none and the current last position".into()
    })?;
    let next = later(Duration::from_secs(3600));
    store
        .record(&[retry(&jobs[0], next, false), retry(&jobs[1], next, false)])
        .await?;
    f.cancel(&store, jobs[1].delivery_id).await?;
    f.cancel(&store, jobs[0].delivery_id).await?;
    let (first, at) = store.cancellations_after(Some(start), 1).await?;
    check(first == vec![jobs[1].delivery_id], || {
        format!("cancellations come in the order made, `limit` at a time: {first:?}")
    })?;
    let (second, end) = store.cancellations_after(Some(at), 10).await?;
    check(second == vec![jobs[0].delivery_id], || {
        format!("the next read continues after the position returned: {second:?}")
    })?;
    let (none, same) = store.cancellations_after(Some(end), 10).await?;
    check(none.is_empty() && same == end, || {
        format!("nothing after the last: {none:?} at {same}")
    })?;
    Ok(())
}

pub(super) async fn partitions_take_their_own<F: Fixture>(f: &F) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    let lease = Duration::from_secs(60);
    let scope = |partition| Scope {
        partition,
        partitions: 2,
        shards: vec![(ENDPOINTS[2], 2)],
    };
    let in_part = |d: &NewDelivery, p: u32| {
        let shards = if d.endpoint_id == ENDPOINTS[2] { 2 } else { 1 };
        partition_of(d.endpoint_id, d.id, 2, shards) == p
    };
    let mut all = Vec::new();
    for lsn in 8_000..8_004 {
        let (event, deliveries) = batch(lsn, Some(TOPIC_HELD), ago(Duration::from_secs(1)));
        store
            .materialize(std::slice::from_ref(&event), &deliveries)
            .await?;
        all.extend(deliveries);
    }
    let mut taken = Vec::new();
    for p in 0..2 {
        let node = format!("m{}t1", crate::routing::node_suffix(p));
        store.node_started(&node, lease).await?;
        let jobs = store
            .take_partition(&node, &scope(p))
            .await?
            .ok_or_else(|| {
                ContractError::Broken("a partition nobody held before is taken at once".into())
            })?;
        let want = sorted(all.iter().filter(|d| in_part(d, p)).map(|d| d.id).collect());
        check(ids(&jobs) == want, || {
            format!("partition {p} takes exactly its planned deliveries: {jobs:?}")
        })?;
        check(
            jobs.iter().all(|j| !j.after_unknown && !j.materialized),
            || format!("no earlier dispatcher: nothing unknown: {jobs:?}"),
        )?;
        taken.extend(jobs);
    }
    check(ids(&taken).len() == all.len(), || {
        "the partitions together take every delivery".into()
    })?;
    let node0 = format!("m{}t1", crate::routing::node_suffix(0));
    let next0 = format!("n{}t2", crate::routing::node_suffix(0));
    check(
        store.take_partition(&next0, &scope(0)).await?.is_none(),
        || "a partition waits while its earlier dispatcher runs".into(),
    )?;
    store.node_stopped(&node0).await?;
    check(
        store.take_partition(&next0, &scope(0)).await?.is_some(),
        || "a partition is taken once its earlier dispatcher stopped".into(),
    )?;

    // A retry handed back in partition 0 is claimed by partition 0 only.
    let job = taken
        .iter()
        .find(|j| {
            let shards = if j.endpoint_id == ENDPOINTS[2] { 2 } else { 1 };
            partition_of(j.endpoint_id, j.delivery_id, 2, shards) == 0
        })
        .ok_or_else(|| ContractError::Broken("partition 0 has a delivery".into()))?;
    store.record(&[retry(job, Timestamp::now(), false)]).await?;
    let other = store.claim_scoped("o", 100, &[], &scope(1)).await?;
    check(other.is_empty(), || {
        format!("another partition's delivery is not claimed: {other:?}")
    })?;
    let own = store.claim_scoped(&next0, 100, &[], &scope(0)).await?;
    check(ids(&own) == vec![job.delivery_id], || {
        format!("the partition claims its due delivery: {own:?}")
    })?;
    Ok(())
}

pub(super) async fn health_reads_back_as_saved<F: Fixture>(f: &F) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    let tenant = TenantId::new(TENANT).expect("a valid tenant");
    let at = |s: i64| Timestamp(1_796_000_000_000_000 + s * 1_000_000);
    let health = |ep: EndpointId, failures: u32, circuit: CircuitState| EndpointHealth {
        endpoint_id: ep,
        tenant_id: tenant.clone(),
        failing_since: (failures > 0).then(|| at(1)),
        consecutive_failures: failures,
        circuit,
        open_until: (circuit == CircuitState::Open).then(|| at(60)),
    };
    store
        .save_health(&[
            health(ENDPOINTS[0], 3, CircuitState::Closed),
            health(ENDPOINTS[1], 9, CircuitState::Open),
            health(ENDPOINTS[0], 5, CircuitState::HalfOpen),
        ])
        .await?;
    let mut loaded = store.load_health().await?;
    loaded.sort_by_key(|h| h.endpoint_id);
    let want = vec![
        health(ENDPOINTS[0], 5, CircuitState::HalfOpen),
        health(ENDPOINTS[1], 9, CircuitState::Open),
    ];
    check(loaded == want, || {
        format!("health reads back as saved, the latest per endpoint: {loaded:?}")
    })?;
    store
        .save_health(&[health(ENDPOINTS[1], 0, CircuitState::Closed)])
        .await?;
    let loaded = store.load_health().await?;
    check(
        loaded
            .iter()
            .any(|h| h == &health(ENDPOINTS[1], 0, CircuitState::Closed)),
        || format!("a later save replaces the earlier one: {loaded:?}"),
    )?;
    Ok(())
}
