//! How the dispatcher's attempts feed [`PipelineMetrics`].
//!
//! ```text
//!  Dispatcher ──AttemptObserver──▶ MetricsObserver ──▶ attempts by trigger/outcome/class,
//!                                                      commit→first-attempt and success latency
//! ```
//!
//! The dispatcher says which attempt it is (its trigger, its number, and
//! whether it is the delivery's first automatic one), so a replay is never
//! counted as a first attempt and nothing re-parses headers or bodies.

use std::sync::Arc;

use super::{
    EndpointLabels, OutcomeLabel, PipelineMetrics, StatusClassLabel, TenantLabel, TenantLabels,
};
use crate::delivery::{DeliveryJob, DeliveryStatus, Trigger};
use crate::dispatch::observe::{AttemptObserver, AttemptSeen, Throttle};
use crate::dispatch::outcome::{AttemptOutcome, ErrorClass};
use crate::ids::TenantId;
use crate::time::Timestamp;

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
        m.attempt(a.trigger, outcome.kind(), outcome.error_class());
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::ids::EndpointId;
    use crate::metrics::{MAX_LABELLED, OTHER};
    use prometheus_client::registry::Registry;

    use super::*;

    /// Job `n` of tenant `tenant-{n}` to endpoint `n`: every id distinct.
    fn job(n: u32) -> DeliveryJob {
        let mut job = crate::dispatch::scheduler::tests::job(n, 0, &format!("tenant-{n}"), 0);
        job.endpoint_id = EndpointId(job.delivery_id.0);
        job
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
    #[test]
    fn tenant_and_endpoint_labels_stay_bounded() {
        let metrics = Arc::new(PipelineMetrics::default());
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let observer = MetricsObserver::new(metrics);
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
        let text = crate::metrics::encode(&registry);
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
