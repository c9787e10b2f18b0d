//! The whole path on the embedded default: business writes become verified
//! webhooks.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use walhook_devkit::receiver::{Behaviour, Received};

use crate::support::{Child, World};

mod replays;

fn body(r: &Received) -> serde_json::Value {
    serde_json::from_slice(&r.body).expect("the body is JSON")
}

/// (type, object id) of a received webhook.
fn key(r: &Received) -> (String, String) {
    let b = body(r);
    (
        b["type"].as_str().unwrap().to_owned(),
        b["object_id"].as_str().unwrap().to_owned(),
    )
}

#[tokio::test]
async fn business_writes_become_verified_webhooks() {
    let w = World::new().await;
    w.endpoint("acme", "acme-all", &[]).await;
    w.endpoint("acme", "acme-invoices", &["invoice.paid"]).await;
    w.endpoint(
        "globex",
        "globex-orders",
        &["order.created", "user.disabled"],
    )
    .await;
    w.receiver
        .set_behaviour("acme-all", Behaviour::FailEvery { n: 3, status: 503 });
    let child = Child::run(&w.config(""));
    w.wait_streaming().await;

    let mut expected: HashMap<String, HashSet<(String, String)>> = HashMap::new();
    let mut add = |path: &str, t: &str, id: i64| {
        expected
            .entry(path.to_owned())
            .or_default()
            .insert((t.to_owned(), id.to_string()));
    };
    for i in 0..30i64 {
        let tenant = if i % 2 == 0 { "acme" } else { "globex" };
        w.shop
            .execute(
                "INSERT INTO orders VALUES ($1, $2, $3::text::numeric)",
                &[&i, &tenant, &format!("{i}.50")],
            )
            .await
            .unwrap();
        w.shop
            .execute(
                "INSERT INTO invoices VALUES ($1, $2, 'open', $3)",
                &[&i, &tenant, &(i * 100)],
            )
            .await
            .unwrap();
        w.shop
            .execute(
                "INSERT INTO users VALUES ($1, $2, $3)",
                &[&i, &tenant, &format!("u{i}@example.com")],
            )
            .await
            .unwrap();
        if tenant == "acme" {
            add("acme-all", "order.created", i);
        } else {
            add("globex-orders", "order.created", i);
        }
    }
    for i in (0..30i64).filter(|i| i % 3 == 0) {
        w.shop
            .execute("UPDATE invoices SET status = 'paid' WHERE id = $1", &[&i])
            .await
            .unwrap();
        w.shop
            .execute("UPDATE users SET disabled = true WHERE id = $1", &[&i])
            .await
            .unwrap();
        if i % 2 == 0 {
            add("acme-all", "invoice.paid", i);
            add("acme-invoices", "invoice.paid", i);
            add("acme-all", "user.disabled", i);
        } else {
            add("globex-orders", "user.disabled", i);
        }
    }
    // Paid twice: still one event.
    w.shop
        .execute("UPDATE invoices SET status = 'paid' WHERE id = 0", &[])
        .await
        .unwrap();

    let all_received = |got: &[Received]| {
        expected.iter().all(|(path, keys)| {
            let seen: HashSet<(String, String)> = got
                .iter()
                .filter(|r| &r.path == path && (200..300).contains(&r.status))
                .map(key)
                .collect();
            keys.is_subset(&seen)
        })
    };
    if !w
        .receiver
        .wait_until(Duration::from_secs(60), all_received)
        .await
    {
        panic!("not every expected webhook arrived: {}", w.state().await);
    }
    let got = w.receiver.received();

    // Nothing unexpected, every signature verified by the receiver's own
    // verifier, exact captured bytes, one webhook-id per (event, endpoint).
    let mut ids: HashMap<(String, (String, String)), String> = HashMap::new();
    for r in &got {
        let k = key(r);
        assert!(
            expected[&r.path].contains(&k),
            "unexpected {k:?} at {}",
            r.path
        );
        assert_eq!(
            r.verified,
            Some(true),
            "signature not verified for {k:?} at {}",
            r.path
        );
        let id = ids
            .entry((r.path.clone(), k.clone()))
            .or_insert_with(|| r.webhook_id.clone());
        assert_eq!(id, &r.webhook_id, "a retry changed webhook-id");
        // The headers that say when the event happened and which schema
        // version its body follows repeat the body's own fields.
        let b = body(r);
        assert_eq!(
            (r.event_occurred_at.as_str(), r.schema_version.as_str()),
            (
                b["occurred_at"].as_str().unwrap(),
                b["schema_version"].to_string().as_str()
            ),
            "walhook-event-occurred-at / walhook-schema-version"
        );
        let row = w
            .platform_sql
            .query_one(
                "SELECT payload FROM walhook.events WHERE id::text = $1",
                &[&uuid_of(&r.event_id)],
            )
            .await
            .unwrap();
        let stored: Vec<u8> = row.get(0);
        assert_eq!(
            stored,
            r.body.to_vec(),
            "the body differs from the captured bytes"
        );
    }
    let retried = got
        .iter()
        .filter(|r| r.path == "acme-all" && r.status == 503)
        .count();
    assert!(retried > 0, "the flaky endpoint never failed");
    let expected_total: usize = expected.values().map(HashSet::len).sum();
    assert_eq!(ids.len(), expected_total);

    // The platform agrees (a delivery's row is written with its first
    // attempt's outcome, just after the receiver answered).
    w.wait_count(
        "every delivery recorded as succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        expected_total as i64,
    )
    .await;
    let row = w
        .platform_sql
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*), (SELECT count(*) FROM walhook.attempts) FROM walhook.deliveries",
            &[],
        )
        .await
        .unwrap();
    let (succeeded, total, attempts): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(
        (succeeded, total),
        (expected_total as i64, expected_total as i64)
    );
    assert!(attempts > total, "retries were not recorded as attempts");

    let status = child.terminate();
    assert!(
        status.success(),
        "walhook run did not stop cleanly: {status}"
    );
}

