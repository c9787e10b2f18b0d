//! Fan-out on the embedded log and the in-memory twin of the platform
//! store: what it plans, what it sends, what it sets aside, and that the
//! events offset moves only once the batch is stored.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{FanoutCounters, FanoutOperator, FanoutSettings};
use crate::delivery::DeliveryJob;
use crate::endpoint::{EndpointConfig, RefreshSettings, SubscriptionCache};
use crate::event::{Event, EventKey, EventType};
use crate::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use crate::incident::IncidentKind;
use crate::log::embedded::EmbeddedLog;
use crate::log::{Consumer, Log, Producer, Receipt, TopicSpec};
use crate::store::memory::{MemoryEndpoints, MemoryStore};
use crate::time::Timestamp;

const NODE: &str = "node-1";

fn endpoint(n: u8, tenant: &str, types: &[&str], enabled: bool) -> EndpointConfig {
    EndpointConfig {
        event_types: types.iter().map(|t| EventType::new(t).unwrap()).collect(),
        enabled,
        config_version: i32::from(n),
        ..EndpointConfig::for_tests(
            EndpointId([n; 16]),
            tenant,
            format!("https://127.0.0.1/{n}"),
        )
    }
}

fn event(n: u64, tenant: &str, event_type: &str) -> Event {
    Event {
        id: EventId::derive("shop", Lsn(n), 0, "rule"),
        source: Arc::from("shop"),
        key: EventKey {
            commit_lsn: Lsn(n),
            tx_ordinal: 0,
        },
        tenant_id: TenantId::new(tenant).unwrap(),
        event_type: EventType::new(event_type).unwrap(),
        schema_version: 1,
        object_id: Some(format!("obj-{n}")),
        object_version: None,
        occurred_at: Timestamp(1_796_000_000_000_000 + n as i64),
        payload: bytes::Bytes::from(format!("{{\"n\":{n}}}")),
        payload_hash: [0; 32],
    }
}

/// acme: 1 gets everything, 2 `invoice.paid`, 3 `order.shipped`, 4
/// `invoice.paid` but disabled; globex: 5 everything.
fn endpoints() -> Vec<EndpointConfig> {
    vec![
        endpoint(1, "acme", &[], true),
        endpoint(2, "acme", &["invoice.paid"], true),
        endpoint(3, "acme", &["order.shipped"], true),
        endpoint(4, "acme", &["invoice.paid"], false),
        endpoint(5, "globex", &[], true),
    ]
}

/// Fan-out running over an embedded log into the twin.
struct Stage {
    log: EmbeddedLog,
    store: Arc<MemoryStore>,
    counters: Arc<FanoutCounters>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), super::FanoutError>>,
    jobs: <EmbeddedLog as Log>::Consumer<DeliveryJob>,
}

impl Stage {
    async fn start(store: MemoryStore) -> Stage {
        let log = EmbeddedLog::new([
            TopicSpec {
                name: "events".into(),
                partitions: 1,
                capacity: 1024,
                durable_groups: vec!["fanout".into()],
            },
            TopicSpec {
                name: "deliveries".into(),
                partitions: 1,
                capacity: 1024,
                durable_groups: vec![],
            },
        ]);
        let store = Arc::new(store);
        let stop = CancellationToken::new();
        let directory = Arc::new(SubscriptionCache::default());
        let source = MemoryEndpoints::new(1, endpoints());
        directory.load(&source).await.unwrap();
        tokio::spawn({
            let (directory, stop) = (directory.clone(), stop.clone());
            async move {
                let settings = RefreshSettings {
                    interval: Duration::from_secs(3600),
                    min_reload_gap: Duration::ZERO,
                };
                directory.refresh(source, settings, stop).await
            }
        });
        let operator = FanoutOperator::new(
            log.consumer::<Event>("events", 0, "fanout").await.unwrap(),
            log.producer::<DeliveryJob>("deliveries").unwrap(),
            store.clone(),
            directory,
            FanoutSettings {
                batch_size: 100,
                linger: Duration::ZERO,
                deadline: Duration::from_secs(24 * 3600),
                lease_owner: Some(NODE.into()),
                lease: Duration::from_secs(30),
                route: None,
            },
        );
        let counters = Arc::new(FanoutCounters::default());
        let task = tokio::spawn(operator.run(counters.clone(), stop.clone()));
        let jobs = log
            .consumer::<DeliveryJob>("deliveries", 0, "dispatch")
            .await
            .unwrap();
        Stage {
            log,
            store,
            counters,
            stop,
            task,
            jobs,
        }
    }

