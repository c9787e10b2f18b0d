//! What cold reads keep between requests: parsed manifests and Parquet
//! footers (with their page indexes), within a memory bound.
//!
//! Both never change once written: a manifest's key is its generation's,
//! and a footer is kept by its part's key and SHA-256 (compaction
//! replaces a part under its key, with other bytes), so an entry is
//! never stale; it only costs memory. The cache holds at most
//! [`MetaCache::capacity`] bytes (each entry weighed by its estimated size
//! in memory) and drops the least recently used entries past it, so a
//! caller walking the whole archive cannot grow the process: it only
//! evicts what others used less recently. An entry larger than the whole
//! bound is used once and not kept.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use parquet::arrow::arrow_reader::ArrowReaderMetadata;

use crate::manifest::Manifest;

/// The default bound of the cache: 64 MiB, room for the manifests of
/// years of days and the footers of a few thousand parts.
pub const DEFAULT_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// One cached value.
#[derive(Clone)]
pub(crate) enum Meta {
    /// A parsed manifest.
    Manifest(Arc<Manifest>),
    /// A Parquet footer with its page index.
    Footer(ArrowReaderMetadata),
}

struct Entry {
    value: Meta,
    weight: usize,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    /// Keys by the tick of their last use: the first is the least recent.
    order: BTreeMap<u64, String>,
    bytes: usize,
    tick: u64,
}

/// A bounded least-recently-used cache of manifests and footers, by key.
pub(crate) struct MetaCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

impl MetaCache {
    /// An empty cache of at most `capacity` bytes.
    pub(crate) fn new(capacity: usize) -> Self {
        MetaCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// The bound, in bytes.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries and their total weight.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.entries.len(), inner.bytes)
    }

    /// The value under `key`, now the most recently used.
    pub(crate) fn get(&self, key: &str) -> Option<Meta> {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let entry = inner.entries.get_mut(key)?;
        let old = std::mem::replace(&mut entry.tick, tick);
        let value = entry.value.clone();
        inner.order.remove(&old);
        inner.order.insert(tick, key.to_owned());
        Some(value)
    }

    /// Keeps `value` under `key`, weighing `weight` bytes, and drops the
    /// least recently used entries beyond the bound.
    pub(crate) fn insert(&self, key: &str, value: Meta, weight: usize) {
        if weight > self.capacity {
            return;
        }
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        if let Some(old) = inner.entries.insert(
            key.to_owned(),
            Entry {
                value,
                weight,
                tick,
            },
        ) {
            inner.order.remove(&old.tick);
            inner.bytes -= old.weight;
        }
        inner.order.insert(tick, key.to_owned());
        inner.bytes += weight;
        while inner.bytes > self.capacity {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some(e) = inner.entries.remove(&oldest) {
                inner.bytes -= e.weight;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;

    fn manifest() -> Meta {
        Meta::Manifest(Arc::new(Manifest::new(Table::Events, "2026-01-01", 0, 16)))
    }

    #[test]
    fn the_least_recently_used_entries_leave_past_the_bound() {
        let cache = MetaCache::new(100);
        for k in ["a", "b", "c"] {
            cache.insert(k, manifest(), 30);
        }
        assert_eq!(cache.usage(), (3, 90));
        // "a" is used, so "b" is now the least recent and leaves first.
        assert!(cache.get("a").is_some());
        cache.insert("d", manifest(), 30);
        assert_eq!(cache.usage(), (3, 90));
        assert!(cache.get("b").is_none());
        assert!(cache.get("a").is_some() && cache.get("c").is_some());
        // Replacing an entry does not count it twice.
        cache.insert("a", manifest(), 40);
        assert_eq!(cache.usage(), (3, 100));
        // An entry larger than the bound is not kept.
        cache.insert("huge", manifest(), 101);
        assert!(cache.get("huge").is_none());
        assert!(cache.usage().1 <= cache.capacity());
        for i in 0..1000 {
            cache.insert(&format!("k{i}"), manifest(), 7 + i % 13);
            assert!(cache.usage().1 <= 100);
        }
    }
}
