//! Dispatch scenarios against real HTTP receivers on loopback, with the real
//! egress and a manual clock: backoffs, Retry-After and the 24 h deadline
//! pass in milliseconds while the requests are real. The store is the
//! in-memory twin of the platform store (`walhook_pipeline::store::memory`,
//! held to the same contract as the Postgres store), on the same clock.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use walhook_connectors::http::{EgressSettings, HttpEgress};
use walhook_devkit::receiver::{Behaviour, Receiver};
use walhook_pipeline::delivery::{
    AttemptRecord, DeliveryJob, DeliveryStatus, ObjectOrder, OutcomeKind,
};
use walhook_pipeline::dispatch::clock::{Clock, ManualClock};
use walhook_pipeline::dispatch::outcome::ErrorClass;
use walhook_pipeline::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use walhook_pipeline::endpoint::{
    DeliveryOrder, Directory, EndpointConfig, RefreshSettings, SubscriptionCache,
};
use walhook_pipeline::event::{EventKey, EventType};
use walhook_pipeline::ids::{DeliveryId, EndpointId, EventId, Lsn, TenantId};
use walhook_pipeline::retry::RetryPolicy;
use walhook_pipeline::signing::SigningSecret;
use walhook_pipeline::store::memory::{MemoryEndpoints, MemoryStore};
use walhook_pipeline::time::Timestamp;

struct Harness {
    receiver: Receiver,
    clock: Arc<ManualClock>,
    store: Arc<MemoryStore>,
    /// The dispatcher's node id: the holder of the jobs sent to it.
    node: String,
    jobs: mpsc::Sender<DeliveryJob>,
    stop: CancellationToken,
    endpoint: EndpointId,
    /// The directory the dispatcher reads, and the endpoint's config in it.
    directory: Arc<SubscriptionCache>,
    config: EndpointConfig,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn new(path: &str, request_timeout: Duration) -> Harness {
        Self::tuned(path, request_timeout, |_| {}).await
    }

    async fn tuned(
        path: &str,
        request_timeout: Duration,
        tune: impl FnOnce(&mut DispatchSettings),
    ) -> Harness {
        let receiver = Receiver::start().await.unwrap();
        let secret = SigningSecret::generate();
        receiver.set_secrets(path, vec![secret.expose_text()]);
        let endpoint = EndpointId([9; 16]);
        let directory = Arc::new(SubscriptionCache::default());
        let config = EndpointConfig {
            secrets: std::sync::Arc::from([walhook_pipeline::signing::VersionedSecret {
                version: 1,
                secret,
            }]),
            ..EndpointConfig::for_tests(endpoint, "acme", receiver.url(path))
        };
        directory.replace(Directory::new(1, vec![config.clone()]));
        let clock = ManualClock::new(Timestamp::now());
        let store = Arc::new(MemoryStore::with_clock(Clock::Manual(clock.clone())));
        let egress = HttpEgress::new(EgressSettings {
            request_timeout,
            connect_timeout: Duration::from_secs(2),
            allow_http_loopback: true,
            ..EgressSettings::default()
        })
        .unwrap();
        let mut settings = DispatchSettings {
            retry: RetryPolicy {
                base_delay: Duration::from_secs(1),
                max_delay: Duration::from_secs(3600),
                max_attempts: 1000,
                deadline: Duration::from_secs(24 * 3600),
                retry_after_cap: Duration::from_secs(300),
                slow_down_floor: Duration::from_secs(2),
                ..RetryPolicy::default()
            },
            hold_horizon: Duration::from_secs(48 * 3600),
            clock: Clock::Manual(clock.clone()),
            breaker: walhook_pipeline::dispatch::breaker::BreakerConfig {
                failure_threshold: 1000,
                ..Default::default()
            },
            ..DispatchSettings::default()
        };
        tune(&mut settings);
        let node = settings.node_id.clone();
        let (jobs, rx) = mpsc::channel(16);
        let stop = CancellationToken::new();
        let dispatcher = Dispatcher::new(
            Arc::new(egress),
            store.clone(),
            directory.clone(),
            settings,
            Arc::new(DispatchCounters::default()),
        );
        let s = stop.clone();
        let task = tokio::spawn(async move { dispatcher.run(rx, s).await.unwrap() });
        Harness {
            receiver,
            clock,
            store,
            node,
            jobs,
            stop,
            endpoint,
            directory,
            config,
            task,
        }
    }

