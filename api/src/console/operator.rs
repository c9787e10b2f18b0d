//! The operator's pages: the pipeline at a glance (refreshed every 5 s
//! without script), and the tenants.

use std::fmt::Write;

use axum::extract::{Path, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use maud::{Markup, PreEscaped, html};

use super::pages::{enc, text};
use super::{OperatorSession, Session, respond};
use crate::ApiState;

fn secs(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} ms", v * 1000.0)
    } else {
        format!("{v:.1} s")
    }
}

/// Attempts per minute over the last hour as an inline SVG bar chart
/// (succeeded in green over the failed remainder).
fn chart(minutes: &[(f64, i64, i64)]) -> Markup {
    let (w, h) = (600.0f64, 120.0f64);
    let now = minutes.last().map_or(0.0, |m| m.0);
    let max = minutes.iter().map(|m| m.1).max().unwrap_or(0).max(1) as f64;
    let bar = w / 60.0;
    let mut svg = format!(
        r#"<svg class="chart" width="{w}" height="{}" viewBox="0 0 {w} {}" role="img" aria-label="Attempts per minute over the last hour">"#,
        h + 16.0,
        h + 16.0
    );
    for (minute, all, ok) in minutes {
        let slot = 59.0 - ((now - minute) / 60.0).round();
        if !(0.0..60.0).contains(&slot) {
            continue;
        }
        let x = slot * bar;
        let total = h * (*all as f64) / max;
        let good = h * (*ok as f64) / max;
        let _ = write!(
            svg,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{total:.1}" fill="#c44"><title>{all} attempts, {ok} succeeded</title></rect><rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{good:.1}" fill="#3a3"/>"##,
            h - total,
            bar - 1.0,
            h - good,
            bar - 1.0,
        );
    }
    let _ = write!(
        svg,
        r#"<text x="0" y="{}" font-size="11">60 min ago</text><text x="{w}" y="{}" font-size="11" text-anchor="end">now · peak {max:.0}/min</text></svg>"#,
        h + 13.0,
        h + 13.0
    );
    // Only numbers are interpolated: nothing to escape.
    PreEscaped(svg)
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
                div class="tile" { span class="label" { "Attempts, last hour" } span class="value" id="attempts-hour" { (m.iter().map(|x| x.1).sum::<i64>()) } }
            }
            h2 { "Attempts per minute" }
            (chart(&m))
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
            p { @for (state, n) in &g.circuits { (state) ": " (n) "  " } }
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

/// The tenants.
pub(crate) async fn tenants(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
) -> Response {
    let list = s
        .call(&state, Method::GET, "/v1/tenants?limit=250", None)
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
                        td { a href={ "/console/tenants/" (t["id"].as_str().unwrap_or_default()) } { code { (t["id"].as_str().unwrap_or_default()) } } }
                        td { (t["name"].as_str().unwrap_or_default()) }
                        td { @if t["enabled"].as_bool().unwrap_or(true) { "enabled" } @else { "disabled" } }
                        td { (t["created_at"].as_str().unwrap_or_default()) }
                    }
                }
            }
        }
    };
    respond("Tenants", &s, None, body)
}

/// The reconciliation runs the caller may see (the operator every one, a
/// tenant its own), each linked to its HTML report.
pub(crate) async fn reconciliations(State(state): State<ApiState>, s: Session) -> Response {
    let list = s
        .call(&state, Method::GET, "/v1/reconciliations?limit=100", None)
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

/// One tenant and its API keys (prefixes only: a key is shown once, when
/// issued over the API).
pub(crate) async fn tenant(
    State(state): State<ApiState>,
    OperatorSession(s): OperatorSession,
    Path(id): Path<String>,
) -> Response {
    let id = enc(&id);
    let t = s
        .call(&state, Method::GET, &format!("/v1/tenants/{id}"), None)
        .await;
    if !t.ok() {
        return super::not_found(&s, "No such tenant.");
    }
    let keys = s
        .call(
            &state,
            Method::GET,
            &format!("/v1/tenants/{id}/api-keys"),
            None,
        )
        .await;
    let body = html! {
        h1 { "Tenant " code { (text(&t.body["id"])) } }
        dl {
            dt { "Name" } dd { (text(&t.body["name"])) }
            dt { "State" } dd { @if t.body["enabled"].as_bool().unwrap_or(true) { "enabled" } @else { "disabled" } }
            dt { "Created" } dd { (text(&t.body["created_at"])) }
        }
        h2 { "API keys" }
        table {
            thead { tr { th { "Key" } th { "Name" } th { "Prefix" } th { "Created" } th { "Revoked" } } }
            tbody {
                @for k in keys.body["data"].as_array().map_or(&[][..], Vec::as_slice) {
                    tr {
                        td { code { (text(&k["id"])) } }
                        td { (text(&k["name"])) }
                        td { code { (text(&k["prefix"])) "…" } }
                        td { (text(&k["created_at"])) }
                        td { (text(&k["revoked_at"])) }
                    }
                }
            }
        }
    };
    respond("Tenant", &s, None, body)
}
