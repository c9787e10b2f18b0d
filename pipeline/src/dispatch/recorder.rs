//! Writes dispatch's results in batches; retries transient errors and never
//! drops a result (a crash before the write only means the attempt is made
//! again, under the same attempt id).
//!
//! One bad record never fails the batch: when the platform database refuses
//! a batch's values (a data error), the batch is split until the record at
//! fault is found. An attempt is then recorded without its response excerpt;
//! if even that is refused, the delivery is handed back (attempted again
//! later) and an incident says why. Only a definite error (the schema is
//! wrong, a permission is missing) ends the recorder, and dispatch with it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{DispatchCounters, DispatchError};
use crate::delivery::AttemptRecord;
use crate::ids::DeliveryId;
use crate::incident::{IncidentKind, Stage, StageIncident};
use crate::store::{DispatchStore, EndpointHealth, Release, StoreError, Transition};
use crate::time::Timestamp;

/// One thing to write. Nearly every record is an attempt: boxing it would
/// add an allocation per attempt to spare the rare others some bytes.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
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

/// A batch smaller than this waits up to [`LINGER`] for more records.
const LINGER_BELOW: usize = 256;

/// How long a small batch waits for more records. At 12,000 attempts/s,
/// 10 ms (up to 256 records) instead of 2 ms (up to 64) made a quarter as
/// many record statements and cut Postgres's time per delivery by an
/// eighth (docs/performance.md); it delays only the durability of results
/// that are already known (a crash in between repeats those attempts,
/// noted `previous_outcome_unknown`, as before).
const LINGER: Duration = Duration::from_millis(10);

/// How long a delivery whose result could not be stored waits before it is
/// attempted again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// Runs until the channel closes. A failpoint `dispatch.recorder` with the
/// action `end` ends it early (supervision tests).
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
        if crate::failpoint::hit("dispatch.recorder") {
            return Ok(());
        }
        batch.push(first);
        let mut closed = false;
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        // A small batch waits a moment for company: each write costs the
        // database a round trip and a statement start whatever its size,
        // and the attempts it records have already been made (nobody waits
        // for this write but the durability of their results).
        let linger_until = tokio::time::Instant::now() + LINGER;
        while batch.len() < LINGER_BELOW {
            match tokio::time::timeout_at(linger_until, rx.recv()).await {
                Ok(Some(r)) => batch.push(r),
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let stale = write_isolating(&*store, std::mem::take(&mut batch), &counters).await?;
        // Results durable, the node still holding what it reschedules: a
        // crash here must neither repeat a recorded success nor lose a
        // delivery whose next attempt was only in memory.
        crate::failpoint::hit("dispatch.after_record");
        if stale > 0 {
            counters.stale.fetch_add(stale as u64, Ordering::Relaxed);
            tracing::warn!(
                count = stale,
                "results of deliveries whose lease moved on were not applied"
            );
        }
        if closed {
            return Ok(());
        }
    }
}

