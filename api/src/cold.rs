//! Archived history as the API reads it: the store counted as it is read
//! (for `/metrics`), and the 429 of a tenant over its archive reads at
//! once.
//!
//! What a request may take from the archive is decided in
//! [`walhook_archive::cold`]: days and bytes per listing request, reads at
//! once per tenant (`[api].cold_reads_per_tenant`), memory for manifests
//! and footers.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::error::{ApiError, QuotaExceeded};

/// The archive's cold history over the configured store, counted.
pub type Cold = walhook_archive::cold::ColdHistory<
    walhook_archive::cold::CountingStore<walhook_connectors::objstore::AnyStore>,
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
