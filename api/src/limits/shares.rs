//! Fair shares of the request slots: no client address holds more than
//! `[api].max_requests_per_client` of them, and no tenant more than that or
//! half of the API's database connections (`[api].max_connections`), so
//! one caller (or one tenant's many callers) can take neither every slot
//! nor every connection another tenant's request would wait for.
//!
//! - By address: taken before a slot, waiting like a slot does (up to the
//!   same queue wait), so a burst from one address queues behind its own
//!   share and no one else's.
//! - By tenant: the tenant is known only once its key is checked, which
//!   happens inside a slot; authentication admits the tenant through the
//!   request's [`TenantAdmission`], and a tenant over its share is refused
//!   at once (its slot is freed instead of held waiting).
//!
//! Both tables hold entries only for callers with requests in progress or
//! waiting, so their size follows the connections, never the history.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use walhook_pipeline::ids::TenantId;

use crate::client::ClientKey;
use crate::error::{ApiError, QuotaExceeded};
use crate::metrics::{Metrics, Refusal};

/// Request slots per client address.
#[derive(Debug)]
pub(crate) struct ClientShares {
    share: usize,
    by_client: Mutex<HashMap<ClientKey, Arc<Semaphore>>>,
}

/// A client's share held by a request (given back when dropped).
#[derive(Debug)]
pub(crate) struct ClientPermit {
    permit: Option<OwnedSemaphorePermit>,
    key: ClientKey,
    shares: Arc<ClientShares>,
}

impl ClientShares {
    pub(crate) fn new(share: usize) -> Self {
        ClientShares {
            share: share.max(1),
            by_client: Mutex::new(HashMap::new()),
        }
    }

    /// The share per address.
    pub(crate) fn share(&self) -> usize {
        self.share
    }

    /// One of `key`'s requests, waiting until `deadline` at most.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: ClientKey,
        deadline: Instant,
    ) -> Option<ClientPermit> {
        let semaphore = self
            .by_client
            .lock()
            .entry(key)
            .or_insert_with(|| Arc::new(Semaphore::new(self.share)))
            .clone();
        let acquired = tokio::time::timeout_at(deadline, semaphore.acquire_owned()).await;
        match acquired {
            Ok(Ok(permit)) => Some(ClientPermit {
                permit: Some(permit),
                key,
                shares: self.clone(),
            }),
            _ => {
                self.forget_if_idle(key);
                None
            }
        }
    }

    /// Drops `key`'s entry once nothing holds or waits for it.
    fn forget_if_idle(&self, key: ClientKey) {
        let mut map = self.by_client.lock();
        if map
            .get(&key)
            .is_some_and(|s| Arc::strong_count(s) == 1 && s.available_permits() == self.share)
        {
            map.remove(&key);
        }
    }

    /// Addresses with requests in progress or waiting.
    pub(crate) fn tracked(&self) -> usize {
        self.by_client.lock().len()
    }
}

impl Drop for ClientPermit {
    fn drop(&mut self) {
        self.permit.take();
        self.shares.forget_if_idle(self.key);
    }
}

/// Request slots per tenant.
#[derive(Debug)]
pub(crate) struct TenantShares {
    share: usize,
    in_progress: Mutex<HashMap<TenantId, usize>>,
    metrics: Arc<Metrics>,
    /// The tenant's refused requests, draining at `share` a second: how
    /// many were refused ahead of the next, which sets its `Retry-After`.
    refused: crate::ratelimit::RateTable<crate::ratelimit::CredentialKey>,
}

impl TenantShares {
    pub(crate) fn new(share: usize, metrics: Arc<Metrics>) -> Self {
        TenantShares {
            share: share.max(1),
            in_progress: Mutex::new(HashMap::new()),
            metrics,
            refused: crate::ratelimit::RateTable::new(
                u32::try_from(share.max(1) * 60).unwrap_or(u32::MAX),
                crate::ratelimit::MAX_TRACKED,
            ),
        }
    }

    fn enter(&self, tenant: &TenantId) -> Result<(), ApiError> {
        let mut map = self.in_progress.lock();
        let n = map.entry(tenant.clone()).or_default();
        if *n >= self.share {
            let current = *n;
            drop(map);
            // Requests refused together are told to come back one share
            // a second, so that many clients of one tenant retrying after
            // the same wait do not all arrive again at once.
            let ahead = self.refused.take_and_count(
                crate::ratelimit::CredentialKey::of(tenant.as_str()),
                std::time::Instant::now(),
            );
            let retry = (ahead / self.refused.per_second()).ceil().max(1.0) as u64;
            if self.metrics.refused(Refusal::TenantRequests) {
                tracing::warn!(
                    tenant_id = %tenant,
                    share = self.share,
                    "request refused: the tenant holds its share of the request slots"
                );
            }
            // The tenant's own limit, not the server's: a 429 naming it.
            return Err(ApiError::QuotaExceeded {
                detail: format!(
                    "tenant {:?} has {} requests in progress, the most one tenant may have \
                     ([api].max_requests_per_client, and at most half of [api].max_connections, \
                     the API's database connections); nothing was done: retry after Retry-After \
                     seconds, or send fewer requests at once",
                    tenant.as_str(),
                    self.share
                ),
                quota: QuotaExceeded {
                    limit_name: "requests_per_tenant".into(),
                    limit: self.share as u64,
                    current: current as u64,
                    retry_after_seconds: Some(retry),
                },
            });
        }
        *n += 1;
        Ok(())
    }

