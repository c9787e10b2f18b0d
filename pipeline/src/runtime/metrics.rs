//! How a process's roles feed the metrics registry (the API's, or a stage
//! process's own).
//!
//! ```text
//!  Dispatcher ──AttemptObserver──▶ MetricsObserver (crate::metrics)
//!  Counters (capture, fan-out, dispatch atomics) ◀── read at scrape by PipelineCollector
//!  capture observer ──▶ capture lag, slot lag (runtime/capture.rs)
//! ```

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::Counters;
use crate::endpoint::SubscriptionCache;
use crate::metrics::{PipelineMetrics, names};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The registry of a stage process on its own (`walhook capture`,
/// `fanout`, `dispatch` with `--metrics-listen`): the pipeline's metrics and
/// the collectors over its counters, none of the API's (its requests, and
/// the SQL gauges that the API's `/metrics` reads for the whole platform).
pub struct StageMetrics {
    registry: parking_lot::Mutex<Registry>,
    /// Fed by the stages in this process.
    pub pipeline: Arc<PipelineMetrics>,
}

impl std::fmt::Debug for StageMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageMetrics").finish_non_exhaustive()
    }
}

impl Default for StageMetrics {
    /// A registry with the pipeline's metrics.
    fn default() -> Self {
        let mut registry = Registry::default();
        let pipeline = Arc::new(PipelineMetrics::default());
        pipeline.register(&mut registry);
        StageMetrics {
            registry: parking_lot::Mutex::new(registry),
            pipeline,
        }
    }
}

impl StageMetrics {
    /// Adds a collector read at every scrape.
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry.lock().register_collector(collector);
    }

    /// Every metric in the text exposition format.
    pub fn render(&self) -> String {
        crate::metrics::encode(&self.registry.lock())
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
            type Read = fn(&crate::membership::MembershipCounters) -> u64;
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
