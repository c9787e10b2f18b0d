//! The tenant's pages: endpoints, deliveries, event types, the audit log.
//! Each reads and acts through the API (see the module above).

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde_json::{Value, json};

use super::charts::{Axis, Bar, bars};
use super::{Answer, Form, Session, TenantSession, not_found, respond};
use crate::ApiState;

/// Text of a JSON value: strings as they are, others as JSON.
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn rows(v: &Value) -> &[Value] {
    v["data"].as_array().map_or(&[], Vec::as_slice)
}

/// An API answer that is not a success, as the console shows it: back to
/// sign-in when the credential no longer works, the problem otherwise.
fn failed(s: &Session, a: &Answer) -> Response {
    match a.status {
        StatusCode::UNAUTHORIZED => Redirect::to("/console/login").into_response(),
        StatusCode::NOT_FOUND => not_found(s, &a.problem()),
        status => (
            status,
            respond(
                "Error",
                s,
                None,
                html! { h1 { "The request failed" } p class="error" { (a.problem()) } },
            ),
        )
            .into_response(),
    }
}

/// A button's action: the form's CSRF token checked, then `POST {}` to the
/// API's `uri`; the API's answer, or the page to show instead (refused,
/// failed).
async fn act(
    state: &ApiState,
    s: &Session,
    form: &Form,
    uri: &str,
) -> Result<Answer, Box<Response>> {
    if let Some(r) = form.refused(s) {
        return Err(Box::new(r));
    }
    let a = s.call(state, Method::POST, uri, Some(json!({}))).await;
    if a.ok() {
        Ok(a)
    } else {
        Err(Box::new(failed(s, &a)))
    }
}

/// A path segment or query value, percent-encoded.
pub(crate) fn enc(s: &str) -> String {
    serde_urlencoded::to_string([("v", s)])
        .map(|q| q[2..].to_owned())
        .unwrap_or_default()
}

fn state_of(e: &Value) -> Markup {
    let enabled = e["enabled"].as_bool().unwrap_or(false);
    html! {
        @if enabled { span class="ok" { "enabled" } }
        @else {
            span class="bad" { "disabled" }
            @if let Some(r) = e["disabled_reason"].as_str() { " (" (r) ")" }
        }
    }
}

/// The stats (`…/stats`) of each endpoint of a listing, in its order
/// (Null where they could not be read: the page shows the rest).
async fn stats_of(state: &ApiState, s: &Session, list: &Value) -> Vec<Value> {
    use futures::StreamExt;
    let ids: Vec<String> = rows(list).iter().map(|e| text(&e["id"])).collect();
    futures::stream::iter(ids)
        .map(|id| async move {
            let a = s
                .call(
                    state,
                    Method::GET,
                    &format!("/v1/webhook-endpoints/{}/stats", enc(&id)),
                    None,
                )
                .await;
            if a.ok() { a.body } else { Value::Null }
        })
        .buffered(8)
        .collect()
        .await
}

/// The hours of `…/stats` as bars (succeeded in green over the failed
/// rest).
fn hours_chart(stats: &Value, width: f64, height: f64) -> Markup {
    let hours = stats["hours"].as_array().map_or(&[][..], Vec::as_slice);
    let slots: Vec<Option<Bar>> = hours
        .iter()
        .map(|h| {
            let (all, ok) = (
                h["attempts"].as_i64().unwrap_or(0),
                h["succeeded"].as_i64().unwrap_or(0),
            );
            (all > 0).then(|| Bar {
                total: all as f64,
                good: ok as f64,
                title: format!("{}: {all} attempts, {ok} succeeded", text(&h["hour"])),
            })
        })
        .collect();
    let label = format!("Attempts per hour over the last {} hours", hours.len());
    bars(
        &slots,
        width,
        height,
        &Axis {
            label: &label,
            left: &format!("{} h ago", hours.len()),
            right: "now",
        },
    )
}

/// Success rate and attempts of `…/stats`.
fn rate_of(stats: &Value) -> Markup {
    html! {
        @match stats["success_rate"].as_f64() {
            Some(r) => {
                span class=(if r >= 0.99 { "ok" } else { "bad" }) { (format!("{:.1} %", r * 100.0)) }
                " of " (text(&stats["attempts"]))
            }
            None => span class="muted" { "no attempts" },
        }
    }
}

