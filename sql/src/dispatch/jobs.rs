//! Claimed rows read back as jobs; a row that cannot be read is ended with
//! an incident rather than held forever.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{DeliveryJob, ObjectOrder, Replay};
use walhook_pipeline::event::{EventKey, EventType};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use walhook_pipeline::time::Timestamp;

use super::Param;
use crate::{Platform, StoreError};

impl Platform {
    /// Runs `sql` (prepared once per connection) and reads its rows as
    /// jobs ([`Platform::jobs_from_rows`]); `what` names it in errors.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn claimed(
        &self,
        client: &deadpool_postgres::Object,
        sql: &str,
        params: &[Param<'_>],
        what: &'static str,
        replays: bool,
        materialized: bool,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let stmt = client
            .prepare_cached(sql)
            .await
            .map_err(StoreError::query(what))?;
        let rows = client
            .query(&stmt, params)
            .await
            .map_err(StoreError::query(what))?;
        self.jobs_from_rows(client, rows, replays, materialized)
            .await
    }
}

impl Platform {
    /// Jobs from rows of `CLAIM_UPDATE` or `CLAIM_REPLAYS` (the latter
    /// with the replay request id last). A row that cannot be read back
    /// (its tenant or type no longer valid) would otherwise stay claimed by
    /// this node forever: it is ended as failed, with an incident.
    pub(super) async fn jobs_from_rows(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        rows: Vec<tokio_postgres::Row>,
        replays: bool,
        materialized: bool,
    ) -> Result<Vec<DeliveryJob>, StoreError> {
        let mut jobs = Vec::with_capacity(rows.len());
        let mut unreadable: Vec<(Uuid, i64, String)> = Vec::new();
        for r in rows {
            // A plan taken whose deliveries all have rows: nothing to do.
            let Some(id) = r.get::<_, Option<Uuid>>(0) else {
                continue;
            };
            let tenant: String = r.get(3);
            let etype: String = r.get(4);
            let (tenant_id, event_type) = match (TenantId::new(tenant), EventType::new(&etype)) {
                (Ok(t), Ok(e)) => (t, e),
                (Err(e), _) | (_, Err(e)) => {
                    unreadable.push((id, r.get(10), e.to_string()));
                    continue;
                }
            };
            let payload: Vec<u8> = r.get(5);
            let ts = |i: usize| Timestamp::from_system_time(r.get::<_, SystemTime>(i));
            let manual_attempt_count = r.get::<_, i32>(13).max(0) as u32;
            let attempt_count = r.get::<_, i32>(6).max(0) as u32;
            jobs.push(DeliveryJob {
                delivery_id: DeliveryId(*id.as_bytes()),
                event_id: EventId(*r.get::<_, Uuid>(1).as_bytes()),
                endpoint_id: EndpointId(*r.get::<_, Uuid>(2).as_bytes()),
                tenant_id,
                event_type,
                payload: payload.into(),
                attempt_count,
                manual_attempt_count,
                after_unknown: r.get(14),
                materialized,
                created_at: ts(7),
                next_attempt_at: ts(8),
                expires_at: ts(9),
                lease_version: r.get(10),
                endpoint_config_version: r.get(11),
                event_occurred_at: ts(12),
                schema_version: r.get::<_, i32>(15).max(1) as u32,
                replay: replays.then(|| Replay {
                    request_id: r.get(19),
                    number: attempt_count + manual_attempt_count,
                }),
                order: r.get::<_, Option<String>>(16).map(|object| ObjectOrder {
                    object_id: object.into(),
                    key: EventKey {
                        commit_lsn: Lsn(r.get::<_, i64>(17) as u64),
                        tx_ordinal: r.get::<_, i32>(18) as u32,
                    },
                }),
            });
        }
        if !unreadable.is_empty() {
            self.end_unreadable(client, &unreadable, replays).await?;
        }
        Ok(jobs)
    }

    async fn end_unreadable(
        &self,
        client: &impl deadpool_postgres::GenericClient,
        rows: &[(Uuid, i64, String)],
        replays: bool,
    ) -> Result<(), StoreError> {
        use walhook_pipeline::incident::{IncidentKind, Stage, StageIncident};
        let ids: Vec<Uuid> = rows.iter().map(|r| r.0).collect();
        let leases: Vec<i64> = rows.iter().map(|r| r.1).collect();
        if replays {
            client
                .execute(
                    "UPDATE walhook.replay_requests SET done_at = now(), \
                       error = 'the delivery cannot be read back; see the incidents' \
                     WHERE delivery_id = ANY($1::uuid[]) AND done_at IS NULL",
                    &[&ids],
                )
                .await
                .map_err(StoreError::query(
                    "close replay requests of unreadable deliveries",
                ))?;
        } else {
            client
                .execute(
                    "WITH ended AS ( \
                       UPDATE walhook.deliveries d SET status = 'failed', last_error_class = $3, \
                         lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
                       FROM unnest($1::uuid[], $2::int8[]) AS x(id, lease) \
                       WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
                       RETURNING d.id) \
                     DELETE FROM walhook.pending p USING ended WHERE p.delivery_id = ended.id",
                    &[
                        &ids,
                        &leases,
                        &walhook_pipeline::delivery::EndReason::Unreadable.as_str(),
                    ],
                )
                .await
                .map_err(StoreError::query("end unreadable deliveries"))?;
        }
        let incidents: Vec<StageIncident> = rows
            .iter()
            .map(|(id, _, why)| {
                let delivery = DeliveryId(*id.as_bytes());
                StageIncident::new(
                    Stage::Dispatch,
                    IncidentKind::UnreadableDelivery,
                    &delivery.to_string(),
                    &format!(
                        "delivery {delivery} could not be read back after it was claimed ({why}); it was \
                         ended as failed instead of being held forever"
                    ),
                )
            })
            .collect();
        for i in &incidents {
            i.log();
        }
        self.upsert_incidents(client, &incidents).await?;
        Ok(())
    }
}
