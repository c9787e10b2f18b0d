//! Faults outside walhook: the Postgres server (the business and the
//! platform database, one cluster here) killed with SIGKILL while walhook
//! streams and producers write, then started again.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use walhook_devkit::postgres::Reconnecting;
use walhook_devkit::receiver::Received;

use crate::support::{Child, World};

/// Writes orders 1, 2, … through its own connection until `stop`,
/// reconnecting after errors; returns the ids whose commit was
/// acknowledged and those whose outcome is unknown (the server died while
/// the statement ran).
async fn write_orders(url: String, stop: Arc<AtomicBool>) -> (Vec<i64>, Vec<i64>) {
    let (mut acked, mut unknown) = (Vec::new(), Vec::new());
    let mut session = Reconnecting::new(url);
    let mut id = 0i64;
    while !stop.load(Ordering::Relaxed) {
        id += 1;
        match session
            .execute("INSERT INTO orders VALUES ($1, 'acme', 10.50)", &[&id])
            .await
        {
            Ok(_) => acked.push(id),
            Err(_) => unknown.push(id),
        }
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    (acked, unknown)
}

/// The ids of the orders that reached `path` with a 2xx answer.
fn orders_at(all: &[Received], path: &str) -> BTreeSet<String> {
    all.iter()
        .filter(|r| r.path == path && (200..300).contains(&r.status))
        .filter_map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
            body["object_id"].as_str().map(str::to_owned)
        })
        .collect()
}

