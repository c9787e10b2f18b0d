//! Request limits: how many requests run at once, how they share the
//! slots, and how long each (and its body) may take.
//!
//! ```text
//!  request ─▶ sign-in form? ─yes─▶ read it whole first (body::read_sign_in; no slot held)
//!     ─▶ the address's share free? (shares::ClientShares) ─┐ wait up to QUEUE_WAIT
//!     ─▶ free slot? ───────────────────────────────────────┘   for both, then 503 busy
//!     ─▶ handler, within request_timeout ──▶ response
//!          │  authentication admits the tenant (shares::TenantAdmission): over its share, 503
//!          │  the body must arrive within body_read_timeout (body::TimedBody): else 408
//!          └─ too slow ─▶ 503 timeout (Retry-After: 1)
//! ```
//!
//! Together with the API's own small pool and `statement_timeout`, this
//! bounds what the API can take from the process and the database: a flood
//! of requests waits briefly, then is told to come back, instead of queueing
//! without end on the pool; and no single address or tenant can hold every
//! slot, so 80 connections trickling bodies lock out no one else.
//! `/healthz` is exempt: a liveness probe must answer while the server is
//! busy, and it touches nothing.

mod body;
mod shares;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
use walhook_pipeline::sanitize::{Lines, clean_str};

pub use self::body::{BodyTimedOut, SIGN_IN_BODY_TIMEOUT, SIGN_IN_MAX_BODY, is_body_timeout};
pub(crate) use self::shares::admit_tenant;
use self::shares::{ClientShares, TenantAdmission, TenantShares};
use crate::client::ClientAddr;
use crate::error::{ApiError, Overload};
use crate::metrics::{Metrics, Refusal};
use crate::settings::{ApiLimits, QUEUE_WAIT};

/// The shared state of [`enforce`].
#[derive(Debug)]
pub struct RequestLimits {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    queue_wait: Duration,
    timeout: Duration,
    body_read_timeout: Duration,
    clients: Arc<ClientShares>,
    tenants: Arc<TenantShares>,
    metrics: Arc<Metrics>,
}

impl RequestLimits {
    /// Limits from the settings, counting refusals in `metrics`.
    pub fn new(limits: &ApiLimits, metrics: Arc<Metrics>) -> Self {
        let mut l = Self::with(
            limits.max_concurrent_requests,
            QUEUE_WAIT,
            limits.request_timeout,
        );
        l.body_read_timeout = limits.body_deadline();
        l.clients = Arc::new(ClientShares::new(limits.client_share()));
        l.tenants = Arc::new(TenantShares::new(limits.tenant_share(), metrics.clone()));
        l.metrics = metrics;
        l
    }

    /// `max_concurrent` requests at once, waiting up to `queue_wait` for a
    /// slot, each taking up to `timeout`; any one address or tenant may
    /// hold them all.
    pub fn with(max_concurrent: usize, queue_wait: Duration, timeout: Duration) -> Self {
        let metrics = Arc::new(Metrics::new());
        RequestLimits {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            queue_wait,
            timeout,
            body_read_timeout: timeout,
            clients: Arc::new(ClientShares::new(max_concurrent)),
            tenants: Arc::new(TenantShares::new(max_concurrent, metrics.clone())),
            metrics,
        }
    }

    /// The same limits with `share` requests at most per address and per
    /// tenant.
    pub fn with_share(mut self, share: usize) -> Self {
        self.clients = Arc::new(ClientShares::new(share));
        self.tenants = Arc::new(TenantShares::new(share, self.metrics.clone()));
        self
    }

    /// Client addresses with requests in progress or waiting.
    pub fn clients_tracked(&self) -> usize {
        self.clients.tracked()
    }

    /// The 503 of a request refused for load (counted by the caller).
    fn busy(&self, detail: String) -> Response {
        ApiError::Overloaded {
            kind: Overload::Busy,
            detail,
        }
        .into_response()
    }
}

