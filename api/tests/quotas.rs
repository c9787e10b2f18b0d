//! Per-tenant quotas: clear 429 problem documents naming the limit, and a
//! refused request changes nothing.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use reqwest::Method;
use serde_json::json;
use walhook_api::ApiLimits;

use crate::support::Api;

#[tokio::test]
async fn endpoints_per_tenant_stop_at_the_limit() {
    let api = Api::start_with(ApiLimits {
        max_endpoints_per_tenant: 3,
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let mut made = Vec::new();
    for _ in 0..3 {
        made.push(api.endpoint(&key, &[]).await);
    }
    let audit = api.count("SELECT count(*) FROM walhook.audit_log").await;
    let body = json!({"url": "https://hooks.example.com/4"});
    let refused = api.post(&key, "/v1/webhook-endpoints", body.clone()).await;
    refused.problem(429);
    assert_eq!(refused.body["type"], "urn:walhook:problem:quota");
    assert_eq!(
        refused.body["quota"]["limit_name"],
        "max_endpoints_per_tenant"
    );
    assert_eq!(refused.body["quota"]["limit"], 3);
    assert_eq!(refused.body["quota"]["current"], 3);
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("[api].max_endpoints_per_tenant") && detail.contains("DELETE"),
        "{detail}"
    );
    assert!(refused.headers.get("retry-after").is_none(), "{refused:?}");
    assert_eq!(api.count("SELECT count(*) FROM walhook.endpoints").await, 3);
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.audit_log").await,
        audit
    );

    // Another tenant has its own count.
    let other = api.tenant("globex").await;
    api.endpoint(&other, &[]).await;

    // A refusal under an Idempotency-Key does not stick: once there is
    // room, the same request with the same key goes through.
    let path = "/v1/webhook-endpoints";
    api.post_with_key(&key, path, "room", body.clone())
        .await
        .problem(429);
    let deleted = api
        .call(
            &key,
            Method::DELETE,
            &format!("/v1/webhook-endpoints/{}", made[0]),
            None,
        )
        .await;
    assert_eq!(deleted.status, 204);
    let made_now = api.post_with_key(&key, path, "room", body).await;
    assert_eq!(made_now.status, 201, "{made_now:?}");
}

