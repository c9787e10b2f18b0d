//! The object stores that cold history is written to: implementations of
//! the [`ObjectStore`] port of `walhook-pipeline`.
//!
//! ```text
//!                       ┌──────────────► LocalDirStore ──► <root>/<key>   (fsync + rename)
//!  archive ──► AnyStore ┤
//!                       └──────────────► S3Store ───────► s3://<bucket>/<prefix>/<key>
//!                                                        (PutObject or multipart, SHA-256 checked)
//! ```
//!
//! - [`local`]: a directory on local disk, the embedded default. Atomic by
//!   writing a temporary file and renaming it over the key; durable by
//!   fsyncing the file and its directory.
//! - [`s3`]: S3 or any S3-compatible server through `aws-sdk-s3`, with a
//!   SHA-256 checksum on every upload so the server refuses bytes that
//!   changed on the way, and errors split into transient and definite in one
//!   place.
//! - [`AnyStore`]: either of the two, chosen at run time from configuration,
//!   so the archive stays generic over one type.
//!
//! Both pass the same contract suite (`archive/tests/objstore.rs`), the
//! S3 one against a real S3-compatible server (`s3s-fs`).

pub mod local;
#[cfg(feature = "s3")]
pub mod s3;

use bytes::Bytes;
use walhook_pipeline::objstore::{ObjectInfo, ObjectStore, ObjectStoreError, PutReceipt};

pub use local::LocalDirStore;
#[cfg(feature = "s3")]
pub use s3::{S3Credentials, S3Settings, S3SettingsError, S3Store};

/// One of the object stores, chosen at run time (the binary reads which
/// from its configuration).
#[derive(Debug, Clone)]
pub enum AnyStore {
    /// A directory on local disk.
    Local(LocalDirStore),
    /// An S3 bucket (or an S3-compatible server).
    #[cfg(feature = "s3")]
    S3(S3Store),
}

impl From<LocalDirStore> for AnyStore {
    fn from(store: LocalDirStore) -> Self {
        AnyStore::Local(store)
    }
}

#[cfg(feature = "s3")]
impl From<S3Store> for AnyStore {
    fn from(store: S3Store) -> Self {
        AnyStore::S3(store)
    }
}

impl ObjectStore for AnyStore {
    async fn put(&self, key: &str, bytes: Bytes) -> Result<PutReceipt, ObjectStoreError> {
        match self {
            AnyStore::Local(store) => store.put(key, bytes).await,
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.put(key, bytes).await,
        }
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, ObjectStoreError> {
        match self {
            AnyStore::Local(store) => store.get(key).await,
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.get(key).await,
        }
    }

    async fn get_range(
        &self,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Option<Bytes>, ObjectStoreError> {
        match self {
            AnyStore::Local(store) => store.get_range(key, range).await,
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.get_range(key, range).await,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<ObjectInfo>, ObjectStoreError> {
        match self {
            AnyStore::Local(store) => store.list(prefix).await,
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.list(prefix).await,
        }
    }

    async fn delete(&self, key: &str) -> Result<(), ObjectStoreError> {
        match self {
            AnyStore::Local(store) => store.delete(key).await,
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.delete(key).await,
        }
    }

    fn describe(&self) -> String {
        match self {
            AnyStore::Local(store) => store.describe(),
            #[cfg(feature = "s3")]
            AnyStore::S3(store) => store.describe(),
        }
    }
}
