//! Reconciliation runs (`walhook reconcile`, and the schedule in `walhook
//! run`): the operator sees every run with its whole report, a tenant the
//! runs over every tenant (and its own), each with its own funnel and gaps.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use walhook_sql::reconcile::Reconciliation as Run;

use super::validate;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorResponses};
use crate::extract::{PathParams, QueryParams};
use crate::model::{Reconciliation, ReconciliationPage, ts};
use crate::{ApiState, cursor};

/// Paging of the runs.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ReconciliationQuery {
    /// `next_cursor` of the previous page.
    #[param(value_type = Option<String>)]
    pub cursor: Option<String>,
    /// Page size, 1 to 100 (default 20).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 100)]
    pub limit: Option<String>,
}

fn tenant_of(principal: &Principal) -> Option<&str> {
    match principal {
        Principal::Operator => None,
        Principal::Tenant { tenant, .. } => Some(tenant.as_str()),
    }
}

fn model(run: Run) -> Reconciliation {
    Reconciliation {
        id: run.id,
        trigger: run.trigger,
        since: ts(run.since),
        until: ts(run.until),
        tenant_id: run.tenant_id,
        repair: run.repair,
        clean: run.clean,
        open_gaps: run.open_gaps,
        gap_counts: run.gap_counts,
        data_sha256: run.data_sha256,
        started_at: ts(run.started_at),
        finished_at: ts(run.finished_at),
        report: run.report,
    }
}

/// Reconciliation runs, newest first. The operator's list has each run's
/// gap counts; a tenant's has, per run, its own funnel and gaps (under
/// `report`), and `clean` judged on its own gaps.
#[utoipa::path(get, path = "/v1/reconciliations", tag = "reconciliation", params(ReconciliationQuery),
    responses((status = 200, description = "A page of runs", body = ReconciliationPage), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn list_reconciliations(
    principal: Principal,
    State(state): State<ApiState>,
    QueryParams(q): QueryParams<ReconciliationQuery>,
) -> Result<Response, ApiError> {
    let limit = validate::limit(q.limit.as_deref(), 20, 100)?;
    let tenant = tenant_of(&principal);
    let canonical = format!("tenant={tenant:?}");
    let before_id = cursor::decode_id(q.cursor.as_deref(), "reconciliations", &canonical)?;
    let mut rows = state
        .platform
        .list_reconciliations(tenant, before_id, limit + 1)
        .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            rows.last()
                .map(|r| cursor::encode("reconciliations", &canonical, &r.id.to_string()))
        })
        .flatten();
    Ok(axum::Json(ReconciliationPage {
        data: rows.into_iter().map(model).collect(),
        next_cursor,
    })
    .into_response())
}

/// The run `id` names, as `tenant` (or the operator) may see it; 404 when
/// there is none.
async fn find_run(state: &ApiState, id: &str, tenant: Option<&str>) -> Result<Run, ApiError> {
    let missing = || ApiError::NotFound(format!("no reconciliation {id:?}"));
    let n = id
        .parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(missing)?;
    state
        .platform
        .reconciliation(n, tenant)
        .await?
        .ok_or_else(missing)
}

/// One run: the operator gets the whole report (the JSON of `walhook
/// reconcile --format json`), a tenant its own funnel and gaps.
#[utoipa::path(get, path = "/v1/reconciliations/{reconciliation_id}", tag = "reconciliation",
    params(("reconciliation_id" = i64, Path, description = "The run's id")),
    responses((status = 200, description = "The run and its report", body = Reconciliation), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn get_reconciliation(
    principal: Principal,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let run = find_run(&state, &id, tenant_of(&principal)).await?;
    Ok(axum::Json(model(run)).into_response())
}

/// One run's report as the self-contained HTML page auditors read: the
/// operator's is the whole report; a tenant's is its own view of a run
/// over every tenant or over it alone (its funnel, its gaps and
/// explanations; nothing of another tenant), with its own verdict and
/// data hash.
#[utoipa::path(get, path = "/v1/reconciliations/{reconciliation_id}/report.html", tag = "reconciliation",
    params(("reconciliation_id" = i64, Path, description = "The run's id")),
    responses((status = 200, description = "The report", content_type = "text/html"), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn reconciliation_html(
    principal: Principal,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let tenant = tenant_of(&principal);
    // A tenant's runs only (404 for another's), then the whole report to
    // take its view from.
    if tenant.is_some() {
        find_run(&state, &id, tenant).await?;
    }
    let run = find_run(&state, &id, None).await?;
    let n = run.id;
    let report: walhook_reconcile::Report = serde_json::from_value(run.report.unwrap_or_default())
        .map_err(|e| {
            ApiError::NotFound(format!(
                "reconciliation {n} was stored in a report layout this version does not render \
                 ({e}); GET /v1/reconciliations/{n} returns it as JSON"
            ))
        })?;
    let page = match tenant {
        Some(t) => walhook_reconcile::html::render_tenant_view(
            &walhook_reconcile::tenant_view::for_tenant(&report, t),
        ),
        None => walhook_reconcile::html::render(&report),
    };
    Ok((
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; img-src data:",
            ),
        ],
        page,
    )
        .into_response())
}
