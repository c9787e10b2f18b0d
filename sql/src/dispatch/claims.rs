//! Claims: due deliveries, the deliveries and plans of lapsed nodes, a
//! restarted node's own, and replay requests, each taken under a new lease.

use std::time::Duration;

use uuid::Uuid;
use walhook_pipeline::delivery::DeliveryJob;
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId};
#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;
use walhook_pipeline::time::Timestamp;

use super::uuid16;
use crate::{Platform, StoreError};

/// Fan-out's plans (deliveries with no row yet) picked by `picked` (a
/// `SELECT event_id, lease_owner AS old_owner … FOR UPDATE SKIP LOCKED`),
/// taken under a new lease by `$1`, expanded into the deliveries that have
/// no row yet (asked as a scalar subquery, which the planner never turns
/// into a join: a primary-key probe per delivery, never a scan of
/// `deliveries`), in the column order of [`Platform::jobs_from_rows`] (a plan
/// whose deliveries all have rows gives one row with a NULL delivery, so
/// that every plan taken shows); `after_unknown` says whether an attempt
/// may have gone out unrecorded.
fn plans_claim_sql(picked: &str, after_unknown: &str) -> String {
    format!(
        "WITH picked AS ({picked}), \
         taken AS ( \
            UPDATE walhook.fanouts p SET lease_version = p.lease_version + 1, lease_owner = $1 \
            FROM picked WHERE p.event_id = picked.event_id \
            RETURNING p.event_id, p.event_occurred_at, p.tenant_id, p.event_type, p.delivery_ids, \
                      p.endpoint_ids, p.config_versions, p.created_at, p.expires_at, p.lease_version, \
                      picked.old_owner) \
         SELECT x.id, taken.event_id, x.ep, taken.tenant_id, taken.event_type, e.payload, 0, taken.created_at, taken.created_at, \
                taken.expires_at, taken.lease_version, x.ver, taken.event_occurred_at, 0, {after_unknown}, \
                e.schema_version, e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal \
         FROM taken JOIN walhook.events e ON e.id = taken.event_id AND e.occurred_at = taken.event_occurred_at \
         LEFT JOIN LATERAL ( \
            SELECT * FROM unnest(taken.delivery_ids, taken.endpoint_ids, taken.config_versions) AS u(id, ep, ver) \
            WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = u.id) IS NULL) x ON true \
         ORDER BY taken.event_id"
    )
}

/// This node's plans after a restart, made before this run began (`$5`),
/// in event order after `$3`.
static RECLAIM_PLANS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    plans_claim_sql(
        "SELECT event_id, lease_owner AS old_owner FROM walhook.fanouts \
         WHERE lease_owner = $1 AND event_id > $3 AND created_at < $5 \
         ORDER BY event_id LIMIT $2 FOR UPDATE SKIP LOCKED",
        "$4::bool",
    )
});

/// Plans of nodes whose lease lapsed (`$3`), and plans nobody holds.
static CLAIM_PLANS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    plans_claim_sql(
        "SELECT event_id, lease_owner AS old_owner FROM walhook.fanouts \
         WHERE lease_owner = ANY($3::text[]) OR lease_owner IS NULL \
         ORDER BY event_id LIMIT $2 FOR UPDATE SKIP LOCKED",
        "coalesce((SELECT n.stopped_at IS NULL FROM walhook.dispatch_nodes n WHERE n.node_id = taken.old_owner), false)",
    )
});

/// Plans whose deliveries all have rows, left behind.
const TIDY_PLANS: &str = "\
DELETE FROM walhook.fanouts p \
WHERE p.created_at < now() - interval '10 seconds' \
  AND (SELECT count(*) FROM walhook.deliveries d WHERE d.id = ANY (p.delivery_ids)) >= cardinality(p.delivery_ids)";

