//! The tenant's pages: endpoints, deliveries, event types, the audit log.
//! Each reads and acts through the API (see the module above).

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde_json::{Value, json};

use super::charts::{Axis, Bar, bars};
use super::pager::Pager;
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

pub(crate) fn rows(v: &Value) -> &[Value] {
    v["data"].as_array().map_or(&[], Vec::as_slice)
}

/// An API answer that is not a success, as the console shows it: back to
/// sign-in when the credential no longer works, the problem otherwise.
pub(crate) fn failed(s: &Session, a: &Answer) -> Response {
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

/// A button's action: the form's CSRF token checked, then `POST body` to
/// the API's `uri`; the API's answer, or the page to show instead
/// (refused, failed).
pub(crate) async fn act(
    state: &ApiState,
    s: &Session,
    form: &Form,
    uri: &str,
    body: Value,
) -> Result<Answer, Box<Response>> {
    if let Some(r) = form.refused(s) {
        return Err(Box::new(r));
    }
    let a = s.call(state, Method::POST, uri, Some(body)).await;
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
    pager: &Pager,
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
            (pager.links(list["next_cursor"].as_str()))
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
    RawQuery(query): RawQuery,
) -> Response {
    let pager = endpoint_pager(query.as_deref());
    let list = list_endpoints(&state, &s, &pager).await;
    if !list.ok() {
        return failed(&s, &list);
    }
    let stats = stats_of(&state, &s, &list.body).await;
    endpoints_page(&s, &list.body, &stats, &pager, None, None, StatusCode::OK)
}

fn endpoint_pager(query: Option<&str>) -> Pager {
    Pager::new("/console/endpoints", query, &[], 50, 250)
}

/// A page of the tenant's endpoints.
async fn list_endpoints(state: &ApiState, s: &Session, pager: &Pager) -> Answer {
    let mut q = vec![("limit", pager.limit.to_string())];
    if let Some(c) = &pager.cursor {
        q.push(("cursor", c.clone()));
    }
    let uri = format!(
        "/v1/webhook-endpoints?{}",
        serde_urlencoded::to_string(&q).unwrap_or_default()
    );
    s.call(state, Method::GET, &uri, None).await
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
    let pager = endpoint_pager(None);
    let list = list_endpoints(&state, &s, &pager).await;
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
            &pager,
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
            &pager,
            Some(notice),
            Some(&form),
            created.status,
        )
    }
}

/// The recovery form's values, kept when the page answers it.
pub(crate) struct RecoverValues {
    since: String,
    until: String,
}

