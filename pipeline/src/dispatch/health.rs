//! Endpoint health: how long an endpoint has failed, its circuit, and
//! disabling it after `disable_after` without a success or on 410 Gone.

use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use super::breaker::{Circuit, Health, Transition as CircuitChange};
use super::recorder::Record;
use super::scheduler;
use super::{Dispatcher, RunState, send};
use crate::delivery::DeliveryJob;
use crate::dispatch::egress::Egress;
use crate::store::{DispatchStore, EndpointHealth};
use crate::time::Timestamp;

impl<E: Egress, S: DispatchStore> Dispatcher<E, S> {
    /// Follows how long an endpoint has failed, circuit changes, and
    /// disables an endpoint that failed for `disable_after`.
    pub(super) async fn track_health(
        &self,
        state: &mut RunState,
        job: &DeliveryJob,
        health: Health,
        report: &scheduler::EndpointReport,
        now: Timestamp,
        record_tx: &mpsc::Sender<Record>,
    ) {
        let id = job.endpoint_id;
        let mut changed = report.transition.is_some();
        match health {
            Health::Success => changed |= state.failing_since.remove(&id).is_some(),
            Health::Failure => {
                if let std::collections::hash_map::Entry::Vacant(v) = state.failing_since.entry(id)
                {
                    v.insert(now);
                    changed = true;
                }
            }
            Health::Neutral => {}
        }
        match report.transition {
            Some(CircuitChange::Opened(until)) => {
                self.counters
                    .circuits_opened
                    .fetch_add(1, Ordering::Relaxed);
                state.exclude.lock().insert(id, until);
                tracing::warn!(endpoint_id = %id, until = %until, "circuit opened: the endpoint keeps failing; its deliveries wait");
            }
            Some(CircuitChange::Closed) => {
                state.exclude.lock().remove(&id);
                tracing::info!(endpoint_id = %id, "circuit closed: the endpoint answers again");
            }
            None => {}
        }
        if changed {
            let circuit = report.circuit.state();
            let (open_until, failures) = match report.circuit {
                Circuit::Open { until, .. } => (Some(until), 0),
                Circuit::HalfOpen { .. } => (None, 0),
                Circuit::Closed { failures } => (None, failures),
            };
            send(
                record_tx,
                Record::Health(EndpointHealth {
                    endpoint_id: id,
                    tenant_id: job.tenant_id.clone(),
                    failing_since: state.failing_since.get(&id).copied(),
                    consecutive_failures: failures,
                    circuit,
                    open_until,
                }),
            )
            .await;
        }
        if let Some(since) = state.failing_since.get(&id).copied()
            && now.since(since) >= self.settings.disable_after
        {
            let why = format!("the endpoint failed without a success since {since}");
            self.disable(state, job, &why, record_tx).await;
        }
    }

    pub(super) async fn disable(
        &self,
        state: &mut RunState,
        job: &DeliveryJob,
        why: &str,
        record_tx: &mpsc::Sender<Record>,
    ) {
        if state.disabling.insert(job.endpoint_id) {
            self.counters
                .endpoints_disabled
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(endpoint_id = %job.endpoint_id, tenant_id = %job.tenant_id, reason = why, "disabling endpoint");
            send(record_tx, Record::Disable(job.endpoint_id, why.to_owned())).await;
        }
    }
}
