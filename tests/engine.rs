//! The delivery engine against real Postgres and the real binary: restarts
//! in the middle of retries, manual replays, endpoints that answer 410.

use std::collections::HashMap;
use std::time::Duration;

use walhook_devkit::receiver::Behaviour;

use crate::support::{Child, World};

const FAST: &str =
    "[breaker]\nfailure_threshold = 3\ncool_down = \"500ms\"\nmax_cool_down = \"1s\"\n";

async fn wait_for<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_or(what, check, || async { String::new() }).await
}

async fn wait_for_or<F, Fut, D, DFut>(what: &str, mut check: F, describe: D)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
    D: FnOnce() -> DFut,
    DFut: std::future::Future<Output = String>,
{
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}: {}", describe().await);
}

#[tokio::test]
async fn a_restart_in_the_middle_of_retries_keeps_counts_and_deadlines() {
    let w = World::new().await;
    w.endpoint("acme", "down", &[]).await;
    w.receiver.set_behaviour("down", Behaviour::Status(500));
    let cfg = w.config(FAST);
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    for i in 0..5i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    let sql = &w.platform_sql;
    wait_for("several failed attempts per delivery", || async {
        let n: i64 = sql
            .query_one(
                "SELECT count(*) FROM walhook.deliveries WHERE attempt_count >= 3",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n == 5
    })
    .await;
    child.kill();
    let before: HashMap<uuid::Uuid, (i32, std::time::SystemTime)> = sql
        .query(
            "SELECT id, attempt_count, expires_at FROM walhook.deliveries",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let child = Child::run(&cfg);
    wait_for("retries after the restart", || async {
        let rows = sql
            .query("SELECT id, attempt_count FROM walhook.deliveries", &[])
            .await
            .unwrap();
        rows.iter()
            .all(|r| r.get::<_, i32>(1) > before[&r.get::<_, uuid::Uuid>(0)].0)
    })
    .await;
    w.receiver.set_behaviour("down", Behaviour::Status(200));
    wait_for_or(
        "every delivery to succeed",
        || async {
            let n: i64 = sql
                .query_one("SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'", &[])
                .await
                .unwrap()
                .get(0);
            n == 5
        },
        || async {
            let rows = sql
                .query(
                    "SELECT status::text, attempt_count, next_attempt_at::text, lease_version, lease_owner, lease_expires_at::text, now()::text FROM walhook.deliveries",
                    &[],
                )
                .await
                .unwrap();
            let health = sql.query("SELECT circuit, open_until::text FROM walhook.endpoint_health", &[]).await.unwrap();
            format!(
                "{:?} health {:?}",
                rows.iter()
                    .map(|r| (r.get::<_, String>(0), r.get::<_, i32>(1), r.get::<_, String>(2), r.get::<_, i64>(3), r.get::<_, Option<String>>(4), r.get::<_, Option<String>>(5), r.get::<_, String>(6)))
                    .collect::<Vec<_>>(),
                health.iter().map(|r| (r.get::<_, String>(0), r.get::<_, Option<String>>(1))).collect::<Vec<_>>()
            )
        },
    )
    .await;
    let after = sql
        .query(
            "SELECT id, attempt_count, expires_at FROM walhook.deliveries",
            &[],
        )
        .await
        .unwrap();
    for r in after {
        let id: uuid::Uuid = r.get(0);
        let (count_before, expires_before) = before[&id];
        assert!(
            r.get::<_, i32>(1) > count_before,
            "the attempt count was reset"
        );
        assert_eq!(
            r.get::<_, std::time::SystemTime>(2),
            expires_before,
            "the deadline moved"
        );
        // Attempt numbers continue, each once, in the order the attempts
        // started. The SIGKILL may have cut an attempt off after it was
        // sent: its number is skipped, and the attempt after the gap says
        // that the one before it has an unknown outcome; no other gap.
        let rows = sql
            .query("SELECT number, note FROM walhook.attempts WHERE delivery_id = $1 AND trigger = 'auto' ORDER BY started_at, number", &[&id])
            .await
            .unwrap();
        let numbers: Vec<(i32, Option<String>)> =
            rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(numbers[0].0, 1, "{numbers:?}");
        let mut unknown = 0;
        for pair in numbers.windows(2) {
            let ((a, _), (b, note)) = (&pair[0], &pair[1]);
            match b - a {
                1 => assert_eq!(note, &None, "{numbers:?}"),
                2 => {
                    assert_eq!(
                        note.as_deref(),
                        Some("previous_outcome_unknown"),
                        "{numbers:?}"
                    );
                    unknown += 1;
                }
                _ => panic!("attempt numbers restarted or repeated: {numbers:?}"),
            }
        }
        assert!(
            unknown <= 1,
            "more than one unknown outcome after one kill: {numbers:?}"
        );
    }
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
}

#[tokio::test]
async fn a_replay_is_a_manual_attempt_on_the_same_delivery() {
    let w = World::new().await;
    w.endpoint("acme", "ok", &[]).await;
    let child = Child::run(&w.config(FAST));
    w.wait_streaming().await;
    w.shop
        .execute("INSERT INTO orders VALUES (1, 'acme', 1)", &[])
        .await
        .unwrap();
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |r| r.len() == 1)
            .await
    );
    let sql = &w.platform_sql;
    w.wait_count(
        "the delivery's row",
        "SELECT count(*) FROM walhook.deliveries",
        1,
    )
    .await;
    let delivery: uuid::Uuid = sql
        .query_one("SELECT id FROM walhook.deliveries", &[])
        .await
        .unwrap()
        .get(0);
    let delivery_id = walhook_pipeline::ids::DeliveryId(*delivery.as_bytes());
    // The webhook-id the receiver saw is the delivery id.
    assert_eq!(w.receiver.received()[0].webhook_id, delivery_id.to_string());
    for _ in 0..2 {
        w.platform
            .request_replay(delivery_id, "operator@example.com")
            .await
            .unwrap();
    }
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |r| r.len() == 3)
            .await,
        "the replays were not sent"
    );
    let got = w.receiver.received();
    assert!(got.iter().all(|r| r.webhook_id == got[0].webhook_id
        && r.body == got[0].body
        && r.verified == Some(true)));
    wait_for("manual attempts recorded", || async {
        let n: i64 = sql
            .query_one(
                "SELECT count(*) FROM walhook.attempts WHERE trigger = 'manual'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        n == 2
    })
    .await;
    let rows = sql
        .query(
            "SELECT number, trigger::text FROM walhook.attempts ORDER BY trigger, number",
            &[],
        )
        .await
        .unwrap();
    let seen: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    // One sequence per delivery: the replays follow the automatic attempt,
    // they are not attempt 1 again.
    assert_eq!(
        seen,
        vec![
            (1, "auto".into()),
            (2, "manual".into()),
            (3, "manual".into())
        ]
    );
    let row = sql
        .query_one(
            "SELECT status::text, attempt_count, manual_attempt_count FROM walhook.deliveries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, i32>(1),
            row.get::<_, i32>(2)
        ),
        ("succeeded".into(), 1, 2)
    );
    let open: i64 = sql
        .query_one(
            "SELECT count(*) FROM walhook.replay_requests WHERE done_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0);
    assert!(child.terminate().success());
}