/// Writes `batch`, retrying transient errors; on a data error, splits it
/// and sets the records at fault aside. Returns how many results were stale.
async fn write_isolating<S: DispatchStore>(
    store: &S,
    batch: Vec<Record>,
    counters: &DispatchCounters,
) -> Result<usize, DispatchError> {
    let mut stale = 0;
    let mut todo = vec![batch];
    while let Some(part) = todo.pop() {
        match write_retrying(store, &part).await {
            Ok(s) => stale += s.len(),
            Err(e) if e.is_data() && part.len() > 1 => {
                if todo.is_empty() {
                    tracing::warn!(error = %e.chain(), records = part.len(), "the platform database refused dispatch results; looking for the records at fault");
                }
                let mut left = part;
                let right = left.split_off(left.len() / 2);
                todo.push(right);
                todo.push(left);
            }
            Err(e) if e.is_data() => {
                let record = part.into_iter().next().expect("one record");
                stale += set_aside(store, record, &e, counters).await?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(stale)
}

/// One record the database refused: store what can be stored, hand the
/// delivery back, and leave an incident.
async fn set_aside<S: DispatchStore>(
    store: &S,
    record: Record,
    error: &StoreError,
    counters: &DispatchCounters,
) -> Result<usize, DispatchError> {
    counters.unstorable.fetch_add(1, Ordering::Relaxed);
    let (subject, detail, fallback) = match record {
        Record::Attempt(a) => {
            let bare = AttemptRecord {
                response_excerpt: None,
                ..a.clone()
            };
            match write_retrying(store, &[Record::Attempt(bare)]).await {
                // Stored without the excerpt: the history is complete.
                Ok(stale) => {
                    let incident = StageIncident::new(
                        Stage::Dispatch,
                        IncidentKind::UnstorableResult,
                        &a.delivery_id.to_string(),
                        &format!(
                            "attempt {} of delivery {} was stored without its response excerpt, which \
                             the platform database refused: {}",
                            a.number,
                            a.delivery_id,
                            error.chain()
                        ),
                    );
                    record_incident(store, incident).await?;
                    return Ok(stale.len());
                }
                Err(e) if e.is_data() => {}
                Err(e) => return Err(e.into()),
            }
            let release = Release {
                first_write: a.first_write.clone(),
                delivery_id: a.delivery_id,
                lease_version: a.lease_version,
                not_before: Timestamp::now().plus(REFUSED_RETRY),
            };
            (
                a.delivery_id.to_string(),
                format!(
                    "the result of attempt {} of delivery {} was refused by the platform database; \
                     the delivery was handed back and will be attempted again: {}",
                    a.number,
                    a.delivery_id,
                    error.chain()
                ),
                Some(Record::Release(release)),
            )
        }
        other => (
            record_subject(&other),
            format!(
                "a dispatch record ({}) was refused by the platform database and not stored: {}",
                record_kind(&other),
                error.chain()
            ),
            None,
        ),
    };
    if let Some(fallback) = fallback {
        match write_retrying(store, &[fallback]).await {
            Ok(_) => {}
            Err(e) if e.is_data() => {
                tracing::error!(error = %e.chain(), delivery = %subject, "could not hand a delivery back either; it is reclaimed at the next start");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let incident = StageIncident::new(
        Stage::Dispatch,
        IncidentKind::UnstorableResult,
        &subject,
        &detail,
    );
    record_incident(store, incident).await?;
    Ok(0)
}

async fn record_incident<S: DispatchStore>(
    store: &S,
    incident: StageIncident,
) -> Result<(), DispatchError> {
    incident.log();
    let mut backoff = Duration::from_millis(50);
    loop {
        match store
            .record_incidents(std::slice::from_ref(&incident))
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn record_kind(r: &Record) -> &'static str {
    match r {
        Record::Attempt(_) => "attempt",
        Record::Transition(_) => "transition",
        Record::Release(_) => "release",
        Record::RejectReplay(..) => "replay rejection",
        Record::Disable(..) => "endpoint disable",
        Record::Health(_) => "endpoint health",
    }
}

fn record_subject(r: &Record) -> String {
    match r {
        Record::Attempt(a) => a.delivery_id.to_string(),
        Record::Transition(t) => t.delivery_id.to_string(),
        Record::Release(x) => x.delivery_id.to_string(),
        Record::RejectReplay(id, _) => format!("replay request {id}"),
        Record::Disable(ep, _) => ep.to_string(),
        Record::Health(h) => h.endpoint_id.to_string(),
    }
}

/// [`write`], retrying transient errors with a backoff.
async fn write_retrying<S: DispatchStore>(
    store: &S,
    batch: &[Record],
) -> Result<Vec<DeliveryId>, StoreError> {
    let mut backoff = Duration::from_millis(50);
    loop {
        match write(store, batch).await {
            Err(e) if e.is_transient() => {
                tracing::warn!(error = %e.chain(), retry_in = ?backoff, "could not record dispatch results; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            other => return other,
        }
    }
}

async fn write<S: DispatchStore>(
    store: &S,
    batch: &[Record],
) -> Result<Vec<DeliveryId>, StoreError> {
    let mut attempts: Vec<AttemptRecord> = Vec::new();
    let mut transitions: Vec<Transition> = Vec::new();
    let mut releases: Vec<Release> = Vec::new();
    let mut health: Vec<EndpointHealth> = Vec::new();
    for r in batch {
        match r {
            Record::Attempt(a) => attempts.push(a.clone()),
            Record::Transition(t) => transitions.push(t.clone()),
            Record::Release(x) => releases.push(x.clone()),
            Record::Health(h) => health.push(h.clone()),
            Record::RejectReplay(..) | Record::Disable(..) => {}
        }
    }
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
