//! [`DispatchStore`] on the twin's tables.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use super::MemoryStore;
use super::tables::{FirstState, Node, Tables, Unknown};
use crate::delivery::{
    AttemptRecord, DeliveryJob, DeliveryStatus, FirstWrite, LastError, OutcomeKind, Trigger,
};
use crate::ids::{DeliveryId, EndpointId, EventId};
use crate::routing::{Scope, TOPIC_HELD, node_suffix};
use crate::store::{DispatchStore, EndpointHealth, Release, StoreError, Transition};
use crate::time::Timestamp;

impl DispatchStore for MemoryStore {
    async fn record(&self, attempts: &[AttemptRecord]) -> Result<Vec<DeliveryId>, StoreError> {
        let (mut t, _) = self.begin()?;
        for a in attempts {
            if t.attempt_ids.insert(a.attempt_id) {
                t.attempts.push(a.clone());
            }
        }
        // One state per delivery, the latest automatic attempt's; a
        // delivery any of whose attempts carries a first write gets its
        // row written.
        let mut latest: BTreeMap<DeliveryId, &AttemptRecord> = BTreeMap::new();
        let mut first_writes: HashMap<DeliveryId, &FirstWrite> = HashMap::new();
        for a in attempts.iter().filter(|a| a.trigger == Trigger::Auto) {
            if let Some(w) = &a.first_write {
                first_writes.insert(a.delivery_id, w);
            }
            if latest
                .get(&a.delivery_id)
                .is_none_or(|p| p.number <= a.number)
            {
                latest.insert(a.delivery_id, a);
            }
        }
        let mut stale = Vec::new();
        let mut fresh = Vec::new();
        for (id, a) in &latest {
            if let Some(w) = first_writes.get(id) {
                fresh.push((
                    *id,
                    *w,
                    FirstState {
                        status: a.status,
                        attempts: a.attempt_count,
                        next: a.next_attempt_at,
                        hold: a.hold_until,
                        lease: a.lease_version,
                        http: a.http_status,
                        error: a.error_class.map(LastError::Attempt),
                    },
                ));
                continue;
            }
            match t.deliveries.get_mut(id) {
                // The row is found by its id and when it was made (the
                // day partition it lives in, in Postgres).
                Some(row)
                    if row.lease_version == a.lease_version
                        && row.created_at == a.delivery_created_at
                        && row.status == DeliveryStatus::Pending =>
                {
                    row.status = a.status;
                    row.attempt_count = row.attempt_count.max(a.attempt_count);
                    row.next_attempt_at = a.next_attempt_at;
                    if a.hold_until.is_none() {
                        row.lease_owner = None;
                    }
                    row.hold_until = a.hold_until;
                    row.last_http_status = a.http_status;
                    row.last_error = a.error_class.map(LastError::Attempt);
                }
                _ => stale.push(*id),
            }
        }
        let wanted: Vec<DeliveryId> = fresh.iter().map(|(id, _, _)| *id).collect();
        let written: HashSet<DeliveryId> = t.write_first_rows(fresh).into_iter().collect();
        stale.extend(wanted.into_iter().filter(|id| !written.contains(id)));

        // Manual attempts, after the automatic ones' states: the request
        // is done; a success ends the delivery as succeeded and out of
        // anyone's hands.
        for a in attempts.iter().filter(|a| a.trigger == Trigger::Manual) {
            if let Some(q) = a.replay_request.and_then(|r| t.replays.get_mut(&r)) {
                q.done = true;
            }
            let Some(row) = t.deliveries.get_mut(&a.delivery_id) else {
                continue;
            };
            let ok = a.outcome == OutcomeKind::Succeeded;
            let was = row.status;
            if ok
                && matches!(
                    was,
                    DeliveryStatus::Pending | DeliveryStatus::Failed | DeliveryStatus::Exhausted
                )
            {
                row.status = DeliveryStatus::Succeeded;
            }
            if ok && was == DeliveryStatus::Pending {
                row.lease_owner = None;
                row.hold_until = None;
            }
            row.last_http_status = a.http_status;
        }
        Ok(stale)
    }

