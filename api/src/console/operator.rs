//! The operator's pages: the pipeline at a glance (refreshed every 5 s
//! without script), and the tenants.

use axum::extract::{Path, RawQuery, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use maud::{Markup, html};
use serde_json::json;
use walhook_sql::tallies::MinuteTally;

use super::charts::{Axis, Bar, bars};
use super::pager::Pager;
use super::pages::{enc, text};
use super::{Form, OperatorSession, Session, respond};
use crate::ApiState;

fn secs(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} ms", v * 1000.0)
    } else if v < 120.0 {
        format!("{v:.1} s")
    } else if v < 7200.0 {
        format!("{:.0} min", v / 60.0)
    } else if v < 172_800.0 {
        format!("{:.1} h", v / 3600.0)
    } else {
        format!("{:.1} days", v / 86_400.0)
    }
}

/// The last hour's minutes as one slot each (oldest first), the current
/// minute last (empty after a quiet spell: the chart's "now" is now).
fn last_hour<T>(
    minutes: &[MinuteTally],
    bar: impl Fn(&MinuteTally) -> Option<T>,
) -> Vec<Option<T>> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let now = (secs - secs % 60) as f64;
    let mut slots: Vec<Option<T>> = (0..60).map(|_| None).collect();
    for m in minutes {
        let slot = 59.0 - ((now - m.minute) / 60.0).round();
        if (0.0..60.0).contains(&slot) {
            slots[slot as usize] = bar(m);
        }
    }
    slots
}

/// Attempts per minute (succeeded in green over the failed rest) and the
/// commit -> first attempt p99 per minute, over the last hour.
fn hour_charts(minutes: &[MinuteTally]) -> Markup {
    let attempts = last_hour(minutes, |m| {
        Some(Bar {
            total: m.attempts as f64,
            good: m.succeeded as f64,
            title: format!("{} attempts, {} succeeded", m.attempts, m.succeeded),
        })
    });
    let latency = last_hour(minutes, |m| {
        m.first_latency_ms.map(|(p50, p99)| Bar {
            total: p99,
            good: p99,
            title: format!(
                "{} first attempts: p50 ≤ {}, p99 ≤ {}",
                m.first_attempts,
                ms(p50),
                ms(p99)
            ),
        })
    });
    let peak = minutes.iter().map(|m| m.attempts).max().unwrap_or(0);
    let worst = minutes
        .iter()
        .filter_map(|m| m.first_latency_ms.map(|l| l.1))
        .fold(0.0, f64::max);
    html! {
        h2 { "Attempts per minute" }
        (bars(&attempts, 600.0, 120.0, &Axis {
            label: "Attempts per minute over the last hour",
            left: "60 min ago",
            right: &format!("now · peak {peak}/min"),
        }))
        h2 { "Commit to first attempt, p99 per minute" }
        (bars(&latency, 600.0, 80.0, &Axis {
            label: "First-attempt latency (p99) per minute over the last hour",
            left: "60 min ago",
            right: &format!("now · worst {}", ms(worst)),
        }))
    }
}

fn ms(v: f64) -> String {
    secs(v / 1000.0)
}

