//! Driving `walhook run`'s API over HTTP in end-to-end tests.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};
use walhook_devkit::receiver::Received;

use super::{Child, World};

pub const OPERATOR: &str = "e2e-operator-token-0123456789abcdef01";

/// A free loopback port (bound and released; the child binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `[api]` on `port`; `/metrics` is read with the operator token on that
/// port ([`Http::metrics`]), so the token-free metrics listener takes any
/// free loopback port.
pub fn api_section(port: u16) -> String {
    format!(
        "[api]\nlisten = \"127.0.0.1:{port}\"\nmetrics_listen = \"127.0.0.1:0\"\n\
         operator_token = \"{OPERATOR}\"\n"
    )
}

/// A client of the API at a loopback port.
pub struct Http {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The HTTP client.
    pub client: reqwest::Client,
}

impl Http {
    pub fn new(port: u16) -> Http {
        Http {
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::new(),
        }
    }

    pub async fn call(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        self.call(token, Method::GET, path, None).await
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.call(token, Method::POST, path, Some(body)).await
    }

    /// `/metrics`, read with the operator token (without one the public
    /// listener answers 401).
    pub async fn metrics(&self) -> String {
        self.text_as(OPERATOR, "/metrics").await
    }

    pub async fn text(&self, path: &str) -> String {
        self.text_as("", path).await
    }

    pub async fn text_as(&self, token: &str, path: &str) -> String {
        let mut req = self.client.get(format!("{}{path}", self.base));
        if !token.is_empty() {
            req = req.bearer_auth(token);
        }
        req.send().await.unwrap().text().await.unwrap()
    }

    /// Waits until the service answers /readyz.
    pub async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = self
                .client
                .get(format!("{}/readyz", self.base))
                .send()
                .await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the API did not become ready within 30 s");
    }

    /// Polls `path` until `done` holds for its body.
    pub async fn wait_for(
        &self,
        token: &str,
        path: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, body) = self.get(token, path).await;
            if status == 200 && done(&body) {
                return body;
            }
            if Instant::now() > deadline {
                panic!("{what} did not happen within 60 s; last answer {status}: {body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A tenant and its key, an endpoint on the receiver at `path` (which then
/// verifies signatures with its secret).
/// A world and `walhook run` with `[api]` (and `extra` config), ready and
/// streaming.
pub async fn start(extra: &str) -> (World, Child, Http) {
    let w = World::new().await;
    let port = free_port();
    let child = Child::run(&w.config(&format!("{}{extra}", api_section(port))));
    let api = Http::new(port);
    api.wait_ready().await;
    w.wait_streaming().await;
    (w, child, api)
}

/// Waits until endpoint `id` passed its ownership check.
pub async fn wait_verified(api: &Http, key: &str, id: &str) {
    api.wait_for(
        key,
        &format!("/v1/webhook-endpoints/{id}"),
        "the endpoint's ownership check",
        |b| b["verification"]["state"] == "verified",
    )
    .await;
}

pub async fn onboard(w: &World, api: &Http, tenant: &str) -> String {
    let (s, _) = api
        .post(OPERATOR, "/v1/tenants", json!({"id": tenant}))
        .await;
    assert!(s == 201 || s == 409, "{s}");
    let (s, key) = api
        .post(
            OPERATOR,
            &format!("/v1/tenants/{tenant}/api-keys"),
            json!({"name": "e2e"}),
        )
        .await;
    assert_eq!(s, 201, "{key}");
    let _ = w;
    key["key"].as_str().unwrap().to_owned()
}

pub async fn endpoint(
    w: &World,
    api: &Http,
    key: &str,
    path: &str,
    types: &[&str],
) -> (String, String) {
    let (s, created) = api
        .post(
            key,
            "/v1/webhook-endpoints",
            json!({"url": w.receiver.url(path), "event_types": types}),
        )
        .await;
    assert_eq!(s, 201, "{created}");
    let secret = created["secret"].as_str().unwrap().to_owned();
    w.receiver.set_secrets(path, vec![secret.clone()]);
    let id = created["endpoint"]["id"].as_str().unwrap().to_owned();
    // The receiver echoes the ownership check; nothing is sent before.
    wait_verified(api, key, &id).await;
    (id, secret)
}

pub fn at(received: &[Received], path: &str) -> Vec<Received> {
    received
        .iter()
        .filter(|r| r.path == path)
        .cloned()
        .collect()
}

pub async fn insert_order(w: &World, id: i64, tenant: &str) {
    w.shop
        .execute("INSERT INTO orders VALUES ($1, $2, 10.50)", &[&id, &tenant])
        .await
        .unwrap();
}
