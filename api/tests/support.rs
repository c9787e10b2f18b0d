//! A running API on a throwaway Postgres, and HTTP helpers.

#![allow(dead_code)]
// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use walhook_api::{ApiLimits, ApiSettings, ApiState, Metrics};
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::url_policy::UrlPolicy;
use walhook_sql::Platform;

/// The operator token of test servers.
pub const OPERATOR: &str = "test-operator-token-0123456789abcdef";

/// Event types in the catalog of test servers.
pub const TYPES: &[&str] = &["invoice.paid", "order.created", "user.disabled"];

/// A served API.
pub struct Api {
    /// The cluster (kept alive).
    pub pg: LocalPostgres,
    /// The platform, for direct checks.
    pub platform: Platform,
    /// A SQL session on the platform database.
    pub sql: tokio_postgres::Client,
    /// `http://127.0.0.1:port`.
    pub base: String,
    /// The client.
    pub http: reqwest::Client,
    /// The served state (its counters).
    pub state: ApiState,
    shutdown: CancellationToken,
}

impl Drop for Api {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A response: status, headers and JSON body (null when empty).
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The content type.
    pub content_type: String,
    /// Headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body as JSON (`Value::Null` when empty or not JSON).
    pub body: Value,
}

impl Answer {
    /// The `field` of the first error of a problem document.
    pub fn field(&self) -> &str {
        self.body["errors"][0]["field"].as_str().unwrap_or_default()
    }

    /// Asserts a problem document with `status`.
    pub fn problem(&self, status: u16) -> &Self {
        assert_eq!(self.status.as_u16(), status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert_eq!(self.body["status"], status, "{self:?}");
        assert!(
            self.body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{self:?}"
        );
        self
    }
}

impl Api {
    /// Starts Postgres, migrates, fills the catalog and serves the API.
    pub async fn start() -> Api {
        Self::start_with(ApiLimits::default()).await
    }

    /// [`Api::start`] with `limits`.
    pub async fn start_with(limits: ApiLimits) -> Api {
        Self::start_configured(limits, |_| {}).await
    }

    /// [`Api::start`] with `limits` and the settings `tweak` changes.
    pub async fn start_configured(limits: ApiLimits, tweak: impl FnOnce(&mut ApiSettings)) -> Api {
        let pg = LocalPostgres::start().await.unwrap();
        let url = pg.create_database("platform").await.unwrap();
        let mut sql = pg.connect("platform").await.unwrap();
        walhook_sql::migrate::run(&mut sql).await.unwrap();
        // The API's own pool, as `walhook run` and `walhook api` make it.
        let platform = walhook_api::connect(&options(&url), &limits)
            .unwrap()
            .with_keyring(walhook_sql::Keyring::ephemeral());
        let types: Vec<(String, u32)> = TYPES.iter().map(|t| (t.to_string(), 1)).collect();
        platform.upsert_event_types("main", &types).await.unwrap();
        let policy = UrlPolicy {
            allow_http_loopback: true,
            ..UrlPolicy::default()
        };
        let mut settings = ApiSettings::new(OPERATOR, policy);
        settings.limits = limits;
        tweak(&mut settings);
        let state = ApiState::new(platform.clone(), settings, Arc::new(Metrics::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        tokio::spawn(walhook_api::serve(
            listener,
            state.clone(),
            shutdown.clone(),
        ));
        Api {
            pg,
            platform,
            sql,
            base,
            http: reqwest::Client::new(),
            state,
            shutdown,
        }
    }

    /// POST with a token and an `Idempotency-Key`.
    pub async fn post_with_key(&self, token: &str, path: &str, key: &str, body: Value) -> Answer {
        Self::answer(
            self.http
                .post(format!("{}{path}", self.base))
                .bearer_auth(token)
                .header("idempotency-key", key)
                .json(&body)
                .send()
                .await
                .unwrap(),
        )
        .await
    }

    /// Sends a request with a bearer token and an optional JSON body.
    pub async fn call(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Answer {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        Self::answer(req.send().await.unwrap()).await
    }

    /// Sends raw bytes with a content type.
    pub async fn raw(
        &self,
        token: &str,
        method: Method,
        path: &str,
        content_type: &str,
        body: &'static [u8],
    ) -> Answer {
        let req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", content_type)
            .body(body);
        Self::answer(req.send().await.unwrap()).await
    }

    /// Reads a response.
    pub async fn answer(resp: reqwest::Response) -> Answer {
        let status = resp.status();
        let headers = resp.headers().clone();
        let content_type = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let bytes = resp.bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer {
            status,
            content_type,
            headers,
            body,
        }
    }

    /// GET with a token.
    pub async fn get(&self, token: &str, path: &str) -> Answer {
        self.call(token, Method::GET, path, None).await
    }

    /// POST with a token.
    pub async fn post(&self, token: &str, path: &str, body: Value) -> Answer {
        self.call(token, Method::POST, path, Some(body)).await
    }

    /// Creates tenant `id` and returns a fresh API key for it.
    pub async fn tenant(&self, id: &str) -> String {
        let t = self
            .post(OPERATOR, "/v1/tenants", json!({"id": id, "name": id}))
            .await;
        assert_eq!(t.status, 201, "{t:?}");
        let k = self
            .post(
                OPERATOR,
                &format!("/v1/tenants/{id}/api-keys"),
                json!({"name": "tests"}),
            )
            .await;
        assert_eq!(k.status, 201, "{k:?}");
        k.body["key"].as_str().unwrap().to_owned()
    }

    /// Creates an endpoint for the key's tenant on a loopback URL; returns
    /// its id.
    pub async fn endpoint(&self, key: &str, types: &[&str]) -> String {
        let e = self
            .post(
                key,
                "/v1/webhook-endpoints",
                json!({"url": "http://127.0.0.1:9/hook", "event_types": types}),
            )
            .await;
        assert_eq!(e.status, 201, "{e:?}");
        e.body["endpoint"]["id"].as_str().unwrap().to_owned()
    }

    /// `/metrics`, read with the operator token (the public listener
    /// serves it to no one else).
    pub async fn metrics(&self) -> String {
        metrics_at(&self.http, &self.base).await
    }

    /// A count from SQL.
    pub async fn count(&self, sql: &str) -> i64 {
        self.sql.query_one(sql, &[]).await.unwrap().get(0)
    }
}

/// Serves `state` on a loopback port (for states on a broken database);
/// returns the base URL and the token that stops it.
pub async fn serve(state: ApiState) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(walhook_api::serve(listener, state, shutdown.clone()));
    (base, shutdown)
}

/// `/metrics` at `base`, read with the operator token.
pub async fn metrics_at(http: &reqwest::Client, base: &str) -> String {
    let response = http
        .get(format!("{base}/metrics"))
        .bearer_auth(OPERATOR)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "GET /metrics with the operator token"
    );
    response.text().await.unwrap()
}

/// The connection settings of a test database URL (no TLS fields).
pub fn options(url: &str) -> walhook_pgtls::ConnectOptions {
    walhook_pgtls::ConnectOptions::parse(
        &walhook_pgtls::DatabaseUrl::new(url),
        "[platform]",
        &walhook_pgtls::TlsFields::default(),
    )
    .unwrap()
}
