//! The log as the runtime controls it: closed after a failure, so that
//! nothing waits for receipts that will never come, and, for a cluster
//! outside the process, watched (`walhook_connectors::fluvio` watches
//! Fluvio's reachability and consumer lag).

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::log::Log;
use crate::log::embedded::EmbeddedLog;
use crate::metrics::PipelineMetrics;
use crate::supervise::Stopped;

/// A log the runtime can close after a failure and whose cluster it may
/// watch.
pub trait LogControl: Log {
    /// Fails what waits on the log (receipts, reads) once a task failed.
    fn close_after_failure(&self);

    /// A task that watches the log's cluster until `stop`, failing once the
    /// cluster has not answered for longer than its configured limit;
    /// `None` for a log inside the process.
    fn watch(
        &self,
        _metrics: Option<Arc<PipelineMetrics>>,
        _stop: CancellationToken,
    ) -> Option<BoxFuture<'static, Result<(), Stopped>>> {
        None
    }
}

impl LogControl for EmbeddedLog {
    fn close_after_failure(&self) {
        self.close();
    }
}