#[tokio::test]
async fn a_delivery_has_one_open_replay_at_most() {
    // 16 database connections: a tenant may have 8 requests at once, so
    // the burst of 8 below all reach the database together.
    let api = Api::start_with(ApiLimits {
        max_connections: 16,
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let test = api
        .post(&key, &format!("/v1/webhook-endpoints/{ep}/test"), json!({}))
        .await;
    let dlv = test.body["delivery_id"].as_str().unwrap().to_owned();
    let path = format!("/v1/webhook-deliveries/{dlv}/replay");
    let first = api.post(&key, &path, json!({})).await;
    assert_eq!(first.status, 202, "{first:?}");
    let request = first.body["replay_request_id"].as_i64().unwrap();
    let audit = api.count("SELECT count(*) FROM walhook.audit_log").await;

    let second = api.post(&key, &path, json!({})).await;
    second.problem(409);
    let detail = second.body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("open replay request ({request}")),
        "{detail}"
    );
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.replay_requests")
            .await,
        1
    );
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.audit_log").await,
        audit
    );

    // Once the dispatcher has made it, another may be asked for; of many
    // asked for at once, exactly one is queued.
    api.sql
        .execute("UPDATE walhook.replay_requests SET done_at = now()", &[])
        .await
        .unwrap();
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let (http, url, key) = (api.http.clone(), format!("{}{path}", api.base), key.clone());
            tokio::spawn(async move {
                let r = http.post(url).bearer_auth(key).json(&json!({})).send();
                r.await.unwrap().status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in burst {
        statuses.push(task.await.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, vec![202, 409, 409, 409, 409, 409, 409, 409]);
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.replay_requests WHERE done_at IS NULL")
            .await,
        1
    );
}

#[tokio::test]
async fn test_events_per_minute_are_limited_with_retry_after() {
    let api = Api::start_with(ApiLimits {
        test_events_per_minute: 2,
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let path = format!("/v1/webhook-endpoints/{ep}/test");
    let first = api.post_with_key(&key, &path, "t-1", json!({})).await;
    assert_eq!(first.status, 202, "{first:?}");
    assert_eq!(api.post(&key, &path, json!({})).await.status, 202);
    let refused = api.post(&key, &path, json!({})).await;
    refused.problem(429);
    let quota = &refused.body["quota"];
    assert_eq!(quota["limit_name"], "test_events_per_minute");
    assert_eq!(
        (quota["limit"].as_u64(), quota["current"].as_u64()),
        (Some(2), Some(2))
    );
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(quota["retry_after_seconds"], retry);
    assert!(
        refused.body["detail"]
            .as_str()
            .unwrap()
            .contains("[api].test_events_per_minute"),
        "{refused:?}"
    );
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.deliveries").await,
        2
    );
    // A replay of an answered request is not another test event.
    let replayed = api.post_with_key(&key, &path, "t-1", json!({})).await;
    assert_eq!(replayed.status, 202);
    assert_eq!(replayed.headers["idempotent-replayed"], "true");
    // Another tenant has its own budget.
    let other = api.tenant("globex").await;
    let theirs = api.endpoint(&other, &[]).await;
    let answer = api
        .post(
            &other,
            &format!("/v1/webhook-endpoints/{theirs}/test"),
            json!({}),
        )
        .await;
    assert_eq!(answer.status, 202, "{answer:?}");
}

/// Each `POST …/verify` makes a dispatcher send a request to the
/// endpoint's URL: at most `[api].verify_requests_per_minute` per endpoint,
/// then a 429 naming the limit with `Retry-After`, and the refused request
/// changes nothing (the pending challenge stays, nothing is audited).
#[tokio::test]
async fn verify_requests_are_limited_per_endpoint() {
    let api = Api::start_with(ApiLimits {
        verify_requests_per_minute: 2,
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let path = format!("/v1/webhook-endpoints/{ep}/verify");
    for _ in 0..2 {
        let asked = api.post(&key, &path, json!({})).await;
        assert_eq!(asked.status, 202, "{asked:?}");
    }
    let challenge = "SELECT verification_challenge FROM walhook.endpoints";
    let before: String = api.sql.query_one(challenge, &[]).await.unwrap().get(0);
    let audit = api.count("SELECT count(*) FROM walhook.audit_log").await;
    let refused = api.post(&key, &path, json!({})).await;
    refused.problem(429);
    let quota = &refused.body["quota"];
    assert_eq!(quota["limit_name"], "verify_requests_per_minute");
    assert_eq!(
        (quota["limit"].as_u64(), quota["current"].as_u64()),
        (Some(2), Some(2))
    );
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("[api].verify_requests_per_minute") && detail.contains(&ep),
        "{detail}"
    );
    let after: String = api.sql.query_one(challenge, &[]).await.unwrap().get(0);
    assert_eq!(before, after, "a refused request asked again");
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.audit_log").await,
        audit
    );
    // Another endpoint of the same tenant has its own budget.
    let other = api.endpoint(&key, &[]).await;
    let asked = api
        .post(
            &key,
            &format!("/v1/webhook-endpoints/{other}/verify"),
            json!({}),
        )
        .await;
    assert_eq!(asked.status, 202, "{asked:?}");
}

#[tokio::test]
async fn recovery_looks_back_30_days_at_most() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let path = format!("/v1/webhook-endpoints/{ep}/recover");
    let audit = api.count("SELECT count(*) FROM walhook.audit_log").await;
    let old = chrono::Utc::now() - chrono::Duration::days(31);
    let refused = api.post(&key, &path, json!({"since": old})).await;
    refused.problem(422);
    assert_eq!(refused.field(), "since");
    let message = refused.body["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("30 days"), "{message}");
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.audit_log").await,
        audit
    );
    let recent = chrono::Utc::now() - chrono::Duration::days(29);
    let ok = api.post(&key, &path, json!({"since": recent})).await;
    assert_eq!(ok.status, 202, "{ok:?}");
    assert_eq!(ok.body["replay_request_count"], 0);
}

#[tokio::test]
async fn recovery_works_in_batches_and_asks_once() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let uid = uuid::Uuid::from_bytes(ep.parse::<walhook_pipeline::ids::EndpointId>().unwrap().0);
    // 2,345 failures in the last day (more than two batches) and one
    // older than the window. Ids follow the derivation the table checks.
    api.sql
        .execute(
            "SELECT walhook.ensure_day_partition('deliveries', (now() AT TIME ZONE 'UTC')::date - g) \
             FROM generate_series(0, 3) g",
            &[],
        )
        .await
        .unwrap();
    let inserted = api
        .sql
        .execute(
            "INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, \
               event_occurred_at, endpoint_config_version, status, next_attempt_at, expires_at, created_at) \
             SELECT encode(substring(sha256('\\x0000000000000013'::bytea || convert_to('walhook.delivery.v1', 'UTF8') \
                      || '\\x0000000000000010'::bytea || uuid_send(e.id) \
                      || '\\x0000000000000010'::bytea || uuid_send($1)) FROM 1 FOR 16), 'hex')::uuid, \
                    e.id, $1, 'acme', 'invoice.paid', now(), 1, 'failed', now(), now(), e.at \
             FROM (SELECT gen_random_uuid() AS id, \
                          CASE WHEN n = 0 THEN now() - interval '3 days' \
                               ELSE now() - n * interval '1 second' END AS at \
                   FROM generate_series(0, 2345) n) e",
            &[&uid],
        )
        .await
        .unwrap();
    assert_eq!(inserted, 2346);
    let since = chrono::Utc::now() - chrono::Duration::days(1);
    let path = format!("/v1/webhook-endpoints/{ep}/recover");
    let first = api.post(&key, &path, json!({"since": since})).await;
    assert_eq!(first.status, 202, "{first:?}");
    assert_eq!(first.body["replay_request_count"], 2345);
    assert_eq!(
        api.count("SELECT count(*) FROM walhook.replay_requests")
            .await,
        2345
    );
    let again = api.post(&key, &path, json!({"since": since})).await;
    assert_eq!(again.body["replay_request_count"], 0, "{again:?}");
    // One replay of one of them: refused, its request is open.
    let one: uuid::Uuid = api
        .sql
        .query_one(
            "SELECT delivery_id FROM walhook.replay_requests LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let dlv = walhook_pipeline::ids::DeliveryId(*one.as_bytes());
    api.post(
        &key,
        &format!("/v1/webhook-deliveries/{dlv}/replay"),
        json!({}),
    )
    .await
    .problem(409);
}
