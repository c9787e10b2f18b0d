//! An in-memory [`FanoutStore`] and [`DispatchStore`]: the model the
//! Postgres store (`walhook-sql`) is held to by the
//! [contract](super::contract), and the store of unit tests.
//!
//! It keeps the same tables in maps: events, fan-out's plans (deliveries
//! with no row yet, held under a plan lease), delivery rows under their
//! leases, attempts, dispatcher nodes, replay requests and endpoints'
//! health. "Now" is the store's [`Clock`], so a test on a manual clock sees
//! leases lapse and retries fall due when it moves the clock.
//!
//! What it leaves out: the catalog of event types, the console's tallies,
//! partitions of tables, and what disabling an endpoint writes beyond the
//! fact (a config version, an audit record, an operational event).

use std::collections::HashSet;

use parking_lot::{Mutex, MutexGuard};

use super::{FanoutStore, StoreError};
use crate::capture::ledger::memory::MemoryLedgerStore;
use crate::delivery::{AttemptRecord, DeliveryJob, DeliveryStatus, LastError, NewDelivery};
use crate::dispatch::clock::Clock;
use crate::event::{Event, EventKey, EventType};
use crate::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use crate::incident::{IncidentStore, StageIncident};
use crate::routing::TOPIC_HELD;
#[cfg(doc)]
use crate::store::DispatchStore;
use crate::time::Timestamp;

mod dispatch;
mod endpoints;
mod platform;
mod tables;

pub use endpoints::MemoryEndpoints;

use tables::{Plan, ReplayRequest, Tables};

/// A delivery's row, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    /// Its event.
    pub event_id: EventId,
    /// Its endpoint.
    pub endpoint_id: EndpointId,
    /// Its tenant.
    pub tenant_id: TenantId,
    /// The event's type.
    pub event_type: EventType,
    /// The event's commit time.
    pub event_occurred_at: Timestamp,
    /// The endpoint config version fan-out decided with.
    pub endpoint_config_version: i32,
    /// Its state.
    pub status: DeliveryStatus,
    /// Automatic attempts recorded.
    pub attempt_count: u32,
    /// Manual attempts claimed.
    pub manual_attempt_count: u32,
    /// When the next automatic attempt is due.
    pub next_attempt_at: Timestamp,
    /// When automatic retries stop.
    pub expires_at: Timestamp,
    /// The current lease; results are applied only under it.
    pub lease_version: i64,
    /// The node that holds it, if any.
    pub lease_owner: Option<String>,
    /// Until when its holder keeps it (a near retry).
    pub hold_until: Option<Timestamp>,
    /// The last attempt's HTTP status.
    pub last_http_status: Option<u16>,
    /// The last attempt's error class, or why it ended.
    pub last_error: Option<LastError>,
    /// When fan-out made it.
    pub created_at: Timestamp,
}

/// The platform store's tables in memory. Cheap to make; share it in an
/// `Arc`.
#[derive(Default)]
pub struct MemoryStore {
    tables: Mutex<Tables>,
    clock: Clock,
    /// Capture's side: incidents, the ledger, checkpoints.
    capture: MemoryLedgerStore,
    /// The endpoints the directory loads.
    endpoints: MemoryEndpoints,
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose "now" is `clock`.
    pub fn with_clock(clock: Clock) -> Self {
        MemoryStore {
            clock,
            ..MemoryStore::default()
        }
    }

    /// Makes the next `n` calls fail with a transient error (a dropped
    /// connection), changing nothing.
    pub fn fail_next(&self, n: u32) {
        self.tables.lock().failures = n;
    }

    /// Makes fan-out's writes that hold `event` fail with a data error
    /// (as Postgres refuses a value it cannot store), changing nothing.
    pub fn refuse(&self, event: EventId) {
        self.tables.lock().refused.insert(event);
    }

    /// Every attempt recorded, in the order recorded.
    pub fn attempts(&self) -> Vec<AttemptRecord> {
        self.tables.lock().attempts.clone()
    }

    /// How many attempts are recorded.
    pub fn attempt_count(&self) -> usize {
        self.tables.lock().attempts.len()
    }

    /// The row of `delivery`, if it has one.
    pub fn delivery(&self, delivery: DeliveryId) -> Option<DeliveryRow> {
        self.tables.lock().deliveries.get(&delivery).cloned()
    }

    /// How many delivery rows there are.
    pub fn delivery_count(&self) -> usize {
        self.tables.lock().deliveries.len()
    }

    /// The stored event `id`.
    pub fn event(&self, id: EventId) -> Option<Event> {
        self.tables.lock().events.get(&id).cloned()
    }

    /// How many events are stored.
    pub fn event_count(&self) -> usize {
        self.tables.lock().events.len()
    }

