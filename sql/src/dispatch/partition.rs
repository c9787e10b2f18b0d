//! Claims scoped to one partition of the deliveries topic (dispatch by
//! endpoint): what an earlier holder of the partition held, what is due in
//! it, its replays, and its planned deliveries when it is taken over.

use std::time::Duration;

use uuid::Uuid;
use walhook_pipeline::delivery::DeliveryJob;
use walhook_pipeline::ids::EndpointId;
#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;

use super::{Param, uuid16};
use crate::{Platform, StoreError};

use super::claims::{CLAIM_REPLAYS, CLAIM_UPDATE};

/// That the delivery (`delivery`, to `endpoint`: SQL expressions) is in
/// the deliveries partition `$first`, of `$first + 1` partitions, with the
/// sharded endpoints and their shards in `$first + 2` and `$first + 3`
/// (`walhook.delivery_partition`, migration 0026).
fn in_partition(endpoint: &str, delivery: &str, first: usize) -> String {
    format!(
        "walhook.delivery_partition({endpoint}, {delivery}, ${n}::int4, \
            coalesce((SELECT s.k FROM unnest(${e}::uuid[], ${k}::int4[]) AS s(e, k) WHERE s.e = {endpoint}), 1)) \
         = ${first}::int4",
        n = first + 1,
        e = first + 2,
        k = first + 3,
    )
}

/// Deliveries of one partition held by any other node (an earlier holder
/// of the partition) that stopped cleanly or whose lease lapsed (it may
/// still be sending until then: `[dispatch] lease` outlasts a request):
/// `$1` node, `$2` limit, `$3..$6` the partition.
static CLAIM_SCOPED_HELD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH due AS ( \
            SELECT p.delivery_id AS id, p.created_at AS created, \
                   coalesce(n.stopped_at IS NULL, true) AS after_unknown \
            FROM walhook.pending p LEFT JOIN walhook.dispatch_nodes n ON n.node_id = p.lease_owner \
            WHERE p.lease_owner IS NOT NULL AND p.lease_owner <> $1 AND {} \
              AND (n.node_id IS NULL OR n.stopped_at IS NOT NULL OR n.lease_until < now()) \
              AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                              WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                                AND q.claimed_until >= now()) \
            LIMIT $2 \
            FOR UPDATE OF p SKIP LOCKED), {CLAIM_UPDATE}",
        in_partition("p.endpoint_id", "p.delivery_id", 3)
    )
});

/// Due deliveries of one partition that no node holds: `$1` node, `$2`
/// limit, `$3..$6` the partition, `$7` endpoints left alone.
static CLAIM_SCOPED_UNHELD: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH due AS ( \
            SELECT p.delivery_id AS id, p.created_at AS created, false AS after_unknown \
            FROM walhook.pending p \
            WHERE p.lease_owner IS NULL AND p.next_attempt_at <= now() \
              AND p.endpoint_id <> ALL($7::uuid[]) AND {} \
              AND NOT EXISTS (SELECT 1 FROM walhook.replay_requests q \
                              WHERE q.delivery_id = p.delivery_id AND q.done_at IS NULL \
                                AND q.claimed_until >= now()) \
            ORDER BY p.next_attempt_at \
            LIMIT $2 \
            FOR UPDATE OF p SKIP LOCKED), {CLAIM_UPDATE}",
        in_partition("p.endpoint_id", "p.delivery_id", 3)
    )
});

/// [`CLAIM_REPLAYS`] of one partition's deliveries (`$4..$7`).
static CLAIM_REPLAYS_SCOPED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let at = "ORDER BY q.delivery_id, q.id";
    assert!(CLAIM_REPLAYS.contains(at));
    CLAIM_REPLAYS.replacen(
        at,
        &format!("AND {} {at}", in_partition("d.endpoint_id", "d.id", 4)),
        1,
    )
});

/// The planned deliveries of one partition (`$1..$4`) held by the
/// deliveries topic that have no row yet, as jobs (the columns of
/// [`plans_claim_sql`]), the plans left as they are; `after_unknown` when
/// the partition's latest other dispatcher node (`$6`, a `LIKE` pattern,
/// other than `$5`) did not stop cleanly.
static TAKE_PARTITION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT x.id, f.event_id, x.ep, f.tenant_id, f.event_type, e.payload, 0, f.created_at, f.created_at, \
                f.expires_at, f.lease_version, x.ver, f.event_occurred_at, 0, \
                coalesce((SELECT n.stopped_at IS NULL FROM walhook.dispatch_nodes n \
                          WHERE n.node_id LIKE $6 AND n.node_id <> $5 \
                          ORDER BY n.started_at DESC LIMIT 1), false), \
                e.schema_version, e.object_id, (e.commit_lsn - '0/0'::pg_lsn)::int8, e.tx_ordinal \
         FROM walhook.fanouts f \
         JOIN walhook.events e ON e.id = f.event_id AND e.occurred_at = f.event_occurred_at \
         CROSS JOIN LATERAL ( \
            SELECT * FROM unnest(f.delivery_ids, f.endpoint_ids, f.config_versions) AS u(id, ep, ver) \
            WHERE {} \
              AND (SELECT true FROM walhook.deliveries d WHERE d.id = u.id) IS NULL) x \
         WHERE f.lease_owner = '{}' \
         ORDER BY f.event_id, x.id",
        in_partition("u.ep", "u.id", 1),
        walhook_pipeline::routing::TOPIC_HELD
    )
});

