//! The object-store port: where cold history (Parquet parts and manifests)
//! lives once it leaves the hot tables.
//!
//! Two implementations live in `connectors` (a local directory, the embedded
//! default, and S3 through `aws-sdk-s3`); the archive is generic over this
//! trait. The contract, checked by the contract suite in `connectors`:
//!
//! - Keys are `/`-separated relative paths of printable ASCII
//!   ([`validate_key`]); the store maps them under its own root or prefix.
//! - [`ObjectStore::put`] is atomic: a reader sees the whole object or no
//!   object, never a prefix, and a second `put` of the same key replaces the
//!   first whole (this is what makes every archive step idempotent).
//! - A `put` returns only once the object is durable (fsynced, or acknowledged
//!   by S3 with a matching SHA-256 checksum).
//! - [`ObjectStore::get`] of a missing key is `Ok(None)`, not an error.
//! - [`ObjectStore::get_range`] returns the bytes of `start..end` (cut at
//!   the object's end, so a range past it is shorter or empty) without
//!   reading the rest: cold reads fetch a Parquet footer and a few pages,
//!   not whole parts. A missing key is `Ok(None)`.
//! - [`ObjectStore::list`] returns every object under a prefix, sorted by key,
//!   across as many pages as the backend needs.

use std::future::Future;

use bytes::Bytes;
use sha2::{Digest, Sha256};

/// One stored object, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The key, relative to the store's root.
    pub key: String,
    /// The size in bytes.
    pub size: u64,
}

/// What a successful [`ObjectStore::put`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutReceipt {
    /// The size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, lower-case hex.
    pub sha256: String,
}

/// An object-store failure.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    /// The key is not one this store accepts.
    #[error("invalid object key {key:?}: {reason}")]
    InvalidKey {
        /// The key as given.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The backend failed in a way a retry may fix (timeouts, 5xx, throttling).
    #[error("object store {op} of {key:?} failed (transient)")]
    Transient {
        /// The operation: put, get, list, delete.
        op: &'static str,
        /// The key or prefix.
        key: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The backend refused in a way a retry will not fix (credentials, no
    /// such bucket, permissions, a checksum the server rejected).
    #[error("object store {op} of {key:?} failed: {hint}")]
    Definite {
        /// The operation: put, get, list, delete.
        op: &'static str,
        /// The key or prefix.
        key: String,
        /// What the operator should check.
        hint: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl ObjectStoreError {
    /// A backend failure of `op` on `key`: definite when there is a `hint`
    /// for the operator, transient (a retry may help) when there is none.
    pub fn backend(
        op: &'static str,
        key: &str,
        hint: Option<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        let source = Box::new(source);
        match hint {
            Some(hint) => ObjectStoreError::Definite {
                op,
                key: key.to_owned(),
                hint,
                source,
            },
            None => ObjectStoreError::Transient {
                op,
                key: key.to_owned(),
                source,
            },
        }
    }

    /// Whether retrying the operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ObjectStoreError::Transient { .. })
    }
}

/// Where cold objects live. Cheap to clone; shared across tasks.
pub trait ObjectStore: Clone + Send + Sync + 'static {
    /// Stores `bytes` under `key`, atomically and durably, replacing any
    /// object already there.
    fn put(
        &self,
        key: &str,
        bytes: Bytes,
    ) -> impl Future<Output = Result<PutReceipt, ObjectStoreError>> + Send;

    /// The whole object, or `None` when there is none.
    fn get(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<Bytes>, ObjectStoreError>> + Send;

    /// The bytes of `range` of the object (cut at its end), or `None` when
    /// there is none; only those bytes are read.
    fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> impl Future<Output = Result<Option<Bytes>, ObjectStoreError>> + Send;

    /// Every object whose key starts with `prefix`, sorted by key.
    fn list(
        &self,
        prefix: &str,
    ) -> impl Future<Output = Result<Vec<ObjectInfo>, ObjectStoreError>> + Send;

    /// Removes the object; removing a missing object succeeds.
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), ObjectStoreError>> + Send;

    /// Where the objects are, for logs and reports (`file:///var/walhook`,
    /// `s3://bucket/prefix`). Never contains credentials.
    fn describe(&self) -> String;
}

/// Checks that `key` is a relative, `/`-separated path of printable ASCII
/// without empty, `.` or `..` segments, at most 1,024 bytes: safe as a file
/// path under a root and as an S3 key.
pub fn validate_key(key: &str) -> Result<(), ObjectStoreError> {
    let bad = |reason| {
        Err(ObjectStoreError::InvalidKey {
            key: key.chars().take(200).collect(),
            reason,
        })
    };
    if key.is_empty() {
        return bad("it is empty");
    }
    if key.len() > 1024 {
        return bad("it is longer than 1,024 bytes");
    }
    if !key.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b'\\') {
        return bad("only printable ASCII without spaces or backslashes is allowed");
    }
    if key
        .split('/')
        .any(|s| s.is_empty() || s == "." || s == "..")
    {
        return bad("a path segment is empty, '.' or '..'");
    }
    Ok(())
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_relative_printable_paths() {
        assert!(validate_key("table=attempts/date=2026-11-30/part-00000.parquet").is_ok());
        for bad in [
            "", "/abs", "a//b", "a/../b", "./a", "a b", "a\\b", "é", "a/",
        ] {
            assert!(validate_key(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_key(&"a".repeat(1025)).is_err());
    }

    #[test]
    fn sha256_is_lower_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
