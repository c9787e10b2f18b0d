//! Starting attempts: the schedule's next job is checked against its
//! endpoint (deleted, disabled, quarantined, not verified: it waits, ends or
//! is refused), numbered, signed and sent in a task of its own, and kept as
//! in flight until that task finishes.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::breaker::Health;
use super::egress::{Egress, EgressResult, build_request};
use super::observe::AttemptSeen;
use super::recorder::Record;
use super::scheduler::Limits;
use super::{Dispatcher, RunState, send};
use crate::delivery::{DeliveryJob, DeliveryStatus, EndReason, Trigger};
use crate::retry::RetryOverride;
use crate::signing::VersionedSecret;
use crate::store::{DispatchStore, Transition};
use crate::time::Timestamp;

/// An attempt that finished, with what is needed to record it.
pub(super) struct Finished {
    pub(super) job: DeliveryJob,
    pub(super) number: u32,
    pub(super) config_version: i32,
    /// The secrets that signed it.
    pub(super) secrets: Arc<[VersionedSecret]>,
    /// The endpoint's retry overrides when it was sent.
    pub(super) retry: RetryOverride,
    pub(super) started_at: Timestamp,
    pub(super) finished_at: Timestamp,
    pub(super) result: EgressResult,
}

/// An attempt out, as known before its outcome.
pub(super) struct InFlight {
    pub(super) job: DeliveryJob,
    pub(super) number: u32,
    pub(super) config_version: i32,
    pub(super) secrets: Arc<[VersionedSecret]>,
    pub(super) retry: RetryOverride,
    pub(super) started_at: Timestamp,
}

pub(super) fn seen(job: &DeliveryJob, number: u32, started_at: Timestamp) -> AttemptSeen<'_> {
    AttemptSeen {
        job,
        trigger: if job.replay.is_some() {
            Trigger::Manual
        } else {
            Trigger::Auto
        },
        number,
        first: job.replay.is_none() && job.attempt_count == 0,
        started_at,
    }
}

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    pub(super) async fn start_attempts(
        &self,
        state: &mut RunState,
        attempts: &mut JoinSet<Finished>,
        record_tx: &mpsc::Sender<Record>,
    ) {
        self.refresh_directory(state);
        let directory = self.directory.snapshot();
        let default_cap = self.settings.endpoint_max_in_flight;
        loop {
            let now = self.now();
            let job = state.sched.next_job(now, |id| {
                let ep = directory.endpoint(id);
                Limits {
                    max_in_flight: ep
                        .and_then(|e| e.max_in_flight)
                        .unwrap_or(default_cap)
                        .max(1),
                    rate_per_sec: ep.and_then(|e| e.rate_limit_per_sec),
                }
            });
            let Some(mut job) = job else {
                for (tenant, limit, times) in state.sched.take_throttles() {
                    self.observer.throttled(&tenant, limit, times);
                }
                return;
            };
            let manual = job.replay;
            if manual.is_none()
                && let Some(lease) = state.sched.lease(&job.delivery_id)
            {
                job.lease_version = lease;
            }
            let endpoint = directory.endpoint(&job.endpoint_id).cloned();
            let usable = endpoint.as_ref().filter(|e| {
                e.enabled
                    && e.quarantine.is_none()
                    && e.verification.is_none()
                    && !e.secrets.is_empty()
            });
            let Some(endpoint) = usable else {
                let held = manual.is_none().then_some(job.delivery_id);
                state
                    .sched
                    .finished(job.endpoint_id, held, Health::Neutral, now);
                let why = match &endpoint {
                    None => "the endpoint was deleted",
                    Some(e) if !e.enabled => "the endpoint is disabled",
                    Some(e) if e.quarantine.is_some() => {
                        "the endpoint is quarantined (its configuration cannot be loaded)"
                    }
                    Some(e) if e.verification.is_some() => {
                        "the endpoint has not passed its ownership check (verification pending)"
                    }
                    Some(_) => "the endpoint has no active secret",
                };
                if let Some(replay) = manual {
                    state.replays.remove(&replay.request_id);
                    let held = state.sched.holds(&job.delivery_id);
                    state.numbering.unexpect(job.delivery_id, held);
                    self.observer.replay_refused(&job);
                    send(
                        record_tx,
                        Record::RejectReplay(replay.request_id, why.into()),
                    )
                    .await;
                } else if endpoint.is_none() || now >= job.expires_at {
                    // Deleted, or paused past its deadline: it ends here.
                    state.numbering.forget(job.delivery_id);
                    let (status, reason) = if endpoint.is_none() {
                        (DeliveryStatus::Cancelled, EndReason::EndpointDeleted)
                    } else {
                        (DeliveryStatus::Exhausted, EndReason::DeadlineWhilePaused)
                    };
                    if status == DeliveryStatus::Exhausted {
                        self.let_next_in_order_go(state, &job);
                    }
                    self.observer.ended(&job, status, job.attempt_count);
                    send(
                        record_tx,
                        Record::Transition(Transition {
                            first_write: job.first_write(),
                            delivery_id: job.delivery_id,
                            lease_version: job.lease_version,
                            status,
                            reason,
                        }),
                    )
                    .await;
                } else {
                    // Disabled, quarantined or not verified: the delivery
                    // stays pending and visible.
                    state
                        .sched
                        .reschedule(job, now.plus(self.settings.pause_recheck));
                }
                continue;
            };
            let number = state.numbering.start(&job);
            let url = endpoint.url.clone();
            let secrets = endpoint.secrets.clone();
            let config_version = endpoint.config_version;
            let retry = endpoint.retry;
            let egress = self.egress.clone();
            let clock = self.settings.clock.clone();
            let started_at = clock.now();
            self.observer.started(&seen(&job, number, started_at));
            let out = InFlight {
                job: job.clone(),
                number,
                config_version,
                secrets: secrets.clone(),
                retry,
                started_at,
            };
            // Taken (held, leased, numbered) and not sent yet: a crash here
            // must end in the attempt being made after the restart.
            crate::failpoint::hit("dispatch.before_send");
            let handle = attempts.spawn(async move {
                let request =
                    build_request(&job, &url, &secrets, number, started_at.unix_seconds());
                let result = egress.send(request).await;
                // The receiver may have processed the POST; nothing is
                // recorded yet. A crash here must end in a second attempt
                // with the same webhook-id, never in a lost delivery.
                crate::failpoint::hit("dispatch.after_send");
                Finished {
                    job,
                    number,
                    config_version,
                    secrets,
                    retry,
                    started_at,
                    finished_at: clock.now(),
                    result,
                }
            });
            state.in_flight.insert(handle.id(), out);
        }
    }
}
