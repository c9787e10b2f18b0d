//! The contract every fan-out and dispatch store keeps, checked through the
//! traits alone.
//!
//! Each check takes a fresh store from the [`Fixture`] (tenant [`TENANT`]
//! with the endpoints [`ENDPOINTS`]) and fails with a message naming the
//! rule it broke. The in-memory twin ([`super::memory`]) runs the suite in
//! this crate's unit tests; the Postgres store runs it against a real
//! cluster in `walhook-sql`'s tests. Leases lapse in real time (a few
//! hundred milliseconds), so the suite takes a few seconds.
//!
//! The rules:
//! - fan-out's write is idempotent: a redo stores nothing twice, and a retry
//!   of a batch whose answer was lost hands over the same deliveries, while
//!   a plan claimed since stays its claimant's;
//! - a delivery's row is written with its first attempt, under its plan's
//!   lease (with the latest state when a retry came in the same batch), and
//!   a plan whose deliveries all have rows is gone;
//! - a result under a lease that moved on is stale and changes no state;
//! - plans and deliveries of a node whose lease lapsed move to another node,
//!   marked `after_unknown` when that node did not stop cleanly;
//! - a held retry stays its holder's, a handed-back one is claimed by any
//!   node once due, an ended delivery by none;
//! - a node's start says whether its previous run stopped cleanly;
//! - a replay is claimed once, takes the next number of the delivery's one
//!   sequence, and is closed by its attempt or its rejection; while it is
//!   claimed the automatic schedule waits, and its success ends it;
//! - cancellations are read in order, from a position;
//! - a deliveries partition's dispatcher takes and claims its own
//!   deliveries only, and waits while an earlier one still runs;
//! - endpoint health reads back as saved, the latest per endpoint.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{DispatchStore, FanoutStore, StoreError};
use crate::delivery::{
    AttemptRecord, DeliveryJob, DeliveryStatus, NewDelivery, OutcomeKind, Trigger,
};
use crate::dispatch::outcome::ErrorClass;
use crate::event::{Event, EventKey, EventType};
use crate::ids::{AttemptId, DeliveryId, EndpointId, EventId, Lsn, TenantId};
use crate::time::Timestamp;

mod claims;
mod plans;

use claims::{
    a_replays_success_ends_the_schedule, cancellations_are_read_from_a_position,
    health_reads_back_as_saved, nodes_report_a_clean_stop, partitions_take_their_own,
    replays_are_claimed_once_and_closed, retries_are_held_handed_back_and_ended,
};
use plans::{
    a_first_attempt_and_its_retry_in_one_batch, fanout_is_idempotent,
    first_attempts_write_rows_and_finish_plans, lapsed_nodes_work_moves_and_late_results_are_stale,
    plans_nobody_holds_are_claimed_once,
};

/// The tenant a fresh store knows.
pub const TENANT: &str = "acme";

/// The endpoints of [`TENANT`] a fresh store knows.
pub const ENDPOINTS: [EndpointId; 3] = [
    EndpointId([1; 16]),
    EndpointId([2; 16]),
    EndpointId([3; 16]),
];

/// Makes the stores the contract is checked on.
pub trait Fixture: Sync {
    /// The store under test.
    type Store: FanoutStore + DispatchStore;

    /// An empty store that knows tenant [`TENANT`] and its [`ENDPOINTS`].
    fn fresh(&self) -> impl Future<Output = Result<Self::Store, StoreError>> + Send;

    /// Asks for a manual attempt of `delivery` (which has its row), as the
    /// API does; returns the request's id.
    fn request_replay(
        &self,
        store: &Self::Store,
        delivery: DeliveryId,
    ) -> impl Future<Output = Result<i64, StoreError>> + Send;

