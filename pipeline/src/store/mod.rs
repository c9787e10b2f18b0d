//! What the operators need from the platform database, as traits; the
//! Postgres implementation lives in the `walhook-sql` crate.
//!
//! Contracts: every write is idempotent (ids are derived, inserts use
//! `ON CONFLICT DO NOTHING`), so a stage that crashes and redoes its last
//! batch changes nothing twice. A result is durable when the future
//! resolves `Ok`.
//!
//! With the `testing` feature, [`memory`] holds an in-memory twin of the
//! fan-out and dispatch stores and [`contract`] the rules both it and the
//! Postgres store are checked against.

use std::future::Future;

#[cfg(any(test, feature = "testing"))]
pub mod contract;
#[cfg(any(test, feature = "testing"))]
pub mod memory;

use crate::delivery::{AttemptRecord, DeliveryJob, DeliveryStatus, NewDelivery};
use crate::event::Event;
use crate::ids::DeliveryId;

/// What a failure means for the caller, decided once where the error is
/// made (from the SQLSTATE or the error's kind, never from its text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Retrying may succeed: the connection dropped, the server is starting
    /// or shutting down, a serialization failure, a deadlock, a timeout, a
    /// resource ran short.
    Transient,
    /// One record's values were refused (SQLSTATE classes 22 "data
    /// exception", 23 "integrity constraint violation" and 54 "program
    /// limit exceeded"): retrying the same record fails again, the others
    /// may proceed without it.
    Data,
    /// Retrying cannot help (a missing table, a permission, a bug): the
    /// operator must act.
    Definite,
}

impl ErrorKind {
    /// The kind of a Postgres SQLSTATE (five characters).
    pub fn of_sqlstate(code: &str) -> ErrorKind {
        let class = code.get(..2).unwrap_or("");
        match class {
            // Data exceptions, integrity violations, program limits (a row or
            // an index entry too big).
            "22" | "23" | "54" => ErrorKind::Data,
            // Connection exceptions, insufficient resources, system errors.
            "08" | "53" | "58" => ErrorKind::Transient,
            // Serialization failure, deadlock; statement timeout and
            // cancellation; shutdown and start-up; lock not available; an
            // object (a slot) still in use by a session that is ending.
            _ if matches!(
                code,
                "40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "55P03" | "55006"
            ) =>
            {
                ErrorKind::Transient
            }
            _ => ErrorKind::Definite,
        }
    }
}

/// A platform database error, classified where it was made.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// What failed, for the log.
    pub message: String,
    /// What the failure means for the caller.
    pub kind: ErrorKind,
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
            kind: ErrorKind::Transient,
            source: Some(Box::new(source)),
        }
    }

    /// An error retrying will not fix.
    pub fn definite(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            kind: ErrorKind::Definite,
            source: None,
        }
    }

    /// A record whose values the store refused.
    pub fn data(message: impl Into<String>) -> Self {
        StoreError {
            message: message.into(),
            kind: ErrorKind::Data,
            source: None,
        }
    }

    /// Whether retrying may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind == ErrorKind::Transient
    }

    /// Whether one record's values were refused (isolate it, go on).
    pub fn is_data(&self) -> bool {
        self.kind == ErrorKind::Data
    }

    /// The message and every source, on one line, cleaned and cut to
    /// 1 KiB (for incidents and logs: a database error may quote the value
    /// it refused, which may be hostile input).
    pub fn chain(&self) -> String {
        let text = crate::supervise::error_chain(self);
        crate::sanitize::clean_str(
            &text,
            crate::sanitize::Lines::Escape,
            crate::incident::MAX_DETAIL_BYTES,
        )
    }
}

/// Fan-out's writes.
pub trait FanoutStore: crate::incident::IncidentStore + Send + Sync + 'static {
    /// Stores `events` and `deliveries` in one transaction; returns the ids
    /// of the deliveries that did not exist before.
    fn materialize(
        &self,
        events: &[Event],
        deliveries: &[NewDelivery],
    ) -> impl Future<Output = Result<Vec<DeliveryId>, StoreError>> + Send;
}

