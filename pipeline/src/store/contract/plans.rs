//! The rules of fan-out's plans: idempotent writes, first rows under the
//! plan's lease, stale late results, lapsed nodes' work taken over.

use std::time::Duration;

use super::{
    ContractError, Fixture, ago, attempt, batch, check, held_by_a, ids, later, reclaim, retry,
    sorted,
};
use crate::delivery::{DeliveryJob, DeliveryStatus};
use crate::store::{DispatchStore, FanoutStore};
use crate::time::Timestamp;

pub(super) async fn fanout_is_idempotent<F: Fixture>(f: &F) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    let (event, deliveries) = batch(1_000, Some("a"), Timestamp::now());
    let made = sorted(
        store
            .materialize(std::slice::from_ref(&event), &deliveries)
            .await?,
    );
    let all = sorted(deliveries.iter().map(|d| d.id).collect());
    check(made == all, || {
        format!("a first fan-out hands over every delivery: {made:?}")
    })?;
    let again = sorted(
        store
            .materialize(std::slice::from_ref(&event), &deliveries)
            .await?,
    );
    check(again == all, || {
        format!(
            "a retry of a batch whose answer was lost hands over the same deliveries: {again:?}"
        )
    })?;
    let (_, newer) = batch(1_000, Some("a"), later(Duration::from_millis(5)));
    let redo = store
        .materialize(std::slice::from_ref(&event), &newer)
        .await?;
    check(redo.is_empty(), || {
        format!(
            "a redo by a later run hands over nothing (the plan is the start-up reclaim's): {redo:?}"
        )
    })?;
    let without = sorted(store.without_rows(&all).await?);
    check(without == all, || {
        format!("a planned delivery has no row: {without:?}")
    })?;
    // Empty batches are fine.
    check(store.materialize(&[], &[]).await?.is_empty(), || {
        "an empty batch hands over nothing".into()
    })?;
    Ok(())
}

pub(super) async fn first_attempts_write_rows_and_finish_plans<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let (store, (event, deliveries), jobs) = held_by_a(f, 2_000, &[]).await?;
    check(jobs.len() == 3, || {
        format!("a restart takes back its three planned deliveries: {jobs:?}")
    })?;
    check(
        jobs.iter().all(|j| {
            !j.materialized
                && !j.after_unknown
                && j.lease_version == 2
                && j.attempt_count == 0
                && j.payload == event.payload
                && j.order.as_ref().is_some_and(|o| o.key == event.key)
        }),
        || {
            format!(
                "a reclaimed plan's jobs: no row, second lease, the event's bytes and order: {jobs:?}"
            )
        },
    )?;
    let retried = store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    check(retried.is_empty(), || {
        format!("a plan claimed since is its claimant's, not a retry's: {retried:?}")
    })?;

    let stale = store
        .record(&[attempt(&jobs[0], DeliveryStatus::Succeeded)])
        .await?;
    check(stale.is_empty(), || {
        format!("a first attempt under the plan's lease is applied: stale {stale:?}")
    })?;
    let rest = sorted(store.without_rows(&ids(&jobs)).await?);
    check(rest == ids(&jobs[1..]), || {
        format!("the first attempt wrote its delivery's row, and only that: {rest:?}")
    })?;
    let again = store
        .record(&[attempt(&jobs[0], DeliveryStatus::Succeeded)])
        .await?;
    check(again == vec![jobs[0].delivery_id], || {
        format!("a first attempt recorded again meets its row and is stale: {again:?}")
    })?;

    let stale = store
        .record(&[
            attempt(&jobs[1], DeliveryStatus::Succeeded),
            attempt(&jobs[2], DeliveryStatus::Succeeded),
        ])
        .await?;
    check(stale.is_empty(), || format!("stale {stale:?}"))?;
    check(store.without_rows(&ids(&jobs)).await?.is_empty(), || {
        "every delivery has its row".into()
    })?;
    let (left, next) = store
        .reclaim_plans("a", None, 100, false, later(Duration::from_secs(1)))
        .await?;
    check(left.is_empty() && next.is_none(), || {
        format!("a plan whose deliveries all have rows is done: {left:?}")
    })?;
    let redo = store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    check(redo.is_empty(), || {
        format!("fan-out redone after every row was written plans nothing: {redo:?}")
    })?;
    check(store.tidy_plans().await? == 0, || {
        "nothing to tidy when no plan is left".into()
    })?;
    Ok(())
}