    /// Cancels pending `delivery` (which has its row), as the API does.
    fn cancel(
        &self,
        store: &Self::Store,
        delivery: DeliveryId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// A failed rule of a store's contract (this one or the capture
/// ledger's), or the store's own failure.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// A rule did not hold.
    #[error("store contract broken: {0}")]
    Broken(String),
    /// The store itself failed.
    #[error("store error during contract check")]
    Store(#[from] StoreError),
}

/// `Ok` when `ok`, else the rule `rule` describes, broken.
pub(crate) fn check(ok: bool, rule: impl FnOnce() -> String) -> Result<(), ContractError> {
    if ok {
        Ok(())
    } else {
        Err(ContractError::Broken(rule()))
    }
}

/// Runs every check, each on a fresh store; stops at the first broken rule.
pub async fn check_all<F: Fixture>(fixture: &F) -> Result<(), ContractError> {
    fanout_is_idempotent(fixture).await?;
    first_attempts_write_rows_and_finish_plans(fixture).await?;
    lapsed_nodes_work_moves_and_late_results_are_stale(fixture).await?;
    plans_nobody_holds_are_claimed_once(fixture).await?;
    a_first_attempt_and_its_retry_in_one_batch(fixture).await?;
    retries_are_held_handed_back_and_ended(fixture).await?;
    nodes_report_a_clean_stop(fixture).await?;
    replays_are_claimed_once_and_closed(fixture).await?;
    a_replays_success_ends_the_schedule(fixture).await?;
    cancellations_are_read_from_a_position(fixture).await?;
    partitions_take_their_own(fixture).await?;
    health_reads_back_as_saved(fixture).await?;
    Ok(())
}

/// An event committed at `lsn` and its deliveries to every endpoint,
/// held by `owner`, made at `created`.
pub fn batch(lsn: u64, owner: Option<&str>, created: Timestamp) -> (Event, Vec<NewDelivery>) {
    let tenant = TenantId::new(TENANT).expect("a valid tenant");
    let event = Event {
        id: EventId::derive("contract", Lsn(lsn), 0, "orders"),
        source: Arc::from("contract"),
        key: EventKey {
            commit_lsn: Lsn(lsn),
            tx_ordinal: 0,
        },
        tenant_id: tenant.clone(),
        event_type: EventType::new("order.created").expect("a valid type"),
        schema_version: 1,
        object_id: Some(format!("order-{lsn}")),
        object_version: None,
        occurred_at: Timestamp(1_796_000_000_000_000 + lsn as i64),
        payload: bytes::Bytes::from(format!("{{\"lsn\":{lsn}}}")),
        payload_hash: [7; 32],
    };
    let deliveries = ENDPOINTS
        .iter()
        .map(|ep| NewDelivery {
            id: DeliveryId::derive(event.id, *ep),
            event_id: event.id,
            endpoint_id: *ep,
            tenant_id: tenant.clone(),
            event_type: event.event_type.clone(),
            event_occurred_at: event.occurred_at,
            endpoint_config_version: 1,
            created_at: created,
            expires_at: created.plus(Duration::from_secs(24 * 3600)),
            lease_owner: owner.map(str::to_owned),
            lease_expires_at: None,
        })
        .collect();
    (event, deliveries)
}

/// The record of `job`'s next automatic attempt, with `status` after it.
pub fn attempt(job: &DeliveryJob, status: DeliveryStatus) -> AttemptRecord {
    let number = job.next_auto_number();
    let now = Timestamp::now();
    let ok = status == DeliveryStatus::Succeeded;
    AttemptRecord {
        attempt_id: AttemptId::derive(job.delivery_id, number),
        delivery_id: job.delivery_id,
        endpoint_id: job.endpoint_id,
        tenant_id: job.tenant_id.clone(),
        number,
        trigger: Trigger::Auto,
        endpoint_config_version: job.endpoint_config_version,
        secret_versions: vec![1],
        event_occurred_at: job.event_occurred_at,
        delivery_created_at: job.created_at,
        started_at: now,
        finished_at: now,
        http_status: Some(if ok { 200 } else { 500 }),
        outcome: if ok {
            OutcomeKind::Succeeded
        } else {
            OutcomeKind::Retryable
        },
        error_class: (!ok).then_some(ErrorClass::ServerError),
        response_sha256: None,
        response_excerpt: None,
        status,
        attempt_count: job.attempt_count + 1,
        next_attempt_at: now,
        lease_version: job.lease_version,
        hold_until: None,
        replay_request: None,
        note: None,
        first_write: job.first_write(),
    }
}

/// The record of `job`'s manual attempt (a claimed replay), succeeded or
/// not.
pub fn manual(job: &DeliveryJob, ok: bool) -> AttemptRecord {
    let number = job.replay.map_or(0, |r| r.number);
    let status = if ok {
        DeliveryStatus::Succeeded
    } else {
        DeliveryStatus::Pending
    };
    AttemptRecord {
        attempt_id: AttemptId::derive_manual(job.delivery_id, number),
        number,
        trigger: Trigger::Manual,
        replay_request: job.replay.map(|r| r.request_id),
        first_write: None,
        ..attempt(job, status)
    }
}

/// A failed attempt of `job` whose retry is due at `next`, held by its
/// node until then when `held`.
fn retry(job: &DeliveryJob, next: Timestamp, held: bool) -> AttemptRecord {
    AttemptRecord {
        next_attempt_at: next,
        hold_until: held.then_some(next),
        ..attempt(job, DeliveryStatus::Pending)
    }
}

fn ids(jobs: &[DeliveryJob]) -> Vec<DeliveryId> {
    let mut ids: Vec<DeliveryId> = jobs.iter().map(|j| j.delivery_id).collect();
    ids.sort();
    ids
}

fn sorted(mut ids: Vec<DeliveryId>) -> Vec<DeliveryId> {
    ids.sort();
    ids
}

fn later(d: Duration) -> Timestamp {
    Timestamp::now().plus(d)
}

fn ago(d: Duration) -> Timestamp {
    Timestamp(Timestamp::now().0 - d.as_micros() as i64)
}

/// A fresh store on which `nodes` started (with a minute's lease) and node
/// `a` planned the event committed at `lsn` for every endpoint, then took
/// its plans back as a restart does: the event, its deliveries and the
/// jobs.
async fn held_by_a<F: Fixture>(
    f: &F,
    lsn: u64,
    nodes: &[&str],
) -> Result<(F::Store, (Event, Vec<NewDelivery>), Vec<DeliveryJob>), ContractError> {
    let store = f.fresh().await?;
    for node in nodes {
        store.node_started(node, Duration::from_secs(60)).await?;
    }
    let (event, deliveries) = batch(lsn, Some("a"), ago(Duration::from_secs(1)));
    store
        .materialize(std::slice::from_ref(&event), &deliveries)
        .await?;
    let jobs = reclaim(&store, "a").await?;
    Ok((store, (event, deliveries), jobs))
}

/// `job` handed back, due no earlier than `not_before`.
fn hand_back(job: &DeliveryJob, not_before: Timestamp) -> super::Release {
    super::Release {
        first_write: None,
        delivery_id: job.delivery_id,
        lease_version: job.lease_version,
        not_before,
    }
}

/// This run's plans of `node` (the whole first page).
async fn reclaim<S: DispatchStore>(store: &S, node: &str) -> Result<Vec<DeliveryJob>, StoreError> {
    Ok(store
        .reclaim_plans(node, None, 100, false, later(Duration::from_secs(1)))
        .await?
        .0)
}