    /// The deliveries of the plan of `event` that have no row yet, and its
    /// holder; `None` when there is no plan.
    pub fn plan(&self, event: EventId) -> Option<(Vec<DeliveryId>, Option<String>)> {
        let t = self.tables.lock();
        let plan = t.plans.get(&event)?;
        let open = plan
            .deliveries
            .iter()
            .filter(|(d, _, _)| !t.deliveries.contains_key(d))
            .map(|(d, _, _)| *d)
            .collect();
        Some((open, plan.owner.clone()))
    }

    /// How many plans there are.
    pub fn plan_count(&self) -> usize {
        self.tables.lock().plans.len()
    }

    /// Endpoints disabled through the store, with the reasons.
    pub fn disabled(&self) -> Vec<(EndpointId, String)> {
        self.tables.lock().disabled.clone()
    }

    /// Ownership checks recorded: endpoint, challenge, result.
    pub fn verifications(&self) -> Vec<(EndpointId, String, Result<(), String>)> {
        self.tables.lock().verifications.clone()
    }

    /// Incidents recorded, folded as the Postgres store folds them (one per
    /// stage, kind and subject).
    pub fn incidents(&self) -> Vec<StageIncident> {
        self.tables.lock().incidents.clone()
    }

    /// Whether replay request `id` is closed, and the error it was closed
    /// with.
    pub fn replay_done(&self, id: i64) -> Option<(bool, Option<String>)> {
        let t = self.tables.lock();
        t.replays.get(&id).map(|r| (r.done, r.error.clone()))
    }

    /// Writes `job`'s event and row, pending under the job's lease: held by
    /// `holder` until the job expires (a test that hands jobs straight to a
    /// dispatcher), or by nobody (any node claims it once due).
    pub fn seed(&self, job: &DeliveryJob, holder: Option<&str>) {
        let mut t = self.tables.lock();
        let (source, key, object_id) = match &job.order {
            Some(o) => ("seed", o.key, Some(o.object_id.to_string())),
            None => (
                "seed",
                EventKey {
                    commit_lsn: Lsn(0),
                    tx_ordinal: 0,
                },
                None,
            ),
        };
        t.events.entry(job.event_id).or_insert_with(|| Event {
            id: job.event_id,
            source: source.into(),
            key,
            tenant_id: job.tenant_id.clone(),
            event_type: job.event_type.clone(),
            schema_version: job.schema_version,
            object_id,
            object_version: None,
            occurred_at: job.event_occurred_at,
            payload: job.payload.clone(),
            payload_hash: [0; 32],
        });
        t.deliveries.insert(
            job.delivery_id,
            DeliveryRow {
                event_id: job.event_id,
                endpoint_id: job.endpoint_id,
                tenant_id: job.tenant_id.clone(),
                event_type: job.event_type.clone(),
                event_occurred_at: job.event_occurred_at,
                endpoint_config_version: job.endpoint_config_version,
                status: DeliveryStatus::Pending,
                attempt_count: job.attempt_count,
                manual_attempt_count: job.manual_attempt_count,
                next_attempt_at: job.next_attempt_at,
                expires_at: job.expires_at,
                lease_version: job.lease_version,
                lease_owner: holder.map(str::to_owned),
                hold_until: holder.map(|_| job.expires_at),
                last_http_status: None,
                last_error: None,
                created_at: job.created_at,
            },
        );
    }

    /// Asks for a manual attempt of `delivery`, as the API does; returns
    /// the request's id, or `None` when the delivery has no row.
    pub fn request_replay(&self, delivery: DeliveryId) -> Option<i64> {
        let mut t = self.tables.lock();
        if !t.deliveries.contains_key(&delivery) {
            return None;
        }
        let id = t.replays.keys().next_back().map_or(1, |k| k + 1);
        t.replays.insert(
            id,
            ReplayRequest {
                delivery_id: delivery,
                claimed_by: None,
                claimed_until: None,
                done: false,
                error: None,
            },
        );
        Some(id)
    }

    /// Cancels a pending delivery, as the API does: it ends as cancelled
    /// and dispatchers hear of it through
    /// [`DispatchStore::cancellations_after`]. Returns whether it was
    /// pending.
    pub fn cancel(&self, delivery: DeliveryId) -> bool {
        let mut t = self.tables.lock();
        let Some(row) = t.deliveries.get_mut(&delivery) else {
            return false;
        };
        if row.status != DeliveryStatus::Pending {
            return false;
        }
        row.status = DeliveryStatus::Cancelled;
        row.last_error = Some(LastError::Ended(crate::delivery::EndReason::Cancelled));
        row.lease_owner = None;
        row.hold_until = None;
        t.cancellations.push(delivery);
        true
    }

