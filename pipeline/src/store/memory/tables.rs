//! The twin's tables and the row-level steps its methods share: claims
//! under a new lease, jobs read back from rows and plans, first rows written
//! under a plan's lease, replay picks.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::DeliveryRow;
use crate::delivery::{
    AttemptRecord, DeliveryJob, DeliveryStatus, FirstWrite, LastError, ObjectOrder, Replay,
};
use crate::event::Event;
use crate::ids::{AttemptId, DeliveryId, EndpointId, EventId};
use crate::incident::StageIncident;
use crate::routing::{Scope, partition_of};
use crate::store::EndpointHealth;
use crate::time::Timestamp;

/// Fan-out's plan of one event: its deliveries that have no row yet.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// (delivery, endpoint, config version), in delivery order.
    pub(super) deliveries: Vec<(DeliveryId, EndpointId, i32)>,
    pub(super) created_at: Timestamp,
    pub(super) expires_at: Timestamp,
    pub(super) owner: Option<String>,
    pub(super) lease_version: i64,
}

#[derive(Debug, Clone)]
pub(super) struct Node {
    pub(super) lease_until: Timestamp,
    pub(super) started_at: Timestamp,
    pub(super) stopped_at: Option<Timestamp>,
}

#[derive(Debug, Clone)]
pub(super) struct ReplayRequest {
    pub(super) delivery_id: DeliveryId,
    pub(super) claimed_by: Option<String>,
    pub(super) claimed_until: Option<Timestamp>,
    pub(super) done: bool,
    pub(super) error: Option<String>,
}

#[derive(Default)]
pub(super) struct Tables {
    pub(super) events: HashMap<EventId, Event>,
    pub(super) plans: BTreeMap<EventId, Plan>,
    pub(super) deliveries: BTreeMap<DeliveryId, DeliveryRow>,
    pub(super) attempts: Vec<AttemptRecord>,
    pub(super) attempt_ids: HashSet<AttemptId>,
    pub(super) nodes: HashMap<String, Node>,
    pub(super) replays: BTreeMap<i64, ReplayRequest>,
    pub(super) cancellations: Vec<DeliveryId>,
    pub(super) health: BTreeMap<EndpointId, EndpointHealth>,
    pub(super) disabled: Vec<(EndpointId, String)>,
    pub(super) verifications: Vec<(EndpointId, String, Result<(), String>)>,
    pub(super) incidents: Vec<StageIncident>,
    pub(super) failures: u32,
    pub(super) refused: HashSet<EventId>,
}

/// How the claim of a row marks its job.
#[derive(Clone, Copy)]
pub(super) enum Unknown {
    /// As given.
    Is(bool),
    /// Whether the row's holder (a node) did not stop cleanly; a holder
    /// that is no node counts as not clean.
    HolderUnclean,
}

impl Tables {
    /// Whether a node claimed a replay of `delivery` and has not recorded
    /// it yet (its success would end the automatic schedule).
    pub(super) fn replay_claimed(&self, delivery: DeliveryId, now: Timestamp) -> bool {
        self.replays.values().any(|q| {
            q.delivery_id == delivery && !q.done && q.claimed_until.is_some_and(|u| u >= now)
        })
    }

    /// Pending deliveries nobody holds, due by `now`, not to `exclude`,
    /// passing `keep`, without a replay claimed: the soonest due first, at
    /// most `limit`.
    pub(super) fn due_unheld(
        &self,
        now: Timestamp,
        exclude: &[EndpointId],
        limit: usize,
        keep: impl Fn(DeliveryId, &DeliveryRow) -> bool,
    ) -> Vec<DeliveryId> {
        let mut due: Vec<(Timestamp, DeliveryId)> = self
            .deliveries
            .iter()
            .filter(|(id, r)| {
                r.status == DeliveryStatus::Pending
                    && r.lease_owner.is_none()
                    && r.next_attempt_at <= now
                    && !exclude.contains(&r.endpoint_id)
                    && keep(**id, r)
                    && !self.replay_claimed(**id, now)
            })
            .map(|(id, r)| (r.next_attempt_at, *id))
            .collect();
        due.sort();
        due.into_iter().take(limit).map(|(_, id)| id).collect()
    }

    pub(super) fn node_live(&self, node: &str, now: Timestamp) -> bool {
        self.nodes.get(node).is_some_and(|n| n.lease_until >= now)
    }

