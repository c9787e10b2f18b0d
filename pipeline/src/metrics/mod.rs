//! What the pipeline's stages feed as they work, for Prometheus: attempt
//! outcomes by class, commit-to-first-attempt latency, capture and log lag.
//! The REST crate serves them at `/metrics`, and so does a stage process on
//! its own (`--metrics-listen`); both register [`PipelineMetrics`] in their
//! registry, so the series are the same wherever a stage runs.
//!
//! Names are the constants of [`names`]; counters get `_total` when encoded.
//! Tenant and endpoint labels are the first [`MAX_LABELLED`] seen, then
//! [`OTHER`], so a platform with many tenants keeps a bounded label set.

use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub mod names;
mod observer;

pub use observer::MetricsObserver;

/// Every metric of `registry` in the text exposition format; a metric that
/// cannot be encoded is logged, and the page holds what came before it.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::error!(error = %e, "metrics: cannot encode");
    }
    out
}

/// A family of histograms built by a function (their buckets).
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Labels of attempts.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `auto` (the schedule) or `manual` (a replay).
    pub trigger: String,
    /// `succeeded`, `retryable`, `rejected`, `gone`.
    pub outcome: String,
    /// The error class (`http_5xx`, `timeout`, …), `none` on success.
    pub class: String,
}

/// How many endpoints (and tenants) get series of their own; later ones
/// are counted as `other`, so a platform with many endpoints keeps a
/// bounded label set.
pub const MAX_LABELLED: usize = 100;

/// The label value for what is past [`MAX_LABELLED`].
pub const OTHER: &str = "other";

/// A status class label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusClassLabel {
    /// `2xx`, `3xx`, `4xx`, `5xx` or `none`.
    pub status_class: String,
}

/// Labels of a consumer group's lag on one partition of the log.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LogLagLabels {
    /// The topic.
    pub topic: String,
    /// The partition number.
    pub partition: String,
    /// The consumer group.
    pub group: String,
}

/// Labels of per-endpoint attempts.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// The endpoint (`ep_…`) or `other`.
    pub endpoint_id: String,
    /// `2xx` … `5xx`, `none`.
    pub status_class: String,
}

/// Labels of per-tenant series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// The tenant or `other`.
    pub tenant_id: String,
    /// What is counted: a trigger, a final state or a limit.
    pub kind: String,
}

/// A tenant label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant or `other`.
    pub tenant_id: String,
}

/// An outcome label.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// The outcome.
    pub outcome: String,
}

/// The first [`MAX_LABELLED`] values seen keep their own label; the rest are
/// [`OTHER`].
#[derive(Debug, Default)]
pub struct Bounded(Mutex<std::collections::HashSet<String>>);

impl Bounded {
    /// The label for `value`.
    pub fn label(&self, value: &str) -> String {
        let mut seen = self.0.lock();
        if seen.contains(value) || seen.len() < MAX_LABELLED {
            seen.insert(value.to_owned());
            value.to_owned()
        } else {
            OTHER.to_owned()
        }
    }
}

fn attempts_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 50.0])
}

/// What the pipeline feeds as it works.
#[derive(Debug)]
pub struct PipelineMetrics {
    /// Attempts by outcome and class.
    pub attempts: Family<AttemptLabels, Counter>,
    /// Commit to first attempt, seconds.
    pub first_attempt_latency: Histogram,
    /// Commit to the end of the successful attempt, seconds.
    pub success_latency: Histogram,
    /// The number of the attempt that succeeded.
    pub attempts_to_success: Histogram,
    /// Commit to capture, seconds, for the last transaction read.
    pub capture_lag: Gauge<f64, AtomicU64>,
    /// WAL the slot retains, bytes.
    pub slot_lag_bytes: Gauge,
    /// Commit to fan-out durable, seconds.
    pub fanout_latency: Histogram,
    /// Attempts by status class.
    pub attempts_by_status_class: Family<StatusClassLabel, Counter>,
    /// Attempts by endpoint (bounded) and status class.
    pub endpoint_attempts: Family<EndpointLabels, Counter>,
    /// Attempts by tenant (bounded) and trigger.
    pub tenant_attempts: Family<TenantLabels, Counter>,
    /// Deliveries ended by tenant and final state.
    pub tenant_ended: Family<TenantLabels, Counter>,
    /// Automatic attempts per ended delivery, by tenant.
    pub tenant_attempts_per_delivery: HistogramFamily<TenantLabel>,
    /// Waits for limits by tenant and limit.
    pub throttled: Family<TenantLabels, Counter>,
    /// Replays by outcome.
    pub replays: Family<OutcomeLabel, Counter>,
    /// Attempts of unknown outcome.
    pub unknown_outcomes: Counter,
    /// Attempts after one of unknown outcome.
    pub attempts_after_unknown: Counter,
    /// Which endpoints have labels of their own.
    pub endpoints_labelled: Bounded,
    /// Which tenants have labels of their own.
    pub tenants_labelled: Bounded,
    /// Seconds the log's cluster has not answered (0 while it answers;
    /// Fluvio only).
    pub log_unreachable_seconds: Gauge<f64, AtomicU64>,
    /// Records stored after each consumer group's committed position, per
    /// partition of the log (Fluvio only).
    pub log_consumer_lag: Family<LogLagLabels, Gauge>,
    /// Seconds the oldest unread record of each consumer group has waited,
    /// per partition of the log (Fluvio only).
    pub log_oldest_unread_age: Family<LogLagLabels, Gauge<f64, AtomicU64>>,
    /// Why `/healthz` of a stage process fails, while it does (the log's
    /// cluster has not answered for some seconds).
    pub log_problem: Mutex<Option<String>>,
}

