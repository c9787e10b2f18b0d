//! Hostile receivers and producers, and a broken endpoint: none of them
//! stops or blinds the platform for anyone else, and each leaves a trace.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::time::Duration;

use serde_json::json;

use crate::support::api::{Http, OPERATOR, api_section, endpoint, free_port, onboard};
use crate::support::hostile::{Hostile, PATHS};
use crate::support::{Child, World, run, stderr, walhook};

/// Receivers that answer with NUL bytes, invalid UTF-8, control characters,
/// 10 MB, a trickle, 500 headers, a control byte in a header, a body cut
/// short: their attempts are recorded with a class, healthy endpoints of
/// another tenant are unaffected, and the process never exits.
#[tokio::test]
async fn hostile_receivers_cannot_stop_the_platform() {
    let w = World::new().await;
    let hostile = Hostile::start().await;
    for path in PATHS {
        w.endpoint_at("evil", &hostile.url(path), &[]).await;
    }
    w.endpoint("good", "good-a", &[]).await;
    w.endpoint("good", "good-b", &[]).await;
    let cfg = w.config("");
    let log = w.dir.path().join("hostile-receivers.log");
    let mut child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;
    for i in 0..20i64 {
        for (id, tenant) in [(i, "evil"), (1000 + i, "good")] {
            w.shop
                .execute("INSERT INTO orders VALUES ($1, $2, 1)", &[&id, &tenant])
                .await
                .unwrap();
        }
    }
    w.wait_count(
        "healthy deliveries recorded as succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE tenant_id = 'good' AND status = 'succeeded'",
        40,
    )
    .await;
    // Every hostile endpoint has recorded attempts (the trickle ends at the
    // 5 s request timeout).
    w.wait_count(
        "hostile endpoints with a recorded attempt",
        "SELECT count(DISTINCT endpoint_id) FROM walhook.attempts WHERE tenant_id = 'evil'",
        PATHS.len() as i64,
    )
    .await;
    assert!(
        child.running(),
        "walhook exited: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let good: Vec<_> = w
        .receiver
        .received()
        .into_iter()
        .filter(|r| r.path.starts_with("good"))
        .collect();
    assert!(good.len() >= 40 && good.iter().all(|r| r.verified == Some(true)));

    // Each hostile answer is on record, with its class; excerpts are
    // stored cleaned.
    let rows = w
        .platform_sql
        .query(
            "SELECT e.url, a.outcome, a.http_status, a.error_class, a.response_excerpt \
             FROM walhook.attempts a JOIN walhook.endpoints e ON e.id = a.endpoint_id \
             WHERE a.tenant_id = 'evil'",
            &[],
        )
        .await
        .unwrap();
    for path in PATHS {
        let url = hostile.url(path);
        let mine: Vec<_> = rows
            .iter()
            .filter(|r| r.get::<_, String>(0) == url)
            .collect();
        assert!(!mine.is_empty(), "no attempt recorded for {path}");
        for r in &mine {
            let outcome: String = r.get(1);
            let status: Option<i32> = r.get(2);
            let class: Option<String> = r.get(3);
            assert!(
                outcome == "succeeded" || class.is_some(),
                "{path}: {outcome} without a class"
            );
            if let Some(excerpt) = r.get::<_, Option<String>>(4) {
                assert!(!excerpt.contains('\0') && excerpt.len() <= 1024, "{path}");
            }
            if *path == "nul-500" {
                assert_eq!((status, class.as_deref()), (Some(500), Some("http_5xx")));
            }
        }
    }
    let nul = rows
        .iter()
        .find(|r| r.get::<_, String>(0) == hostile.url("nul-200"))
        .unwrap();
    assert_eq!(nul.get::<_, String>(1), "succeeded");
    let excerpt: String = nul.get(4);
    assert!(excerpt.starts_with("ok\\x00\u{fffd}"), "{excerpt:?}");
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(!log_text.contains("a stage failed"), "{log_text}");
    assert!(child.terminate().success());
}

const HOSTILE_RULES: &str = r#"
[[rules]]
name = "outbox"
kind = "outbox"
table = "public.outbox"
type_column = "event_type"
payload_column = "payload"
tenant_column = "tenant_id"
object_id_column = "aggregate_id"
event_types = ["thing.happened"]

[[rules]]
name = "app_messages"
kind = "message"
prefix = "app"
"#;

/// Outbox rows and logical messages with NUL or control characters in
/// their type, tenant or object id, a 50 MB value, 10,000-deep JSON,
/// invalid JSON and an unregistered tenant: each is an incident, capture
/// goes on (a healthy event after each arrives), and the slot moves past
/// them.
#[tokio::test]
async fn hostile_producers_become_incidents_and_capture_goes_on() {
    let w = World::new().await;
    w.shop
        .batch_execute(
            "CREATE TABLE outbox (id bigserial PRIMARY KEY, tenant_id text NOT NULL, \
             aggregate_id text, event_type text NOT NULL, payload text NOT NULL)",
        )
        .await
        .unwrap();
    w.publish("outbox").await;
    w.endpoint("acme", "things", &["thing.happened"]).await;
    let cfg = w.config(HOSTILE_RULES);
    let log = w.dir.path().join("hostile-producers.log");
    let mut child = Child::run_logged(&cfg, &[], &log);
    w.wait_streaming().await;

    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let big = "x".repeat(50_000_000);
    let message = |body: &str| {
        format!(
            "SELECT pg_logical_emit_message(true, 'app', {})",
            quote(body)
        )
    };
    let hostile: Vec<String> = vec![
        message(r#"{"type": "thing.ha\u0000ppened", "tenant_id": "acme", "data": {}}"#),
        message(r#"{"type": "thing.happened", "tenant_id": "ac\u0000me", "data": {}}"#),
        message(r#"{"type": "thing.happened", "tenant_id": "acme", "object_id": "o\u00001", "data": {}}"#),
        message(&format!(r#"{{"type": "thing.happened", "tenant_id": "acme", "data": "{big}"}}"#)),
        message(&format!(r#"{{"type": "thing.happened", "tenant_id": "acme", "data": {deep}}}"#)),
        message(r#"{"type": "thing.happened", "tenant_id": "acme", "data": {"#),
        format!(
            "INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('acme', 'thing.happened', {})",
            quote(&format!("{{\"blob\": \"{big}\"}}"))
        ),
        format!(
            "INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('acme', 'thing.happened', {})",
            quote(&deep)
        ),
        "INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('acme', 'thing.happened', 'not json')".into(),
        "INSERT INTO outbox (tenant_id, aggregate_id, event_type, payload) VALUES ('acme', E'o\\x01b', 'thing.happened', '{}')".into(),
        "INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('acme', E'thing\\x07.happened', '{}')".into(),
        "INSERT INTO outbox (tenant_id, event_type, payload) VALUES (E'ac\\x1bme', 'thing.happened', '{}')".into(),
    ];
    let healthy = |i: usize| {
        format!(
            "INSERT INTO outbox (tenant_id, aggregate_id, event_type, payload) \
             VALUES ('acme', 'ok-{i}', 'thing.happened', '{{\"n\": {i}}}')"
        )
    };
    for (i, sql) in hostile.iter().enumerate() {
        w.shop.batch_execute(sql).await.unwrap();
        w.shop.batch_execute(&healthy(i)).await.unwrap();
    }
    // A tenant nobody registered: stored, delivered to no one, counted.
    w.shop
        .batch_execute(
            "INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('nobody', 'thing.happened', '{}'); \
             INSERT INTO outbox (tenant_id, event_type, payload) VALUES ('nobody', 'thing.happened', '{}')",
        )
        .await
        .unwrap();
    w.shop.batch_execute(&healthy(999)).await.unwrap();
    let last: String = w
        .shop
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .unwrap()
        .get(0);

    let n = hostile.len() as i64 + 1;
    w.wait_count(
        "healthy events delivered after each hostile one",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        n,
    )
    .await;
    w.wait_count(
        "capture incidents",
        "SELECT count(*) FROM walhook.capture_incidents",
        hostile.len() as i64,
    )
    .await;
    w.wait_count(
        "the unknown tenant's incident",
        "SELECT coalesce(sum(occurrences), 0)::int8 FROM walhook.incidents \
         WHERE kind = 'unknown_tenant' AND subject = 'nobody'",
        2,
    )
    .await;
    let incidents = w
        .platform_sql
        .query(
            "SELECT kind, commit_lsn::text, detail FROM walhook.capture_incidents ORDER BY commit_lsn",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        incidents.len(),
        hostile.len(),
        "one incident per hostile change"
    );
    for r in &incidents {
        let detail: String = r.get(2);
        assert!(
            r.get::<_, Option<String>>(1).is_some(),
            "an incident without its LSN"
        );
        assert!(detail.len() <= 1024 && !detail.contains('\0'), "{detail}");
    }
    let kinds: Vec<String> = incidents.iter().map(|r| r.get(0)).collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "oversized_event").count(),
        2,
        "{kinds:?}"
    );
    // Both events of the unknown tenant are stored; no delivery for them.
    let stored: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.events WHERE tenant_id = 'nobody'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 2);
    // The slot moved past every hostile change.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let past: bool = w
            .shop
            .query_one(
                "SELECT confirmed_flush_lsn >= $1::text::pg_lsn FROM pg_replication_slots WHERE slot_name = 'walhook'",
                &[&last],
            )
            .await
            .unwrap()
            .get(0);
        if past {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot did not move past {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        child.running(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(child.terminate().success());
}

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// An endpoint whose secret row cannot be opened is quarantined, alone:
/// the other endpoints keep receiving, a new one receives within a second,
/// a deleted one stops; once the row opens again its waiting deliveries go.
#[tokio::test]
async fn a_broken_endpoint_is_quarantined_and_nothing_else_stops() {
    let w = World::new().await;
    let port = free_port();
    let cfg = w.config(&api_section(port));
    let out = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    let child = Child::run(&cfg);
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    let key = onboard(&w, &api, "acme").await;
    let mut ids = Vec::new();
    for path in ["broken", "steady", "doomed"] {
        let (id, _) = endpoint(&w, &api, &key, path, &["order.created"]).await;
        ids.push(id);
    }
    let broken = ids[0].clone();
    let broken_uuid: uuid::Uuid = w
        .platform_sql
        .query_one(
            "SELECT id FROM walhook.endpoints WHERE url = $1",
            &[&w.receiver.url("broken")],
        )
        .await
        .unwrap()
        .get(0);

    // Corrupt the broken endpoint's sealed secret (keep it to restore).
    let sealed: Vec<u8> = w
        .platform_sql
        .query_one(
            "SELECT secret FROM walhook.endpoint_secrets WHERE endpoint_id = $1",
            &[&broken_uuid],
        )
        .await
        .unwrap()
        .get(0);
    let mut corrupt = sealed.clone();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    w.platform_sql
        .execute(
            "UPDATE walhook.endpoint_secrets SET secret = $2 WHERE endpoint_id = $1",
            &[&broken_uuid, &corrupt],
        )
        .await
        .unwrap();
    w.wait_count(
        "the quarantine incident",
        "SELECT count(*) FROM walhook.incidents WHERE kind = 'endpoint_quarantined' AND resolved_at IS NULL",
        1,
    )
    .await;
    for i in 0..10i64 {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    let count_at = |path: &'static str| {
        let received = w.receiver.received();
        received.iter().filter(|r| r.path == path).count()
    };
    w.wait_count(
        "deliveries to the steady endpoint",
        "SELECT count(*) FROM walhook.deliveries d JOIN walhook.endpoints e ON e.id = d.endpoint_id \
         WHERE e.url LIKE '%/steady' AND d.status = 'succeeded'",
        10,
    )
    .await;
    assert_eq!(count_at("broken"), 0, "a quarantined endpoint was sent to");

    // A new endpoint receives within a second; a deleted one stops.
    endpoint(&w, &api, &key, "fresh", &["order.created"]).await;
    let (s, _) = api
        .call(
            &key,
            reqwest::Method::DELETE,
            &format!("/v1/webhook-endpoints/{}", ids[2]),
            None,
        )
        .await;
    assert!(s == 204 || s == 200, "{s}");
    let before_doomed = count_at("doomed");
    let started = std::time::Instant::now();
    w.shop
        .execute("INSERT INTO orders VALUES (100, 'acme', 1)", &[])
        .await
        .unwrap();
    while count_at("fresh") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "a new endpoint did not receive within a second while another was quarantined"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        count_at("doomed"),
        before_doomed,
        "a deleted endpoint received"
    );
    let metrics = api.metrics().await;
    assert!(
        metrics.contains("walhook_endpoints_quarantined 1"),
        "{metrics}"
    );
    let audit: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.audit_log WHERE action = 'endpoint.quarantined' AND target = $1",
            &[&broken],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(audit, 1);

    // Fixed: the quarantine lifts and the waiting deliveries go out.
    w.platform_sql
        .execute(
            "UPDATE walhook.endpoint_secrets SET secret = $2 WHERE endpoint_id = $1",
            &[&broken_uuid, &sealed],
        )
        .await
        .unwrap();
    w.wait_count(
        "the waiting deliveries of the repaired endpoint",
        "SELECT count(*) FROM walhook.deliveries d JOIN walhook.endpoints e ON e.id = d.endpoint_id \
         WHERE e.url LIKE '%/broken' AND d.status = 'succeeded'",
        11,
    )
    .await;
    let open: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM walhook.incidents WHERE kind = 'endpoint_quarantined' AND resolved_at IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(open, 0, "the quarantine was not lifted");
    let _ = OPERATOR;
    assert!(child.terminate().success());
}

/// Secrets exist in plaintext only in the one answer that shows them: after
/// creating and rotating endpoints and issuing keys (each twice under one
/// `Idempotency-Key`), neither the platform database nor walhook's log at
/// `debug` holds a `whsec_` secret, an API key or the operator token.
#[tokio::test]
async fn secrets_reach_neither_the_database_nor_the_debug_log() {
    let w = World::new().await;
    let port = free_port();
    let cfg = w.config(&api_section(port));
    let out = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    let log = w.dir.path().join("debug.log");
    let child = Child::run_logged(&cfg, &[("WALHOOK_LOG", "debug")], &log);
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    let key = onboard(&w, &api, "acme").await;
    let post = |token: &str, path: &str, idem: &str, body: serde_json::Value| {
        api.client
            .post(format!("{}{path}", api.base))
            .bearer_auth(token)
            .header("idempotency-key", idem)
            .json(&body)
            .send()
    };
    let mut shown: Vec<String> = vec![key.clone(), OPERATOR.to_owned()];
    let mut endpoint = String::new();
    for _ in 0..2 {
        let r = post(
            &key,
            "/v1/webhook-endpoints",
            "create-1",
            json!({"url": w.receiver.url("s"), "event_types": ["order.created"]}),
        )
        .await
        .unwrap();
        let body: serde_json::Value = r.json().await.unwrap();
        if let Some(s) = body["secret"].as_str() {
            shown.push(s.to_owned());
            w.receiver.set_secrets("s", vec![s.to_owned()]);
        }
        endpoint = body["endpoint"]["id"].as_str().unwrap().to_owned();
    }
    for _ in 0..2 {
        let r = post(
            &key,
            &format!("/v1/webhook-endpoints/{endpoint}/rotate-secret"),
            "rotate-1",
            json!({}),
        )
        .await
        .unwrap();
        let body: serde_json::Value = r.json().await.unwrap();
        if let Some(s) = body["secret"].as_str() {
            shown.push(s.to_owned());
        }
    }
    for _ in 0..2 {
        let r = post(
            OPERATOR,
            "/v1/tenants/acme/api-keys",
            "key-2",
            json!({"name": "second"}),
        )
        .await
        .unwrap();
        let body: serde_json::Value = r.json().await.unwrap();
        if let Some(k) = body["key"].as_str() {
            shown.push(k.to_owned());
        }
    }
    assert!(
        shown.len() >= 5,
        "a secret was not shown even once: {shown:?}"
    );
    // Some traffic for the pipeline's debug logs.
    w.shop
        .execute("INSERT INTO orders VALUES (1, 'acme', 1)", &[])
        .await
        .unwrap();
    w.wait_count(
        "the delivery",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        1,
    )
    .await;
    assert!(child.terminate().success());

    // Every column of every table, bytea shown as text where it is text.
    let columns = w
        .platform_sql
        .query(
            "SELECT table_name, column_name, data_type FROM information_schema.columns \
             WHERE table_schema = 'walhook'",
            &[],
        )
        .await
        .unwrap();
    let mut dump = String::new();
    for c in &columns {
        let (table, column, kind): (String, String, String) = (c.get(0), c.get(1), c.get(2));
        let expr = if kind == "bytea" {
            format!("encode(\"{column}\", 'escape')")
        } else {
            format!("\"{column}\"::text")
        };
        for r in w
            .platform_sql
            .query(&format!("SELECT {expr} FROM walhook.\"{table}\""), &[])
            .await
            .unwrap()
        {
            if let Some(v) = r.get::<_, Option<String>>(0) {
                dump.push_str(&v);
                dump.push('\n');
            }
        }
    }
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(log_text.contains("DEBUG"), "the log was not at debug");
    for (place, text) in [
        ("the platform database", &dump),
        ("the debug log", &log_text),
    ] {
        assert!(!text.contains("whsec_"), "a whsec_ secret in {place}");
        for s in &shown {
            assert!(!text.contains(s.as_str()), "a secret or key in {place}");
        }
    }
}

/// The resident set of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The tester's flood against `walhook run` itself (API and pipeline in one
/// process): 3,000 unauthenticated requests, each with a 2 KB method of
/// its own, leave `/metrics` within 100 KB of its size before and the
/// process's RSS within 20 MB, and deliveries go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_do_not_grow_walhook_run() {
    let (w, child, api) = crate::support::api::start("").await;
    let key = onboard(&w, &api, "acme").await;
    endpoint(&w, &api, &key, "hook", &["order.created"]).await;
    let delivered = |n: usize| {
        let w = &w;
        async move {
            let ok = w
                .receiver
                .wait_until(Duration::from_secs(30), |r| {
                    crate::support::api::at(r, "hook").len() >= n
                })
                .await;
            assert!(ok, "delivery {n} did not arrive");
        }
    };
    let verification = crate::support::api::at(&w.receiver.received(), "hook").len();
    crate::support::api::insert_order(&w, 1, "acme").await;
    delivered(verification + 1).await;
    api.metrics().await;
    let pid = child.0.id();
    let (before, rss_before) = (api.metrics().await, rss_kib(pid));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let base = api.base.clone();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                for _ in 0..375 {
                    let method: String = (0..2048)
                        .map(|_| char::from(b'A' + rand::random::<u8>() % 26))
                        .collect();
                    let r = http
                        .request(
                            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                            format!("{base}/v1/webhook-endpoints"),
                        )
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 405);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let (after, rss_after) = (api.metrics().await, rss_kib(pid));
    println!(
        "walhook run, 3,000 made-up 2 KB methods: /metrics {} -> {} bytes, RSS {rss_before} -> \
         {rss_after} KiB ({:+} KiB)",
        before.len(),
        after.len(),
        rss_after as i64 - rss_before as i64
    );
    assert!(after.len() <= before.len() + 100 * 1024);
    assert!(rss_after <= rss_before + 20 * 1024);
    assert!(after.contains("walhook_api_refusals_total{reason=\"method\"} 3000"));
    // The pipeline in the same process goes on.
    crate::support::api::insert_order(&w, 2, "acme").await;
    delivered(verification + 2).await;
    assert!(child.terminate().success());
}