    /// Takes `ids` (pending rows) under a new lease held by `node`, as
    /// jobs.
    pub(super) fn claim_rows(
        &mut self,
        node: &str,
        ids: &[DeliveryId],
        unknown: Unknown,
    ) -> Vec<DeliveryJob> {
        let mut jobs = Vec::with_capacity(ids.len());
        for id in ids {
            let after_unknown = match unknown {
                Unknown::Is(b) => b,
                Unknown::HolderUnclean => {
                    let holder = self.deliveries[id].lease_owner.as_deref();
                    holder
                        .and_then(|h| self.nodes.get(h))
                        .is_none_or(|n| n.stopped_at.is_none())
                }
            };
            let Some(row) = self.deliveries.get_mut(id) else {
                continue;
            };
            if row.status != DeliveryStatus::Pending {
                continue;
            }
            row.lease_version += 1;
            row.lease_owner = Some(node.to_owned());
            row.hold_until = None;
            let row = row.clone();
            jobs.push(self.job_of_row(*id, &row, after_unknown, None));
        }
        jobs
    }

    pub(super) fn job_of_row(
        &self,
        id: DeliveryId,
        row: &DeliveryRow,
        after_unknown: bool,
        replay: Option<i64>,
    ) -> DeliveryJob {
        let event = self.events.get(&row.event_id);
        DeliveryJob {
            delivery_id: id,
            event_id: row.event_id,
            endpoint_id: row.endpoint_id,
            tenant_id: row.tenant_id.clone(),
            event_type: row.event_type.clone(),
            payload: event.map(|e| e.payload.clone()).unwrap_or_default(),
            attempt_count: row.attempt_count,
            manual_attempt_count: row.manual_attempt_count,
            after_unknown,
            materialized: true,
            created_at: row.created_at,
            next_attempt_at: row.next_attempt_at,
            expires_at: row.expires_at,
            lease_version: row.lease_version,
            endpoint_config_version: row.endpoint_config_version,
            event_occurred_at: row.event_occurred_at,
            schema_version: event.map_or(1, |e| e.schema_version.max(1)),
            replay: replay.map(|request_id| Replay {
                request_id,
                number: row.attempt_count + row.manual_attempt_count,
            }),
            order: event.and_then(ObjectOrder::of),
        }
    }

    /// The jobs of `plan`'s deliveries that have no row yet and pass
    /// `keep`.
    pub(super) fn plan_jobs(
        &self,
        event_id: EventId,
        plan: &Plan,
        after_unknown: bool,
        keep: impl Fn(DeliveryId, EndpointId) -> bool,
    ) -> Vec<DeliveryJob> {
        let Some(event) = self.events.get(&event_id) else {
            return Vec::new();
        };
        plan.deliveries
            .iter()
            .filter(|(d, ep, _)| !self.deliveries.contains_key(d) && keep(*d, *ep))
            .map(|(d, ep, ver)| DeliveryJob {
                delivery_id: *d,
                event_id,
                endpoint_id: *ep,
                tenant_id: event.tenant_id.clone(),
                event_type: event.event_type.clone(),
                payload: event.payload.clone(),
                attempt_count: 0,
                manual_attempt_count: 0,
                after_unknown,
                materialized: false,
                created_at: plan.created_at,
                next_attempt_at: plan.created_at,
                expires_at: plan.expires_at,
                lease_version: plan.lease_version,
                endpoint_config_version: *ver,
                event_occurred_at: event.occurred_at,
                schema_version: event.schema_version.max(1),
                replay: None,
                order: ObjectOrder::of(event),
            })
            .collect()
    }

    /// Takes the plans of `events` under a new lease held by `node`;
    /// `unknown` of a plan's former holder.
    pub(super) fn claim_plans(
        &mut self,
        node: &str,
        events: &[EventId],
        unknown: impl Fn(&Tables, Option<&str>) -> bool,
    ) -> Vec<DeliveryJob> {
        let mut jobs = Vec::new();
        for event in events {
            let Some(mut plan) = self.plans.get(event).cloned() else {
                continue;
            };
            let after_unknown = unknown(self, plan.owner.as_deref());
            plan.lease_version += 1;
            plan.owner = Some(node.to_owned());
            jobs.extend(self.plan_jobs(*event, &plan, after_unknown, |_, _| true));
            self.plans.insert(*event, plan);
        }
        jobs
    }