/// Replay requests, one per delivery, of deliveries no other live node
/// holds (every attempt of a delivery goes through its holder, which keeps
/// attempt numbers unique); the manual attempt takes the next number of the
/// delivery's one sequence (automatic + manual attempts recorded).
pub(super) const CLAIM_REPLAYS: &str = "\
WITH open AS ( \
    SELECT DISTINCT ON (q.delivery_id) q.id, q.delivery_id FROM walhook.replay_requests q \
    JOIN walhook.deliveries d ON d.id = q.delivery_id \
    WHERE q.done_at IS NULL AND (q.claimed_until IS NULL OR q.claimed_until < now()) \
      AND (d.status <> 'pending' OR d.lease_owner IS NULL OR d.lease_owner = $1 \
           OR NOT EXISTS (SELECT 1 FROM walhook.dispatch_nodes n \
                          WHERE n.node_id = d.lease_owner AND n.lease_until >= now())) \
    ORDER BY q.delivery_id, q.id \
    LIMIT $2), \
claimed AS ( \
    UPDATE walhook.replay_requests q SET claimed_by = $1, \
        claimed_until = now() + $3 * interval '1 millisecond' \
    FROM open WHERE q.id = open.id AND q.done_at IS NULL RETURNING q.id, q.delivery_id) \
UPDATE walhook.deliveries d SET manual_attempt_count = d.manual_attempt_count + 1, updated_at = now() \
FROM claimed, walhook.events e \
WHERE d.id = claimed.delivery_id AND e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.event_type, e.payload, d.attempt_count, \
          d.created_at, d.next_attempt_at, d.expires_at, d.lease_version, d.endpoint_config_version, \
          d.event_occurred_at, d.manual_attempt_count, false, e.schema_version, \
          e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal, claimed.id";

/// The claim update shared by the claims: `due` names the rows and says
/// whether an unrecorded attempt may have gone out (`after_unknown`).
pub(super) const CLAIM_UPDATE: &str = "\
taken AS (UPDATE walhook.pending p SET lease_owner = $1 FROM due WHERE p.delivery_id = due.id) \
UPDATE walhook.deliveries d SET \
    lease_version = d.lease_version + 1, lease_owner = $1, lease_expires_at = NULL \
FROM due, walhook.events e \
WHERE d.id = due.id AND d.created_at = due.created AND d.status = 'pending' \
  AND e.id = d.event_id AND e.occurred_at = d.event_occurred_at \
RETURNING d.id, d.event_id, d.endpoint_id, d.tenant_id, d.event_type, e.payload, d.attempt_count, \
          d.created_at, d.next_attempt_at, d.expires_at, d.lease_version, d.endpoint_config_version, \
          d.event_occurred_at, d.manual_attempt_count, due.after_unknown, e.schema_version, \
          e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal";

/// Due, unheld deliveries (the `pending_due` index), then those of nodes
/// whose lease lapsed (the `pending_held` index). A delivery is unheld
/// only once its holder recorded it, so nothing of it is unknown. Neither
/// takes a delivery whose replay a node has claimed and not yet recorded:
/// the replay may succeed, and a success ends the automatic schedule (the
/// same transaction closes the request and ends the delivery, so once the
/// request is done there is nothing pending to claim). A probe of the
/// partial index `replay_requests_by_delivery` per candidate row.
const CLAIM_UNHELD: &str = "\
WITH due AS ( \
    SELECT delivery_id AS id, created_at AS created, false AS after_unknown FROM walhook.pending \
    WHERE lease_owner IS NULL AND next_attempt_at <= now() \
      AND endpoint_id <> ALL($3::uuid[]) \
      AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                      WHERE q.delivery_id = pending.delivery_id AND q.done_at IS NULL \
                        AND q.claimed_until >= now()) \
    ORDER BY next_attempt_at \
    LIMIT $2 \
    FOR UPDATE SKIP LOCKED), ";