/// Dispatch's reads and writes.
pub trait DispatchStore: crate::incident::IncidentStore + Send + Sync + 'static {
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

    /// This node starts: renews its lease and returns whether its previous
    /// run stopped cleanly (every attempt it started was recorded). A node
    /// never seen before counts as clean.
    fn node_started(
        &self,
        node: &str,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// This node stopped cleanly: every attempt it started is recorded.
    fn node_stopped(&self, node: &str) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Renews this node's lease: the deliveries it holds stay its own until
    /// `lease` from now. Called more often than `lease`.
    fn heartbeat(
        &self,
        node: &str,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims up to `limit` pending deliveries that are due and held by no
    /// live node (released retries, operational events, and everything of
    /// nodes whose lease lapsed), bumping each lease version. Due deliveries
    /// of `exclude` (open circuits) are left alone. Deliveries taken from a
    /// node that did not stop cleanly come with `after_unknown` set. A row
    /// that cannot be read back is ended as failed with an incident, never
    /// left claimed.
    fn claim_due(
        &self,
        node: &str,
        limit: usize,
        exclude: &[crate::ids::EndpointId],
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send;

    /// After a restart: claims the pending deliveries this node held, in id
    /// order after `after`, bumping each lease version; `after_unknown`
    /// when the previous run did not stop cleanly.
    fn reclaim_own(
        &self,
        node: &str,
        after: Option<DeliveryId>,
        limit: usize,
        after_unknown: bool,
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send;

    /// After a restart: takes back the plans of fan-out (deliveries with no
    /// row yet) this node held, made before `before` (the start of this
    /// run: the plans this run's own fan-out makes meanwhile are already on
    /// their way to its dispatcher, and taking them again would send them
    /// twice), in event order after `after`, bumping each plan's lease;
    /// returns their deliveries that have no row yet and the event to
    /// continue after (`None` when done).
    fn reclaim_plans(
        &self,
        node: &str,
        after: Option<crate::ids::EventId>,
        limit: usize,
        after_unknown: bool,
        before: crate::time::Timestamp,
    ) -> impl Future<Output = Result<(Vec<DeliveryJob>, Option<crate::ids::EventId>), StoreError>> + Send;

    /// Removes plans whose deliveries all have their rows (left behind by a
    /// crash, or by two writers finishing one plan at once); returns how
    /// many.
    fn tidy_plans(&self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Cleans the queue tables (plans, pending deliveries) of the rows they
    /// no longer hold. Their rows live for milliseconds, thousands a
    /// second; left to autovacuum (which visits a database about once a
    /// minute), every scan of them reads pages of dead rows. A store
    /// without such tables does nothing.
    fn clean_queues(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        async { Ok(()) }
    }

    /// Drops attempt tallies (the console's charts) past their keeping
    /// time; returns how many rows. A store without them does nothing.
    fn expire_tallies(&self) -> impl Future<Output = Result<u64, StoreError>> + Send {
        async { Ok(0) }
    }

    /// Deliveries cancelled through the API after position `after` (at
    /// most `limit`, in order) and the position to ask after next; with
    /// `after = None`, none and the current last position. A store without
    /// cancellations has none.
    fn cancellations_after(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<(Vec<crate::ids::DeliveryId>, i64), StoreError>> + Send {
        let _ = (after, limit);
        async { Ok((Vec::new(), 0)) }
    }

    /// Records the outcome of an ownership check of `endpoint` for
    /// `challenge`: `Ok` verifies it (unless a newer challenge replaced
    /// this one meanwhile), `Err` keeps it waiting and stores why.
    fn record_verification(
        &self,
        endpoint: crate::ids::EndpointId,
        challenge: &str,
        result: Result<(), String>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Hands held deliveries back (no attempt): they stay pending, become
    /// due no earlier than the given time, and any node may claim them then.
    fn release(&self, releases: &[Release]) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Claims up to `limit` open replay requests (one per delivery, none of
    /// a pending delivery that another live node holds: every attempt of a
    /// delivery goes through its holder), numbering their manual attempts
    /// in the delivery's one sequence of attempts.
    fn claim_replays(
        &self,
        node: &str,
        limit: usize,
        lease: std::time::Duration,
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send;

    /// [`DispatchStore::claim_due`] for the dispatcher of one partition of
    /// the deliveries topic ([`crate::routing`]): due deliveries of
    /// `scope` that no node holds, and those of `scope` that any other node
    /// holds (an earlier holder of the partition; `after_unknown` unless
    /// that node stopped cleanly), bumping each lease version. Nothing
    /// outside `scope`, and no plans (the topic carries them).
    fn claim_scoped(
        &self,
        node: &str,
        limit: usize,
        exclude: &[crate::ids::EndpointId],
        scope: &crate::routing::Scope,
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send {
        let _ = (node, limit, exclude, scope);
        async {
            Err(StoreError::definite(
                "this store cannot dispatch by deliveries partition",
            ))
        }
    }

    /// [`DispatchStore::claim_replays`] of the deliveries in `scope` only.
    fn claim_replays_scoped(
        &self,
        node: &str,
        limit: usize,
        lease: std::time::Duration,
        scope: &crate::routing::Scope,
    ) -> impl Future<Output = Result<Vec<DeliveryJob>, StoreError>> + Send {
        let _ = (node, limit, lease, scope);
        async {
            Err(StoreError::definite(
                "this store cannot dispatch by deliveries partition",
            ))
        }
    }

    /// The deliveries of `scope` planned by fan-out under the topic's hold
    /// ([`crate::routing::TOPIC_HELD`]) that have no row yet, as jobs for
    /// `node`, marked `after_unknown` when the partition's latest earlier
    /// dispatcher did not stop cleanly (it may have sent them); `None`
    /// while an earlier dispatcher of the partition neither stopped nor
    /// lapsed (it may still send them). Nothing changes: the plans stay as
    /// they are.
    fn take_partition(
        &self,
        node: &str,
        scope: &crate::routing::Scope,
    ) -> impl Future<Output = Result<Option<Vec<DeliveryJob>>, StoreError>> + Send {
        let _ = (node, scope);
        async {
            Err(StoreError::definite(
                "this store cannot dispatch by deliveries partition",
            ))
        }
    }

    /// Those of `ids` that have no delivery row.
    fn without_rows(
        &self,
        ids: &[DeliveryId],
    ) -> impl Future<Output = Result<Vec<DeliveryId>, StoreError>> + Send {
        let _ = ids;
        async {
            Err(StoreError::definite(
                "this store cannot dispatch by deliveries partition",
            ))
        }
    }

    /// Closes a replay request that cannot be carried out (endpoint gone or
    /// disabled), with the reason.
    fn reject_replay(
        &self,
        request_id: i64,
        reason: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Disables an endpoint (410 Gone, or failing too long): a new config
    /// version, an audit record, and an `endpoint.disabled` event for the
    /// tenant's endpoints subscribed to it.
    fn disable_endpoint(
        &self,
        endpoint: crate::ids::EndpointId,
        reason: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Saves an endpoint's health (failing since, circuit) across restarts.
    fn save_health(
        &self,
        health: &[EndpointHealth],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every endpoint's saved health.
    fn load_health(&self) -> impl Future<Output = Result<Vec<EndpointHealth>, StoreError>> + Send;
}

/// A delivery ending without an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// Set when the delivery has no row yet: this transition writes it.
    pub first_write: Option<Box<crate::delivery::FirstWrite>>,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The lease it is held under.
    pub lease_version: i64,
    /// Its new (terminal) status.
    pub status: DeliveryStatus,
    /// Why, stored as the last error class.
    pub reason: crate::delivery::EndReason,
}

/// A held delivery handed back without an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Set when the delivery has no row yet: the release writes it.
    pub first_write: Option<Box<crate::delivery::FirstWrite>>,
    /// The delivery.
    pub delivery_id: DeliveryId,
    /// The lease it is held under.
    pub lease_version: i64,
    /// Not due before this.
    pub not_before: crate::time::Timestamp,
}

/// An endpoint's health, kept across restarts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointHealth {
    /// The endpoint.
    pub endpoint_id: crate::ids::EndpointId,
    /// Its tenant.
    pub tenant_id: crate::ids::TenantId,
    /// Failing without a success since then.
    pub failing_since: Option<crate::time::Timestamp>,
    /// Consecutive failures.
    pub consecutive_failures: u32,
    /// Its circuit's state.
    pub circuit: crate::dispatch::breaker::CircuitState,
    /// When an open circuit may probe.
    pub open_until: Option<crate::time::Timestamp>,
}
