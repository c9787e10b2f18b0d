//! No subscriber misses an event, and no deleted endpoint gets one: an
//! endpoint change the API answered is honoured for every business change
//! committed after the answer, however soon after.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::World;
use crate::support::api::{Http, api_section, endpoint, free_port, onboard};
use crate::support::{Child, run, stderr, walhook};

const ROUNDS: i64 = 100;

/// The order ids each path received (verified signatures only).
fn orders_by_path(w: &World, prefix: &str) -> BTreeMap<String, BTreeSet<i64>> {
    let mut out: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for r in w.receiver.received() {
        if !r.path.starts_with(prefix) {
            continue;
        }
        assert_eq!(r.verified, Some(true), "a bad signature at {}", r.path);
        let body: Value = serde_json::from_slice(&r.body).unwrap();
        let id: i64 = body["object_id"].as_str().unwrap().parse().unwrap();
        out.entry(r.path.clone()).or_default().insert(id);
    }
    out
}

/// Waits until `want` holds for what the receiver has, then a little
/// longer, so that a delivery that should not exist has had time to show.
async fn settle(w: &World, prefix: &str, want: &BTreeMap<String, BTreeSet<i64>>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = orders_by_path(w, prefix);
        let complete = want
            .iter()
            .all(|(p, ids)| got.get(p).is_some_and(|g| g.is_superset(ids)));
        if complete {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "deliveries missing after 60 s: {}",
                want.iter()
                    .filter_map(|(p, ids)| {
                        let g = got.get(p).cloned().unwrap_or_default();
                        let missing: Vec<_> = ids.difference(&g).collect();
                        (!missing.is_empty()).then(|| format!("{p} misses {missing:?}"))
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

#[tokio::test]
async fn an_endpoint_receives_every_event_committed_after_the_api_answered() {
    let w = World::new().await;
    let port = free_port();
    let cfg = w.config(&format!(
        "{}max_endpoints_per_tenant = 1000\n",
        api_section(port)
    ));
    let out = run(walhook().args(["migrate", "--config"]).arg(&cfg));
    assert!(out.status.success(), "{}", stderr(&out));
    let child = Child::run(&cfg);
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    let key = onboard(&w, &api, "acme").await;

    // 1. Create, then commit at once.
    for i in 0..ROUNDS {
        let path = format!("new-{i}");
        endpoint(&w, &api, &key, &path, &["order.created"]).await;
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&i])
            .await
            .unwrap();
    }
    let want: BTreeMap<String, BTreeSet<i64>> = (0..ROUNDS)
        .map(|i| (format!("new-{i}"), (i..ROUNDS).collect()))
        .collect();
    settle(&w, "new-", &want).await;
    assert_eq!(
        orders_by_path(&w, "new-"),
        want,
        "an endpoint missed an event committed after it was created, or got one from before"
    );

    // 2. Subscribe (PATCH), then commit at once: orders 1000.. belong to
    // this phase only.
    let mut ids = Vec::new();
    for i in 0..ROUNDS {
        let path = format!("sub-{i}");
        let (id, _) = endpoint(&w, &api, &key, &path, &["user.disabled"]).await;
        ids.push(id);
    }
    for (i, id) in ids.iter().enumerate() {
        let (s, body) = api
            .call(
                &key,
                Method::PATCH,
                &format!("/v1/webhook-endpoints/{id}"),
                Some(json!({"event_types": ["user.disabled", "order.created"]})),
            )
            .await;
        assert_eq!(s, 200, "{body}");
        w.shop
            .execute(
                "INSERT INTO orders VALUES ($1, 'acme', 1)",
                &[&(1000 + i as i64)],
            )
            .await
            .unwrap();
    }
    let want: BTreeMap<String, BTreeSet<i64>> = (0..ROUNDS)
        .map(|i| (format!("sub-{i}"), (1000 + i..1000 + ROUNDS).collect()))
        .collect();
    settle(&w, "sub-", &want).await;
    assert_eq!(
        orders_by_path(&w, "sub-"),
        want,
        "a subscription change was not honoured for a change committed after it"
    );

    // 3. Delete, then commit at once: the deleted endpoint gets nothing
    // committed after the delete; the one still there gets everything.
    let mut ids = Vec::new();
    for i in 0..ROUNDS {
        let path = format!("del-{i}");
        let (id, _) = endpoint(&w, &api, &key, &path, &["invoice.paid"]).await;
        ids.push(id);
    }
    endpoint(&w, &api, &key, "del-keeper", &["invoice.paid"]).await;
    for i in 0..ROUNDS {
        w.shop
            .execute(
                "INSERT INTO invoices VALUES ($1, 'acme', 'open', 100)",
                &[&(2000 + i)],
            )
            .await
            .unwrap();
    }
    for (i, id) in ids.iter().enumerate() {
        let (s, body) = api
            .call(
                &key,
                Method::DELETE,
                &format!("/v1/webhook-endpoints/{id}"),
                None,
            )
            .await;
        assert!(s == 204 || s == 200, "{s} {body}");
        w.shop
            .execute(
                "UPDATE invoices SET status = 'paid' WHERE id = $1",
                &[&(2000 + i as i64)],
            )
            .await
            .unwrap();
    }
    let keeper: BTreeMap<String, BTreeSet<i64>> =
        [("del-keeper".to_owned(), (2000..2000 + ROUNDS).collect())].into();
    settle(&w, "del-keeper", &keeper).await;
    let got = orders_by_path(&w, "del-");
    for i in 0..ROUNDS {
        let path = format!("del-{i}");
        // Invoice 2000 + j was paid after endpoints del-0..=del-j were
        // deleted.
        let late: Vec<i64> = got
            .get(&path)
            .into_iter()
            .flatten()
            .copied()
            .filter(|id| *id >= 2000 + i)
            .collect();
        assert!(
            late.is_empty(),
            "{path} received {late:?}, paid after it was deleted"
        );
    }
    assert_eq!(got["del-keeper"], keeper["del-keeper"]);
    assert!(child.terminate().success());
}
