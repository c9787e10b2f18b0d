//! `--repair`: missing deliveries are re-driven through fan-out's own write
//! (the same plan rows fan-out stores, unheld so that any dispatcher claims
//! them), overdue ones are re-enqueued (due now, held by nobody). Both are
//! idempotent: a delivery that exists, or is held by a live dispatcher, is
//! left alone, and a second run finds nothing to do.

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;

use uuid::Uuid;
use walhook_pipeline::delivery::NewDelivery;
use walhook_pipeline::event::{Event, EventKey, EventType};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use walhook_pipeline::store::FanoutStore;
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

use crate::ReconcileError;
use crate::findings::Findings;
use crate::reconciler::Settings;
use crate::report::{GapClass, Repair};

/// Events re-driven per fan-out write.
const CHUNK: usize = 500;

/// Repairs what `findings` lists; marks the gaps it fixed.
pub async fn run(
    platform: &Platform,
    settings: &Settings,
    findings: &mut Findings,
) -> Result<Vec<Repair>, ReconcileError> {
    let mut repairs = Vec::new();
    if !findings.missing.is_empty() {
        let fixed = redrive(platform, settings, findings).await?;
        repairs.push(Repair {
            class: GapClass::MissingDelivery,
            repaired: fixed.len() as u64,
            action: "made the missing deliveries through fan-out's write, due now and held by no \
                     dispatcher, so the next sweep claims and sends them"
                .into(),
        });
        findings.mark_repaired(GapClass::MissingDelivery, &fixed);
    }
    if !findings.overdue.is_empty() {
        let fixed = requeue(platform, findings).await?;
        repairs.push(Repair {
            class: GapClass::OverduePending,
            repaired: fixed.len() as u64,
            action: "made the overdue deliveries due now and held by no dispatcher (their \
                     scheduling rows restored where missing), so the next sweep claims them"
                .into(),
        });
        findings.mark_repaired(GapClass::OverduePending, &fixed);
    }
    Ok(repairs)
}

fn gap_id(class: GapClass, delivery: DeliveryId) -> String {
    format!("{}:{delivery}", class.as_str())
}

async fn redrive(
    platform: &Platform,
    settings: &Settings,
    findings: &Findings,
) -> Result<HashSet<String>, ReconcileError> {
    let mut by_event: HashMap<[u8; 16], Vec<(EndpointId, i32)>> = HashMap::new();
    for m in &findings.missing {
        by_event
            .entry(m.event_id)
            .or_default()
            .push((EndpointId(m.endpoint_id), m.config_version));
    }
    let ids: Vec<[u8; 16]> = by_event.keys().copied().collect();
    let mut fixed = HashSet::new();
    for chunk in ids.chunks(CHUNK) {
        let uuids: Vec<Uuid> = chunk.iter().map(|b| Uuid::from_bytes(*b)).collect();
        let client = platform.client().await?;
        let rows = client
            .query(
                "SELECT id, tenant_id, event_type, schema_version, object_id, object_version, occurred_at, \
                        source, commit_lsn::text, tx_ordinal, payload, payload_sha256 \
                 FROM walhook.events WHERE id = ANY($1)",
                &[&uuids],
            )
            .await
            .map_err(ReconcileError::query("read the events to re-drive"))?;
        drop(client);
        let now = Timestamp::now();
        let expires_at = now.plus(settings.deadline);
        let mut events = Vec::new();
        let mut deliveries = Vec::new();
        for r in rows {
            let Some(event) = event_of(&r) else {
                continue;
            };
            for (endpoint, version) in by_event.get(&event.id.0).into_iter().flatten() {
                deliveries.push(NewDelivery {
                    id: DeliveryId::derive(event.id, *endpoint),
                    event_id: event.id,
                    endpoint_id: *endpoint,
                    tenant_id: event.tenant_id.clone(),
                    event_type: event.event_type.clone(),
                    event_occurred_at: event.occurred_at,
                    endpoint_config_version: *version,
                    created_at: now,
                    expires_at,
                    lease_owner: None,
                    lease_expires_at: None,
                });
            }
            events.push(event);
        }
        let made = platform
            .materialize(&events, &deliveries)
            .await
            .map_err(ReconcileError::Repair)?;
        audit(platform, &deliveries, &made).await?;
        fixed.extend(
            made.into_iter()
                .map(|d| gap_id(GapClass::MissingDelivery, d)),
        );
    }
    Ok(fixed)
}

fn event_of(r: &tokio_postgres::Row) -> Option<Event> {
    let payload: Vec<u8> = r.get(10);
    let hash: Vec<u8> = r.get(11);
    Some(Event {
        id: EventId(*r.get::<_, Uuid>(0).as_bytes()),
        source: Arc::from(r.get::<_, &str>(7)),
        key: EventKey {
            commit_lsn: Lsn::from_str(r.get::<_, &str>(8)).ok()?,
            tx_ordinal: r.get::<_, i32>(9) as u32,
        },
        tenant_id: TenantId::new(r.get::<_, String>(1)).ok()?,
        event_type: EventType::new(r.get::<_, &str>(2)).ok()?,
        schema_version: r.get::<_, i32>(3) as u32,
        object_id: r.get(4),
        object_version: r.get(5),
        occurred_at: Timestamp::from_system_time(r.get(6)),
        payload: payload.into(),
        payload_hash: hash.try_into().ok()?,
    })
}