    async fn transition(&self, changes: &[Transition]) -> Result<(), StoreError> {
        let (mut t, now) = self.begin()?;
        let mut fresh = Vec::new();
        for c in changes {
            if let Some(w) = &c.first_write {
                fresh.push((
                    c.delivery_id,
                    &**w,
                    FirstState {
                        status: c.status,
                        attempts: 0,
                        next: now,
                        hold: None,
                        lease: c.lease_version,
                        http: None,
                        error: Some(LastError::Ended(c.reason)),
                    },
                ));
                continue;
            }
            if let Some(row) = t.deliveries.get_mut(&c.delivery_id)
                && row.lease_version == c.lease_version
                && row.status == DeliveryStatus::Pending
            {
                row.status = c.status;
                row.last_error = Some(LastError::Ended(c.reason));
                row.lease_owner = None;
                row.hold_until = None;
            }
        }
        t.write_first_rows(fresh);
        Ok(())
    }

    async fn node_started(&self, node: &str, lease: Duration) -> Result<bool, StoreError> {
        let (mut t, now) = self.begin()?;
        let clean = t.nodes.get(node).is_none_or(|n| n.stopped_at.is_some());
        t.nodes.insert(
            node.to_owned(),
            Node {
                lease_until: now.plus(lease),
                started_at: now,
                stopped_at: None,
            },
        );
        // A new run holds none of the replays its predecessor claimed.
        for q in t.replays.values_mut() {
            if !q.done && q.claimed_by.as_deref() == Some(node) {
                q.claimed_until = None;
            }
        }
        Ok(clean)
    }

    async fn node_stopped(&self, node: &str) -> Result<(), StoreError> {
        let (mut t, now) = self.begin()?;
        if let Some(n) = t.nodes.get_mut(node) {
            n.stopped_at = Some(now);
        }
        Ok(())
    }

    async fn heartbeat(&self, node: &str, lease: Duration) -> Result<(), StoreError> {
        let (mut t, now) = self.begin()?;
        let n = t.nodes.entry(node.to_owned()).or_insert(Node {
            lease_until: now,
            started_at: now,
            stopped_at: None,
        });
        n.lease_until = now.plus(lease);
        n.stopped_at = None;
        for q in t.replays.values_mut() {
            if !q.done && q.claimed_by.as_deref() == Some(node) && q.claimed_until.is_some() {
                q.claimed_until = Some(now.plus(lease));
            }
        }
        Ok(())
    }

    async fn claim_due(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let (mut t, now) = self.begin()?;
        let dead: HashSet<String> = t
            .nodes
            .iter()
            .filter(|(id, n)| n.lease_until < now && id.as_str() != node)
            .map(|(id, _)| id.clone())
            .collect();
        // Deliveries of lapsed nodes, then plans of lapsed nodes and plans
        // nobody holds, then due deliveries nobody holds.
        let orphans: Vec<DeliveryId> = t
            .deliveries
            .iter()
            .filter(|(id, r)| {
                r.status == DeliveryStatus::Pending
                    && r.lease_owner.as_ref().is_some_and(|o| dead.contains(o))
                    && !t.replay_claimed(**id, now)
            })
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let mut jobs = t.claim_rows(node, &orphans, Unknown::HolderUnclean);
        if jobs.len() < limit {
            let plans: Vec<EventId> = t
                .plans
                .iter()
                .filter(|(_, p)| p.owner.as_ref().is_none_or(|o| dead.contains(o)))
                .map(|(e, _)| *e)
                .take(limit - jobs.len())
                .collect();
            jobs.extend(t.claim_plans(node, &plans, |t, old| {
                old.and_then(|o| t.nodes.get(o))
                    .is_some_and(|n| n.stopped_at.is_none())
            }));
        }
        if jobs.len() < limit {
            let due = t.due_unheld(now, exclude, limit - jobs.len(), |_, _| true);
            jobs.extend(t.claim_rows(node, &due, Unknown::Is(false)));
        }
        Ok(jobs)
    }

