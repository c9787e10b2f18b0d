//! Tenants share dispatch capacity by weight: with more work than slots, a
//! tenant of weight 3 gets three attempts for each one of a tenant of
//! weight 1 (within 10 % over 480 attempts), through the real pipeline.

use std::time::Duration;

use walhook_devkit::receiver::Behaviour;

use crate::support::{Child, World};

/// Orders of each tenant: gold's 400 last through its share of the first
/// 480 answers (3 : 1 gives it 360), so both have work waiting throughout
/// the window measured.
const ORDERS_EACH: i64 = 400;

/// Answers measured: at least 400 attempts under contention.
const WINDOW: usize = 480;

/// Weights 3 : 1 under contention (four slots, both backlogs far longer),
/// on real Postgres and a real receiver: of the first 480 answers, gold's
/// share over bronze's is within 10 % of 3 (2.7 to 3.3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_slots_in_proportion_to_their_weights() {
    let w = World::new().await;
    w.endpoint("gold", "gold", &[]).await;
    w.endpoint("bronze", "bronze", &[]).await;
    w.platform_sql
        .batch_execute("UPDATE walhook.tenants SET weight = 3 WHERE id = 'gold'")
        .await
        .unwrap();
    // Equal answer times: a share of slots is then the same share of
    // attempts.
    for path in ["gold", "bronze"] {
        w.receiver.set_behaviour(
            path,
            Behaviour::Delay {
                wait: Duration::from_millis(100),
                status: 200,
            },
        );
    }
    // Four slots for the whole node: both tenants want more.
    let cfg = w.config("[reconcile]\nevery = \"0s\"\n");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("[dispatch]\n", "[dispatch]\nmax_in_flight = 4\n");
    std::fs::write(&cfg, text).unwrap();
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    // One transaction: both backlogs reach the dispatcher together.
    w.shop
        .execute(
            "INSERT INTO orders SELECT i, CASE WHEN i % 2 = 0 THEN 'gold' ELSE 'bronze' END, 1 \
             FROM generate_series(1, $1::int8) i",
            &[&(2 * ORDERS_EACH)],
        )
        .await
        .unwrap();
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        2 * ORDERS_EACH,
    )
    .await;
    child.terminate();
    let received = w.receiver.received();
    let mut by_time: Vec<(std::time::Instant, String)> =
        received.iter().map(|r| (r.at, r.path.clone())).collect();
    by_time.sort();
    let window: Vec<&String> = by_time.iter().take(WINDOW).map(|(_, p)| p).collect();
    let gold = window.iter().filter(|p| p.as_str() == "gold").count();
    let bronze = window.len() - gold;
    assert!(
        window.len() == WINDOW && (gold as i64) < ORDERS_EACH && (bronze as i64) < ORDERS_EACH,
        "both tenants must have work waiting through the window: {gold} : {bronze} of {}",
        window.len()
    );
    let ratio = gold as f64 / bronze.max(1) as f64;
    println!(
        "weights 3 : 1, the first {WINDOW} answers: gold {gold}, bronze {bronze}, ratio {ratio:.3}"
    );
    assert!(
        (2.7..=3.3).contains(&ratio),
        "gold got {gold} and bronze {bronze} of the first {WINDOW} answers, a ratio of {ratio:.3}, \
         not within 10 % of 3 : 1 (360 : 120)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_own_budget_caps_its_attempts_in_flight() {
    let w = World::new().await;
    w.endpoint("capped", "capped", &[]).await;
    w.platform_sql
        .batch_execute("UPDATE walhook.tenants SET max_in_flight = 1 WHERE id = 'capped'")
        .await
        .unwrap();
    w.receiver.set_behaviour(
        "capped",
        Behaviour::Delay {
            wait: Duration::from_millis(300),
            status: 200,
        },
    );
    let child = Child::run(&w.config("[reconcile]\nevery = \"0s\"\n"));
    w.wait_streaming().await;
    w.shop
        .batch_execute("INSERT INTO orders SELECT i, 'capped', 1 FROM generate_series(1, 6) i")
        .await
        .unwrap();
    w.wait_count(
        "deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        6,
    )
    .await;
    child.terminate();
    // One at a time: each answer comes a whole delay after the one before
    // (the endpoint alone would allow 16 at once).
    let mut at: Vec<std::time::Instant> = w.receiver.received().iter().map(|r| r.at).collect();
    at.sort();
    let gaps: Vec<Duration> = at.windows(2).map(|p| p[1] - p[0]).collect();
    assert!(
        gaps.iter().all(|g| *g >= Duration::from_millis(250)),
        "answers closer than one delay apart, so more than one was in flight: {gaps:?}"
    );
}