/// The pipeline: pending work and its age, capture checkpoints, circuits,
/// attempts over the last hour, open incidents.
pub(crate) async fn pipeline(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
) -> Response {
    let (gauges, minutes, incidents, captured) = tokio::join!(
        state.platform.pipeline_gauges(),
        state.platform.attempts_by_minute(),
        state.platform.open_incidents(),
        state.platform.recent_capture_incidents(20)
    );
    let body = match (gauges, minutes, incidents, captured) {
        (Ok(g), Ok(m), Ok(i), Ok(c)) => html! {
            h1 { "Pipeline" }
            p class="muted" { "Refreshed every 5 seconds." }
            div class="tiles" {
                div class="tile" { span class="label" { "Pending deliveries" } span class="value" id="pending" { (g.pending) } }
                div class="tile" { span class="label" { "Oldest pending" } span class="value" { (secs(g.oldest_pending_age_secs)) } }
                div class="tile" { span class="label" { "Oldest due, new" } span class="value" { (secs(g.oldest_due_new_secs)) } }
                div class="tile" { span class="label" { "Oldest due, retry" } span class="value" { (secs(g.oldest_due_retry_secs)) } }
                div class="tile" { span class="label" { "Due, unheld" } span class="value" { (g.overdue_unleased) } }
                div class="tile" { span class="label" { "Attempts, last hour" } span class="value" id="attempts-hour" { (m.minutes.iter().map(|x| x.attempts).sum::<i64>()) } }
                div class="tile" { span class="label" { "First attempt p99, last hour" } span class="value" id="first-p99" {
                    @if let Some((_, p99)) = m.first_latency_ms { "≤ " (ms(p99)) } @else { "none" } } }
            }
            (hour_charts(&m.minutes))
            h2 { "Capture" }
            table {
                thead { tr { th { "Source" } th { "Slot lag" } th { "Checkpoint age" } } }
                tbody {
                    @for (source, lag, age) in &g.capture {
                        tr { td { (source) } td { @if let Some(l) = lag { (l / 1024) " KiB" } @else { "unknown" } } td { (secs(*age)) } }
                    }
                }
            }
            h2 { "Archive" }
            @if g.archive.is_empty() { p { "Nothing archived yet." } } @else {
                table {
                    thead { tr { th { "Table" } th { "Rows archived" } th { "Parquet bytes" } th { "Failed verifications" } th { "Oldest hot day" } } }
                    tbody { @for a in &g.archive { tr { td { (a.table) } td { (a.rows) } td { (a.bytes) } td { (a.verification_failures) } td { (secs(a.oldest_hot_age_secs)) } } } }
                }
            }
            h2 { "Circuits" }
            @if g.circuits.is_empty() { p { "None recorded yet: no endpoint has had an attempt." } }
            @else { p { @for (state, n) in &g.circuits { (state) ": " (n) "  " } } }
            h2 { "Quarantined endpoints" }
            @let quarantined: Vec<_> = i.iter().filter(|x| x.kind == "endpoint_quarantined").collect();
            @if quarantined.is_empty() { p { "None: every endpoint's configuration loads." } } @else {
                table {
                    thead { tr { th { "Endpoint" } th { "Why its deliveries wait" } } }
                    tbody { @for x in &quarantined { tr { td { code { (x.subject) } } td { (x.detail) } } } }
                }
            }
            h2 { "Capture incidents (latest 20)" }
            @if c.is_empty() { p { "None: every captured change became an event." } } @else {
                table {
                    thead { tr { th { "Seen" } th { "Source" } th { "Kind" } th { "Table" } th { "Rule" } th { "Commit LSN" } th { "Detail" } } }
                    tbody {
                        @for x in &c {
                            tr {
                                td { (chrono::DateTime::from_timestamp(x.seen_at as i64, 0).map(|t| t.to_rfc3339()).unwrap_or_default()) }
                                td { (x.source) } td { (x.kind) }
                                td { (x.table.as_deref().unwrap_or("")) } td { (x.rule.as_deref().unwrap_or("")) }
                                td { (x.commit_lsn.as_deref().unwrap_or("")) } td { (x.detail) }
                            }
                        }
                    }
                }
            }
            h2 { "Open incidents" }
            @if i.is_empty() { p { "None." } } @else {
                table {
                    thead { tr { th { "Stage" } th { "Kind" } th { "Subject" } th { "Occurrences" } th { "Detail" } } }
                    tbody { @for x in &i { tr { td { (x.stage) } td { (x.kind) } td { (x.subject) } td { (x.occurrences) } td { (x.detail) } } } }
                }
            }
        },
        (g, m, i, c) => {
            let error = g
                .err()
                .or(m.err())
                .or(i.err())
                .or(c.err())
                .map(|e| e.to_string())
                .unwrap_or_default();
            html! { h1 { "Pipeline" } p class="error" role="alert" { "The platform database did not answer: " (error) } }
        }
    };
    let mut response = respond("Pipeline", &s, None, body);
    response.headers_mut().insert(
        axum::http::HeaderName::from_static("refresh"),
        axum::http::HeaderValue::from_static("5"),
    );
    response
}

