//! A success ends the schedule: once a manual attempt of a delivery
//! succeeds, no automatic attempt of it follows, whether its next
//! automatic attempt waited in the dispatcher's memory or in Postgres.

use std::str::FromStr;
use std::time::Duration;

use serde_json::{Value, json};
use walhook_devkit::receiver::Behaviour;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::time::Timestamp;

use crate::support::api::{Http, at, endpoint, insert_order, onboard, start};

/// The one delivery of `endpoint` once its first automatic attempt is
/// recorded.
async fn first_failure(api: &Http, key: &str, endpoint: &str) -> Value {
    let listed = api
        .wait_for(
            key,
            &format!("/v1/webhook-deliveries?endpoint_id={endpoint}"),
            "the first automatic attempt",
            |b| {
                b["data"]
                    .as_array()
                    .is_some_and(|d| d.len() == 1 && d[0]["attempt_count"] == 1)
            },
        )
        .await;
    listed["data"][0].clone()
}

/// A receiver fails (503 with `Retry-After`), then recovers; the tenant
/// replays the failed delivery at once and the manual attempt succeeds.
/// At endpoint `near` the next automatic attempt was due 8 s later, held in
/// the dispatcher's memory (within the hold horizon); at `far` 120 s
/// later, handed back to Postgres (then made due at once by the test). The
/// receivers see neither: each delivery ends as succeeded after one
/// automatic and one manual attempt.
#[tokio::test]
async fn a_successful_replay_ends_the_automatic_schedule() {
    let (w, child, api) = start("").await;
    let key = onboard(&w, &api, "acme").await;
    let (near, _) = endpoint(&w, &api, &key, "near", &["order.created"]).await;
    let (far, _) = endpoint(&w, &api, &key, "far", &["order.created"]).await;
    let (fence, _) = endpoint(&w, &api, &key, "fence", &["webhook.test"]).await;
    for (path, secs) in [("near", 8), ("far", 120)] {
        w.receiver
            .set_behaviour(path, Behaviour::RetryAfter { status: 503, secs });
    }
    insert_order(&w, 1, "acme").await;
    let near_dlv = first_failure(&api, &key, &near).await;
    let far_dlv = first_failure(&api, &key, &far).await;
    let due: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(near_dlv["next_attempt_at"].clone()).unwrap();

    // The receivers recover; the tenant replays both.
    for path in ["near", "far"] {
        w.receiver.set_behaviour(path, Behaviour::Status(200));
    }
    let mut ids = Vec::new();
    for dlv in [&near_dlv, &far_dlv] {
        let id = dlv["id"].as_str().unwrap().to_owned();
        let (s, body) = api
            .post(
                &key,
                &format!("/v1/webhook-deliveries/{id}/replay"),
                json!({}),
            )
            .await;
        assert_eq!(s, 202, "{body}");
        ids.push(id);
    }
    for id in &ids {
        api.wait_for(
            &key,
            &format!("/v1/webhook-deliveries/{id}"),
            "the manual attempt's success",
            |b| {
                b["attempts"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|a| a["trigger"] == "manual" && a["http_status"] == 200)
                })
            },
        )
        .await;
        // Read again: the response that showed the attempt may have read
        // the delivery's row just before the attempt's transaction (which
        // also ends the delivery) committed.
        let (s, detail) = api.get(&key, &format!("/v1/webhook-deliveries/{id}")).await;
        assert_eq!(s, 200, "{detail}");
        assert_eq!(
            detail["delivery"]["status"], "succeeded",
            "a successful replay left the delivery {}",
            detail["delivery"]
        );
    }
    assert!(
        chrono::Utc::now() < due,
        "the replay came after the automatic retry was due; the test proves nothing"
    );

    // Whatever Postgres still holds is made due now; a test delivery to
    // `fence`, claimed by the sweeper like a handed-back retry, shows that
    // a claim ran after that. Then the held retry's time passes.
    w.platform_sql
        .batch_execute(
            "UPDATE walhook.pending SET next_attempt_at = now(); \
             UPDATE walhook.deliveries SET next_attempt_at = now() WHERE status = 'pending'",
        )
        .await
        .unwrap();
    let tenant = TenantId::new("acme").unwrap();
    let fence_id = EndpointId::from_str(&fence).unwrap();
    let (event, delivery) = walhook_api::test_event::build(
        &tenant,
        fence_id,
        1,
        Timestamp::now(),
        Duration::from_secs(3600),
    );
    w.platform
        .insert_test_delivery(&event, &delivery, "test")
        .await
        .unwrap();
    let wait = (due - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_secs(1)).await;
    let fenced = w
        .receiver
        .wait_until(Duration::from_secs(30), |got| {
            got.iter().any(|r| r.path == "fence")
        })
        .await;
    assert!(fenced, "the sweeper's fence never arrived");
    // One more claim round after the fence, for good measure.
    tokio::time::sleep(Duration::from_millis(600)).await;

    let received = w.receiver.received();
    for (path, id) in [("near", &ids[0]), ("far", &ids[1])] {
        let statuses: Vec<u16> = at(&received, path)
            .iter()
            .filter(|r| &r.webhook_id == id)
            .map(|r| r.status)
            .collect();
        assert_eq!(
            statuses,
            vec![503, 200],
            "{path}: an automatic attempt followed the successful replay of {id}"
        );
        let detail = api
            .get(&key, &format!("/v1/webhook-deliveries/{id}"))
            .await
            .1;
        let mut attempts: Vec<(i64, String)> = detail["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                (
                    a["number"].as_i64().unwrap(),
                    a["trigger"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        attempts.sort();
        assert_eq!(
            attempts,
            vec![(1, "auto".to_owned()), (2, "manual".to_owned())],
            "{path}: {detail}"
        );
        assert_eq!(
            detail["delivery"]["status"], "succeeded",
            "{path}: {detail}"
        );
    }
    assert!(child.terminate().success());
    w.assert_pending_consistent().await;
}