#[tokio::test]
async fn a_410_disables_the_endpoint_and_tells_the_tenant() {
    let w = World::new().await;
    let gone = w.endpoint("acme", "gone", &["order.created"]).await;
    w.endpoint("acme", "ops", &["endpoint.disabled"]).await;
    w.receiver.set_behaviour("gone", Behaviour::Status(410));
    let child = Child::run(&w.config(FAST));
    w.wait_streaming().await;
    w.shop
        .execute("INSERT INTO orders VALUES (1, 'acme', 1)", &[])
        .await
        .unwrap();
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |r| r
                .iter()
                .any(|x| x.path == "ops"))
            .await,
        "no endpoint.disabled event arrived: {}",
        w.state().await
    );
    let event = w
        .receiver
        .received()
        .into_iter()
        .find(|r| r.path == "ops")
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&event.body).unwrap();
    assert_eq!(body["type"], "endpoint.disabled");
    assert_eq!(body["data"]["endpoint_id"], gone.to_string());
    assert!(body["data"]["reason"].as_str().unwrap().contains("410"));
    assert_eq!(event.verified, Some(true));
    let sql = &w.platform_sql;
    let row = sql
        .query_one(
            "SELECT enabled, config_version, disabled_reason FROM walhook.endpoints WHERE id = $1",
            &[&uuid::Uuid::from_bytes(gone.0)],
        )
        .await
        .unwrap();
    assert_eq!((row.get::<_, bool>(0), row.get::<_, i32>(1)), (false, 2));
    let audit: i64 = sql
        .query_one(
            "SELECT count(*) FROM walhook.audit_log WHERE action = 'endpoint.disabled'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audit, 1);
    let status: String = sql
        .query_one(
            "SELECT status::text FROM walhook.deliveries WHERE endpoint_id = $1",
            &[&uuid::Uuid::from_bytes(gone.0)],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "failed");
    // New events no longer go to the disabled endpoint.
    w.shop
        .execute("INSERT INTO orders VALUES (2, 'acme', 1)", &[])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.receiver
            .received()
            .iter()
            .filter(|r| r.path == "gone")
            .count(),
        1
    );
    assert!(child.terminate().success());
}
