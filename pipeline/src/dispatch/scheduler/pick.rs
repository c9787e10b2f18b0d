//! Picking the next job: endpoints with work wait in their tenant's ring,
//! tenants with work in a set ordered by attempts in flight per unit of
//! weight; the pick passes an endpoint's gates (in-flight cap, circuit,
//! rate) and takes new work before retries except for the retries' share.

use std::collections::HashMap;

use super::{Limits, MAX_WEIGHT, Place, Scheduler, Timer};
use crate::delivery::DeliveryJob;
use crate::dispatch::breaker::Circuit;
use crate::dispatch::bucket::TokenBucket;
use crate::dispatch::observe::Throttle;
use crate::ids::{EndpointId, TenantId};
use crate::time::Timestamp;

/// A tenant's place among tenants with work: attempts in flight per unit of
/// weight, scaled so that weights up to [`MAX_WEIGHT`] order exactly.
fn share_key(in_flight: u32, weight: u32) -> u64 {
    u64::from(in_flight) * u64::from(MAX_WEIGHT) * 1000 / u64::from(weight.max(1))
}

impl Scheduler {
    pub(super) fn enqueue(&mut self, job: DeliveryJob) {
        let endpoint = job.endpoint_id;
        let tenant = job.tenant_id.clone();
        let ep = self.endpoint_mut(endpoint, &tenant);
        if job.attempt_count == 0 {
            ep.fresh.push_back(job);
        } else {
            ep.retries.push_back(job);
        }
        self.activate(endpoint);
    }

    /// Puts an idle endpoint with work into its tenant's ring, and the
    /// tenant into the ring of tenants.
    pub(super) fn activate(&mut self, id: EndpointId) {
        let Some(ep) = self.endpoints.get_mut(&id) else {
            return;
        };
        if ep.place != Place::Idle || ep.queued() == 0 {
            return;
        }
        ep.place = Place::Ready;
        let tenant_id = ep.tenant.clone();
        self.tenants
            .entry(tenant_id.clone())
            .or_default()
            .ready
            .push_back(id);
        self.queue_tenant(&tenant_id);
    }

    /// Puts a tenant with ready endpoints, under its budget, into the set of
    /// tenants with work (or moves it to match its in-flight count).
    pub(super) fn queue_tenant(&mut self, id: &TenantId) {
        let budget = self
            .budgets
            .get(id)
            .copied()
            .unwrap_or(self.cfg.tenant_max_in_flight);
        let weight = self.weights.get(id).copied().unwrap_or(1);
        let Some(t) = self.tenants.get_mut(id) else {
            return;
        };
        let want = !t.ready.is_empty() && t.in_flight < budget;
        if !t.ready.is_empty() && t.in_flight >= budget {
            *self
                .throttles
                .entry((id.clone(), Throttle::TenantBudget))
                .or_default() += 1;
        }
        let share = share_key(t.in_flight, weight);
        match (t.queued_as, want) {
            (Some((n, _)), true) if n == share => {}
            (old, want) => {
                if let Some((n, seq)) = old {
                    self.ready_tenants.remove(&(n, seq, id.clone()));
                    t.queued_as = None;
                }
                if want {
                    self.seq += 1;
                    t.queued_as = Some((share, self.seq));
                    self.ready_tenants.insert((share, self.seq, id.clone()));
                }
            }
        }
    }

    /// Sets the tenants' weights (absent: 1) and their own in-flight
    /// budgets (absent: the configured one); tenants move to their new
    /// place among those with work.
    pub fn set_tenants(
        &mut self,
        weights: HashMap<TenantId, u32>,
        budgets: HashMap<TenantId, u32>,
    ) {
        self.weights = weights
            .into_iter()
            .filter(|(_, w)| *w != 1)
            .map(|(t, w)| (t, w.clamp(1, MAX_WEIGHT)))
            .collect();
        self.budgets = budgets.into_iter().map(|(t, b)| (t, b.max(1))).collect();
        let known: Vec<TenantId> = self.tenants.keys().cloned().collect();
        for t in known {
            self.queue_tenant(&t);
        }
    }

