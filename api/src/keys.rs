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