    /// Writes first rows (deliveries planned by fan-out), each only under
    /// its plan's current lease and only when it has none; removes the
    /// plans whose deliveries all have rows then. Returns the deliveries
    /// written.
    pub(super) fn write_first_rows(
        &mut self,
        rows: Vec<(DeliveryId, &FirstWrite, FirstState)>,
    ) -> Vec<DeliveryId> {
        let mut written = Vec::new();
        let mut events = Vec::new();
        for (id, w, s) in rows {
            let Some(plan) = self.plans.get(&w.event_id) else {
                continue;
            };
            if plan.lease_version != s.lease || self.deliveries.contains_key(&id) {
                continue;
            }
            let owner = s.hold.and(w.holder.clone().or_else(|| plan.owner.clone()));
            self.deliveries.insert(
                id,
                DeliveryRow {
                    event_id: w.event_id,
                    endpoint_id: w.endpoint_id,
                    tenant_id: w.tenant_id.clone(),
                    event_type: w.event_type.clone(),
                    event_occurred_at: w.event_occurred_at,
                    endpoint_config_version: w.config_version,
                    status: s.status,
                    attempt_count: s.attempts,
                    manual_attempt_count: 0,
                    next_attempt_at: s.next,
                    expires_at: w.expires_at,
                    lease_version: s.lease,
                    lease_owner: owner,
                    hold_until: s.hold,
                    last_http_status: s.http,
                    last_error: s.error,
                    created_at: w.created_at,
                },
            );
            written.push(id);
            events.push(w.event_id);
        }
        for event in events {
            let done = self.plans.get(&event).is_some_and(|p| {
                p.deliveries
                    .iter()
                    .all(|(d, _, _)| self.deliveries.contains_key(d))
            });
            if done {
                self.plans.remove(&event);
            }
        }
        written
    }

    pub(super) fn in_scope(scope: &Scope, endpoint: EndpointId, delivery: DeliveryId) -> bool {
        let shards = scope
            .shards
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map_or(1, |(_, k)| *k);
        partition_of(endpoint, delivery, scope.partitions, shards) == scope.partition
    }

    /// Open replay requests that `node` may claim now, one per delivery
    /// (its oldest), in delivery order, at most `limit`, of the
    /// deliveries that pass `keep`.
    pub(super) fn open_replays(
        &self,
        node: &str,
        limit: usize,
        now: Timestamp,
        keep: impl Fn(DeliveryId, &DeliveryRow) -> bool,
    ) -> Vec<(i64, DeliveryId)> {
        let mut first: BTreeMap<DeliveryId, i64> = BTreeMap::new();
        for (id, q) in &self.replays {
            if q.done || q.claimed_until.is_some_and(|u| u >= now) {
                continue;
            }
            let Some(row) = self.deliveries.get(&q.delivery_id) else {
                continue;
            };
            let free = row.status != DeliveryStatus::Pending
                || row
                    .lease_owner
                    .as_deref()
                    .is_none_or(|o| o == node || !self.node_live(o, now));
            if free && keep(q.delivery_id, row) {
                first.entry(q.delivery_id).or_insert(*id);
            }
        }
        first.into_iter().take(limit).map(|(d, q)| (q, d)).collect()
    }

    pub(super) fn claim_replays(
        &mut self,
        node: &str,
        picked: Vec<(i64, DeliveryId)>,
        until: Timestamp,
    ) -> Vec<DeliveryJob> {
        let mut jobs = Vec::new();
        for (request, delivery) in picked {
            if let Some(q) = self.replays.get_mut(&request) {
                q.claimed_by = Some(node.to_owned());
                q.claimed_until = Some(until);
            }
            let Some(row) = self.deliveries.get_mut(&delivery) else {
                continue;
            };
            row.manual_attempt_count += 1;
            let row = row.clone();
            jobs.push(self.job_of_row(delivery, &row, false, Some(request)));
        }
        jobs
    }
}

/// A first row's state.
pub(super) struct FirstState {
    pub(super) status: DeliveryStatus,
    pub(super) attempts: u32,
    pub(super) next: Timestamp,
    pub(super) hold: Option<Timestamp>,
    pub(super) lease: i64,
    pub(super) http: Option<u16>,
    pub(super) error: Option<LastError>,
}
