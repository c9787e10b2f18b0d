//! Metrics that outsiders cannot grow or read: no label value comes from
//! what a caller sent (a made-up method is refused before any metric is
//! touched; unknown paths are one series), and the tenant- and
//! endpoint-labelled series are served only with a token on the public
//! listener, or without one on the loopback metrics listener.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::time::Instant;

use reqwest::Method;
use walhook_api::metrics::Refusal;
use walhook_api::{ApiLimits, ApiState};
use walhook_pipeline::metrics::{EndpointLabels, TenantLabels};

use crate::support::{Api, OPERATOR};

/// The resident set of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn made_up(len: usize) -> String {
    (0..len)
        .map(|_| char::from(b'A' + rand::random::<u8>() % 26))
        .collect()
}

/// The series of metric `name` in `/metrics` text.
fn series<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .collect()
}

/// The sample of the series that starts with `prefix`.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_methods_paths_and_statuses_leave_the_metrics_bounded() {
    let api = Api::start().await;
    let key = api.tenant("acme").await;
    let endpoint = api.endpoint(&key, &["invoice.paid"]).await;
    api.metrics().await;
    let before = api.metrics().await;
    let rss_before = rss_kib();

    // 3,000 requests, each with a 2 KB method of its own, from 8 clients.
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let base = api.base.clone();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut methods = Vec::new();
                for _ in 0..375 {
                    let method = made_up(2048);
                    let r = http
                        .request(
                            Method::from_bytes(method.as_bytes()).unwrap(),
                            format!("{base}/v1/webhook-endpoints"),
                        )
                        .bearer_auth("whk_anything")
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(r.status(), 405);
                    assert_eq!(r.headers()["content-type"], "application/problem+json");
                    methods.push(method[..64].to_owned());
                }
                methods
            })
        })
        .collect();
    let mut methods = Vec::new();
    for t in tasks {
        methods.extend(t.await.unwrap());
    }
    let took = started.elapsed();
    let rss_after = rss_kib();
    let after = api.metrics().await;

    // Made-up paths (under routes and not), and every status the server
    // gives, from callers with and without keys.
    let mut paths = Vec::new();
    for i in 0..300 {
        let junk = made_up(200);
        let path = match i % 3 {
            0 => format!("/{junk}"),
            1 => format!("/v1/webhook-endpoints/{junk}"),
            _ => format!("/v1/tenants/{junk}/api-keys"),
        };
        let token = if i % 2 == 0 { key.as_str() } else { OPERATOR };
        let status = api.get(token, &path).await.status.as_u16();
        assert!(matches!(status, 403 | 404), "{path}: {status}");
        paths.push(junk);
    }
    for (method, path, token) in [
        (Method::DELETE, "/healthz", ""),
        (Method::PUT, "/v1/webhook-endpoints", key.as_str()),
        (Method::GET, "/v1/webhook-endpoints?limit=0", key.as_str()),
        (Method::POST, "/v1/webhook-endpoints", key.as_str()),
        (Method::GET, "/v1/webhook-endpoints", "whk_unknown"),
        (
            Method::GET,
            &format!("/v1/webhook-endpoints/{endpoint}"),
            &key,
        ),
        (Method::OPTIONS, "/console/login", ""),
        (Method::TRACE, "/", ""),
    ] {
        api.call(token, method, path, None).await;
    }
    let flooded = api.metrics().await;
    let rss_end = rss_kib();

    println!(
        "3,000 made-up 2 KB methods in {took:?}: /metrics {} -> {} bytes ({:+}), RSS {} -> {} KiB \
         ({:+} KiB); after 300 made-up paths and every status: /metrics {} bytes, RSS {} KiB",
        before.len(),
        after.len(),
        after.len() as i64 - before.len() as i64,
        rss_before,
        rss_after,
        rss_after as i64 - rss_before as i64,
        flooded.len(),
        rss_end
    );
    assert!(
        after.len() <= before.len() + 100 * 1024,
        "/metrics grew from {} to {} bytes",
        before.len(),
        after.len()
    );
    assert!(
        rss_after <= rss_before + 20 * 1024,
        "RSS grew from {rss_before} to {rss_after} KiB"
    );
    // Nothing a caller made up is in the text.
    for junk in methods.iter().chain(&paths) {
        assert!(!flooded.contains(junk.as_str()), "{junk} became a label");
    }
    // The refusals are counted, under a fixed label.
    assert_eq!(
        sample(&flooded, "walhook_api_refusals_total{reason=\"method\"}"),
        3000.0
    );
    let methods_seen: BTreeSet<&str> = series(&flooded, "walhook_api_requests_total")
        .iter()
        .filter_map(|l| l.split("method=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        methods_seen.iter().all(|m| m.len() <= 7),
        "{methods_seen:?}"
    );
    // Every series of requests names a route template or `unmatched`:
    // 300 made-up paths added at most one series per method and status.
    let routes: BTreeSet<&str> = series(&flooded, "walhook_api_requests_total")
        .iter()
        .filter_map(|l| l.split("route=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        routes.iter().all(|r| *r == "unmatched"
            || r.starts_with("/v1/")
            || r.starts_with("/console")
            || ["/healthz", "/metrics", "/readyz", "/openapi.json"].contains(r)),
        "{routes:?}"
    );
    let count = series(&flooded, "walhook_api_requests_total").len();
    assert!(
        count <= series(&before, "walhook_api_requests_total").len() + 16,
        "{count} series of requests:\n{}",
        series(&flooded, "walhook_api_requests_total").join("\n")
    );
}