/// After crashes under load: every acknowledged commit is in the business
/// database, every order it kept reaches endpoint `orders` (within 120 s),
/// nothing else does, every signature verifies, and walhook (whose stderr
/// is `log`) still runs, never restarted. Returns the orders committed and
/// those delivered.
async fn assert_every_order_arrives(
    w: &World,
    child: &mut Child,
    log: &Path,
    acked: &[i64],
) -> (BTreeSet<String>, BTreeSet<String>) {
    // What the business database kept is the truth: every acknowledged
    // commit, and those of unknown outcome that made it.
    let shop = w.pg.connect("shop").await.unwrap();
    let committed: BTreeSet<String> = shop
        .query("SELECT id::text FROM orders", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for id in acked {
        assert!(
            committed.contains(&id.to_string()),
            "an acknowledged commit is gone: {id}"
        );
    }
    let want = committed.clone();
    let arrived = w
        .receiver
        .wait_until(Duration::from_secs(120), move |all| {
            want.is_subset(&orders_at(all, "orders"))
        })
        .await;
    let got = orders_at(&w.receiver.received(), "orders");
    let missing: Vec<&String> = committed.difference(&got).collect();
    assert!(
        arrived,
        "{} of {} committed orders never arrived (acked {}), walhook {}: {:?}\n{}",
        missing.len(),
        committed.len(),
        acked.len(),
        if child.running() { "running" } else { "exited" },
        missing.iter().take(10).collect::<Vec<_>>(),
        std::fs::read_to_string(log).unwrap_or_default()
    );
    let unexpected: Vec<&String> = got.difference(&committed).collect();
    assert!(unexpected.is_empty(), "not committed: {unexpected:?}");
    assert!(
        w.receiver
            .received()
            .iter()
            .filter(|r| r.path == "orders")
            .all(|r| r.verified == Some(true)),
        "a webhook with a bad signature"
    );
    assert!(
        child.running(),
        "walhook exited instead of reconnecting:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    (committed, got)
}

/// Crash rounds: two in CI; `WALHOOK_FAULT_ROUNDS=20` for the figures in
/// docs/reliability.md.
fn fault_rounds() -> u32 {
    std::env::var("WALHOOK_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// `kill -9` of Postgres under load, in rounds: walhook notices the lost connections,
/// reconnects by itself with backoff (the replication stream resumes from
/// its slot, which crash recovery keeps), and every order whose commit
/// survived the crash reaches the endpoint signed, without a restart of
/// walhook; nothing arrives that was not committed.
#[tokio::test]
async fn a_postgres_crash_under_load_loses_nothing() {
    let mut w = World::new().await;
    w.endpoint("acme", "orders", &["order.created"]).await;
    let cfg = w.config("");
    let log = w.dir.path().join("walhook.log");
    let mut child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_orders(w.pg.url("shop"), stop.clone()));
    let rounds = fault_rounds();
    let mut recoveries = Vec::new();
    for round in 0..rounds {
        // Deliveries flow again (after the previous crash) before the next.
        let since = std::time::Instant::now();
        let floor = w.receiver.count();
        let flowing = w
            .receiver
            .wait_until(Duration::from_secs(30), |all| all.len() > floor + 50)
            .await;
        assert!(
            flowing,
            "deliveries did not resume within 30 s after crash {round}:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        recoveries.push(since.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
        w.pg.crash_and_restart(Duration::from_millis(500))
            .await
            .unwrap();
    }
    eprintln!("after each crash, 50 more deliveries arrived within {recoveries:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (acked, unknown) = writer.await.unwrap();
    let (committed, got) = assert_every_order_arrives(&w, &mut child, &log, &acked).await;
    eprintln!(
        "{rounds} crashes: {} orders committed ({} acknowledged, {} of unknown outcome), {} delivered, {} requests",
        committed.len(),
        acked.len(),
        unknown.len(),
        got.len(),
        w.receiver.count()
    );
    w.platform_sql = w.pg.connect("platform").await.unwrap();
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
}

/// The business and the platform database on clusters of their own, each
/// killed with SIGKILL while the other stays up: capture alone loses its
/// stream, or fan-out, dispatch and capture's ledger lose their database
/// (two crashes of each in CI; `WALHOOK_FAULT_ROUNDS=20`: twenty of each).
/// walhook reconnects by itself each time and every committed order
/// arrives once at least.
#[tokio::test]
async fn either_database_crashing_alone_loses_nothing() {
    let mut w = World::new_split().await;
    w.endpoint("acme", "orders", &["order.created"]).await;
    let cfg = w.config("");
    let log = w.dir.path().join("walhook.log");
    let mut child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_orders(w.pg.url("shop"), stop.clone()));
    let rounds = fault_rounds();
    for which in (0..rounds).flat_map(|_| ["business", "platform"]) {
        let floor = w.receiver.count();
        assert!(
            w.receiver
                .wait_until(Duration::from_secs(30), |all| all.len() > floor + 50)
                .await,
            "deliveries did not flow before the {which} crash:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let cluster = match which {
            "business" => &mut w.pg,
            _ => w.platform_pg.as_mut().unwrap(),
        };
        cluster
            .crash_and_restart(Duration::from_millis(500))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (acked, unknown) = writer.await.unwrap();
    let (committed, got) = assert_every_order_arrives(&w, &mut child, &log, &acked).await;
    eprintln!(
        "{rounds} crashes of each database: {} orders committed ({} acknowledged, {} of unknown outcome), {} delivered, {} requests",
        committed.len(),
        acked.len(),
        unknown.len(),
        got.len(),
        w.receiver.count()
    );
    w.platform_sql = w
        .platform_pg
        .as_ref()
        .unwrap()
        .connect("platform")
        .await
        .unwrap();
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
}

/// Drops walhook's slot: ends the walsender reading it and drops it before
/// walhook reconnects (trying again while walhook wins the race).
async fn drop_slot_under_walhook(shop: &tokio_postgres::Client) {
    for _ in 0..200 {
        let dropped = shop
            .batch_execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = 'walhook' AND active_pid IS NOT NULL; \
                 SELECT pg_drop_replication_slot('walhook');",
            )
            .await;
        if dropped.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("could not drop the slot under walhook");
}

async fn slot_exists(shop: &tokio_postgres::Client) -> bool {
    shop.query_opt(
        "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'walhook'",
        &[],
    )
    .await
    .unwrap()
    .is_some()
}

/// A slot dropped while walhook streams: walhook halts with a definite
/// error naming the position it had read and the way on, and a restart does
/// not quietly create a new slot (which would skip what the old one held);
/// `--accept-slot-loss` records the gap as a capture incident and goes on
/// from a new slot.
#[tokio::test]
async fn a_dropped_slot_halts_capture_until_the_loss_is_accepted() {
    let w = World::new().await;
    w.endpoint("acme", "orders", &["order.created"]).await;
    let cfg = w.config("");
    let log = w.dir.path().join("walhook.log");
    let mut child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;
    let insert = |id: i64| {
        let shop = &w.shop;
        async move {
            shop.execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
                .await
                .unwrap();
        }
    };
    insert(1).await;
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |all| !all.is_empty())
            .await
    );
    // The checkpoint is saved every second or so; wait for one.
    w.wait_count(
        "a capture checkpoint",
        "SELECT count(*) FROM walhook.capture_checkpoints",
        1,
    )
    .await;
    drop_slot_under_walhook(&w.shop).await;
    insert(2).await; // committed while no slot holds it: the gap
    let status = child
        .wait_exit(Duration::from_secs(30))
        .expect("walhook kept running without its slot");
    assert!(!status.success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("does not exist, but source \"main\" has read from it up to")
            && text.contains("--accept-slot-loss"),
        "{text}"
    );
    assert!(!slot_exists(&w.shop).await, "a slot was created");

    // A plain restart refuses too, and creates nothing.
    let mut child = Child::run_logged(&cfg, &[], &log);
    let status = child
        .wait_exit(Duration::from_secs(30))
        .expect("walhook started without its slot");
    assert!(!status.success());
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("--accept-slot-loss")
    );
    assert!(!slot_exists(&w.shop).await, "a restart created a slot");

    // The operator accepts the loss: the gap is on record, capture goes on.
    let child = Child::run_with(&cfg, &[], &["--accept-slot-loss"], &log);
    w.wait_streaming().await;
    insert(3).await;
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(30), |all| {
                orders_at(all, "orders").contains("3")
            })
            .await,
        "nothing after the new slot arrived"
    );
    let incident = w
        .platform_sql
        .query_one(
            "SELECT count(*), min(detail) FROM walhook.capture_incidents WHERE kind = 'slot_reset'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(incident.get::<_, i64>(0), 1);
    assert!(
        incident.get::<_, String>(1).contains("were not captured"),
        "{:?}",
        incident.get::<_, String>(1)
    );
    assert!(child.terminate().success());
}

/// Network faults between walhook and its receivers, through a loopback
/// fault proxy per endpoint (latency, a reset in the middle of the
/// response, a black hole, a slow close, a response trickled a byte at a
/// time, an endpoint flapping between up and refused). While a fault holds,
/// each attempt ends within the request timeout (5 s here) + 1 s and is
/// retried; once it clears, every delivery arrives. Nothing is lost.
#[tokio::test]
async fn network_faults_toward_receivers_lose_nothing() {
    use walhook_devkit::faultproxy::{Fault, FaultProxy};
    let w = World::new().await;
    let faults = [
        ("latency", Fault::Latency(Duration::from_millis(400))),
        ("reset", Fault::ResetMidBody),
        ("blackhole", Fault::BlackHole),
        ("slowclose", Fault::SlowClose(Duration::from_secs(8))),
        ("trickle", Fault::Trickle(Duration::from_millis(100))),
        ("flap", Fault::Flap(Duration::from_millis(700))),
    ];
    let mut proxies = Vec::new();
    let mut endpoints = Vec::new();
    for (path, fault) in faults {
        let proxy = FaultProxy::start(w.receiver.addr()).await.unwrap();
        proxy.set(fault);
        let id = w
            .endpoint_at("acme", &proxy.url(path), &["order.created"])
            .await;
        endpoints.push((path, id));
        proxies.push(proxy);
    }
    let cfg = w.config("");
    let log = w.dir.path().join("walhook.log");
    let child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;
    const ORDERS: i64 = 5;
    // Spread over two flap periods, so that some land while it is down.
    for id in 1..=ORDERS {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    // Long enough for a black-holed attempt to time out and be retried.
    tokio::time::sleep(Duration::from_secs(7)).await;
    for p in &proxies {
        p.set(Fault::None);
    }
    let paths: Vec<&str> = faults.iter().map(|(p, _)| *p).collect();
    // Failing endpoints' circuits opened (30 s cool-down, longer after a
    // failed probe on a loaded machine): wait for their probes.
    let all_arrived = w
        .receiver
        .wait_until(Duration::from_secs(180), |all| {
            paths
                .iter()
                .all(|path| orders_at(all, path).len() == ORDERS as usize)
        })
        .await;
    assert!(
        all_arrived,
        "not every delivery arrived after the faults cleared:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    w.wait_count(
        "every delivery succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        ORDERS * faults.len() as i64,
    )
    .await;
    // Per endpoint: the slowest attempt, and the attempts that failed.
    let mut figures = Vec::new();
    for (path, id) in &endpoints {
        let row = w
            .platform_sql
            .query_one(
                "SELECT coalesce(max(latency_ms), 0), count(*) FILTER (WHERE outcome <> 'succeeded'), \
                        string_agg(DISTINCT error_class, ',') \
                 FROM walhook.attempts WHERE endpoint_id = $1",
                &[&uuid::Uuid::from_bytes(id.0)],
            )
            .await
            .unwrap();
        let (slowest, failed, classes): (i32, i64, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        assert!(
            slowest <= 5_000 + 1_000,
            "{path}: an attempt took {slowest} ms, past the request timeout + 1 s"
        );
        figures.push((*path, slowest, failed, classes));
    }
    let of = |path: &str| figures.iter().find(|f| f.0 == path).unwrap().clone();
    assert!(of("latency").1 >= 400, "{figures:?}");
    for path in ["reset", "blackhole", "trickle", "flap"] {
        assert!(of(path).2 > 0, "{path} never failed: {figures:?}");
    }
    assert!(
        of("blackhole")
            .3
            .as_deref()
            .unwrap_or_default()
            .contains("timeout"),
        "{figures:?}"
    );
    assert!(
        of("slowclose").1 < 2_000 && of("slowclose").2 == 0,
        "a slow close held the attempt: {figures:?}"
    );
    eprintln!("per endpoint (slowest ms, failed attempts, classes): {figures:?}");
    assert!(child.terminate().success());
}

/// `walhook chaos`, short: one round of every fault (failpoints, SIGKILL,
/// kill -9 of Postgres, network faults) judged against the business
/// database; the full run is in docs/reliability.md.
#[tokio::test]
async fn walhook_chaos_rounds_are_clean() {
    let (report, text) =
        crate::support::run_chaos(&["--rounds", "20", "--seed", "1", "--writes", "60"]);
    let rounds = report["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 20);
    let faults: BTreeSet<&str> = rounds
        .iter()
        .map(|r| r["fault"].as_str().unwrap())
        .collect();
    assert_eq!(faults.len(), 20, "every fault once: {faults:?}");
    for r in rounds {
        assert!(r["expected"].as_u64().unwrap() > 0, "{r}");
        for field in ["lost", "unexpected", "unstable_ids", "bad_signatures"] {
            assert_eq!(r[field], 0, "{field}: {r}");
        }
        // A frozen walhook's attempt lasts as long as the freeze.
        if r["fault"] != "lease-expiry" {
            assert!(r["slowest_attempt_ms"].as_i64().unwrap() <= 3_000, "{r}");
        }
    }
    // The failpoints and the kill stopped walhook, and it was started again.
    for r in rounds.iter().filter(|r| {
        let f = r["fault"].as_str().unwrap();
        f.contains('.') || f == "sigkill"
    }) {
        assert_eq!(r["walhook_restarted"], true, "{r}");
    }
    assert_eq!(report["clean"], true);
    assert!(text.contains("clean: nothing lost"), "{text}");
}

/// A short soak: every default soak fault once while orders stream, the
/// samples and the report written, and nothing lost. (The drift verdict
/// needs the long run's warm-up; a 45 s run is judged field by field.)
#[tokio::test(flavor = "multi_thread")]
async fn a_short_walhook_chaos_soak_samples_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let report_dir = dir.path().join("soak");
    let out = crate::support::run(
        crate::support::walhook()
            .args([
                "chaos",
                "--soak",
                "45s",
                "--rate",
                "150",
                "--fault-every",
                "5s",
                "--sample-every",
                "2s",
                "--report",
            ])
            .arg(&report_dir),
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: serde_json::Value = serde_json::from_slice(
        &std::fs::read(report_dir.join("soak.json"))
            .unwrap_or_else(|e| panic!("{e}: {text}\n{}", crate::support::stderr(&out))),
    )
    .unwrap();
    for field in [
        "lost",
        "unexpected",
        "unstable_ids",
        "bad_signatures",
        "walhook_restarts",
    ] {
        assert_eq!(report[field], 0, "{field}: {text}");
    }
    assert!(
        report["orders_committed"].as_u64().unwrap() > 3_000,
        "{text}"
    );
    // Three endpoints per order.created, four per order.paid (every fourth
    // order, paid on the next tick: the last tick's orders stay unpaid).
    let (expected, orders) = (
        report["webhooks_expected"].as_u64().unwrap(),
        report["orders_committed"].as_u64().unwrap(),
    );
    // (Ids whose insert a fault cut off leave gaps, so "every fourth" is
    // about a quarter of the orders kept, not exactly.)
    let ratio = expected as f64 / orders as f64;
    assert!(
        (3.95..4.05).contains(&ratio),
        "{expected} for {orders} orders"
    );
    let faults: BTreeSet<&str> = report["faults"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["fault"].as_str().unwrap())
        .collect();
    assert_eq!(
        faults,
        BTreeSet::from([
            "postgres-kill",
            "receiver-reset",
            "pg-connection-limit",
            "receiver-blackhole",
            "pg-cancel-storm"
        ])
    );
    let samples = report["samples"].as_array().unwrap();
    assert!(samples.len() >= 15, "{}", samples.len());
    let read = |s: &serde_json::Value, f: &str| s[f].as_f64();
    assert!(
        samples
            .iter()
            .all(|s| read(s, "rss_mib").is_some_and(|v| v > 1.0))
    );
    assert!(
        samples
            .iter()
            .any(|s| read(s, "history_tables_mib").is_some_and(|v| v > 0.0))
    );
    assert!(
        samples
            .iter()
            .any(|s| read(s, "pg_sessions").is_some_and(|v| v >= 2.0))
    );
    let html = std::fs::read_to_string(report_dir.join("soak.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("walhook RSS") && html.contains("pg-cancel-storm")
    );
    assert!(report_dir.join("soak.svg").exists());
}
