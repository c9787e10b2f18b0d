//! What follows an attempt's result: the endpoint's health, the delivery's
//! next state (`DeliveryState::next`), the counters, the attempt record
//! under the newest lease this node holds, and a retry kept in memory or
//! released; a manual attempt that succeeds ends the automatic schedule,
//! and a delivery that ends without success lets the next of its object go.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::attempt::{Finished, InFlight, seen};
use super::breaker::Health;
use super::egress::{Egress, EgressResult};
use super::outcome::{AttemptOutcome, ErrorClass};
use super::recorder::Record;
use super::{Dispatcher, RunState, send};
use crate::delivery::{AttemptNote, AttemptRecord, DeliveryJob, DeliveryStatus, Trigger};
use crate::ids::AttemptId;
use crate::retry::DeliveryState;
use crate::store::DispatchStore;

fn health_of(outcome: &AttemptOutcome) -> Health {
    match outcome {
        AttemptOutcome::Delivered { .. } => Health::Success,
        AttemptOutcome::Retryable { .. } => Health::Failure,
        AttemptOutcome::Rejected { .. } | AttemptOutcome::Gone => Health::Neutral,
    }
}

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    /// Records an attempt whose outcome nobody will know (still out at the
    /// end of the drain, or its task failed): the delivery is attempted
    /// again, and the history says this one may have reached the receiver.
    pub(super) async fn record_unknown(
        &self,
        state: &mut RunState,
        out: InFlight,
        record_tx: &mpsc::Sender<Record>,
    ) {
        let now = self.now();
        let f = Finished {
            job: out.job,
            number: out.number,
            config_version: out.config_version,
            secrets: out.secrets,
            retry: out.retry,
            started_at: out.started_at,
            finished_at: now,
            result: EgressResult::bare(AttemptOutcome::Retryable {
                status: None,
                class: ErrorClass::Shutdown,
                retry_after: None,
            }),
        };
        self.on_finished(state, f, record_tx).await;
    }

    pub(super) async fn on_finished(
        &self,
        state: &mut RunState,
        mut f: Finished,
        record_tx: &mpsc::Sender<Record>,
    ) {
        // This node may have claimed the delivery again while the attempt
        // was out (another node had taken it over and handed it back): the
        // result is recorded under the newest lease this node holds, so that
        // the delivery is not left owned by this node yet forgotten.
        if f.job.replay.is_none()
            && let Some(newer) = state.sched.lease(&f.job.delivery_id)
        {
            f.job.lease_version = f.job.lease_version.max(newer);
        }
        // The endpoint's (or its tenant's) schedule; a deadline of its own
        // moves the delivery's expiry (written with its first attempt).
        let policy = self.settings.retry.with(&f.retry);
        if f.retry.deadline_seconds.is_some() {
            f.job.expires_at = f.job.created_at.plus(policy.deadline);
        }
        let job = &f.job;
        let outcome = f.result.outcome;
        self.observer
            .finished(&seen(job, f.number, f.started_at), &outcome, f.finished_at);
        let health = health_of(&outcome);
        let manual = job.replay;
        let report = state.sched.finished(
            job.endpoint_id,
            manual.is_none().then_some(job.delivery_id),
            health,
            f.finished_at,
        );
        self.track_health(state, job, health, &report, f.finished_at, record_tx)
            .await;
        if outcome == AttemptOutcome::Gone {
            self.disable(state, job, "the endpoint answered 410 Gone", record_tx)
                .await;
        }

        let base = AttemptRecord {
            attempt_id: AttemptId::derive(job.delivery_id, f.number),
            delivery_id: job.delivery_id,
            endpoint_id: job.endpoint_id,
            tenant_id: job.tenant_id.clone(),
            number: f.number,
            trigger: if manual.is_some() {
                Trigger::Manual
            } else {
                Trigger::Auto
            },
            endpoint_config_version: f.config_version,
            secret_versions: f.secrets.iter().map(|s| s.version).collect(),
            event_occurred_at: job.event_occurred_at,
            delivery_created_at: job.created_at,
            started_at: f.started_at,
            finished_at: f.finished_at,
            http_status: outcome.status(),
            outcome: outcome.kind(),
            error_class: outcome.error_class(),
            response_sha256: f.result.response_sha256,
            response_excerpt: f.result.response_excerpt.clone(),
            status: DeliveryStatus::Pending,
            attempt_count: job.attempt_count,
            next_attempt_at: job.next_attempt_at,
            lease_version: job.lease_version,
            hold_until: None,
            replay_request: manual.map(|r| r.request_id),
            note: if job.after_unknown {
                Some(AttemptNote::PreviousOutcomeUnknown)
            } else if manual.is_none() && state.sched.take_after_failure(&job.delivery_id) {
                Some(AttemptNote::PreviousInOrderFailed)
            } else {
                None
            },
            first_write: job.first_write().map(|mut w| {
                if self.settings.scope.is_some() {
                    w.holder = Some(self.settings.node_id.clone());
                }
                w
            }),
        };
        if let Some(replay) = manual {
            // A failed replay leaves the automatic schedule as it is; a
            // successful one ends it (the store ends the delivery as
            // succeeded with this record).
            state.replays.remove(&replay.request_id);
            self.counters.manual.fetch_add(1, Ordering::Relaxed);
            if matches!(outcome, AttemptOutcome::Delivered { .. }) {
                self.end_schedule(state, job);
            }
            let held = state.sched.holds(&job.delivery_id);
            state.numbering.finish(job.delivery_id, held);
            send(record_tx, Record::Attempt(base)).await;
            return;
        }
        if f.number > 1 {
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
        }
        let before = DeliveryState {
            status: DeliveryStatus::Pending,
            attempts: job.attempt_count,
            created_at: job.created_at,
            expires_at: job.expires_at,
            next_attempt_at: job.next_attempt_at,
        };
        let next = before.next(&outcome, &policy, f.finished_at, rand::random::<f64>());
        if next.status.is_terminal() {
            self.observer.ended(&f.job, next.status, next.attempts);
        }
        if matches!(
            next.status,
            DeliveryStatus::Failed | DeliveryStatus::Exhausted
        ) {
            self.let_next_in_order_go(state, &f.job);
        }
        match next.status {
            DeliveryStatus::Succeeded => {
                self.counters.succeeded.fetch_add(1, Ordering::Relaxed);
            }
            DeliveryStatus::Failed | DeliveryStatus::Exhausted => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        let cancelled = state.cancelled.remove(&f.job.delivery_id);
        // A delivery kept in its object's order is held however far its
        // retry is: released, the next of its object would go first.
        let hold = next.status == DeliveryStatus::Pending
            && !cancelled
            && (next.next_attempt_at.since(f.finished_at) <= self.settings.hold_horizon
                || state.sched.orders(&f.job));
        let record = AttemptRecord {
            status: next.status,
            attempt_count: next.attempts,
            next_attempt_at: next.next_attempt_at,
            hold_until: hold.then(|| next.next_attempt_at.plus(self.settings.lease)),
            ..base
        };
        send(record_tx, Record::Attempt(record)).await;
        state.numbering.finish(f.job.delivery_id, hold);
        if hold {
            let mut job = f.job;
            job.attempt_count = next.attempts;
            // Recorded now: the next attempt follows this one, and the
            // delivery has its row.
            job.after_unknown = false;
            job.materialized = true;
            state.sched.reschedule(job, next.next_attempt_at);
        }
    }
}

