//! Dispatch's reads and writes: attempts, delivery states under leases, and
//! claims of due deliveries. [`DispatchStore`] is implemented here, each
//! method handing over to the module of its concern:
//!
//! - `record`: attempts, their tallies and the states after them;
//! - `first_rows`: the first row of a delivery fan-out only planned;
//! - `transitions`: ends and hand-backs outside attempts;
//! - `claims`: due deliveries, lapsed nodes' work, a restart's own, replays;
//! - `partition`: the same claims scoped to one partition of the
//!   deliveries topic;
//! - `jobs`: claimed rows read back as jobs;
//! - `nodes`, `health`: dispatcher nodes' leases, endpoints' health.

use std::time::Duration;

use uuid::Uuid;
use walhook_pipeline::delivery::{AttemptRecord, DeliveryJob};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId};
use walhook_pipeline::store::{DispatchStore, EndpointHealth, Release, Transition};
use walhook_pipeline::time::Timestamp;

use crate::{Platform, StoreError};

mod claims;
mod first_rows;
mod health;
mod jobs;
mod nodes;
mod partition;
mod record;
mod transitions;

/// A statement parameter.
type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);

fn uuid16(b: &[u8; 16]) -> Uuid {
    Uuid::from_bytes(*b)
}

impl DispatchStore for Platform {
    async fn record(
        &self,
        attempts: &[AttemptRecord],
    ) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
        record::record(self, attempts).await
    }

    async fn transition(
        &self,
        changes: &[Transition],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        transitions::transition(self, changes).await
    }

    async fn node_started(
        &self,
        node: &str,
        lease: Duration,
    ) -> Result<bool, walhook_pipeline::store::StoreError> {
        nodes::node_started(self, node, lease).await
    }

    async fn node_stopped(&self, node: &str) -> Result<(), walhook_pipeline::store::StoreError> {
        nodes::node_stopped(self, node).await
    }

    async fn heartbeat(
        &self,
        node: &str,
        lease: Duration,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        nodes::heartbeat(self, node, lease).await
    }

    async fn claim_due(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        claims::claim_due(self, node, limit, exclude).await
    }

    async fn reclaim_own(
        &self,
        node: &str,
        after: Option<DeliveryId>,
        limit: usize,
        after_unknown: bool,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        claims::reclaim_own(self, node, after, limit, after_unknown).await
    }

    async fn reclaim_plans(
        &self,
        node: &str,
        after: Option<EventId>,
        limit: usize,
        after_unknown: bool,
        before: Timestamp,
    ) -> Result<(Vec<DeliveryJob>, Option<EventId>), walhook_pipeline::store::StoreError> {
        claims::reclaim_plans(self, node, after, limit, after_unknown, before).await
    }

    async fn cancellations_after(
        &self,
        after: Option<i64>,
        limit: usize,
    ) -> Result<(Vec<DeliveryId>, i64), walhook_pipeline::store::StoreError> {
        Ok(self.read_cancellations(after, limit).await?)
    }

    async fn tidy_plans(&self) -> Result<u64, walhook_pipeline::store::StoreError> {
        claims::tidy_plans(self).await
    }

    async fn expire_tallies(&self) -> Result<u64, walhook_pipeline::store::StoreError> {
        Ok(self.drop_old_tallies().await?)
    }

    async fn clean_queues(&self) -> Result<(), walhook_pipeline::store::StoreError> {
        let client = self.client().await?;
        // A table locked by someone else is skipped this time; a role that
        // does not own the tables gets a warning from the server, not an
        // error (autovacuum still cleans them then, only later).
        client
            .batch_execute("VACUUM (SKIP_LOCKED, TRUNCATE false) walhook.fanouts, walhook.pending")
            .await
            .map_err(StoreError::query("vacuum the queue tables"))?;
        Ok(())
    }

    async fn release(
        &self,
        releases: &[Release],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        transitions::release(self, releases).await
    }

    async fn claim_scoped(
        &self,
        node: &str,
        limit: usize,
        exclude: &[EndpointId],
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        partition::claim_scoped(self, node, limit, exclude, scope).await
    }

    async fn claim_replays_scoped(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        partition::claim_replays_scoped(self, node, limit, lease, scope).await
    }

    async fn take_partition(
        &self,
        node: &str,
        scope: &walhook_pipeline::routing::Scope,
    ) -> Result<Option<Vec<DeliveryJob>>, walhook_pipeline::store::StoreError> {
        partition::take_partition(self, node, scope).await
    }

    async fn without_rows(
        &self,
        ids: &[DeliveryId],
    ) -> Result<Vec<DeliveryId>, walhook_pipeline::store::StoreError> {
        claims::without_rows(self, ids).await
    }

    async fn claim_replays(
        &self,
        node: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DeliveryJob>, walhook_pipeline::store::StoreError> {
        claims::claim_replays(self, node, limit, lease).await
    }

    async fn reject_replay(
        &self,
        request_id: i64,
        reason: &str,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        claims::reject_replay(self, request_id, reason).await
    }

    async fn record_verification(
        &self,
        endpoint: EndpointId,
        challenge: &str,
        result: Result<(), String>,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self
            .record_verification_result(endpoint, challenge, result)
            .await?)
    }

    async fn disable_endpoint(
        &self,
        endpoint: EndpointId,
        reason: &str,
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        Ok(self
            .disable_endpoint_for(endpoint, reason, "walhook")
            .await?)
    }

    async fn save_health(
        &self,
        all: &[EndpointHealth],
    ) -> Result<(), walhook_pipeline::store::StoreError> {
        health::save_health(self, all).await
    }

    async fn load_health(
        &self,
    ) -> Result<Vec<EndpointHealth>, walhook_pipeline::store::StoreError> {
        health::load_health(self).await
    }
}
