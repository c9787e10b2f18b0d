//! `Idempotency-Key`: a retried POST does its work once and gets the same
//! answer; the same key with another body is refused.

use serde_json::{Value, json};

use crate::support::{Answer, Api, OPERATOR};

async fn post_with_key(api: &Api, token: &str, path: &str, key: &str, body: Value) -> Answer {
    Api::answer(
        api.http
            .post(format!("{}{path}", api.base))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

#[tokio::test]
async fn a_retried_post_runs_once() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let body = json!({"url": "https://hooks.example.com/a", "event_types": ["invoice.paid"]});
    let first = post_with_key(&api, &key, "/v1/webhook-endpoints", "k-1", body.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    let again = post_with_key(&api, &key, "/v1/webhook-endpoints", "k-1", body.clone()).await;
    assert_eq!(again.status, 201);
    // The same answer, but the secret is shown once: the replay withholds
    // it (secrets.rs checks that nothing stores it).
    assert_eq!(
        again.body["endpoint"], first.body["endpoint"],
        "the replay differs"
    );
    assert!(first.body["secret"].is_string(), "{first:?}");
    assert!(again.body["secret"].is_null(), "{again:?}");
    assert_eq!(again.body["secret_withheld"], true);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(api.count("SELECT count(*) FROM walhook.endpoints").await, 1);

    // The same key with another body: refused, naming the header.
    let other = json!({"url": "https://hooks.example.com/b"});
    let clash = post_with_key(&api, &key, "/v1/webhook-endpoints", "k-1", other.clone()).await;
    clash.problem(422);
    assert_eq!(clash.field(), "header.Idempotency-Key");
    assert_eq!(api.count("SELECT count(*) FROM walhook.endpoints").await, 1);

    // Keys are per caller: another tenant may use the same one.
    let globex = api.tenant("globex").await;
    let theirs = post_with_key(&api, &globex, "/v1/webhook-endpoints", "k-1", body.clone()).await;
    assert_eq!(theirs.status, 201);
    assert_ne!(theirs.body["endpoint"]["id"], first.body["endpoint"]["id"]);

    // A refusal of the work is stored like a success.
    let taken = json!({"id": "acme"});
    let refused = post_with_key(&api, OPERATOR, "/v1/tenants", "t-1", taken.clone()).await;
    refused.problem(409);
    let refused_again = post_with_key(&api, OPERATOR, "/v1/tenants", "t-1", taken).await;
    refused_again.problem(409);
    assert_eq!(refused_again.headers["idempotent-replayed"], "true");

    // An API key is shown once, even to a retry.
    let path = "/v1/tenants/acme/api-keys";
    let issued = post_with_key(&api, OPERATOR, path, "key-1", json!({"name": "ci"})).await;
    assert!(issued.body["key"].as_str().is_some(), "{issued:?}");
    let replayed = post_with_key(&api, OPERATOR, path, "key-1", json!({"name": "ci"})).await;
    assert_eq!(replayed.status, 201);
    assert_eq!(replayed.body["api_key"], issued.body["api_key"]);
    // `key` is null (it was absent before replays said why): never the key.
    assert!(replayed.body["key"].is_null(), "{replayed:?}");
    assert_eq!(replayed.body["key_withheld"], true);
    let issued_key = issued.body["key"].as_str().unwrap();
    assert!(
        !replayed.body.to_string().contains(issued_key),
        "{replayed:?}"
    );
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.api_keys WHERE tenant_id = 'acme'")
            .await,
        2
    );
}

/// A crash between the work and storing its answer leaves a claim without
/// a response, which a retry takes over after a minute. The retry must not
/// make a second endpoint: the endpoint's id comes from the key.
#[tokio::test]
async fn a_retry_after_a_lost_answer_makes_no_second_endpoint() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let body = json!({"url": "https://hooks.example.com/a"});
    let path = "/v1/webhook-endpoints";
    let first = post_with_key(&api, &key, path, "k-lost", body.clone()).await;
    assert_eq!(first.status, 201, "{first:?}");
    let id = first.body["endpoint"]["id"].as_str().unwrap().to_owned();
    // What the crash would have left: the claim, no response, abandoned.
    api.sql
        .execute(
            "UPDATE walhook.idempotency_keys SET status = NULL, response = NULL, \
             created_at = now() - interval '2 minutes' WHERE key = 'k-lost'",
            &[],
        )
        .await
        .unwrap();
    let retry = post_with_key(&api, &key, path, "k-lost", body.clone()).await;
    retry.problem(409);
    let detail = retry.body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(&id), "{detail}");
    assert_eq!(api.count("SELECT count(*) FROM walhook.endpoints").await, 1);
    // The refusal is the stored answer from now on.
    let again = post_with_key(&api, &key, path, "k-lost", body).await;
    again.problem(409);
    assert_eq!(again.headers["idempotent-replayed"], "true");
    // Without a key, or with another one, endpoints are made as usual.
    let other = post_with_key(
        &api,
        &key,
        path,
        "k-new",
        json!({"url": "https://hooks.example.com/b"}),
    )
    .await;
    assert_eq!(other.status, 201, "{other:?}");
    assert_eq!(api.count("SELECT count(*) FROM walhook.endpoints").await, 2);
}