    /// The next job to start at `now`, or `None` when nothing may start.
    /// `limits` gives each endpoint's cap and rate.
    pub fn next_job(
        &mut self,
        now: Timestamp,
        limits: impl Fn(&EndpointId) -> Limits,
    ) -> Option<DeliveryJob> {
        self.settle_chains(now);
        if self.in_flight >= self.cfg.max_in_flight {
            return None;
        }
        // Tenants in order of attempts in flight; one that has nothing it
        // may start now leaves the set until something changes for it.
        let mut skipped: Vec<TenantId> = Vec::new();
        let mut found = None;
        while let Some((_, _, tenant_id)) = self.ready_tenants.first().cloned() {
            let t = self
                .tenants
                .get_mut(&tenant_id)
                .expect("queued tenants exist");
            let key = t.queued_as.take().expect("queued tenants have a key");
            self.ready_tenants
                .remove(&(key.0, key.1, tenant_id.clone()));
            if let Some(job) = self.pick_in_tenant(&tenant_id, now, &limits) {
                let tenant = self.tenants.get_mut(&tenant_id).expect("present");
                tenant.in_flight += 1;
                self.in_flight += 1;
                self.queue_tenant(&tenant_id);
                if !self.in_chain.is_empty()
                    && job.replay.is_none()
                    && let Some(chain) = self
                        .in_chain
                        .get(&job.delivery_id)
                        .and_then(|k| self.chains.get_mut(k))
                    && chain.head == job.delivery_id
                {
                    chain.head_out = true;
                }
                found = Some(job);
                break;
            }
            skipped.push(tenant_id);
        }
        // Tenants whose endpoints were all parked or capped: their endpoints
        // come back through `activate` (timers, finished attempts).
        for t in skipped {
            self.queue_tenant(&t);
        }
        found
    }

    fn pick_in_tenant(
        &mut self,
        tenant_id: &TenantId,
        now: Timestamp,
        limits: &impl Fn(&EndpointId) -> Limits,
    ) -> Option<DeliveryJob> {
        let mut endpoints_left = self.tenants.get(tenant_id)?.ready.len();
        while endpoints_left > 0 {
            endpoints_left -= 1;
            let id = self.tenants.get_mut(tenant_id)?.ready.pop_front()?;
            let lim = limits(&id);
            let retry_share = self.cfg.retry_share.max(1);
            let Some(ep) = self.endpoints.get_mut(&id) else {
                continue;
            };
            ep.place = Place::Idle;
            if ep.queued() == 0 {
                continue;
            }
            if ep.in_flight >= lim.max_in_flight.max(1) {
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::EndpointCap))
                    .or_default() += 1;
                continue;
            }
            if let Err(until) = ep.circuit.admits(now) {
                if let Some(until) = until {
                    ep.place = Place::Parked;
                    self.timer(until, Timer::Wake(id));
                }
                continue;
            }
            match (lim.rate_per_sec, &mut ep.bucket) {
                (None, bucket) => *bucket = None,
                (Some(rate), Some(b)) if b.rate() == rate => {}
                (Some(rate), bucket) => *bucket = Some(TokenBucket::new(rate, now)),
            }
            if let Some(bucket) = ep.bucket.as_mut()
                && let Err(at) = bucket.take(now)
            {
                ep.place = Place::Parked;
                self.timer(at, Timer::Wake(id));
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::RateLimit))
                    .or_default() += 1;
                continue;
            }
            ep.picks = ep.picks.wrapping_add(1);
            let retry_turn = ep.picks % retry_share == 0;
            let job = if (retry_turn && !ep.retries.is_empty()) || ep.fresh.is_empty() {
                ep.retries.pop_front()
            } else {
                ep.fresh.pop_front()
            }?;
            ep.in_flight += 1;
            ep.circuit.started();
            let capped = ep.in_flight >= lim.max_in_flight.max(1);
            let more = ep.queued() > 0
                && !capped
                && !matches!(ep.circuit, Circuit::HalfOpen { probing: true, .. });
            if capped && ep.queued() > 0 {
                // The rest wait for an attempt of this endpoint to finish.
                *self
                    .throttles
                    .entry((tenant_id.clone(), Throttle::EndpointCap))
                    .or_default() += 1;
            }
            if more {
                ep.place = Place::Ready;
                self.tenants.get_mut(tenant_id)?.ready.push_back(id);
            }
            return Some(job);
        }
        None
    }
}
