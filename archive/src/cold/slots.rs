//! A cap on each tenant's archive reads at once: one tenant asking for
//! its whole archive many times over takes at most `limit` reads' worth of
//! the store, the CPU that decodes Parquet and the API's connections, and
//! the others keep theirs. A read past the cap is refused at once
//! ([`ArchiveError::TenantReadsBusy`], a 429 in the API), never queued.
//!
//! The table holds only tenants with a read in progress, so it is bounded
//! by the reads in progress, whoever sends them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use walhook_pipeline::ids::TenantId;

use crate::ArchiveError;

/// The default number of archive reads one tenant may have at once.
pub const DEFAULT_READS_PER_TENANT: usize = 4;

/// The archive reads in progress, per tenant.
#[derive(Debug)]
pub(crate) struct TenantSlots {
    limit: usize,
    held: Mutex<HashMap<TenantId, usize>>,
    refused: AtomicU64,
}

/// One read in progress; dropping it frees the slot. It owns its share
/// of the table, so a read handed to another task keeps its slot.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<TenantSlots>,
    tenant: TenantId,
}

impl TenantSlots {
    /// At most `limit` reads per tenant (at least 1).
    pub(crate) fn new(limit: usize) -> Self {
        TenantSlots {
            limit: limit.max(1),
            held: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        }
    }

    /// A slot for `tenant`, or the refusal when it holds them all.
    pub(crate) fn take(self: &Arc<Self>, tenant: &TenantId) -> Result<Slot, ArchiveError> {
        let mut held = self.held.lock();
        let n = held.entry(tenant.clone()).or_insert(0);
        if *n >= self.limit {
            let current = *n;
            drop(held);
            self.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(tenant = %tenant, limit = self.limit, "archive read refused: the tenant's reads at once are at the cap");
            return Err(ArchiveError::TenantReadsBusy {
                tenant: tenant.to_string(),
                limit: self.limit,
                current,
            });
        }
        *n += 1;
        Ok(Slot {
            slots: self.clone(),
            tenant: tenant.clone(),
        })
    }

    /// Reads refused so far.
    pub(crate) fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Tenants with a read in progress.
    #[cfg(test)]
    pub(crate) fn tenants(&self) -> usize {
        self.held.lock().len()
    }
}

impl Slot {
    /// The tenant it counts for.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock();
        if let Some(n) = held.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_cap_is_refused_and_others_are_not() {
        let slots = Arc::new(TenantSlots::new(2));
        let a = TenantId::new("a").unwrap();
        let b = TenantId::new("b").unwrap();
        let one = slots.take(&a).unwrap();
        let _two = slots.take(&a).unwrap();
        let refused = slots.take(&a).unwrap_err();
        assert!(matches!(
            refused,
            ArchiveError::TenantReadsBusy {
                limit: 2,
                current: 2,
                ..
            }
        ));
        assert_eq!(slots.refused(), 1);
        let _other = slots.take(&b).unwrap();
        drop(one);
        let _three = slots.take(&a).unwrap();
        drop(_three);
        drop(_two);
        drop(_other);
        assert_eq!(slots.tenants(), 0, "idle tenants leave the table");
    }
}
