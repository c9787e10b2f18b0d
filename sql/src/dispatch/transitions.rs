//! State changes that are not attempts: deliveries ended by the dispatcher
//! (expired, endpoint gone or disabled) and deliveries handed back unheld.

use std::time::SystemTime;

use uuid::Uuid;
use walhook_pipeline::delivery::{DeliveryStatus, LastError};
#[cfg(doc)]
use walhook_pipeline::store::DispatchStore;
use walhook_pipeline::store::{Release, Transition};
use walhook_pipeline::time::Timestamp;

use super::uuid16;
use crate::{Platform, StoreError};

use super::first_rows::FreshRows;

/// [`DispatchStore::transition`] on Postgres.
pub(super) async fn transition(
    platform: &Platform,
    changes: &[Transition],
) -> Result<(), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let (fresh, changes): (Vec<&Transition>, Vec<&Transition>) =
        changes.iter().partition(|c| c.first_write.is_some());
    if !fresh.is_empty() {
        // Ended before their first attempt: their row says how.
        let now = Timestamp::now();
        let mut first = FreshRows::default();
        for c in &fresh {
            if let Some(w) = &c.first_write {
                first.push(
                    c.delivery_id,
                    w,
                    c.status,
                    0,
                    now,
                    None,
                    c.lease_version,
                    None,
                    Some(LastError::Ended(c.reason)),
                );
            }
        }
        first
            .write(platform, &client, "end planned deliveries")
            .await?;
    }
    if changes.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = changes.iter().map(|c| uuid16(&c.delivery_id.0)).collect();
    let statuses: Vec<&str> = changes.iter().map(|c| c.status.as_str()).collect();
    let leases: Vec<i64> = changes.iter().map(|c| c.lease_version).collect();
    let reasons: Vec<&str> = changes.iter().map(|c| c.reason.as_str()).collect();
    client
        .execute(
            "WITH ended AS ( \
               UPDATE walhook.deliveries d SET status = x.status::walhook.delivery_status, \
                 last_error_class = x.reason, lease_owner = NULL, lease_expires_at = NULL, updated_at = now() \
               FROM unnest($1::uuid[], $2::text[], $3::int8[], $4::text[]) AS x(id, status, lease, reason) \
               WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
               RETURNING d.id) \
             DELETE FROM walhook.pending p USING ended WHERE p.delivery_id = ended.id",
            &[&ids, &statuses, &leases, &reasons],
        )
        .await
        .map_err(StoreError::query("end deliveries"))?;
    Ok(())
}

/// [`DispatchStore::release`] on Postgres.
pub(super) async fn release(
    platform: &Platform,
    releases: &[Release],
) -> Result<(), walhook_pipeline::store::StoreError> {
    let client = platform.client().await?;
    let (fresh, releases): (Vec<&Release>, Vec<&Release>) =
        releases.iter().partition(|r| r.first_write.is_some());
    if !fresh.is_empty() {
        // Handed back before their first attempt: their row is written
        // pending and unheld, due at the given time.
        let mut first = FreshRows::default();
        for r in &fresh {
            if let Some(w) = &r.first_write {
                first.push(
                    r.delivery_id,
                    w,
                    DeliveryStatus::Pending,
                    0,
                    r.not_before,
                    None,
                    r.lease_version,
                    None,
                    None,
                );
            }
        }
        first
            .write(platform, &client, "hand planned deliveries back")
            .await?;
    }
    if releases.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = releases.iter().map(|r| uuid16(&r.delivery_id.0)).collect();
    let leases: Vec<i64> = releases.iter().map(|r| r.lease_version).collect();
    let times: Vec<SystemTime> = releases
        .iter()
        .map(|r| r.not_before.to_system_time())
        .collect();
    client
        .execute(
            "WITH handed_back AS ( \
               UPDATE walhook.deliveries d SET lease_owner = NULL, lease_expires_at = NULL, \
                 next_attempt_at = greatest(d.next_attempt_at, x.t), updated_at = now() \
               FROM unnest($1::uuid[], $2::int8[], $3::timestamptz[]) AS x(id, lease, t) \
               WHERE d.id = x.id AND d.lease_version = x.lease AND d.status = 'pending' \
               RETURNING d.id, d.next_attempt_at) \
             UPDATE walhook.pending p SET lease_owner = NULL, next_attempt_at = h.next_attempt_at \
             FROM handed_back h WHERE p.delivery_id = h.id",
            &[&ids, &leases, &times],
        )
        .await
        .map_err(StoreError::query("hand deliveries back"))?;
    Ok(())
}
