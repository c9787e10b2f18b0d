//! Fan-out's plans against a real cluster: a delivery with no row yet is
//! held by its plan's lease, gets its row with its first attempt, moves to
//! another node when its holder's lease lapses, and a late result under an
//! old lease writes no state.

use std::time::Duration;

use uuid::Uuid;
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::delivery::{
    AttemptNote, AttemptRecord, DeliveryJob, DeliveryStatus, LastError, NewDelivery, ObjectOrder,
    OutcomeKind, Trigger,
};
use walhook_pipeline::dispatch::outcome::ErrorClass;
use walhook_pipeline::event::Event;
use walhook_pipeline::ids::{AttemptId, DeliveryId, EndpointId, EventId, TenantId};
use walhook_pipeline::store::contract;
use walhook_pipeline::store::{DispatchStore, FanoutStore};
use walhook_pipeline::time::Timestamp;
use walhook_sql::Platform;

struct World {
    _pg: LocalPostgres,
    sql: tokio_postgres::Client,
    platform: Platform,
    endpoints: Vec<EndpointId>,
}

async fn world() -> World {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    sql.execute(
        "INSERT INTO walhook.tenants (id, name) VALUES ('acme', 'Acme')",
        &[],
    )
    .await
    .unwrap();
    let mut endpoints = Vec::new();
    for i in 1..=3u8 {
        let id = EndpointId([i; 16]);
        sql.execute(
            "INSERT INTO walhook.endpoints (id, tenant_id, url) VALUES ($1, 'acme', 'https://127.0.0.1/hook')",
            &[&Uuid::from_bytes(id.0)],
        )
        .await
        .unwrap();
        endpoints.push(id);
    }
    let platform = Platform::new(&pg.url("postgres"), 4).unwrap();
    World {
        _pg: pg,
        sql,
        platform,
        endpoints,
    }
}

impl World {
    /// An event committed at `lsn`, planned for every endpoint, held by
    /// `owner`, made `age` ago.
    async fn plan(&self, lsn: u64, owner: Option<&str>, age: Duration) -> Vec<DeliveryId> {
        let (event, deliveries) = self.batch(lsn, owner, age);
        self.store(&event, &deliveries).await
    }

    /// Fan-out's write of `event` and `deliveries`: the deliveries it hands
    /// to dispatch, sorted.
    async fn store(&self, event: &Event, deliveries: &[NewDelivery]) -> Vec<DeliveryId> {
        let mut made = self
            .platform
            .materialize(std::slice::from_ref(event), deliveries)
            .await
            .unwrap();
        made.sort();
        made
    }

    /// What fan-out passes to the store for [`World::plan`]'s event (the
    /// contract's event, to the endpoints made in [`world`]).
    fn batch(&self, lsn: u64, owner: Option<&str>, age: Duration) -> (Event, Vec<NewDelivery>) {
        assert_eq!(self.endpoints, contract::ENDPOINTS);
        contract::batch(
            lsn,
            owner,
            Timestamp(Timestamp::now().0 - age.as_micros() as i64),
        )
    }

    /// The plans node `a` held, as a run starting now takes them back (the
    /// first page of ten, attempts not marked unknown).
    async fn reclaim_as_a_restart(&self) -> (Vec<DeliveryJob>, Option<EventId>) {
        self.platform
            .reclaim_plans("a", None, 10, false, Timestamp::now())
            .await
            .unwrap()
    }

