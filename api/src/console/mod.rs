//! The web console: server-rendered pages under `/console` for tenants
//! (their endpoints, deliveries, event types and audit log) and for the
//! operator (the pipeline, tenants).
//!
//! The console is a client of the REST API inside the process: every page
//! reads, and every form acts, through the API's own routes with the
//! caller's credential, so authorisation, validation, idempotency and the
//! audit trail are the API's and cannot drift apart. The credential (an API
//! key or the operator token) stays on the server, in a session of at most
//! [`SESSION_TTL`]; the browser holds a random session id in an `HttpOnly`,
//! `Secure`, `SameSite=Strict` cookie named with the `__Host-` prefix
//! (so it is bound to this host, `Path=/`, and no subdomain or plain-http
//! page can set or shadow it). Each credential holds a bounded number of
//! sessions and sign-ins are rate-limited (`sessions.rs`, `signin.rs`,
//! [`crate::ratelimit`]). Every form
//! carries the session's CSRF token (the sign-in form a token of its own,
//! double-submitted in a cookie), and a POST without it changes nothing.
//! Pages are escaped by the template engine (payloads, URLs and
//! descriptions are hostile input), served with a strict
//! Content-Security-Policy and no script at all; the stylesheet ships in
//! the binary.

mod charts;
mod deliveries;
mod operator;
mod pager;
mod pages;
pub(crate) mod sessions;
mod signin;

pub(crate) use self::signin::{too_large_form, too_slow_form};

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use maud::{DOCTYPE, Markup, html};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

use self::sessions::Sessions;
use crate::ApiState;
use crate::ratelimit::{Attempts, CredentialKey};

/// How long a console session lasts after sign-in.
pub const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);

/// The session cookie. `__Host-`: browsers accept it only with `Secure`,
/// `Path=/` and no `Domain`, so it cannot be set by a subdomain or over
/// plain http, nor shadowed by a cookie of a narrower path.
const COOKIE: &str = "__Host-walhook_console";
/// The sign-in form's CSRF cookie (double submit), prefixed the same way.
const LOGIN_COOKIE: &str = "__Host-walhook_console_login";

/// The console's state inside the API: its sessions, the sign-in attempts
/// and the API router it calls.
pub(crate) struct Console {
    sessions: Mutex<Sessions>,
    sign_ins: Attempts,
    api: OnceLock<Router>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console")
            .field("sessions", &self.sessions.lock().len())
            .finish_non_exhaustive()
    }
}

impl Console {
    /// A console allowing `sign_ins_per_minute` sign-in attempts per client
    /// address and per credential.
    pub(crate) fn new(sign_ins_per_minute: u32) -> Self {
        Console {
            sessions: Mutex::new(Sessions::default()),
            sign_ins: Attempts::new(sign_ins_per_minute),
            api: OnceLock::new(),
        }
    }

    /// Sessions held now.
    pub(crate) fn session_count(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Sessions held by `credential`.
    pub(crate) fn sessions_held_by(&self, credential: &str) -> usize {
        self.sessions.lock().held_by(CredentialKey::of(credential))
    }

    /// Hands the console the API routes it calls (set once, when the router
    /// is built).
    pub(crate) fn set_api(&self, api: Router) {
        let _ = self.api.set(api);
    }
}

/// Who signed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Who {
    Tenant(String),
    Operator,
}

/// A signed-in browser.
#[derive(Clone)]
pub(crate) struct Session {
    credential: String,
    /// The credential's key (sessions are capped per credential).
    owner: CredentialKey,
    pub(crate) who: Who,
    pub(crate) csrf: String,
    expires: Instant,
}

fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
}

fn same(a: &str, b: &str) -> bool {
    let (ha, hb) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    ha.iter()
        .zip(hb.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

fn set_cookie(name: &str, value: &str, max_age: u64) -> HeaderValue {
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static(""))
}

impl FromRequestParts<ApiState> for Session {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let id = cookie(&parts.headers, COOKIE).unwrap_or_default();
        let session = state.guards.console.sessions.lock().get(id, Instant::now());
        session.ok_or_else(|| Redirect::to("/console/login").into_response())
    }
}

/// A session of the tenant console (the operator gets a 404 page).
pub(crate) struct TenantSession(pub(crate) Session);