/// Middleware applying [`RequestLimits`] (see the module docs).
pub async fn enforce(
    State(limits): State<Arc<RequestLimits>>,
    request: Request,
    next: Next,
) -> Response {
    if request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    let client = request.extensions().get::<ClientAddr>().map(|c| c.key());
    // Someone not yet known sends the sign-in form: all of it, quickly,
    // before anything is held for them.
    let mut request = if body::is_sign_in(&request) {
        match body::read_sign_in(request, &limits.metrics).await {
            Ok(r) => r,
            Err(refusal) => return refusal,
        }
    } else {
        request
    };
    let deadline = tokio::time::Instant::now() + limits.queue_wait;
    let _client_share = match client {
        Some(key) => match limits.clients.acquire(key, deadline).await {
            Some(permit) => Some(permit),
            None => {
                if limits.metrics.refused(Refusal::ClientRequests) {
                    tracing::warn!(
                        client = %key,
                        share = limits.clients.share(),
                        "request refused: the client address holds its share of the request slots"
                    );
                }
                return limits.busy(format!(
                    "this client address has {} requests in progress, the most \
                         [api].max_requests_per_client allows one address, and none finished \
                         within {} ms; nothing was done: retry after Retry-After seconds",
                    limits.clients.share(),
                    limits.queue_wait.as_millis()
                ));
            }
        },
        None => None,
    };
    let slot = match tokio::time::timeout_at(deadline, limits.slots.clone().acquire_owned()).await {
        Ok(Ok(slot)) => slot,
        // Timed out, or the semaphore closed (never done): busy either way.
        _ => {
            if limits.metrics.refused(Refusal::Busy) {
                tracing::warn!(
                    max_concurrent_requests = limits.max_concurrent,
                    "request refused: every request slot is taken"
                );
            }
            return limits.busy(
                format!(
                    "{} requests are in progress, the most [api].max_concurrent_requests allows, \
                     and none finished within {} ms; nothing was done: retry after Retry-After seconds",
                    limits.max_concurrent,
                    limits.queue_wait.as_millis()
                ),
            );
        }
    };
    let admission = TenantAdmission::new(limits.tenants.clone());
    request.extensions_mut().insert(admission.clone());
    let (read_timeout, metrics) = (limits.body_read_timeout, limits.metrics.clone());
    let request = request.map(|b| Body::new(body::TimedBody::new(b, read_timeout, metrics)));
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = match tokio::time::timeout(limits.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(
                %method,
                path = %clean_str(&path, Lines::Escape, 256),
                timeout_ms = limits.timeout.as_millis() as u64,
                "request stopped: it took longer than [api].request_timeout"
            );
            ApiError::Overloaded {
                kind: Overload::Timeout,
                detail: format!(
                    "the request took longer than [api].request_timeout ({} s) and was stopped; \
                     work it had committed stays done. Retry (a POST with the same Idempotency-Key \
                     is safe to retry; its key is free again after a minute), or narrow the request",
                    limits.timeout.as_secs_f64()
                ),
            }
            .into_response()
        }
    };
    admission.release();
    drop(slot);
    response
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;

    /// A router whose `/hold` waits until `release` fires, `/slow` sleeps a
    /// minute and `/healthz` answers at once.
    fn app(limits: RequestLimits, release: tokio::sync::watch::Receiver<bool>) -> Router {
        app_with(Arc::new(limits), release)
    }

    fn app_with(limits: Arc<RequestLimits>, release: tokio::sync::watch::Receiver<bool>) -> Router {
        let hold = move || {
            let mut release = release.clone();
            async move {
                let _ = release.wait_for(|open| *open).await;
                "held"
            }
        };
        Router::new()
            .route("/hold", get(hold))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    "slow"
                }),
            )
            .route("/healthz", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(limits, enforce))
    }

    async fn call(app: &Router, path: &str) -> (u16, Option<String>, serde_json::Value) {
        call_from(app, path, None).await
    }

    /// A request from `client`, as [`crate::edge`] marks it.
    async fn call_from(
        app: &Router,
        path: &str,
        client: Option<&str>,
    ) -> (u16, Option<String>, serde_json::Value) {
        let mut request = Request::get(path).body(Body::empty()).unwrap();
        if let Some(ip) = client {
            request
                .extensions_mut()
                .insert(ClientAddr(ip.parse().unwrap()));
        }
        let response = app.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let retry = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, retry, body)
    }

    #[tokio::test]
    async fn a_slow_request_is_stopped_with_a_503() {
        let (_release, gate) = tokio::sync::watch::channel(false);
        let app = app(
            RequestLimits::with(4, Duration::from_secs(1), Duration::from_millis(100)),
            gate,
        );
        let started = std::time::Instant::now();
        let (status, retry, body) = call(&app, "/slow").await;
        assert!(started.elapsed() < Duration::from_secs(30));
        assert_eq!((status, retry.as_deref()), (503, Some("1")));
        assert_eq!(body["type"], "urn:walhook:problem:timeout");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("[api].request_timeout"),
            "{body}"
        );
    }

    /// Spawns `/hold` and returns once it holds the only slot.
    async fn hold_the_slot(
        app: &Router,
        limits: &RequestLimits,
    ) -> tokio::task::JoinHandle<(u16, Option<String>, serde_json::Value)> {
        let held = tokio::spawn({
            let app = app.clone();
            async move { call(&app, "/hold").await }
        });
        while limits.slots.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        held
    }

    #[tokio::test]
    async fn requests_beyond_the_limit_wait_briefly_then_get_a_503() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let limits = Arc::new(RequestLimits::with(
            1,
            Duration::from_millis(100),
            Duration::from_secs(60),
        ));
        let app = app_with(limits.clone(), gate);
        let first = hold_the_slot(&app, &limits).await;
        let (status, retry, body) = call(&app, "/hold").await;
        assert_eq!((status, retry.as_deref()), (503, Some("1")));
        assert_eq!(body["type"], "urn:walhook:problem:busy");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("[api].max_concurrent_requests"),
            "{body}"
        );
        // Liveness answers while every slot is taken.
        assert_eq!(call(&app, "/healthz").await.0, 200);
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().0, 200);
        assert_eq!(call(&app, "/hold").await.0, 200);
    }

    #[tokio::test]
    async fn a_request_waiting_for_a_slot_gets_it_when_one_frees() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let limits = Arc::new(RequestLimits::with(
            1,
            Duration::from_secs(30),
            Duration::from_secs(60),
        ));
        let app = app_with(limits.clone(), gate);
        let first = hold_the_slot(&app, &limits).await;
        let queued = tokio::spawn({
            let app = app.clone();
            async move { call(&app, "/hold").await }
        });
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().0, 200);
        assert_eq!(queued.await.unwrap().0, 200);
    }

    #[tokio::test]
    async fn one_address_waits_behind_its_share_while_others_get_slots() {
        let (release, gate) = tokio::sync::watch::channel(false);
        let limits = Arc::new(
            RequestLimits::with(4, Duration::from_millis(100), Duration::from_secs(60))
                .with_share(2),
        );
        let app = app_with(limits.clone(), gate);
        let spawn_from = |client: &'static str| {
            let app = app.clone();
            tokio::spawn(async move { call_from(&app, "/hold", Some(client)).await })
        };
        let held = [spawn_from("192.0.2.1"), spawn_from("192.0.2.1")];
        while limits.slots.available_permits() > 2 {
            tokio::task::yield_now().await;
        }
        // A third from the same address: its share is taken, slots are not.
        let (status, retry, body) = call_from(&app, "/hold", Some("192.0.2.1")).await;
        assert_eq!((status, retry.as_deref()), (503, Some("1")));
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("[api].max_requests_per_client"),
            "{body}"
        );
        assert_eq!(limits.metrics.refusals(Refusal::ClientRequests), 1);
        // Another address gets a slot at once.
        let other = spawn_from("192.0.2.2");
        while limits.slots.available_permits() > 1 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        for h in held {
            assert_eq!(h.await.unwrap().0, 200);
        }
        assert_eq!(other.await.unwrap().0, 200);
        assert_eq!(limits.clients_tracked(), 0);
    }
}
