//! Two dispatcher nodes against one platform database: `walhook run` and a
//! `walhook dispatch` node. When the first is killed, the second takes its
//! deliveries over once its lease lapses; when the first is frozen past its
//! lease and comes back, its late results are kept as history and never
//! change a delivery the second one finished.

use std::time::Duration;

use walhook_devkit::receiver::Behaviour;

use crate::support::{Child, World, assert_recent_window_reconciles, walhook};

async fn wait_arrivals(w: &World, path: &str, want: u64) {
    for _ in 0..600 {
        if w.receiver.arrivals(path) >= want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{want} requests did not reach {path} within 30 s ({}); {}",
        w.receiver.arrivals(path),
        w.state().await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_dispatcher_node_takes_over_and_fences_a_stale_one() {
    let w = World::new().await;
    w.endpoint("acme", "acme", &[]).await;
    let cfg = w.config("[reconcile]\nevery = \"0s\"\n");
    let node_b = Child(
        walhook()
            .args(["dispatch", "--config"])
            .arg(&cfg)
            .args(["--node-id", "node-b"])
            .env("WALHOOK_LOG", "warn")
            .spawn()
            .expect("cannot start walhook dispatch"),
    );

    // Killed with attempts in flight: node-b sends them once node `local`'s
    // lease lapses.
    w.receiver.set_behaviour(
        "acme",
        Behaviour::Delay {
            wait: Duration::from_secs(2),
            status: 200,
        },
    );
    let node_a = Child::run(&w.config("[reconcile]\nevery = \"0s\"\n"));
    w.wait_streaming().await;
    for i in 0..6i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    // Every event made (only this process captures), and attempts out.
    w.wait_count("events stored", "SELECT count(*) FROM walhook.events", 6)
        .await;
    wait_arrivals(&w, "acme", 1).await;
    node_a.kill();
    w.wait_count(
        "deliveries succeeded after the takeover",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        6,
    )
    .await;
    let (b_alive, taken_over): (bool, i64) = {
        let r = w
            .platform_sql
            .query_one(
                "SELECT (SELECT lease_until > now() FROM walhook.dispatch_nodes WHERE node_id = 'node-b'), \
                        (SELECT count(*) FROM walhook.attempts WHERE note = 'previous_outcome_unknown')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert!(b_alive, "node-b renews its lease");
    assert!(
        taken_over >= 1,
        "the deliveries node `local` had out were sent again, marked as such"
    );
    // Every delivery reached the receiver under one id, with the same body.
    let received = w.receiver.received();
    let mut by_id: std::collections::HashMap<String, Vec<Vec<u8>>> = Default::default();
    for r in &received {
        assert_eq!(r.verified, Some(true), "{r:?}");
        by_id
            .entry(r.webhook_id.clone())
            .or_default()
            .push(r.body.to_vec());
    }
    assert_eq!(by_id.len(), 6, "{received:?}");
    assert!(
        by_id
            .values()
            .all(|bodies| bodies.windows(2).all(|p| p[0] == p[1]))
    );

    // Frozen past its lease while its attempts are out (they will fail):
    // node-b sends them (they succeed); the frozen node's late failures are
    // kept as history and change nothing.
    w.receiver.set_behaviour(
        "acme",
        Behaviour::Delay {
            wait: Duration::from_secs(3),
            status: 500,
        },
    );
    let node_a = Child::run(&w.config("[reconcile]\nevery = \"0s\"\n"));
    w.wait_streaming().await;
    let before = w.receiver.arrivals("acme");
    for i in 100..104i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    wait_arrivals(&w, "acme", before + 4).await;
    node_a.signal("STOP");
    w.receiver.set_behaviour("acme", Behaviour::Status(200));
    w.wait_count(
        "deliveries node-b finished while node `local` was frozen",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        10,
    )
    .await;
    node_a.signal("CONT");
    // The frozen node's results arrive (a 500 or a timeout each) …
    w.wait_count(
        "the frozen node's late results",
        "SELECT count(*) FROM walhook.attempts a JOIN walhook.events e ON e.id = \
           (SELECT event_id FROM walhook.deliveries d WHERE d.id = a.delivery_id) \
         WHERE e.object_id::int >= 100 AND a.outcome <> 'succeeded'",
        4,
    )
    .await;
    // … and the deliveries stay as node-b left them.
    let rows = w
        .platform_sql
        .query(
            "SELECT d.status::text, d.last_http_status, d.attempt_count, d.lease_version \
             FROM walhook.deliveries d JOIN walhook.events e ON e.id = d.event_id \
             WHERE e.object_id::int >= 100",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    for r in &rows {
        let (status, http, attempts, lease): (String, Option<i32>, i32, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        assert_eq!(
            (status.as_str(), http),
            ("succeeded", Some(200)),
            "a stale result overwrote the newer one"
        );
        assert_eq!(attempts, 1, "one attempt number, used by both nodes");
        assert!(lease >= 2, "node-b claimed under a newer lease: {lease}");
    }
    // The history holds both nodes' attempts; reconciliation finds no gap.
    assert_recent_window_reconciles(&cfg);
    node_a.terminate();
    node_b.terminate();
}