impl FromRequestParts<ApiState> for TenantSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let s = Session::from_request_parts(parts, state).await?;
        match &s.who {
            Who::Tenant(t) => {
                // The tenant's share of the request slots, as its API calls.
                if let Ok(tenant) = walhook_pipeline::ids::TenantId::new(t.as_str()) {
                    crate::limits::admit_tenant(&parts.extensions, &tenant)
                        .map_err(IntoResponse::into_response)?;
                }
                Ok(TenantSession(s))
            }
            Who::Operator => Err(not_found(
                &s,
                "This page belongs to a tenant's console; the operator's pages are Pipeline and Tenants.",
            )),
        }
    }
}

/// A session of the operator (tenants get a 404 page).
pub(crate) struct OperatorSession(pub(crate) Session);

impl FromRequestParts<ApiState> for OperatorSession {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Response> {
        let s = Session::from_request_parts(parts, state).await?;
        match s.who {
            Who::Operator => Ok(OperatorSession(s)),
            Who::Tenant(_) => Err(not_found(&s, "No such page.")),
        }
    }
}

/// The fields of a posted form (`application/x-www-form-urlencoded`), in
/// order; repeated names (checkboxes) repeat.
pub(crate) struct Form(pub(crate) Vec<(String, String)>);

impl Form {
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The refusal of a form without the session's CSRF token; `None`
    /// when it carries it.
    pub(crate) fn refused(&self, s: &Session) -> Option<Response> {
        match self.get("csrf") {
            Some(t) if same(t, &s.csrf) => None,
            _ => Some(forbidden_form(Some(s))),
        }
    }
}

impl<S: Send + Sync> axum::extract::FromRequest<S> for Form {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| {
                if crate::limits::is_body_timeout(&e) {
                    too_slow_form()
                } else {
                    e.into_response()
                }
            })?;
        serde_urlencoded::from_bytes::<Vec<(String, String)>>(&bytes)
            .map(Form)
            .map_err(|_| forbidden_form(None))
    }
}

fn forbidden_form(s: Option<&Session>) -> Response {
    let body = html! {
        h1 { "The form was refused" }
        p { "It did not carry this console's form token (CSRF), so nothing was changed. Reload the page and send the form again." }
    };
    (StatusCode::FORBIDDEN, page("Refused", s, None, body)).into_response()
}

pub(crate) fn not_found(s: &Session, detail: &str) -> Response {
    let body = html! { h1 { "Not found" } p { (detail) } };
    (
        StatusCode::NOT_FOUND,
        page("Not found", Some(s), None, body),
    )
        .into_response()
}

/// The API's answer to an in-process call.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: serde_json::Value,
}

impl Answer {
    pub(crate) fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The problem's sentence (`detail`, with the fields it names).
    pub(crate) fn problem(&self) -> String {
        let mut text = self.body["detail"]
            .as_str()
            .unwrap_or("the request failed")
            .to_owned();
        if let Some(errors) = self.body["errors"].as_array() {
            for e in errors {
                text.push_str(&format!(
                    " {}: {}",
                    e["field"].as_str().unwrap_or("?"),
                    e["message"].as_str().unwrap_or("")
                ));
            }
        }
        text
    }
}

/// Sends a request to the API's route `uri` with `credential`; the API's
/// response as it is.
async fn send(
    state: &ApiState,
    credential: &str,
    method: Method,
    uri: &str,
    body: Option<serde_json::Value>,
) -> Response {
    use tower::ServiceExt;
    let Some(api) = state.guards.console.api.get().cloned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "the console is not connected to the API",
        )
            .into_response();
    };
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {credential}"));
    let body = match body {
        Some(b) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(b.to_string())
        }
        None => Body::empty(),
    };
    let Ok(request) = request.body(body) else {
        return (
            StatusCode::BAD_REQUEST,
            "the console could not form the request",
        )
            .into_response();
    };
    match api.oneshot(request).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// Calls the API's route `uri` with `credential`; its JSON answer.
pub(crate) async fn call(
    state: &ApiState,
    credential: &str,
    method: Method,
    uri: &str,
    body: Option<serde_json::Value>,
) -> Answer {
    let response = send(state, credential, method, uri, body).await;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 16 << 20)
        .await
        .unwrap_or_default();
    Answer {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    }
}

impl Session {
    /// Calls the API as this session's caller.
    pub(crate) async fn call(
        &self,
        state: &ApiState,
        method: Method,
        uri: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        call(state, &self.credential, method, uri, body).await
    }

