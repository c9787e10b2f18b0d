//! Dispatchers over the in-memory twin of the platform store, with a
//! scripted egress: a node that dies with an attempt in flight is taken
//! over once its lease lapses, and the next attempt skips a number and says
//! that the previous outcome is unknown; a node that stopped cleanly hands
//! over nothing unknown. Leases lapse in real time (a few hundred
//! milliseconds).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::egress::{EgressResult, Outbound};
use super::outcome::{AttemptOutcome, ErrorClass};
use super::{DispatchCounters, DispatchSettings, Dispatcher, egress::Egress};
use crate::delivery::{
    AttemptNote, AttemptRecord, DeliveryJob, DeliveryStatus, ObjectOrder, Trigger,
};
use crate::endpoint::{Directory, EndpointConfig, SubscriptionCache};
use crate::ids::DeliveryId;
use crate::retry::RetryPolicy;
use crate::signing::{SigningSecret, VersionedSecret};
use crate::store::contract::{ENDPOINTS, batch};
use crate::store::memory::MemoryStore;
use crate::store::{DispatchStore, FanoutStore};
use crate::time::Timestamp;

/// How the scripted egress answers.
#[derive(Clone, Copy)]
enum Answer {
    /// Never: the request stays in flight.
    Hang,
    /// A 2xx.
    Ok,
    /// A 503.
    Unavailable,
}

/// Records every request (its `webhook-id`) and answers as told.
struct Scripted {
    answer: Answer,
    seen: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(answer: Answer) -> Arc<Scripted> {
        Arc::new(Scripted {
            answer,
            seen: Mutex::default(),
        })
    }