/// The parameters that name a partition for [`in_partition`].
struct PartitionParams {
    partition: i32,
    partitions: i32,
    endpoints: Vec<Uuid>,
    shards: Vec<i32>,
}

impl PartitionParams {
    fn of(scope: &walhook_pipeline::routing::Scope) -> Self {
        PartitionParams {
            partition: scope.partition as i32,
            partitions: scope.partitions as i32,
            endpoints: scope.shards.iter().map(|(e, _)| uuid16(&e.0)).collect(),
            shards: scope.shards.iter().map(|(_, k)| *k as i32).collect(),
        }
    }

    /// A scoped statement's parameters: `before`, the partition's four,
    /// then `after`.
    fn around<'a>(&'a self, before: &[Param<'a>], after: &[Param<'a>]) -> Vec<Param<'a>> {
        let own: [Param<'a>; 4] = [
            &self.partition,
            &self.partitions,
            &self.endpoints,
            &self.shards,
        ];
        before
            .iter()
            .copied()
            .chain(own)
            .chain(after.iter().copied())
            .collect()
    }
}

/// [`DispatchStore::claim_scoped`] on Postgres.
pub(super) async fn claim_scoped(
    platform: &Platform,
    node: &str,
    limit: usize,
    exclude: &[EndpointId],
    scope: &walhook_pipeline::routing::Scope,
) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let part = PartitionParams::of(scope);
    // What an earlier holder of the partition held first (begun, so
    // earlier in their objects' order), then what is due.
    let mut jobs = platform
        .claimed(
            &client,
            &CLAIM_SCOPED_HELD,
            &part.around(&[&node, &(limit as i64)], &[]),
            "claim the partition's deliveries other nodes held",
            false,
            true,
        )
        .await?;
    if !jobs.is_empty() {
        tracing::warn!(
            partition = scope.partition,
            count = jobs.len(),
            "took over deliveries of this partition that an earlier holder held"
        );
    }
    if jobs.len() < limit {
        let excluded: Vec<Uuid> = exclude.iter().map(|e| uuid16(&e.0)).collect();
        let rest = (limit - jobs.len()) as i64;
        jobs.extend(
            platform
                .claimed(
                    &client,
                    &CLAIM_SCOPED_UNHELD,
                    &part.around(&[&node, &rest], &[&excluded]),
                    "claim the partition's due deliveries",
                    false,
                    true,
                )
                .await?,
        );
    }
    if !jobs.is_empty() {
        crate::answer_lost("dispatch.claim_answer_lost")?;
    }
    Ok(jobs)
}

/// [`DispatchStore::claim_replays_scoped`] on Postgres.
pub(super) async fn claim_replays_scoped(
    platform: &Platform,
    node: &str,
    limit: usize,
    lease: Duration,
    scope: &walhook_pipeline::routing::Scope,
) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let part = PartitionParams::of(scope);
    let (limit, lease) = (limit as i64, lease.as_millis() as f64);
    Ok(platform
        .claimed(
            &client,
            &CLAIM_REPLAYS_SCOPED,
            &part.around(&[&node, &limit, &lease], &[]),
            "claim replay requests of a partition",
            true,
            true,
        )
        .await?)
}

/// [`DispatchStore::take_partition`] on Postgres.
pub(super) async fn take_partition(
    platform: &Platform,
    node: &str,
    scope: &walhook_pipeline::routing::Scope,
) -> Result<Option<Vec<DeliveryJob>>, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let pattern = format!(
        "%{}%",
        walhook_pipeline::routing::node_suffix(scope.partition)
    );
    // An earlier holder's dispatcher that neither stopped nor lapsed
    // may still send what it read: not yet.
    let running: Vec<String> = client
        .query(
            "SELECT node_id FROM walhook.dispatch_nodes \
             WHERE node_id LIKE $1 AND node_id <> $2 AND stopped_at IS NULL AND lease_until >= now()",
            &[&pattern, &node],
        )
        .await
        .map_err(StoreError::query(
            "look for earlier dispatchers of the partition",
        ))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if !running.is_empty() {
        tracing::info!(partition = scope.partition, nodes = ?running, "the partition's planned deliveries wait until its earlier dispatcher stops or its lease lapses");
        return Ok(None);
    }
    let part = PartitionParams::of(scope);
    Ok(Some(
        platform
            .claimed(
                &client,
                &TAKE_PARTITION,
                &part.around(&[], &[&node, &pattern]),
                "read the partition's planned deliveries",
                false,
                false,
            )
            .await?,
    ))
}
