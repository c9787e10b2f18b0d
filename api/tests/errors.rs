//! Invalid input gets a 4xx problem document naming the field, and changes
//! nothing.

use reqwest::Method;
use serde_json::json;

use crate::support::{Api, OPERATOR};

async fn state(api: &Api) -> (i64, i64, i64) {
    (
        api.count("SELECT count(*) FROM walhook.endpoints").await,
        api.count("SELECT count(*) FROM walhook.endpoint_versions")
            .await,
        api.count("SELECT count(*) FROM walhook.audit_log").await,
    )
}

#[tokio::test]
async fn invalid_input_names_the_field_and_changes_nothing() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let before = state(&api).await;
    let create = |body: serde_json::Value| api.post(&key, "/v1/webhook-endpoints", body);

    let cases: Vec<(serde_json::Value, u16, &str, &str)> = vec![
        (json!({"url": "not a url"}), 422, "url", "not a valid URL"),
        (
            json!({"url": "http://hooks.example.com/x"}),
            422,
            "url",
            "https",
        ),
        (json!({"url": "https://10.1.2.3/x"}), 422, "url", "private"),
        (
            json!({"url": "https://169.254.169.254/latest"}),
            422,
            "url",
            "link-local",
        ),
        (
            json!({"url": "https://[::ffff:10.0.0.1]/x"}),
            422,
            "url",
            "IPv4-mapped",
        ),
        (
            json!({"url": "https://[fd00::1]/x"}),
            422,
            "url",
            "not a public address",
        ),
        (
            json!({"url": "https://user:pw@hooks.example.com/"}),
            422,
            "url",
            "password",
        ),
        (
            json!({"url": "https://hooks.example.com:8443/"}),
            422,
            "url",
            "port 8443",
        ),
        (
            json!({"url": "https://db.internal/x"}),
            422,
            "url",
            "internal",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["invoice.refunded"]}),
            422,
            "event_types[0]",
            "catalog",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["not a type"]}),
            422,
            "event_types[0]",
            "not an event type",
        ),
        (
            json!({"url": "https://hooks.example.com/", "description": "x".repeat(1025)}),
            422,
            "description",
            "1025",
        ),
        (
            json!({"url": format!("https://hooks.example.com/{}", "a".repeat(2100))}),
            422,
            "url",
            "2048",
        ),
        (
            json!({"url": "https://hooks.example.com/", "rate_limit_per_sec": 0}),
            422,
            "rate_limit_per_sec",
            "1 to",
        ),
        (
            json!({"url": "https://hooks.example.com/", "max_in_flight": 5000}),
            422,
            "max_in_flight",
            "1 to",
        ),
        (
            json!({"url": "https://hooks.example.com/", "max_in_flight": -1}),
            422,
            "max_in_flight",
            "invalid value",
        ),
        (
            json!({"url": "https://hooks.example.com/", "colour": "blue"}),
            422,
            "colour",
            "unknown field",
        ),
        (
            json!({"description": "no url"}),
            422,
            "url",
            "missing field",
        ),
        (json!({"url": 42}), 422, "url", "invalid type"),
    ];
    for (body, status, field, words) in cases {
        let answer = create(body.clone()).await;
        answer.problem(status);
        assert_eq!(answer.field(), field, "{body}: {answer:?}");
        let message = answer.body["errors"][0]["message"].as_str().unwrap();
        assert!(
            message.contains(words),
            "{body}: {message:?} lacks {words:?}"
        );
    }

    // Malformed JSON, the wrong media type, an oversized body.
    let bad = api
        .raw(
            &key,
            Method::POST,
            "/v1/webhook-endpoints",
            "application/json",
            b"{\"url\": ",
        )
        .await;
    bad.problem(400);
    assert_eq!(bad.field(), "body");
    api.raw(
        &key,
        Method::POST,
        "/v1/webhook-endpoints",
        "text/plain",
        b"url=x",
    )
    .await
    .problem(415);
    let huge = format!(
        "{{\"url\": \"https://hooks.example.com/\", \"description\": \"{}\"}}",
        "x".repeat(70_000)
    );
    let too_large = Api::answer(
        api.http
            .post(format!("{}/v1/webhook-endpoints", api.base))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(huge)
            .send()
            .await
            .unwrap(),
    )
    .await;
    too_large.problem(413);

    // Listings: a bad cursor, limit, status, time or endpoint id.
    for (query, field) in [
        ("cursor=garbage", "query.cursor"),
        ("limit=0", "query.limit"),
        ("limit=lots", "query.limit"),
        ("status=lost", "query.status"),
        ("since=yesterday", "query.since"),
        ("endpoint_id=42", "query.endpoint_id"),
        ("event_type=%20", "query.event_type"),
    ] {
        let answer = api
            .get(&key, &format!("/v1/webhook-deliveries?{query}"))
            .await;
        answer.problem(422);
        assert_eq!(answer.field(), field, "{query}: {answer:?}");
    }
    api.get(&key, "/v1/webhook-deliveries?limit=1&limit=2")
        .await
        .problem(400);
    api.get(&key, "/v1/webhook-endpoints?cursor=x")
        .await
        .problem(422);

    // Headers.
    let idem = Api::answer(
        api.http
            .post(format!("{}/v1/webhook-endpoints", api.base))
            .bearer_auth(&key)
            .header("idempotency-key", "has spaces")
            .json(&json!({"url": "https://hooks.example.com/"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    idem.problem(422);
    assert_eq!(idem.field(), "header.Idempotency-Key");

    // Unknown routes and methods are problems too.
    api.get(&key, "/v1/nothing-here").await.problem(404);
    api.call(&key, Method::PUT, "/v1/webhook-endpoints", None)
        .await
        .problem(405);
    assert_eq!(
        state(&api).await,
        before,
        "a refused request changed something"
    );

    // PATCH: the same checks, and an empty change is refused.
    let ep = api.endpoint(&key, &[]).await;
    let before = state(&api).await;
    let path = format!("/v1/webhook-endpoints/{ep}");
    for (body, field) in [
        (json!({}), "body"),
        (json!({"url": "https://192.168.1.1/"}), "url"),
        (json!({"event_types": ["nope.nope"]}), "event_types[0]"),
        (json!({"rate_limit_per_sec": 0}), "rate_limit_per_sec"),
        (json!({"enabled": "yes"}), "enabled"),
    ] {
        let answer = api
            .call(&key, Method::PATCH, &path, Some(body.clone()))
            .await;
        answer.problem(422);
        assert_eq!(answer.field(), field, "{body}: {answer:?}");
    }
    let rotate = api
        .post(
            &key,
            &format!("{path}/rotate-secret"),
            json!({"overlap_seconds": 10_000_000}),
        )
        .await;
    rotate.problem(422);
    assert_eq!(rotate.field(), "overlap_seconds");
    let recover = api
        .post(
            &key,
            &format!("{path}/recover"),
            json!({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}),
        )
        .await;
    recover.problem(422);
    assert_eq!(recover.field(), "until");
    let far = api
        .post(
            &key,
            &format!("{path}/recover"),
            json!({"since": "+200000-01-01T00:00:00Z"}),
        )
        .await;
    far.problem(422);
    api.post(
        &key,
        &format!("{path}/recover"),
        json!({"since": "last week"}),
    )
    .await
    .problem(422);
    assert_eq!(
        state(&api).await,
        before,
        "a refused change changed something"
    );

    // A null removes a limit; a value sets it; each is a version.
    let set = api
        .call(
            &key,
            Method::PATCH,
            &path,
            Some(json!({"rate_limit_per_sec": 5})),
        )
        .await;
    assert_eq!(set.body["rate_limit_per_sec"], 5, "{set:?}");
    let cleared = api
        .call(
            &key,
            Method::PATCH,
            &path,
            Some(json!({"rate_limit_per_sec": null})),
        )
        .await;
    assert_eq!(
        cleared.body["rate_limit_per_sec"],
        serde_json::Value::Null,
        "{cleared:?}"
    );
    assert_eq!(cleared.body["config_version"], 3);
}

#[tokio::test]
async fn a_tenant_s_weight_and_budget_are_checked_and_kept() {
    let api = Api::start().await;
    for (body, field, words) in [
        (json!({"id": "w1", "weight": 0}), "weight", "1 to 1000"),
        (json!({"id": "w2", "weight": 1001}), "weight", "1 to 1000"),
        (
            json!({"id": "b1", "max_in_flight": 0}),
            "max_in_flight",
            "1 to 100000",
        ),
        (
            json!({"id": "b2", "max_in_flight": 100_001}),
            "max_in_flight",
            "tenant_max_in_flight",
        ),
    ] {
        let answer = api.post(OPERATOR, "/v1/tenants", body.clone()).await;
        answer.problem(422);
        assert_eq!(answer.field(), field, "{body}: {answer:?}");
        let message = answer.body["errors"][0]["message"].as_str().unwrap();
        assert!(message.contains(words), "{body}: {message:?}");
    }
    let made = api
        .post(
            OPERATOR,
            "/v1/tenants",
            json!({"id": "gold", "weight": 3, "max_in_flight": 40}),
        )
        .await;
    assert_eq!(made.status, 201, "{made:?}");
    assert_eq!(made.body["weight"], 3);
    assert_eq!(made.body["max_in_flight"], 40);
    let plain = api
        .post(OPERATOR, "/v1/tenants", json!({"id": "plain"}))
        .await;
    assert_eq!(plain.body["weight"], 1);
    assert_eq!(plain.body["max_in_flight"], serde_json::Value::Null);
}

#[tokio::test]
async fn operations_routes_answer() {
    let api = Api::start().await;
    let health = api.get("", "/healthz").await;
    assert_eq!(health.status, 200);
    let ready = api.get("", "/readyz").await;
    assert_eq!(ready.body["status"], "ok", "{ready:?}");
    let doc = api.get("", "/openapi.json").await;
    assert_eq!(doc.body["openapi"], "3.1.0");
    let key = api.tenant("acme").await;
    api.endpoint(&key, &[]).await;
    let metrics = api.metrics().await;
    for name in [
        "walhook_api_requests_total{method=\"POST\",route=\"/v1/webhook-endpoints\",status=\"201\"} 1",
        "walhook_deliveries_pending 0",
        "walhook_deliveries_oldest_pending_age_seconds 0",
        "walhook_metrics_database_up 1",
        "walhook_dispatch_first_attempt_latency_seconds_bucket",
    ] {
        assert!(metrics.contains(name), "{name} missing from\n{metrics}");
    }
}
