//! Verification: every object a manifest names is read back whole and
//! matched (SHA-256, size, Parquet footer, row count, column layout) before
//! any hot row leaves. Each failure names the object and the fix.

use chrono::NaiveDate;
use walhook_pipeline::objstore::{ObjectStore, sha256_hex};

use crate::encode::footer_rows;
use crate::layout::staged_key;
use crate::manifest::{FORMAT, Manifest};
use crate::table::{OLDEST_READABLE, SCHEMA_VERSION, Table};
use crate::{ArchiveError, VerificationKind};

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
    let fail = |object: &str, kind: VerificationKind, problem: String, fix: &str| {
        ArchiveError::Verification {
            table,
            day,
            object: format!("{}/{object}", store.describe()),
            kind,
            problem,
            fix: fix.to_string(),
        }
    };
    let rewrite = format!(
        "The hot rows are kept. Remove the manifest {key} and run `walhook archive` again to write the day anew from them"
    );
    let Some(bytes) = store.get(key).await? else {
        return Err(fail(
            key,
            VerificationKind::Missing,
            "the manifest is missing".into(),
            "Run `walhook archive` again: it writes the day anew from the hot rows",
        ));
    };
    let got = sha256_hex(&bytes);
    if got != sha256 {
        return Err(fail(
            key,
            VerificationKind::Mismatch,
            format!("the manifest's SHA-256 is {got}, the catalog recorded {sha256}"),
            &rewrite,
        ));
    }
    let manifest = Manifest::from_bytes(&bytes).map_err(|e| {
        fail(
            key,
            VerificationKind::Mismatch,
            format!("the manifest does not parse: {e}"),
            &rewrite,
        )
    })?;
    if manifest.format != FORMAT
        || !(OLDEST_READABLE..=SCHEMA_VERSION).contains(&manifest.schema_version)
        || manifest.table != table.name()
    {
        return Err(fail(
            key,
            VerificationKind::Mismatch,
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
            return Err(fail(
                &at,
                VerificationKind::Missing,
                "the object is missing".into(),
                &rewrite,
            ));
        };
        if obj.len() as u64 != f.bytes {
            return Err(fail(
                &at,
                VerificationKind::Mismatch,
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
                VerificationKind::Mismatch,
                format!(
                    "the object's SHA-256 is {got}, the manifest says {}",
                    f.sha256
                ),
                &rewrite,
            ));
        }
        let n = footer_rows(table, &obj)
            .map_err(|p| fail(&at, VerificationKind::Mismatch, p, &rewrite))?;
        if n != f.rows {
            return Err(fail(
                &at,
                VerificationKind::Mismatch,
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
            VerificationKind::Mismatch,
            format!(
                "the parts hold {rows} rows in {bytes_total} bytes, the manifest's totals say {} rows in {} bytes",
                manifest.row_count, manifest.byte_count
            ),
            &rewrite,
        ));
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::manifest::FileEntry;
    use crate::objstore::LocalDirStore;

    fn kind_of(r: Result<Manifest, ArchiveError>) -> (VerificationKind, String) {
        let e = r.expect_err("verification must fail");
        let ArchiveError::Verification {
            kind,
            ref object,
            ref problem,
            ..
        } = e
        else {
            panic!("not a verification failure: {e}");
        };
        (kind, format!("{object}: {problem}"))
    }

    #[tokio::test]
    async fn absent_objects_are_missing_and_wrong_ones_a_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::open(dir.path().join("objects")).unwrap();
        let table = Table::Events;
        let day = NaiveDate::from_ymd_opt(2026, 11, 27).unwrap();
        let key = "table=events/date=2026-11-27/_manifest.json";
        let part = "table=events/date=2026-11-27/tenant_bucket=00/part-00000.parquet";
        let body = Bytes::from_static(b"not a parquet file");
        let mut manifest = Manifest::new(table, "2026-11-27", 0, 16);
        manifest.add(FileEntry {
            key: part.into(),
            tenant_bucket: 0,
            rows: 1,
            bytes: body.len() as u64,
            sha256: sha256_hex(&body),
            id_range: ("0".into(), "0".into()),
            time_range: (0, 0),
            tenants: [("t".to_string(), 1u64)].into_iter().collect(),
        });
        let bytes = manifest.to_bytes();
        let sha = sha256_hex(&bytes);

        // No manifest.
        let (kind, what) = kind_of(verify(&store, table, day, key, &sha).await);
        assert_eq!(kind, VerificationKind::Missing, "{what}");
        assert!(what.contains(key), "{what}");

        // The manifest, but not its part.
        store.put(key, Bytes::from(bytes)).await.unwrap();
        let (kind, what) = kind_of(verify(&store, table, day, key, &sha).await);
        assert_eq!(kind, VerificationKind::Missing, "{what}");
        assert!(what.contains(part), "{what}");

        // A manifest other than the catalog recorded.
        let (kind, what) = kind_of(verify(&store, table, day, key, &"0".repeat(64)).await);
        assert_eq!(kind, VerificationKind::Mismatch, "{what}");

        // A part of another size.
        store.put(part, Bytes::from_static(b"short")).await.unwrap();
        let (kind, what) = kind_of(verify(&store, table, day, key, &sha).await);
        assert_eq!(kind, VerificationKind::Mismatch, "{what}");

        // The part's bytes, which are no Parquet file.
        store.put(part, body).await.unwrap();
        let (kind, what) = kind_of(verify(&store, table, day, key, &sha).await);
        assert_eq!(kind, VerificationKind::Mismatch, "{what}");
        assert!(what.contains("not a Parquet file"), "{what}");
    }
}
