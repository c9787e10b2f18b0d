//! Tenant routes: delivery history, replays and cancellation.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use walhook_archive::cold::Restore;
use walhook_archive::table::Table;
use walhook_pipeline::delivery::DeliveryStatus;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{DeliveryId, EndpointId};
use walhook_sql::cancel::CancelOutcome;
use walhook_sql::deliveries::DeliveryFilter;
use walhook_sql::replay::ReplayOutcome;

use super::validate;
use crate::auth::TenantCaller;
use crate::error::{ApiError, ErrorResponses};
use crate::extract::{IdempotencyKey, JsonBody, PathParams, QueryParams};
use crate::idempotency::{self, Reply};
use crate::model::deliveries::*;
use crate::model::ts;
use crate::routes::endpoints::Empty;
use crate::{ApiState, cursor};

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no delivery {id:?}"))
}

/// The refusal of a replay past the replay window.
fn outside_window(
    did: DeliveryId,
    occurred_at: std::time::SystemTime,
    window: std::time::Duration,
) -> ApiError {
    ApiError::Conflict(format!(
        "the event of delivery {did} occurred at {}, more than the replay window ({} days) ago, so it \
         cannot be replayed; its history stays readable, and the operator can widen [archive] replay_window",
        ts(occurred_at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        window.as_secs() / 86_400
    ))
}

fn delivery_id(text: &str) -> Result<DeliveryId, ApiError> {
    text.parse().map_err(|_| not_found(text))
}

/// The filters, checked, and their canonical text (bound into cursors).
fn filter(q: &DeliveryQuery, caller: &TenantCaller) -> Result<(DeliveryFilter, String), ApiError> {
    let endpoint = match &q.endpoint_id {
        Some(text) => Some(text.parse::<EndpointId>().map_err(|_| {
            ApiError::field(
                "query.endpoint_id",
                format!("{text:?} is not an endpoint id (ep_…)"),
            )
        })?),
        None => None,
    };
    let event_type = match &q.event_type {
        Some(t) => Some(
            EventType::new(t)
                .map_err(|_| {
                    ApiError::field(
                        "query.event_type",
                        format!("{t:?} is not an event type name"),
                    )
                })?
                .to_string(),
        ),
        None => None,
    };
    let status = match &q.status {
        Some(s) => Some(DeliveryStatus::try_from(s.as_str()).map_err(|_| {
            ApiError::field(
                "query.status",
                format!(
                    "{s:?} is not a status; give one of {}",
                    DeliveryStatus::NAMES.join(", ")
                ),
            )
        })?),
        None => None,
    };
    let since = validate::time("query.since", q.since.as_deref())?;
    let until = validate::time("query.until", q.until.as_deref())?;
    let limit = validate::limit(q.limit.as_deref(), 50, 250)?;
    let canonical = format!(
        "endpoint={:?}&type={:?}&status={:?}&since={:?}&until={:?}",
        endpoint.map(|e| e.to_string()),
        event_type,
        status.map(DeliveryStatus::as_str),
        since,
        until
    );
    let before = match &q.cursor {
        Some(c) => Some(cursor::parse_keyset(&cursor::decode(
            c,
            "deliveries",
            &canonical,
        )?)?),
        None => None,
    };
    Ok((
        DeliveryFilter {
            tenant: caller.tenant.clone(),
            endpoint,
            event_type,
            status,
            since,
            until,
            before,
            limit,
        },
        canonical,
    ))
}

/// Lists the tenant's deliveries, newest first, with a stable cursor.
///
/// Past the hot rows the listing continues into archived days. A request
/// reads a bounded number of archived days and bytes: when that budget is
/// spent before the page is full, the page holds fewer rows than `limit`
/// (possibly none) and a `next_cursor` to go on with. An `endpoint_id` that
/// is not one of the tenant's endpoints is a 404.
#[utoipa::path(get, path = "/v1/webhook-deliveries", tag = "deliveries", params(DeliveryQuery),
    responses((status = 200, description = "A page of deliveries", body = DeliveryPage), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn list_deliveries(
    caller: TenantCaller,
    State(state): State<ApiState>,
    QueryParams(q): QueryParams<DeliveryQuery>,
) -> Result<Response, ApiError> {
    let (mut f, canonical) = filter(&q, &caller)?;
    // A page below the newest archived day reads the archive: its read
    // slot is taken first, so a tenant over [api].cold_reads_per_tenant
    // is refused before the request costs a query.
    let held = match (&state.cold, f.before) {
        (Some(cold), Some((at, _))) if cold.may_hold_since(Table::Deliveries, at).await? => {
            Some(state.hold_cold(cold, &caller.tenant)?)
        }
        _ => None,
    };
    // Another tenant's endpoint is a 404 like a missing one, before any
    // hot or archived row is read for it.
    if let Some(ep) = f.endpoint
        && !state
            .platform
            .endpoint_is_tenants(&caller.tenant, ep)
            .await?
    {
        return Err(ApiError::NotFound(format!(
            "no endpoint {:?}",
            ep.to_string()
        )));
    }
    let limit = f.limit;
    f.limit = limit + 1;
    let mut rows = state.platform.list_deliveries(&f).await?;
    let mut resume = None;
    // Archived deliveries at or above the last hot row the page can show
    // (every one, when the hot rows ran short). A delivery hot again after
    // a restore is shown once, from the hot row.
    let floor = (rows.len() as i64 >= f.limit)
        .then(|| rows.last().map(keyset))
        .flatten();
    // A page of recent hot rows needs nothing archived: it is answered
    // here, without waiting behind archive reads.
    let reaches = match (&state.cold, floor) {
        (Some(cold), Some((at, _))) => cold.may_hold_since(Table::Deliveries, at).await?,
        (cold, _) => cold.is_some(),
    };
    let archived = if reaches {
        let f = f.clone();
        state
            .cold_read(&caller.tenant, held, move |cold, slot| async move {
                cold.list_deliveries(&f, floor, Some(&slot)).await
            })
            .await?
    } else {
        None
    };
    if let Some(page) = archived {
        let hot: std::collections::HashSet<DeliveryId> = rows.iter().map(|d| d.id).collect();
        rows.extend(page.rows.into_iter().filter(|d| !hot.contains(&d.id)));
        rows.sort_by_key(|d| std::cmp::Reverse(keyset(d)));
        if let Some(at) = page.resume {
            // The archive was not read below this position: what lies
            // there comes on the next page.
            rows.retain(|d| keyset(d) >= at);
            resume = Some(at);
        }
    }
    let more = rows.len() as i64 > limit;
    rows.truncate(limit as usize);
    let position = if more {
        rows.last().map(keyset)
    } else {
        resume
    };
    let next_cursor =
        position.map(|(at, id)| cursor::encode("deliveries", &canonical, &cursor::keyset(at, id)));
    Ok(axum::Json(DeliveryPage {
        data: rows.into_iter().map(Delivery::from).collect(),
        next_cursor,
    })
    .into_response())
}

/// A delivery's place in listings: `(created_at, id)`.
fn keyset(d: &walhook_sql::deliveries::DeliveryRecord) -> (std::time::SystemTime, uuid::Uuid) {
    (d.created_at, uuid::Uuid::from_bytes(d.id.0))
}

/// One delivery with its event (the exact body) and every attempt.
#[utoipa::path(get, path = "/v1/webhook-deliveries/{delivery_id}", tag = "deliveries",
    params(("delivery_id" = String, Path, description = "The delivery (`dlv_…`)")),
    responses((status = 200, description = "The delivery", body = DeliveryDetail), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn get_delivery(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let h = history(&state, &caller, &id).await?;
    Ok(axum::Json(DeliveryDetail {
        delivery: h.delivery.into(),
        event: h.event.into(),
        attempts: h.attempts.into_iter().map(Attempt::from).collect(),
    })
    .into_response())
}

/// A delivery of the caller's, its event and every attempt, hot or
/// archived.
pub(crate) struct History {
    pub(crate) delivery: walhook_sql::deliveries::DeliveryRecord,
    pub(crate) event: walhook_sql::deliveries::EventRecord,
    /// In the order they started.
    pub(crate) attempts: Vec<walhook_sql::deliveries::AttemptRow>,
}

/// The caller's delivery `id` with its event and attempts (hot rows, then
/// the archive); a 404 for another tenant's.
pub(crate) async fn history(
    state: &ApiState,
    caller: &TenantCaller,
    id: &str,
) -> Result<History, ApiError> {
    let did = delivery_id(id)?;
    let tenant = caller.tenant.clone();
    // A hot delivery, its event and attempts come from one snapshot: the
    // attempts listed are the ones its counts and status describe.
    let (delivery, event, mut attempts) =
        match state.platform.hot_history(&caller.tenant, did).await? {
            Some(h) => (h.delivery, h.event, h.attempts),
            None => {
                let tenant = tenant.clone();
                let delivery = state
                    .cold_read(&caller.tenant, None, move |cold, slot| async move {
                        cold.delivery(&tenant, did, Some(&slot)).await
                    })
                    .await?
                    .flatten()
                    .ok_or_else(|| not_found(id))?;
                // A replay of an archived delivery adds hot attempts.
                let (event, attempts) = (
                    state.platform.event_of(&delivery).await?,
                    state.platform.attempts_of(did).await?,
                );
                (delivery, event, attempts)
            }
        };
    let event = match event {
        Some(e) => e,
        None => {
            let (tenant, d) = (tenant.clone(), delivery.clone());
            state
                .cold_read(&caller.tenant, None, move |cold, slot| async move {
                    cold.event(&tenant, &d, Some(&slot)).await
                })
                .await?
                .flatten()
                .map(|e| e.record)
                .ok_or_else(|| {
                    ApiError::NotFound(format!(
                        "the event of delivery {did} is no longer in the hot store and the archive does not hold it"
                    ))
                })?
        }
    };
    // Attempts of archived days, then the hot ones (a replay of an archived
    // delivery adds hot attempts to cold ones).
    let known = attempts.len();
    let d = delivery.clone();
    // A recent delivery's attempts are all hot: no archive read.
    let archived = match &state.cold {
        Some(cold)
            if cold
                .may_hold_since(Table::Attempts, delivery.created_at)
                .await? =>
        {
            state
                .cold_read(&caller.tenant, None, move |cold, slot| async move {
                    cold.attempts(&tenant, &d, known, Some(&slot)).await
                })
                .await?
        }
        _ => None,
    };
    if let Some(archived) = archived {
        let hot: std::collections::HashSet<_> = attempts.iter().map(|a| a.id).collect();
        let mut all: Vec<_> = archived
            .into_iter()
            .filter(|a| !hot.contains(&a.id))
            .collect();
        all.append(&mut attempts);
        all.sort_by_key(|a| a.started_at);
        attempts = all;
    }
    Ok(History {
        delivery,
        event,
        attempts,
    })
}

/// Asks for a new manual attempt of a delivery: same `webhook-id`, same
/// bytes, signed with the endpoint's current secrets. While a request is
/// open (not yet carried out), another one is a 409 naming it.
#[utoipa::path(post, path = "/v1/webhook-deliveries/{delivery_id}/replay", tag = "deliveries",
    params(("delivery_id" = String, Path, description = "The delivery (`dlv_…`)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe")),
    request_body(content = Empty, description = "Optional; `{}` or nothing"),
    responses((status = 202, description = "The replay is queued", body = ReplayAccepted), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn replay_delivery(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<Empty>,
) -> Result<Response, ApiError> {
    let did = delivery_id(&id)?;
    let path = format!("POST /v1/webhook-deliveries/{did}/replay");
    let (s, tenant, actor) = (&state, &caller.tenant, &caller.principal.actor());
    idempotency::once(
        s,
        &caller.principal,
        &key,
        &path,
        &body.raw,
        || async move {
            let mut outcome = s
                .platform
                .request_replay_of_tenant(tenant, did, actor, s.settings.replay_window)
                .await?;
            // An archived delivery comes back to the hot tables first (same
            // ids and bytes), within the replay window.
            let restored = if outcome == ReplayOutcome::NotFound {
                let owner = tenant.clone();
                s.cold_read(tenant, None, move |cold, slot| async move {
                    cold.restore(&owner, did, Some(&slot)).await
                })
                .await?
            } else {
                None
            };
            if let Some(restored) = restored {
                match restored {
                    Restore::Restored => {
                        outcome = s
                            .platform
                            .request_replay_of_tenant(tenant, did, actor, s.settings.replay_window)
                            .await?;
                    }
                    Restore::NotFound => {}
                    Restore::OutsideWindow {
                        occurred_at,
                        window,
                    } => {
                        return Err(outside_window(did, occurred_at, window));
                    }
                }
            }
            match outcome {
                ReplayOutcome::Requested(request) => Ok(Reply::json(
                    StatusCode::ACCEPTED,
                    &ReplayAccepted {
                        replay_request_id: request,
                        delivery_id: did.to_string(),
                    },
                )),
                ReplayOutcome::NotFound => Err(not_found(&did.to_string())),
                ReplayOutcome::OutsideWindow { occurred_at } => {
                    Err(outside_window(did, occurred_at, s.settings.replay_window))
                }
                ReplayOutcome::NotAttemptedYet => Err(ApiError::Conflict(format!(
                    "delivery {did} has not had its first attempt yet; it is pending and is sent \
                     without a replay: follow it with GET /v1/webhook-deliveries/{did}"
                ))),
                ReplayOutcome::EndpointDeleted => Err(ApiError::Conflict(format!(
                    "the endpoint of delivery {did} was deleted; there is nowhere to send it"
                ))),
                // One open request per delivery: a flood of replays would
                // otherwise queue as many identical sends.
                ReplayOutcome::AlreadyOpen {
                    request,
                    requested_at,
                } => Err(ApiError::Conflict(format!(
                    "delivery {did} already has an open replay request ({request}, made at {}); \
                     the dispatcher sends it within a sweep interval: follow it with \
                     GET /v1/webhook-deliveries/{did} and ask again once it has been made",
                    ts(requested_at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ))),
            }
        },
    )
    .await
}

/// Cancels a pending delivery: no attempt starts after this (an attempt
/// already out finishes and is kept in the history, without changing the
/// state). Ended deliveries cannot be cancelled (409 names their state).
#[utoipa::path(post, path = "/v1/webhook-deliveries/{delivery_id}/cancel", tag = "deliveries",
    params(("delivery_id" = String, Path, description = "The delivery (`dlv_…`)"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST safe")),
    request_body(content = Empty, description = "Optional; `{}` or nothing"),
    responses((status = 200, description = "The delivery, now cancelled", body = Delivery), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn cancel_delivery(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
    key: IdempotencyKey,
    body: JsonBody<Empty>,
) -> Result<Response, ApiError> {
    let did = delivery_id(&id)?;
    let path = format!("POST /v1/webhook-deliveries/{did}/cancel");
    let (s, tenant, actor) = (&state, &caller.tenant, &caller.principal.actor());
    idempotency::once(
        s,
        &caller.principal,
        &key,
        &path,
        &body.raw,
        || async move {
            match s.platform.cancel_delivery_of_tenant(tenant, did, actor).await? {
                CancelOutcome::Cancelled => {
                    let delivery = s
                        .platform
                        .delivery_of_tenant(tenant, did)
                        .await?
                        .ok_or_else(|| not_found(&did.to_string()))?;
                    Ok(Reply::json(StatusCode::OK, &Delivery::from(delivery)))
                }
                CancelOutcome::NotFound => Err(not_found(&did.to_string())),
                CancelOutcome::NotAttemptedYet => Err(ApiError::Conflict(format!(
                    "delivery {did} is having its first attempt made right now; ask again in a moment \
                     (a retry it may need is then cancelled)"
                ))),
                CancelOutcome::Ended(status) => Err(ApiError::Conflict(format!(
                    "delivery {did} has ended ({status}); only a pending delivery can be cancelled \
                     (ask for a new attempt with POST /v1/webhook-deliveries/{did}/replay)"
                ))),
            }
        },
    )
    .await
}
