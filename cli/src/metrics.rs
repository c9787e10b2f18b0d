//! How the pipeline in this process feeds the API's metrics registry.
//!
//! ```text
//!  Dispatcher ──AttemptObserver──▶ MetricsObserver ──▶ attempts by trigger/outcome/class,
//!                                                      commit→first-attempt and success latency
//!  Counters (capture, fan-out, dispatch atomics) ◀── read at scrape by PipelineCollector
//!  capture observer ──▶ capture lag, slot lag (in pipeline.rs)
//! ```
//!
//! The dispatcher says which attempt it is (its trigger, its number, and
//! whether it is the delivery's first automatic one), so a replay is never
//! counted as a first attempt and nothing re-parses headers or bodies.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use walhook_api::metrics::{
    EndpointLabels, OutcomeLabel, PipelineMetrics, StatusClassLabel, TenantLabel, TenantLabels,
    names,
};
use walhook_pipeline::delivery::{DeliveryJob, DeliveryStatus, Trigger};
use walhook_pipeline::dispatch::observe::{AttemptObserver, AttemptSeen, Throttle};
use walhook_pipeline::dispatch::outcome::{AttemptOutcome, ErrorClass};
use walhook_pipeline::endpoint::SubscriptionCache;
use walhook_pipeline::ids::TenantId;
use walhook_pipeline::time::Timestamp;

use crate::pipeline::Counters;

/// Feeds [`PipelineMetrics`] from the dispatcher's attempts.
#[derive(Debug)]
pub struct MetricsObserver {
    metrics: Arc<PipelineMetrics>,
}

impl MetricsObserver {
    /// An observer feeding `metrics`.
    pub fn new(metrics: Arc<PipelineMetrics>) -> Self {
        MetricsObserver { metrics }
    }
}

/// `2xx` … `5xx`, or `none` without a response.
fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        Some(_) => "other",
        None => "none",
    }
}

impl AttemptObserver for MetricsObserver {
    fn fanned_out(&self, occurred_at: Timestamp, at: Timestamp) {
        self.metrics
            .fanout_latency
            .observe(at.since(occurred_at).as_secs_f64());
    }

    fn ended(&self, job: &DeliveryJob, status: DeliveryStatus, attempts: u32) {
        let m = &self.metrics;
        let tenant = m.tenants_labelled.label(job.tenant_id.as_str());
        m.tenant_ended
            .get_or_create(&TenantLabels {
                tenant_id: tenant.clone(),
                kind: status.as_str().to_owned(),
            })
            .inc();
        m.tenant_attempts_per_delivery
            .get_or_create(&TenantLabel { tenant_id: tenant })
            .observe(f64::from(attempts));
    }

    fn throttled(&self, tenant: &TenantId, limit: Throttle, times: u64) {
        let m = &self.metrics;
        m.throttled
            .get_or_create(&TenantLabels {
                tenant_id: m.tenants_labelled.label(tenant.as_str()),
                kind: limit.as_str().to_owned(),
            })
            .inc_by(times);
    }

    fn replay_refused(&self, _job: &DeliveryJob) {
        self.metrics
            .replays
            .get_or_create(&OutcomeLabel {
                outcome: "refused".into(),
            })
            .inc();
    }

    fn started(&self, a: &AttemptSeen<'_>) {
        if a.job.after_unknown {
            self.metrics.attempts_after_unknown.inc();
        }
        if a.first {
            let latency = a.started_at.since(a.job.event_occurred_at);
            self.metrics
                .first_attempt_latency
                .observe(latency.as_secs_f64());
        }
    }

