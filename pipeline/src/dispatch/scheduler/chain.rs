//! Per-object ordering: the chains of one object's deliveries at an
//! endpoint that orders per object. Only a chain's head is scheduled; the
//! rest wait in commit order and the next becomes the head when the head
//! ends (or a head that failed lets it go, which its first attempt notes).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::Scheduler;
use crate::delivery::DeliveryJob;
use crate::event::EventKey;
use crate::ids::{DeliveryId, EndpointId};
use crate::time::Timestamp;

/// One object at an endpoint with per-object ordering.
pub(super) type ChainKey = (EndpointId, Arc<str>);

/// A delivery's place in its chain: commit order, then the id (two capture
/// sources may share a position).
type ChainPos = (EventKey, DeliveryId);

/// The deliveries of one object at an ordered endpoint that this node holds.
#[derive(Debug)]
pub(super) struct Chain {
    /// The one that may be attempted (queued, waiting or in flight).
    pub(super) head: DeliveryId,
    head_pos: ChainPos,
    /// Whether an attempt of the head is out (it can no longer give way to
    /// an earlier delivery).
    pub(super) head_out: bool,
    /// Whether the head ended without success: the next one goes, and its
    /// first attempt says so.
    head_failed: bool,
    /// The later ones, in commit order.
    pub(super) blocked: BTreeMap<ChainPos, DeliveryJob>,
}

impl Scheduler {
    /// The chain an automatic job of an ordered endpoint belongs to.
    pub(super) fn chain_key(&self, job: &DeliveryJob) -> Option<ChainKey> {
        if self.ordered.is_empty()
            || job.replay.is_some()
            || !self.ordered.contains(&job.endpoint_id)
        {
            return None;
        }
        job.order
            .as_ref()
            .map(|o| (job.endpoint_id, o.object_id.clone()))
    }

    /// Puts `job` into its chain; returns it when it is the head (to be
    /// scheduled), `None` when it waits behind an earlier one.
    pub(super) fn join_chain(&mut self, key: ChainKey, job: DeliveryJob) -> Option<DeliveryJob> {
        let id = job.delivery_id;
        let pos = (
            job.order.as_ref().expect("chained jobs have an order").key,
            id,
        );
        self.in_chain.insert(id, key.clone());
        let Some(chain) = self.chains.get_mut(&key) else {
            self.chains.insert(
                key,
                Chain {
                    head: id,
                    head_pos: pos,
                    head_out: false,
                    head_failed: false,
                    blocked: BTreeMap::new(),
                },
            );
            return Some(job);
        };
        if chain.head_out || pos > chain.head_pos {
            chain.blocked.insert(pos, job);
            return None;
        }
        // Earlier than a head not yet attempted: it goes first.
        let old = std::mem::replace(&mut chain.head, id);
        chain.head_pos = pos;
        if let Some(old_job) = self.unschedule(&old) {
            let old_pos = (
                old_job
                    .order
                    .as_ref()
                    .expect("chained jobs have an order")
                    .key,
                old,
            );
            if let Some(chain) = self.chains.get_mut(&key) {
                chain.blocked.insert(old_pos, old_job);
            }
        }
        Some(job)
    }

    /// Sets the endpoints with per-object ordering. Deliveries waiting in
    /// the chains of an endpoint that no longer orders are scheduled.
    pub fn set_ordered(&mut self, ordered: HashSet<EndpointId>, now: Timestamp) {
        self.ordered = ordered;
        let gone: Vec<ChainKey> = self
            .chains
            .keys()
            .filter(|(ep, _)| !self.ordered.contains(ep))
            .cloned()
            .collect();
        for key in gone {
            let Some(chain) = self.chains.remove(&key) else {
                continue;
            };
            self.in_chain.remove(&chain.head);
            for (_, job) in chain.blocked {
                self.in_chain.remove(&job.delivery_id);
                self.schedule(job, now);
            }
        }
    }

    /// Whether `job` is (or would be) kept in order with its object's other
    /// deliveries: such a job stays with this node until it ends, since a
    /// later one of its object could otherwise be claimed and sent first.
    pub fn orders(&self, job: &DeliveryJob) -> bool {
        self.chain_key(job).is_some()
    }

    /// Notes that held delivery `id` ended without success: when it heads a
    /// chain, the next delivery of its object goes anyway and its first
    /// attempt says so. Returns how many wait behind it.
    pub fn head_failed(&mut self, id: &DeliveryId) -> usize {
        let Some(chain) = self.in_chain.get(id).and_then(|k| self.chains.get_mut(k)) else {
            return 0;
        };
        if chain.head != *id {
            return 0;
        }
        chain.head_failed = true;
        chain.blocked.len()
    }

    /// Whether `id` went out after an earlier delivery of its object ended
    /// without success (asked once, when its first attempt is recorded).
    pub fn take_after_failure(&mut self, id: &DeliveryId) -> bool {
        !self.after_failure.is_empty() && self.after_failure.remove(id)
    }

    /// Advances the chains whose head ended: the next delivery of the
    /// object becomes the head and is scheduled.
    pub(super) fn settle_chains(&mut self, now: Timestamp) {
        if self.settle.is_empty() {
            return;
        }
        for key in std::mem::take(&mut self.settle) {
            let Some(chain) = self.chains.get_mut(&key) else {
                continue;
            };
            if self.held.contains_key(&chain.head) {
                // Rescheduled (a retry): still the head.
                continue;
            }
            let ended = chain.head;
            let failed = std::mem::take(&mut chain.head_failed);
            self.in_chain.remove(&ended);
            let Some((pos, next)) = chain.blocked.pop_first() else {
                self.chains.remove(&key);
                continue;
            };
            chain.head = next.delivery_id;
            chain.head_pos = pos;
            chain.head_out = false;
            if failed {
                self.after_failure.insert(next.delivery_id);
            }
            self.schedule(next, now);
        }
    }

    /// Marks the chain of held delivery `id`, if it has one, to be looked at.
    pub(super) fn unsettle(&mut self, id: &DeliveryId) {
        if self.in_chain.is_empty() {
            return;
        }
        if let Some(key) = self.in_chain.get(id) {
            if let Some(chain) = self.chains.get_mut(key)
                && chain.head == *id
            {
                chain.head_out = false;
            }
            self.settle.push(key.clone());
        }
    }
}
