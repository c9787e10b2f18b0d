//! A store that counts what is read through it: requests and bytes, for
//! the API's metrics and for tests that hold cold reads to their budget
//! (wrapped around the real store, so what it counts is what the backend
//! served).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use walhook_pipeline::objstore::{ObjectInfo, ObjectStore, ObjectStoreError, PutReceipt};

/// The most keys a key log keeps (tests read a handful of objects).
const KEY_LOG_LIMIT: usize = 10_000;

/// Reads counted so far.
#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    bytes: AtomicU64,
    /// The keys read, when asked for ([`CountingStore::with_key_log`]).
    keys: Option<Mutex<Vec<String>>>,
}

/// Totals of a [`CountingStore`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadTotals {
    /// `get` and `get_range` calls.
    pub reads: u64,
    /// Bytes they returned.
    pub bytes: u64,
}

/// `S`, counting its reads. Clones share the counters.
#[derive(Debug, Clone)]
pub struct CountingStore<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: ObjectStore> CountingStore<S> {
    /// Counts the reads of `inner`.
    pub fn new(inner: S) -> Self {
        CountingStore {
            inner,
            counters: Arc::default(),
        }
    }

    /// Also keeps the keys read (at most 10,000), for tests.
    pub fn with_key_log(inner: S) -> Self {
        CountingStore {
            inner,
            counters: Arc::new(Counters {
                keys: Some(Mutex::new(Vec::new())),
                ..Counters::default()
            }),
        }
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Reads and bytes so far.
    pub fn totals(&self) -> ReadTotals {
        ReadTotals {
            reads: self.counters.reads.load(Ordering::Relaxed),
            bytes: self.counters.bytes.load(Ordering::Relaxed),
        }
    }

    /// The keys read since the last call (empty without a key log).
    pub fn take_keys(&self) -> Vec<String> {
        self.counters
            .keys
            .as_ref()
            .map(|k| std::mem::take(&mut *k.lock()))
            .unwrap_or_default()
    }

    fn count(&self, key: &str, got: &Option<Bytes>) {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        let n = got.as_ref().map_or(0, |b| b.len() as u64);
        self.counters.bytes.fetch_add(n, Ordering::Relaxed);
        if let Some(keys) = &self.counters.keys {
            let mut keys = keys.lock();
            if keys.len() < KEY_LOG_LIMIT {
                keys.push(key.to_owned());
            }
        }
    }
}

impl<S: ObjectStore> ObjectStore for CountingStore<S> {
    async fn put(&self, key: &str, bytes: Bytes) -> Result<PutReceipt, ObjectStoreError> {
        self.inner.put(key, bytes).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, ObjectStoreError> {
        let got = self.inner.get(key).await?;
        self.count(key, &got);
        Ok(got)
    }

    async fn get_range(
        &self,
        key: &str,
        range: Range<u64>,
    ) -> Result<Option<Bytes>, ObjectStoreError> {
        let got = self.inner.get_range(key, range).await?;
        self.count(key, &got);
        Ok(got)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectStoreError> {
        self.inner.list(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        self.inner.delete(key).await
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}
