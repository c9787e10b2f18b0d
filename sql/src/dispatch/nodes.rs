//! Dispatcher nodes: their start (and whether the previous run stopped
//! cleanly), their lease and their clean stop.

use std::time::Duration;

#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;

use crate::{Platform, StoreError};

/// [`DispatchStore::node_started`] on Postgres.
pub(super) async fn node_started(
    platform: &Platform,
    node: &str,
    lease: Duration,
) -> Result<bool, walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    // The previous row's `stopped_at`, read before this start clears it.
    let row = client
        .query_one(
            "WITH before AS (SELECT stopped_at FROM walhook.dispatch_nodes WHERE node_id = $1), \
             up AS (INSERT INTO walhook.dispatch_nodes (node_id, lease_until, started_at) \
                    VALUES ($1, now() + $2 * interval '1 millisecond', now()) \
                    ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, \
                      started_at = now(), stopped_at = NULL, updated_at = now()) \
             SELECT coalesce((SELECT stopped_at IS NOT NULL FROM before), \
                             NOT EXISTS (SELECT 1 FROM before))",
            &[&node, &(lease.as_millis() as f64)],
        )
        .await
        .map_err(StoreError::query("register the dispatcher node"))?;
    // A new process holds none of the replays its predecessor claimed:
    // they may be claimed again at once (by this node or another).
    client
        .execute(
            "UPDATE walhook.replay_requests SET claimed_until = NULL \
             WHERE done_at IS NULL AND claimed_by = $1 AND claimed_until IS NOT NULL",
            &[&node],
        )
        .await
        .map_err(StoreError::query(
            "release the replays of the node's previous run",
        ))?;
    Ok(row.get(0))
}

/// [`DispatchStore::node_stopped`] on Postgres.
pub(super) async fn node_stopped(
    platform: &Platform,
    node: &str,
) -> Result<(), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    client
        .execute(
            "UPDATE walhook.dispatch_nodes SET stopped_at = now(), updated_at = now() WHERE node_id = $1",
            &[&node],
        )
        .await
        .map_err(StoreError::query("record the node's clean stop"))?;
    Ok(())
}

/// [`DispatchStore::heartbeat`] on Postgres.
pub(super) async fn heartbeat(
    platform: &Platform,
    node: &str,
    lease: Duration,
) -> Result<(), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    client
        .execute(
            "INSERT INTO walhook.dispatch_nodes (node_id, lease_until) \
             VALUES ($1, now() + $2 * interval '1 millisecond') \
             ON CONFLICT (node_id) DO UPDATE SET lease_until = EXCLUDED.lease_until, stopped_at = NULL, updated_at = now()",
            &[&node, &(lease.as_millis() as f64)],
        )
        .await
        .map_err(StoreError::query("renew the node's lease"))?;
    // Replays this node claimed and still holds (one may wait long
    // behind an open circuit) stay its own while it lives: a lapsed
    // claim would be claimed again and sent twice.
    client
        .execute(
            "UPDATE walhook.replay_requests SET claimed_until = now() + $2 * interval '1 millisecond' \
             WHERE done_at IS NULL AND claimed_by = $1 AND claimed_until IS NOT NULL",
            &[&node, &(lease.as_millis() as f64)],
        )
        .await
        .map_err(StoreError::query("renew the node's replay claims"))?;
    Ok(())
}