/// A lapsed node that did not record a clean stop may have had attempts
/// out.
const CLAIM_ORPHANS: &str = "\
WITH due AS ( \
    SELECT p.delivery_id AS id, p.created_at AS created, coalesce(n.stopped_at IS NULL, true) AS after_unknown \
    FROM walhook.pending p LEFT JOIN walhook.dispatch_nodes n ON n.node_id = p.lease_owner \
    WHERE p.lease_owner = ANY($3::text[]) \
      AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                      WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                        AND q.claimed_until >= now()) \
    LIMIT $2 \
    FOR UPDATE OF p SKIP LOCKED), ";

const RECLAIM_OWN: &str = "\
WITH due AS ( \
    SELECT delivery_id AS id, created_at AS created, $4::bool AS after_unknown FROM walhook.pending \
    WHERE lease_owner = $1 AND delivery_id > $3 \
    ORDER BY delivery_id \
    LIMIT $2 \
    FOR UPDATE SKIP LOCKED), ";

/// [`DispatchStore::claim_due`] on Postgres.
pub(super) async fn claim_due(
    platform: &Platform,
    node: &str,
    limit: usize,
    exclude: &[EndpointId],
) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let dead: Vec<String> = client
        .query(
            "SELECT node_id FROM walhook.dispatch_nodes WHERE lease_until < now() AND node_id <> $1",
            &[&node],
        )
        .await
        .map_err(StoreError::query("look for lapsed dispatcher nodes"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Deliveries of lapsed nodes first (with rows: begun, so earlier in
    // their objects' order than their plans), then fan-out's plans of
    // lapsed nodes and plans nobody holds.
    let mut jobs = Vec::new();
    if !dead.is_empty() {
        let stmt = client
            .prepare_cached(&format!("{CLAIM_ORPHANS}{CLAIM_UPDATE}"))
            .await
            .map_err(StoreError::query("prepare the orphan claim"))?;
        let rows = client
            .query(&stmt, &[&node, &(limit as i64), &dead])
            .await
            .map_err(StoreError::query("claim the deliveries of lapsed nodes"))?;
        if !rows.is_empty() {
            tracing::warn!(nodes = ?dead, count = rows.len(), "took over deliveries of dispatcher nodes whose lease lapsed");
        }
        jobs = platform.jobs_from_rows(&client, rows, false, true).await?;
    }
    if jobs.len() < limit {
        let stmt = client
            .prepare_cached(&CLAIM_PLANS)
            .await
            .map_err(StoreError::query("prepare the claim of plans"))?;
        let rows = client
            .query(&stmt, &[&node, &((limit - jobs.len()) as i64), &dead])
            .await
            .map_err(StoreError::query("claim plans"))?;
        if !rows.is_empty() && !dead.is_empty() {
            tracing::warn!(nodes = ?dead, count = rows.len(), "took over planned deliveries of dispatcher nodes whose lease lapsed");
        }
        jobs.extend(platform.jobs_from_rows(&client, rows, false, false).await?);
    }
    if jobs.len() < limit {
        let excluded: Vec<Uuid> = exclude.iter().map(|e| uuid16(&e.0)).collect();
        let stmt = client
            .prepare_cached(&format!("{CLAIM_UNHELD}{CLAIM_UPDATE}"))
            .await
            .map_err(StoreError::query("prepare the claim"))?;
        let rows = client
            .query(&stmt, &[&node, &((limit - jobs.len()) as i64), &excluded])
            .await
            .map_err(StoreError::query("claim due deliveries"))?;
        jobs.extend(platform.jobs_from_rows(&client, rows, false, true).await?);
    }
    if !jobs.is_empty() {
        crate::answer_lost("dispatch.claim_answer_lost")?;
    }
    Ok(jobs)
}

/// [`DispatchStore::reclaim_own`] on Postgres.
pub(super) async fn reclaim_own(
    platform: &Platform,
    node: &str,
    after: Option<DeliveryId>,
    limit: usize,
    after_unknown: bool,
) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let stmt = client
        .prepare_cached(&format!("{RECLAIM_OWN}{CLAIM_UPDATE}"))
        .await
        .map_err(StoreError::query("prepare the reclaim"))?;
    let after = uuid16(&after.map_or([0; 16], |d| d.0));
    let rows = client
        .query(&stmt, &[&node, &(limit as i64), &after, &after_unknown])
        .await
        .map_err(StoreError::query("reclaim this node's deliveries"))?;
    Ok(platform.jobs_from_rows(&client, rows, false, true).await?)
}

/// [`DispatchStore::reclaim_plans`] on Postgres.
pub(super) async fn reclaim_plans(
    platform: &Platform,
    node: &str,
    after: Option<EventId>,
    limit: usize,
    after_unknown: bool,
    before: Timestamp,
) -> Result<(Vec<DeliveryJob>, Option<EventId>), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let stmt = client
        .prepare_cached(&RECLAIM_PLANS)
        .await
        .map_err(StoreError::query("prepare the reclaim of plans"))?;
    let after = uuid16(&after.map_or([0; 16], |e| e.0));
    let rows = client
        .query(
            &stmt,
            &[
                &node,
                &(limit as i64),
                &after,
                &after_unknown,
                &before.to_system_time(),
            ],
        )
        .await
        .map_err(StoreError::query("reclaim this node's plans"))?;
    // A page of `limit` plans was taken (the last event continues it),
    // or fewer (done). Plans whose deliveries all have rows give no
    // jobs; the next tidy removes them.
    let next = rows
        .last()
        .map(|r| EventId(*r.get::<_, Uuid>(1).as_bytes()));
    let events: std::collections::HashSet<Uuid> = rows.iter().map(|r| r.get(1)).collect();
    let jobs = platform.jobs_from_rows(&client, rows, false, false).await?;
    Ok((jobs, next.filter(|_| events.len() >= limit)))
}

