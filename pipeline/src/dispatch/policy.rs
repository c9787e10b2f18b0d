//! The retry policy and the delivery state machine, as pure functions.
//!
//! Backoff is exponential with full jitter: the delay before automatic
//! attempt `n + 1` is uniform in `[0, min(max_delay, base · 2^(n-1))]`,
//! raised to a floor after a 429 or a timeout, and to `Retry-After` (capped)
//! when the receiver sent one. No attempt is scheduled past the deadline
//! (24 h from the delivery's creation by default) or beyond the maximum
//! attempt count: the delivery is then `exhausted`.

use std::time::Duration;

use crate::delivery::DeliveryStatus;
use crate::dispatch::outcome::{AttemptOutcome, ErrorClass};
use crate::time::Timestamp;

/// The retry schedule (configuration; tests make it instant).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// The first backoff ceiling.
    #[serde(with = "crate::duration")]
    pub base_delay: Duration,
    /// The largest backoff ceiling.
    #[serde(with = "crate::duration")]
    pub max_delay: Duration,
    /// Automatic attempts at most (the first included).
    pub max_attempts: u32,
    /// No automatic attempt after this long from the delivery's creation.
    #[serde(with = "crate::duration")]
    pub deadline: Duration,
    /// `Retry-After` is honoured up to this.
    #[serde(with = "crate::duration")]
    pub retry_after_cap: Duration,
    /// The least delay after a 429 or a timeout.
    #[serde(with = "crate::duration")]
    pub slow_down_floor: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_secs(5),
            max_delay: Duration::from_secs(3600),
            max_attempts: 20,
            deadline: Duration::from_secs(24 * 3600),
            retry_after_cap: Duration::from_secs(3600),
            slow_down_floor: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Checks the fields, naming the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry.max_attempts must be at least 1".into());
        }
        if self.base_delay.is_zero() && !self.max_delay.is_zero() {
            return Err("retry.base_delay must be above zero when max_delay is".into());
        }
        if self.max_delay < self.base_delay {
            return Err("retry.max_delay must be at least retry.base_delay".into());
        }
        if self.deadline.is_zero() {
            return Err("retry.deadline must be above zero (24h is the usual)".into());
        }
        Ok(())
    }

    /// The backoff ceiling after `attempts` automatic attempts (≥ 1).
    pub fn ceiling(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(100);
        let nanos = self.base_delay.as_nanos().saturating_mul(1u128 << exp);
        let capped = nanos.min(self.max_delay.as_nanos());
        Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
    }

    /// The delay before the next attempt; `jitter` is uniform in [0, 1).
    pub fn delay(&self, attempts: u32, outcome: &AttemptOutcome, jitter: f64) -> Duration {
        let jitter = jitter.clamp(0.0, 1.0);
        let mut delay = self.ceiling(attempts).mul_f64(jitter);
        if let AttemptOutcome::Retryable {
            class, retry_after, ..
        } = outcome
        {
            if matches!(
                class,
                ErrorClass::RateLimited
                    | ErrorClass::Timeout
                    | ErrorClass::RequestTimeout
                    | ErrorClass::ConnectTimeout
            ) {
                delay = delay.max(
                    self.slow_down_floor
                        .min(self.max_delay.max(self.slow_down_floor)),
                );
            }
            if let Some(ra) = retry_after {
                delay = delay.max((*ra).min(self.retry_after_cap));
            }
        }
        delay
    }
}

/// A delivery's schedule state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryState {
    /// Its status.
    pub status: DeliveryStatus,
    /// Automatic attempts made.
    pub attempts: u32,
    /// When it was made.
    pub created_at: Timestamp,
    /// When automatic attempts stop.
    pub expires_at: Timestamp,
    /// When the next automatic attempt is due (meaningful while pending).
    pub next_attempt_at: Timestamp,
}

impl DeliveryState {
    /// A new pending delivery due now.
    pub fn new(created_at: Timestamp, policy: &RetryPolicy) -> Self {
        DeliveryState {
            status: DeliveryStatus::Pending,
            attempts: 0,
            created_at,
            expires_at: created_at.plus(policy.deadline),
            next_attempt_at: created_at,
        }
    }

