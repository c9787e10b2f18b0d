//! No silent stall: when any long-lived task of `walhook run` ends, fails or
//! panics, the process stops with an error naming it, and the next start
//! loses nothing.

use std::time::Duration;

use crate::support::{Child, World};

/// (failpoint, words the error must contain).
const CASES: &[(&str, &str)] = &[
    (
        "directory.refresh=end@3",
        "the endpoint directory refresher ended unexpectedly",
    ),
    ("dispatch.recorder=end@2", "the recorder stopped"),
    ("dispatch.sweeper=end@3", "the sweeper stopped"),
    (
        "dispatch.forward=end@2",
        "the forwarder of deliveries partition",
    ),
    ("fanout.poll=end@2", "fan-out of events partition"),
    ("fanout.poll=panic@2", "panicked: failpoint fanout.poll"),
    (
        "capture.checkpoint=end@2",
        "the capture checkpoint writer ended unexpectedly",
    ),
];

#[tokio::test]
async fn every_long_lived_task_is_watched() {
    let w = World::new().await;
    w.endpoint("acme", "a", &[]).await;
    w.endpoint("acme", "b", &["order.created"]).await;
    let cfg = w.config("");
    let mut order = 0i64;

    // The slot exists once walhook ran.
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    for _ in 0..3 {
        order += 1;
        add(&w, order).await;
    }
    w.wait_count(
        "the first deliveries",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        6,
    )
    .await;
    assert!(child.terminate().success());

    for (failpoint, words) in CASES {
        let log = w.dir.path().join("supervised.log");
        let mut child = Child::run_logged(&cfg, &[("WALHOOK_FAILPOINTS", failpoint)], &log);
        // Work for the task to do until the failpoint fires.
        let mut status = None;
        for _ in 0..60 {
            order += 1;
            add(&w, order).await;
            status = child.wait_exit(Duration::from_millis(500));
            if status.is_some() {
                break;
            }
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let status = status.unwrap_or_else(|| panic!("{failpoint}: walhook kept running\n{text}"));
        assert!(!status.success(), "{failpoint}: exited 0\n{text}");
        assert!(
            text.contains(words),
            "{failpoint}: the error does not name the task ({words:?})\n{text}"
        );

        // The next start delivers everything, once per (event, endpoint).
        let child = Child::run(&cfg);
        let want = order * 2;
        w.wait_count(
            &format!("every delivery after {failpoint}"),
            "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
            want,
        )
        .await;
        assert!(child.terminate().success());
        let made: i64 = w
            .platform_sql
            .query_one("SELECT count(*) FROM walhook.deliveries", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(made, want, "{failpoint}: a delivery made twice or missing");
        w.assert_pending_consistent().await;
    }
    let received = w.receiver.received();
    assert!(received.iter().all(|r| r.verified == Some(true)));
    for path in ["a", "b"] {
        let ids: std::collections::HashSet<String> = received
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.webhook_id.clone())
            .collect();
        assert_eq!(ids.len() as i64, order, "{path} missed a delivery");
    }
}

async fn add(w: &World, id: i64) {
    w.shop
        .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
        .await
        .unwrap();
}

/// walhook's log cannot be written (stderr is `/dev/full`: every write
/// fails with "no space left on device", as when the log's disk fills):
/// log lines are lost, nothing else. Before, the logger's own error report
/// (`eprintln!`) panicked, and the panics ended fan-out and dispatch.
#[tokio::test]
async fn an_unwritable_log_loses_log_lines_not_deliveries() {
    let w = World::new().await;
    w.endpoint("acme", "orders", &["order.created"]).await;
    let cfg = w.config("");
    let mut child = Child::run_with(
        &cfg,
        &[("WALHOOK_LOG", "debug")],
        &[],
        std::path::Path::new("/dev/full"),
    );
    w.wait_streaming().await;
    for id in 1..=20i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
            .await
            .unwrap();
    }
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(60), |all| all.len() >= 20)
            .await,
        "{} of 20 orders arrived with the log unwritable",
        w.receiver.count()
    );
    assert!(child.running(), "walhook ended with its log unwritable");
    assert!(child.terminate().success());
}