impl<E, S> Dispatcher<E, S> {
    /// A manual attempt of `job`'s delivery succeeded: no automatic attempt
    /// follows. The delivery leaves the schedule (waiting, queued, or in its
    /// object's chain, whose next delivery then goes); an automatic attempt
    /// already out finishes and is recorded as history, never rescheduled.
    /// Replays are claimed only by the node that holds the delivery (or
    /// when no live node does), and claims of due deliveries skip one whose
    /// replay is claimed, so this node's schedule is the only one to end.
    fn end_schedule(&self, state: &mut RunState, job: &DeliveryJob) {
        let id = job.delivery_id;
        if !state.sched.cancel(&id) {
            return;
        }
        let out = state.automatic_attempt_out(id);
        if out {
            state.cancelled.insert(id);
        }
        tracing::info!(delivery = %id, endpoint = %job.endpoint_id, auto_attempt_out = out, "a manual attempt succeeded; the automatic schedule of the delivery ends");
    }

    /// A delivery ended without success: when later deliveries of its
    /// object wait behind it, the next goes now (its first attempt notes
    /// [`AttemptNote::PreviousInOrderFailed`]).
    pub(super) fn let_next_in_order_go(&self, state: &mut RunState, job: &DeliveryJob) {
        let waiting = state.sched.head_failed(&job.delivery_id);
        if waiting > 0 {
            tracing::warn!(
                delivery = %job.delivery_id,
                endpoint = %job.endpoint_id,
                object = job.order.as_ref().map(|o| &*o.object_id),
                waiting,
                "a delivery kept in its object's order ended without success; the next delivery of the object goes without it"
            );
        }
    }
}
