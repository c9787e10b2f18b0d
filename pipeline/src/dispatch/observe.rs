//! What metrics learn from the pipeline's stages: an observer that fan-out
//! and the dispatcher call, with no-op defaults, so nothing re-parses
//! headers or bodies to find out which attempt it was.

use super::outcome::AttemptOutcome;
use crate::delivery::{DeliveryJob, DeliveryStatus, Trigger};
use crate::ids::TenantId;
use crate::time::Timestamp;

/// One attempt, as the dispatcher saw it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptSeen<'a> {
    /// The delivery.
    pub job: &'a DeliveryJob,
    /// What started it.
    pub trigger: Trigger,
    /// Its number in the delivery's sequence of attempts.
    pub number: u32,
    /// Whether it is the delivery's first automatic attempt (what the
    /// commit → first-attempt latency measures; a replay never is).
    pub first: bool,
    /// When the request started.
    pub started_at: Timestamp,
}

/// The limit that held a ready delivery back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Throttle {
    /// The endpoint's token bucket (`rate_limit_per_sec`).
    RateLimit,
    /// The endpoint's in-flight cap.
    EndpointCap,
    /// The tenant's in-flight budget.
    TenantBudget,
}

impl Throttle {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Throttle::RateLimit => "rate_limit",
            Throttle::EndpointCap => "endpoint_max_in_flight",
            Throttle::TenantBudget => "tenant_budget",
        }
    }
}

/// Sees events leave fan-out and attempts start and finish. Called on the
/// stages' tasks: implementations must not block.
pub trait AttemptObserver: Send + Sync + 'static {
    /// An event's deliveries are durable (fan-out committed past it) at
    /// `at`; it occurred (was committed in the business database) at
    /// `occurred_at`.
    fn fanned_out(&self, _occurred_at: Timestamp, _at: Timestamp) {}
    /// An attempt is about to be sent.
    fn started(&self, _attempt: &AttemptSeen<'_>) {}
    /// An attempt's outcome is known (`finished_at` is when).
    fn finished(
        &self,
        _attempt: &AttemptSeen<'_>,
        _outcome: &AttemptOutcome,
        _finished_at: Timestamp,
    ) {
    }
    /// A delivery reached a final state after `attempts` automatic attempts.
    fn ended(&self, _job: &DeliveryJob, _status: DeliveryStatus, _attempts: u32) {}
    /// A ready delivery of `tenant` waited `times` times for `limit` since
    /// the last call.
    fn throttled(&self, _tenant: &TenantId, _limit: Throttle, _times: u64) {}
    /// A replay request was refused (the endpoint cannot be sent to).
    fn replay_refused(&self, _job: &DeliveryJob) {}
}

/// An observer that sees nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl AttemptObserver for NoObserver {}
