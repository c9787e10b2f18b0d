//! The shared, refreshed endpoint directory, and how fresh it is.
//!
//! ```text
//!  fan-out: polled events at T ──fresh_since(T)──▶ wait until a check that began after T succeeded
//!                                    │ (asks for one at once)
//!  refresher: tick / request ──▶ read the config epoch ──moved──▶ reload (at most one per min_reload_gap)
//!                                    └──▶ fresh = the instant the check began
//! ```
//!
//! Freshness is causal, not a clock comparison: an event reached fan-out
//! after its commit, and an endpoint change the API answered was committed
//! before the answer. A check that *began* after fan-out polled an event
//! therefore sees every endpoint change committed before that event's
//! commit, whichever servers' clocks are involved. One check serves every
//! fan-out partition waiting for it, so the cost is one small query per
//! round of batches, not one per event.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::{Directory, EndpointSource};
use crate::ids::EndpointId;
use crate::store::StoreError;

/// How the directory is kept current.
#[derive(Debug, Clone)]
pub struct RefreshSettings {
    /// How often the epoch is read when nobody asks (a change is seen by
    /// dispatch within this).
    pub interval: Duration,
    /// The shortest time between two reloads: a flood of endpoint changes
    /// costs at most one reload per gap.
    pub min_reload_gap: Duration,
}

impl Default for RefreshSettings {
    fn default() -> Self {
        RefreshSettings {
            interval: Duration::from_millis(200),
            min_reload_gap: Duration::from_millis(100),
        }
    }
}

/// The shared, refreshed directory.
#[derive(Debug)]
pub struct SubscriptionCache {
    current: RwLock<Arc<Directory>>,
    /// When the newest successful check began: the snapshot holds every
    /// change committed before then.
    fresh: watch::Sender<Option<Instant>>,
    /// A fan-out partition waits for a check.
    wanted: Notify,
}

impl Default for SubscriptionCache {
    fn default() -> Self {
        SubscriptionCache {
            current: RwLock::default(),
            fresh: watch::Sender::new(None),
            wanted: Notify::new(),
        }
    }
}

impl SubscriptionCache {
    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Directory> {
        self.current.read().clone()
    }

    /// Replaces the snapshot (tests, and the loader): it counts as fresh
    /// as of now.
    pub fn replace(&self, dir: Directory) {
        self.install(dir, Instant::now());
    }

    fn install(&self, dir: Directory, checked_at: Instant) {
        *self.current.write() = Arc::new(dir);
        self.mark_fresh(checked_at);
    }

    fn mark_fresh(&self, checked_at: Instant) {
        self.fresh.send_if_modified(|f| {
            if f.is_none_or(|t| t < checked_at) {
                *f = Some(checked_at);
                true
            } else {
                false
            }
        });
    }

    /// Loads once (at start-up, so that fan-out never runs on an empty
    /// directory by mistake), recording quarantine changes.
    pub async fn load<S: EndpointSource>(&self, source: &S) -> Result<(), StoreError> {
        self.load_checked(source, Instant::now()).await
    }

    async fn load_checked<S: EndpointSource>(
        &self,
        source: &S,
        checked_at: Instant,
    ) -> Result<(), StoreError> {
        let epoch = source.config_epoch().await?;
        let loaded = source.load_endpoints().await?;
        let dir = Directory::loaded(epoch, loaded);
        tracing::debug!(
            epoch,
            endpoints = dir.len(),
            "loaded the endpoint directory"
        );
        let before = self.snapshot();
        let was: HashSet<EndpointId> = before.quarantined().map(|e| e.id).collect();
        let now: Vec<Arc<super::EndpointConfig>> = dir.quarantined().cloned().collect();
        let first = self.fresh.borrow().is_none();
        let changed = now.len() != was.len() || now.iter().any(|e| !was.contains(&e.id));
        if first || changed {
            for e in now.iter().filter(|e| !was.contains(&e.id)) {
                tracing::error!(endpoint_id = %e.id, tenant_id = %e.tenant_id,
                    reason = e.quarantine.as_deref().unwrap_or(""),
                    "endpoint quarantined: it cannot be loaded; its deliveries wait, other endpoints are not affected");
            }
            for id in was.iter().filter(|id| !now.iter().any(|e| e.id == **id)) {
                tracing::info!(endpoint_id = %id, "endpoint loads again; quarantine lifted");
            }
            // Recorded before the new snapshot is used: if this fails, the
            // next load finds the same change and records it then.
            source.quarantine_sync(&now).await?;
        }
        self.install(dir, checked_at);
        Ok(())
    }

