//! Request bodies that cannot hold a slot for long.
//!
//! - The console's sign-in form comes from someone not yet known: it is
//!   read whole, at most [`SIGN_IN_MAX_BODY`] bytes within
//!   [`SIGN_IN_BODY_TIMEOUT`], *before* the request may take a slot
//!   ([`read_sign_in`]). A client trickling it a byte at a time holds a
//!   connection and nothing else, and is cut off after the timeout.
//! - Every other body belongs to a request that authenticates before its
//!   body is read (the handlers' extractors run in that order), and is
//!   read within `[api].body_read_timeout` of the first read
//!   ([`TimedBody`]); past it, the read fails with [`BodyTimedOut`] and the
//!   request is answered 408.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, header};
use axum::response::Response;
use http_body::{Frame, SizeHint};

use crate::metrics::{Metrics, Refusal};

/// The largest sign-in form accepted (a CSRF token and a key or the
/// operator token fit many times over).
pub const SIGN_IN_MAX_BODY: usize = 4 * 1024;

/// How long the sign-in form may take to arrive.
pub const SIGN_IN_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// The route whose body is read before a slot.
pub const SIGN_IN_PATH: &str = "/console/login";

/// A body read that took longer than allowed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// Whether `e` (a body-read rejection, at any depth) is a [`BodyTimedOut`].
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(cause) = next {
        if cause.is::<BodyTimedOut>() {
            return true;
        }
        next = cause.source();
    }
    false
}

/// Whether `request` is a sign-in whose body is read before a slot.
pub(crate) fn is_sign_in(request: &Request) -> bool {
    request.method() == Method::POST && request.uri().path() == SIGN_IN_PATH
}

/// Reads the sign-in form whole (see the module docs): the request with
/// its body in memory, or the page refusing it.
pub(crate) async fn read_sign_in(request: Request, metrics: &Metrics) -> Result<Request, Response> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > SIGN_IN_MAX_BODY as u64) {
        if metrics.refused(Refusal::SignInBody) {
            tracing::info!(
                max_bytes = SIGN_IN_MAX_BODY,
                "sign-in refused: its form is larger than allowed"
            );
        }
        return Err(crate::console::too_large_form(SIGN_IN_MAX_BODY));
    }
    let (parts, body) = request.into_parts();
    let read = axum::body::to_bytes(body, SIGN_IN_MAX_BODY);
    match tokio::time::timeout(SIGN_IN_BODY_TIMEOUT, read).await {
        Ok(Ok(bytes)) => Ok(Request::from_parts(parts, Body::from(bytes))),
        Ok(Err(_)) => {
            // Longer than the cap (chunked), or cut off by the client.
            if metrics.refused(Refusal::SignInBody) {
                tracing::info!(
                    max_bytes = SIGN_IN_MAX_BODY,
                    "sign-in refused: its form is larger than allowed, or was cut off"
                );
            }
            Err(crate::console::too_large_form(SIGN_IN_MAX_BODY))
        }
        Err(_) => {
            if metrics.refused(Refusal::SignInBody) {
                tracing::info!(
                    timeout_ms = SIGN_IN_BODY_TIMEOUT.as_millis() as u64,
                    "sign-in refused: its form did not arrive in time"
                );
            }
            Err(crate::console::too_slow_form())
        }
    }
}

/// A body that must arrive within a time from its first read.
pub(crate) struct TimedBody {
    inner: Body,
    limit: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    metrics: Arc<Metrics>,
    expired: bool,
}

impl TimedBody {
    pub(crate) fn new(inner: Body, limit: Duration, metrics: Arc<Metrics>) -> Self {
        TimedBody {
            inner,
            limit,
            deadline: None,
            metrics,
            expired: false,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(this.limit)))));
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let limit = this.limit;
        let deadline = this
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.expired = true;
                if this.metrics.refused(Refusal::BodyTimeout) {
                    tracing::info!(
                        timeout_ms = limit.as_millis() as u64,
                        "request body refused: it did not arrive within [api].body_read_timeout"
                    );
                }
                Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut(limit)))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_fails_after_the_limit() {
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let metrics = Arc::new(Metrics::new());
        let body = Body::new(TimedBody::new(
            Body::from_stream(rx),
            Duration::from_secs(10),
            metrics.clone(),
        ));
        let trickle = tokio::spawn(async move {
            use futures::SinkExt;
            for _ in 0..100 {
                if tx.send(Ok(Bytes::from_static(b"x"))).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let started = tokio::time::Instant::now();
        let e = axum::body::to_bytes(body, 1 << 20).await.unwrap_err();
        assert!(is_body_timeout(&e), "{e:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(metrics.refusals(Refusal::BodyTimeout), 1);
        trickle.abort();
        // A body that arrives in time is read as it is.
        let body = Body::new(TimedBody::new(
            Body::from("whole"),
            Duration::from_secs(10),
            metrics,
        ));
        assert_eq!(axum::body::to_bytes(body, 100).await.unwrap(), "whole");
    }
}