    async fn wait_for(&self, n: usize) -> Vec<String> {
        for _ in 0..1000 {
            if self.seen.lock().len() >= n {
                return self.seen.lock().clone();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("expected {n} requests, got {:?}", self.seen.lock());
    }
}

impl Egress for Scripted {
    async fn send(&self, request: Outbound) -> EgressResult {
        let id = request.header("webhook-id").unwrap_or_default().to_owned();
        self.seen.lock().push(id);
        match self.answer {
            Answer::Hang => std::future::pending().await,
            Answer::Ok => EgressResult::bare(AttemptOutcome::Delivered { status: 200 }),
            Answer::Unavailable => EgressResult::bare(AttemptOutcome::Retryable {
                status: Some(503),
                class: ErrorClass::ServerError,
                retry_after: None,
            }),
        }
    }
}

fn directory() -> Arc<SubscriptionCache> {
    let cache = Arc::new(SubscriptionCache::default());
    let endpoints = ENDPOINTS
        .iter()
        .map(|id| EndpointConfig {
            secrets: Arc::from([VersionedSecret {
                version: 1,
                secret: SigningSecret::generate(),
            }]),
            ..EndpointConfig::for_tests(
                *id,
                crate::store::contract::TENANT,
                format!("https://127.0.0.1/{}", id.0[0]),
            )
        })
        .collect();
    cache.replace(Directory::new(1, endpoints));
    cache
}

/// A dispatcher node over `store`, fed through `jobs`.
struct Node {
    jobs: mpsc::Sender<DeliveryJob>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// The runtime of a node that can die: shutting it down ends every task
    /// the node started at once, as the end of its process would.
    runtime: Option<tokio::runtime::Runtime>,
}

impl Node {
    /// Ends the node's every task without a word to the store.
    fn die(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// A node on the test's runtime.
fn start(node: &str, store: &Arc<MemoryStore>, egress: Arc<Scripted>) -> Node {
    spawn_node(node, store, egress, None)
}

/// A node on a runtime of its own, so that it can [`Node::die`].
fn start_mortal(node: &str, store: &Arc<MemoryStore>, egress: Arc<Scripted>) -> Node {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    spawn_node(node, store, egress, Some(runtime))
}

fn spawn_node(
    node: &str,
    store: &Arc<MemoryStore>,
    egress: Arc<Scripted>,
    runtime: Option<tokio::runtime::Runtime>,
) -> Node {
    let settings = DispatchSettings {
        node_id: node.into(),
        lease: Duration::from_millis(400),
        sweep_interval: Duration::from_millis(50),
        hold_horizon: Duration::from_secs(3600),
        drain_timeout: Duration::from_millis(200),
        retry: RetryPolicy {
            base_delay: Duration::from_secs(600),
            ..RetryPolicy::default()
        },
        ..DispatchSettings::default()
    };
    let (jobs, rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let dispatcher = Dispatcher::new(
        egress,
        store.clone(),
        directory(),
        settings,
        Arc::new(DispatchCounters::default()),
    );
    let s = stop.clone();
    let run = async move {
        let _ = dispatcher.run(rx, s).await;
    };
    let task = match &runtime {
        Some(rt) => rt.spawn(run),
        None => tokio::spawn(run),
    };
    Node {
        jobs,
        stop,
        task,
        runtime,
    }
}

/// One event planned for node `a` (as fan-out in its process does); the
/// job of its delivery to the first endpoint.
async fn planned(store: &MemoryStore) -> DeliveryJob {
    let (event, deliveries) = batch(9_000, Some("a"), Timestamp::now());
    store
        .materialize(std::slice::from_ref(&event), &deliveries[..1])
        .await
        .unwrap();
    DeliveryJob::planned(&event, &deliveries[0], ObjectOrder::of(&event))
}

async fn recorded(store: &MemoryStore, n: usize) -> Vec<AttemptRecord> {
    for _ in 0..1000 {
        if store.attempt_count() >= n {
            return store.attempts();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("expected {n} attempts, got {:?}", store.attempts());
}

fn status(store: &MemoryStore, id: DeliveryId) -> Option<DeliveryStatus> {
    store.delivery(id).map(|r| r.status)
}

#[tokio::test]
async fn a_node_that_died_mid_attempt_is_taken_over_and_the_next_attempt_says_so() {
    let store = Arc::new(MemoryStore::new());
    let hang = Scripted::new(Answer::Hang);
    let a = start_mortal("a", &store, hang.clone());
    let job = planned(&store).await;
    let id = job.delivery_id;
    a.jobs.send(job).await.unwrap();
    let sent = hang.wait_for(1).await;
    // a dies with the attempt in flight: no record, no clean stop.
    a.die();
    assert_eq!(store.attempt_count(), 0);

    let ok = Scripted::new(Answer::Ok);
    let b = start("b", &store, ok.clone());
    let seen = ok.wait_for(1).await;
    assert_eq!(
        seen[0], sent[0],
        "the same webhook-id: receivers de-duplicate on it"
    );
    let attempts = recorded(&store, 1).await;
    let r = &attempts[0];
    assert_eq!(
        (r.number, r.note, r.trigger, r.status),
        (
            2,
            Some(AttemptNote::PreviousOutcomeUnknown),
            Trigger::Auto,
            DeliveryStatus::Succeeded
        ),
        "number 1 is left for the attempt a may have sent"
    );
    assert_eq!(status(&store, id), Some(DeliveryStatus::Succeeded));
    b.stop().await;
}

#[tokio::test]
async fn a_node_that_stopped_cleanly_hands_over_nothing_unknown() {
    let store = Arc::new(MemoryStore::new());
    let failing = Scripted::new(Answer::Unavailable);
    let a = start("a", &store, failing.clone());
    let job = planned(&store).await;
    let id = job.delivery_id;
    a.jobs.send(job).await.unwrap();
    let first = recorded(&store, 1).await;
    assert_eq!(
        (first[0].number, first[0].status),
        (1, DeliveryStatus::Pending)
    );
    let held = store.delivery(id).unwrap();
    assert_eq!(held.lease_owner.as_deref(), Some("a"), "a holds its retry");
    a.stop().await;

    // b takes a's held retry once a's lease lapses; a stopped cleanly, so
    // every attempt it made is recorded and nothing is unknown. The retry
    // is due in ten minutes: b holds it, it does not send it now.
    let ok = Scripted::new(Answer::Ok);
    let b = start("b", &store, ok.clone());
    let mut taken = None;
    for _ in 0..200 {
        let row = store.delivery(id).unwrap();
        if row.lease_owner.as_deref() == Some("b") {
            taken = Some(row);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let row = taken.expect("b did not take a's delivery");
    assert!(row.lease_version > held.lease_version);
    assert!(
        ok.seen.lock().is_empty(),
        "the retry went out before it was due"
    );
    b.stop().await;
    // Then a third node takes it from b: its number follows a's attempt.
    let due = store.claim_due("c", 10, &[]).await.unwrap();
    assert!(due.is_empty(), "b holds it until its lease lapses: {due:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let due = store.claim_due("c", 10, &[]).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(!due[0].after_unknown, "b stopped cleanly");
    assert_eq!(due[0].next_auto_number(), 2);
}
