//! Attempt limits: console sign-ins and failed authentications, counted
//! per client address and per credential, so that neither guessing from
//! one address nor hammering one credential from many goes on for long.
//!
//! ```text
//!  sign-in ──▶ take(address, credential) ──ok──▶ check the key ──▶ session
//!                      └─ out ─▶ 429 page, Retry-After
//!  API call ─▶ check(address, credential) ─ok─▶ check the token ──fail──▶ record(address, credential), 401
//!                      └─ out ─▶ 429 problem, Retry-After (the token is not even looked at)
//! ```
//!
//! Each limit is a token bucket: `per_minute` attempts at once, refilled at
//! `per_minute` a minute. An outsider can send from many addresses and
//! with many made-up credentials, so each table holds at most
//! [`MAX_TRACKED`] entries: a bucket that has filled up again says nothing
//! and is dropped when the table is full (at most once a second, so a
//! flood does not scan the table per request); keys that still find no
//! room share one overflow bucket, which limits them together instead of
//! forgetting anyone already limited. Memory is therefore fixed: about
//! 100 bytes per entry, under 2 MB per table.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use crate::client::ClientKey;

/// Entries a table keeps at most (addresses, or credentials).
pub const MAX_TRACKED: usize = 16_384;

/// The shortest time between two sweeps of a full table.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// A credential as the limits know it: the first half of its SHA-256, never
/// the text.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub struct CredentialKey([u8; 16]);

impl CredentialKey {
    /// The key of a presented token, API key or password.
    pub fn of(credential: &str) -> CredentialKey {
        let digest = Sha256::digest(credential.as_bytes());
        let mut key = [0u8; 16];
        key.copy_from_slice(&digest[..16]);
        CredentialKey(key)
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: capacity,
            at: now,
        }
    }

    /// Tokens at `now` (the bucket refilled since it was last touched).
    fn level(&self, rate: f64, capacity: f64, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + elapsed * rate).min(capacity)
    }

    /// How long until one token, or `None` when there is one now.
    fn wait(&self, rate: f64, capacity: f64, now: Instant) -> Option<Duration> {
        let level = self.level(rate, capacity, now);
        (level < 1.0).then(|| Duration::from_secs_f64((1.0 - level) / rate))
    }

    fn take(&mut self, rate: f64, capacity: f64, now: Instant) {
        self.tokens = (self.level(rate, capacity, now) - 1.0).max(0.0);
        self.at = now;
    }
}

/// Token buckets by key, at most [`MAX_TRACKED`] of them (see the module
/// docs).
#[derive(Debug)]
pub struct RateTable<K> {
    capacity: f64,
    /// Tokens per second.
    rate: f64,
    max_entries: usize,
    inner: Mutex<Table<K>>,
}

#[derive(Debug)]
struct Table<K> {
    buckets: HashMap<K, Bucket>,
    overflow: Option<Bucket>,
    swept: Option<Instant>,
}

impl<K: Hash + Eq + Copy> RateTable<K> {
    /// `per_minute` attempts at once, refilled at `per_minute` a minute,
    /// for at most `max_entries` keys.
    pub fn new(per_minute: u32, max_entries: usize) -> Self {
        let capacity = f64::from(per_minute.max(1));
        RateTable {
            capacity,
            rate: capacity / 60.0,
            max_entries,
            inner: Mutex::new(Table {
                buckets: HashMap::new(),
                overflow: None,
                swept: None,
            }),
        }
    }

    /// `per_minute` attempts a minute with bursts of at most `burst`, for
    /// at most `max_entries` keys.
    pub fn with_burst(per_minute: u32, burst: u32, max_entries: usize) -> Self {
        let mut table = Self::new(per_minute, max_entries);
        table.capacity = f64::from(burst.max(1));
        table
    }

    /// How long `key` must wait for an attempt, or `None` when it may try
    /// now; counts nothing.
    pub fn wait(&self, key: K, now: Instant) -> Option<Duration> {
        let t = self.inner.lock();
        let bucket = match t.buckets.get(&key) {
            Some(b) => Some(b),
            None if t.buckets.len() >= self.max_entries => t.overflow.as_ref(),
            None => None,
        };
        bucket.and_then(|b| b.wait(self.rate, self.capacity, now))
    }

