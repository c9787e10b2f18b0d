//! Writes dispatch's results in batches; retries transient errors and never
//! drops a result (a crash before the write only means the attempt is made
//! again, under the same attempt id).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{DispatchCounters, DispatchError};
use crate::delivery::AttemptRecord;
use crate::ids::DeliveryId;
use crate::store::{DispatchStore, EndpointHealth, Release, StoreError, Transition};

/// One thing to write.
#[derive(Debug)]
pub enum Record {
    /// An attempt and the delivery's state after it.
    Attempt(AttemptRecord),
    /// A delivery ending without an attempt.
    Transition(Transition),
    /// A held delivery handed back.
    Release(Release),
    /// A replay request that cannot be carried out.
    RejectReplay(i64, String),
    /// An endpoint to disable, and why.
    Disable(crate::ids::EndpointId, String),
    /// An endpoint's health changed.
    Health(EndpointHealth),
}

const BATCH: usize = 1000;

/// Runs until the channel closes.
pub async fn run<S: DispatchStore>(
    store: Arc<S>,
    mut rx: mpsc::Receiver<Record>,
    counters: Arc<DispatchCounters>,
) -> Result<(), DispatchError> {
    let mut batch: Vec<Record> = Vec::with_capacity(BATCH);
    loop {
        let Some(first) = rx.recv().await else {
            return Ok(());
        };
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let mut backoff = Duration::from_millis(50);
        loop {
            match write(&*store, &batch).await {
                Ok(stale) => {
                    if !stale.is_empty() {
                        counters
                            .stale
                            .fetch_add(stale.len() as u64, Ordering::Relaxed);
                        tracing::warn!(
                            count = stale.len(),
                            "results of deliveries whose lease moved on were not applied"
                        );
                    }
                    break;
                }
                Err(e) if e.transient => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "could not record dispatch results; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e.into()),
            }
        }
        batch.clear();
    }
}

async fn write<S: DispatchStore>(
    store: &S,
    batch: &[Record],
) -> Result<Vec<DeliveryId>, StoreError> {
    let attempts: Vec<AttemptRecord> = batch
        .iter()
        .filter_map(|r| {
            if let Record::Attempt(a) = r {
                Some(a.clone())
            } else {
                None
            }
        })
        .collect();
    let transitions: Vec<Transition> = batch
        .iter()
        .filter_map(|r| {
            if let Record::Transition(t) = r {
                Some(t.clone())
            } else {
                None
            }
        })
        .collect();
    let releases: Vec<Release> = batch
        .iter()
        .filter_map(|r| {
            if let Record::Release(x) = r {
                Some(x.clone())
            } else {
                None
            }
        })
        .collect();
    let stale = if attempts.is_empty() {
        Vec::new()
    } else {
        store.record(&attempts).await?
    };
    if !transitions.is_empty() {
        store.transition(&transitions).await?;
    }
    if !releases.is_empty() {
        store.release(&releases).await?;
    }
    let health: Vec<EndpointHealth> = batch
        .iter()
        .filter_map(|r| {
            if let Record::Health(h) = r {
                Some(h.clone())
            } else {
                None
            }
        })
        .collect();
    if !health.is_empty() {
        store.save_health(&health).await?;
    }
    for r in batch {
        match r {
            Record::RejectReplay(id, reason) => store.reject_replay(*id, reason).await?,
            Record::Disable(endpoint, reason) => store.disable_endpoint(*endpoint, reason).await?,
            _ => {}
        }
    }
    Ok(stale)
}