    async fn reclaim_own(
        &self,
        node: &str,
        after: Option<DeliveryId>,
        limit: usize,
        after_unknown: bool,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let (mut t, _) = self.begin()?;
        let after = after.unwrap_or(DeliveryId([0; 16]));
        let own: Vec<DeliveryId> = t
            .deliveries
            .range(after..)
            .filter(|(id, r)| {
                **id > after
                    && r.status == DeliveryStatus::Pending
                    && r.lease_owner.as_deref() == Some(node)
            })
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        Ok(t.claim_rows(node, &own, Unknown::Is(after_unknown)))
    }

    async fn reclaim_plans(
        &self,
        node: &str,
        after: Option<EventId>,
        limit: usize,
        after_unknown: bool,
        before: Timestamp,
    ) -> Result<(Vec<DeliveryJob>, Option<EventId>), StoreError> {
        let (mut t, _) = self.begin()?;
        let after = after.unwrap_or(EventId([0; 16]));
        let picked: Vec<EventId> = t
            .plans
            .range(after..)
            .filter(|(e, p)| {
                **e > after && p.owner.as_deref() == Some(node) && p.created_at < before
            })
            .map(|(e, _)| *e)
            .take(limit)
            .collect();
        let jobs = t.claim_plans(node, &picked, |_, _| after_unknown);
        let next = picked.last().copied().filter(|_| picked.len() >= limit);
        Ok((jobs, next))
    }

    async fn tidy_plans(&self) -> Result<u64, StoreError> {
        let (mut t, now) = self.begin()?;
        let cutoff = Timestamp(now.0 - Duration::from_secs(10).as_micros() as i64);
        let done: Vec<EventId> = t
            .plans
            .iter()
            .filter(|(_, p)| {
                p.created_at < cutoff
                    && p.deliveries
                        .iter()
                        .all(|(d, _, _)| t.deliveries.contains_key(d))
            })
            .map(|(e, _)| *e)
            .collect();
        for e in &done {
            t.plans.remove(e);
        }
        Ok(done.len() as u64)
    }

    async fn cancellations_after(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<DeliveryId>, i64), StoreError> {
        let (t, _) = self.begin()?;
        let last = t.cancellations.len() as i64;
        let Some(after) = after else {
            return Ok((Vec::new(), last));
        };
        let from = usize::try_from(after.max(0)).unwrap_or(usize::MAX);
        let ids: Vec<DeliveryId> = t
            .cancellations
            .iter()
            .skip(from)
            .take(limit)
            .copied()
            .collect();
        let next = after + ids.len() as i64;
        Ok((ids, next))
    }

