//! `webhook.test` events: `POST /v1/webhook-endpoints/{id}/test`.
//!
//! A test event goes the normal way from the platform database on: the API
//! stores the event and its one delivery in one transaction (pending, due
//! now, unleased), and the dispatcher's sweep claims, signs and sends it
//! like any other, recording attempts. So that reconciliation stays
//! consistent, a test event says what it is: source `walhook.api` (no
//! capture source has that name, so no captured change is expected behind
//! it), commit LSN `0/0`, and exactly one expected delivery, to the endpoint
//! it was sent to, made with the event (never by fan-out: the type is not
//! produced by any capture rule, and endpoints subscribe to it only
//! implicitly through this call).

use std::sync::Arc;
use std::time::Duration;

use walhook_pipeline::canonical::JsonWriter;
use walhook_pipeline::delivery::NewDelivery;
use walhook_pipeline::event::{Envelope, Event, EventKey, EventType};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use walhook_pipeline::time::Timestamp;

/// The event type of test events.
pub const TEST_EVENT_TYPE: &str = "webhook.test";

/// The source name of events the API makes.
pub const API_SOURCE: &str = "walhook.api";

/// A test event for `endpoint` and its delivery, due at `now`.
pub fn build(
    tenant: &TenantId,
    endpoint: EndpointId,
    config_version: i32,
    now: Timestamp,
    deadline: Duration,
) -> (Event, NewDelivery) {
    let id = EventId(rand::random());
    let event_type = EventType::new(TEST_EVENT_TYPE).expect("a valid type name");
    let endpoint_text = endpoint.to_string();
    let (payload, payload_hash) = Envelope {
        id,
        event_type: &event_type,
        tenant_id: tenant,
        object_id: Some(&endpoint_text),
        object_version_json: None,
        occurred_at: now,
        schema_version: 1,
        unavailable: &[],
    }
    .write(|w: &mut JsonWriter<'_>| {
        w.begin_object();
        w.key("endpoint_id");
        w.string(&endpoint_text);
        w.key("message");
        w.string("This is a test event sent by walhook on request.");
        w.end_object();
    });
    let event = Event {
        id,
        source: Arc::from(API_SOURCE),
        key: EventKey {
            commit_lsn: Lsn::ZERO,
            tx_ordinal: 0,
        },
        tenant_id: tenant.clone(),
        event_type: event_type.clone(),
        schema_version: 1,
        object_id: Some(endpoint_text),
        object_version: None,
        occurred_at: now,
        payload,
        payload_hash,
    };
    let delivery = NewDelivery {
        id: DeliveryId::derive(id, endpoint),
        event_id: id,
        endpoint_id: endpoint,
        tenant_id: tenant.clone(),
        event_type,
        event_occurred_at: now,
        endpoint_config_version: config_version,
        created_at: now,
        expires_at: now.plus(deadline),
        lease_owner: None,
        lease_expires_at: None,
    };
    (event, delivery)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_a_canonical_envelope() {
        let tenant = TenantId::new("acme").unwrap();
        let (event, delivery) = build(
            &tenant,
            EndpointId([1; 16]),
            3,
            Timestamp(1_795_947_104_000_000),
            Duration::from_secs(60),
        );
        let body: serde_json::Value = serde_json::from_slice(&event.payload).unwrap();
        assert_eq!(body["type"], "webhook.test");
        assert_eq!(body["tenant_id"], "acme");
        assert_eq!(body["id"], event.id.to_string());
        assert_eq!(body["data"]["endpoint_id"], EndpointId([1; 16]).to_string());
        assert_eq!(
            delivery.id,
            DeliveryId::derive(event.id, EndpointId([1; 16]))
        );
        assert_eq!(delivery.endpoint_config_version, 3);
        assert!(delivery.lease_owner.is_none());
    }
}