    /// Counts an attempt by `key` (once its bucket is empty, it stays so
    /// until it refills).
    pub fn take(&self, key: K, now: Instant) {
        let mut t = self.inner.lock();
        let (rate, capacity) = (self.rate, self.capacity);
        self.bucket(&mut t, key, now).take(rate, capacity, now);
    }

    /// Counts an attempt by `key` and answers how many attempts its bucket
    /// holds below full after it: read as a queue that drains at the
    /// table's rate, the attempts ahead of the next one (at most the
    /// capacity).
    pub fn take_and_count(&self, key: K, now: Instant) -> f64 {
        let mut t = self.inner.lock();
        let (rate, capacity) = (self.rate, self.capacity);
        let bucket = self.bucket(&mut t, key, now);
        bucket.take(rate, capacity, now);
        capacity - bucket.tokens
    }

    /// Tokens refilled per second.
    pub fn per_second(&self) -> f64 {
        self.rate
    }

    /// Keys tracked now (the overflow bucket aside).
    pub fn len(&self) -> usize {
        self.inner.lock().buckets.len()
    }

    /// Whether no key is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bucket<'t>(&self, t: &'t mut Table<K>, key: K, now: Instant) -> &'t mut Bucket {
        if !t.buckets.contains_key(&key) && t.buckets.len() >= self.max_entries {
            self.sweep(t, now);
        }
        if t.buckets.contains_key(&key) || t.buckets.len() < self.max_entries {
            return t
                .buckets
                .entry(key)
                .or_insert_with(|| Bucket::full(self.capacity, now));
        }
        t.overflow
            .get_or_insert_with(|| Bucket::full(self.capacity, now))
    }

    /// Drops the buckets that filled up again, at most once a second.
    fn sweep(&self, t: &mut Table<K>, now: Instant) {
        if t.swept
            .is_some_and(|at| now.saturating_duration_since(at) < SWEEP_EVERY)
        {
            return;
        }
        t.swept = Some(now);
        let (rate, capacity) = (self.rate, self.capacity);
        t.buckets
            .retain(|_, b| b.level(rate, capacity, now) < capacity);
    }
}

/// Which of the two limits refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedBy {
    /// Too many attempts from this client address.
    Client,
    /// Too many attempts with this credential.
    Credential,
}

/// An attempt refused: by which limit, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refused {
    /// The limit that refused.
    pub by: RefusedBy,
    /// How long until an attempt is allowed.
    pub retry_after: Duration,
}

impl Refused {
    /// Whole seconds for `Retry-After`, at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }

    /// Who ran out, in words.
    pub fn whom(&self) -> &'static str {
        match self.by {
            RefusedBy::Client => "from this client address",
            RefusedBy::Credential => "with this credential",
        }
    }
}

/// Attempts per client address and per credential.
#[derive(Debug)]
pub struct Attempts {
    per_minute: u32,
    by_client: RateTable<ClientKey>,
    by_credential: RateTable<CredentialKey>,
}

impl Attempts {
    /// `per_minute` attempts per address and per credential.
    pub fn new(per_minute: u32) -> Self {
        Attempts {
            per_minute,
            by_client: RateTable::new(per_minute, MAX_TRACKED),
            by_credential: RateTable::new(per_minute, MAX_TRACKED),
        }
    }

    /// The limit per minute.
    pub fn per_minute(&self) -> u32 {
        self.per_minute
    }

    /// Whether an attempt is allowed now; counts nothing. A request without
    /// a known address (an in-process call) is limited by credential only.
    pub fn check(
        &self,
        client: Option<ClientKey>,
        credential: CredentialKey,
        now: Instant,
    ) -> Result<(), Refused> {
        if let Some(wait) = client.and_then(|c| self.by_client.wait(c, now)) {
            return Err(Refused {
                by: RefusedBy::Client,
                retry_after: wait,
            });
        }
        match self.by_credential.wait(credential, now) {
            Some(wait) => Err(Refused {
                by: RefusedBy::Credential,
                retry_after: wait,
            }),
            None => Ok(()),
        }
    }

    /// Counts an attempt (a failure, or any sign-in).
    pub fn record(&self, client: Option<ClientKey>, credential: CredentialKey, now: Instant) {
        if let Some(c) = client {
            self.by_client.take(c, now);
        }
        self.by_credential.take(credential, now);
    }