    /// The tables, after a failure asked for by [`MemoryStore::fail_next`].
    fn begin(&self) -> Result<(MutexGuard<'_, Tables>, Timestamp), StoreError> {
        let mut t = self.tables.lock();
        if t.failures > 0 {
            t.failures -= 1;
            return Err(StoreError::transient(
                "the in-memory store was told to fail",
                std::io::Error::other("injected"),
            ));
        }
        Ok((t, self.clock.now()))
    }
}

impl IncidentStore for MemoryStore {
    async fn record_incidents(&self, incidents: &[StageIncident]) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        for i in incidents {
            let same = t
                .incidents
                .iter_mut()
                .find(|x| x.stage == i.stage && x.kind == i.kind && x.subject == i.subject);
            match same {
                Some(x) => {
                    x.occurrences += i.occurrences;
                    x.detail.clone_from(&i.detail);
                }
                None => t.incidents.push(i.clone()),
            }
        }
        Ok(())
    }
}

impl FanoutStore for MemoryStore {
    async fn materialize(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
    ) -> Result<Vec<DeliveryId>, StoreError> {
        let (mut t, _) = self.begin()?;
        if let Some(e) = events.iter().find(|e| t.refused.contains(&e.id)) {
            return Err(StoreError::data(format!(
                "the in-memory store was told to refuse event {}",
                e.id
            )));
        }
        for e in events {
            t.events.entry(e.id).or_insert_with(|| e.clone());
        }
        // Plans that existed before this call, and the deliveries grouped
        // by event in the order first met.
        let before: HashSet<EventId> = t.plans.keys().copied().collect();
        let mut groups: Vec<(EventId, Vec<&NewDelivery>)> = Vec::new();
        for d in deliveries {
            match groups.iter_mut().find(|(e, _)| *e == d.event_id) {
                Some((_, g)) => g.push(d),
                None => groups.push((d.event_id, vec![d])),
            }
        }
        let mut made = Vec::new();
        for (event, group) in groups {
            if before.contains(&event) {
                // A retry of a batch whose first try committed (same
                // holder, same creation time, first lease), or a plan the
                // deliveries topic holds: its deliveries without a row are
                // still this caller's to hand over.
                let plan = &t.plans[&event];
                for d in &group {
                    let mine = d.lease_owner.is_some()
                        && plan.owner == d.lease_owner
                        && plan.lease_version == 1
                        && (plan.created_at == d.created_at
                            || d.lease_owner.as_deref() == Some(TOPIC_HELD))
                        && plan.deliveries.iter().any(|(id, _, _)| *id == d.id)
                        && !t.deliveries.contains_key(&d.id);
                    if mine {
                        made.push(d.id);
                    }
                }
                continue;
            }
            let mut open: Vec<(DeliveryId, EndpointId, i32)> = group
                .iter()
                .filter(|d| !t.deliveries.contains_key(&d.id))
                .map(|d| (d.id, d.endpoint_id, d.endpoint_config_version))
                .collect();
            if open.is_empty() {
                continue;
            }
            open.sort_by_key(|(id, _, _)| *id);
            let first = group[0];
            made.extend(open.iter().map(|(id, _, _)| *id));
            t.plans.insert(
                event,
                Plan {
                    deliveries: open,
                    created_at: first.created_at,
                    expires_at: first.expires_at,
                    owner: first.lease_owner.clone(),
                    lease_version: 1,
                },
            );
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::contract::{self, Fixture};

    struct Twin;

    impl Fixture for Twin {
        type Store = MemoryStore;

        async fn fresh(&self) -> Result<MemoryStore, StoreError> {
            Ok(MemoryStore::new())
        }

        async fn request_replay(
            &self,
            store: &MemoryStore,
            delivery: DeliveryId,
        ) -> Result<i64, StoreError> {
            store
                .request_replay(delivery)
                .ok_or_else(|| StoreError::data(format!("delivery {delivery} has no row")))
        }

        async fn cancel(
            &self,
            store: &MemoryStore,
            delivery: DeliveryId,
        ) -> Result<(), StoreError> {
            store.cancel(delivery);
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_twin_keeps_the_store_contract() {
        contract::check_all(&Twin).await.unwrap();
    }

    #[tokio::test]
    async fn an_injected_failure_changes_nothing() {
        let store = MemoryStore::new();
        let (event, deliveries) = contract::batch(1, None, Timestamp::now());
        store.fail_next(1);
        let err = store
            .materialize(std::slice::from_ref(&event), &deliveries)
            .await
            .unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert_eq!(store.event_count(), 0);
        assert_eq!(store.plan_count(), 0);
        let made = store
            .materialize(std::slice::from_ref(&event), &deliveries)
            .await
            .unwrap();
        assert_eq!(made.len(), 3);
        assert_eq!(store.plan(event.id).unwrap().0.len(), 3);
    }
}