/// One audit record per re-driven delivery, in its tenant's log.
async fn audit(
    platform: &Platform,
    deliveries: &[NewDelivery],
    made: &[DeliveryId],
) -> Result<(), ReconcileError> {
    let made: HashSet<&DeliveryId> = made.iter().collect();
    let done: Vec<&NewDelivery> = deliveries.iter().filter(|d| made.contains(&d.id)).collect();
    if done.is_empty() {
        return Ok(());
    }
    let tenants: Vec<&str> = done.iter().map(|d| d.tenant_id.as_str()).collect();
    let targets: Vec<String> = done.iter().map(|d| d.id.to_string()).collect();
    let details: Vec<String> = done
        .iter()
        .map(|d| {
            serde_json::json!({
                "event_id": d.event_id.to_string(),
                "endpoint_id": d.endpoint_id.to_string(),
                "endpoint_config_version": d.endpoint_config_version,
            })
            .to_string()
        })
        .collect();
    let client = platform.client().await?;
    client
        .execute(
            "INSERT INTO walhook.audit_log (tenant_id, actor, action, target, detail) \
             SELECT t, 'walhook reconcile', 'delivery.redriven', g, d::jsonb \
             FROM unnest($1::text[], $2::text[], $3::text[]) AS u(t, g, d)",
            &[&tenants, &targets, &details],
        )
        .await
        .map_err(ReconcileError::query("audit re-driven deliveries"))?;
    Ok(())
}

async fn requeue(
    platform: &Platform,
    findings: &Findings,
) -> Result<HashSet<String>, ReconcileError> {
    let rows: Vec<Uuid> = findings
        .overdue
        .iter()
        .filter(|o| o.planned_event.is_none())
        .map(|o| Uuid::from_bytes(o.delivery_id))
        .collect();
    let plans: Vec<Uuid> = findings
        .overdue
        .iter()
        .filter_map(|o| o.planned_event.map(Uuid::from_bytes))
        .collect();
    let mut fixed = HashSet::new();
    let mut client = platform.client().await?;
    let tx = client
        .transaction()
        .await
        .map_err(ReconcileError::query("begin the re-enqueue"))?;
    // A holder that is alive again keeps what it holds. Plans held by the
    // deliveries topic stay with it: only the dispatcher of their
    // partition may send them, and it takes them when it takes the
    // partition (the finding says what to check).
    let requeued = tx
        .query(
            "INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at, lease_owner) \
             SELECT d.id, d.endpoint_id, d.created_at, now(), NULL FROM walhook.deliveries d \
             WHERE d.id = ANY($1) AND d.status = 'pending' \
             ON CONFLICT (delivery_id) DO UPDATE SET lease_owner = NULL, next_attempt_at = now() \
             WHERE walhook.pending.lease_owner IS NULL OR NOT EXISTS ( \
                 SELECT 1 FROM walhook.dispatch_nodes n \
                 WHERE n.node_id = walhook.pending.lease_owner AND n.lease_until >= now()) \
             RETURNING delivery_id",
            &[&rows],
        )
        .await
        .map_err(ReconcileError::query("re-enqueue overdue deliveries"))?;
    let requeued: Vec<Uuid> = requeued.iter().map(|r| r.get(0)).collect();
    tx.execute(
        "UPDATE walhook.deliveries SET next_attempt_at = now(), lease_owner = NULL, lease_expires_at = NULL, \
                updated_at = now() WHERE id = ANY($1)",
        &[&requeued],
    )
    .await
    .map_err(ReconcileError::query("re-enqueue overdue deliveries"))?;
    fixed.extend(
        requeued
            .iter()
            .map(|u| gap_id(GapClass::OverduePending, DeliveryId(*u.as_bytes()))),
    );
    let freed = tx
        .query(
            "UPDATE walhook.fanouts f SET lease_owner = NULL \
             WHERE f.event_id = ANY($1) AND f.lease_owner IS DISTINCT FROM $2 AND (f.lease_owner IS NULL OR NOT EXISTS ( \
                 SELECT 1 FROM walhook.dispatch_nodes n WHERE n.node_id = f.lease_owner AND n.lease_until >= now())) \
             RETURNING event_id",
            &[&plans, &walhook_pipeline::routing::TOPIC_HELD],
        )
        .await
        .map_err(ReconcileError::query("release overdue plans"))?;
    let freed: HashSet<[u8; 16]> = freed
        .iter()
        .map(|r| *r.get::<_, Uuid>(0).as_bytes())
        .collect();
    for o in &findings.overdue {
        if o.planned_event.is_some_and(|e| freed.contains(&e)) {
            fixed.insert(gap_id(GapClass::OverduePending, DeliveryId(o.delivery_id)));
        }
    }
    walhook_sql::commit!(tx, client).map_err(ReconcileError::query("commit the re-enqueue"))?;
    Ok(fixed)
}