    fn finished(&self, a: &AttemptSeen<'_>, outcome: &AttemptOutcome, finished_at: Timestamp) {
        let m = &self.metrics;
        m.attempt(
            a.trigger.as_str(),
            outcome.name(),
            outcome.error_class().map(ErrorClass::as_str),
        );
        let class = status_class(outcome.status());
        m.attempts_by_status_class
            .get_or_create(&StatusClassLabel {
                status_class: class.into(),
            })
            .inc();
        m.endpoint_attempts
            .get_or_create(&EndpointLabels {
                endpoint_id: m.endpoints_labelled.label(&a.job.endpoint_id.to_string()),
                status_class: class.into(),
            })
            .inc();
        m.tenant_attempts
            .get_or_create(&TenantLabels {
                tenant_id: m.tenants_labelled.label(a.job.tenant_id.as_str()),
                kind: a.trigger.as_str().into(),
            })
            .inc();
        if outcome.error_class() == Some(ErrorClass::Shutdown) {
            m.unknown_outcomes.inc();
        }
        if a.trigger == Trigger::Manual {
            m.replays
                .get_or_create(&OutcomeLabel {
                    outcome: if outcome.is_success() {
                        "succeeded"
                    } else {
                        "failed"
                    }
                    .into(),
                })
                .inc();
        }
        if outcome.is_success() && a.trigger == Trigger::Auto {
            self.metrics
                .attempts_to_success
                .observe(f64::from(a.number));
            let latency = finished_at.since(a.job.event_occurred_at);
            self.metrics.success_latency.observe(latency.as_secs_f64());
        }
    }
}

/// The pipeline's atomic counters and the directory's quarantine count,
/// read at every scrape.
#[derive(Debug)]
pub struct PipelineCollector {
    counters: Arc<Counters>,
    directory: Arc<SubscriptionCache>,
}