    /// Sends `events` in one batch and waits until fan-out committed past
    /// them (the events group is the topic's durable group).
    async fn send(&self, events: &[Event]) {
        let producer = self.log.producer::<Event>("events").unwrap();
        let receipt: Receipt = producer
            .send_all(
                events
                    .iter()
                    .map(|e| (e.id.0.to_vec(), e.clone()))
                    .collect(),
            )
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), receipt)
            .await
            .expect("fan-out did not commit past the events")
            .unwrap();
    }

    /// Every job fan-out sent so far.
    async fn jobs(&mut self) -> Vec<DeliveryJob> {
        let mut all = Vec::new();
        while let Ok(Ok(batch)) =
            tokio::time::timeout(Duration::from_millis(100), self.jobs.poll(100)).await
        {
            if batch.is_empty() {
                break;
            }
            all.extend(batch.into_iter().map(|r| r.message));
        }
        all
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

fn ids(jobs: &[DeliveryJob]) -> Vec<DeliveryId> {
    let mut ids: Vec<DeliveryId> = jobs.iter().map(|j| j.delivery_id).collect();
    ids.sort();
    ids
}

fn deliveries_of(event: &Event, endpoints: &[u8]) -> Vec<DeliveryId> {
    let mut ids: Vec<DeliveryId> = endpoints
        .iter()
        .map(|n| DeliveryId::derive(event.id, EndpointId([*n; 16])))
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn each_event_reaches_each_subscribed_endpoint_once() {
    let mut stage = Stage::start(MemoryStore::new()).await;
    let paid = event(1, "acme", "invoice.paid");
    let shipped = event(2, "acme", "order.shipped");
    let other = event(3, "globex", "invoice.paid");
    // The first event twice in one batch (a log that delivers at least
    // once): planned once.
    stage
        .send(&[paid.clone(), shipped.clone(), paid.clone(), other.clone()])
        .await;

    let jobs = stage.jobs().await;
    let mut want = [
        deliveries_of(&paid, &[1, 2]),
        deliveries_of(&shipped, &[1, 3]),
        deliveries_of(&other, &[5]),
    ]
    .concat();
    want.sort();
    assert_eq!(
        ids(&jobs),
        want,
        "subscribed, enabled endpoints of the event's tenant, once each"
    );
    let job = jobs
        .iter()
        .find(|j| j.delivery_id == DeliveryId::derive(paid.id, EndpointId([2; 16])))
        .unwrap();
    assert_eq!(job.payload, paid.payload, "the event's bytes, unchanged");
    assert_eq!(
        job.endpoint_config_version, 2,
        "the config version decided with"
    );
    assert!(!job.materialized && job.lease_version == 1 && job.attempt_count == 0);
    assert_eq!(
        job.order.as_ref().map(|o| (&*o.object_id, o.key)),
        Some(("obj-1", paid.key)),
        "the object and its place in commit order"
    );

    assert_eq!(stage.store.event_count(), 3);
    let (planned, holder) = stage.store.plan(paid.id).unwrap();
    assert_eq!(planned, deliveries_of(&paid, &[1, 2]));
    assert_eq!(
        holder.as_deref(),
        Some(NODE),
        "made leased to this node's dispatcher"
    );
    assert_eq!(stage.counters.events.load(Ordering::Relaxed), 3);
    assert_eq!(stage.counters.deliveries.load(Ordering::Relaxed), 5);
    assert!(stage.store.incidents().is_empty());
    stage.stop().await;
}

#[tokio::test]
async fn events_read_again_send_nothing_twice() {
    let mut stage = Stage::start(MemoryStore::new()).await;
    let events = [
        event(10, "acme", "invoice.paid"),
        event(11, "acme", "order.shipped"),
    ];
    stage.send(&events).await;
    assert_eq!(stage.jobs().await.len(), 4);
    // The same events again, as after a crash before the offset moved on
    // some logs: a later run's plan is the start-up reclaim's, and its
    // deliveries are not sent again.
    stage.send(&events).await;
    assert!(
        stage.jobs().await.is_empty(),
        "the events' deliveries went to dispatch twice"
    );
    assert_eq!(stage.store.event_count(), 2);
    assert_eq!(stage.store.plan_count(), 2);
    stage.stop().await;
}

#[tokio::test]
async fn a_store_that_fails_for_a_while_loses_nothing() {
    let store = MemoryStore::new();
    store.fail_next(3);
    let mut stage = Stage::start(store).await;
    let e = event(20, "acme", "invoice.paid");
    stage.send(std::slice::from_ref(&e)).await;
    assert_eq!(ids(&stage.jobs().await), deliveries_of(&e, &[1, 2]));
    assert!(stage.store.plan(e.id).is_some());
    assert!(
        stage.store.incidents().is_empty(),
        "a transient failure is not an incident"
    );
    stage.stop().await;
}

#[tokio::test]
async fn an_event_the_store_refuses_is_set_aside_and_the_rest_is_stored() {
    let store = MemoryStore::new();
    let events: Vec<Event> = (30..35).map(|n| event(n, "acme", "invoice.paid")).collect();
    store.refuse(events[3].id);
    let mut stage = Stage::start(store).await;
    stage.send(&events).await;

    let jobs = stage.jobs().await;
    let mut want: Vec<DeliveryId> = events
        .iter()
        .filter(|e| e.id != events[3].id)
        .flat_map(|e| deliveries_of(e, &[1, 2]))
        .collect();
    want.sort();
    assert_eq!(ids(&jobs), want, "every other event fanned out");
    assert!(stage.store.event(events[3].id).is_none());
    let incidents = stage.store.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].kind, IncidentKind::UnstorableEvent);
    assert_eq!(incidents[0].subject, events[3].id.to_string());
    assert!(
        incidents[0].detail.contains("2 deliveries") && incidents[0].detail.contains("refuse"),
        "{}",
        incidents[0].detail
    );
    assert_eq!(stage.counters.incidents.load(Ordering::Relaxed), 1);
    stage.stop().await;
}

#[tokio::test]
async fn events_of_an_unknown_tenant_are_stored_and_counted_in_one_incident() {
    let mut stage = Stage::start(MemoryStore::new()).await;
    let ghosts: Vec<Event> = (40..43)
        .map(|n| event(n, "ghost", "invoice.paid"))
        .collect();
    stage.send(&ghosts).await;
    assert!(
        stage.jobs().await.is_empty(),
        "no endpoint can receive them"
    );
    assert_eq!(stage.store.event_count(), 3, "stored all the same");
    assert_eq!(stage.store.plan_count(), 0);
    let incidents = stage.store.incidents();
    assert_eq!(incidents.len(), 1, "{incidents:?}");
    assert_eq!(incidents[0].kind, IncidentKind::UnknownTenant);
    assert_eq!(incidents[0].subject, "ghost");
    assert_eq!(incidents[0].occurrences, 3);
    assert!(incidents[0].detail.contains("POST /v1/tenants"));
    stage.stop().await;
}
