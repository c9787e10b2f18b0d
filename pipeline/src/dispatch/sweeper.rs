//! Claims work that is not in memory: deliveries due whose lease expired
//! (retries released earlier, orphans of a crashed node), everything this
//! node held before a restart, and replay requests.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::DispatchSettings;
use crate::delivery::DeliveryJob;
use crate::ids::EndpointId;
use crate::store::DispatchStore;

/// Work the sweeper found.
#[derive(Debug)]
pub enum Claimed {
    /// Automatic deliveries.
    Due(Vec<DeliveryJob>),
    /// Manual attempts.
    Replays(Vec<DeliveryJob>),
}

/// Runs until `stop`; `exclude` lists endpoints whose deliveries it must
/// leave alone (open circuits, full queues).
pub async fn run<S: DispatchStore>(
    store: Arc<S>,
    settings: DispatchSettings,
    out: mpsc::Sender<Claimed>,
    exclude: Arc<Mutex<Vec<EndpointId>>>,
    stop: CancellationToken,
) {
    let mut reclaim_own = true;
    loop {
        loop {
            let excluded = exclude.lock().clone();
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
