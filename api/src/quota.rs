//! Per-tenant quotas: what one tenant may take from everyone's API and
//! database.
//!
//! - Endpoints per tenant (`[api].max_endpoints_per_tenant`): counted by
//!   the database when an endpoint is created, under a per-tenant lock.
//! - Test events per tenant and minute (`[api].test_events_per_minute`):
//!   [`PerMinute`], a sliding window of the last minute's sends kept in
//!   this process (each API process counts its own).
//! - Ownership checks asked for per endpoint and minute
//!   (`[api].verify_requests_per_minute`): each `POST …/verify` makes a
//!   dispatcher send a request to the endpoint's URL, so without a limit a
//!   tenant could use walhook to send a stream of requests to any URL it
//!   registers. Counted like test events, per endpoint.
//!
//! A refusal is a 429 problem document whose `quota` member names the
//! limit, the current value and, for rates, when to retry (also sent as
//! `Retry-After`); the detail says what to do. One open replay per delivery
//! and the 30-day recovery window are checked where those requests are
//! handled.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use walhook_pipeline::ids::{EndpointId, TenantId};

use crate::error::{ApiError, QuotaExceeded};

/// The window of per-minute rates.
const MINUTE: Duration = Duration::from_secs(60);

/// Keys (tenants, endpoints) kept before idle ones are forgotten.
const PRUNE_ABOVE: usize = 1024;

/// At most `limit` uses per key (a tenant, an endpoint) in any 60 seconds.
#[derive(Debug)]
pub struct PerMinute<K = TenantId> {
    limit: u32,
    uses: Mutex<HashMap<K, VecDeque<Instant>>>,
}

/// A use [`PerMinute`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRefusal {
    /// Uses in the last minute.
    pub current: u32,
    /// When the oldest of them leaves the window.
    pub retry_after: Duration,
}

impl<K: Hash + Eq + Clone> PerMinute<K> {
    /// A window allowing `limit` uses per minute.
    pub fn new(limit: u32) -> Self {
        PerMinute {
            limit,
            uses: Mutex::new(HashMap::new()),
        }
    }

    /// The limit.
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Counts a use by `key` at `now`, or refuses it (counting nothing).
    pub fn take(&self, key: &K, now: Instant) -> Result<(), RateRefusal> {
        let mut uses = self.uses.lock();
        if uses.len() > PRUNE_ABOVE {
            uses.retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < MINUTE));
        }
        let q = uses.entry(key.clone()).or_default();
        while q.front().is_some_and(|t| now.duration_since(*t) >= MINUTE) {
            q.pop_front();
        }
        if q.len() >= self.limit as usize {
            let oldest = *q.front().expect("limit is at least 1");
            return Err(RateRefusal {
                current: q.len() as u32,
                retry_after: MINUTE.saturating_sub(now.duration_since(oldest)),
            });
        }
        q.push_back(now);
        Ok(())
    }
}

/// Whole seconds to wait, at least 1 (`Retry-After` has no fractions).
fn ceil_secs(d: Duration) -> u64 {
    (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
}

/// The 429 for a test event over `[api].test_events_per_minute`.
pub fn test_events_exceeded(tenant: &TenantId, limit: u32, refusal: RateRefusal) -> ApiError {
    let secs = ceil_secs(refusal.retry_after);
    ApiError::QuotaExceeded {
        detail: format!(
            "tenant {:?} sent {} test events in the last minute, the most \
             [api].test_events_per_minute ({limit}) allows; retry in {secs} s",
            tenant.as_str(),
            refusal.current
        ),
        quota: QuotaExceeded {
            limit_name: "test_events_per_minute".into(),
            limit: u64::from(limit),
            current: u64::from(refusal.current),
            retry_after_seconds: Some(secs),
        },
    }
}

/// The 429 for an ownership check over `[api].verify_requests_per_minute`.
pub fn verify_requests_exceeded(
    endpoint: EndpointId,
    limit: u32,
    refusal: RateRefusal,
) -> ApiError {
    let secs = ceil_secs(refusal.retry_after);
    ApiError::QuotaExceeded {
        detail: format!(
            "endpoint {endpoint} was asked to verify {} times in the last minute, the most \
             [api].verify_requests_per_minute ({limit}) allows; no check was sent. Retry in \
             {secs} s (the pending check is also sent again by itself every minute)",
            refusal.current
        ),
        quota: QuotaExceeded {
            limit_name: "verify_requests_per_minute".into(),
            limit: u64::from(limit),
            current: u64::from(refusal.current),
            retry_after_seconds: Some(secs),
        },
    }
}

/// The 429 for an endpoint over `[api].max_endpoints_per_tenant`.
pub fn endpoints_exceeded(tenant: &TenantId, limit: u32, count: i64) -> ApiError {
    ApiError::QuotaExceeded {
        detail: format!(
            "tenant {:?} has {count} endpoints, the most [api].max_endpoints_per_tenant \
             ({limit}) allows; nothing was created. Delete one you no longer use \
             (DELETE /v1/webhook-endpoints/{{id}}), subscribe an existing endpoint to more \
             event types, or ask the operator to raise the limit",
            tenant.as_str()
        ),
        quota: QuotaExceeded {
            limit_name: "max_endpoints_per_tenant".into(),
            limit: u64::from(limit),
            current: u64::try_from(count).unwrap_or(0),
            retry_after_seconds: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_minute_per_tenant() {
        let rate = PerMinute::new(3);
        let (acme, globex) = (
            TenantId::new("acme").unwrap(),
            TenantId::new("globex").unwrap(),
        );
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        rate.take(&acme, at(0)).unwrap();
        rate.take(&acme, at(10_000)).unwrap();
        rate.take(&acme, at(20_000)).unwrap();
        let refused = rate.take(&acme, at(30_000)).unwrap_err();
        assert_eq!(refused.current, 3);
        assert_eq!(refused.retry_after, Duration::from_secs(30));
        // Another tenant has its own window.
        rate.take(&globex, at(30_000)).unwrap();
        // A refusal counts nothing: the first use leaves at 60 s.
        rate.take(&acme, at(60_000)).unwrap();
        assert!(rate.take(&acme, at(60_500)).is_err());
        rate.take(&acme, at(70_000)).unwrap();
    }

    #[test]
    fn refusals_name_the_limit_and_when_to_retry() {
        let acme = TenantId::new("acme").unwrap();
        let e = test_events_exceeded(
            &acme,
            60,
            RateRefusal {
                current: 60,
                retry_after: Duration::from_millis(12_300),
            },
        );
        assert_eq!(e.retry_after(), Some(13));
        let p = e.problem();
        assert_eq!(p.status, 429);
        assert!(p.detail.contains("test_events_per_minute"), "{}", p.detail);
        let q = p.quota.unwrap();
        assert_eq!((q.limit, q.current), (60, 60));
        let e = verify_requests_exceeded(
            EndpointId([1; 16]),
            5,
            RateRefusal {
                current: 5,
                retry_after: Duration::from_secs(40),
            },
        );
        assert_eq!(e.retry_after(), Some(40));
        let p = e.problem();
        assert!(
            p.detail.contains("verify_requests_per_minute") && p.detail.contains("ep_"),
            "{}",
            p.detail
        );
        assert_eq!(p.quota.unwrap().limit_name, "verify_requests_per_minute");
        let e = endpoints_exceeded(&acme, 100, 100);
        assert_eq!(e.retry_after(), None);
        assert!(e.problem().detail.contains("DELETE"));
    }
}
