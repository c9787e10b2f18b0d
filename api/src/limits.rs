//! Request limits: how many requests run at once and how long each may
//! take.
//!
//! ```text
//!  request ─▶ free slot? ──yes──▶ handler, within request_timeout ──▶ response
//!                │                        └─ too slow ─▶ 503 timeout (Retry-After: 1)
//!                └─ no: wait up to QUEUE_WAIT ─▶ slot ─▶ handler …
//!                                   └─ still none ─▶ 503 busy (Retry-After: 1)
//! ```
//!
//! Together with the API's own small pool and `statement_timeout`, this
//! bounds what the API can take from the process and the database: a flood
//! of requests waits briefly, then is told to come back, instead of queueing
//! without end on the pool. `/healthz` is exempt: a liveness probe must
//! answer while the server is busy, and it touches nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;
use walhook_pipeline::sanitize::{Lines, clean_str};

use crate::error::{ApiError, Overload};
use crate::settings::{ApiLimits, QUEUE_WAIT};

/// The shared state of [`enforce`].
#[derive(Debug)]
pub struct RequestLimits {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    queue_wait: Duration,
    timeout: Duration,
}

impl RequestLimits {
    /// Limits from the settings.
    pub fn new(limits: &ApiLimits) -> Self {
        Self::with(
            limits.max_concurrent_requests,
            QUEUE_WAIT,
            limits.request_timeout,
        )
    }

    /// `max_concurrent` requests at once, waiting up to `queue_wait` for a
    /// slot, each taking up to `timeout`.
    pub fn with(max_concurrent: usize, queue_wait: Duration, timeout: Duration) -> Self {
        RequestLimits {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            queue_wait,
            timeout,
        }
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
    let slot = match tokio::time::timeout(limits.queue_wait, limits.slots.clone().acquire_owned())
        .await
    {
        Ok(Ok(slot)) => slot,
        // Timed out, or the semaphore closed (never done): busy either way.
        _ => {
            tracing::warn!(
                max_concurrent_requests = limits.max_concurrent,
                "request refused: every request slot is taken"
            );
            return ApiError::Overloaded {
                    kind: Overload::Busy,
                    detail: format!(
                        "{} requests are in progress, the most [api].max_concurrent_requests allows, \
                         and none finished within {} ms; nothing was done: retry after Retry-After seconds",
                        limits.max_concurrent,
                        limits.queue_wait.as_millis()
                    ),
                }
                .into_response();
        }
    };
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
        let response = app
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
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
}