/// `evt_…` → the UUID text Postgres prints.
pub fn uuid_of(event_id: &str) -> String {
    let id: walhook_pipeline::ids::EventId = event_id.parse().unwrap();
    uuid::Uuid::from_bytes(id.0).to_string()
}

/// Writes orders for alternating tenants until stopped; returns the ids.
fn start_writer(
    w: &World,
    per_second: u64,
) -> (
    tokio::task::JoinHandle<Vec<i64>>,
    tokio_util::sync::CancellationToken,
) {
    let stop = tokio_util::sync::CancellationToken::new();
    let url = w.pg.url("shop");
    let s = stop.clone();
    let handle = tokio::spawn(async move {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut written = Vec::new();
        let mut id = 1_000_000i64;
        let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
        while !s.is_cancelled() {
            tick.tick().await;
            let tenant = if id % 2 == 0 { "acme" } else { "globex" };
            client
                .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&id, &tenant])
                .await
                .unwrap();
            written.push(id);
            id += 1;
        }
        written
    });
    (handle, stop)
}

#[tokio::test]
async fn sigkill_at_random_moments_loses_nothing() {
    let w = World::new().await;
    w.endpoint("acme", "acme-a", &[]).await;
    w.endpoint("acme", "acme-b", &["order.created"]).await;
    w.endpoint("globex", "globex-a", &[]).await;
    w.receiver
        .set_behaviour("acme-b", Behaviour::FailEvery { n: 4, status: 500 });
    let cfg = w.config("");
    let child = Child::run(&cfg);
    w.wait_streaming().await;
    let (writer, stop_writing) = start_writer(&w, 150);
    let mut child = Some(child);
    let mut kills = 0;
    for round in 0..12u64 {
        // A spread of moments: early in start-up, mid-stream, later.
        let wait = 150 + (round * 7919 + rand_u64()) % 1300;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if let Some(c) = child.take() {
            c.kill();
            kills += 1;
        }
        child = Some(Child::run(&cfg));
    }
    stop_writing.cancel();
    let written = writer.await.unwrap();
    assert!(kills >= 10);
    assert!(written.len() > 500, "too little load: {}", written.len());

    let mut expected: HashMap<&str, HashSet<(String, String)>> = HashMap::new();
    for id in &written {
        let paths: &[&str] = if id % 2 == 0 {
            &["acme-a", "acme-b"]
        } else {
            &["globex-a"]
        };
        for p in paths {
            expected
                .entry(p)
                .or_default()
                .insert(("order.created".into(), id.to_string()));
        }
    }
    let done = |got: &[Received]| {
        expected.iter().all(|(path, keys)| {
            let seen: HashSet<(String, String)> = got
                .iter()
                .filter(|r| r.path == *path && (200..300).contains(&r.status))
                .map(key)
                .collect();
            keys.is_subset(&seen)
        })
    };
    if !w.receiver.wait_until(Duration::from_secs(120), done).await {
        panic!(
            "deliveries were lost after {kills} kills: {}",
            w.state().await
        );
    }
    let got = w.receiver.received();
    let mut ids: HashMap<(String, (String, String)), String> = HashMap::new();
    let mut duplicates = 0;
    for r in got.iter().filter(|r| (200..300).contains(&r.status)) {
        let k = key(r);
        assert!(
            expected[r.path.as_str()].contains(&k),
            "unexpected {k:?} at {}",
            r.path
        );
        assert_eq!(r.verified, Some(true));
        match ids.get(&(r.path.clone(), k.clone())) {
            Some(id) => {
                assert_eq!(id, &r.webhook_id, "a duplicate carried a new webhook-id");
                duplicates += 1;
            }
            None => {
                ids.insert((r.path.clone(), k), r.webhook_id.clone());
            }
        }
    }
    eprintln!(
        "{kills} kills, {} writes, {} deliveries, {duplicates} duplicate successes",
        written.len(),
        ids.len()
    );
    assert!(child.unwrap().terminate().success());
    w.assert_pending_consistent().await;
    w.assert_plans_written().await;
    // The capture ledger counted every transaction once across the kills.
    assert_ledger_matches_events(&w).await;
}

