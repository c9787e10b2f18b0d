//! What the operators need from the platform database, as traits; the
//! Postgres implementation lives in the `walhook-sql` crate.
//!
//! Contracts: every write is idempotent (ids are derived, inserts use
//! `ON CONFLICT DO NOTHING`), so a stage that crashes and redoes its last
//! batch changes nothing twice. A result is durable when the future
//! resolves `Ok`.

use std::future::Future;

use crate::delivery::{AttemptRecord, DeliveryJob, DeliveryStatus, NewDelivery};
use crate::event::Event;
use crate::ids::DeliveryId;

/// A platform database error, classified where it was made.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// What failed, for the log.
    pub message: String,
    /// Whether retrying may succeed.
    pub transient: bool,
    /// The cause.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    /// A transient error.
    pub fn transient(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError {
            message: message.into(),
            transient: true,
            source: Some(Box::new(source)),
        }
    }

    /// An error retrying will not fix.
    pub fn definite(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            transient: false,
            source: None,
        }
    }
}

/// Fan-out's writes.
pub trait FanoutStore: Send + Sync + 'static {
    /// Stores `events` and `deliveries` in one transaction; returns the ids
    /// of the deliveries that did not exist before.
    fn materialize(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
    ) -> impl Future<Output = Result<Vec<DeliveryId>, StoreError>> + Send;
}

/// Dispatch's reads and writes.
pub trait DispatchStore: Send + Sync + 'static {
    /// Records attempts and, under their leases, the deliveries' new states.
    /// Returns the deliveries whose lease had moved on (stale results).
    fn record(
        &self,
        attempts: &[AttemptRecord],
    ) -> impl Future<Output = Result<Vec<DeliveryId>, StoreError>> + Send;

    /// Ends deliveries without an attempt (endpoint deleted, deadline passed
    /// while paused), under their leases.
    fn transition(
        &self,
        changes: &[Transition],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims up to `limit` due pending deliveries whose lease expired (and,
    /// with `reclaim_own`, those `node` held before a restart), bumping each
    /// lease version.
    fn claim_due(
        &self,
        node: &str,
        limit: usize,
        lease: std::time::Duration,
        reclaim_own: bool,
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send;
}

/// A delivery ending without an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The lease it is held under.
    pub lease_version: i64,
    /// Its new (terminal) status.
    pub status: DeliveryStatus,
    /// Why, stored as the last error class.
    pub reason: &'static str,
}
