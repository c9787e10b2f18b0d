//! Claims work that is not in memory: at start-up everything this node held
//! before a restart (and again after a claim failed, which may have
//! committed with its answer lost); then, every interval, deliveries that
//! are due and held by no live node (retries released earlier, operational
//! and test events, orphans of a node whose lease lapsed), and replay
//! requests. It also renews the node's lease, which keeps the deliveries
//! this node holds its own: one row per node, not a renewal per delivery.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::DispatchSettings;
use crate::delivery::DeliveryJob;
use crate::ids::EndpointId;
use crate::store::DispatchStore;
use crate::time::Timestamp;

/// How often finished fan-out plans left behind are removed.
const TIDY_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// How often the queue tables are cleaned of dead rows
/// ([`DispatchStore::clean_queues`]).
const CLEAN_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Work the sweeper found.
#[derive(Debug)]
pub enum Claimed {
    /// Automatic deliveries.
    Due(Vec<DeliveryJob>),
    /// Manual attempts.
    Replays(Vec<DeliveryJob>),
    /// Deliveries cancelled through the API: whoever holds them drops them.
    Cancelled(Vec<crate::ids::DeliveryId>),
}

/// What a run takes back of this node's previous run at its start.
#[derive(Debug, Clone, Copy)]
pub struct Retake {
    /// The previous run did not stop cleanly: what it held may have had
    /// attempts out.
    pub after_unknown: bool,
    /// Plans made from this instant on are this run's own (its fan-out's,
    /// already handed to its dispatcher), never taken back.
    pub before: Timestamp,
}

