//! One database read shared by every caller for an interval.
//!
//! `/readyz` answers without a token, so anyone who can reach the port can
//! call it as often as they like; `/metrics` answers without one on the
//! metrics listener, and scrapers may be many. Each keeps its last read
//! in a [`TtlCache`]: within `[api].metrics_cache` of a read, callers get
//! its result; after it, the first caller reads again while the others wait
//! for that one read (they hold the lock), so a flood costs one read per
//! interval, never one per request.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

/// A value read at most once per `max_age` (see the module docs).
#[derive(Debug)]
pub struct TtlCache<T> {
    last: Mutex<Option<(Instant, T)>>,
    reads: AtomicU64,
}

impl<T> Default for TtlCache<T> {
    fn default() -> Self {
        TtlCache {
            last: Mutex::new(None),
            reads: AtomicU64::new(0),
        }
    }
}

impl<T: Clone> TtlCache<T> {
    /// The value read less than `max_age` ago, or a fresh one from `read`.
    /// Failures are values too (`T` may be a `Result`): a database that is
    /// down is asked again only after `max_age`, like one that is up.
    pub async fn get<F, Fut>(&self, max_age: Duration, read: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        // A tokio lock, held across the read on purpose: callers arriving
        // during a read wait for it instead of starting their own.
        let mut last = self.last.lock().await;
        if let Some((at, value)) = last.as_ref()
            && at.elapsed() < max_age
        {
            return value.clone();
        }
        let value = read().await;
        self.reads.fetch_add(1, Ordering::Relaxed);
        *last = Some((Instant::now(), value.clone()));
        value
    }

    /// How many reads were made (for tests and debugging).
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn a_flood_reads_once_per_interval() {
        let cache = Arc::new(TtlCache::<u64>::default());
        let hour = Duration::from_secs(3600);
        let (release, gate) = tokio::sync::watch::channel(false);
        // The first read waits until every caller has arrived, so all of
        // them come while it runs: they must share it.
        let callers: Vec<_> = (0..50)
            .map(|_| {
                let (cache, mut gate) = (cache.clone(), gate.clone());
                tokio::spawn(async move {
                    cache
                        .get(hour, || async move {
                            let _ = gate.wait_for(|open| *open).await;
                            1
                        })
                        .await
                })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        for c in callers {
            assert_eq!(c.await.unwrap(), 1);
        }
        assert_eq!(cache.reads(), 1);
        // Within the interval: the value read; after it: a new read.
        assert_eq!(cache.get(hour, || async { 2 }).await, 1);
        assert_eq!(cache.reads(), 1);
        assert_eq!(cache.get(Duration::ZERO, || async { 3 }).await, 3);
        assert_eq!(cache.reads(), 2);
    }
}
