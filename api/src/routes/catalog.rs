//! Routes for any caller: the event-type catalog and the audit log (a
//! tenant sees its own records, the operator everyone's).

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use walhook_pipeline::ids::TenantId;
use walhook_sql::audit::AuditFilter;

use super::validate;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorResponses};
use crate::extract::{PathParams, QueryParams};
use crate::model::{
    AuditEntry, AuditPage, EventType, EventTypeDetail, EventTypeList, SchemaVersion, ts,
};
use crate::{ApiState, cursor};

/// The event-type catalog: the types capture rules produce, with their
/// schema versions, and `webhook.test`.
#[utoipa::path(get, path = "/v1/event-types", tag = "catalog",
    responses((status = 200, description = "The catalog", body = EventTypeList), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn list_event_types(
    _: Principal,
    State(state): State<ApiState>,
) -> Result<Response, ApiError> {
    let types = state.platform.event_types().await?;
    Ok(axum::Json(EventTypeList {
        data: types
            .into_iter()
            .map(|t| EventType {
                name: t.name,
                schema_version: t.schema_version,
                source: t.source,
                description: t.description,
                updated_at: ts(t.updated_at),
            })
            .collect(),
    })
    .into_response())
}

/// One event type of the catalog, with every version of its payload's
/// JSON Schema (a table rule's type gets a new version when the captured
/// table's columns it sends change; old versions stay readable).
#[utoipa::path(get, path = "/v1/event-types/{event_type}", tag = "catalog",
    params(("event_type" = String, Path, description = "The type, e.g. `invoice.paid`")),
    responses((status = 200, description = "The type and its schema versions", body = EventTypeDetail), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn get_event_type(
    _: Principal,
    State(state): State<ApiState>,
    PathParams(name): PathParams<String>,
) -> Result<Response, ApiError> {
    let Some(t) = state
        .platform
        .event_types()
        .await?
        .into_iter()
        .find(|t| t.name == name)
    else {
        return Err(ApiError::NotFound(format!(
            "no event type {name:?} in the catalog (GET /v1/event-types lists them)"
        )));
    };
    let versions = state.platform.schema_versions(&name).await?;
    Ok(axum::Json(EventTypeDetail {
        event_type: EventType {
            name: t.name,
            schema_version: t.schema_version,
            source: t.source,
            description: t.description,
            updated_at: ts(t.updated_at),
        },
        versions: versions
            .into_iter()
            .map(|v| SchemaVersion {
                version: v.version,
                schema: v.schema,
                source: v.source,
                created_at: ts(v.created_at),
            })
            .collect(),
    })
    .into_response())
}

/// Filters of the audit log.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// One action's records (e.g. `endpoint.updated`).
    #[param(value_type = Option<String>)]
    pub action: Option<String>,
    /// One target's records (an endpoint, delivery, tenant or key id).
    #[param(value_type = Option<String>)]
    pub target: Option<String>,
    /// Operator only: one tenant's records (a tenant always sees its own).
    #[param(value_type = Option<String>)]
    pub tenant_id: Option<String>,
    /// `next_cursor` of the previous page, with the same filters.
    #[param(value_type = Option<String>)]
    pub cursor: Option<String>,
    /// Page size, 1 to 250 (default 50).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 250)]
    pub limit: Option<String>,
}

/// The audit log, newest first: who changed what, and when.
#[utoipa::path(get, path = "/v1/audit-log", tag = "catalog", params(AuditQuery),
    responses((status = 200, description = "A page of audit records", body = AuditPage), ErrorResponses),
    security(("tenant_key" = []), ("operator" = [])))]
pub async fn list_audit(
    principal: Principal,
    State(state): State<ApiState>,
    QueryParams(q): QueryParams<AuditQuery>,
) -> Result<Response, ApiError> {
    let limit = validate::limit(q.limit.as_deref(), 50, 250)?;
    let asked = match &q.tenant_id {
        Some(t) => Some(TenantId::new(t.clone()).map_err(|_| {
            ApiError::field("query.tenant_id", format!("{t:?} is not a tenant id"))
        })?),
        None => None,
    };
    let tenant = match &principal {
        Principal::Operator => asked,
        Principal::Tenant { tenant, .. } => {
            if asked.as_ref().is_some_and(|a| a != tenant) {
                // Another tenant's records: none of the caller's match.
                return Ok(axum::Json(AuditPage {
                    data: Vec::new(),
                    next_cursor: None,
                })
                .into_response());
            }
            Some(tenant.clone())
        }
    };
    for (field, value) in [("query.action", &q.action), ("query.target", &q.target)] {
        if value.as_ref().is_some_and(|v| v.len() > 256) {
            return Err(ApiError::field(field, "is longer than 256 characters"));
        }
        if value
            .as_ref()
            .is_some_and(|v| v.chars().any(char::is_control))
        {
            return Err(ApiError::field(
                field,
                "contains control characters; remove them",
            ));
        }
    }
    let canonical = format!(
        "tenant={tenant:?}&action={:?}&target={:?}",
        q.action, q.target
    );
    let before_id = cursor::decode_id(q.cursor.as_deref(), "audit", &canonical)?;
    let mut rows = state
        .platform
        .list_audit(&AuditFilter {
            tenant,
            action: q.action.clone(),
            target: q.target.clone(),
            before_id,
            limit: limit + 1,
        })
        .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let next_cursor = more
        .then(|| {
            rows.last()
                .map(|r| cursor::encode("audit", &canonical, &r.id.to_string()))
        })
        .flatten();
    Ok(axum::Json(AuditPage {
        data: rows
            .into_iter()
            .map(|r| AuditEntry {
                id: r.id,
                tenant_id: r.tenant_id,
                actor: r.actor,
                action: r.action,
                target: r.target,
                detail: r.detail,
                at: ts(r.at),
            })
            .collect(),
        next_cursor,
    })
    .into_response())
}