/// Runs until `stop`; `exclude` lists endpoints whose due deliveries it
/// leaves alone until the given time (open circuits: their deliveries wait
/// for the probe; after it, claims resume so that a probe can go at all).
/// `retake`: what to take back of this node's previous run. A failpoint
/// `dispatch.sweeper` with the action `end` ends it (supervision tests).
pub async fn run<S: DispatchStore>(
    store: Arc<S>,
    settings: DispatchSettings,
    out: mpsc::Sender<Claimed>,
    exclude: Arc<Mutex<HashMap<EndpointId, Timestamp>>>,
    retake_from: Retake,
    stop: CancellationToken,
) {
    let Retake {
        after_unknown,
        before,
    } = retake_from;
    if let Err(e) = store.heartbeat(&settings.node_id, settings.lease).await {
        tracing::warn!(error = %e, "could not renew the node's lease");
    }
    let mut last_heartbeat = std::time::Instant::now();
    // Everything this node held before a restart.
    let Some(complete) = retake_own(&*store, &settings, &out, after_unknown, before).await else {
        return;
    };
    let mut retake = !complete;
    // Cancellations from now on concern this node (what was cancelled
    // before is not pending, so it is never claimed). Without the current
    // position it reads every cancellation kept: dropping a delivery this
    // node does not hold changes nothing.
    let mut cancel_cursor = match store.cancellations_after(None, 0).await {
        Ok((_, last)) => last,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the last cancellation; reading them all");
            0
        }
    };
    let mut last_tidy = std::time::Instant::now();
    let mut last_clean = std::time::Instant::now();
    loop {
        if crate::failpoint::hit("dispatch.sweeper") {
            return;
        }
        if last_tidy.elapsed() >= TIDY_EVERY {
            match store.tidy_plans().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(count = n, "removed finished fan-out plans"),
                Err(e) => tracing::warn!(error = %e, "could not remove finished fan-out plans"),
            }
            if let Err(e) = store.expire_tallies().await {
                tracing::warn!(error = %e, "could not drop old attempt tallies");
            }
            last_tidy = std::time::Instant::now();
        }
        if last_clean.elapsed() >= CLEAN_EVERY {
            if let Err(e) = store.clean_queues().await {
                tracing::warn!(error = %e, "could not clean the queue tables");
            }
            last_clean = std::time::Instant::now();
        }
        if last_heartbeat.elapsed() >= settings.lease / 4 {
            match store.heartbeat(&settings.node_id, settings.lease).await {
                Ok(()) => last_heartbeat = std::time::Instant::now(),
                Err(e) => tracing::warn!(error = %e, "could not renew the node's lease"),
            }
        }
        // A claim that failed may have committed with its answer lost (the
        // connection broke between the two), or a retake at start-up did
        // not finish: what this node holds in Postgres but not in memory
        // would then wait, unsent, until its next start. Everything it
        // holds is taken again (dispatch keeps what it has; an attempt
        // may have gone out for what it finished but had not recorded yet,
        // which the next number and note account for).
        if retake {
            tracing::info!("taking again what this node holds, after a failed claim");
            let Some(complete) = retake_own(&*store, &settings, &out, true, before).await else {
                return;
            };
            retake = !complete;
        }
        loop {
            let now = settings.clock.now();
            let excluded: Vec<EndpointId> = exclude
                .lock()
                .iter()
                .filter(|(_, until)| **until > now)
                .map(|(id, _)| *id)
                .collect();
            let claimed = match &settings.scope {
                Some(scope) => {
                    store
                        .claim_scoped(&settings.node_id, settings.sweep_batch, &excluded, scope)
                        .await
                }
                None => {
                    store
                        .claim_due(&settings.node_id, settings.sweep_batch, &excluded)
                        .await
                }
            };
            match claimed {
                Ok(jobs) => {
                    let full = jobs.len() >= settings.sweep_batch;
                    if !jobs.is_empty() {
                        tracing::debug!(count = jobs.len(), "claimed due deliveries");
                        if out.send(Claimed::Due(jobs)).await.is_err() {
                            return;
                        }
                    }
                    if !full {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim due deliveries");
                    retake = true;
                    break;
                }
            }
        }
        let replays = match &settings.scope {
            Some(scope) => {
                store
                    .claim_replays_scoped(&settings.node_id, 100, settings.lease, scope)
                    .await
            }
            None => {
                store
                    .claim_replays(&settings.node_id, 100, settings.lease)
                    .await
            }
        };
        match replays {
            Ok(jobs) if !jobs.is_empty() => {
                tracing::debug!(count = jobs.len(), "claimed replay requests");
                if out.send(Claimed::Replays(jobs)).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not claim replay requests"),
        }
        loop {
            match store.cancellations_after(Some(cancel_cursor), 1000).await {
                Ok((ids, next)) => {
                    let more = ids.len() >= 1000;
                    cancel_cursor = next;
                    if !ids.is_empty() {
                        tracing::debug!(count = ids.len(), "deliveries cancelled");
                        if out.send(Claimed::Cancelled(ids)).await.is_err() {
                            return;
                        }
                    }
                    if !more {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the cancellations");
                    break;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}

/// Takes everything this node holds in Postgres again, under new leases:
/// its deliveries (in id order), then fan-out's plans it holds (deliveries
/// that have no row yet), and hands them to dispatch. `after_unknown`: an
/// attempt may have gone out unrecorded. `Some(true)` when everything was
/// handed over, `Some(false)` when a read failed (what it would have taken
/// stays this node's, for the next try), `None` when dispatch is gone.
async fn retake_own<S: DispatchStore>(
    store: &S,
    settings: &DispatchSettings,
    out: &mpsc::Sender<Claimed>,
    after_unknown: bool,
    before: Timestamp,
) -> Option<bool> {
    let mut complete = true;
    let mut after = None;
    loop {
        match store
            .reclaim_own(
                &settings.node_id,
                after,
                settings.sweep_batch,
                after_unknown,
            )
            .await
        {
            Ok(jobs) => {
                let full = jobs.len() >= settings.sweep_batch;
                after = jobs.iter().map(|j| j.delivery_id).max();
                if !jobs.is_empty() {
                    tracing::info!(count = jobs.len(), "reclaimed deliveries this node held");
                    if out.send(Claimed::Due(jobs)).await.is_err() {
                        return None;
                    }
                }
                if !full {
                    break;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not reclaim this node's deliveries; trying again at the next sweep");
                complete = false;
                break;
            }
        }
    }
    let mut after = None;
    loop {
        match store
            .reclaim_plans(
                &settings.node_id,
                after,
                settings.sweep_batch,
                after_unknown,
                before,
            )
            .await
        {
            Ok((jobs, next)) => {
                if !jobs.is_empty() {
                    tracing::info!(
                        count = jobs.len(),
                        "reclaimed planned deliveries this node held"
                    );
                    if out.send(Claimed::Due(jobs)).await.is_err() {
                        return None;
                    }
                }
                match next {
                    Some(n) => after = Some(n),
                    None => break,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not reclaim this node's planned deliveries; trying again at the next sweep");
                complete = false;
                break;
            }
        }
    }
    Some(complete)
}
