//! The API cannot starve the pipeline or the database: its own pool with a
//! `statement_timeout`, unauthenticated probes that read the database at
//! most once per interval, and readiness that never shows database errors.
//! (Request timeouts and the concurrency limit are unit-tested in
//! `limits.rs` with handlers that hold.)

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use walhook_api::{ApiLimits, ApiSettings, ApiState, Metrics};
use walhook_pipeline::url_policy::UrlPolicy;

use crate::support::{Answer, Api, OPERATOR, serve};

#[tokio::test]
async fn the_api_pool_sets_statement_timeout() {
    let api = Api::start_with(ApiLimits {
        statement_timeout: Duration::from_millis(300),
        ..ApiLimits::default()
    })
    .await;
    let client = api.state.platform.client().await.unwrap();
    let shown: String = client
        .query_one("SHOW statement_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, "300ms");
    let name: String = client
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "walhook-api");
    let slow = client
        .query_one("SELECT pg_sleep(5)", &[])
        .await
        .unwrap_err();
    assert_eq!(
        slow.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{slow:?}"
    );
    // The default is 10 s.
    assert_eq!(
        ApiLimits::default().statement_timeout,
        Duration::from_secs(10)
    );
}

/// `n` concurrent GETs of `path`, with `token` when not empty.
async fn flood(base: &str, path: &str, token: &str, n: usize) -> Vec<(u16, String)> {
    let http = reqwest::Client::new();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let mut request = http.get(format!("{base}{path}"));
            if !token.is_empty() {
                request = request.bearer_auth(token);
            }
            let request = request.send();
            tokio::spawn(async move {
                let r = request.await.unwrap();
                (r.status().as_u16(), r.text().await.unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test]
async fn probe_floods_read_the_database_once_per_interval() {
    let api = Api::start().await;
    // The default interval is 5 s; the floods take well under that.
    for (status, text) in flood(&api.base, "/metrics", OPERATOR, 40).await {
        assert_eq!(status, 200);
        assert!(text.contains("walhook_metrics_database_up 1"), "{text}");
    }
    for (status, _) in flood(&api.base, "/readyz", "", 40).await {
        assert_eq!(status, 200);
    }
    assert_eq!(api.state.metrics.gauge_reads(), 1);
    assert_eq!(api.state.readiness_checks(), 1);
}

/// Made-up keys, however many and however well-formed, cost at most one
/// read of the live keys' prefixes a second, never a lookup each; a key
/// issued a moment ago works at once.
#[tokio::test]
async fn made_up_keys_do_not_reach_the_database_one_by_one() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let before = api.state.key_prefix_reads();
    let http = reqwest::Client::new();
    let tasks: Vec<_> = (0..60u32)
        .map(|i| {
            // The form walhook issues: `whk_` and 43 URL-safe characters.
            let made_up = format!("whk_{:0>43}", format!("madeup{i}"));
            let request = http
                .get(format!("{}/v1/webhook-endpoints", api.base))
                .bearer_auth(made_up)
                .send();
            tokio::spawn(async move { request.await.unwrap().status().as_u16() })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 401);
    }
    assert!(
        api.state.key_prefix_reads() - before <= 2,
        "{} reads for 60 made-up keys",
        api.state.key_prefix_reads() - before
    );
    let answer = api.get(&key, "/v1/webhook-endpoints").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let fresh = api.tenant("globex").await;
    assert_eq!(api.get(&fresh, "/v1/webhook-endpoints").await.status, 200);
}

#[tokio::test]
async fn the_gauges_are_read_again_after_the_interval() {
    let api = Api::start_with(ApiLimits {
        metrics_cache: Duration::from_millis(200),
        ..ApiLimits::default()
    })
    .await;
    let key = api.tenant("acme").await;
    let ep = api.endpoint(&key, &[]).await;
    let scrape = || api.metrics();
    assert!(scrape().await.contains("walhook_deliveries_pending 0"));
    let test = api
        .post(
            &key,
            &format!("/v1/webhook-endpoints/{ep}/test"),
            serde_json::json!({}),
        )
        .await;
    assert_eq!(test.status, 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(scrape().await.contains("walhook_deliveries_pending 1"));
    assert_eq!(api.state.metrics.gauge_reads(), 2);
}

fn assert_no_database_text(answer: &Answer, hidden: &[&str]) {
    let text = answer.body.to_string();
    for word in [
        "refused",
        "os error",
        "does not exist",
        "error connecting",
        "db error",
        "FATAL",
    ]
    .iter()
    .chain(hidden)
    {
        assert!(
            !text.to_lowercase().contains(&word.to_lowercase()),
            "the answer shows database error text ({word}): {text}"
        );
    }
}

fn state_on(url: &str) -> ApiState {
    let limits = ApiLimits::default();
    let platform = walhook_api::connect(&crate::support::options(url), &limits).unwrap();
    let mut settings = ApiSettings::new(OPERATOR, UrlPolicy::default());
    settings.limits = limits;
    ApiState::new(platform, settings, Arc::new(Metrics::new()))
}

#[tokio::test]
async fn readyz_with_the_database_down_shows_no_error_text() {
    // Nothing listens on this port: the connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let state = state_on(&format!("postgres://walhook@127.0.0.1:{port}/walhook_xyz"));
    let (base, shutdown) = serve(state.clone()).await;
    let get = |path: &'static str| {
        let url = format!("{base}{path}");
        async move { Api::answer(reqwest::get(url).await.unwrap()).await }
    };
    for _ in 0..5 {
        let ready = get("/readyz").await;
        ready.problem(503);
        assert_eq!(ready.headers["retry-after"], "1");
        assert_no_database_text(&ready, &[&port.to_string(), "walhook_xyz", "127.0.0.1"]);
    }
    // One attempt to connect for all five.
    assert_eq!(state.readiness_checks(), 1);
    let metrics = crate::support::metrics_at(&reqwest::Client::new(), &base).await;
    assert!(
        metrics.contains("walhook_metrics_database_up 0"),
        "{metrics}"
    );
    shutdown.cancel();

    // A database that answers but does not exist: the same generic answer.
    let api = Api::start().await;
    let state = state_on(&api.pg.url("no_such_database"));
    let (base, shutdown) = serve(state).await;
    let ready = Api::answer(reqwest::get(format!("{base}/readyz")).await.unwrap()).await;
    ready.problem(503);
    assert_no_database_text(&ready, &["no_such_database"]);
    shutdown.cancel();
}
