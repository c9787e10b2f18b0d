//! The first row of a delivery that fan-out only planned: written with its
//! first attempt's state, or when it ends or is handed back before one.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{DeliveryStatus, FirstWrite, LastError};
use walhook_pipeline::ids::DeliveryId;
use walhook_pipeline::time::Timestamp;

use super::uuid16;
use crate::{Platform, StoreError};

/// The CTEs `first_rows`, `first_pending`, `made`, `done`: the first rows of deliveries that
/// had none (planned by fan-out), for parameters from `$first` on (16
/// arrays), written only under their plan's current lease; their pending
/// rows; and the plans whose deliveries now all have rows, removed. `first_rows`'
/// rows are counted once per event (`made`), not once per plan: a count
/// inside the plan's condition would scan all of `first_rows` for every plan, work
/// that grows with the square of the batch, and batches grow when
/// dispatch falls behind. A plan whose deliveries all came in this batch
/// (the common case) is done without reading `deliveries`; otherwise the
/// rows from before are counted by primary-key probes (they and the new
/// rows are disjoint: the statement's snapshot shows none of `first_rows`).
/// Plans are read by primary-key probes (`LATERAL … LIMIT 1`, a subquery
/// the planner cannot turn into a join, and `= ANY (ARRAY(…))`, an index
/// condition), never by a join the planner may choose: `fanouts` grows
/// when dispatch falls behind, batches grow with it, and past a few tens
/// of thousands of plans a planner's join hashed the whole queue for
/// every batch, so the further behind, the slower each batch
/// (docs/performance.md, "The issue's baseline, and a queue hashed
/// whole"). `careful` adds
/// `ON CONFLICT DO NOTHING` (a row written by another writer is left as
/// it is and counts as stale).
pub(super) fn fresh_sql(first: usize, careful: bool) -> String {
    format!(
        "first_rows AS ( \
            INSERT INTO walhook.deliveries (id, event_id, endpoint_id, tenant_id, event_type, event_occurred_at, \
                endpoint_config_version, status, attempt_count, next_attempt_at, expires_at, lease_version, \
                lease_owner, lease_expires_at, last_http_status, last_error_class, created_at, updated_at) \
            SELECT x.id, x.ev, x.ep, x.tenant, x.etype, x.occ, x.ver, x.status::walhook.delivery_status, \
                   x.attempts, x.next_at, x.expires, x.lease, \
                   CASE WHEN x.hold IS NULL THEN NULL ELSE coalesce(x.holder, f.lease_owner) END, \
                   x.hold, x.http, x.err, \
                   x.created, now() \
            FROM {} AS x \
            CROSS JOIN LATERAL (SELECT f.lease_owner FROM walhook.fanouts f \
                                WHERE f.event_id = x.ev AND f.lease_version = x.lease LIMIT 1) f \
            {} \
            RETURNING id, event_id, endpoint_id, created_at, next_attempt_at, lease_owner, status), \
        first_pending AS ( \
            INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at, lease_owner) \
            SELECT id, endpoint_id, created_at, next_attempt_at, lease_owner FROM first_rows WHERE status = 'pending'), \
        made AS ( \
            SELECT event_id, count(*) AS fresh FROM first_rows GROUP BY event_id), \
        done AS ( \
            DELETE FROM walhook.fanouts p USING made m \
            WHERE p.event_id = ANY (ARRAY(SELECT event_id FROM made)) AND p.event_id = m.event_id \
              AND CASE WHEN m.fresh >= cardinality(p.delivery_ids) THEN true \
                       ELSE m.fresh + (SELECT count(*) FROM walhook.deliveries d \
                                      WHERE d.id = ANY (p.delivery_ids)) \
                            >= cardinality(p.delivery_ids) END)",
        crate::unnested(
            first,
            &[
                &crate::PLANNED_DELIVERY[..],
                &[
                    ("status", "text"),
                    ("attempts", "int4"),
                    ("next_at", "timestamptz"),
                    ("expires", "timestamptz"),
                    ("created", "timestamptz"),
                    ("hold", "timestamptz"),
                    ("lease", "int8"),
                    ("http", "int4"),
                    ("err", "text"),
                    ("holder", "text")
                ],
            ]
            .concat()
        ),
        if careful {
            "ON CONFLICT DO NOTHING"
        } else {
            ""
        }
    )
}

