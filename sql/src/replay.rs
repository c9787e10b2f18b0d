//! Manual replays: asked for by the API, carried out by the dispatcher.

use uuid::Uuid;
use walhook_pipeline::ids::DeliveryId;

use crate::{Platform, StoreError};

impl Platform {
    /// Asks for a manual attempt of `delivery`; returns the request's id.
    /// The dispatcher sends it (same `webhook-id`, same bytes, signed with
    /// the endpoint's current secrets) within a sweep interval. Fails with
    /// [`StoreError::Schema`] when the delivery does not exist.
    pub async fn request_replay(
        &self,
        delivery: DeliveryId,
        actor: &str,
    ) -> Result<i64, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "INSERT INTO walhook.replay_requests (delivery_id, requested_by) \
                 SELECT id, $2 FROM walhook.deliveries WHERE id = $1 RETURNING id",
                &[&Uuid::from_bytes(delivery.0), &actor],
            )
            .await
            .map_err(StoreError::query("request a replay"))?
            .ok_or_else(|| StoreError::Schema(format!("delivery {delivery} does not exist")))?;
        Ok(row.get(0))
    }
}
