//! Hostile text: NUL and other control characters in any string the API
//! takes are refused with a 422 naming the field, the character and its
//! position, before anything reaches Postgres (which refuses NUL in text
//! and would turn the request into a 500).

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Answer, Api, OPERATOR};

/// Rows that any accepted request would have added to.
async fn state(api: &Api) -> Vec<i64> {
    let mut out = Vec::new();
    for table in [
        "tenants",
        "api_keys",
        "endpoints",
        "endpoint_versions",
        "audit_log",
        "idempotency_keys",
    ] {
        out.push(
            api.count(&format!("SELECT count(*) FROM walhook.{table}"))
                .await,
        );
    }
    out
}

fn refused(answer: &Answer, field: &str, character: &str) {
    answer.problem(422);
    let error = answer.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["field"] == field)
        .unwrap_or_else(|| panic!("no error for {field}: {answer:?}"));
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains(character) && message.contains("at byte") && message.contains("remove"),
        "{field}: {message}"
    );
}

#[tokio::test]
async fn nul_and_control_characters_are_refused_by_field() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &["invoice.paid"]).await;
    let before = state(&api).await;

    let endpoint = "/v1/webhook-endpoints";
    let cases: Vec<(&str, &str, Method, String, Value, &str, &str)> = vec![
        (
            "endpoint description",
            "tenant",
            Method::POST,
            endpoint.into(),
            json!({"url": "https://hooks.example.com/a", "description": "bad\u{0}byte"}),
            "description",
            "U+0000 (NUL) at byte 3",
        ),
        (
            "endpoint url",
            "tenant",
            Method::POST,
            endpoint.into(),
            json!({"url": "https://hooks.example.com/\u{0}"}),
            "url",
            "U+0000",
        ),
        (
            "event type",
            "tenant",
            Method::POST,
            endpoint.into(),
            json!({"url": "https://hooks.example.com/a", "event_types": ["invoice.paid", "x\u{0}"]}),
            "event_types[1]",
            "U+0000",
        ),
        (
            "escape in a url",
            "tenant",
            Method::POST,
            endpoint.into(),
            json!({"url": "https://hooks.example.com/\u{1b}[31m"}),
            "url",
            "U+001B",
        ),
        (
            "a new description",
            "tenant",
            Method::PATCH,
            format!("{endpoint}/{ep}"),
            json!({"description": "\u{0}"}),
            "description",
            "U+0000",
        ),
        (
            "tenant id",
            "operator",
            Method::POST,
            "/v1/tenants".into(),
            json!({"id": "evil\u{0}corp"}),
            "id",
            "U+0000",
        ),
        (
            "tenant name",
            "operator",
            Method::POST,
            "/v1/tenants".into(),
            json!({"id": "globex", "name": "Globex\u{0}"}),
            "name",
            "U+0000",
        ),
        (
            "a line break in a tenant name",
            "operator",
            Method::POST,
            "/v1/tenants".into(),
            json!({"id": "globex", "name": "Globex\nCorp"}),
            "name",
            "U+000A (line feed)",
        ),
        (
            "API key name",
            "operator",
            Method::POST,
            "/v1/tenants/acme/api-keys".into(),
            json!({"name": "ci\u{0}"}),
            "name",
            "U+0000",
        ),
        (
            "a member name",
            "operator",
            Method::POST,
            "/v1/tenants".into(),
            json!({"id": "globex", "na\u{0}me": "x"}),
            "body",
            "U+0000",
        ),
    ];
    for (what, who, method, path, body, field, character) in cases {
        let token = if who == "operator" { OPERATOR } else { &key };
        let answer = api.call(token, method, &path, Some(body)).await;
        assert_ne!(answer.status.as_u16(), 500, "{what}: {answer:?}");
        refused(&answer, field, character);
    }

    // Query strings and cursors.
    for (path, field) in [
        ("/v1/audit-log?action=endpoint.created%00", "query.action"),
        (
            "/v1/webhook-deliveries?event_type=invoice.paid%00",
            "query.event_type",
        ),
        ("/v1/webhook-endpoints?cursor=abc%00def", "query.cursor"),
        (
            "/v1/webhook-deliveries?since=2026-01-01T00:00:00Z%01",
            "query.since",
        ),
    ] {
        let answer = api.get(&key, path).await;
        assert_ne!(answer.status.as_u16(), 500, "{path}: {answer:?}");
        refused(&answer, field, "U+00");
    }
    let answer = api.get(OPERATOR, "/v1/tenants?cursor=%00").await;
    refused(&answer, "query.cursor", "U+0000");

    // The Idempotency-Key header (HTTP itself refuses NUL there; a tab
    // passes HTTP and is refused here).
    let with_tab = api
        .http
        .post(format!("{}{endpoint}", api.base))
        .bearer_auth(&key)
        .header("idempotency-key", "key\twith-tab")
        .json(&json!({"url": "https://hooks.example.com/b"}))
        .send()
        .await
        .unwrap();
    let answer = Api::answer(with_tab).await;
    answer.problem(422);
    assert_eq!(answer.field(), "header.Idempotency-Key");
    let message = answer.body["errors"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("U+0009") && message.contains("at byte 3"),
        "{message}"
    );

    assert_eq!(
        state(&api).await,
        before,
        "a refused request changed something"
    );
}
