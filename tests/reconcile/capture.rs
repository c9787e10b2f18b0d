//! Capture as the auditor sees it: column changes of a captured table are
//! explained (`schema_changed`, with the new schema versions), not gaps; a
//! capture that is stopped while the source is written to makes the window
//! `capture_behind` until it has caught up; the funnel's first stage counts
//! each source change once.

use std::process::Command;

use serde_json::Value;

use super::{explained, gap_ids, reconcile};
use crate::support::{Child, World};

/// Sends `signal` (`STOP`, `CONT`) to `child`.
fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.0.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal}");
}

async fn insert_orders(w: &World, ids: std::ops::Range<i64>) {
    for i in ids {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        w.shop
            .execute(
                "INSERT INTO orders (id, tenant_id, total) VALUES ($1, $2, 1)",
                &[&i, &tenant],
            )
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn column_changes_are_explained_and_the_window_reconciles_clean() {
    let w = World::new().await;
    w.endpoint("acme", "acme", &[]).await;
    w.endpoint("globex", "globex", &[]).await;
    let cfg = w.config("[reconcile]\nevery = \"0s\"\n");
    let _child = Child::run(&cfg);
    w.wait_streaming().await;
    insert_orders(&w, 0..3).await;
    // A column added, a column retyped, a column added and dropped again:
    // each followed by rows, so capture sees each new shape.
    let steps = [
        "ALTER TABLE orders ADD COLUMN note text",
        "ALTER TABLE orders ALTER COLUMN total TYPE double precision",
        "ALTER TABLE orders ADD COLUMN scratch integer",
        "ALTER TABLE orders DROP COLUMN scratch",
    ];
    for (n, step) in steps.iter().enumerate() {
        w.shop.batch_execute(step).await.unwrap();
        let first = 3 * (n as i64 + 1);
        insert_orders(&w, first..first + 3).await;
    }
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        15,
    )
    .await;

    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["gap_counts"], serde_json::json!({}), "{report:#}");
    assert_eq!(explained(&report, "schema_changed"), 4, "{report:#}");
    let changes = report["schema_changes"].as_array().unwrap();
    assert_eq!(changes.len(), 4, "{changes:#?}");
    let versions: Vec<u64> = changes
        .iter()
        .map(|c| {
            assert_eq!(c["table"], "public.orders", "{c:#}");
            let v = c["versions"].as_array().unwrap();
            assert_eq!(v.len(), 1, "{c:#}");
            assert_eq!(v[0]["event_type"], "order.created", "{c:#}");
            v[0]["schema_version"].as_u64().unwrap()
        })
        .collect();
    // The events carry the versions the report names.
    let stored: Vec<i32> = w
        .platform_sql
        .query(
            "SELECT DISTINCT ON (schema_version) schema_version FROM walhook.events \
             ORDER BY schema_version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for v in &versions {
        assert!(stored.contains(&(*v as i32)), "{versions:?} vs {stored:?}");
    }
    assert!(versions.iter().all(|v| *v >= 2), "{versions:?}");
    // Dropping the added column gives back the retyped shape's version.
    assert_eq!(versions[3], versions[1], "{versions:?}");
    // The funnel starts at the source: 15 row changes, each counted once.
    assert_eq!(report["funnel"]["captured_changes"], 15, "{report:#}");
    assert_eq!(report["funnel"]["captured_events"], 15, "{report:#}");
    let coverage = &report["capture_coverage"];
    assert_eq!(coverage[0]["confirmed"], true, "{coverage:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_capture_is_behind_until_it_has_caught_up() {
    let w = World::new().await;
    w.endpoint("acme", "acme", &[]).await;
    w.endpoint("globex", "globex", &[]).await;
    let cfg = w.config("[reconcile]\nevery = \"0s\"\ncapture_wait = \"8s\"\n");
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    insert_orders(&w, 0..4).await;
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        4,
    )
    .await;
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "capture running: {report:#}");

    // Capture frozen while the source goes on.
    signal(&child, "STOP");
    insert_orders(&w, 4..10).await;
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(gap_ids(&report), ["capture_behind:main"], "{report:#}");
    let gap: &Value = &report["gaps"][0];
    let detail = gap["detail"].as_str().unwrap();
    for needed in [
        "source \"main\"",
        "Slot lag",
        "last commit captured: commit LSN",
    ] {
        assert!(detail.contains(needed), "{needed:?} in {detail}");
    }
    let coverage = &report["capture_coverage"][0];
    assert_eq!(coverage["confirmed"], false, "{coverage:#}");
    // The report never calls a window clean while capture may be behind.
    assert_eq!(report["clean"], false);

    // Resumed, capture catches up; the same window is clean.
    signal(&child, "CONT");
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        10,
    )
    .await;
    let (code, report) = reconcile(&cfg, &[]);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["capture_coverage"][0]["confirmed"], true);
    assert_eq!(report["funnel"]["captured_changes"], 10, "{report:#}");
    drop(child);
}