impl PipelineCollector {
    /// A collector over `counters` and `directory`.
    pub fn new(counters: Arc<Counters>, directory: Arc<SubscriptionCache>) -> Self {
        PipelineCollector {
            counters,
            directory,
        }
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
                names::FANOUT_INCIDENTS,
                "Events set aside because the platform database refused them (incidents)",
                c.fanout.incidents.load(Relaxed),
            ),
            (
                names::DISPATCH_UNSTORABLE,
                "Attempt results the platform database refused (incidents; attempted again)",
                c.dispatch.unstorable.load(Relaxed),
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
        let quarantined = ConstGauge::new(self.directory.snapshot().quarantined().count() as i64);
        let metric = encoder.encode_descriptor(
            names::ENDPOINTS_QUARANTINED,
            "Endpoints whose configuration cannot be loaded; their deliveries wait",
            None,
            quarantined.metric_type(),
        )?;
        quarantined.encode(metric)?;
        if !c.memberships.is_empty() {
            let mut metric = encoder.encode_descriptor(
                names::MEMBER_PARTITIONS,
                "Partitions this member holds now, by group and member slot",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for m in &c.memberships {
                let labels = [("group", m.group.clone()), ("member", m.slot.to_string())];
                ConstGauge::new(m.held.load(Relaxed) as i64)
                    .encode(metric.encode_family(&labels)?)?;
            }
            type Read = fn(&walhook_pipeline::membership::MembershipCounters) -> u64;
            let families: [(&str, &str, Read); 2] = [
                (
                    names::MEMBER_ASSIGNMENT_CHANGES,
                    "Partitions this member took, gave back or lost, by group and member slot",
                    |m| m.changes.load(Relaxed),
                ),
                (
                    names::MEMBER_FENCED_COMMITS,
                    "Commits refused because the partition was no longer this member's, by group and member slot",
                    |m| m.fenced.load(Relaxed),
                ),
            ];
            for (name, help, read) in families {
                let mut metric = encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    prometheus_client::metrics::MetricType::Counter,
                )?;
                for m in &c.memberships {
                    let labels = [("group", m.group.clone()), ("member", m.slot.to_string())];
                    ConstCounter::new(read(m)).encode(metric.encode_family(&labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// Serves `GET /metrics` (the metrics of this process: no SQL gauges, which
/// `walhook api` serves once for the deployment) and `GET /healthz` on
/// `listen` until `shutdown`, for the processes without the API: `walhook
/// capture`, `walhook fanout`, `walhook dispatch` (`--metrics-listen`).
/// `/healthz` answers 503 with the reason while the Fluvio cluster has not
/// answered for some seconds (see `pipeline::watch_cluster`).
pub async fn serve_stage_metrics(
    listen: &str,
    metrics: Arc<walhook_api::Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    use anyhow::Context;
    use axum::http::header;
    use axum::response::IntoResponse;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!("cannot listen on --metrics-listen {listen:?}; is the port free?")
        })?;
    let health = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let metrics = metrics.clone();
                async move {
                    let text = metrics.render(None, std::time::Duration::ZERO).await;
                    (
                        [(
                            header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        text,
                    )
                        .into_response()
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(move || {
                let problem = health.pipeline.log_problem.lock().clone();
                async move {
                    match problem {
                        None => (axum::http::StatusCode::OK, "ok".to_owned()),
                        Some(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        );
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "--metrics-listen is not loopback: anyone who can reach it reads tenant and endpoint metrics without a token"
        );
    }
    tracing::info!(%addr, "serving /metrics");
    // Ends at shutdown; a failure before that is logged, and the stages
    // go on (metrics are not worth stopping delivery for).
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use walhook_api::metrics::{MAX_LABELLED, OTHER};
    use walhook_pipeline::event::EventType;
    use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId};

    use super::*;

    fn job(n: u32) -> DeliveryJob {
        let mut id = [0u8; 16];
        id[..4].copy_from_slice(&n.to_be_bytes());
        DeliveryJob {
            delivery_id: DeliveryId(id),
            event_id: EventId(id),
            endpoint_id: EndpointId(id),
            tenant_id: TenantId::new(format!("tenant-{n}")).unwrap(),
            event_type: EventType::new("invoice.paid").unwrap(),
            payload: Default::default(),
            attempt_count: 0,
            manual_attempt_count: 0,
            after_unknown: false,
            materialized: true,
            created_at: Timestamp(0),
            next_attempt_at: Timestamp(0),
            expires_at: Timestamp(i64::MAX),
            lease_version: 1,
            endpoint_config_version: 1,
            event_occurred_at: Timestamp(0),
            schema_version: 1,
            replay: None,
            order: None,
        }
    }

    /// The distinct values of label `name` in `/metrics` text.
    fn values<'t>(text: &'t str, name: &str) -> BTreeSet<&'t str> {
        let key = format!("{name}=\"");
        text.lines()
            .filter_map(|l| l.split(key.as_str()).nth(1)?.split('"').next())
            .collect()
    }

    /// Dispatch feeding 5,000 tenants and endpoints, with every status
    /// class, trigger, final state and limit: the tenant and endpoint
    /// labels stay at the first MAX_LABELLED and `other`, whatever the
    /// ids.
    #[tokio::test]
    async fn tenant_and_endpoint_labels_stay_bounded() {
        let metrics = walhook_api::Metrics::new();
        let observer = MetricsObserver::new(metrics.pipeline.clone());
        let outcomes = [
            AttemptOutcome::Delivered { status: 200 },
            AttemptOutcome::Retryable {
                status: Some(503),
                class: ErrorClass::ServerError,
                retry_after: None,
            },
            AttemptOutcome::Rejected {
                status: Some(404),
                class: ErrorClass::ClientError,
            },
            AttemptOutcome::Gone,
        ];
        for n in 0..5_000u32 {
            let job = job(n);
            let seen = AttemptSeen {
                job: &job,
                trigger: if n % 2 == 0 {
                    Trigger::Auto
                } else {
                    Trigger::Manual
                },
                number: 1,
                first: n % 2 == 0,
                started_at: Timestamp(0),
            };
            observer.started(&seen);
            observer.finished(&seen, &outcomes[n as usize % 4], Timestamp(1));
            observer.ended(&job, DeliveryStatus::Succeeded, 1);
            observer.throttled(&job.tenant_id, Throttle::TenantBudget, 1);
        }
        let text = metrics.render(None, std::time::Duration::ZERO).await;
        let tenants = values(&text, "tenant_id");
        let endpoints = values(&text, "endpoint_id");
        assert_eq!(tenants.len(), MAX_LABELLED + 1, "{tenants:?}");
        assert_eq!(endpoints.len(), MAX_LABELLED + 1);
        assert!(tenants.contains(OTHER) && endpoints.contains(OTHER));
        // Every series of every family, all told.
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        assert!(series < 3_000, "{series} series");
    }
}
