//! Parquet parts read through the object store with ranged GETs: the
//! footer, the page index, then only the pages of the columns and rows a
//! read needs (the parquet crate's async reader over
//! [`ObjectStore::get_range`]).
//!
//! Every byte fetched is added to the request's [`Spend`], which is how a
//! listing holds to its budget and how the bench reports bytes per request.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::ParquetError;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use walhook_pipeline::objstore::ObjectStore;

use crate::ArchiveError;

/// Bytes fetched with the footer's last 8: most parts' footers and page
/// indexes fit, so one GET reads them.
const FOOTER_PREFETCH: usize = 64 * 1024;

/// Ranges fetched at once by one reader.
const CONCURRENT_RANGES: usize = 8;

/// What one request read from the store so far.
#[derive(Debug, Default)]
pub struct Spend {
    bytes: AtomicU64,
    reads: AtomicU64,
}

impl Spend {
    /// A fresh count, shared by the readers of one request.
    pub fn unlimited() -> Arc<Spend> {
        Arc::new(Spend::default())
    }

    /// Counts one read of `n` bytes.
    pub fn add(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes read so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Reads (GETs) so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// One part, read range by range.
pub struct PartReader<S> {
    store: S,
    key: String,
    size: u64,
    spend: Arc<Spend>,
}

impl<S: ObjectStore> PartReader<S> {
    /// A reader of the part at `key`, `size` bytes long (the manifest says).
    pub fn new(store: S, key: String, size: u64, spend: Arc<Spend>) -> Self {
        PartReader {
            store,
            key,
            size,
            spend,
        }
    }

    async fn fetch(&self, range: Range<u64>) -> parquet::errors::Result<Bytes> {
        let bytes = self
            .store
            .get_range(&self.key, range.clone())
            .await
            .map_err(|e| ParquetError::External(Box::new(e)))?
            .ok_or_else(|| {
                ParquetError::General(format!(
                    "{} is named by a manifest but missing from the store",
                    self.key
                ))
            })?;
        self.spend.add(bytes.len() as u64);
        if bytes.len() as u64 != range.end - range.start {
            return Err(ParquetError::EOF(format!(
                "{} ends before byte {}: the store holds a shorter object than its manifest says",
                self.key, range.end
            )));
        }
        Ok(bytes)
    }
}

impl<S: ObjectStore> AsyncFileReader for PartReader<S> {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, parquet::errors::Result<Bytes>> {
        self.fetch(range).boxed()
    }

    /// Neighbouring ranges (the pages of one column) are merged into one
    /// GET; the GETs run a few at a time.
    fn get_byte_ranges(
        &mut self,
        ranges: Vec<Range<u64>>,
    ) -> BoxFuture<'_, parquet::errors::Result<Vec<Bytes>>> {
        async move {
            let mut order: Vec<usize> = (0..ranges.len()).collect();
            order.sort_by_key(|&i| ranges[i].start);
            let mut merged: Vec<Range<u64>> = Vec::new();
            for &i in &order {
                let r = &ranges[i];
                match merged.last_mut() {
                    Some(m) if r.start <= m.end => m.end = m.end.max(r.end),
                    _ => merged.push(r.clone()),
                }
            }
            let fetched: Vec<Bytes> = futures::stream::iter(merged.iter().cloned())
                .map(|r| self.fetch(r))
                .buffered(CONCURRENT_RANGES)
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<parquet::errors::Result<_>>()?;
            Ok(ranges
                .iter()
                .map(|r| {
                    // The merged range that starts last at or before it.
                    let j = merged
                        .partition_point(|m| m.start <= r.start)
                        .saturating_sub(1);
                    let m = &merged[j];
                    fetched[j].slice((r.start - m.start) as usize..(r.end - m.start) as usize)
                })
                .collect())
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, parquet::errors::Result<Arc<ParquetMetaData>>> {
        async move {
            let size = self.size;
            let meta = ParquetMetaDataReader::new()
                .with_page_index_policy(PageIndexPolicy::Optional)
                .with_prefetch_hint(Some(FOOTER_PREFETCH))
                .load_and_finish(self, size)
                .await?;
            Ok(Arc::new(meta))
        }
        .boxed()
    }
}

/// The options every cold read uses (the schema as written, with the
/// uuid extension type).
pub fn options() -> ArrowReaderOptions {
    ArrowReaderOptions::new().with_page_index_policy(PageIndexPolicy::Optional)
}

/// The footer and page index of the part behind `reader`.
pub async fn load_metadata<S: ObjectStore>(
    reader: &mut PartReader<S>,
) -> Result<ArrowReaderMetadata, ArchiveError> {
    let meta = reader
        .get_metadata(None)
        .await
        .map_err(ArchiveError::Parquet)?;
    ArrowReaderMetadata::try_new(meta, options()).map_err(ArchiveError::Parquet)
}
