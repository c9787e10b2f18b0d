//! Endpoints' health (failures, circuit state), saved and loaded across
//! restarts.

use std::collections::HashMap;
use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::ids::{EndpointId, TenantId};
#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;
use walhook_pipeline::store::EndpointHealth;
use walhook_pipeline::time::Timestamp;

use super::uuid16;
use crate::{Platform, StoreError, stored};

/// [`DispatchStore::save_health`] on Postgres.
pub(super) async fn save_health(
    platform: &Platform,
    all: &[EndpointHealth],
) -> Result<(), walhook_pipeline::store::StoreError> {
    // One row per endpoint: the latest state in the batch.
    let mut latest: HashMap<EndpointId, &EndpointHealth> = HashMap::new();
    for h in all {
        latest.insert(h.endpoint_id, h);
    }
    let h: Vec<&EndpointHealth> = latest.into_values().collect();
    let ids: Vec<Uuid> = h.iter().map(|x| uuid16(&x.endpoint_id.0)).collect();
    let since: Vec<Option<SystemTime>> = h
        .iter()
        .map(|x| x.failing_since.map(|t| t.to_system_time()))
        .collect();
    let failures: Vec<i32> = h.iter().map(|x| x.consecutive_failures as i32).collect();
    let circuits: Vec<&str> = h.iter().map(|x| x.circuit.as_str()).collect();
    let until: Vec<Option<SystemTime>> = h
        .iter()
        .map(|x| x.open_until.map(|t| t.to_system_time()))
        .collect();
    let client = platform.client().await?;
    client
        .execute(
            "INSERT INTO walhook.endpoint_health (endpoint_id, failing_since, consecutive_failures, circuit, opened_at, open_until, updated_at) \
             SELECT u.id, u.since, u.failures, u.circuit, CASE WHEN u.circuit = 'open' THEN now() END, u.until, now() \
             FROM unnest($1::uuid[], $2::timestamptz[], $3::int4[], $4::text[], $5::timestamptz[]) AS u(id, since, failures, circuit, until) \
             WHERE EXISTS (SELECT 1 FROM walhook.endpoints WHERE id = u.id) \
             ON CONFLICT (endpoint_id) DO UPDATE SET failing_since = EXCLUDED.failing_since, \
               consecutive_failures = EXCLUDED.consecutive_failures, circuit = EXCLUDED.circuit, \
               opened_at = CASE WHEN EXCLUDED.circuit = 'open' THEN coalesce(walhook.endpoint_health.opened_at, now()) END, \
               open_until = EXCLUDED.open_until, updated_at = now()",
            &[&ids, &since, &failures, &circuits, &until],
        )
        .await
        .map_err(StoreError::query("save endpoint health"))?;
    Ok(())
}

/// [`DispatchStore::load_health`] on Postgres.
pub(super) async fn load_health(
    platform: &Platform,
) -> Result<Vec<EndpointHealth>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let rows = client
        .query(
            "SELECT h.endpoint_id, e.tenant_id, h.failing_since, h.consecutive_failures, h.circuit, h.open_until \
             FROM walhook.endpoint_health h JOIN walhook.endpoints e ON e.id = h.endpoint_id \
             WHERE e.deleted_at IS NULL",
            &[],
        )
        .await
        .map_err(StoreError::query("load endpoint health"))?;
    let mut out = Vec::new();
    for r in rows {
        let Ok(tenant_id) = TenantId::new(r.get::<_, String>(1)) else {
            continue;
        };
        let endpoint_id = EndpointId(*r.get::<_, Uuid>(0).as_bytes());
        out.push(EndpointHealth {
            endpoint_id,
            tenant_id,
            failing_since: r
                .get::<_, Option<SystemTime>>(2)
                .map(Timestamp::from_system_time),
            consecutive_failures: r.get::<_, i32>(3).max(0) as u32,
            circuit: stored(r.get(4), "the health of endpoint", endpoint_id)?,
            open_until: r
                .get::<_, Option<SystemTime>>(5)
                .map(Timestamp::from_system_time),
        });
    }
    Ok(out)
}
