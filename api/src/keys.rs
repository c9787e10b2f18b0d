//! Which API keys could exist, known without a query per request.
//!
//! Every request with an unknown `whk_` key would otherwise cost a database
//! lookup: a flood of made-up keys would then reach Postgres as fast as it
//! arrives. A key's first characters (its shown prefix, 8 random characters
//! after `whk_`) are kept for every live key; a key whose prefix is not
//! among them is refused without a query. The set is read again on a miss,
//! at most once a second, so a key issued by another API process works
//! within a second, and a flood of random keys costs one read a second.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use walhook_sql::{Platform, StoreError};

/// The shortest time between two reads of the prefixes.
const REREAD: Duration = Duration::from_secs(1);

/// The shown prefixes of live keys.
#[derive(Debug, Default)]
pub struct KnownPrefixes {
    set: parking_lot::RwLock<HashSet<String>>,
    /// When the set was last read; held while a read runs, so callers that
    /// miss together share one read.
    last_read: tokio::sync::Mutex<Option<Instant>>,
    reads: AtomicU64,
}

impl KnownPrefixes {
    /// Adds the prefix of a key this process just issued (usable at once).
    pub fn add(&self, prefix: &str) {
        self.set.write().insert(prefix.to_owned());
    }

    /// Whether a live key may have `prefix` (false: it certainly does not).
    pub async fn may_exist(&self, platform: &Platform, prefix: &str) -> Result<bool, StoreError> {
        if self.set.read().contains(prefix) {
            return Ok(true);
        }
        let mut last = self.last_read.lock().await;
        if last.is_none_or(|t| t.elapsed() >= REREAD) {
            let live = platform.live_key_prefixes().await?;
            self.reads.fetch_add(1, Ordering::Relaxed);
            *self.set.write() = live.into_iter().collect();
            *last = Some(Instant::now());
        }
        Ok(self.set.read().contains(prefix))
    }

    /// How many times the prefixes were read (tests).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// How long a key found live is believed without asking the database
/// again. A key revoked, or a tenant disabled, through this process is
/// forgotten at once; through another API process it stops working
/// within this time.
pub const VERIFIED_FOR: Duration = Duration::from_secs(2);

/// Keys remembered at most; past that the memory starts over.
const MAX_VERIFIED: usize = 4096;

/// Live keys found recently, by their SHA-256: a tenant's requests cost
/// one key lookup per [`VERIFIED_FOR`], not one each (a burst of requests
/// refused at the tenant's limits then costs the database nothing).
#[derive(Debug, Default)]
pub struct VerifiedKeys {
    keys: parking_lot::Mutex<std::collections::HashMap<[u8; 32], Verified>>,
}

#[derive(Debug, Clone)]
struct Verified {
    at: Instant,
    tenant: walhook_pipeline::ids::TenantId,
    key_id: uuid::Uuid,
}

impl VerifiedKeys {
    /// The tenant and key id of `hash`, when found live within
    /// [`VERIFIED_FOR`].
    pub fn get(&self, hash: &[u8; 32]) -> Option<(walhook_pipeline::ids::TenantId, uuid::Uuid)> {
        let keys = self.keys.lock();
        keys.get(hash)
            .filter(|v| v.at.elapsed() < VERIFIED_FOR)
            .map(|v| (v.tenant.clone(), v.key_id))
    }

    /// Remembers `hash` as live now.
    pub fn put(&self, hash: [u8; 32], tenant: walhook_pipeline::ids::TenantId, key_id: uuid::Uuid) {
        let mut keys = self.keys.lock();
        if keys.len() >= MAX_VERIFIED {
            keys.retain(|_, v| v.at.elapsed() < VERIFIED_FOR);
            if keys.len() >= MAX_VERIFIED {
                keys.clear();
            }
        }
        keys.insert(
            hash,
            Verified {
                at: Instant::now(),
                tenant,
                key_id,
            },
        );
    }

    /// Forgets every key (one was revoked, or a tenant changed).
    pub fn forget_all(&self) {
        self.keys.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verified_key_is_believed_until_forgotten() {
        let keys = VerifiedKeys::default();
        let acme = walhook_pipeline::ids::TenantId::new("acme").unwrap();
        let id = uuid::Uuid::from_u128(7);
        assert!(keys.get(&[1; 32]).is_none());
        keys.put([1; 32], acme.clone(), id);
        assert_eq!(keys.get(&[1; 32]), Some((acme, id)));
        assert!(keys.get(&[2; 32]).is_none());
        keys.forget_all();
        assert!(keys.get(&[1; 32]).is_none());
    }
}