/// The API's listing `path` at the pager's page.
fn api_page(path: &str, pager: &Pager) -> String {
    let mut q = vec![("limit", pager.limit.to_string())];
    if let Some(c) = &pager.cursor {
        q.push(("cursor", c.clone()));
    }
    format!(
        "{path}?{}",
        serde_urlencoded::to_string(&q).unwrap_or_default()
    )
}

/// The tenants, 50 a page.
pub(crate) async fn tenants(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
    RawQuery(query): RawQuery,
) -> Response {
    let pager = Pager::new("/console/tenants", query.as_deref(), &[], 50, 250);
    let list = s
        .call(&state, Method::GET, &api_page("/v1/tenants", &pager), None)
        .await;
    if !list.ok() {
        return respond(
            "Tenants",
            &s,
            None,
            html! { p class="error" { (list.problem()) } },
        )
        .into_response();
    }
    let body = html! {
        h1 { "Tenants" }
        table {
            thead { tr { th { "Id" } th { "Name" } th { "State" } th { "Created" } } }
            tbody {
                @for t in list.body["data"].as_array().map_or(&[][..], Vec::as_slice) {
                    tr {
                        td { a href={ "/console/tenants/" (enc(&text(&t["id"]))) } { code { (text(&t["id"])) } } }
                        td { (text(&t["name"])) }
                        td { @if t["enabled"].as_bool().unwrap_or(true) { "enabled" } @else { "disabled" } }
                        td { (t["created_at"].as_str().unwrap_or_default()) }
                    }
                }
            }
        }
        (pager.links(list.body["next_cursor"].as_str()))
    };
    respond("Tenants", &s, None, body)
}

/// The reconciliation runs the caller may see (the operator every one, a
/// tenant its own), each linked to its HTML report.
pub(crate) async fn reconciliations(
    State(state): State<ApiState>,
    s: Session,
    RawQuery(query): RawQuery,
) -> Response {
    let pager = Pager::new("/console/reconciliations", query.as_deref(), &[], 20, 100);
    let list = s
        .call(
            &state,
            Method::GET,
            &api_page("/v1/reconciliations", &pager),
            None,
        )
        .await;
    if !list.ok() {
        return respond(
            "Reconciliation",
            &s,
            None,
            html! { p class="error" { (list.problem()) } },
        );
    }
    let body = html! {
        h1 { "Reconciliation" }
        p { "Each run compares every stage for its window; its report is a page an auditor can read." }
        table {
            thead { tr { th { "Run" } th { "Window" } th { "Tenant" } th { "Verdict" } th { "Open gaps" } th { "Finished" } } }
            tbody {
                @for r in list.body["data"].as_array().map_or(&[][..], Vec::as_slice) {
                    tr {
                        td { a href={ "/console/reconciliations/" (text(&r["id"])) "/report.html" } { "#" (text(&r["id"])) } }
                        td { (text(&r["since"])) " – " (text(&r["until"])) }
                        td { @if r["tenant_id"].is_null() { "every tenant" } @else { (text(&r["tenant_id"])) } }
                        td { @if r["clean"].as_bool().unwrap_or(false) { span class="ok" { "clean" } } @else { span class="bad" { "gaps" } } }
                        td { (text(&r["open_gaps"])) }
                        td { (text(&r["finished_at"])) }
                    }
                }
            }
        }
        (pager.links(list.body["next_cursor"].as_str()))
    };
    respond("Reconciliation", &s, None, body)
}

/// A run's HTML report, as the API renders it (with its own policy).
pub(crate) async fn reconciliation_report(
    State(state): State<ApiState>,
    s: Session,
    Path(id): Path<String>,
) -> Response {
    let id: i64 = match id.parse() {
        Ok(n) => n,
        Err(_) => return super::not_found(&s, "No such reconciliation run."),
    };
    let response = s
        .send(&state, &format!("/v1/reconciliations/{id}/report.html"))
        .await;
    if response.status().is_success() {
        response
    } else {
        super::not_found(&s, "No such reconciliation run, or not one of yours.")
    }
}