/// First rows alone (transitions and hand-backs of deliveries that had
/// none), gap-filling.
static FRESH_ONLY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("WITH {} SELECT id FROM first_rows", fresh_sql(1, true)));

/// One first row of a delivery that had none: the 17 arrays of
/// [`fresh_sql`].
#[derive(Default)]
pub(super) struct FreshRows<'a> {
    ids: Vec<Uuid>,
    events: Vec<Uuid>,
    endpoints: Vec<Uuid>,
    tenants: Vec<&'a str>,
    types: Vec<&'a str>,
    occurred: Vec<SystemTime>,
    versions: Vec<i32>,
    statuses: Vec<&'static str>,
    attempts: Vec<i32>,
    next: Vec<SystemTime>,
    expires: Vec<SystemTime>,
    created: Vec<SystemTime>,
    hold: Vec<Option<SystemTime>>,
    leases: Vec<i64>,
    http: Vec<Option<i32>>,
    errs: Vec<Option<&'static str>>,
    holders: Vec<Option<&'a str>>,
}

impl<'a> FreshRows<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn push(
        &mut self,
        id: DeliveryId,
        w: &'a FirstWrite,
        status: DeliveryStatus,
        attempts: u32,
        next: Timestamp,
        hold: Option<Timestamp>,
        lease: i64,
        http: Option<u16>,
        err: Option<LastError>,
    ) {
        self.ids.push(uuid16(&id.0));
        self.events.push(uuid16(&w.event_id.0));
        self.endpoints.push(uuid16(&w.endpoint_id.0));
        self.tenants.push(w.tenant_id.as_str());
        self.types.push(w.event_type.as_str());
        self.occurred.push(w.event_occurred_at.to_system_time());
        self.versions.push(w.config_version);
        self.statuses.push(status.as_str());
        self.attempts.push(attempts as i32);
        self.next.push(next.to_system_time());
        self.expires.push(w.expires_at.to_system_time());
        self.created.push(w.created_at.to_system_time());
        self.hold.push(hold.map(|t| t.to_system_time()));
        self.leases.push(lease);
        self.http.push(http.map(i32::from));
        self.errs.push(err.map(LastError::as_str));
        self.holders.push(w.holder.as_deref());
    }

    /// When the rows were made: the days whose partitions they need.
    pub(super) fn created_days(&self) -> impl Iterator<Item = Timestamp> + '_ {
        self.created.iter().map(|t| Timestamp::from_system_time(*t))
    }

    /// Writes these rows alone ([`FRESH_ONLY`]), gap-filling.
    pub(super) async fn write(
        &self,
        platform: &Platform,
        client: &deadpool_postgres::Object,
        what: &'static str,
    ) -> Result<(), StoreError> {
        platform
            .ensure_partitions(client, "deliveries", self.created_days())
            .await?;
        let stmt = client
            .prepare_cached(&FRESH_ONLY)
            .await
            .map_err(StoreError::query("prepare the first rows"))?;
        client
            .query(&stmt, &self.params())
            .await
            .map_err(StoreError::query(what))?;
        Ok(())
    }

    pub(super) fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 17] {
        [
            &self.ids,
            &self.events,
            &self.endpoints,
            &self.tenants,
            &self.types,
            &self.occurred,
            &self.versions,
            &self.statuses,
            &self.attempts,
            &self.next,
            &self.expires,
            &self.created,
            &self.hold,
            &self.leases,
            &self.http,
            &self.errs,
            &self.holders,
        ]
    }
}