async fn endpoint_page(
    state: &ApiState,
    s: &Session,
    id: &str,
    notice: Option<Markup>,
    recover: Option<&RecoverValues>,
    query: Option<&str>,
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
    // Newest first, paged here (the API returns them all).
    let mut all = rows(&versions.body).to_vec();
    all.reverse();
    let pager = Pager::new(
        &format!("/console/endpoints/{}", enc(id)),
        query,
        &[],
        20,
        100,
    );
    let (versions, version_pages) = pager.slice(&all);
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
        }
        h2 { "Recover failed deliveries" }
        p { "Every failed or exhausted delivery to this endpoint made in the window gets one manual attempt (same id, same bytes, the current secrets)." }
        form method="post" action={ "/console/endpoints/" (enc(id)) "/recover" } class="recover" {
            (s.csrf_field())
            label for="since" { "Made since (RFC 3339; at most the replay window ago)" }
            input id="since" name="since" type="text" required value=(recover.map_or_else(day_ago, |r| r.since.clone()));
            label for="until" { "And before (RFC 3339; empty for now)" }
            input id="until" name="until" type="text" value=(recover.map(|r| r.until.clone()).unwrap_or_default());
            button type="submit" { "Recover failed deliveries" }
        }
        h2 { "Versions" } p class="muted" { "Newest first." }
        table {
            thead { tr { th { "Version" } th { "Changed" } th { "By" } th { "URL" } th { "Event types" } th { "Enabled" } } }
            tbody {
                @for v in versions {
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
        (version_pages)
    };
    respond("Endpoint", s, notice, body)
}

/// One endpoint: its settings, versions and actions.
pub(crate) async fn endpoint(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    endpoint_page(&state, &s, &id, None, None, query.as_deref()).await
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
        json!({}),
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
    endpoint_page(&state, &s, &id, Some(notice), None, None).await
}

/// The default start of a recovery: 24 hours ago, to the second.
fn day_ago() -> String {
    (chrono::Utc::now() - chrono::Duration::hours(24))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Recovers the endpoint's failed deliveries made since the time given
/// (24 hours ago unless another is asked for), and says how many were
/// re-enqueued, with a link to them.
pub(crate) async fn recover(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    form: Form,
) -> Response {
    if let Some(r) = form.refused(&s) {
        return r;
    }
    let since = form
        .get("since")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map_or_else(day_ago, str::to_owned);
    let until = form.get("until").map(str::trim).filter(|v| !v.is_empty());
    let mut body = json!({ "since": since });
    if let Some(u) = until {
        body["until"] = json!(u);
    }
    let uri = format!("/v1/webhook-endpoints/{}/recover", enc(&id));
    let a = s.call(&state, Method::POST, &uri, Some(body)).await;
    if a.status == StatusCode::UNAUTHORIZED || a.status == StatusCode::NOT_FOUND {
        return failed(&s, &a);
    }
    let values = RecoverValues {
        since: since.clone(),
        until: until.unwrap_or_default().to_owned(),
    };
    if !a.ok() {
        let notice =
            html! { p class="error" role="alert" { "Nothing was recovered: " (a.problem()) } };
        let mut page = endpoint_page(&state, &s, &id, Some(notice), Some(&values), None).await;
        *page.status_mut() = a.status;
        return page;
    }
    let count = a.body["replay_request_count"].as_i64().unwrap_or(0);
    let mut filter = vec![("endpoint_id", id.clone()), ("since", since.clone())];
    if let Some(u) = until {
        filter.push(("until", u.to_owned()));
    }
    let list = format!(
        "/console/deliveries?{}",
        serde_urlencoded::to_string(&filter).unwrap_or_default()
    );
    let notice = html! {
        p id="recovered" {
            @match count {
                0 => { "No failed or exhausted delivery made since " (since) @if let Some(u) = until { " and before " (u) } " needed a new attempt: nothing was re-enqueued." }
                1 => { "1 failed or exhausted delivery made since " (since) @if let Some(u) = until { " and before " (u) } " was re-enqueued: it gets one manual attempt shortly." }
                n => { (n) " failed or exhausted deliveries made since " (since) @if let Some(u) = until { " and before " (u) } " were re-enqueued: each gets one manual attempt shortly." }
            }
            " Deliveries that already had a replay waiting are not counted again. "
            a href=(list) { "The deliveries of that window" }
        }
    };
    endpoint_page(&state, &s, &id, Some(notice), Some(&values), None).await
}

/// The event-type catalog with each type's schema versions, 20 types a
/// page.
pub(crate) async fn event_types(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    RawQuery(query): RawQuery,
) -> Response {
    let list = s.call(&state, Method::GET, "/v1/event-types", None).await;
    if !list.ok() {
        return failed(&s, &list);
    }
    let pager = Pager::new("/console/event-types", query.as_deref(), &[], 20, 100);
    let (types, links) = pager.slice(rows(&list.body));
    let mut details = Vec::new();
    for t in types {
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
        @if details.is_empty() { p { "No event type in the catalog yet." } }
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
        (links)
    };
    respond("Event types", &s, None, body)
}

/// The tenant's audit log, newest first, 50 records a page.
pub(crate) async fn audit_log(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    RawQuery(query): RawQuery,
) -> Response {
    let pager = Pager::new("/console/audit-log", query.as_deref(), &[], 50, 250);
    let mut q = vec![("limit", pager.limit.to_string())];
    if let Some(c) = &pager.cursor {
        q.push(("cursor", c.clone()));
    }
    let uri = format!(
        "/v1/audit-log?{}",
        serde_urlencoded::to_string(&q).unwrap_or_default()
    );
    let page = s.call(&state, Method::GET, &uri, None).await;
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
        (pager.links(page.body["next_cursor"].as_str()))
    };
    respond("Audit log", &s, None, body)
}