/// The circuit of `…/stats`.
fn circuit_of(stats: &Value) -> Markup {
    let c = &stats["circuit"];
    html! {
        @match c["state"].as_str() {
            Some("closed") => span class="ok" { "closed" },
            Some(other) => {
                span class="bad" { (other) }
                @if let Some(until) = c["open_until"].as_str() { " until " (until) }
                " (" (text(&c["consecutive_failures"])) " failures in a row)"
            }
            None => span class="muted" { "unknown" },
        }
    }
}

fn endpoints_page(
    s: &Session,
    list: &Value,
    stats: &[Value],
    notice: Option<Markup>,
    form: Option<&Form>,
    status: StatusCode,
) -> Response {
    let value = |name: &str| {
        form.and_then(|f| f.get(name))
            .unwrap_or_default()
            .to_owned()
    };
    let body = html! {
        h1 { "Endpoints" }
        @if rows(list).is_empty() {
            p { "No endpoint yet: add the first below." }
        } @else {
            table {
                thead { tr {
                    th { "URL" } th { "Description" } th { "Event types" } th { "State" } th { "Circuit" }
                    th { "Ownership" } th { "Success, 24 h" } th { "Attempts per hour, 24 h" }
                } }
                tbody {
                    @for (e, st) in rows(list).iter().zip(stats.iter().chain(std::iter::repeat(&Value::Null))) {
                        tr {
                            td { a href={ "/console/endpoints/" (text(&e["id"])) } { (text(&e["url"])) } }
                            td { (text(&e["description"])) }
                            td { (e["event_types"].as_array().map(|t| t.iter().map(text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                            td class="nowrap" { (state_of(e)) }
                            td class="nowrap" { (circuit_of(st)) }
                            td class="nowrap" { (text(&e["verification"]["state"])) }
                            td class="nowrap" { (rate_of(st)) }
                            td { (hours_chart(st, 120.0, 24.0)) }
                        }
                    }
                }
            }
        }
        h2 { "Add an endpoint" }
        form method="post" action="/console/endpoints" {
            (s.csrf_field())
            label for="url" { "URL (https)" }
            input id="url" name="url" type="text" required value=(value("url"));
            label for="event_types" { "Event types (comma-separated; * for every type)" }
            input id="event_types" name="event_types" type="text" required value=(value("event_types"));
            label for="description" { "Description" }
            input id="description" name="description" type="text" value=(value("description"));
            button type="submit" { "Add endpoint" }
        }
    };
    (status, respond("Endpoints", s, notice, body)).into_response()
}

/// The tenant's endpoints and a form to add one.
pub(crate) async fn endpoints(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
) -> Response {
    let list = s
        .call(&state, Method::GET, "/v1/webhook-endpoints?limit=250", None)
        .await;
    if !list.ok() {
        return failed(&s, &list);
    }
    let stats = stats_of(&state, &s, &list.body).await;
    endpoints_page(&s, &list.body, &stats, None, None, StatusCode::OK)
}

/// Adds an endpoint; its secret is shown once.
pub(crate) async fn create_endpoint(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    form: Form,
) -> Response {
    if let Some(r) = form.refused(&s) {
        return r;
    }
    let types: Vec<String> = form
        .get("event_types")
        .unwrap_or_default()
        .split([',', ' '])
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let created = s
        .call(
            &state,
            Method::POST,
            "/v1/webhook-endpoints",
            Some(json!({
                "url": form.get("url").unwrap_or_default(),
                "event_types": types,
                "description": form.get("description").unwrap_or_default(),
            })),
        )
        .await;
    let list = s
        .call(&state, Method::GET, "/v1/webhook-endpoints?limit=250", None)
        .await;
    let stats = stats_of(&state, &s, &list.body).await;
    if created.ok() {
        let notice = html! {
            p { "Endpoint " a href={ "/console/endpoints/" (text(&created.body["endpoint"]["id"])) } { (text(&created.body["endpoint"]["url"])) } " added. Its signing secret, shown this once:" }
            p { code class="secret" { (text(&created.body["secret"])) } }
        };
        endpoints_page(
            &s,
            &list.body,
            &stats,
            Some(notice),
            None,
            StatusCode::CREATED,
        )
    } else if created.status == StatusCode::UNAUTHORIZED {
        failed(&s, &created)
    } else {
        let notice = html! { p class="error" role="alert" { "Not added: " (created.problem()) } };
        endpoints_page(
            &s,
            &list.body,
            &stats,
            Some(notice),
            Some(&form),
            created.status,
        )
    }
}

async fn endpoint_page(
    state: &ApiState,
    s: &Session,
    id: &str,
    notice: Option<Markup>,
) -> Response {
    let e = s
        .call(
            state,
            Method::GET,
            &format!("/v1/webhook-endpoints/{}", enc(id)),
            None,
        )
        .await;
    if !e.ok() {
        return failed(s, &e);
    }
    let versions = s
        .call(
            state,
            Method::GET,
            &format!("/v1/webhook-endpoints/{}/versions", enc(id)),
            None,
        )
        .await;
    let stats = s
        .call(
            state,
            Method::GET,
            &format!("/v1/webhook-endpoints/{}/stats", enc(id)),
            None,
        )
        .await;
    let e = &e.body;
    let stats = &stats.body;
    let body = html! {
        h1 { "Endpoint" }
        dl {
            dt { "URL" } dd { (text(&e["url"])) }
            dt { "Id" } dd { code { (text(&e["id"])) } }
            dt { "Description" } dd { (text(&e["description"])) }
            dt { "Event types" } dd { (e["event_types"].as_array().map(|t| t.iter().map(text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
            dt { "State" } dd { (state_of(e)) }
            dt { "Ownership check" } dd { (text(&e["verification"]["state"])) @if let Some(err) = e["verification"]["last_error"].as_str() { " — " (err) } }
            dt { "Ordering" } dd { (text(&e["ordering"])) }
            dt { "Config version" } dd { (text(&e["config_version"])) }
            dt { "Secret version" } dd { (text(&e["secret_version"])) }
            dt { "Circuit" } dd id="circuit" { (circuit_of(stats)) }
            dt { "Success, 24 h" } dd id="success-rate" { (rate_of(stats)) }
        }
        h2 { "Attempts per hour" }
        (hours_chart(stats, 480.0, 80.0))
        p { a href={ "/console/deliveries?endpoint_id=" (enc(&text(&e["id"]))) } { "Deliveries to this endpoint" } }
        div class="actions" {
            form method="post" action={ "/console/endpoints/" (enc(id)) "/rotate" } {
                (s.csrf_field())
                button type="submit" { "Rotate the signing secret" }
            }
            form method="post" action={ "/console/endpoints/" (enc(id)) "/recover" } {
                (s.csrf_field())
                button type="submit" { "Recover failed deliveries" }
            }
        }
        h2 { "Versions" }
        table {
            thead { tr { th { "Version" } th { "Changed" } th { "By" } th { "URL" } th { "Event types" } th { "Enabled" } } }
            tbody {
                @for v in rows(&versions.body) {
                    tr {
                        td { (text(&v["version"])) }
                        td { (text(&v["changed_at"])) }
                        td { (text(&v["changed_by"])) }
                        td { (text(&v["url"])) }
                        td { (v["event_types"].as_array().map(|t| t.iter().map(text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                        td { (text(&v["enabled"])) }
                    }
                }
            }
        }
    };
    respond("Endpoint", s, notice, body)
}

/// One endpoint: its settings, versions and actions.
pub(crate) async fn endpoint(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
) -> Response {
    endpoint_page(&state, &s, &id, None).await
}

/// Rotates the endpoint's secret; the new one is shown once.
pub(crate) async fn rotate(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    form: Form,
) -> Response {
    let a = match act(
        &state,
        &s,
        &form,
        &format!("/v1/webhook-endpoints/{}/rotate-secret", enc(&id)),
    )
    .await
    {
        Ok(a) => a,
        Err(page) => return *page,
    };
    let notice = html! {
        p { "The secret was rotated (version " (text(&a.body["secret_version"])) "); the previous one keeps signing alongside during the overlap. The new secret, shown this once:" }
        p { code class="secret" { (text(&a.body["secret"])) } }
    };
    endpoint_page(&state, &s, &id, Some(notice)).await
}

/// Recovers the endpoint's failed deliveries.
pub(crate) async fn recover(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    form: Form,
) -> Response {
    let a = match act(
        &state,
        &s,
        &form,
        &format!("/v1/webhook-endpoints/{}/recover", enc(&id)),
    )
    .await
    {
        Ok(a) => a,
        Err(page) => return *page,
    };
    let notice = html! { p { "Recovery queued: " (pretty(&a.body)) } };
    endpoint_page(&state, &s, &id, Some(notice)).await
}

/// The filters the deliveries page passes on to the API.
const FILTERS: &[&str] = &[
    "status",
    "event_type",
    "endpoint_id",
    "since",
    "until",
    "cursor",
];

/// The tenant's deliveries, newest first, filtered and paged.
pub(crate) async fn deliveries(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    RawQuery(query): RawQuery,
) -> Response {
    let given: Vec<(String, String)> =
        serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).unwrap_or_default();
    let get = |name: &str| {
        given
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let mut pass: Vec<(&str, String)> = FILTERS
        .iter()
        .map(|f| (*f, get(f)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    pass.push(("limit", "50".into()));
    let uri = format!(
        "/v1/webhook-deliveries?{}",
        serde_urlencoded::to_string(&pass).unwrap_or_default()
    );
    let page = s.call(&state, Method::GET, &uri, None).await;
    if page.status == StatusCode::UNAUTHORIZED {
        return failed(&s, &page);
    }
    let next = page.body["next_cursor"].as_str().map(|c| {
        let mut q: Vec<(&str, String)> = FILTERS
            .iter()
            .filter(|f| **f != "cursor")
            .map(|f| (*f, get(f)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        q.push(("cursor", c.to_owned()));
        format!(
            "/console/deliveries?{}",
            serde_urlencoded::to_string(&q).unwrap_or_default()
        )
    });
    let status = get("status");
    let body = html! {
        h1 { "Deliveries" }
        form method="get" action="/console/deliveries" class="filters" {
            label for="status" { "Status" }
            select id="status" name="status" {
                @for option in ["", "pending", "succeeded", "failed", "exhausted", "cancelled"] {
                    option value=(option) selected[status == option] { @if option.is_empty() { "any" } @else { (option) } }
                }
            }
            label for="event_type" { "Event type" }
            input id="event_type" name="event_type" type="text" value=(get("event_type"));
            label for="endpoint_id" { "Endpoint id" }
            input id="endpoint_id" name="endpoint_id" type="text" value=(get("endpoint_id"));
            label for="since" { "Since (RFC 3339)" }
            input id="since" name="since" type="text" value=(get("since"));
            button type="submit" { "Filter" }
        }
        @if !page.ok() {
            p class="error" role="alert" { (page.problem()) }
        } @else if rows(&page.body).is_empty() {
            p { "No delivery matches." }
        } @else {
            table {
                thead { tr { th { "Delivery" } th { "Event type" } th { "Status" } th { "Attempts" } th { "Last HTTP status" } th { "Created" } } }
                tbody {
                    @for d in rows(&page.body) {
                        tr {
                            td { a href={ "/console/deliveries/" (enc(&text(&d["id"]))) } { code { (text(&d["id"])) } } }
                            td { (text(&d["event_type"])) }
                            td class={ "status-" (text(&d["status"])) } { (text(&d["status"])) }
                            td { (text(&d["attempt_count"])) @if d["manual_attempt_count"].as_i64().unwrap_or(0) > 0 { " + " (text(&d["manual_attempt_count"])) " manual" } }
                            td { (text(&d["last_http_status"])) @if let Some(c) = d["last_error_class"].as_str() { " " (c) } }
                            td { (text(&d["created_at"])) }
                        }
                    }
                }
            }
            @if let Some(next) = next { p { a href=(next) rel="next" { "Older deliveries" } } }
        }
    };
    respond("Deliveries", &s, None, body)
}

/// One delivery: the event, the headers it goes with, every attempt, and
/// a replay.
pub(crate) async fn delivery(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let d = s
        .call(
            &state,
            Method::GET,
            &format!("/v1/webhook-deliveries/{}", enc(&id)),
            None,
        )
        .await;
    if !d.ok() {
        return failed(&s, &d);
    }
    let (delivery, event) = (&d.body["delivery"], &d.body["event"]);
    let attempts = d.body["attempts"].as_array().map_or(&[][..], Vec::as_slice);
    let notice = query
        .as_deref()
        .is_some_and(|q| q.contains("replayed=1"))
        .then(|| html! { p { "Replay queued: a manual attempt follows shortly (reload to see it)." } });
    let body = html! {
        h1 { "Delivery " code { (text(&delivery["id"])) } }
        dl {
            dt { "Status" } dd class={ "status-" (text(&delivery["status"])) } { (text(&delivery["status"])) }
            dt { "Event type" } dd { (text(&delivery["event_type"])) }
            dt { "Endpoint" } dd { a href={ "/console/endpoints/" (enc(&text(&delivery["endpoint_id"]))) } { code { (text(&delivery["endpoint_id"])) } } }
            dt { "Next attempt" } dd { (text(&delivery["next_attempt_at"])) }
            dt { "Expires" } dd { (text(&delivery["expires_at"])) }
        }
        form method="post" action={ "/console/deliveries/" (enc(&id)) "/replay" } {
            (s.csrf_field())
            button type="submit" { "Replay" }
        }
        h2 { "Headers" }
        pre { "webhook-id: " (text(&delivery["id"])) "\nwalhook-event-id: " (text(&event["id"])) "\nwalhook-event-type: " (text(&event["type"])) "\nwalhook-schema-version: " (text(&event["schema_version"])) }
        h2 { "Event" }
        pre class="payload" { (pretty(event)) }
        h2 { "Attempts" }
        @if attempts.is_empty() { p { "No attempt yet." } } @else {
            ol class="timeline" {
                @for a in attempts {
                    li {
                        strong { "#" (text(&a["number"])) " " (text(&a["trigger"])) }
                        " · " (text(&a["started_at"])) " · "
                        span class={ "outcome-" (text(&a["outcome"])) } { (text(&a["outcome"])) }
                        @if !a["http_status"].is_null() { " · HTTP " (text(&a["http_status"])) }
                        @if let Some(c) = a["error_class"].as_str() { " · " (c) }
                        " · " (text(&a["latency_ms"])) " ms"
                        @if let Some(n) = a["note"].as_str() { " · " em { (n) } }
                        @if let Some(x) = a["response_excerpt"].as_str() { pre class="excerpt" { (x) } }
                    }
                }
            }
        }
    };
    respond("Delivery", &s, notice, body)
}

/// Replays a delivery (a manual attempt with the same id and bytes).
pub(crate) async fn replay(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    form: Form,
) -> Response {
    let uri = format!("/v1/webhook-deliveries/{}/replay", enc(&id));
    if let Err(page) = act(&state, &s, &form, &uri).await {
        return *page;
    }
    Redirect::to(&format!("/console/deliveries/{}?replayed=1", enc(&id))).into_response()
}

/// The event-type catalog with each type's schema versions.
pub(crate) async fn event_types(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
) -> Response {
    let list = s.call(&state, Method::GET, "/v1/event-types", None).await;
    if !list.ok() {
        return failed(&s, &list);
    }
    let mut details = Vec::new();
    for t in rows(&list.body) {
        let name = text(&t["name"]);
        let d = s
            .call(
                &state,
                Method::GET,
                &format!("/v1/event-types/{}", enc(&name)),
                None,
            )
            .await;
        details.push((t.clone(), d.body));
    }
    let body = html! {
        h1 { "Event types" }
        @for (t, d) in &details {
            section {
                h2 { (text(&t["name"])) }
                p { (text(&t["description"])) " · source " (text(&t["source"])) " · schema version " (text(&t["schema_version"])) }
                @for v in d["versions"].as_array().map_or(&[][..], Vec::as_slice) {
                    details {
                        summary { "Version " (text(&v["version"])) " (" (text(&v["created_at"])) ")" }
                        pre { (pretty(&v["schema"])) }
                    }
                }
            }
        }
    };
    respond("Event types", &s, None, body)
}

/// The tenant's audit log, newest first.
pub(crate) async fn audit_log(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
) -> Response {
    let page = s
        .call(&state, Method::GET, "/v1/audit-log?limit=100", None)
        .await;
    if !page.ok() {
        return failed(&s, &page);
    }
    let body = html! {
        h1 { "Audit log" }
        table {
            thead { tr { th { "At" } th { "Actor" } th { "Action" } th { "Target" } th { "Detail" } } }
            tbody {
                @for e in rows(&page.body) {
                    tr {
                        td { (text(&e["at"])) }
                        td { (text(&e["actor"])) }
                        td { (text(&e["action"])) }
                        td { (text(&e["target"])) }
                        td { code { (text(&e["detail"])) } }
                    }
                }
            }
        }
    };
    respond("Audit log", &s, None, body)
}