    /// The API's response to this session's caller, as it is (an HTML
    /// report keeps its own headers).
    pub(crate) async fn send(&self, state: &ApiState, uri: &str) -> Response {
        send(state, &self.credential, Method::GET, uri, None).await
    }

    /// A hidden field with the session's CSRF token, for every form.
    pub(crate) fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name="csrf" value=(self.csrf); }
    }
}

/// A page of the console: the layout around `body`, with a notice.
pub(crate) fn page(
    title: &str,
    s: Option<&Session>,
    notice: Option<Markup>,
    body: Markup,
) -> axum::response::Html<String> {
    axum::response::Html(layout(title, s, notice, body).into_string())
}

fn layout(title: &str, s: Option<&Session>, notice: Option<Markup>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · walhook" }
                link rel="stylesheet" href="/console/static/console.css";
            }
            body {
                a class="skip" href="#main" { "Skip to content" }
                header {
                    span class="brand" { "walhook" }
                    @if let Some(s) = s {
                        nav aria-label="Console" {
                            @match &s.who {
                                Who::Tenant(t) => {
                                    a href="/console/endpoints" { "Endpoints" }
                                    a href="/console/deliveries" { "Deliveries" }
                                    a href="/console/event-types" { "Event types" }
                                    a href="/console/audit-log" { "Audit log" }
                                    a href="/console/reconciliations" { "Reconciliation" }
                                    span class="who" { "tenant " (t) }
                                }
                                Who::Operator => {
                                    a href="/console/pipeline" { "Pipeline" }
                                    a href="/console/tenants" { "Tenants" }
                                    a href="/console/reconciliations" { "Reconciliation" }
                                    span class="who" { "operator" }
                                }
                            }
                            form method="post" action="/console/logout" class="inline" {
                                (s.csrf_field())
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main id="main" {
                    @if let Some(n) = notice { div class="notice" role="status" { (n) } }
                    (body)
                }
            }
        }
    }
}

/// A page as a response.
pub(crate) fn respond(title: &str, s: &Session, notice: Option<Markup>, body: Markup) -> Response {
    page(title, Some(s), notice, body).into_response()
}

const CSS: &str = include_str!("console.css");

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        CSS,
    )
        .into_response()
}

/// Headers of every console response: a strict CSP (no script, no
/// third-party anything), no framing, no sniffing, no caching of pages.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    // A page passed on from the API (the reconciliation report, styled
    // inline) keeps the policy it came with.
    if !h.contains_key(header::CONTENT_SECURITY_POLICY) {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; \
                 frame-ancestors 'none'; base-uri 'none'",
            ),
        );
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

async fn index(s: Session) -> Response {
    match s.who {
        Who::Tenant(_) => Redirect::to("/console/endpoints").into_response(),
        Who::Operator => Redirect::to("/console/pipeline").into_response(),
    }
}

/// The console's routes (mounted by [`crate::routes::router`]).
pub(crate) fn router() -> Router<ApiState> {
    Router::new()
        .route("/console", get(index))
        .route("/console/", get(index))
        .route("/console/static/console.css", get(stylesheet))
        .route(
            "/console/login",
            get(signin::login_form).post(signin::login),
        )
        .route("/console/logout", post(signin::logout))
        .route(
            "/console/endpoints",
            get(pages::endpoints).post(pages::create_endpoint),
        )
        .route("/console/endpoints/{id}", get(pages::endpoint))
        .route("/console/endpoints/{id}/rotate", post(pages::rotate))
        .route("/console/endpoints/{id}/recover", post(pages::recover))
        .route("/console/deliveries", get(deliveries::deliveries))
        .route("/console/deliveries/{id}", get(deliveries::delivery))
        .route("/console/deliveries/{id}/replay", post(deliveries::replay))
        .route("/console/event-types", get(pages::event_types))
        .route("/console/audit-log", get(pages::audit_log))
        .route("/console/pipeline", get(operator::pipeline))
        .route("/console/tenants", get(operator::tenants))
        .route("/console/tenants/{id}", get(operator::tenant))
        .route("/console/tenants/{id}/keys", post(operator::issue_key))
        .route(
            "/console/tenants/{id}/keys/{key}/revoke",
            post(operator::revoke_key),
        )
        .route("/console/reconciliations", get(operator::reconciliations))
        .route(
            "/console/reconciliations/{id}/report.html",
            get(operator::reconciliation_report),
        )
        .layer(axum::middleware::from_fn(security_headers))
}
