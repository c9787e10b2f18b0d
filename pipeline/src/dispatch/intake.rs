//! How jobs enter the schedule: an automatic job is placed (or handed back
//! to Postgres when its endpoint's circuit is open and its queue full), and
//! the schedule follows the endpoint directory, which claimed jobs may be
//! ahead of.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::breaker::Circuit;
use super::egress::Egress;
use super::recorder::Record;
use super::{Dispatcher, RunState, send};
use crate::delivery::DeliveryJob;
use crate::store::{DispatchStore, Release};

/// How long dispatch waits for the endpoint directory to catch up with
/// deliveries claimed from Postgres (see `catch_up_directory`).
const DIRECTORY_CATCH_UP: Duration = Duration::from_secs(5);

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    /// Takes an automatic job into the schedule, or hands it back to
    /// Postgres when its endpoint's circuit is open and its queue is full (a
    /// stuck endpoint must not fill memory). A healthy endpoint's backlog
    /// stays in memory up to `max_held`, beyond which new work waits upstream:
    /// handing it back would only be claimed again, a loop that costs
    /// Postgres everything exactly when it has least to spare.
    pub(super) async fn accept(
        &self,
        state: &mut RunState,
        job: DeliveryJob,
        record_tx: &mpsc::Sender<Record>,
    ) {
        // The job was planned from a directory at least this new: an
        // endpoint that orders per object must be known as ordered before
        // its first job is placed, or that job would skip its chain.
        self.refresh_directory(state);
        // A job kept in its object's order stays here: handed back, a later
        // delivery of its object could be claimed and sent before it.
        if let Circuit::Open { until, .. } = state.sched.circuit(&job.endpoint_id)
            && !state.sched.holds(&job.delivery_id)
            && !state.sched.orders(&job)
            && state.sched.queued_at(&job.endpoint_id) >= self.settings.endpoint_max_queued
        {
            let release = Release {
                first_write: job.first_write(),
                delivery_id: job.delivery_id,
                lease_version: job.lease_version,
                not_before: until,
            };
            send(record_tx, Record::Release(release)).await;
            return;
        }
        state.sched.add(job, self.now());
    }

    /// Jobs claimed from Postgres may have been planned by another node
    /// under endpoint configurations this node has not read yet (a new
    /// endpoint would look deleted, one switched to per-object ordering
    /// unordered): when any names an endpoint unknown here or a newer
    /// version of one, the directory is read again before they are placed.
    /// Bounded, so that a refresher that cannot reach Postgres delays
    /// dispatch rather than stopping it (it says so).
    pub(super) async fn catch_up_directory(
        &self,
        batch: &[DeliveryJob],
        claimed: Instant,
        shutdown: &CancellationToken,
    ) {
        let directory = self.directory.snapshot();
        let behind = batch.iter().any(|j| {
            directory
                .endpoint(&j.endpoint_id)
                .is_none_or(|e| e.config_version < j.endpoint_config_version)
        });
        if behind
            && tokio::time::timeout(
                DIRECTORY_CATCH_UP,
                self.directory.fresh_since(claimed, shutdown),
            )
            .await
            .is_err()
        {
            tracing::warn!(
                waited = ?DIRECTORY_CATCH_UP,
                "claimed deliveries name endpoint configurations newer than the directory read here, and reading it again did not finish in time; going on with the one in hand"
            );
        }
    }

    /// Gives the schedule the tenants' weights and budgets and the ordered
    /// endpoints of a newer directory.
    pub(super) fn refresh_directory(&self, state: &mut RunState) {
        let directory = self.directory.snapshot();
        if state.weights_epoch != Some(directory.epoch) {
            state.weights_epoch = Some(directory.epoch);
            state
                .sched
                .set_tenants(directory.weights().clone(), directory.budgets().clone());
            state
                .sched
                .set_ordered(directory.ordered().clone(), self.now());
        }
    }
}
