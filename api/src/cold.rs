//! Archived history as the API reads it: on threads of its own, the store
//! counted as it is read (for `/metrics`), and the 429 of a tenant over its
//! archive reads at once.
//!
//! ```text
//!  request (API workers) ── hot rows ──▶ Postgres
//!        │ archive read: ColdPool::run ──▶ walhook-cold threads (half the cores)
//!        │                                  manifests, footers, pages, Parquet decoding
//!        ◀──────────── records ─────────────┘
//! ```
//!
//! Decoding Parquet is CPU work: on the API's own workers, four reads of
//! one tenant would hold both cores of a small machine and every other
//! tenant's request would wait behind them. On a pool of their own the
//! archive reads of all tenants share at most half the cores, at a lower
//! CPU priority ([`COLD_NICE`]), and the workers that answer hot requests
//! stay free. A read handed to the pool
//! keeps its tenant's read slot until it ends, even when the request that
//! asked for it has gone.
//!
//! What a request may take from the archive is decided in
//! [`walhook_archive::cold`]: days and bytes per listing request, reads at
//! once per tenant (`[api].cold_reads_per_tenant`), memory for manifests
//! and footers.

use std::future::Future;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::error::{ApiError, QuotaExceeded};

/// The archive's cold history over the configured store, counted.
pub type Cold = walhook_archive::cold::ColdHistory<
    walhook_archive::cold::CountingStore<walhook_archive::objstore::AnyStore>,
>;

/// Metric names.
pub mod names {
    /// Bytes the API read from the archive's store (counter).
    pub const COLD_READ_BYTES: &str = "walhook_api_cold_read_bytes";
    /// Reads (GETs, whole or ranged) the API sent to the archive's store
    /// (counter).
    pub const COLD_READS: &str = "walhook_api_cold_reads";
    /// Archive reads refused because their tenant had
    /// `[api].cold_reads_per_tenant` in progress (counter; each was a 429).
    pub const COLD_READS_REFUSED: &str = "walhook_api_cold_reads_refused";
    /// Memory held by cached manifests and footers, bytes (gauge).
    pub const COLD_CACHE_BYTES: &str = "walhook_api_cold_cache_bytes";
}

/// The 429 of a tenant with `current` archive reads in progress, the most
/// `[api].cold_reads_per_tenant` (`limit`) allows.
pub fn reads_busy(tenant: &str, limit: usize, current: usize) -> ApiError {
    ApiError::QuotaExceeded {
        detail: format!(
            "tenant {tenant:?} has {current} reads of archived history in progress, the most \
             [api].cold_reads_per_tenant ({limit}) allows at once; nothing was read. Retry in \
             a second, or wait for the tenant's other listings and lookups of archived \
             deliveries to end"
        ),
        quota: QuotaExceeded {
            limit_name: "cold_reads_per_tenant".into(),
            limit: limit as u64,
            current: current as u64,
            retry_after_seconds: Some(1),
        },
    }
}

/// The 429 of a tenant that started `[api].cold_reads_per_minute`
/// (`limit`) archive reads in the last minute: the next may start after
/// `wait`.
pub fn reads_too_often(tenant: &str, limit: u32, wait: std::time::Duration) -> ApiError {
    let retry = wait.as_secs_f64().ceil().max(1.0) as u64;
    ApiError::QuotaExceeded {
        detail: format!(
            "tenant {tenant:?} started {limit} reads of archived history in the last minute, \
             the most [api].cold_reads_per_minute allows; nothing was read. Retry in {retry} \
             second(s)"
        ),
        quota: QuotaExceeded {
            limit_name: "cold_reads_per_minute".into(),
            limit: u64::from(limit),
            current: u64::from(limit),
            retry_after_seconds: Some(retry),
        },
    }
}

/// The cold reads' counters, read at every scrape.
#[derive(Debug)]
pub struct ColdCollector(pub Arc<Cold>);

impl Collector for ColdCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let totals = self.0.store().totals();
        let stats = self.0.stats();
        for (name, help, value) in [
            (
                names::COLD_READ_BYTES,
                "Bytes read from the archive's store by API requests",
                totals.bytes,
            ),
            (
                names::COLD_READS,
                "Reads (whole or ranged GETs) sent to the archive's store by API requests",
                totals.reads,
            ),
            (
                names::COLD_READS_REFUSED,
                "Archive reads refused (429) because their tenant had [api].cold_reads_per_tenant in progress",
                stats.refused,
            ),
        ] {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        let cache = ConstGauge::new(stats.cache_bytes as i64);
        let metric = encoder.encode_descriptor(
            names::COLD_CACHE_BYTES,
            "Memory held by cached archive manifests and Parquet footers",
            None,
            cache.metric_type(),
        )?;
        cache.encode(metric)?;
        Ok(())
    }
}

/// How much lower the archive read threads' CPU priority is (`nice`): when
/// the machine is busy, the threads that answer hot requests (and
/// Postgres) come first, and archive reads take what is left.
pub const COLD_NICE: i32 = 10;

/// Threads of [`ColdPool`]: half the cores, at least one.
pub fn cold_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// A runtime of its own for archive reads (see the module docs), owned by
/// a thread that drops it when the pool is dropped.
#[derive(Debug)]
pub struct ColdPool {
    handle: tokio::runtime::Handle,
    stop: Option<std::sync::mpsc::Sender<()>>,
}

impl ColdPool {
    /// A pool of `threads` worker threads named `walhook-cold`.
    pub fn new(threads: usize) -> std::io::Result<ColdPool> {
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::Builder::new()
            .name("walhook-cold-owner".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads.max(1))
                    .thread_name("walhook-cold")
                    .on_thread_start(|| {
                        // Per thread on Linux; elsewhere the pool just runs
                        // at the usual priority.
                        if let Err(e) = rustix::process::nice(COLD_NICE) {
                            tracing::debug!(error = %e, "archive read threads keep the usual CPU priority");
                        }
                    })
                    .enable_all()
                    .build();
                match runtime {
                    Ok(runtime) => {
                        let _ = handle_tx.send(Ok(runtime.handle().clone()));
                        // Until the pool is dropped (or its sender is).
                        let _ = stopped.recv();
                        runtime.shutdown_background();
                    }
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                    }
                }
            })?;
        let handle = handle_rx.recv().map_err(|_| {
            std::io::Error::other("the archive read pool's thread ended at start")
        })??;
        Ok(ColdPool {
            handle,
            stop: Some(stop),
        })
    }

    /// Runs `work` on the pool and waits for it.
    pub async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, walhook_archive::ArchiveError>> + Send + 'static,
    ) -> Result<T, ApiError> {
        match self.handle.spawn(work).await {
            Ok(done) => Ok(done?),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(ApiError::Overloaded {
                kind: crate::error::Overload::Busy,
                detail: "the server is stopping; archived history could not be read".into(),
            }),
        }
    }
}

impl Drop for ColdPool {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