    async fn send(&self, n: u8) -> DeliveryId {
        self.send_job(self.job(n)).await
    }

    async fn send_job(&self, job: DeliveryJob) -> DeliveryId {
        let id = job.delivery_id;
        self.store.seed(&job, Some(&self.node));
        self.jobs.send(job).await.unwrap();
        id
    }

    /// Delivery `n` of an event of its own, due now.
    fn job(&self, n: u8) -> DeliveryJob {
        let id = DeliveryId([n; 16]);
        let now = self.clock.now();
        DeliveryJob {
            delivery_id: id,
            event_id: EventId([n; 16]),
            endpoint_id: self.endpoint,
            tenant_id: TenantId::new("acme").unwrap(),
            event_type: EventType::new("invoice.paid").unwrap(),
            payload: bytes::Bytes::from(format!("{{\"n\":{n}}}")),
            attempt_count: 0,
            manual_attempt_count: 0,
            after_unknown: false,
            materialized: true,
            created_at: now,
            next_attempt_at: now,
            expires_at: now.plus(Duration::from_secs(24 * 3600)),
            lease_version: 1,
            endpoint_config_version: 1,
            event_occurred_at: now,
            schema_version: 1,
            replay: None,
            order: None,
        }
    }

    async fn requests(&self, n: usize) {
        assert!(
            self.receiver
                .wait_until(Duration::from_secs(10), |r| r.len() >= n)
                .await,
            "expected {n} requests, got {}",
            self.receiver.count()
        );
    }

