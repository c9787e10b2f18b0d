//! The retry policy and the delivery state machine, as pure functions.
//!
//! Backoff is exponential with full jitter: the delay before automatic
//! attempt `n + 1` is uniform in `[0, min(max_delay, base · 2^(n-1))]`,
//! raised to a floor after a 429 or a timeout, and to `Retry-After` (capped)
//! when the receiver sent one. No attempt is scheduled past the deadline
//! (24 h from the delivery's creation by default) or beyond the maximum
//! attempt count: the delivery is then `exhausted`.
//!
//! Tenants and endpoints may override the schedule's shape
//! ([`RetryOverride`]: attempts, first and largest delay, deadline) within
//! the operator's bounds ([`RetryLimits`]); an endpoint's field wins over its
//! tenant's, which wins over `[retry]`.

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
    /// What tenants and endpoints may ask for in their overrides.
    pub limits: RetryLimits,
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
            limits: RetryLimits::default(),
        }
    }
}

/// The operator's bounds on tenants' and endpoints' retry overrides
/// (`[retry.limits]`). The API refuses an override outside them; dispatch
/// clamps a stored one into them (bounds tightened after it was set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryLimits {
    /// The most automatic attempts an override may ask for.
    pub max_attempts: u32,
    /// The shortest first delay (and largest delay) an override may set.
    #[serde(with = "crate::duration")]
    pub min_delay: Duration,
    /// The longest largest delay an override may set.
    #[serde(with = "crate::duration")]
    pub max_delay: Duration,
    /// The longest deadline an override may set.
    #[serde(with = "crate::duration")]
    pub max_deadline: Duration,
}

impl Default for RetryLimits {
    fn default() -> Self {
        RetryLimits {
            max_attempts: 50,
            min_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(24 * 3600),
            max_deadline: Duration::from_secs(72 * 3600),
        }
    }
}

impl RetryLimits {
    fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("retry.limits.max_attempts must be at least 1".into());
        }
        if self.max_delay < self.min_delay {
            return Err(format!(
                "retry.limits.max_delay ({:?}) must be at least retry.limits.min_delay ({:?})",
                self.max_delay, self.min_delay
            ));
        }
        if self.max_deadline.is_zero() {
            return Err("retry.limits.max_deadline must be above zero".into());
        }
        Ok(())
    }
}

/// A tenant's or an endpoint's changes to the retry schedule; absent
/// fields inherit. Stored as JSON (`retry_policy`), whole seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryOverride {
    /// Automatic attempts at most (the first included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// The first backoff ceiling, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_delay_seconds: Option<u64>,
    /// The largest backoff ceiling, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_seconds: Option<u64>,
    /// No automatic attempt after this long from the delivery's creation,
    /// seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<u64>,
}

impl RetryOverride {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == RetryOverride::default()
    }

    /// `self`'s fields, and `fallback`'s where `self` has none (an
    /// endpoint's override over its tenant's).
    pub fn or(self, fallback: RetryOverride) -> RetryOverride {
        RetryOverride {
            max_attempts: self.max_attempts.or(fallback.max_attempts),
            base_delay_seconds: self.base_delay_seconds.or(fallback.base_delay_seconds),
            max_delay_seconds: self.max_delay_seconds.or(fallback.max_delay_seconds),
            deadline_seconds: self.deadline_seconds.or(fallback.deadline_seconds),
        }
    }

    /// Every field outside `limits`, as (field, problem and fix).
    pub fn problems(&self, limits: &RetryLimits) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let secs = |d: Duration| d.as_secs().max(1);
        if let Some(n) = self.max_attempts
            && !(1..=limits.max_attempts).contains(&n)
        {
            out.push((
                "max_attempts",
                format!(
                    "is {n}; give 1 to {} (the operator's limit)",
                    limits.max_attempts
                ),
            ));
        }
        let (lo, hi) = (secs(limits.min_delay), limits.max_delay.as_secs());
        for (field, value) in [
            ("base_delay_seconds", self.base_delay_seconds),
            ("max_delay_seconds", self.max_delay_seconds),
        ] {
            if let Some(v) = value
                && !(lo..=hi).contains(&v)
            {
                out.push((
                    field,
                    format!("is {v}; give {lo} to {hi} seconds (the operator's limits)"),
                ));
            }
        }
        if let (Some(base), Some(max)) = (self.base_delay_seconds, self.max_delay_seconds)
            && max < base
        {
            out.push((
                "max_delay_seconds",
                format!("is {max}, below base_delay_seconds {base}; give at least {base}"),
            ));
        }
        if let Some(d) = self.deadline_seconds
            && !(1..=limits.max_deadline.as_secs()).contains(&d)
        {
            out.push((
                "deadline_seconds",
                format!(
                    "is {d}; give 1 to {} seconds (the operator's limit)",
                    limits.max_deadline.as_secs()
                ),
            ));
        }
        out
    }
}