    /// The first column of every row of `sql`.
    async fn column<T: for<'a> tokio_postgres::types::FromSql<'a>>(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Vec<T> {
        self.sql
            .query(sql, params)
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn count(&self, what: &str) -> i64 {
        self.sql
            .query_one(&format!("SELECT count(*) FROM {what}"), &[])
            .await
            .unwrap()
            .get(0)
    }
}

/// The job fan-out hands dispatch for delivery `id` of `deliveries`
/// (first lease, no row yet).
fn job_of(id: DeliveryId, event: &Event, deliveries: &[NewDelivery]) -> DeliveryJob {
    let d = deliveries.iter().find(|d| d.id == id).unwrap();
    DeliveryJob::planned(event, d, ObjectOrder::of(event))
}

/// The record of `job`'s next automatic attempt, succeeded.
fn success(job: &DeliveryJob) -> AttemptRecord {
    contract::attempt(job, DeliveryStatus::Succeeded)
}

#[tokio::test]
async fn a_planned_delivery_gets_its_row_with_its_first_attempt() {
    let w = world().await;
    let made = w.plan(1_000, Some("a"), Duration::ZERO).await;
    assert_eq!(made.len(), 3, "three new deliveries");
    assert_eq!(w.count("walhook.fanouts").await, 1, "one plan per event");
    assert_eq!(
        w.count("walhook.deliveries").await,
        0,
        "no row before an attempt"
    );

    // Fan-out redone: nothing new, nothing twice.
    assert!(w.plan(1_000, Some("a"), Duration::ZERO).await.is_empty());
    assert_eq!(w.count("walhook.fanouts").await, 1);

    let (mut jobs, next) = w.reclaim_as_a_restart().await;
    assert_eq!(next, None, "one page");
    jobs.sort_by_key(|j| j.delivery_id);
    let mut expected = made.clone();
    expected.sort();
    assert_eq!(
        jobs.iter().map(|j| j.delivery_id).collect::<Vec<_>>(),
        expected
    );
    assert!(jobs.iter().all(|j| !j.materialized && j.lease_version == 2));

    // The first attempt writes the row; the plan stays for the others.
    let stale = w.platform.record(&[success(&jobs[0])]).await.unwrap();
    assert!(stale.is_empty(), "{stale:?}");
    assert_eq!(w.count("walhook.deliveries").await, 1);
    assert_eq!(w.count("walhook.attempts").await, 1);
    assert_eq!(w.count("walhook.fanouts").await, 1);
    assert_eq!(
        w.count("walhook.pending").await,
        0,
        "a succeeded delivery is not pending"
    );

    // The last ones remove the plan.
    let stale = w
        .platform
        .record(&[success(&jobs[1]), success(&jobs[2])])
        .await
        .unwrap();
    assert!(stale.is_empty(), "{stale:?}");
    assert_eq!(w.count("walhook.deliveries").await, 3);
    assert_eq!(
        w.count("walhook.deliveries WHERE status = 'succeeded' AND attempt_count = 1")
            .await,
        3
    );
    assert_eq!(w.count("walhook.fanouts").await, 0, "the plan is gone");

    // Fan-out redone after everything was written: no plan comes back.
    assert!(w.plan(1_000, Some("a"), Duration::ZERO).await.is_empty());
    assert_eq!(w.count("walhook.fanouts").await, 0);
    assert_eq!(w.count("walhook.deliveries").await, 3);
}

#[tokio::test]
async fn a_retry_after_a_lost_answer_hands_over_what_the_first_try_stored() {
    let w = world().await;
    let (event, deliveries) = w.batch(1_500, Some("a"), Duration::ZERO);
    let made = w.store(&event, &deliveries).await;
    assert_eq!(made.len(), 3);

    // The first try committed and its answer was lost with the connection:
    // fan-out tries the same batch again, meets the event it stored, and
    // must still hand over every delivery (nobody else will while this
    // node lives).
    assert_eq!(
        w.store(&event, &deliveries).await,
        made,
        "the retry hands over what the first try stored"
    );
    assert_eq!(w.count("walhook.fanouts").await, 1, "one plan still");
    assert_eq!(w.count("walhook.events").await, 1);

    // Once a delivery has its row, a retry leaves it out.
    assert!(
        w.platform
            .record(&[success(&job_of(made[0], &event, &deliveries))])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        w.store(&event, &deliveries).await,
        made[1..],
        "the deliveries without a row"
    );

    // Claimed since (a later lease): whoever claimed it has the rest.
    let (jobs, _) = w.reclaim_as_a_restart().await;
    assert_eq!(jobs.len(), 2);
    assert!(
        w.store(&event, &deliveries).await.is_empty(),
        "a plan claimed since is its claimant's"
    );

    // A plan of an earlier run of this node (another creation time) is
    // the start-up reclaim's, and one nobody holds is the sweepers'.
    w.plan(1_600, Some("a"), Duration::from_secs(5)).await;
    assert!(w.plan(1_600, Some("a"), Duration::ZERO).await.is_empty());
    let (event, deliveries) = w.batch(1_700, None, Duration::ZERO);
    assert_eq!(w.store(&event, &deliveries).await.len(), 3);
    assert!(
        w.store(&event, &deliveries).await.is_empty(),
        "a plan nobody holds is claimed by the sweepers"
    );

    // A retry of a batch whose deliveries all have rows hands over nothing.
    let (event, deliveries) = w.batch(1_800, Some("a"), Duration::ZERO);
    let made = w.store(&event, &deliveries).await;
    let done: Vec<AttemptRecord> = made
        .iter()
        .map(|id| success(&job_of(*id, &event, &deliveries)))
        .collect();
    assert!(w.platform.record(&done).await.unwrap().is_empty());
    assert!(w.store(&event, &deliveries).await.is_empty());
}

#[tokio::test]
async fn a_lapsed_nodes_plans_move_to_another_node_and_its_late_results_are_stale() {
    let w = world().await;
    assert!(
        w.platform
            .node_started("a", Duration::from_millis(50))
            .await
            .unwrap()
    );
    let made = w.plan(2_000, Some("a"), Duration::ZERO).await;
    let (a_jobs, _) = w.reclaim_as_a_restart().await;
    assert_eq!(a_jobs.len(), 3);

    // Node b finds a's lease lapsed (a never stopped cleanly) and takes its
    // plan: the attempt a may have sent is unknown.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        w.platform
            .node_started("b", Duration::from_secs(60))
            .await
            .unwrap()
    );
    let b_jobs = w.platform.claim_due("b", 10, &[]).await.unwrap();
    assert_eq!(b_jobs.len(), 3, "{b_jobs:?}");
    assert!(b_jobs.iter().all(|j| j.after_unknown && !j.materialized));
    assert!(
        b_jobs
            .iter()
            .all(|j| j.lease_version > a_jobs[0].lease_version)
    );
    let a_first = a_jobs.iter().find(|j| j.delivery_id == made[0]).unwrap();
    let b_first = b_jobs.iter().find(|j| j.delivery_id == made[0]).unwrap();
    assert_eq!(
        b_first.next_auto_number(),
        2,
        "one number left for a's unknown attempt"
    );

    // a's late result: its attempt is history, its state is refused.
    let stale = w.platform.record(&[success(a_first)]).await.unwrap();
    assert_eq!(stale, vec![made[0]]);
    assert_eq!(
        w.count("walhook.deliveries").await,
        0,
        "no row under an old lease"
    );
    assert_eq!(w.count("walhook.attempts").await, 1);

    // b's result writes the row, after a's attempt in one sequence.
    let stale = w.platform.record(&[success(b_first)]).await.unwrap();
    assert!(stale.is_empty(), "{stale:?}");
    let row = w
        .sql
        .query_one(
            "SELECT status::text, attempt_count, lease_version FROM walhook.deliveries WHERE id = $1",
            &[&Uuid::from_bytes(made[0].0)],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded");
    // b counts the attempts it knows of (as the dispatcher does); a's
    // late one is history, numbered before b's.
    assert_eq!(row.get::<_, i32>(1), 1);
    assert_eq!(row.get::<_, i64>(2), b_first.lease_version);
    let numbers: Vec<i32> = w
        .column(
            "SELECT number FROM walhook.attempts WHERE delivery_id = $1 ORDER BY number",
            &[&Uuid::from_bytes(made[0].0)],
        )
        .await;
    assert_eq!(numbers, vec![1, 2]);

    // Nothing of a's is left to claim; b still holds the other two.
    assert!(w.platform.claim_due("c", 10, &[]).await.unwrap().is_empty());
    assert_eq!(w.count("walhook.fanouts WHERE lease_owner = 'b'").await, 1);
}

#[tokio::test]
async fn plans_nobody_holds_are_claimed_and_leftovers_are_tidied() {
    let w = world().await;
    assert!(
        w.platform
            .node_started("a", Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Fan-out in a process of its own: the plan is nobody's.
    w.plan(3_000, None, Duration::from_secs(30)).await;
    let jobs = w.platform.claim_due("a", 10, &[]).await.unwrap();
    assert_eq!(jobs.len(), 3);
    assert!(
        jobs.iter().all(|j| !j.after_unknown),
        "nobody held it: nothing unknown"
    );
    assert!(
        w.platform.claim_due("a", 10, &[]).await.unwrap().is_empty(),
        "taken once"
    );

    // A plan whose deliveries all have rows, left behind (two writers
    // finishing one plan at once), is tidied; one still needed is not.
    w.sql
        .batch_execute("CREATE TABLE saved AS SELECT * FROM walhook.fanouts")
        .await
        .unwrap();
    let all: Vec<AttemptRecord> = jobs.iter().map(success).collect();
    assert!(w.platform.record(&all).await.unwrap().is_empty());
    assert_eq!(w.count("walhook.fanouts").await, 0);
    w.sql
        .batch_execute("INSERT INTO walhook.fanouts SELECT * FROM saved")
        .await
        .unwrap();
    w.plan(4_000, Some("a"), Duration::from_secs(30)).await;
    assert_eq!(w.count("walhook.fanouts").await, 2);
    assert_eq!(w.platform.tidy_plans().await.unwrap(), 1);
    assert_eq!(
        w.count("walhook.fanouts").await,
        1,
        "the unfinished plan stays"
    );
    // A recent plan is left alone even when finished (its writer may still
    // be on its way).
    w.plan(5_000, Some("a"), Duration::ZERO).await;
    assert_eq!(w.platform.tidy_plans().await.unwrap(), 0);
}

#[tokio::test]
async fn a_first_attempt_and_its_retry_in_one_batch_write_the_row_with_the_latest_state() {
    let w = world().await;
    let made = w.plan(6_000, Some("a"), Duration::ZERO).await;
    let (jobs, _) = w.reclaim_as_a_restart().await;
    let job = jobs.iter().find(|j| j.delivery_id == made[0]).unwrap();

    // The first attempt fails and is retried at once; the dispatcher marks
    // the job as having its row as soon as it hands the first result over,
    // so the retry's record carries no first write. Both reach the
    // recorder in one batch.
    let mut failed = success(job);
    failed.http_status = Some(503);
    failed.outcome = OutcomeKind::Retryable;
    failed.error_class = Some(ErrorClass::ServerError);
    failed.status = DeliveryStatus::Pending;
    failed.hold_until = Some(Timestamp::now().plus(Duration::from_secs(60)));
    let mut held = job.clone();
    held.attempt_count = 1;
    held.materialized = true;
    let retried = success(&held);
    assert!(retried.first_write.is_none() && retried.number == 2);

    let stale = w.platform.record(&[failed, retried]).await.unwrap();
    assert!(
        stale.is_empty(),
        "the retry's result was refused: {stale:?}"
    );
    let row = w
        .sql
        .query_one(
            "SELECT status::text, attempt_count FROM walhook.deliveries WHERE id = $1",
            &[&Uuid::from_bytes(made[0].0)],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "succeeded");
    assert_eq!(row.get::<_, i32>(1), 2);
    assert_eq!(w.count("walhook.attempts").await, 2);
    assert_eq!(w.count("walhook.pending").await, 0);
}

#[tokio::test]
async fn attempts_are_tallied_once_even_when_a_batch_is_recorded_again() {
    let w = world().await;
    w.plan(2_000, Some("a"), Duration::ZERO).await;
    let (mut jobs, _) = w.reclaim_as_a_restart().await;
    jobs.sort_by_key(|j| j.endpoint_id);
    let failed = AttemptRecord {
        outcome: OutcomeKind::Rejected,
        http_status: Some(400),
        status: DeliveryStatus::Failed,
        ..success(&jobs[2])
    };
    let batch = [success(&jobs[0]), success(&jobs[1]), failed];
    w.platform.record(&batch).await.unwrap();
    // A redo (the write committed, its answer was lost): the careful path
    // inserts nothing and so tallies nothing.
    w.platform.record(&batch).await.unwrap();
    assert_eq!(w.count("walhook.attempts").await, 3);
    let sum = |sql: &str| {
        let sql = sql.to_owned();
        let client = &w.sql;
        async move {
            let row = client.query_one(&sql, &[]).await.unwrap();
            (row.get::<_, i64>(0), row.get::<_, i64>(1))
        }
    };
    assert_eq!(
        sum("SELECT sum(attempts)::int8, sum(succeeded)::int8 FROM walhook.endpoint_hours").await,
        (3, 2)
    );
    assert_eq!(
        sum("SELECT sum(attempts)::int8, sum(first_attempts)::int8 FROM walhook.attempt_minutes")
            .await,
        (3, 3)
    );
    assert_eq!(
        sum("SELECT sum(attempts)::int8, count(*) FROM walhook.first_attempt_latency").await,
        (3, 1),
        "three first attempts, committed at one time and started together"
    );

    // Read back: the failing endpoint's window ends with this hour.
    let acme = TenantId::new("acme").unwrap();
    let (hours, circuit) = w
        .platform
        .endpoint_tallies(&acme, jobs[2].endpoint_id, 24)
        .await
        .unwrap()
        .expect("acme's endpoint");
    assert_eq!(hours.len(), 24, "every hour of the window");
    let last = hours.last().unwrap();
    assert_eq!((last.attempts, last.succeeded), (1, 0));
    assert!(hours[..23].iter().all(|h| h.attempts == 0));
    assert!(last.hour <= std::time::SystemTime::now());
    assert_eq!(circuit, None, "no health recorded yet");
    let other = TenantId::new("other").unwrap();
    assert!(
        w.platform
            .endpoint_tallies(&other, jobs[2].endpoint_id, 24)
            .await
            .unwrap()
            .is_none(),
        "another tenant's endpoint is not found"
    );
    let hour = w.platform.attempts_by_minute().await.unwrap();
    assert_eq!(hour.minutes.iter().map(|m| m.attempts).sum::<i64>(), 3);
    let (p50, p99) = hour.first_latency_ms.expect("first attempts were made");
    // Committed at the plan's fixed time (Nov 2026): days, not seconds.
    let truth = Timestamp::now()
        .since(Timestamp(1_796_000_000_000_000 + 2_000))
        .as_millis() as f64;
    assert!(
        p50 == p99 && p99 >= truth && p99 < truth * 1.2,
        "{p99} vs {truth}"
    );

    // Tallies past their keeping time go; recent ones stay.
    w.sql
        .execute(
            "INSERT INTO walhook.attempt_minutes VALUES (now() - interval '3 days', 1, 1, 0)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(w.platform.drop_old_tallies().await.unwrap(), 1);
    assert_eq!(w.count("walhook.attempt_minutes").await, 1);
}

#[tokio::test]
async fn a_batch_removes_exactly_the_plans_it_completes() {
    let w = world().await;
    w.plan(2_000, Some("a"), Duration::ZERO).await;
    w.plan(3_000, Some("a"), Duration::ZERO).await;
    let (mut jobs, _) = w.reclaim_as_a_restart().await;
    assert_eq!(jobs.len(), 6, "two events, three endpoints each");
    jobs.sort_by_key(|j| (j.event_id, j.delivery_id));
    let (first, second) = jobs.split_at(3);

    // One batch: every delivery of the first event, one of the second.
    let batch: Vec<AttemptRecord> = first.iter().chain(&second[..1]).map(success).collect();
    let stale = w.platform.record(&batch).await.unwrap();
    assert!(stale.is_empty(), "{stale:?}");
    assert_eq!(w.count("walhook.deliveries").await, 4);
    let left: Vec<Uuid> = w.column("SELECT event_id FROM walhook.fanouts", &[]).await;
    assert_eq!(
        left,
        vec![Uuid::from_bytes(second[0].event_id.0)],
        "the completed plan is gone, the other stays"
    );

    // The rest of the second event, with its earlier row found in the table.
    let rest: Vec<AttemptRecord> = second[1..].iter().map(success).collect();
    assert!(w.platform.record(&rest).await.unwrap().is_empty());
    assert_eq!(w.count("walhook.deliveries").await, 6);
    assert_eq!(w.count("walhook.fanouts").await, 0);
}

#[tokio::test]
async fn the_platforms_sessions_do_not_jit_compile() {
    let w = world().await;
    let client = w.platform.client().await.unwrap();
    let jit: String = client.query_one("SHOW jit", &[]).await.unwrap().get(0);
    assert_eq!(jit, "off");
}

/// A success ends the schedule. While a node has a delivery's replay
/// claimed, no node claims the delivery's due retry (the replay may
/// succeed); the manual success ends the pending delivery as succeeded and
/// takes it out of `pending`, so nothing claims it after; a holder's later
/// automatic result is history only. A failed replay leaves the schedule
/// as it was: the retry is claimed once the replay is recorded.
#[tokio::test]
async fn a_successful_replay_ends_the_schedule_and_a_claimed_one_holds_it_back() {
    let w = world().await;
    let (event, deliveries) = w.batch(3_000, Some("a"), Duration::ZERO);
    let made = w.store(&event, &deliveries).await;
    let jobs: Vec<DeliveryJob> = made[..2]
        .iter()
        .map(|id| job_of(*id, &event, &deliveries))
        .collect();
    // Both fail their first attempt; their retries are handed back, due.
    let due = Timestamp(Timestamp::now().0 - 1_000_000);
    let failed: Vec<AttemptRecord> = jobs
        .iter()
        .map(|j| AttemptRecord {
            http_status: Some(503),
            outcome: OutcomeKind::Retryable,
            error_class: Some(ErrorClass::ServerError),
            status: DeliveryStatus::Pending,
            next_attempt_at: due,
            ..success(j)
        })
        .collect();
    assert!(w.platform.record(&failed).await.unwrap().is_empty());
    assert_eq!(
        w.count("walhook.pending WHERE lease_owner IS NULL").await,
        2
    );

    // Node b claims replays of both; node a's sweep leaves them alone.
    for id in &made[..2] {
        w.platform.request_replay(*id, "test").await.unwrap();
    }
    let mut replays = w
        .platform
        .claim_replays("b", 10, Duration::from_secs(60))
        .await
        .unwrap();
    replays.sort_by_key(|j| j.delivery_id);
    assert_eq!(replays.len(), 2);
    let claimed = w.platform.claim_due("a", 10, &[]).await.unwrap();
    assert!(
        claimed.is_empty(),
        "a due retry was claimed while its replay was out: {:?}",
        claimed.iter().map(|j| j.delivery_id).collect::<Vec<_>>()
    );

    // The first replay succeeds, the second fails.
    let manual = |job: &DeliveryJob, ok: bool| {
        let replay = job.replay.unwrap();
        AttemptRecord {
            attempt_id: AttemptId::derive(job.delivery_id, replay.number),
            number: replay.number,
            trigger: Trigger::Manual,
            replay_request: Some(replay.request_id),
            http_status: Some(if ok { 200 } else { 503 }),
            outcome: if ok {
                OutcomeKind::Succeeded
            } else {
                OutcomeKind::Retryable
            },
            error_class: (!ok).then_some(ErrorClass::ServerError),
            status: DeliveryStatus::Pending,
            first_write: None,
            ..success(job)
        }
    };
    let (won, lost) = (&replays[0], &replays[1]);
    w.platform
        .record(&[manual(won, true), manual(lost, false)])
        .await
        .unwrap();
    let status = |id: DeliveryId| {
        let sql = &w.sql;
        async move {
            let row = sql
                .query_one(
                    "SELECT d.status::text, d.lease_owner, \
                            EXISTS (SELECT 1 FROM walhook.pending p WHERE p.delivery_id = d.id) \
                     FROM walhook.deliveries d WHERE d.id = $1",
                    &[&Uuid::from_bytes(id.0)],
                )
                .await
                .unwrap();
            (
                row.get::<_, String>(0),
                row.get::<_, Option<String>>(1),
                row.get::<_, bool>(2),
            )
        }
    };
    assert_eq!(
        status(won.delivery_id).await,
        ("succeeded".to_owned(), None, false),
        "a successful replay left the delivery pending"
    );
    assert_eq!(status(lost.delivery_id).await.0, "pending");

    // Only the failed replay's delivery is claimed for its retry.
    let claimed = w.platform.claim_due("a", 10, &[]).await.unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.delivery_id).collect::<Vec<_>>(),
        vec![lost.delivery_id]
    );

    // An automatic attempt that was out when the replay succeeded is
    // recorded, and changes nothing.
    let held = jobs
        .iter()
        .find(|j| j.delivery_id == won.delivery_id)
        .unwrap();
    let late = AttemptRecord {
        attempt_id: AttemptId::derive(held.delivery_id, 9),
        number: 9,
        attempt_count: 2,
        first_write: None,
        ..success(held)
    };
    let stale = w.platform.record(&[late]).await.unwrap();
    assert_eq!(
        stale,
        vec![won.delivery_id],
        "the late result is not applied"
    );
    assert_eq!(
        w.count(&format!(
            "walhook.attempts WHERE delivery_id = '{}'",
            Uuid::from_bytes(won.delivery_id.0)
        ))
        .await,
        3,
        "the late attempt is in the history"
    );
    assert_eq!(
        status(won.delivery_id).await,
        ("succeeded".to_owned(), None, false)
    );
}

/// A restart takes back the plans of the node's previous run, never the
/// ones its own fan-out made since it began (already on their way to its
/// dispatcher: taking them again sent first attempts twice).
#[tokio::test]
async fn a_restart_leaves_the_plans_of_its_own_run_alone() {
    let w = world().await;
    let began = walhook_pipeline::time::Timestamp::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let made = w.plan(1_000, Some("a"), Duration::ZERO).await;
    assert_eq!(made.len(), 3);
    let (jobs, next) = w
        .platform
        .reclaim_plans("a", None, 10, false, began)
        .await
        .unwrap();
    assert!(
        jobs.is_empty() && next.is_none(),
        "took this run's plans: {jobs:?}"
    );
    // The same plans, as a later run sees them: its predecessor's.
    let (jobs, _) = w.reclaim_as_a_restart().await;
    assert_eq!(jobs.len(), 3);
}

#[tokio::test]
async fn a_deliveries_partitions_dispatcher_takes_and_claims_only_its_own_deliveries() {
    use walhook_pipeline::routing::{Routes, TOPIC_HELD};
    let w = world().await;
    let routes = Routes::new(2, Default::default()).unwrap();
    // Fan-out with dispatch by endpoint: the plan is held by the topic.
    let (event, deliveries) = w.batch(8_000, Some(TOPIC_HELD), Duration::ZERO);
    assert_eq!(w.store(&event, &deliveries).await.len(), 3);
    let of = |p: u32| -> Vec<DeliveryId> {
        let mut ids: Vec<DeliveryId> = deliveries
            .iter()
            .filter(|d| routes.partition(d.endpoint_id, d.id) == p)
            .map(|d| d.id)
            .collect();
        ids.sort();
        ids
    };
    let (p0, p1) = (of(0), of(1));
    assert!(!p0.is_empty() && !p1.is_empty(), "{p0:?} {p1:?}");
    let sorted = |jobs: &[DeliveryJob]| {
        let mut ids: Vec<DeliveryId> = jobs.iter().map(|j| j.delivery_id).collect();
        ids.sort();
        ids
    };

    // No sweep of another node claims what the topic holds.
    w.platform
        .node_started("other", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        w.platform
            .claim_due("other", 10, &[])
            .await
            .unwrap()
            .is_empty()
    );
    // Partition 1's earlier dispatcher still runs: its deliveries wait.
    w.platform
        .node_started("m-p1.1", Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        w.platform
            .take_partition("m-p1.2", &routes.scope(1))
            .await
            .unwrap()
            .is_none()
    );
    // Partition 0's dispatcher takes exactly its own planned deliveries.
    let taken = w
        .platform
        .take_partition("m-p0.1", &routes.scope(0))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sorted(&taken), p0);
    assert!(taken.iter().all(|j| !j.after_unknown), "no earlier holder");

    // Partition 1's running dispatcher fails its first attempts and holds
    // the retries: rows leased to it, not to the topic.
    let now = Timestamp::now();
    let failed: Vec<AttemptRecord> = p1
        .iter()
        .map(|id| {
            let mut r = success(&job_of(*id, &event, &deliveries));
            r.http_status = Some(503);
            r.outcome = OutcomeKind::Retryable;
            r.error_class = Some(ErrorClass::ServerError);
            r.status = DeliveryStatus::Pending;
            r.next_attempt_at = now;
            r.hold_until = Some(now.plus(Duration::from_secs(60)));
            if let Some(first) = r.first_write.as_mut() {
                first.holder = Some("m-p1.1".into());
            }
            r
        })
        .collect();
    assert!(w.platform.record(&failed).await.unwrap().is_empty());
    let holders: Vec<String> = w
        .column("SELECT DISTINCT lease_owner FROM walhook.pending", &[])
        .await;
    assert_eq!(holders, vec!["m-p1.1".to_owned()]);
    // Partition 0's dispatcher never claims them; partition 1's next
    // holder only once the earlier one stopped, and then all of them.
    let scope0 = routes.scope(0);
    let scope1 = routes.scope(1);
    assert!(
        w.platform
            .claim_scoped("m-p0.1", 10, &[], &scope0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        w.platform
            .claim_scoped("m-p1.2", 10, &[], &scope1)
            .await
            .unwrap()
            .is_empty(),
        "its holder still runs"
    );
    w.platform.node_stopped("m-p1.1").await.unwrap();
    let claimed = w
        .platform
        .claim_scoped("m-p1.2", 10, &[], &scope1)
        .await
        .unwrap();
    assert_eq!(sorted(&claimed), p1);
    assert!(
        claimed.iter().all(|j| !j.after_unknown),
        "it stopped cleanly"
    );
    // Released (due, held by nobody), they go to partition 1 again only.
    w.sql
        .batch_execute("UPDATE walhook.pending SET lease_owner = NULL")
        .await
        .unwrap();
    assert!(
        w.platform
            .claim_scoped("m-p0.1", 10, &[], &scope0)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        sorted(
            &w.platform
                .claim_scoped("m-p1.2", 10, &[], &scope1)
                .await
                .unwrap()
        ),
        p1
    );
}

/// Stored names come back as the enums they were written from, and a value
/// this version does not know is an error naming it (never a default).
#[tokio::test]
async fn stored_names_read_back_as_enums_and_an_unknown_one_is_named() {
    let w = world().await;
    let made = w.plan(7_000, Some("a"), Duration::ZERO).await;
    let (jobs, _) = w.reclaim_as_a_restart().await;
    let job = jobs.iter().find(|j| j.delivery_id == made[0]).unwrap();
    let mut failed = success(job);
    failed.http_status = Some(429);
    failed.outcome = OutcomeKind::Retryable;
    failed.error_class = Some(ErrorClass::RateLimited);
    failed.note = Some(AttemptNote::PreviousOutcomeUnknown);
    failed.status = DeliveryStatus::Pending;
    assert!(w.platform.record(&[failed]).await.unwrap().is_empty());

    let attempts = w.platform.attempts_of(job.delivery_id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    let a = &attempts[0];
    assert_eq!(
        (a.trigger, a.outcome, a.error_class, a.note),
        (
            Trigger::Auto,
            OutcomeKind::Retryable,
            Some(ErrorClass::RateLimited),
            Some(AttemptNote::PreviousOutcomeUnknown)
        )
    );
    let d = w
        .platform
        .delivery_of_tenant(&job.tenant_id, job.delivery_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.status, DeliveryStatus::Pending);
    assert_eq!(
        d.last_error_class,
        Some(LastError::Attempt(ErrorClass::RateLimited))
    );

    // A newer version's (or a hand-edited) value is refused by name.
    let id = Uuid::from_bytes(job.delivery_id.0);
    w.sql
        .execute(
            "UPDATE walhook.attempts SET outcome = 'bounced' WHERE delivery_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let err = w.platform.attempts_of(job.delivery_id).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("\"bounced\"") && text.contains("succeeded, retryable, rejected, gone"),
        "{text}"
    );
    w.sql
        .execute(
            "UPDATE walhook.deliveries SET last_error_class = 'mystery' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let err = w
        .platform
        .delivery_of_tenant(&job.tenant_id, job.delivery_id)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"mystery\""), "{err}");
}

/// How many sequential scans of `walhook.{table}` the statistics show.
async fn seq_scans(sql: &tokio_postgres::Client, table: &str) -> i64 {
    sql.query_one(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE schemaname = 'walhook' AND relname = $1",
        &[&table],
    )
    .await
    .unwrap()
    .get(0)
}

/// The client sessions other than `sql`'s own.
async fn other_sessions(sql: &tokio_postgres::Client) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until the sessions other than `sql`'s are back to `sessions`
/// (a closed session has handed its statistics over as it ended).
async fn sessions_back_to(sql: &tokio_postgres::Client, sessions: i64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while other_sessions(sql).await != sessions {
        assert!(
            std::time::Instant::now() < deadline,
            "a closed session did not end in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Dispatch behind: 50,000 plans and 50,000 retries queued, and the
/// recorder's batches of 4,200 first attempts and then their retries. Each
/// batch reaches the plans and the queue by their primary keys; a plan the
/// planner chose by the tables' sizes hashed the whole queue for every batch
/// (a sequential scan each), so that the further behind dispatch was, the
/// slower it caught up. The plans' half fails on the statements before the
/// change; the retry queue's half did not (its batch's estimate stayed
/// small at every size tried) and keeps the new form from regressing.
#[tokio::test]
async fn a_long_queue_is_probed_by_key_not_scanned_for_each_batch() {
    let w = world().await;
    let mut events = Vec::new();
    let mut planned = Vec::new();
    for i in 0..1_400u64 {
        let (event, deliveries) = w.batch(10_000 + i * 10, Some("a"), Duration::ZERO);
        events.push(event);
        planned.push(deliveries);
    }
    let all: Vec<NewDelivery> = planned.iter().flatten().cloned().collect();
    assert_eq!(
        w.platform.materialize(&events, &all).await.unwrap().len(),
        4_200
    );
    w.sql
        .batch_execute(
            "INSERT INTO walhook.fanouts (event_id, event_occurred_at, tenant_id, event_type, delivery_ids, \
                 endpoint_ids, config_versions, created_at, expires_at, lease_owner) \
             SELECT gen_random_uuid(), now(), 'acme', 'order.created', \
                    ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], \
                    ARRAY[gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), gen_random_uuid()], \
                    ARRAY[1, 1, 1, 1], now(), now() + interval '1 day', 'b' \
             FROM generate_series(1, 50000); \
             INSERT INTO walhook.pending (delivery_id, endpoint_id, created_at, next_attempt_at, lease_owner) \
             SELECT gen_random_uuid(), gen_random_uuid(), now(), now() + interval '1 hour', 'b' \
             FROM generate_series(1, 50000); \
             ANALYZE walhook.fanouts, walhook.pending",
        )
        .await
        .unwrap();
    let jobs: Vec<DeliveryJob> = events
        .iter()
        .zip(&planned)
        .flat_map(|(event, deliveries)| deliveries.iter().map(|d| job_of(d.id, event, deliveries)))
        .collect();
    let failed: Vec<AttemptRecord> = jobs
        .iter()
        .map(|job| {
            let mut failed = contract::attempt(job, DeliveryStatus::Pending);
            failed.hold_until = Some(Timestamp::now().plus(Duration::from_secs(60)));
            failed
        })
        .collect();
    let retried: Vec<AttemptRecord> = jobs
        .iter()
        .map(|job| {
            let mut held = job.clone();
            held.attempt_count = 1;
            held.materialized = true;
            success(&held)
        })
        .collect();

    // This session's own counts (the migrations' index builds scan both
    // tables) are handed over before the count is read.
    w.sql
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    let sessions = other_sessions(&w.sql).await;
    let before = (
        seq_scans(&w.sql, "fanouts").await,
        seq_scans(&w.sql, "pending").await,
    );
    // The recorder's batches on a session of their own, closed after them
    // so that its statistics are in before they are read.
    let recorder = Platform::new(&w._pg.url("postgres"), 1).unwrap();
    assert!(recorder.record(&failed).await.unwrap().is_empty());
    assert!(recorder.record(&retried).await.unwrap().is_empty());
    drop(recorder);
    sessions_back_to(&w.sql, sessions).await;
    // A control: one sequential scan of each, counted the same way.
    let control = w._pg.connect("postgres").await.unwrap();
    control
        .batch_execute(
            "SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off; \
             SET max_parallel_workers_per_gather = 0; \
             SELECT count(*) FROM walhook.fanouts; SELECT count(*) FROM walhook.pending",
        )
        .await
        .unwrap();
    drop(control);
    sessions_back_to(&w.sql, sessions).await;
    let after = (
        seq_scans(&w.sql, "fanouts").await,
        seq_scans(&w.sql, "pending").await,
    );
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 1),
        "sequential scans of (fanouts, pending) besides the control's one each"
    );

    // And the batches did their work.
    assert_eq!(
        w.count("walhook.deliveries WHERE status = 'succeeded'")
            .await,
        4_200
    );
    assert_eq!(
        w.count("walhook.fanouts").await,
        50_000,
        "the 1,400 plans are done"
    );
    assert_eq!(
        w.count("walhook.pending").await,
        50_000,
        "the 4,200 retries left the queue"
    );
}