    /// The state after an automatic attempt that finished at `now` with
    /// `outcome`. Terminal states never change.
    pub fn next(
        self,
        outcome: &AttemptOutcome,
        policy: &RetryPolicy,
        now: Timestamp,
        jitter: f64,
    ) -> DeliveryState {
        if self.status.is_terminal() {
            return self;
        }
        let attempts = self.attempts.saturating_add(1);
        let status = match outcome {
            AttemptOutcome::Delivered { .. } => DeliveryStatus::Succeeded,
            AttemptOutcome::Rejected { .. } | AttemptOutcome::Gone => DeliveryStatus::Failed,
            AttemptOutcome::Retryable { .. } => {
                if attempts >= policy.max_attempts {
                    DeliveryStatus::Exhausted
                } else {
                    let at = now.plus(policy.delay(attempts, outcome, jitter));
                    if at > self.expires_at {
                        DeliveryStatus::Exhausted
                    } else {
                        return DeliveryState {
                            attempts,
                            next_attempt_at: at,
                            ..self
                        };
                    }
                }
            }
        };
        DeliveryState {
            status,
            attempts,
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            max_attempts: 8,
            deadline: Duration::from_secs(24 * 3600),
            retry_after_cap: Duration::from_secs(300),
            slow_down_floor: Duration::from_secs(5),
        }
    }

    fn retryable(class: ErrorClass, retry_after: Option<Duration>) -> AttemptOutcome {
        AttemptOutcome::Retryable {
            status: None,
            class,
            retry_after,
        }
    }

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let p = policy();
        let c: Vec<u64> = (1..=8).map(|n| p.ceiling(n).as_secs()).collect();
        assert_eq!(c, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(p.ceiling(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn success_failure_and_exhaustion() {
        let p = policy();
        let s = DeliveryState::new(Timestamp(0), &p);
        assert_eq!(
            s.next(
                &AttemptOutcome::Delivered { status: 200 },
                &p,
                Timestamp(1),
                0.5
            )
            .status,
            DeliveryStatus::Succeeded
        );
        assert_eq!(
            s.next(&AttemptOutcome::Gone, &p, Timestamp(1), 0.5).status,
            DeliveryStatus::Failed
        );
        let mut s = s;
        for _ in 0..7 {
            s = s.next(
                &retryable(ErrorClass::ServerError, None),
                &p,
                s.next_attempt_at,
                0.5,
            );
            assert_eq!(s.status, DeliveryStatus::Pending);
        }
        s = s.next(
            &retryable(ErrorClass::ServerError, None),
            &p,
            s.next_attempt_at,
            0.5,
        );
        assert_eq!((s.status, s.attempts), (DeliveryStatus::Exhausted, 8));
    }

    #[test]
    fn the_deadline_ends_retries() {
        let p = policy();
        let s = DeliveryState::new(Timestamp(0), &p);
        let late = Timestamp(0).plus(Duration::from_secs(24 * 3600 - 1));
        let after = s.next(&retryable(ErrorClass::Timeout, None), &p, late, 0.9);
        assert_eq!(after.status, DeliveryStatus::Exhausted);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        /// The delay stays within [0, ceiling], raised only by the floor and
        /// a capped Retry-After.
        #[test]
        fn delays_stay_in_bounds(attempts in 1u32..100, jitter in 0.0f64..1.0, ra in proptest::option::of(0u64..100_000), rate_limited: bool) {
            let p = policy();
            let class = if rate_limited { ErrorClass::RateLimited } else { ErrorClass::ServerError };
            let outcome = retryable(class, ra.map(Duration::from_secs));
            let d = p.delay(attempts, &outcome, jitter);
            let mut upper = p.ceiling(attempts);
            if rate_limited {
                upper = upper.max(p.slow_down_floor);
                prop_assert!(d >= p.slow_down_floor);
            }
            if let Some(ra) = ra {
                let honoured = Duration::from_secs(ra).min(p.retry_after_cap);
                prop_assert!(d >= honoured);
                upper = upper.max(honoured);
            }
            prop_assert!(d <= upper, "{d:?} > {upper:?}");
            prop_assert!(d <= p.max_delay.max(p.retry_after_cap).max(p.slow_down_floor));
        }
    }
}