impl RetryPolicy {
    /// The policy with `o`'s fields in place of its own, each clamped into
    /// [`RetryLimits`] (a stored override survives bounds tightened later
    /// without escaping them).
    pub fn with(&self, o: &RetryOverride) -> RetryPolicy {
        if o.is_empty() {
            return self.clone();
        }
        let l = &self.limits;
        let delay = |secs: u64| Duration::from_secs(secs).clamp(l.min_delay, l.max_delay);
        let base_delay = o.base_delay_seconds.map_or(self.base_delay, delay);
        let max_delay = o
            .max_delay_seconds
            .map_or(self.max_delay, delay)
            .max(base_delay);
        RetryPolicy {
            base_delay,
            max_delay,
            max_attempts: o
                .max_attempts
                .map_or(self.max_attempts, |n| n.clamp(1, l.max_attempts)),
            deadline: o.deadline_seconds.map_or(self.deadline, |s| {
                Duration::from_secs(s).clamp(Duration::from_secs(1), l.max_deadline)
            }),
            ..self.clone()
        }
    }

    /// Checks the fields, naming the one at fault.
    pub fn validate(&self) -> Result<(), String> {
        self.limits.validate()?;
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
            ..RetryPolicy::default()
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
    fn overrides_replace_fields_within_the_limits() {
        let p = policy();
        let endpoint = RetryOverride {
            max_attempts: Some(3),
            ..RetryOverride::default()
        };
        let tenant = RetryOverride {
            max_attempts: Some(9),
            deadline_seconds: Some(3600),
            ..RetryOverride::default()
        };
        let merged = endpoint.or(tenant);
        assert_eq!(merged.max_attempts, Some(3), "the endpoint's field wins");
        assert_eq!(merged.deadline_seconds, Some(3600), "the tenant's fills in");
        let e = p.with(&merged);
        assert_eq!((e.max_attempts, e.deadline), (3, Duration::from_secs(3600)));
        assert_eq!((e.base_delay, e.max_delay), (p.base_delay, p.max_delay));
        assert_eq!(p.with(&RetryOverride::default()), p);

        // Stored values outside bounds tightened later are clamped.
        let wild = RetryOverride {
            max_attempts: Some(1_000),
            base_delay_seconds: Some(0),
            max_delay_seconds: Some(10 * 24 * 3600),
            deadline_seconds: Some(365 * 24 * 3600),
        };
        let e = p.with(&wild);
        let l = p.limits;
        assert_eq!(e.max_attempts, l.max_attempts);
        assert_eq!(e.base_delay, l.min_delay);
        assert_eq!(e.max_delay, l.max_delay);
        assert_eq!(e.deadline, l.max_deadline);
        // A first delay above the stored largest one raises the largest.
        let e = p.with(&RetryOverride {
            base_delay_seconds: Some(120),
            ..RetryOverride::default()
        });
        assert_eq!(e.max_delay, Duration::from_secs(120));
    }

    #[test]
    fn problems_name_each_field_and_its_bounds() {
        let l = RetryLimits::default();
        assert!(RetryOverride::default().problems(&l).is_empty());
        let bad = RetryOverride {
            max_attempts: Some(0),
            base_delay_seconds: Some(600),
            max_delay_seconds: Some(60),
            deadline_seconds: Some(0),
        };
        let fields: Vec<&str> = bad.problems(&l).iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            vec!["max_attempts", "max_delay_seconds", "deadline_seconds"]
        );
        let (_, why) = &bad.problems(&l)[0];
        assert!(why.contains("is 0; give 1 to 50"), "{why}");
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

    #[test]
    fn a_receivers_extreme_retry_after_is_capped_and_never_overflows() {
        let p = policy();
        let huge = retryable(ErrorClass::RateLimited, Some(Duration::from_secs(u64::MAX)));
        assert_eq!(p.delay(1, &huge, 0.999), p.retry_after_cap);
        assert_eq!(p.delay(u32::MAX, &huge, 1.0), p.retry_after_cap);
        // Near the end of time the next attempt saturates instead of
        // wrapping into the past, and the deadline ends the delivery.
        let s = DeliveryState::new(Timestamp(i64::MAX - 10), &p);
        assert_eq!(s.expires_at, Timestamp(i64::MAX));
        let after = s.next(&huge, &p, Timestamp(i64::MAX - 5), 0.5);
        assert_eq!(after.status, DeliveryStatus::Pending);
        assert_eq!(after.next_attempt_at, Timestamp(i64::MAX));
        // A policy that honours any Retry-After still cannot overflow.
        let lax = RetryPolicy {
            retry_after_cap: Duration::MAX,
            ..policy()
        };
        assert_eq!(lax.delay(1, &huge, 0.5), Duration::from_secs(u64::MAX));
        let after = DeliveryState::new(Timestamp(0), &lax).next(&huge, &lax, Timestamp(1), 0.5);
        assert_eq!(after.status, DeliveryStatus::Exhausted);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(10_000))]

        /// The delay stays within [0, ceiling], raised only by the floor and
        /// a capped Retry-After.
        #[test]
        fn delays_stay_in_bounds(attempts in 1u32..100, jitter in 0.0f64..1.0, ra in proptest::option::of(prop_oneof![0u64..100_000, Just(u64::MAX), any::<u64>()]), rate_limited: bool) {
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
