//! A whole process on the twins: the capture source, the embedded log, the
//! platform store in memory and an egress that answers 200. A commit is
//! delivered and confirmed; a scheduled task that ends, and capture
//! failing for good, each stop the process with an error naming them.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::process::{CaptureRole, Process, ProcessError, ProcessSettings, Task, WorkerRole};
use super::workers::{Share, events_topic};
use crate::capture::SourceErrorKind;
use crate::capture::source::memory::{MemorySource, TENANT};
use crate::dispatch::DispatchSettings;
use crate::dispatch::egress::{Egress, EgressResult, Outbound};
use crate::dispatch::outcome::AttemptOutcome;
use crate::endpoint::{EndpointConfig, SubscriptionCache};
use crate::fanout::FanoutSettings;
use crate::ids::EndpointId;
use crate::log::embedded::EmbeddedLog;
use crate::signing::{SigningSecret, VersionedSecret};
use crate::store::memory::MemoryStore;
use crate::supervise::TaskError;

/// Answers 200 and keeps every request's `webhook-id`.
#[derive(Default)]
struct Accepting(Mutex<Vec<String>>);

impl Egress for Accepting {
    async fn send(&self, request: Outbound) -> EgressResult {
        let id = request.header("webhook-id").unwrap_or_default().to_owned();
        self.0.lock().push(id);
        EgressResult::bare(AttemptOutcome::Delivered { status: 200 })
    }
}

type TwinProcess = Process<EmbeddedLog, MemoryStore, Accepting, Arc<MemorySource>>;

struct Parts {
    source_name: &'static str,
    egress: Arc<Accepting>,
    store: Arc<MemoryStore>,
}

/// A process that captures from `source`, fans out over two partitions
/// and dispatches to one endpoint of the twin's tenant.
async fn process(source: Arc<MemorySource>, tasks: Vec<Task>) -> (TwinProcess, Parts) {
    let store = Arc::new(MemoryStore::new());
    store.set_endpoints(
        1,
        vec![EndpointConfig {
            secrets: Arc::from([VersionedSecret {
                version: 1,
                secret: SigningSecret::generate(),
            }]),
            ..EndpointConfig::for_tests(EndpointId([4; 16]), TENANT, "https://127.0.0.1/hook")
        }],
    );
    let directory = Arc::new(SubscriptionCache::default());
    directory.load(&*store).await.unwrap();
    let egress = Arc::new(Accepting::default());
    let process = Process {
        log: EmbeddedLog::new([events_topic("events", 2, 100)]),
        store: store.clone(),
        egress: Some(egress.clone()),
        directory: Some(directory),
        capture: Some(CaptureRole {
            source,
            slot: "twin".into(),
        }),
        workers: Some(WorkerRole {
            share: Share::Fixed(vec![0, 1]),
            node_id: "node-1".into(),
            route: None,
        }),
        dispatch: None,
        settings: ProcessSettings {
            events_topic: "events".into(),
            deliveries_topic: "deliveries".into(),
            deliveries_partitions: 2,
            capacity: 100,
            fanout: FanoutSettings {
                batch_size: 100,
                linger: Duration::from_millis(5),
                deadline: Duration::from_secs(3600),
                lease_owner: None,
                lease: Duration::from_secs(30),
                route: None,
            },
            dispatch: DispatchSettings {
                sweep_interval: Duration::from_millis(50),
                drain_timeout: Duration::from_millis(500),
                ..DispatchSettings::default()
            },
        },
        metrics: None,
        tasks,
    };
    (
        process,
        Parts {
            source_name: "twin",
            egress,
            store,
        },
    )
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen within 10 s");
}

#[tokio::test]
async fn a_commit_is_delivered_confirmed_and_checkpointed_and_shutdown_ends_cleanly() {
    let source = Arc::new(MemorySource::new("twin"));
    let end = source.commit(&["order-1"]);
    let (process, parts) = process(
        source.clone(),
        vec![Task::new(
            "a schedule",
            |stop: CancellationToken| async move {
                stop.cancelled().await;
            },
        )],
    )
    .await;
    let shutdown = CancellationToken::new();
    let running = process.start(shutdown.clone()).await.unwrap();
    until("the delivery", || parts.egress.0.lock().len() == 1).await;
    // Fan-out committed the event, so the source confirmed its end.
    until("the confirmation", || source.confirmed() >= end).await;
    until("the checkpoint", || {
        parts.store.capture().checkpoint(parts.source_name) >= Some(end)
    })
    .await;
    let counters = running.counters.clone();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), running.wait())
        .await
        .expect("the process stops within 10 s")
        .unwrap();
    use std::sync::atomic::Ordering::Relaxed;
    assert_eq!(counters.capture.events.load(Relaxed), 1);
    assert_eq!(parts.store.attempt_count(), 1);
}

#[tokio::test]
async fn a_scheduled_task_that_ends_stops_the_process_with_its_name() {
    let (process, _parts) = process(
        Arc::new(MemorySource::new("twin")),
        vec![Task::new("the archive schedule", |_stop| async {})],
    )
    .await;
    let running = process.start(CancellationToken::new()).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), running.wait())
        .await
        .expect("the process stops by itself")
        .unwrap_err();
    assert!(
        matches!(&e, ProcessError::Task(TaskError::Ended { task }) if task == "the archive schedule"),
        "{e:?}"
    );
}

#[tokio::test]
async fn capture_failing_for_good_stops_the_process() {
    let source = Arc::new(MemorySource::new("twin"));
    source.fail_next_run(SourceErrorKind::Definite);
    let (process, _parts) = process(source, Vec::new()).await;
    let running = process.start(CancellationToken::new()).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), running.wait())
        .await
        .expect("the process stops by itself")
        .unwrap_err();
    assert!(matches!(e, ProcessError::Capture(_)), "{e:?}");
    assert_eq!(e.to_string(), "capture stopped");
}