    async fn record_verification(
        &self,
        endpoint: EndpointId,
        challenge: &str,
        result: Result<(), String>,
    ) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        t.verifications
            .push((endpoint, challenge.to_owned(), result));
        Ok(())
    }

    async fn release(&self, releases: &[Release]) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        let mut fresh = Vec::new();
        for r in releases {
            if let Some(w) = &r.first_write {
                fresh.push((
                    r.delivery_id,
                    &**w,
                    FirstState {
                        status: DeliveryStatus::Pending,
                        attempts: 0,
                        next: r.not_before,
                        hold: None,
                        lease: r.lease_version,
                        http: None,
                        error: None,
                    },
                ));
                continue;
            }
            if let Some(row) = t.deliveries.get_mut(&r.delivery_id)
                && row.lease_version == r.lease_version
                && row.status == DeliveryStatus::Pending
            {
                row.lease_owner = None;
                row.hold_until = None;
                row.next_attempt_at = row.next_attempt_at.max(r.not_before);
            }
        }
        t.write_first_rows(fresh);
        Ok(())
    }

    async fn claim_replays(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let (mut t, now) = self.begin()?;
        let picked = t.open_replays(node, limit, now, |_, _| true);
        Ok(t.claim_replays(node, picked, now.plus(lease)))
    }

    async fn claim_scoped(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
        scope: &Scope,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let (mut t, now) = self.begin()?;
        // What an earlier holder of the partition held (it stopped or its
        // lease lapsed), then what is due and unheld.
        let held: Vec<DeliveryId> = t
            .deliveries
            .iter()
            .filter(|(id, r)| {
                r.status == DeliveryStatus::Pending
                    && r.lease_owner.as_deref().is_some_and(|o| {
                        o != node
                            && t.nodes
                                .get(o)
                                .is_none_or(|n| n.stopped_at.is_some() || n.lease_until < now)
                    })
                    && Tables::in_scope(scope, r.endpoint_id, **id)
                    && !t.replay_claimed(**id, now)
            })
            .map(|(id, _)| *id)
            .take(limit)
            .collect();
        let mut jobs = t.claim_rows(node, &held, Unknown::HolderUnclean);
        if jobs.len() < limit {
            let due = t.due_unheld(now, exclude, limit - jobs.len(), |id, r| {
                Tables::in_scope(scope, r.endpoint_id, id)
            });
            jobs.extend(t.claim_rows(node, &due, Unknown::Is(false)));
        }
        Ok(jobs)
    }

    async fn claim_replays_scoped(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
        scope: &Scope,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let (mut t, now) = self.begin()?;
        let picked = t.open_replays(node, limit, now, |id, r| {
            Tables::in_scope(scope, r.endpoint_id, id)
        });
        Ok(t.claim_replays(node, picked, now.plus(lease)))
    }

    async fn take_partition(
        &self,
        node: &str,
        scope: &Scope,
    ) -> Result<Option<Vec<DeliveryJob>>, StoreError> {
        let (t, now) = self.begin()?;
        let suffix = node_suffix(scope.partition);
        let earlier = || {
            t.nodes
                .iter()
                .filter(|(id, _)| id.contains(&suffix) && id.as_str() != node)
        };
        if earlier().any(|(_, n)| n.stopped_at.is_none() && n.lease_until >= now) {
            return Ok(None);
        }
        let after_unknown = earlier()
            .max_by_key(|(_, n)| n.started_at)
            .is_some_and(|(_, n)| n.stopped_at.is_none());
        let mut jobs = Vec::new();
        for (event, plan) in &t.plans {
            if plan.owner.as_deref() == Some(TOPIC_HELD) {
                jobs.extend(t.plan_jobs(*event, plan, after_unknown, |d, ep| {
                    Tables::in_scope(scope, ep, d)
                }));
            }
        }
        Ok(Some(jobs))
    }

    async fn without_rows(&self, ids: &[DeliveryId]) -> Result<Vec<DeliveryId>, StoreError> {
        let (t, _) = self.begin()?;
        Ok(ids
            .iter()
            .filter(|id| !t.deliveries.contains_key(id))
            .copied()
            .collect())
    }

    async fn reject_replay(&self, request_id: i64, reason: &str) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        if let Some(q) = t.replays.get_mut(&request_id)
            && !q.done
        {
            q.done = true;
            q.error = Some(reason.to_owned());
        }
        Ok(())
    }

    async fn disable_endpoint(&self, endpoint: EndpointId, reason: &str) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        t.disabled.push((endpoint, reason.to_owned()));
        Ok(())
    }

    async fn save_health(&self, health: &[EndpointHealth]) -> Result<(), StoreError> {
        let (mut t, _) = self.begin()?;
        for h in health {
            t.health.insert(h.endpoint_id, h.clone());
        }
        Ok(())
    }

    async fn load_health(&self) -> Result<Vec<EndpointHealth>, StoreError> {
        let (t, _) = self.begin()?;
        Ok(t.health.values().cloned().collect())
    }
}