impl Default for PipelineMetrics {
    fn default() -> Self {
        PipelineMetrics {
            attempts: Family::default(),
            // 5 ms to about 82 s: the SLO is 10 s at the 99th percentile.
            first_attempt_latency: Histogram::new(exponential_buckets(0.005, 2.0, 15)),
            // 10 ms to about 40 h: retries run up to the 24 h deadline.
            success_latency: Histogram::new(exponential_buckets(0.01, 3.0, 16)),
            attempts_to_success: Histogram::new([
                1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0,
            ]),
            capture_lag: Gauge::default(),
            slot_lag_bytes: Gauge::default(),
            // 1 ms to about 33 s.
            fanout_latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            attempts_by_status_class: Family::default(),
            endpoint_attempts: Family::default(),
            tenant_attempts: Family::default(),
            tenant_ended: Family::default(),
            tenant_attempts_per_delivery: Family::new_with_constructor(attempts_histogram),
            throttled: Family::default(),
            replays: Family::default(),
            unknown_outcomes: Counter::default(),
            attempts_after_unknown: Counter::default(),
            endpoints_labelled: Bounded::default(),
            tenants_labelled: Bounded::default(),
            log_unreachable_seconds: Gauge::default(),
            log_consumer_lag: Family::default(),
            log_oldest_unread_age: Family::default(),
            log_problem: Mutex::new(None),
        }
    }
}

impl PipelineMetrics {
    /// Registers every metric under its name in [`names`].
    pub fn register(&self, registry: &mut Registry) {
        use names::*;
        registry.register(
            DISPATCH_ATTEMPTS,
            "Attempts by outcome and error class",
            self.attempts.clone(),
        );
        registry.register(
            DISPATCH_FIRST_ATTEMPT_LATENCY,
            "Seconds from the event's commit to the start of its delivery's first attempt",
            self.first_attempt_latency.clone(),
        );
        registry.register(
            DISPATCH_SUCCESS_LATENCY,
            "Seconds from the event's commit to the end of the attempt that succeeded",
            self.success_latency.clone(),
        );
        registry.register(
            DISPATCH_ATTEMPTS_TO_SUCCESS,
            "The number of the attempt that succeeded (1 = the first try)",
            self.attempts_to_success.clone(),
        );
        registry.register(
            CAPTURE_LAG,
            "Seconds from commit to capture for the last transaction read",
            self.capture_lag.clone(),
        );
        registry.register(
            LOG_CONSUMER_LAG,
            "Records stored after a consumer group's committed position, by topic and partition (Fluvio only)",
            self.log_consumer_lag.clone(),
        );
        registry.register(
            LOG_OLDEST_UNREAD_AGE,
            "Seconds the oldest record a consumer group has not read has waited since it was produced, \
             0 when caught up, by topic and partition (Fluvio only)",
            self.log_oldest_unread_age.clone(),
        );
        registry.register(
            LOG_UNREACHABLE,
            "Seconds the log's cluster has not answered (0 while it answers; Fluvio only)",
            self.log_unreachable_seconds.clone(),
        );
        registry.register(
            CAPTURE_SLOT_LAG,
            "WAL the replication slot retains, in bytes",
            self.slot_lag_bytes.clone(),
        );
        registry.register(
            FANOUT_LATENCY,
            "Seconds from an event's commit to its deliveries being durable",
            self.fanout_latency.clone(),
        );
        registry.register(
            DISPATCH_ATTEMPTS_BY_STATUS_CLASS,
            "Attempts by HTTP status class (none: no response)",
            self.attempts_by_status_class.clone(),
        );
        registry.register(
            ENDPOINT_ATTEMPTS,
            "Attempts by endpoint (the first 100 seen; later ones as other) and status class",
            self.endpoint_attempts.clone(),
        );
        registry.register(
            TENANT_ATTEMPTS,
            "Attempts by tenant (the first 100 seen; later ones as other) and trigger (kind)",
            self.tenant_attempts.clone(),
        );
        registry.register(
            TENANT_DELIVERIES_ENDED,
            "Deliveries that reached a final state, by tenant and state (kind)",
            self.tenant_ended.clone(),
        );
        registry.register(
            TENANT_ATTEMPTS_PER_DELIVERY,
            "Automatic attempts per delivery that ended (retry amplification), by tenant",
            self.tenant_attempts_per_delivery.clone(),
        );
        registry.register(
            DISPATCH_THROTTLED,
            "Times a ready delivery waited for a limit, by tenant and limit (kind)",
            self.throttled.clone(),
        );
        registry.register(
            DISPATCH_REPLAYS,
            "Replays by outcome (succeeded, failed, refused)",
            self.replays.clone(),
        );
        registry.register(
            DISPATCH_UNKNOWN_OUTCOMES,
            "Attempts whose outcome nobody knows (the receiver may have had them)",
            self.unknown_outcomes.clone(),
        );
        registry.register(
            DISPATCH_ATTEMPTS_AFTER_UNKNOWN,
            "Attempts sent after one of unknown outcome: possible duplicates, same webhook-id",
            self.attempts_after_unknown.clone(),
        );
    }

    /// Counts one attempt.
    pub fn attempt(
        &self,
        trigger: crate::delivery::Trigger,
        outcome: crate::delivery::OutcomeKind,
        class: Option<crate::dispatch::outcome::ErrorClass>,
    ) {
        self.attempts
            .get_or_create(&AttemptLabels {
                trigger: trigger.as_str().to_owned(),
                outcome: outcome.as_str().to_owned(),
                class: class.map_or("none", |c| c.as_str()).to_owned(),
            })
            .inc();
    }
}
