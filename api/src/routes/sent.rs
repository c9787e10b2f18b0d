//! What each attempt of a delivery sent: the request rebuilt, byte for
//! byte, from what walhook stores.
//!
//! Attempts do not store their request (a copy of every body per attempt
//! would multiply the hottest table's size); everything that went into it
//! is stored, and the request is a pure function of it:
//!
//! ```text
//!  event bytes, type, schema version, commit time ─┐
//!  delivery id (webhook-id) ───────────────────────┤
//!  attempt number, start time (webhook-timestamp) ─┼─▶ egress::build_request ─▶ headers, body
//!  endpoint URL of the attempt's config version ───┤     (the dispatcher's own code)
//!  secrets of the attempt's secret versions ───────┘
//! ```
//!
//! So the rebuilt request is the one the dispatcher built, by the same
//! code; the HTTP client then adds `host`, `accept` and `content-length`,
//! which are added here the same way. Secrets are opened with the
//! platform's keyring and never leave this module: only the signatures
//! they make do, as the receiver saw them.

use std::collections::HashMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use uuid::Uuid;
use walhook_pipeline::delivery::DeliveryJob;
use walhook_pipeline::dispatch::egress::build_request;
use walhook_pipeline::event::EventType;
use walhook_pipeline::ids::{EndpointId, TenantId};
use walhook_pipeline::signing::VersionedSecret;
use walhook_pipeline::time::Timestamp;
use walhook_sql::StoreError;
use walhook_sql::deliveries::AttemptRow;

use super::deliveries::{History, history};
use crate::ApiState;
use crate::auth::TenantCaller;
use crate::error::{ApiError, ErrorResponses};
use crate::extract::PathParams;
use crate::model::deliveries::{SentHeader, SentRequest, SentRequestList};
use crate::model::hex;

/// The request each attempt of a delivery sent, rebuilt exactly: the body
/// byte for byte and every header, `webhook-signature` included (it
/// verifies with the secrets of the versions that signed the attempt).
#[utoipa::path(get, path = "/v1/webhook-deliveries/{delivery_id}/requests", tag = "deliveries",
    params(("delivery_id" = String, Path, description = "The delivery (`dlv_…`)")),
    responses((status = 200, description = "One request per attempt", body = SentRequestList), ErrorResponses),
    security(("tenant_key" = [])))]
pub async fn sent_requests(
    caller: TenantCaller,
    State(state): State<ApiState>,
    PathParams(id): PathParams<String>,
) -> Result<Response, ApiError> {
    let h = history(&state, &caller, &id).await?;
    let endpoint = h.delivery.endpoint_id;
    let mut config_versions: Vec<i32> = h
        .attempts
        .iter()
        .map(|a| a.endpoint_config_version)
        .collect();
    config_versions.sort_unstable();
    config_versions.dedup();
    let mut secret_versions: Vec<i32> = h
        .attempts
        .iter()
        .flat_map(|a| a.secret_versions.iter().flatten().copied())
        .collect();
    secret_versions.sort_unstable();
    secret_versions.dedup();
    let urls = urls(&state, endpoint, &config_versions).await?;
    let secrets = secrets(&state, endpoint, &secret_versions).await?;
    let job = job_of(&h, &caller.tenant)?;
    let data = h
        .attempts
        .iter()
        .map(|a| rebuild(&job, &h, a, &urls, &secrets))
        .collect();
    Ok(axum::Json(SentRequestList { data }).into_response())
}

/// The dispatcher's job for the delivery, as far as the request depends
/// on it (the rest is left at its default).
fn job_of(h: &History, tenant: &TenantId) -> Result<DeliveryJob, ApiError> {
    let d = &h.delivery;
    let event_type = EventType::new(&d.event_type).map_err(|_| {
        ApiError::NotFound(format!(
            "delivery {} has the event type {:?}, which no request could carry",
            d.id, d.event_type
        ))
    })?;
    Ok(DeliveryJob {
        delivery_id: d.id,
        event_id: h.event.id,
        endpoint_id: d.endpoint_id,
        tenant_id: tenant.clone(),
        event_type,
        payload: h.event.payload.clone().into(),
        attempt_count: 0,
        manual_attempt_count: 0,
        after_unknown: false,
        materialized: true,
        created_at: Timestamp::from_system_time(d.created_at),
        next_attempt_at: Timestamp::from_system_time(d.created_at),
        expires_at: Timestamp::from_system_time(d.expires_at),
        lease_version: 0,
        endpoint_config_version: d.endpoint_config_version,
        event_occurred_at: Timestamp::from_system_time(d.event_occurred_at),
        // As the dispatcher reads it.
        schema_version: h.event.schema_version.max(1) as u32,
        replay: None,
        order: None,
    })
}