    /// [`Attempts::check`], then [`Attempts::record`] when allowed.
    pub fn take(
        &self,
        client: Option<ClientKey>,
        credential: CredentialKey,
        now: Instant,
    ) -> Result<(), Refused> {
        self.check(client, credential, now)?;
        self.record(client, credential, now);
        Ok(())
    }

    /// Entries tracked: (addresses, credentials).
    pub fn tracked(&self) -> (usize, usize) {
        (self.by_client.len(), self.by_credential.len())
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn addr(n: u32) -> ClientKey {
        ClientKey::V4(Ipv4Addr::from(n))
    }

    #[test]
    fn a_bucket_allows_its_burst_then_one_per_refill() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let limits = Attempts::new(6); // one every 10 s
        let cred = CredentialKey::of("whk_x");
        for _ in 0..6 {
            limits.take(Some(addr(1)), cred, at(0)).unwrap();
        }
        let refused = limits.take(Some(addr(1)), cred, at(0)).unwrap_err();
        assert_eq!(refused.by, RefusedBy::Client);
        assert_eq!(refused.retry_after_secs(), 10);
        // Another address with the same credential: the credential is out.
        let refused = limits.take(Some(addr(2)), cred, at(0)).unwrap_err();
        assert_eq!(refused.by, RefusedBy::Credential);
        // Another credential from another address: allowed.
        limits
            .take(Some(addr(2)), CredentialKey::of("whk_y"), at(0))
            .unwrap();
        // After 4 s, still 6 s to wait; after 10 s, one more.
        let refused = limits.take(Some(addr(1)), cred, at(4_000)).unwrap_err();
        assert_eq!(refused.retry_after_secs(), 6);
        limits.take(Some(addr(1)), cred, at(10_000)).unwrap();
        assert!(limits.take(Some(addr(1)), cred, at(10_100)).is_err());
    }

    #[test]
    fn check_counts_nothing_and_record_counts_failures() {
        let now = Instant::now();
        let limits = Attempts::new(2);
        let cred = CredentialKey::of("wrong");
        for _ in 0..10 {
            limits.check(Some(addr(1)), cred, now).unwrap();
        }
        limits.record(Some(addr(1)), cred, now);
        limits.record(Some(addr(1)), cred, now);
        assert!(limits.check(Some(addr(1)), cred, now).is_err());
        // In-process calls have no address: the credential still counts.
        assert!(limits.check(None, cred, now).is_err());
        limits
            .check(None, CredentialKey::of("another"), now)
            .unwrap();
    }

    #[test]
    fn the_tables_stay_bounded_and_refilled_entries_go() {
        let t0 = Instant::now();
        let table = RateTable::new(2, 100);
        // A flood from 10,000 addresses: at most 100 entries; the rest
        // share the overflow bucket, which runs out like any other.
        for n in 0..10_000 {
            table.take(addr(n), t0);
        }
        assert_eq!(table.len(), 100);
        assert!(table.wait(addr(50), t0).is_none(), "one token left");
        assert!(table.wait(addr(5_000), t0).is_some(), "the overflow is out");
        // A minute later every bucket has refilled: a new key sweeps them.
        let later = t0 + Duration::from_secs(61);
        table.take(addr(20_000), later);
        assert_eq!(table.len(), 1);
        assert!(table.wait(addr(20_001), later).is_none());
    }

    #[test]
    fn credentials_are_kept_as_digests() {
        let key = CredentialKey::of("whk_secret");
        assert_eq!(key, CredentialKey::of("whk_secret"));
        assert_ne!(key, CredentialKey::of("whk_secreT"));
        assert!(!format!("{key:?}").contains("secret"));
    }

    #[test]
    fn refusals_counted_as_a_queue_drain_at_the_rate_and_a_burst_is_capped() {
        let t0 = Instant::now();
        // 60 a minute: one a second, bursts of 6.
        let queue = RateTable::with_burst(60, 6, 4);
        assert_eq!(queue.per_second(), 1.0);
        let ahead: Vec<f64> = (0..8).map(|_| queue.take_and_count(1u8, t0)).collect();
        assert_eq!(ahead, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 6.0, 6.0]);
        // Three seconds later three have had their turn.
        let later = t0 + Duration::from_secs(3);
        assert_eq!(queue.take_and_count(1u8, later), 4.0);
        // Another key queues on its own.
        assert_eq!(queue.take_and_count(2u8, later), 1.0);
    }
}