    /// Waits for the dispatcher to record `n` attempts.
    async fn recorded(&self, n: usize) -> Vec<AttemptRecord> {
        for _ in 0..500 {
            if self.store.attempt_count() >= n {
                return self.store.attempts();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "expected {n} recorded attempts, got {}",
            self.store.attempt_count()
        );
    }

    async fn quiet_for(&self, d: Duration) -> usize {
        let before = self.receiver.count();
        tokio::time::sleep(d).await;
        assert_eq!(self.receiver.count(), before, "an attempt went out early");
        before
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

#[tokio::test]
async fn a_500_then_a_200_retries_with_the_same_webhook_id() {
    let h = Harness::new("a", Duration::from_secs(5)).await;
    h.receiver
        .set_behaviour("a", Behaviour::FailFirst { n: 1, status: 500 });
    let id = h.send(1).await;
    h.requests(1).await;
    let first = h.recorded(1).await;
    assert_eq!(
        (first[0].outcome, first[0].http_status, first[0].error_class),
        (
            OutcomeKind::Retryable,
            Some(500),
            Some(ErrorClass::ServerError)
        )
    );
    assert_eq!(first[0].status, DeliveryStatus::Pending);
    // Full jitter: the first retry is within [0, base] = [0, 1 s].
    assert!(first[0].next_attempt_at.since(first[0].finished_at) <= Duration::from_secs(1));
    h.clock.advance(Duration::from_secs(1));
    h.requests(2).await;
    let all = h.recorded(2).await;
    assert_eq!(all[1].status, DeliveryStatus::Succeeded);
    assert_eq!(all[1].number, 2);
    let got = h.receiver.received();
    assert_eq!(got[0].webhook_id, got[1].webhook_id);
    assert_eq!(got[0].webhook_id, id.to_string());
    assert!(got.iter().all(|r| r.verified == Some(true)));
    h.stop().await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_honoured() {
    let h = Harness::new("b", Duration::from_secs(5)).await;
    h.receiver.set_behaviour(
        "b",
        Behaviour::RetryAfter {
            status: 429,
            secs: 120,
        },
    );
    h.send(2).await;
    h.requests(1).await;
    let first = h.recorded(1).await;
    assert_eq!(first[0].error_class, Some(ErrorClass::RateLimited));
    assert_eq!(
        first[0].next_attempt_at.since(first[0].finished_at),
        Duration::from_secs(120)
    );
    h.receiver.set_behaviour("b", Behaviour::Status(200));
    h.clock.advance(Duration::from_secs(119));
    h.quiet_for(Duration::from_millis(300)).await;
    h.clock.advance(Duration::from_secs(2));
    h.requests(2).await;
    assert_eq!(h.recorded(2).await[1].status, DeliveryStatus::Succeeded);
    h.stop().await;
}

#[tokio::test]
async fn a_410_fails_the_delivery_and_disables_the_endpoint() {
    let h = Harness::new("c", Duration::from_secs(5)).await;
    h.receiver.set_behaviour("c", Behaviour::Status(410));
    h.send(3).await;
    let rec = h.recorded(1).await;
    assert_eq!(
        (rec[0].status, rec[0].outcome),
        (DeliveryStatus::Failed, OutcomeKind::Gone)
    );
    for _ in 0..100 {
        if !h.store.disabled().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let disabled = h.store.disabled();
    assert_eq!(disabled.len(), 1);
    assert!(disabled[0].1.contains("410"));
    h.clock.advance(Duration::from_secs(3600));
    h.quiet_for(Duration::from_millis(200)).await;
    h.stop().await;
}

#[tokio::test]
async fn a_redirect_is_not_followed() {
    let h = Harness::new("d", Duration::from_secs(5)).await;
    let target = h.receiver.url("internal-target");
    h.receiver.set_behaviour(
        "d",
        Behaviour::Redirect {
            status: 307,
            location: target,
        },
    );
    h.send(4).await;
    let rec = h.recorded(1).await;
    assert_eq!(
        (rec[0].status, rec[0].error_class, rec[0].http_status),
        (
            DeliveryStatus::Failed,
            Some(ErrorClass::Redirect),
            Some(307)
        )
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        h.receiver.received().iter().all(|r| r.path == "d"),
        "the redirect was followed"
    );
    h.stop().await;
}

#[tokio::test]
async fn a_receiver_that_stalls_past_the_timeout_is_retried_as_unknown() {
    let h = Harness::new("e", Duration::from_millis(500)).await;
    h.receiver.set_behaviour(
        "e",
        Behaviour::Delay {
            wait: Duration::from_secs(3),
            status: 200,
        },
    );
    h.send(5).await;
    let rec = h.recorded(1).await;
    assert_eq!(
        (rec[0].status, rec[0].error_class, rec[0].http_status),
        (DeliveryStatus::Pending, Some(ErrorClass::Timeout), None)
    );
    // The floor after a timeout: not before 2 s.
    assert!(rec[0].next_attempt_at.since(rec[0].finished_at) >= Duration::from_secs(2));
    h.receiver.set_behaviour("e", Behaviour::Status(204));
    h.clock.advance(Duration::from_secs(1));
    h.quiet_for(Duration::from_millis(200)).await;
    h.clock.advance(Duration::from_secs(600));
    let rec = h.recorded(2).await;
    assert_eq!(rec[1].status, DeliveryStatus::Succeeded);
    h.stop().await;
}

#[tokio::test]
async fn the_24_hour_deadline_ends_retries() {
    let h = Harness::new("f", Duration::from_secs(5)).await;
    h.receiver.set_behaviour("f", Behaviour::Status(503));
    let start = h.clock.now();
    let id = h.send(6).await;
    // Let virtual hours pass; attempts follow the backoff until the deadline.
    let mut last = 0;
    for _ in 0..400 {
        h.clock.advance(Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let done = h.store.delivery(id).map(|r| r.status);
        if done == Some(DeliveryStatus::Exhausted) {
            break;
        }
        last = h.store.attempt_count();
    }
    let attempts = h.store.attempts();
    let end = attempts.last().unwrap();
    assert_eq!(
        end.status,
        DeliveryStatus::Exhausted,
        "after {last} attempts"
    );
    let deadline = start.plus(Duration::from_secs(24 * 3600));
    assert!(
        attempts.iter().all(|a| a.started_at <= deadline),
        "an attempt after the deadline"
    );
    assert!(
        attempts.len() < 1000,
        "the attempt cap, not the deadline, ended it"
    );
    assert!(
        attempts.len() > 10,
        "too few attempts in 24 h: {}",
        attempts.len()
    );
    let count = h.receiver.count();
    h.clock.advance(Duration::from_secs(48 * 3600));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        h.receiver.count(),
        count,
        "attempts continued after exhaustion"
    );
    h.stop().await;
}

#[tokio::test]
async fn an_endpoint_failing_for_too_long_is_disabled() {
    let h = Harness::tuned("g", Duration::from_secs(5), |s| {
        s.disable_after = Duration::from_secs(6 * 3600)
    })
    .await;
    h.receiver.set_behaviour("g", Behaviour::Status(500));
    h.send(7).await;
    h.recorded(1).await;
    // Five virtual hours of failures: still enabled.
    for _ in 0..30 {
        h.clock.advance(Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        h.store.disabled().is_empty(),
        "disabled before six hours of failure"
    );
    for _ in 0..30 {
        h.clock.advance(Duration::from_secs(600));
        tokio::time::sleep(Duration::from_millis(5)).await;
        if !h.store.disabled().is_empty() {
            break;
        }
    }
    let disabled = h.store.disabled();
    assert_eq!(disabled.len(), 1, "not disabled after six hours of failure");
    assert!(
        disabled[0].1.contains("failed without a success since"),
        "{}",
        disabled[0].1
    );
    h.stop().await;
}

/// An endpoint switched to per-object ordering: the first deliveries
/// planned under the new directory are already kept in order. The
/// dispatcher must see the endpoint as ordered when it takes those jobs,
/// not only when it next starts attempts (found under load: an object's
/// first delivery went out beside the ones behind it, unnoted).
#[tokio::test]
async fn the_first_jobs_after_ordering_is_switched_on_wait_in_order() {
    let h = Harness::new("ordered", Duration::from_secs(10)).await;
    // The dispatcher runs on the directory without ordering.
    h.send(9).await;
    h.requests(1).await;
    h.recorded(1).await;
    h.receiver.set_behaviour(
        "ordered",
        Behaviour::FailMatching {
            needle: r#""n":1"#.into(),
            status: 500,
        },
    );
    let mut ordered = h.config.clone();
    ordered.ordering = DeliveryOrder::PerObject;
    h.directory.replace(Directory::new(2, vec![ordered]));
    for n in 1..=3u8 {
        let mut job = h.job(n);
        job.order = Some(ObjectOrder {
            object_id: Arc::from("invoice-7"),
            key: EventKey {
                commit_lsn: Lsn(0x1000),
                tx_ordinal: u32::from(n),
            },
        });
        h.send_job(job).await;
    }
    h.requests(2).await;
    // The object's first delivery failed and waits for its retry (the
    // clock is manual): the two behind it must not go out meanwhile.
    assert_eq!(h.quiet_for(Duration::from_secs(1)).await, 2);
    let second = &h.receiver.received()[1];
    assert!(
        String::from_utf8_lossy(&second.body).contains(r#""n":1"#),
        "the object's first delivery goes first: {:?}",
        second.body
    );
    h.stop().await;
}

/// A delivery claimed from Postgres for an endpoint created after this
/// node last read the directory (planned by another node): the directory
/// is read again before the delivery is placed, so it goes out instead of
/// being cancelled as if its endpoint had been deleted. The refresher
/// here reads only when asked.
#[tokio::test]
async fn a_claimed_delivery_of_an_endpoint_unknown_here_waits_for_the_directory() {
    let h = Harness::new("old", Duration::from_secs(10)).await;
    let mut created = h.config.clone();
    created.id = EndpointId([10; 16]);
    created.url = h.receiver.url("new");
    let source = MemoryEndpoints::new(2, vec![h.config.clone(), created.clone()]);
    let stop = CancellationToken::new();
    let refresher = tokio::spawn({
        let (directory, stop) = (h.directory.clone(), stop.clone());
        async move {
            let settings = RefreshSettings {
                interval: Duration::from_secs(3600),
                min_reload_gap: Duration::ZERO,
            };
            directory.refresh(source, settings, stop).await
        }
    });
    let mut job = h.job(5);
    job.endpoint_id = created.id;
    h.store.seed(&job, None);
    assert!(
        h.receiver
            .wait_until(Duration::from_secs(10), |all| all
                .iter()
                .any(|r| r.path == "new"))
            .await,
        "the claimed delivery did not go out: {:?}",
        h.store.attempts()
    );
    assert_eq!(h.recorded(1).await[0].endpoint_id, created.id);
    stop.cancel();
    refresher.await.unwrap();
    h.stop().await;
}
