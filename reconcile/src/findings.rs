//! What the stages found, gathered while they read: counts per tenant,
//! explained differences, gaps (counted all, listed up to a bound) and the
//! repair candidates.

use std::collections::BTreeMap;

use crate::report::{Explained, Explanation, Funnel, Gap, GapClass, MAX_LISTED_GAPS, TenantFunnel};

/// A delivery a subscription called for that does not exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingDelivery {
    /// Its event.
    pub event_id: [u8; 16],
    /// The endpoint.
    pub endpoint_id: [u8; 16],
    /// The config version that called for it.
    pub config_version: i32,
}

/// A pending delivery nobody will send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overdue {
    /// The delivery.
    pub delivery_id: [u8; 16],
    /// Its endpoint.
    pub endpoint_id: [u8; 16],
    /// Its event, when it only exists as fan-out's plan (no row yet).
    pub planned_event: Option<[u8; 16]>,
}

/// Repair candidates kept at most per class; a larger backlog is repaired
/// by the next run.
pub const MAX_REPAIRS_PER_RUN: usize = 200_000;

/// Everything found so far.
#[derive(Debug, Default)]
pub struct Findings {
    /// Totals over every tenant.
    pub funnel: Funnel,
    /// Per tenant: funnel and gaps.
    pub tenants: BTreeMap<String, (Funnel, u64)>,
    explained: BTreeMap<(Explanation, Option<String>), u64>,
    /// Gaps by class.
    pub gap_counts: BTreeMap<GapClass, u64>,
    listed: BTreeMap<GapClass, Vec<Gap>>,
    /// Candidates for `--repair`.
    pub missing: Vec<MissingDelivery>,
    /// Candidates for `--repair`.
    pub overdue: Vec<Overdue>,
}

impl Findings {
    /// Adds to one tenant's funnel and to the totals.
    pub fn count(&mut self, tenant: &str, f: impl Fn(&mut Funnel)) {
        f(&mut self.funnel);
        match self.tenants.get_mut(tenant) {
            Some((funnel, _)) => f(funnel),
            None => {
                let mut funnel = Funnel::default();
                f(&mut funnel);
                self.tenants.insert(tenant.to_string(), (funnel, 0));
            }
        }
    }

    /// Counts `n` differences explained by `reason`.
    pub fn explain(&mut self, reason: Explanation, tenant: Option<&str>, n: u64) {
        if n > 0 {
            *self
                .explained
                .entry((reason, tenant.map(str::to_string)))
                .or_default() += n;
        }
    }

    /// Records a gap.
    pub fn gap(&mut self, gap: Gap) {
        *self.gap_counts.entry(gap.class).or_default() += 1;
        if let Some(t) = &gap.tenant {
            match self.tenants.get_mut(t) {
                Some((_, gaps)) => *gaps += 1,
                None => {
                    self.tenants.insert(t.clone(), (Funnel::default(), 1));
                }
            }
        }
        let list = self.listed.entry(gap.class).or_default();
        if list.len() < MAX_LISTED_GAPS {
            list.push(gap);
        }
    }

    /// Marks the listed gaps with these ids as repaired.
    pub fn mark_repaired(&mut self, class: GapClass, ids: &std::collections::HashSet<String>) {
        if let Some(list) = self.listed.get_mut(&class) {
            for g in list.iter_mut().filter(|g| ids.contains(&g.id)) {
                g.repaired = true;
            }
        }
    }

    /// The explained differences, ordered.
    pub fn explained(&self) -> Vec<Explained> {
        self.explained
            .iter()
            .map(|((reason, tenant), count)| Explained {
                reason: *reason,
                tenant: tenant.clone(),
                count: *count,
            })
            .collect()
    }

    /// The listed gaps (by class, then id; at most [`MAX_LISTED_GAPS`]) and
    /// how many were left out.
    pub fn gaps(&self) -> (Vec<Gap>, u64) {
        let mut all: Vec<Gap> = self.listed.values().flatten().cloned().collect();
        all.sort_by(|a, b| (a.class, &a.id).cmp(&(b.class, &b.id)));
        all.truncate(MAX_LISTED_GAPS);
        let total: u64 = self.gap_counts.values().sum();
        let not_listed = total - all.len() as u64;
        (all, not_listed)
    }

    /// The per-tenant funnels, by tenant id.
    pub fn tenant_funnels(&self) -> Vec<TenantFunnel> {
        self.tenants
            .iter()
            .map(|(tenant, (funnel, gaps))| TenantFunnel {
                tenant: tenant.clone(),
                funnel: funnel.clone(),
                gaps: *gaps,
            })
            .collect()
    }
}

/// A gap about one delivery (or event), with its ids in their API forms.
pub fn gap(class: GapClass, subject: &str, tenant: Option<&str>, detail: String) -> Gap {
    Gap {
        id: format!("{}:{subject}", class.as_str()),
        class,
        tenant: tenant.map(str::to_string),
        event_id: None,
        delivery_id: None,
        endpoint_id: None,
        detail,
        repaired: false,
    }
}