/// Puts a tenant and an endpoint label into the pipeline's metrics, as
/// dispatch does.
fn labelled(state: &ApiState) {
    let m = &state.metrics.pipeline;
    m.tenant_attempts
        .get_or_create(&TenantLabels {
            tenant_id: m.tenants_labelled.label("acme-private-tenant"),
            kind: "auto".into(),
        })
        .inc();
    m.endpoint_attempts
        .get_or_create(&EndpointLabels {
            endpoint_id: m.endpoints_labelled.label("ep_privateendpoint0000000000"),
            status_class: "2xx".into(),
        })
        .inc();
}

#[tokio::test]
async fn the_public_listener_serves_metrics_only_with_a_token() {
    const METRICS_TOKEN: &str = "metrics-token-0123456789abcdef0123456789";
    let api = Api::start_configured(ApiLimits::default(), |s| {
        s.metrics_token = Some(walhook_pipeline::redact::Redacted::new(
            METRICS_TOKEN.to_owned(),
        ));
    })
    .await;
    let key = api.tenant("acme").await;
    labelled(&api.state);
    let get = |token: &'static str| {
        let request = api.http.get(format!("{}/metrics", api.base));
        let request = if token.is_empty() {
            request
        } else {
            request.bearer_auth(token)
        };
        async move {
            let r = request.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    // Anonymous, or a tenant's key: 401, naming no tenant and no endpoint.
    let (status, body) = get("").await;
    assert_eq!(status, 401, "{body}");
    let key: &'static str = Box::leak(key.into_boxed_str());
    let (tenant_status, tenant_body) = get(key).await;
    assert_eq!(tenant_status, 401, "{tenant_body}");
    for text in [&body, &tenant_body] {
        assert!(
            !text.contains("acme") && !text.contains("ep_") && !text.contains("tenant_id"),
            "{text}"
        );
        assert!(text.contains("metrics_listen"), "{text}");
    }
    // The operator token and the metrics token read everything.
    for token in [OPERATOR, METRICS_TOKEN] {
        let (status, text) = get(token).await;
        assert_eq!(status, 200);
        assert!(
            text.contains("tenant_id=\"acme-private-tenant\"")
                && text.contains("endpoint_id=\"ep_privateendpoint0000000000\""),
            "{text}"
        );
    }

    // The metrics listener serves them without a token, and nothing else.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let served = tokio::spawn(walhook_api::serve_metrics(
        listener,
        api.state.clone(),
        stop.clone(),
    ));
    let text = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("tenant_id=\"acme-private-tenant\""), "{text}");
    let other = reqwest::get(format!("{base}/v1/tenants")).await.unwrap();
    assert_eq!(other.status(), 404);
    stop.cancel();
    served.await.unwrap().unwrap();
    assert!(api.state.metrics.refusals(Refusal::AuthenticationRate) == 0);
}
