//! Archived days reconciled like hot ones: after the day's hot rows are
//! dropped, a delivery removed from its Parquet part (the part rewritten
//! without it, the manifest and the catalog made to match, so verification
//! passes) is found as a missing delivery of that day, with its id.

use arrow_array::cast::AsArray;
use walhook_archive::manifest::Manifest;
use walhook_archive::table::Table;
use walhook_pipeline::ids::DeliveryId;
use walhook_pipeline::objstore::sha256_hex;

use super::{Archived, archived_orders, gap_ids, reconcile};
use crate::support::World;

/// Rewrites the first deliveries part of `day` under `root` without its
/// row at `index` (the first); the manifest and its catalog row follow.
/// Returns the removed row's id.
async fn remove_row(w: &World, root: &std::path::Path, day: &str, index: usize) -> [u8; 16] {
    let table = Table::Deliveries;
    let (key, sha): (String, String) = {
        let r = w
            .platform_sql
            .query_one(
                "SELECT manifest_key, manifest_sha256 FROM walhook.archive_partitions \
                 WHERE table_name = 'deliveries' AND day = $1::text::date AND state = 'dropped'",
                &[&day],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let manifest_path = root.join(&key);
    let bytes = std::fs::read(&manifest_path).unwrap();
    assert_eq!(sha256_hex(&bytes), sha, "the manifest the catalog names");
    let mut manifest = Manifest::from_bytes(&bytes).unwrap();
    let file = &mut manifest.files[0];
    let part_path = root.join(&file.key);
    let batches =
        walhook_archive::encode::decode(std::fs::read(&part_path).unwrap().into()).unwrap();
    assert_eq!(batches.len(), 1, "a small day is one batch");
    let batch = &batches[0];
    let n = batch.num_rows();
    assert!(n > index + 1, "{n} rows");
    let ids = batch
        .column_by_name("id")
        .unwrap()
        .as_fixed_size_binary()
        .clone();
    let tenants = batch
        .column_by_name("tenant_id")
        .unwrap()
        .as_string::<i32>()
        .clone();
    let removed: [u8; 16] = ids.value(index).try_into().unwrap();
    let tenant = tenants.value(index).to_owned();
    // The part's first row: the rest is one slice.
    assert_eq!(index, 0, "only the first row is removed");
    let kept = batch.slice(1, n - 1);
    let rewritten = walhook_archive::encode::encode(table, &kept).unwrap();
    std::fs::write(&part_path, &rewritten).unwrap();
    file.rows -= 1;
    file.bytes = rewritten.len() as u64;
    file.sha256 = sha256_hex(&rewritten);
    *file.tenants.get_mut(&tenant).unwrap() -= 1;
    manifest.row_count -= 1;
    manifest.byte_count = manifest.files.iter().map(|f| f.bytes).sum();
    let bytes = manifest.to_bytes();
    std::fs::write(&manifest_path, &bytes).unwrap();
    w.platform_sql
        .execute(
            "UPDATE walhook.archive_partitions SET manifest_sha256 = $2, row_count = row_count - 1 \
             WHERE table_name = 'deliveries' AND day = $1::text::date AND state = 'dropped'",
            &[&day, &sha256_hex(&bytes)],
        )
        .await
        .unwrap();
    removed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_removed_from_an_archived_day_is_found_with_its_id() {
    let w = World::new().await;
    let Archived {
        cfg,
        today,
        child: _child,
    } = archived_orders(&w, 10).await;
    let hot: i64 = w
        .platform_sql
        .query_one("SELECT count(*) FROM walhook.deliveries", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(hot, 0, "the day's deliveries left the hot table");

    // Read from the Parquet: every delivery and attempt of the window.
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "{report:#}");
    let f = &report["funnel"];
    assert_eq!(f["events_archived"], 10, "{f:#}");
    assert_eq!(f["expected_deliveries"], 10, "{f:#}");
    assert_eq!(f["materialised_deliveries"], 10, "{f:#}");
    assert_eq!(f["deliveries_archived"], 10, "{f:#}");
    assert_eq!(f["attempts_archived"], 10, "{f:#}");
    assert_eq!(f["succeeded"], 10, "{f:#}");

    let root = w.dir.path().join("walhook-archive");
    let removed = DeliveryId(remove_row(&w, &root, &today, 0).await).to_string();
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 3, "{report:#}");
    let ids = gap_ids(&report);
    assert_eq!(ids, [format!("missing_delivery:{removed}")], "{report:#}");
    let gap = &report["gaps"][0];
    assert_eq!(gap["delivery_id"], removed.as_str());
    let detail = gap["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("archived day {today}")),
        "{detail}"
    );
    // Verification alone passes: the manifest matches the rewritten part.
    let days = report["archive"].as_array().unwrap();
    assert!(days.iter().all(|d| d["verified"] == true), "{days:#?}");
    assert_eq!(report["funnel"]["materialised_deliveries"], 9);
}
