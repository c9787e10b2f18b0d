//! How the pipeline in this process feeds the API's metrics registry.
//!
//! ```text
//!  Dispatcher ──Outbound──▶ MeteredEgress ──▶ HttpEgress
//!                               └─▶ attempts by outcome/class, commit→first-attempt latency
//!  Counters (capture, fan-out, dispatch atomics) ◀── read at scrape by PipelineCollector
//!  capture observer ──▶ capture lag, slot lag (in pipeline.rs)
//! ```
//!
//! The egress wrapper sees every attempt without touching dispatch: the
//! attempt number is the `walhook-attempt` header (manual attempts are
//! numbered from 1,000,001, so only automatic first attempts count), and
//! the commit time is the envelope's top-level `occurred_at`. The envelope
//! is canonical JSON whose top-level keys come after `data`, and quotes
//! inside strings are escaped, so the last `"occurred_at":"` in the body is
//! the top-level one.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use walhook_api::metrics::{PipelineMetrics, names};
use walhook_pipeline::dispatch::egress::{Egress, EgressResult, Outbound};
use walhook_pipeline::dispatch::outcome::ErrorClass;

use crate::pipeline::Counters;

/// An egress that reports every attempt to [`PipelineMetrics`].
#[derive(Debug)]
pub struct MeteredEgress<E> {
    inner: E,
    metrics: Option<Arc<PipelineMetrics>>,
}

impl<E> MeteredEgress<E> {
    /// Wraps `inner`; without metrics it only forwards.
    pub fn new(inner: E, metrics: Option<Arc<PipelineMetrics>>) -> Self {
        MeteredEgress { inner, metrics }
    }
}

/// The envelope's commit time, in seconds since 1970.
fn occurred_at(body: &[u8]) -> Option<f64> {
    const KEY: &[u8] = b"\"occurred_at\":\"";
    let start = body.windows(KEY.len()).rposition(|w| w == KEY)? + KEY.len();
    let len = body[start..].iter().position(|&b| b == b'"')?;
    let text = std::str::from_utf8(&body[start..start + len]).ok()?;
    let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    Some(t.timestamp_micros() as f64 / 1e6)
}

/// The attempt's number (`walhook-attempt`, from 1).
fn attempt_number(request: &Outbound) -> Option<u32> {
    request
        .headers
        .iter()
        .find(|(name, _)| *name == "walhook-attempt")
        .and_then(|(_, value)| value.parse().ok())
}

fn now_seconds() -> f64 {
    chrono::Utc::now().timestamp_micros() as f64 / 1e6
}

impl<E: Egress> Egress for MeteredEgress<E> {
    async fn send(&self, request: Outbound) -> EgressResult {
        let Some(metrics) = &self.metrics else {
            return self.inner.send(request).await;
        };
        let number = attempt_number(&request);
        let committed = occurred_at(&request.body);
        if let (Some(1), Some(at)) = (number, committed) {
            metrics
                .first_attempt_latency
                .observe((now_seconds() - at).max(0.0));
        }
        let result = self.inner.send(request).await;
        metrics.attempt(
            result.outcome.name(),
            result.outcome.error_class().map(ErrorClass::as_str),
        );
        if result.outcome.is_success() {
            if let Some(n) = number {
                metrics.attempts_to_success.observe(f64::from(n));
            }
            if let Some(at) = committed {
                metrics
                    .success_latency
                    .observe((now_seconds() - at).max(0.0));
            }
        }
        result
    }
}

/// The pipeline's atomic counters, read at every scrape.
#[derive(Debug)]
pub struct PipelineCollector {
    counters: Arc<Counters>,
}

impl PipelineCollector {
    /// A collector over `counters`.
    pub fn new(counters: Arc<Counters>) -> Self {
        PipelineCollector { counters }
    }
}

impl Collector for PipelineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.counters;
        let values = [
            (
                names::CAPTURE_TRANSACTIONS,
                "Transactions capture read",
                c.capture.transactions.load(Relaxed),
            ),
            (
                names::CAPTURE_CHANGES,
                "Row changes capture read",
                c.capture.changes.load(Relaxed),
            ),
            (
                names::CAPTURE_EVENTS,
                "Events capture made",
                c.capture.events.load(Relaxed),
            ),
            (
                names::CAPTURE_INCIDENTS,
                "Changes that did not become events (stored as incidents)",
                c.capture.incidents.load(Relaxed),
            ),
            (
                names::FANOUT_EVENTS,
                "Events fan-out processed",
                c.fanout.events.load(Relaxed),
            ),
            (
                names::FANOUT_DELIVERIES,
                "Deliveries fan-out made",
                c.fanout.deliveries.load(Relaxed),
            ),
            (
                names::DISPATCH_SUCCEEDED,
                "Deliveries that succeeded",
                c.dispatch.succeeded.load(Relaxed),
            ),
            (
                names::DISPATCH_FAILED,
                "Deliveries that failed permanently or ran out of retries",
                c.dispatch.failed.load(Relaxed),
            ),
            (
                names::DISPATCH_STALE,
                "Attempt results not recorded because the lease had moved on",
                c.dispatch.stale.load(Relaxed),
            ),
            (
                names::DISPATCH_RETRIES,
                "Automatic retries made",
                c.dispatch.retries.load(Relaxed),
            ),
            (
                names::DISPATCH_MANUAL_ATTEMPTS,
                "Manual attempts (replays) made",
                c.dispatch.manual.load(Relaxed),
            ),
            (
                names::DISPATCH_CIRCUITS_OPENED,
                "Endpoint circuits opened",
                c.dispatch.circuits_opened.load(Relaxed),
            ),
            (
                names::DISPATCH_ENDPOINTS_DISABLED,
                "Endpoints disabled by dispatch (410 Gone, or failing too long)",
                c.dispatch.endpoints_disabled.load(Relaxed),
            ),
        ];
        for (name, help, value) in values {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_top_level_commit_time() {
        let body = br#"{"data":{"occurred_at":"1999-01-01T00:00:00Z","x":"\"occurred_at\":\"2000"},"id":"evt_1","occurred_at":"2026-11-29T10:11:44.512345Z","type":"a.b"}"#;
        let t = occurred_at(body).unwrap();
        assert!((t - 1_795_947_104.512_345).abs() < 1e-6, "{t}");
        assert_eq!(occurred_at(b"{}"), None);
    }
}