/// [`DispatchStore::tidy_plans`] on Postgres.
pub(super) async fn tidy_plans(
    platform: &Platform,
) -> Result<u64, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    Ok(client
        .execute(TIDY_PLANS, &[])
        .await
        .map_err(StoreError::query("remove finished plans"))?)
}

/// [`DispatchStore::without_rows`] on Postgres.
pub(super) async fn without_rows(
    platform: &Platform,
    ids: &[DeliveryId],
) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let ids: Vec<Uuid> = ids.iter().map(|d| uuid16(&d.0)).collect();
    let rows = client
        .query(
            "SELECT i FROM unnest($1::uuid[]) AS i \
             WHERE (SELECT true FROM walhook.deliveries d WHERE d.id = i) IS NULL",
            &[&ids],
        )
        .await
        .map_err(StoreError::query("check jobs against the delivery rows"))?;
    Ok(rows
        .iter()
        .map(|r| DeliveryId(*r.get::<_, Uuid>(0).as_bytes()))
        .collect())
}

/// [`DispatchStore::claim_replays`] on Postgres.
pub(super) async fn claim_replays(
    platform: &Platform,
    node: &str,
    limit: usize,
    lease: Duration,
) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let stmt = client
        .prepare_cached(CLAIM_REPLAYS)
        .await
        .map_err(StoreError::query("prepare the replay claim"))?;
    let rows = client
        .query(
            &stmt,
            &[&node, &(limit as i64), &(lease.as_millis() as f64)],
        )
        .await
        .map_err(StoreError::query("claim replay requests"))?;
    Ok(platform.jobs_from_rows(&client, rows, true, true).await?)
}

/// [`DispatchStore::reject_replay`] on Postgres.
pub(super) async fn reject_replay(
    platform: &Platform,
    request_id: i64,
    reason: &str,
) -> Result<(), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    client
        .execute(
            "UPDATE walhook.replay_requests SET done_at = now(), error = $2 WHERE id = $1 AND done_at IS NULL",
            &[&request_id, &reason],
        )
        .await
        .map_err(StoreError::query("close a replay request"))?;
    Ok(())
}