pub(super) async fn lapsed_nodes_work_moves_and_late_results_are_stale<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    check(
        store.node_started("a", Duration::from_millis(50)).await?,
        || "a node never seen counts as clean".into(),
    )?;
    let (event, deliveries) = batch(3_000, Some("a"), ago(Duration::from_secs(1)));
    store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    // A second event, held by `a` and attempted once, its retry held.
    let (event2, deliveries2) = batch(3_001, Some("a"), ago(Duration::from_secs(1)));
    store
        .materialize(std::slice::from_ref(&event2), &deliveries2[..1])
        .await?;
    let (a_jobs, held): (Vec<DeliveryJob>, Vec<DeliveryJob>) = reclaim(&store, "a")
        .await?
        .into_iter()
        .partition(|j| j.event_id == event.id);
    check(a_jobs.len() == 3 && held.len() == 1, || {
        format!("a restart takes back both plans: {a_jobs:?} {held:?}")
    })?;
    let stale = store
        .record(&[retry(&held[0], later(Duration::from_secs(3600)), true)])
        .await?;
    check(stale.is_empty(), || format!("stale {stale:?}"))?;

    tokio::time::sleep(Duration::from_millis(300)).await;
    store.node_started("b", Duration::from_secs(60)).await?;
    let b_jobs = store.claim_due("b", 100, &[]).await?;
    check(b_jobs.len() == 4, || {
        format!("b takes the lapsed node's held delivery and its plan's three: {b_jobs:?}")
    })?;
    check(b_jobs.iter().all(|j| j.after_unknown), || {
        format!(
            "a node that did not stop cleanly may have sent: every job after_unknown: {b_jobs:?}"
        )
    })?;
    check(
        b_jobs[0].delivery_id == held[0].delivery_id && b_jobs[0].materialized,
        || format!("deliveries with rows come before plans: {b_jobs:?}"),
    )?;
    let first = &a_jobs[0];
    let b_first = b_jobs
        .iter()
        .find(|j| j.delivery_id == first.delivery_id)
        .ok_or_else(|| ContractError::Broken("b has a's first delivery".into()))?;
    check(
        b_first.lease_version > first.lease_version && !b_first.materialized,
        || format!("a new lease, still no row: {b_first:?}"),
    )?;
    check(b_first.next_auto_number() == 2, || {
        "one number is left for the unknown attempt".into()
    })?;

    let late = store
        .record(&[attempt(first, DeliveryStatus::Succeeded)])
        .await?;
    check(late == vec![first.delivery_id], || {
        format!("a's late result under the old lease is stale: {late:?}")
    })?;
    check(
        store.without_rows(&[first.delivery_id]).await? == vec![first.delivery_id],
        || "no row is written under an old lease".into(),
    )?;
    let stale = store
        .record(&[attempt(b_first, DeliveryStatus::Succeeded)])
        .await?;
    check(stale.is_empty(), || {
        format!("b's result under its lease is applied: stale {stale:?}")
    })?;
    let c = store.claim_due("c", 100, &[]).await?;
    check(c.is_empty(), || {
        format!("nothing of a is left, and b (live) keeps its own: {c:?}")
    })?;
    Ok(())
}

pub(super) async fn plans_nobody_holds_are_claimed_once<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    store.node_started("a", Duration::from_secs(60)).await?;
    let (event, deliveries) = batch(4_000, None, ago(Duration::from_secs(30)));
    let made = store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    check(made.len() == 3, || format!("{made:?}"))?;
    let again = store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    check(again.is_empty(), || {
        format!("a retry does not hand over a plan nobody holds (the sweeps claim it): {again:?}")
    })?;
    let jobs = store.claim_due("a", 100, &[]).await?;
    check(
        jobs.len() == 3 && jobs.iter().all(|j| !j.after_unknown && !j.materialized),
        || format!("a plan nobody held is claimed, nothing unknown: {jobs:?}"),
    )?;
    let twice = store.claim_due("b", 100, &[]).await?;
    check(twice.is_empty(), || format!("claimed once: {twice:?}"))?;
    Ok(())
}

pub(super) async fn a_first_attempt_and_its_retry_in_one_batch<F: Fixture>(
    f: &F,
) -> Result<(), ContractError> {
    let store = f.fresh().await?;
    store.node_started("a", Duration::from_secs(60)).await?;
    store.node_started("b", Duration::from_secs(60)).await?;
    let (event, deliveries) = batch(4_500, Some("a"), ago(Duration::from_secs(1)));
    store
        .materialize(std::slice::from_ref(&event), &deliveries[..1])
        .await?;
    let jobs = reclaim(&store, "a").await?;
    let job = &jobs[0];
    // The first attempt fails and its retry goes at once: the dispatcher
    // marks the job as having its row when it hands the first result
    // over, so the retry's record carries no first write; both reach the
    // store in one batch. The retry is handed back, due now.
    let first = retry(job, later(Duration::from_secs(3600)), true);
    let next = DeliveryJob {
        attempt_count: 1,
        materialized: true,
        ..job.clone()
    };
    let second = retry(&next, Timestamp::now(), false);
    let stale = store.record(&[first, second]).await?;
    check(stale.is_empty(), || format!("stale {stale:?}"))?;
    let due = store.claim_due("b", 100, &[]).await?;
    check(
        ids(&due) == vec![job.delivery_id] && due[0].attempt_count == 2,
        || {
            format!(
                "the row is written with the latest attempt's state (handed back after two attempts), not the first's (held): {due:?}"
            )
        },
    )?;
    Ok(())
}
