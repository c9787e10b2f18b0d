//! The tenant's deliveries: the list (filtered by status, type, endpoint
//! and time, paged both ways), and one delivery with what each attempt
//! sent, byte for byte, and a `curl` command that sends it again.

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde_json::Value;

use super::pager::Pager;
use super::pages::{act, enc, failed, rows, text};
use super::{Form, TenantSession, respond};
use crate::ApiState;

/// The filters the deliveries page passes on to the API.
const FILTERS: &[&str] = &["status", "event_type", "endpoint_id", "since", "until"];

/// The tenant's deliveries, newest first, filtered and paged.
pub(crate) async fn deliveries(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    RawQuery(query): RawQuery,
) -> Response {
    let pager = Pager::new("/console/deliveries", query.as_deref(), FILTERS, 50, 250);
    let mut pass: Vec<(String, String)> = FILTERS
        .iter()
        .map(|f| ((*f).to_owned(), pager.filter(f)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    pass.push(("limit".into(), pager.limit.to_string()));
    if let Some(c) = &pager.cursor {
        pass.push(("cursor".into(), c.clone()));
    }
    let uri = format!(
        "/v1/webhook-deliveries?{}",
        serde_urlencoded::to_string(&pass).unwrap_or_default()
    );
    let page = s.call(&state, Method::GET, &uri, None).await;
    if page.status == StatusCode::UNAUTHORIZED {
        return failed(&s, &page);
    }
    let status = pager.filter("status");
    let field = |id: &str, label: &str| {
        html! {
            label for=(id) { (label) }
            input id=(id) name=(id) type="text" value=(pager.filter(id));
        }
    };
    let body = html! {
        h1 { "Deliveries" }
        form method="get" action="/console/deliveries" class="filters" {
            label for="status" { "Status" }
            select id="status" name="status" {
                @for option in ["", "pending", "succeeded", "failed", "exhausted", "cancelled"] {
                    option value=(option) selected[status == option] { @if option.is_empty() { "any" } @else { (option) } }
                }
            }
            (field("event_type", "Event type"))
            (field("endpoint_id", "Endpoint id"))
            (field("since", "Since (RFC 3339)"))
            (field("until", "Until (RFC 3339)"))
            @if pager.limit != 50 { input type="hidden" name="limit" value=(pager.limit); }
            button type="submit" { "Filter" }
        }
        @if !page.ok() {
            p class="error" role="alert" { (page.problem()) }
        } @else if rows(&page.body).is_empty() {
            p { "No delivery matches." }
            (pager.links(page.body["next_cursor"].as_str()))
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
            (pager.links(page.body["next_cursor"].as_str()))
        }
    };
    respond("Deliveries", &s, None, body)
}

/// `text` as one shell word (single-quoted; a quote inside closes,
/// escapes and reopens).
fn sh(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// A `curl` command that sends `request` (an element of `…/requests`)
/// again: the same method, URL, headers and body bytes. curl writes
/// `host` and `content-length` itself (the same values); `expect` is
/// turned off so that a large body goes at once, as walhook sends it.
pub(crate) fn curl(request: &Value) -> String {
    let mut out = format!(
        "curl --http1.1 --silent --show-error -X {} {}",
        text(&request["method"]),
        sh(&text(&request["url"]))
    );
    for h in request["headers"].as_array().map_or(&[][..], Vec::as_slice) {
        let name = text(&h["name"]);
        if name == "host" || name == "content-length" {
            continue;
        }
        out.push_str(" \\\n  -H ");
        out.push_str(&sh(&format!("{name}: {}", text(&h["value"]))));
    }
    out.push_str(" \\\n  -H 'expect:' \\\n  --data-raw ");
    out.push_str(&sh(request["body"].as_str().unwrap_or_default()));
    out
}

/// What one attempt sent: the request line, every header, the body and
/// the command that sends it again.
fn sent(request: &Value, open: bool) -> Markup {
    let versions = request["secret_versions"]
        .as_array()
        .map(|v| v.iter().map(text).collect::<Vec<_>>().join(", "));
    html! {
        details class="sent" open[open] {
            summary { "What was sent" }
            p { code { (text(&request["method"])) " " (text(&request["url"])) } }
            table class="headers" {
                thead { tr { th { "Header" } th { "Value" } } }
                tbody {
                    @for h in request["headers"].as_array().map_or(&[][..], Vec::as_slice) {
                        tr { td class="nowrap" { code { (text(&h["name"])) } } td { code { (text(&h["value"])) } } }
                    }
                }
            }
            p class="muted" {
                @match versions {
                    Some(v) => { "Signed with secret version " (v) " (newest first). " }
                    None => {}
                }
                @if let Some(why) = request["signature_unavailable"].as_str() {
                    span class="bad" { "No signature shown: " (why) ". " }
                }
                "Body SHA-256 " code { (text(&request["body_sha256"])) } "."
            }
            h4 { "Body, byte for byte" }
            pre class="body" { (text(&request["body"])) }
            h4 { "Copy as curl" }
            pre class="curl" { (curl(request)) }
        }
    }
}

/// One delivery: its state, every attempt with what it sent, and a
/// replay.
pub(crate) async fn delivery(
    State(state): State<ApiState>,
    TenantSession(s): TenantSession,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let uri = format!("/v1/webhook-deliveries/{}", enc(&id));
    let d = s.call(&state, Method::GET, &uri, None).await;
    if !d.ok() {
        return failed(&s, &d);
    }
    let requests = s
        .call(&state, Method::GET, &format!("{uri}/requests"), None)
        .await;
    let (delivery, event) = (&d.body["delivery"], &d.body["event"]);
    let attempts = d.body["attempts"].as_array().map_or(&[][..], Vec::as_slice);
    let sent_by = |attempt: &Value| {
        rows(&requests.body)
            .iter()
            .find(|r| r["attempt_id"] == attempt["id"])
            .cloned()
    };
    let notice = query
        .as_deref()
        .is_some_and(|q| q.contains("replayed=1"))
        .then(|| html! { p { "Replay queued: a manual attempt follows shortly (reload to see it)." } });
    let body = html! {
        h1 { "Delivery " code { (text(&delivery["id"])) } }
        dl {
            dt { "Status" } dd class={ "status-" (text(&delivery["status"])) } { (text(&delivery["status"])) }
            dt { "Event" } dd { code { (text(&event["id"])) } " · " (text(&delivery["event_type"])) " · schema version " (text(&event["schema_version"])) }
            dt { "Occurred" } dd { (text(&event["occurred_at"])) }
            dt { "Endpoint" } dd { a href={ "/console/endpoints/" (enc(&text(&delivery["endpoint_id"]))) } { code { (text(&delivery["endpoint_id"])) } } }
            dt { "Next attempt" } dd { (text(&delivery["next_attempt_at"])) }
            dt { "Expires" } dd { (text(&delivery["expires_at"])) }
        }
        form method="post" action={ "/console/deliveries/" (enc(&id)) "/replay" } {
            (s.csrf_field())
            button type="submit" { "Replay" }
        }
        h2 { "Attempts" }
        @if !requests.ok() {
            p class="error" role="alert" { "What the attempts sent could not be read: " (requests.problem()) }
        }
        @if attempts.is_empty() {
            p { "No attempt yet. The event's body (each attempt's shows here, byte for byte, once made):" }
            pre class="payload" { (text(&event["payload"])) }
        } @else {
            ol class="timeline" {
                @for (i, a) in attempts.iter().enumerate() {
                    li {
                        strong { "#" (text(&a["number"])) " " (text(&a["trigger"])) }
                        " · " (text(&a["started_at"])) " · "
                        span class={ "outcome-" (text(&a["outcome"])) } { (text(&a["outcome"])) }
                        @if !a["http_status"].is_null() { " · HTTP " (text(&a["http_status"])) }
                        @if let Some(c) = a["error_class"].as_str() { " · " (c) }
                        " · " (text(&a["latency_ms"])) " ms"
                        @if let Some(n) = a["note"].as_str() { " · " em { (n) } }
                        @if let Some(x) = a["response_excerpt"].as_str() { pre class="excerpt" { (x) } }
                        @if let Some(r) = sent_by(a) { (sent(&r, i + 1 == attempts.len())) }
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
    if let Err(page) = act(&state, &s, &form, &uri, serde_json::json!({})).await {
        return *page;
    }
    Redirect::to(&format!("/console/deliveries/{}?replayed=1", enc(&id))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_quotes_every_word_and_sends_the_body_raw() {
        let request = serde_json::json!({
            "method": "POST",
            "url": "http://127.0.0.1:9/in?a=1&b=2",
            "headers": [
                {"name": "content-type", "value": "application/json"},
                {"name": "webhook-signature", "value": "v1,abc+/= v1,def"},
                {"name": "host", "value": "127.0.0.1:9"},
                {"name": "content-length", "value": "27"},
            ],
            "body": "{\"note\":\"it's @home\\n\"}",
        });
        assert_eq!(
            curl(&request),
            "curl --http1.1 --silent --show-error -X POST 'http://127.0.0.1:9/in?a=1&b=2' \\\n  \
             -H 'content-type: application/json' \\\n  -H 'webhook-signature: v1,abc+/= v1,def' \\\n  \
             -H 'expect:' \\\n  --data-raw '{\"note\":\"it'\\''s @home\\n\"}'"
        );
    }
}
