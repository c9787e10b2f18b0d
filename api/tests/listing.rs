//! Cursor pagination: stable pages, filters, cursors bound to their filters.

use std::collections::HashSet;

use serde_json::json;

use crate::support::Api;

#[tokio::test]
async fn deliveries_page_with_stable_cursors() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let ep1 = api.endpoint(&key, &[]).await;
    let ep2 = api.endpoint(&key, &[]).await;
    let mut made = Vec::new();
    for ep in [&ep1, &ep1, &ep1, &ep1, &ep1, &ep2, &ep2] {
        let t = api
            .post(&key, &format!("/v1/webhook-endpoints/{ep}/test"), json!({}))
            .await;
        assert_eq!(t.status, 202, "{t:?}");
        made.push(t.body["delivery_id"].as_str().unwrap().to_owned());
    }

    // All of ep1's, two at a time, newest first.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = format!("/v1/webhook-deliveries?endpoint_id={ep1}&limit=2");
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = api.get(&key, &path).await;
        assert_eq!(page.status, 200, "{page:?}");
        pages += 1;
        if pages == 1 {
            // A delivery made meanwhile does not shift later pages.
            api.post(
                &key,
                &format!("/v1/webhook-endpoints/{ep1}/test"),
                json!({}),
            )
            .await;
        }
        for d in page.body["data"].as_array().unwrap() {
            assert_eq!(d["endpoint_id"], ep1.as_str());
            assert_eq!(d["status"], "pending");
            seen.push(d["id"].as_str().unwrap().to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = made[..5].iter().rev().cloned().collect();
    assert_eq!(seen, expected, "pages skipped or repeated deliveries");

    // A cursor is bound to its filters.
    let first = api
        .get(
            &key,
            &format!("/v1/webhook-deliveries?endpoint_id={ep1}&limit=2"),
        )
        .await;
    let c = first.body["next_cursor"].as_str().unwrap();
    let wrong = api
        .get(
            &key,
            &format!("/v1/webhook-deliveries?endpoint_id={ep2}&limit=2&cursor={c}"),
        )
        .await;
    wrong.problem(422);
    assert_eq!(wrong.field(), "query.cursor");

    // Filters: status, type, time window.
    let all = api.get(&key, "/v1/webhook-deliveries?limit=250").await;
    assert_eq!(all.body["data"].as_array().unwrap().len(), 8);
    let none = api
        .get(&key, "/v1/webhook-deliveries?status=succeeded")
        .await;
    assert_eq!(none.body["data"], json!([]));
    let typed = api
        .get(&key, "/v1/webhook-deliveries?event_type=webhook.test")
        .await;
    assert_eq!(typed.body["data"].as_array().unwrap().len(), 8);
    let future = api
        .get(&key, "/v1/webhook-deliveries?since=2999-01-01T00:00:00Z")
        .await;
    assert_eq!(future.body["data"], json!([]));

    // One delivery: its event's exact body and (no) attempts.
    let one = api
        .get(&key, &format!("/v1/webhook-deliveries/{}", made[0]))
        .await;
    assert_eq!(one.status, 200, "{one:?}");
    assert_eq!(one.body["event"]["type"], "webhook.test");
    assert_eq!(one.body["event"]["payload"]["type"], "webhook.test");
    assert_eq!(one.body["event"]["source"], "walhook.api");
    assert_eq!(one.body["attempts"], json!([]));

    // Endpoints page too, oldest first.
    let mut ids = HashSet::new();
    let p1 = api.get(&key, "/v1/webhook-endpoints?limit=1").await;
    ids.insert(p1.body["data"][0]["id"].as_str().unwrap().to_owned());
    let c = p1.body["next_cursor"].as_str().unwrap();
    let p2 = api
        .get(&key, &format!("/v1/webhook-endpoints?limit=1&cursor={c}"))
        .await;
    ids.insert(p2.body["data"][0]["id"].as_str().unwrap().to_owned());
    assert!(p2.body["next_cursor"].is_null(), "{p2:?}");
    assert_eq!(ids, HashSet::from([ep1, ep2]));
}
