//! Verification: every object a manifest names is read back whole and
//! matched (SHA-256, size, Parquet footer, row count, column layout) before
//! any hot row leaves. Each failure names the object and the fix.

use chrono::NaiveDate;
use walhook_pipeline::objstore::{ObjectStore, sha256_hex};

use crate::ArchiveError;
use crate::encode::footer_rows;
use crate::layout::staged_key;
use crate::manifest::{FORMAT, Manifest};
use crate::table::{OLDEST_READABLE, SCHEMA_VERSION, Table};

/// Where verification reads a compacted generation's parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The parts it wrote, where they wait before publication
    /// ([`crate::layout::staged_key`]); the parts it carried, where they
    /// live.
    Staged,
    /// Every part under its live key.
    Live,
}

/// Reads the manifest at `key` (whose bytes must hash to `sha256`, as the
/// catalog recorded) and every part it names under its live key; returns
/// the manifest when all match.
pub async fn verify<S: ObjectStore>(
    store: &S,
    table: Table,
    day: NaiveDate,
    key: &str,
    sha256: &str,
) -> Result<Manifest, ArchiveError> {
    verify_in(store, table, day, key, sha256, Phase::Live).await
}

/// [`verify`], reading a compacted generation's parts in `phase`.
pub async fn verify_in<S: ObjectStore>(
    store: &S,
    table: Table,
    day: NaiveDate,
    key: &str,
    sha256: &str,
    phase: Phase,
) -> Result<Manifest, ArchiveError> {
    let fail = |object: &str, problem: String, fix: &str| ArchiveError::Verification {
        table,
        day,
        object: format!("{}/{object}", store.describe()),
        problem,
        fix: fix.to_string(),
    };
    let rewrite = format!(
        "The hot rows are kept. Remove the manifest {key} and run `walhook archive` again to write the day anew from them"
    );
    let Some(bytes) = store.get(key).await? else {
        return Err(fail(
            key,
            "the manifest is missing".into(),
            "Run `walhook archive` again: it writes the day anew from the hot rows",
        ));
    };
    let got = sha256_hex(&bytes);
    if got != sha256 {
        return Err(fail(
            key,
            format!("the manifest's SHA-256 is {got}, the catalog recorded {sha256}"),
            &rewrite,
        ));
    }
    let manifest = Manifest::from_bytes(&bytes)
        .map_err(|e| fail(key, format!("the manifest does not parse: {e}"), &rewrite))?;
    if manifest.format != FORMAT
        || !(OLDEST_READABLE..=SCHEMA_VERSION).contains(&manifest.schema_version)
        || manifest.table != table.name()
    {
        return Err(fail(
            key,
            format!(
                "the manifest is {} v{} of table {}, not {FORMAT} v{OLDEST_READABLE}..v{SCHEMA_VERSION} of {table}",
                manifest.format, manifest.schema_version, manifest.table
            ),
            &rewrite,
        ));
    }
    let mut rows = 0u64;
    let mut bytes_total = 0u64;
    for f in &manifest.files {
        let at = match phase {
            Phase::Staged if manifest.compaction.is_some() && manifest.wrote(&f.key) => {
                staged_key(&f.key, manifest.generation)
            }
            _ => f.key.clone(),
        };
        let Some(obj) = store.get(&at).await? else {
            return Err(fail(&at, "the object is missing".into(), &rewrite));
        };
        if obj.len() as u64 != f.bytes {
            return Err(fail(
                &at,
                format!(
                    "the object has {} bytes, the manifest says {}",
                    obj.len(),
                    f.bytes
                ),
                &rewrite,
            ));
        }
        let got = sha256_hex(&obj);
        if got != f.sha256 {
            return Err(fail(
                &at,
                format!(
                    "the object's SHA-256 is {got}, the manifest says {}",
                    f.sha256
                ),
                &rewrite,
            ));
        }
        let n = footer_rows(table, &obj).map_err(|p| fail(&at, p, &rewrite))?;
        if n != f.rows {
            return Err(fail(
                &at,
                format!(
                    "the Parquet footer declares {n} rows, the manifest {}",
                    f.rows
                ),
                &rewrite,
            ));
        }
        rows += n;
        bytes_total += f.bytes;
    }
    if rows != manifest.row_count || bytes_total != manifest.byte_count {
        return Err(fail(
            key,
            format!(
                "the parts hold {rows} rows in {bytes_total} bytes, the manifest's totals say {} rows in {} bytes",
                manifest.row_count, manifest.byte_count
            ),
            &rewrite,
        ));
    }
    Ok(manifest)
}
