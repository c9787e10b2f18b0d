//! The run loop of a dispatcher: it starts the recorder, the sweeper and
//! the endpoint verifier, feeds the schedule from the jobs channel and the
//! sweeper's claims, starts attempts and takes their results, and at
//! shutdown drains what is in flight and stops its tasks in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::attempt::{Finished, InFlight};
use super::breaker::{Circuit, CircuitState};
use super::egress::Egress;
use super::numbering::Numbering;
use super::recorder::{self, Record};
use super::scheduler::{Scheduler, SchedulerConfig};
use super::sweeper::{self, Claimed};
use super::verify;
use super::{DispatchError, Dispatcher, RunState};
use crate::delivery::DeliveryJob;
use crate::store::DispatchStore;

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    /// Runs until `shutdown`: stops taking work, waits for attempts in
    /// flight (up to the drain timeout) and records their results.
    #[allow(clippy::disallowed_methods)] // bare spawn: the recorder, sweeper and verifier are awaited by the dispatcher's run
    pub async fn run(
        self,
        mut jobs: mpsc::Receiver<DeliveryJob>,
        shutdown: CancellationToken,
    ) -> Result<(), DispatchError> {
        let node = self.settings.node_id.clone();
        // Whether the previous run of this node drained cleanly decides
        // whether what it held may have had attempts out.
        let previous_clean = match self.store.node_started(&node, self.settings.lease).await {
            Ok(clean) => clean,
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e.chain(), "could not read how this node stopped last; assuming it did not drain");
                false
            }
            Err(e) => return Err(e.into()),
        };
        let (record_tx, record_rx) = mpsc::channel::<Record>(8192);
        let mut recorder = tokio::spawn(recorder::run(
            self.store.clone(),
            record_rx,
            self.counters.clone(),
        ));
        let mut state = RunState {
            sched: Scheduler::new(SchedulerConfig {
                max_in_flight: self.settings.max_in_flight,
                tenant_max_in_flight: self.settings.tenant_max_in_flight,
                retry_share: 4,
                breaker: self.settings.breaker.clone(),
            }),
            failing_since: HashMap::new(),
            disabling: Default::default(),
            exclude: Arc::default(),
            numbering: Numbering::default(),
            in_flight: HashMap::new(),
            weights_epoch: None,
            cancelled: Default::default(),
            replays: Default::default(),
        };
        self.restore_health(&mut state).await;
        let (claimed_tx, mut claimed_rx) = mpsc::channel::<Claimed>(4);
        let sweep_stop = CancellationToken::new();
        let mut sweeper = tokio::spawn(sweeper::run(
            self.store.clone(),
            self.settings.clone(),
            claimed_tx,
            state.exclude.clone(),
            sweeper::Retake {
                after_unknown: !previous_clean,
                before: self.made_at,
            },
            sweep_stop.clone(),
        ));

        let verify_stop = CancellationToken::new();
        let verifier = tokio::spawn(verify::run(
            self.egress.clone(),
            self.store.clone(),
            self.directory.clone(),
            verify::VerifySettings {
                interval: self.settings.sweep_interval,
                retry_every: self.settings.verification_retry,
            },
            verify_stop.clone(),
        ));
        // Stops it on every way out of this function.
        let stop_verifier = verify_stop.drop_guard();

        let mut attempts: JoinSet<Finished> = JoinSet::new();
        let mut draining: Option<Instant> = None;
        let idle = Duration::from_secs(3600);

        loop {
            let now = self.now();
            state.sched.release_due(now);
            if draining.is_none() {
                self.start_attempts(&mut state, &mut attempts, &record_tx)
                    .await;
            }
            if let Some(since) = draining
                && (attempts.is_empty() || since.elapsed() >= self.settings.drain_timeout)
            {
                break;
            }
            let next_due = state.sched.next_due().unwrap_or(now.plus(idle));
            let room = state.sched.held() < self.settings.max_held && draining.is_none();
            tokio::select! {
                _ = shutdown.cancelled(), if draining.is_none() => {
                    tracing::info!(in_flight = attempts.len(), "dispatch draining");
                    draining = Some(Instant::now());
                    sweep_stop.cancel();
                }
                ended = &mut recorder => {
                    return Err(task_ended("recorder", ended));
                }
                ended = &mut sweeper, if !sweep_stop.is_cancelled() => {
                    let ended = ended.map(Ok::<(), DispatchError>);
                    return Err(task_ended("sweeper", ended));
                }
                Some(done) = attempts.join_next_with_id(), if !attempts.is_empty() => {
                    match done {
                        Ok((id, f)) => {
                            state.in_flight.remove(&id);
                            self.on_finished(&mut state, f, &record_tx).await;
                        }
                        Err(e) => {
                            // A panic while sending: the attempt is as good
                            // as one whose outcome is unknown.
                            tracing::error!(error = %e, "an attempt task failed");
                            if let Some(out) = state.in_flight.remove(&e.id()) {
                                self.record_unknown(&mut state, out, &record_tx).await;
                            }
                        }
                    }
                }
                job = jobs.recv(), if room => match job {
                    Some(job) => self.accept(&mut state, job, &record_tx).await,
                    None => {
                        draining.get_or_insert_with(Instant::now);
                        sweep_stop.cancel();
                    }
                },
                Some(claimed) = claimed_rx.recv(), if room => match claimed {
                    Claimed::Due(batch) => {
                        self.catch_up_directory(&batch, Instant::now(), &shutdown).await;
                        for job in batch {
                            self.accept(&mut state, job, &record_tx).await;
                        }
                    }
                    Claimed::Replays(batch) => {
                        for job in batch {
                            if let Some(replay) = job.replay
                                && !state.replays.insert(replay.request_id)
                            {
                                // Claimed again while this node holds it
                                // (claims are renewed while the node lives;
                                // this is the belt): one request, one attempt.
                                tracing::debug!(request = replay.request_id, "a replay request this node holds was claimed again; ignored");
                                continue;
                            }
                            state.numbering.expect(job.delivery_id);
                            state.sched.add_manual(job);
                        }
                    }
                    Claimed::Cancelled(ids) => {
                        for id in ids {
                            if state.sched.cancel(&id) {
                                if state.automatic_attempt_out(id) {
                                    state.cancelled.insert(id);
                                } else {
                                    state.numbering.forget(id);
                                }
                            }
                        }
                    }
                },
                _ = self.settings.clock.wait_until(next_due), if draining.is_none() => {}
                _ = tokio::time::sleep(Duration::from_millis(50)), if draining.is_some() => {}
            }
        }
        if !attempts.is_empty() {
            tracing::warn!(
                in_flight = attempts.len(),
                "attempts still in flight at shutdown: recorded with an unknown outcome; they will be retried"
            );
            attempts.abort_all();
            while attempts.join_next().await.is_some() {}
            let out: Vec<InFlight> = state.in_flight.drain().map(|(_, f)| f).collect();
            for f in out {
                self.record_unknown(&mut state, f, &record_tx).await;
            }
        }
        sweep_stop.cancel();
        drop(stop_verifier);
        if let Err(e) = verifier.await {
            tracing::error!(error = %e, "the endpoint verifier panicked; endpoints waiting for a check were not checked");
        }
        if let Err(e) = (&mut sweeper).await {
            tracing::error!(error = %e, "the sweeper panicked");
        }
        drop(record_tx);
        match recorder.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => {
                return Err(DispatchError::TaskEnded {
                    task: "recorder",
                    source: Some(Box::new(e)),
                });
            }
        }
        // Everything this run started is recorded: the next start of this
        // node need not suspect unrecorded attempts.
        if let Err(e) = self.store.node_stopped(&node).await {
            tracing::warn!(error = %e.chain(), "could not record this node's clean stop; its next start will note possible unrecorded attempts");
        }
        Ok(())
    }

    async fn restore_health(&self, state: &mut RunState) {
        match self.store.load_health().await {
            Ok(all) => {
                for h in all {
                    if let Some(since) = h.failing_since {
                        state.failing_since.insert(h.endpoint_id, since);
                    }
                    if let (Some(until), CircuitState::Open) = (h.open_until, h.circuit) {
                        let cool_down =
                            until.since(self.now()).max(self.settings.breaker.cool_down);
                        state.sched.restore_circuit(
                            h.endpoint_id,
                            h.tenant_id,
                            Circuit::Open { until, cool_down },
                        );
                        state.exclude.lock().insert(h.endpoint_id, until);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not load endpoint health; circuits start closed")
            }
        }
    }
}

/// The error for a dispatch task that ended while dispatch ran.
fn task_ended(
    task: &'static str,
    ended: Result<Result<(), DispatchError>, tokio::task::JoinError>,
) -> DispatchError {
    let source: Option<Box<dyn std::error::Error + Send + Sync>> = match ended {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(Box::new(e)),
        Err(e) => Some(Box::new(e)),
    };
    let err = DispatchError::TaskEnded { task, source };
    tracing::error!(error = %crate::supervise::error_chain(&err), "dispatch stops");
    err
}
