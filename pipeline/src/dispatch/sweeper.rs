//! Claims work that is not in memory: deliveries due whose lease expired
//! (retries released earlier, orphans of a crashed node), everything this
//! node held before a restart, and replay requests.

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

/// Work the sweeper found.
#[derive(Debug)]
pub enum Claimed {
    /// Automatic deliveries.
    Due(Vec<DeliveryJob>),
    /// Manual attempts.
    Replays(Vec<DeliveryJob>),
}

/// Runs until `stop`; `exclude` lists endpoints whose deliveries it must
/// leave alone until the given time (open circuits: their deliveries wait
/// for the probe; after it, claims resume so that a probe can go at all).
pub async fn run<S: DispatchStore>(
    store: Arc<S>,
    settings: DispatchSettings,
    out: mpsc::Sender<Claimed>,
    exclude: Arc<Mutex<HashMap<EndpointId, Timestamp>>>,
    stop: CancellationToken,
) {
    let mut reclaim_own = true;
    loop {
        loop {
            let now = settings.clock.now();
            let excluded: Vec<EndpointId> = exclude
                .lock()
                .iter()
                .filter(|(_, until)| **until > now)
                .map(|(id, _)| *id)
                .collect();
            match store
                .claim_due(
                    &settings.node_id,
                    settings.sweep_batch,
                    settings.lease,
                    reclaim_own,
                    &excluded,
                )
                .await
            {
                Ok(jobs) => {
                    let full = jobs.len() >= settings.sweep_batch;
                    if !jobs.is_empty() {
                        tracing::debug!(count = jobs.len(), reclaim_own, "claimed due deliveries");
                        if out.send(Claimed::Due(jobs)).await.is_err() {
                            return;
                        }
                    }
                    if !full {
                        reclaim_own = false;
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not claim due deliveries");
                    break;
                }
            }
        }
        match store
            .claim_replays(&settings.node_id, 100, settings.lease)
            .await
        {
            Ok(jobs) if !jobs.is_empty() => {
                tracing::debug!(count = jobs.len(), "claimed replay requests");
                if out.send(Claimed::Replays(jobs)).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not claim replay requests"),
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(settings.sweep_interval) => {}
        }
    }
}