    fn leave(&self, tenant: &TenantId) {
        let mut map = self.in_progress.lock();
        if let Some(n) = map.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(tenant);
            }
        }
    }
}

/// The tenant share of one request: put in the request's extensions by
/// [`super::enforce`], filled by authentication, given back when the
/// request ends. Calls made in-process (the console's calls to the API)
/// carry none: the console's own request was admitted already.
#[derive(Debug, Clone)]
pub(crate) struct TenantAdmission(Arc<Mutex<Held>>);

#[derive(Debug)]
struct Held {
    shares: Arc<TenantShares>,
    tenant: Option<TenantId>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(t) = self.tenant.take() {
            self.shares.leave(&t);
        }
    }
}

impl TenantAdmission {
    pub(crate) fn new(shares: Arc<TenantShares>) -> Self {
        TenantAdmission(Arc::new(Mutex::new(Held {
            shares,
            tenant: None,
        })))
    }

    /// Counts this request against `tenant`'s share, or refuses it (503).
    /// A request admitted once is not counted again.
    pub(crate) fn admit(&self, tenant: &TenantId) -> Result<(), ApiError> {
        let mut held = self.0.lock();
        if held.tenant.is_some() {
            return Ok(());
        }
        held.shares.enter(tenant)?;
        held.tenant = Some(tenant.clone());
        Ok(())
    }

    /// Gives the share back (the request ended).
    pub(crate) fn release(&self) {
        let mut held = self.0.lock();
        if let Some(t) = held.tenant.take() {
            held.shares.leave(&t);
        }
    }
}

/// Admits the request in `extensions` for `tenant`, when it came through
/// [`super::enforce`].
pub(crate) fn admit_tenant(
    extensions: &axum::http::Extensions,
    tenant: &TenantId,
) -> Result<(), ApiError> {
    match extensions.get::<TenantAdmission>() {
        Some(a) => a.admit(tenant),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_address_waits_behind_its_own_share_only() {
        let shares = Arc::new(ClientShares::new(2));
        let (a, b) = (
            ClientKey::V4(Ipv4Addr::new(192, 0, 2, 1)),
            ClientKey::V4(Ipv4Addr::new(192, 0, 2, 2)),
        );
        let soon = || Instant::now() + Duration::from_millis(50);
        let p1 = shares.acquire(a, soon()).await.unwrap();
        let _p2 = shares.acquire(a, soon()).await.unwrap();
        assert!(
            shares.acquire(a, soon()).await.is_none(),
            "a is at its share"
        );
        let pb = shares.acquire(b, soon()).await.unwrap();
        drop(p1);
        let _p3 = shares.acquire(a, soon()).await.unwrap();
        // Entries go with their last request.
        drop(pb);
        assert_eq!(shares.tracked(), 1);
    }

    #[test]
    fn a_tenant_over_its_share_is_refused_and_gets_it_back() {
        let shares = Arc::new(TenantShares::new(2, Arc::new(Metrics::new())));
        let acme = TenantId::new("acme").unwrap();
        let requests: Vec<_> = (0..3)
            .map(|_| TenantAdmission::new(shares.clone()))
            .collect();
        requests[0].admit(&acme).unwrap();
        // Admitting the same request twice counts once.
        requests[0].admit(&acme).unwrap();
        requests[1].admit(&acme).unwrap();
        let e = requests[2].admit(&acme).unwrap_err();
        assert!(e.to_string().contains("max_requests_per_client"), "{e}");
        assert_eq!(shares.metrics.refusals(Refusal::TenantRequests), 1);
        // Another tenant is not affected.
        TenantAdmission::new(shares.clone())
            .admit(&TenantId::new("globex").unwrap())
            .unwrap();
        requests[0].release();
        requests[2].admit(&acme).unwrap();
        drop(requests);
        assert!(shares.in_progress.lock().is_empty());
    }

    #[test]
    fn refusals_together_are_told_to_come_back_a_share_a_second() {
        let shares = Arc::new(TenantShares::new(2, Arc::new(Metrics::new())));
        let acme = TenantId::new("acme").unwrap();
        let held: Vec<_> = (0..2)
            .map(|_| TenantAdmission::new(shares.clone()))
            .collect();
        for h in &held {
            h.admit(&acme).unwrap();
        }
        let retries: Vec<u64> = (0..6)
            .map(
                |_| match TenantAdmission::new(shares.clone()).admit(&acme) {
                    Err(ApiError::QuotaExceeded { quota, .. }) => {
                        assert_eq!(quota.limit_name, "requests_per_tenant");
                        quota.retry_after_seconds.unwrap()
                    }
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert_eq!(retries, [1, 1, 2, 2, 3, 3]);
    }
}