async fn tenant_page(
    state: &ApiState,
    s: &Session,
    id: &str,
    notice: Option<Markup>,
    query: Option<&str>,
) -> Response {
    let id = enc(id);
    let t = s
        .call(state, Method::GET, &format!("/v1/tenants/{id}"), None)
        .await;
    if !t.ok() {
        return super::not_found(s, "No such tenant.");
    }
    let keys = s
        .call(
            state,
            Method::GET,
            &format!("/v1/tenants/{id}/api-keys"),
            None,
        )
        .await;
    let pager = Pager::new(&format!("/console/tenants/{id}"), query, &[], 20, 100);
    let all = keys.body["data"].as_array().map_or(&[][..], Vec::as_slice);
    let (keys, key_pages) = pager.slice(all);
    let body = html! {
        h1 { "Tenant " code { (text(&t.body["id"])) } }
        dl {
            dt { "Name" } dd { (text(&t.body["name"])) }
            dt { "State" } dd { @if t.body["enabled"].as_bool().unwrap_or(true) { "enabled" } @else { "disabled" } }
            dt { "Created" } dd { (text(&t.body["created_at"])) }
        }
        h2 { "API keys" }
        table {
            thead { tr { th { "Key" } th { "Name" } th { "Prefix" } th { "Created" } th { "Revoked" } th { span class="sr-only" { "Action" } } } }
            tbody {
                @for k in keys {
                    tr {
                        td { code { (text(&k["id"])) } }
                        td { (text(&k["name"])) }
                        td { code { (text(&k["prefix"])) "…" } }
                        td { (text(&k["created_at"])) }
                        td { (text(&k["revoked_at"])) }
                        td {
                            @if k["revoked_at"].is_null() {
                                form method="post" action={ "/console/tenants/" (id) "/keys/" (enc(&text(&k["id"]))) "/revoke" } {
                                    (s.csrf_field())
                                    button type="submit" class="danger" aria-label={ "Revoke key " (text(&k["id"])) } { "Revoke" }
                                }
                            }
                        }
                    }
                }
            }
        }
        (key_pages)
        h2 { "Issue a key" }
        form method="post" action={ "/console/tenants/" (id) "/keys" } {
            (s.csrf_field())
            label for="key-name" { "Name (where the key will be used)" }
            input id="key-name" name="name" type="text" maxlength="256";
            button type="submit" { "Issue key" }
        }
    };
    respond("Tenant", s, notice, body)
}

/// A tenant: its API keys, with forms to issue and revoke them.
pub(crate) async fn tenant(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    tenant_page(&state, &s, &id, None, query.as_deref()).await
}

/// Issues a key for a tenant; the key is shown once.
pub(crate) async fn issue_key(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
    Path(id): Path<String>,
    form: Form,
) -> Response {
    if let Some(r) = form.refused(&s) {
        return r;
    }
    let made = s
        .call(
            &state,
            Method::POST,
            &format!("/v1/tenants/{}/api-keys", enc(&id)),
            Some(json!({ "name": form.get("name").unwrap_or_default() })),
        )
        .await;
    let notice = if made.ok() {
        html! {
            p { "Key " code { (text(&made.body["api_key"]["id"])) } " issued. The key, shown this once (give it to the tenant):" }
            p { code class="secret" { (text(&made.body["key"])) } }
        }
    } else {
        html! { p class="error" role="alert" { "Not issued: " (made.problem()) } }
    };
    tenant_page(&state, &s, &id, Some(notice), None).await
}

/// Revokes one of a tenant's keys: it stops authenticating at once.
pub(crate) async fn revoke_key(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
    Path((id, key)): Path<(String, String)>,
    form: Form,
) -> Response {
    if let Some(r) = form.refused(&s) {
        return r;
    }
    let done = s
        .call(
            &state,
            Method::DELETE,
            &format!("/v1/tenants/{}/api-keys/{}", enc(&id), enc(&key)),
            None,
        )
        .await;
    let notice = if done.ok() {
        html! { p { "Key " code { (key) } " revoked: it no longer signs in or calls the API." } }
    } else {
        html! { p class="error" role="alert" { "Not revoked: " (done.problem()) } }
    };
    tenant_page(&state, &s, &id, Some(notice), None).await
}
