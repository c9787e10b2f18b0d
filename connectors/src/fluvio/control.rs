//! The runtime's control of a Fluvio log: nothing to close after a failure
//! (receipts resolve when the cluster stored the records; nothing waits for
//! a consumer), and a watch of the cluster that publishes its reachability
//! and every consumer group's lag, and fails once the cluster has been gone
//! for longer than `[log] give_up_after`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use walhook_pipeline::metrics::{LogLagLabels, PipelineMetrics};
use walhook_pipeline::runtime::LogControl;
use walhook_pipeline::supervise::Stopped;

use super::{FluvioLog, Reachability};

impl LogControl for FluvioLog {
    fn close_after_failure(&self) {}

    fn watch(
        &self,
        metrics: Option<Arc<PipelineMetrics>>,
        stop: CancellationToken,
    ) -> Option<BoxFuture<'static, Result<(), Stopped>>> {
        Some(Box::pin(watch_cluster(self.clone(), metrics, stop)))
    }
}

/// How often the log's cluster is probed.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// Failures shorter than this (a blip) leave `/healthz` answering "ok".
const UNHEALTHY_AFTER: Duration = Duration::from_secs(5);

/// Probes the cluster every [`PROBE_EVERY`] (each probe also renews the
/// connection after a failure), publishes how long it has failed
/// (`walhook_log_unreachable_seconds`, and `/healthz` answers 503 after
/// [`UNHEALTHY_AFTER`]) and, while it answers, every consumer group's lag
/// per partition (`walhook_log_consumer_lag`), and fails once it has failed for longer than
/// `[log] give_up_after`: the process then stops with an error naming the
/// cluster, rather than retrying for ever while nothing moves.
async fn watch_cluster(
    log: FluvioLog,
    metrics: Option<Arc<PipelineMetrics>>,
    stop: CancellationToken,
) -> Result<(), Stopped> {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(PROBE_EVERY) => {}
        }
        let probed = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            probed = log.probe() => probed,
        };
        let failing = match log.reachability() {
            Reachability::Answering => None,
            Reachability::Failing { for_, error } => Some((for_, error)),
        };
        if let Some(m) = &metrics {
            m.log_unreachable_seconds
                .set(failing.as_ref().map_or(0.0, |(for_, _)| for_.as_secs_f64()));
            *m.log_problem.lock() = failing.as_ref().and_then(|(for_, error)| {
                (*for_ >= UNHEALTHY_AFTER).then(|| {
                    format!(
                        "the Fluvio cluster at {} has not answered for {} s: {error}",
                        log.endpoint(),
                        for_.as_secs()
                    )
                })
            });
        }
        if let Some(m) = &metrics
            && let Ok(marks) = &probed
            && let Ok(lags) = log.consumer_lag(marks).await
        {
            for l in lags {
                let labels = LogLagLabels {
                    topic: l.topic,
                    partition: l.partition.to_string(),
                    group: l.group,
                };
                m.log_consumer_lag
                    .get_or_create(&labels)
                    .set(i64::try_from(l.lag).unwrap_or(i64::MAX));
                m.log_oldest_unread_age
                    .get_or_create(&labels)
                    .set(l.oldest_unread_age.as_secs_f64());
            }
        }
        if let Some(error) = log.unreachable_past_limit() {
            return Err(Stopped(error));
        }
    }
}
