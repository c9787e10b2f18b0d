//! Tenant isolation: for every tenant route, another tenant's objects are
//! a 404 (never a 403 with details), and nothing of theirs changes.

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Api, OPERATOR};

async fn snapshot(api: &Api) -> Vec<i64> {
    let mut out = Vec::new();
    for q in [
        "SELECT max(config_version)::int8 FROM walhook.endpoints",
        "SELECT count(*) FROM walhook.endpoint_versions",
        "SELECT count(*) FROM walhook.endpoint_secrets",
        "SELECT count(*) FROM walhook.endpoints WHERE deleted_at IS NOT NULL",
        "SELECT count(*) FROM walhook.replay_requests",
        "SELECT count(*) FROM walhook.events",
        "SELECT count(*) FROM walhook.audit_log WHERE tenant_id = 'acme'",
    ] {
        out.push(api.count(q).await);
    }
    out
}

#[tokio::test]
async fn another_tenants_objects_are_not_found_on_every_route() {
    let api = Api::start().await;
    let a = api.tenant("acme").await;
    let b = api.tenant("globex").await;
    let ep = api.endpoint(&a, &["invoice.paid"]).await;
    let test = api
        .post(&a, &format!("/v1/webhook-endpoints/{ep}/test"), json!({}))
        .await;
    assert_eq!(test.status, 202, "{test:?}");
    let dlv = test.body["delivery_id"].as_str().unwrap().to_owned();
    // A failure of acme's, which recovery would pick up.
    api.sql
        .execute("UPDATE walhook.deliveries SET status = 'failed'", &[])
        .await
        .unwrap();
    let before = snapshot(&api).await;

    let e = format!("/v1/webhook-endpoints/{ep}");
    let d = format!("/v1/webhook-deliveries/{dlv}");
    let routes: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, e.clone(), None),
        (
            Method::PATCH,
            e.clone(),
            Some(json!({"description": "mine now"})),
        ),
        (Method::POST, format!("{e}/test"), Some(json!({}))),
        (Method::PATCH, e.clone(), Some(json!({"enabled": false}))),
        (Method::DELETE, e.clone(), None),
        (Method::GET, format!("{e}/versions"), None),
        (Method::POST, format!("{e}/rotate-secret"), Some(json!({}))),
        (Method::GET, d.clone(), None),
        (Method::GET, format!("{d}/requests"), None),
        // Before the recovery: a delivery has one open replay at most, so
        // the owner's replay would be a 409 after it.
        (Method::POST, format!("{d}/replay"), Some(json!({}))),
        (
            Method::POST,
            format!("{e}/recover"),
            // Recovery looks back 30 days at most.
            Some(json!({"since": chrono::Utc::now() - chrono::Duration::days(1)})),
        ),
    ];
    for (method, path, body) in &routes {
        let answer = api.call(&b, method.clone(), path, body.clone()).await;
        answer.problem(404);
        let text = answer.body.to_string();
        assert!(
            !text.contains("acme"),
            "{method} {path} leaked the owner: {text}"
        );
    }
    // A listing filtered by acme's endpoint is a 404, like the endpoint.
    let answer = api
        .get(&b, &format!("/v1/webhook-deliveries?endpoint_id={ep}"))
        .await;
    answer.problem(404);
    assert!(!answer.body.to_string().contains("acme"), "{answer:?}");
    // Listings filter by tenant: nothing of acme's shows.
    let lists = [
        "/v1/webhook-endpoints".to_owned(),
        "/v1/webhook-deliveries".to_owned(),
        "/v1/audit-log?tenant_id=acme".to_owned(),
    ];
    for path in &lists {
        let answer = api.get(&b, path).await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        assert_eq!(answer.body["data"], json!([]), "{path}: {answer:?}");
    }
    let audit = api.get(&b, "/v1/audit-log").await;
    assert!(
        audit.body["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["tenant_id"] == "globex"),
        "{audit:?}"
    );
    assert_eq!(
        snapshot(&api).await,
        before,
        "a refused request changed something"
    );

    // The owner reaches every one of them.
    for (method, path, body) in &routes {
        if *method == Method::DELETE {
            continue;
        }
        let answer = api.call(&a, method.clone(), path, body.clone()).await;
        assert!(answer.status.is_success(), "{method} {path}: {answer:?}");
    }
    let own = api.get(&a, "/v1/audit-log").await;
    let actions: Vec<&str> = own.body["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap())
        .collect();
    for expected in [
        "endpoint.created",
        "endpoint.test_sent",
        "endpoint.updated",
        "endpoint.disabled",
        "endpoint.secret_rotated",
        "endpoint.recovered",
        "delivery.replay_requested",
    ] {
        assert!(
            actions.contains(&expected),
            "{expected} missing from {actions:?}"
        );
    }
}

#[tokio::test]
async fn tokens_open_only_their_routes() {
    let api = Api::start().await;
    let a = api.tenant("acme").await;
    // A tenant key on operator routes, the operator on tenant routes.
    api.get(&a, "/v1/tenants").await.problem(403);
    api.post(&a, "/v1/tenants", json!({"id": "evil"}))
        .await
        .problem(403);
    api.post(&a, "/v1/tenants/acme/api-keys", json!({}))
        .await
        .problem(403);
    api.get(OPERATOR, "/v1/webhook-endpoints")
        .await
        .problem(403);
    // No token, a wrong token, a malformed header.
    let none = Api::answer(
        api.http
            .get(format!("{}/v1/webhook-endpoints", api.base))
            .send()
            .await
            .unwrap(),
    )
    .await;
    none.problem(401);
    assert!(none.headers.contains_key("www-authenticate"));
    api.get("whk_not-a-key", "/v1/webhook-endpoints")
        .await
        .problem(401);
    api.get("", "/v1/webhook-endpoints").await.problem(401);
    // Revoked keys stop at once; other keys keep working.
    let second = api
        .post(OPERATOR, "/v1/tenants/acme/api-keys", json!({"name": "ci"}))
        .await;
    let second_key = second.body["key"].as_str().unwrap().to_owned();
    let second_id = second.body["api_key"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        api.get(&second_key, "/v1/webhook-endpoints").await.status,
        200
    );
    let revoked = api
        .call(
            OPERATOR,
            Method::DELETE,
            &format!("/v1/tenants/acme/api-keys/{second_id}"),
            None,
        )
        .await;
    assert_eq!(revoked.status, 204, "{revoked:?}");
    api.get(&second_key, "/v1/webhook-endpoints")
        .await
        .problem(401);
    assert_eq!(api.get(&a, "/v1/webhook-endpoints").await.status, 200);
    // Keys are listed without the key itself, and stored hashed.
    let keys = api.get(OPERATOR, "/v1/tenants/acme/api-keys").await;
    assert_eq!(keys.body["data"].as_array().unwrap().len(), 2, "{keys:?}");
    assert!(!keys.body.to_string().contains(&a));
    let stored: i64 = api
        .count(&format!(
            "SELECT count(*) FROM walhook.api_keys WHERE key_sha256 = sha256('{a}'::bytea)"
        ))
        .await;
    assert_eq!(stored, 1);
    // Another tenant's key id is not found.
    api.tenant("globex").await;
    api.call(
        OPERATOR,
        Method::DELETE,
        &format!("/v1/tenants/globex/api-keys/{second_id}"),
        None,
    )
    .await
    .problem(404);
}
