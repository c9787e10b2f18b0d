//! What metrics learn about attempts: an observer the dispatcher calls,
//! with no-op defaults, so nothing re-parses headers or bodies to find out
//! which attempt it was.

use super::outcome::AttemptOutcome;
use crate::delivery::{DeliveryJob, Trigger};
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

/// Sees attempts start and finish. Called on the dispatcher's task:
/// implementations must not block.
pub trait AttemptObserver: Send + Sync + 'static {
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
}

/// An observer that sees nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoObserver;

impl AttemptObserver for NoObserver {}