/// Panics unless the capture ledger holds, per source and minute of commit
/// time, exactly the events stored (every transaction counted once).
async fn assert_ledger_matches_events(w: &World) {
    let mismatched: Vec<(String, i64, Option<i64>)> = w
        .platform_sql
        .query(
            "WITH e AS (SELECT source, date_trunc('minute', occurred_at) AS w, count(*) AS n \
                        FROM walhook.events GROUP BY 1, 2), \
                  l AS (SELECT source, window_start AS w, sum(events)::int8 AS n \
                        FROM walhook.capture_ledger GROUP BY 1, 2) \
             SELECT w::text, coalesce(e.n, 0), l.n FROM e FULL JOIN l USING (source, w) \
             WHERE e.n IS DISTINCT FROM l.n",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert!(
        mismatched.is_empty(),
        "minutes whose ledger differs from the events stored (minute, events, ledger): {mismatched:?}"
    );
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

#[tokio::test]
async fn endpoint_changes_are_honoured_within_a_second() {
    let w = World::new().await;
    let a = w.endpoint("acme", "a", &[]).await;
    let b = w.endpoint("acme", "b", &["order.created"]).await;
    let child = Child::run(&w.config(""));
    w.wait_streaming().await;
    let (writer, stop_writing) = start_writer(&w, 100);
    let now = || std::time::SystemTime::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c_created = now();
    let c = w.endpoint("acme", "c", &["order.created"]).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let a_disabled = now();
    w.platform
        .update_endpoint(
            a,
            &walhook_sql::endpoints::EndpointChange {
                enabled: Some(false),
                ..Default::default()
            },
            "test",
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b_unsubscribed = now();
    let types = vec![walhook_pipeline::event::EventType::new("invoice.paid").unwrap()];
    let b_version = w
        .platform
        .update_endpoint(
            b,
            &walhook_sql::endpoints::EndpointChange {
                event_types: Some(types),
                ..Default::default()
            },
            "test",
        )
        .await
        .unwrap();
    assert_eq!(b_version, 2);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_writing.cancel();
    writer.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let uuid = |id: walhook_pipeline::ids::EndpointId| uuid::Uuid::from_bytes(id.0);
    let rows = w
        .platform_sql
        .query(
            "SELECT d.endpoint_id, e.occurred_at, d.endpoint_config_version FROM walhook.deliveries d \
             JOIN walhook.events e ON e.id = d.event_id WHERE d.tenant_id = 'acme'",
            &[],
        )
        .await
        .unwrap();
    let second = Duration::from_secs(1);
    let (mut a_n, mut b_n, mut c_n) = (0, 0, 0);
    for r in &rows {
        let endpoint: uuid::Uuid = r.get(0);
        let at: std::time::SystemTime = r.get(1);
        let version: i32 = r.get(2);
        if endpoint == uuid(a) {
            a_n += 1;
            assert!(
                at < a_disabled + second,
                "a disabled endpoint got a delivery"
            );
            assert_eq!(version, 1);
        } else if endpoint == uuid(b) {
            b_n += 1;
            assert!(
                at < b_unsubscribed + second,
                "an unsubscribed endpoint got a delivery"
            );
            assert_eq!(version, 1, "a delivery changed its config version");
        } else if endpoint == uuid(c) {
            c_n += 1;
            assert!(at > c_created, "a delivery predates its endpoint");
        }
    }
    // Every acme order after C existed (+1 s) went to C, and before each
    // change (−0 s) to A and B.
    let orders = w
        .shop
        .query("SELECT id FROM orders WHERE tenant_id = 'acme'", &[])
        .await
        .unwrap()
        .len();
    assert!(
        a_n > 0 && b_n > 0 && c_n > 0,
        "a {a_n}, b {b_n}, c {c_n} of {orders}"
    );
    let c_expected = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.events WHERE tenant_id = 'acme' AND occurred_at > $1",
            &[&(c_created + second)],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    let c_made = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.deliveries d JOIN walhook.events e ON e.id = d.event_id \
             WHERE d.endpoint_id = $1 AND e.occurred_at > $2",
            &[&uuid(c), &(c_created + second)],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(
        c_made, c_expected,
        "the new endpoint missed events more than a second after it was created"
    );
    // And every acme order more than a second before B's change went to B.
    let cutoff = b_unsubscribed - second;
    let b_before = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.events WHERE tenant_id = 'acme' AND occurred_at < $1",
            &[&cutoff],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    let b_made = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.deliveries d JOIN walhook.events e ON e.id = d.event_id \
             WHERE d.endpoint_id = $1 AND e.occurred_at < $2",
            &[&uuid(b), &cutoff],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(
        b_made, b_before,
        "the subscribed endpoint missed events from before its change"
    );
    assert!(child.terminate().success());
}

/// The database holds deliveries to one per (event, endpoint) by itself: a
/// row's id must be the one derived from the pair, and the primary key
/// does the rest (no second unique index on the hot path).
#[tokio::test]
async fn the_database_accepts_only_derived_delivery_ids() {
    use uuid::Uuid;
    use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId};

    let w = World::new().await;
    let event = EventId([1; 16]);
    let endpoint = EndpointId([2; 16]);
    let insert = |id: Uuid| {
        let sql = &w.platform_sql;
        async move {
            sql.execute(
                "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, \
                   event_occurred_at, endpoint_config_version, next_attempt_at, expires_at) \
                 VALUES ($1, $2, $3, 'acme', 'order.created', now(), 1, now(), now() + interval '1 day')",
                &[&id, &Uuid::from_bytes(event.0), &Uuid::from_bytes(endpoint.0)],
            )
            .await
        }
    };
    let today: String = w
        .platform_sql
        .query_one(
            "SELECT walhook.ensure_day_partition('deliveries', (now() AT TIME ZONE 'UTC')::date)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let derived = Uuid::from_bytes(DeliveryId::derive(event, endpoint).0);
    insert(derived).await.expect("the derived id is accepted");
    let again = insert(derived).await.unwrap_err();
    // The day's partition carries the key on id (migration 0024).
    assert_eq!(
        again.as_db_error().and_then(|e| e.constraint()),
        Some(format!("{today}_pkey").as_str()),
        "{again}"
    );
    let other = insert(Uuid::from_bytes([9; 16])).await.unwrap_err();
    assert_eq!(
        other.as_db_error().and_then(|e| e.constraint()),
        Some("deliveries_id_is_derived"),
        "{other}"
    );
}

/// Whether every one of `orders` reached both `acme-a` and `acme-b` with a
/// 2xx answer.
fn reached_both(orders: &[i64]) -> impl Fn(&[Received]) -> bool + use<> {
    let expected: HashSet<(String, String)> = orders
        .iter()
        .flat_map(|id| ["acme-a", "acme-b"].map(|p| (p.to_owned(), id.to_string())))
        .collect();
    move |got| {
        let seen: HashSet<(String, String)> = got
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .map(|r| (r.path.clone(), key(r).1))
            .collect();
        expected.is_subset(&seen)
    }
}

/// The seeds' dangerous points, hit exactly: `walhook run` aborts right
/// after fan-out committed a batch of deliveries but before its position
/// moved (so capture reads the events again), and right after a receiver
/// answered a POST that was not recorded yet. After a restart nothing is
/// lost, no delivery is made twice, and the unrecorded POST is sent again
/// with the same `webhook-id` and bytes.
#[tokio::test]
async fn crashes_at_the_dangerous_points_lose_nothing() {
    for (failpoint, resent) in [
        ("fanout.after_materialize=abort@1", false),
        ("dispatch.after_send=abort@5", true),
    ] {
        let w = World::new().await;
        w.endpoint("acme", "acme-a", &[]).await;
        w.endpoint("acme", "acme-b", &["order.created"]).await;
        let cfg = w.config("");
        let mut crashing = Child::run_with_env(&cfg, &[("WALHOOK_FAILPOINTS", failpoint)]);
        w.wait_streaming().await;
        let orders: Vec<i64> = (1..=20).collect();
        for id in &orders {
            w.shop
                .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[id])
                .await
                .unwrap();
        }
        let mut status = None;
        for _ in 0..300 {
            status = crashing.0.try_wait().unwrap();
            if status.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let status = status.unwrap_or_else(|| panic!("{failpoint} did not fire within 30 s"));
        assert!(!status.success(), "{failpoint}: {status}");
        let before_restart = w.receiver.count();

        let child = Child::run(&cfg);
        let all_there = reached_both(&orders);
        assert!(
            w.receiver
                .wait_until(Duration::from_secs(60), all_there)
                .await,
            "{failpoint}: deliveries lost: {}",
            w.state().await
        );
        // Rows are written with the attempts' outcomes, just after the
        // receiver answered: wait for them, then for any extra one.
        w.wait_count(
            &format!("{failpoint}: the deliveries' rows"),
            "SELECT count(*) FROM walhook.deliveries",
            40,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let made: i64 = w
            .platform_sql
            .query_one("SELECT count(*) FROM walhook.deliveries", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(made, 40, "{failpoint}: deliveries made twice or missing");
        let got = w.receiver.received();
        let mut first: HashMap<String, &Received> = HashMap::new();
        let mut again = 0;
        for r in &got {
            match first.get(&r.webhook_id) {
                Some(earlier) => {
                    assert_eq!(
                        earlier.body, r.body,
                        "{failpoint}: a resend changed the bytes"
                    );
                    assert_eq!(earlier.path, r.path);
                    again += 1;
                }
                None => {
                    first.insert(r.webhook_id.clone(), r);
                }
            }
            assert_eq!(r.verified, Some(true));
        }
        assert_eq!(first.len(), 40, "{failpoint}: {} webhook-ids", first.len());
        if resent {
            assert!(
                before_restart >= 5 && again >= 1,
                "{failpoint}: the POST answered before the crash was not sent again \
                 ({before_restart} before the restart, {again} repeats)"
            );
        }
        assert!(child.terminate().success());
        w.assert_pending_consistent().await;
        w.assert_plans_written().await;
        assert_ledger_matches_events(&w).await;
    }
}

/// `walhook run` on `w`'s configuration with `failpoint` set; its log
/// (stderr) goes to the returned file.
fn run_with_failpoint(w: &World, failpoint: &str) -> (Child, std::path::PathBuf) {
    let cfg = w.config("");
    let log = w.dir.path().join("walhook.log");
    let child = Child::run_logged(&cfg, &[("WALHOOK_FAILPOINTS", failpoint)], &log);
    (child, log)
}

/// Fan-out's write commits and its answer is lost (the connection breaks
/// between the two): fan-out tries the batch again, finds it stored, and
/// must still hand its deliveries to dispatch. Without that they would wait
/// for walhook's next start, unsent while it runs. Every order arrives once,
/// without a restart.
#[tokio::test]
async fn a_fan_out_write_whose_answer_is_lost_still_delivers_without_a_restart() {
    let w = World::new().await;
    w.endpoint("acme", "acme-a", &[]).await;
    w.endpoint("acme", "acme-b", &["order.created"]).await;
    let (mut child, log) = run_with_failpoint(&w, "fanout.answer_lost=end@1");
    w.wait_streaming().await;
    let orders: Vec<i64> = (1..=20).collect();
    for id in &orders {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[id])
            .await
            .unwrap();
    }
    let all_there = reached_both(&orders);
    let arrived = w
        .receiver
        .wait_until(Duration::from_secs(30), all_there)
        .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("fanout.answer_lost"),
        "the failpoint did not fire:\n{text}"
    );
    assert!(arrived, "deliveries held back: {}\n{text}", w.state().await);
    assert!(child.running(), "walhook exited:\n{text}");
    w.wait_count(
        "the deliveries' rows",
        "SELECT count(*) FROM walhook.deliveries",
        40,
    )
    .await;
    let ids: Vec<String> = w
        .receiver
        .received()
        .iter()
        .map(|r| r.webhook_id.clone())
        .collect();
    let once: HashSet<&String> = ids.iter().collect();
    assert_eq!((once.len(), ids.len()), (40, 40), "each delivery sent once");
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
    w.assert_plans_written().await;
}

/// The sweeper's claim of due deliveries (here test events, unheld until
/// claimed) commits and its answer is lost: the deliveries are this live
/// node's in Postgres and nowhere in its memory. The sweeper takes what the
/// node holds again at its next round, and they are sent, without a
/// restart.
#[tokio::test]
async fn a_claim_whose_answer_is_lost_is_taken_again_and_sent() {
    let w = World::new().await;
    let endpoint = w.endpoint("acme", "acme-a", &[]).await;
    let (mut child, log) = run_with_failpoint(&w, "dispatch.claim_answer_lost=end@1");
    w.wait_streaming().await;
    let tenant = walhook_pipeline::ids::TenantId::new("acme").unwrap();
    for _ in 0..5 {
        let (event, delivery) = walhook_api::test_event::build(
            &tenant,
            endpoint,
            1,
            walhook_pipeline::time::Timestamp::now(),
            Duration::from_secs(3600),
        );
        w.platform
            .insert_test_delivery(&event, &delivery, "test")
            .await
            .unwrap();
    }
    let arrived = w
        .receiver
        .wait_until(Duration::from_secs(30), |got| {
            got.iter()
                .filter(|r| r.path == "acme-a" && (200..300).contains(&r.status))
                .count()
                >= 5
        })
        .await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("dispatch.claim_answer_lost"),
        "the failpoint did not fire:\n{text}"
    );
    assert!(
        arrived,
        "claimed deliveries held back: {}\n{text}",
        w.state().await
    );
    assert!(child.running(), "walhook exited:\n{text}");
    w.wait_count(
        "the test deliveries succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        5,
    )
    .await;
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
}

/// The process runs without transparent huge pages (the first touch of a
/// huge page zeroes 2 MiB in the allocating worker, which stalled other
/// tenants' deliveries when a burst grew the heap: docs/performance.md),
/// unless the operator asks for them with `MIMALLOC_ALLOW_THP`.
#[tokio::test]
async fn the_process_runs_without_transparent_huge_pages_unless_asked() {
    let w = World::new().await;
    let cfg = w.config("");
    let thp = |child: &Child| -> Option<String> {
        std::fs::read_to_string(format!("/proc/{}/status", child.0.id()))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_owned())
    };
    // Asked for: left on (and the process is surely past its start once it
    // streams).
    let asked = Child::run_with_env(&cfg, &[("MIMALLOC_ALLOW_THP", "1")]);
    w.wait_streaming().await;
    assert_eq!(
        thp(&asked).as_deref(),
        Some("1"),
        "MIMALLOC_ALLOW_THP=1 was not honoured"
    );
    drop(asked);
    let default = Child::run(&cfg);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while thp(&default).as_deref() != Some("0") {
        assert!(
            std::time::Instant::now() < deadline,
            "walhook run still has transparent huge pages on after 30 s: {:?}",
            thp(&default)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