    /// Waits until the snapshot holds every change committed before `at`
    /// (asking the refresher for a check at once); `false` if `shutdown`
    /// came first.
    pub async fn fresh_since(&self, at: Instant, shutdown: &CancellationToken) -> bool {
        let mut rx = self.fresh.subscribe();
        let mut warned = false;
        loop {
            if rx.borrow_and_update().is_some_and(|t| t >= at) {
                return true;
            }
            self.wanted.notify_one();
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                changed = rx.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(10)), if !warned => {
                    warned = true;
                    tracing::warn!("fan-out has waited 10 s for the endpoint directory to be read; is the platform database reachable?");
                }
            }
        }
    }

    /// Checks the epoch every `settings.interval`, and at once when fan-out
    /// asks, reloading when it moved, until `shutdown`. Errors are logged
    /// and retried with a backoff; the snapshot in use stays meanwhile.
    pub async fn refresh<S: EndpointSource>(
        &self,
        source: S,
        settings: RefreshSettings,
        shutdown: CancellationToken,
    ) {
        let mut last_reload: Option<Instant> = None;
        let mut backoff = Duration::from_millis(100);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(settings.interval) => {}
                _ = self.wanted.notified() => {}
            }
            if crate::failpoint::hit("directory.refresh") {
                return;
            }
            let checked_at = Instant::now();
            let result = match source.config_epoch().await {
                Ok(epoch) if epoch == self.snapshot().epoch => {
                    self.mark_fresh(checked_at);
                    Ok(())
                }
                Ok(_) => {
                    // Debounced: a reload too soon after the last waits for
                    // the gap; the check then still began after `checked_at`.
                    if let Some(gap) = last_reload
                        .map(|t| settings.min_reload_gap.saturating_sub(t.elapsed()))
                        .filter(|g| !g.is_zero())
                    {
                        tokio::time::sleep(gap).await;
                    }
                    last_reload = Some(Instant::now());
                    self.load_checked(&source, checked_at).await
                }
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) => {
                    tracing::warn!(error = %e.chain(), retry_in = ?backoff, "could not refresh the endpoint directory; keeping the previous one");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    // A waiting fan-out asks again; keep its request.
                    self.wanted.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    use super::super::{EndpointConfig, Loaded};
    use super::*;

    #[derive(Default)]
    struct Counting {
        epoch: AtomicI64,
        epoch_reads: AtomicUsize,
        loads: AtomicUsize,
    }

    impl EndpointSource for Arc<Counting> {
        async fn config_epoch(&self) -> Result<i64, StoreError> {
            self.epoch_reads.fetch_add(1, Ordering::SeqCst);
            Ok(self.epoch.load(Ordering::SeqCst))
        }
        async fn load_endpoints(&self) -> Result<Loaded, StoreError> {
            self.loads.fetch_add(1, Ordering::SeqCst);
            Ok(Loaded::default())
        }
        async fn quarantine_sync(&self, _now: &[Arc<EndpointConfig>]) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn waiting_for_freshness_asks_for_a_check_at_once() {
        let source = Arc::new(Counting::default());
        let cache = Arc::new(SubscriptionCache::default());
        cache.load(&source).await.unwrap();
        let stop = CancellationToken::new();
        let settings = RefreshSettings {
            interval: Duration::from_secs(3600),
            min_reload_gap: Duration::from_millis(1),
        };
        let refresher = tokio::spawn({
            let (cache, source, stop) = (cache.clone(), source.clone(), stop.clone());
            async move { cache.refresh(source, settings, stop).await }
        });
        // The hour-long interval never fires: only the request can.
        let polled = Instant::now();
        let waited = tokio::time::timeout(Duration::from_secs(5), cache.fresh_since(polled, &stop))
            .await
            .expect("a check was not made on request");
        assert!(waited);
        assert!(source.epoch_reads.load(Ordering::SeqCst) >= 2);

        // A change is loaded before the wait ends.
        source.epoch.store(7, Ordering::SeqCst);
        let polled = Instant::now();
        assert!(cache.fresh_since(polled, &stop).await);
        assert_eq!(cache.snapshot().epoch, 7);
        assert_eq!(source.loads.load(Ordering::SeqCst), 2);
        stop.cancel();
        refresher.await.unwrap();
        assert!(!cache.fresh_since(Instant::now(), &stop).await);
    }
}