/// One attempt's request.
fn rebuild(
    job: &DeliveryJob,
    h: &History,
    a: &AttemptRow,
    urls: &HashMap<i32, String>,
    secrets: &HashMap<i32, Result<VersionedSecret, String>>,
) -> SentRequest {
    let url = urls
        .get(&a.endpoint_config_version)
        .cloned()
        .unwrap_or_default();
    let (signers, unavailable) = match &a.secret_versions {
        None => (
            Vec::new(),
            Some(
                "this attempt was recorded before walhook kept which secrets signed an attempt"
                    .to_owned(),
            ),
        ),
        Some(versions) => {
            let mut signers = Vec::with_capacity(versions.len());
            let mut problem = None;
            for v in versions {
                match secrets.get(v) {
                    Some(Ok(s)) => signers.push(s.clone()),
                    Some(Err(e)) => problem = Some(e.clone()),
                    None => {
                        problem = Some(format!(
                            "the endpoint's secret version {v} is no longer stored"
                        ))
                    }
                }
            }
            (signers, problem)
        }
    };
    let started = Timestamp::from_system_time(a.started_at).unix_seconds();
    let request = build_request(job, &url, &signers, a.number.max(0) as u32, started);
    let mut headers: Vec<SentHeader> = request
        .headers
        .iter()
        .filter(|(name, _)| !(unavailable.is_some() && *name == "webhook-signature"))
        .map(|(name, value)| SentHeader {
            name: (*name).to_owned(),
            value: value.clone(),
        })
        .collect();
    // What the HTTP client adds (connectors' egress, then hyper).
    if let Some(host) = host_of(&url) {
        headers.push(SentHeader {
            name: "host".into(),
            value: host,
        });
    }
    headers.push(SentHeader {
        name: "accept".into(),
        value: "*/*".into(),
    });
    headers.push(SentHeader {
        name: "content-length".into(),
        value: request.body.len().to_string(),
    });
    SentRequest {
        attempt_id: a.id.to_string(),
        number: a.number,
        method: "POST".into(),
        url,
        headers,
        body: String::from_utf8_lossy(&request.body).into_owned(),
        body_sha256: hex(&Sha256::digest(&h.event.payload)),
        secret_versions: a.secret_versions.clone(),
        signature_unavailable: unavailable,
    }
}

/// The `host` header of a request to `url`: the host, and the port when
/// the URL names one other than its scheme's.
fn host_of(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let host = u.host_str()?;
    Some(match u.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// The endpoint's URL in each of `versions`.
async fn urls(
    state: &ApiState,
    endpoint: EndpointId,
    versions: &[i32],
) -> Result<HashMap<i32, String>, ApiError> {
    let client = state.platform.client().await?;
    let rows = client
        .query(
            "SELECT version, url FROM walhook.endpoint_versions \
             WHERE endpoint_id = $1 AND version = ANY($2)",
            &[&Uuid::from_bytes(endpoint.0), &versions],
        )
        .await
        .map_err(StoreError::query("read an endpoint's URLs by version"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The endpoint's secrets of `versions`, opened (or why one does not open).
async fn secrets(
    state: &ApiState,
    endpoint: EndpointId,
    versions: &[i32],
) -> Result<HashMap<i32, Result<VersionedSecret, String>>, ApiError> {
    if versions.is_empty() {
        return Ok(HashMap::new());
    }
    let keyring = state.platform.keyring()?;
    let client = state.platform.client().await?;
    let rows = client
        .query(
            "SELECT version, key_id, secret FROM walhook.endpoint_secrets \
             WHERE endpoint_id = $1 AND version = ANY($2)",
            &[&Uuid::from_bytes(endpoint.0), &versions],
        )
        .await
        .map_err(StoreError::query("read an endpoint's secrets by version"))?;
    Ok(rows
        .iter()
        .map(|r| {
            let version: i32 = r.get(0);
            let key_id: String = r.get(1);
            let sealed: Vec<u8> = r.get(2);
            let opened = keyring
                .open(endpoint, version, &key_id, &sealed)
                .map(|secret| VersionedSecret { version, secret })
                .map_err(|e| e.to_string());
            (version, opened)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_header_names_a_port_only_when_the_url_does() {
        assert_eq!(
            host_of("https://hooks.example.com/in").as_deref(),
            Some("hooks.example.com")
        );
        assert_eq!(
            host_of("http://127.0.0.1:8080/in").as_deref(),
            Some("127.0.0.1:8080")
        );
        assert_eq!(
            host_of("https://[::1]:9443/in").as_deref(),
            Some("[::1]:9443")
        );
        assert_eq!(host_of("not a url"), None);
    }
}
