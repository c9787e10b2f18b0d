//! Time as the dispatcher sees it: the system clock in production, a manual
//! clock in tests, so that a 24 h deadline or a one-hour backoff is crossed
//! in a millisecond while real HTTP still runs in real time.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::time::Timestamp;

/// A source of the current time.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// `SystemTime::now()`.
    #[default]
    System,
    /// Time that moves only when a test moves it.
    Manual(Arc<ManualClock>),
}

/// A clock a test sets and advances.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
    moved: Notify,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Arc<Self> {
        Arc::new(ManualClock {
            now: Mutex::new(start),
            moved: Notify::new(),
        })
    }

    /// Moves the clock forward by `d`, waking whoever waits on it.
    pub fn advance(&self, d: Duration) {
        {
            let mut now = self.now.lock();
            *now = now.plus(d);
        }
        self.moved.notify_waiters();
    }

    /// The current reading.
    pub fn now(&self) -> Timestamp {
        *self.now.lock()
    }
}

impl Clock {
    /// The current time.
    pub fn now(&self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Manual(m) => m.now(),
        }
    }

    /// Resolves when `deadline` may have passed: after sleeping on the
    /// system clock, or when a manual clock moves.
    pub async fn wait_until(&self, deadline: Timestamp) {
        match self {
            Clock::System => tokio::time::sleep(deadline.since(Timestamp::now())).await,
            Clock::Manual(m) => {
                let moved = m.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if m.now() >= deadline {
                    return;
                }
                moved.await;
            }
        }
    }
}
