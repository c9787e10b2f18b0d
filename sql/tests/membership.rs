//! The membership store on real Postgres: slots and epochs, one holder per
//! partition, the fence, lapsed leases; and members run by
//! `hold_partitions` sharing the partitions as they join, leave and die.

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use walhook_devkit::postgres::LocalPostgres;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::LogError;
use walhook_pipeline::membership::{
    BoxError, Fence, Member, MembershipCounters, MembershipSettings, MembershipStore, StartReader,
    hold_partitions,
};
use walhook_sql::Platform;

async fn platform() -> (LocalPostgres, Platform) {
    let pg = LocalPostgres::start().await.unwrap();
    let mut sql = pg.connect("postgres").await.unwrap();
    walhook_sql::migrate::run(&mut sql).await.unwrap();
    let platform = Platform::new(&pg.url("postgres"), 8).unwrap();
    (pg, platform)
}

const LONG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn one_holder_per_partition_and_the_fence_refuses_whoever_lost_it() {
    let (_pg, store) = platform().await;
    let g = "events/fanout";
    let a = store.join(g, "a", 4, LONG).await.unwrap();
    let b = store.join(g, "b", 4, LONG).await.unwrap();
    assert_eq!((a.slot, b.slot), (0, 1), "the lowest free slots");
    assert_eq!(store.live(g).await.unwrap(), vec![0, 1]);
    // Another group is another set of slots.
    assert_eq!(
        store.join("other/fanout", "c", 2, LONG).await.unwrap().slot,
        0
    );

    let ta = store
        .claim(g, a, 0)
        .await
        .unwrap()
        .expect("a free partition");
    assert_eq!(
        store.claim(g, b, 0).await.unwrap(),
        None,
        "held by a live member"
    );
    assert_eq!(store.claim(g, a, 0).await.unwrap(), None, "already held");
    let tb = store.claim(g, b, 1).await.unwrap().unwrap();
    assert_eq!(
        store.renew(g, a, LONG).await.unwrap(),
        Some(BTreeMap::from([(0, ta)]))
    );
    assert!(store.fence_commit(g, a, 0, ta, Offset(5)).await.unwrap());
    assert!(
        !store.fence_commit(g, b, 0, tb, Offset(6)).await.unwrap(),
        "not b's"
    );
    assert!(
        !store
            .fence_commit(g, a, 0, ta + 1, Offset(6))
            .await
            .unwrap(),
        "an old holding"
    );
    assert!(
        !store.fence_commit(g, a, 3, ta, Offset(6)).await.unwrap(),
        "never held"
    );

    // Given back, it is free, and its next holding has a new token.
    store.release(g, a, 0, ta).await.unwrap();
    assert!(
        !store.fence_commit(g, a, 0, ta, Offset(7)).await.unwrap(),
        "given back"
    );
    let tb0 = store.claim(g, b, 0).await.unwrap().unwrap();
    assert_ne!(tb0, ta);
    assert!(store.fence_commit(g, b, 0, tb0, Offset(7)).await.unwrap());

    // A member that leaves frees what it held at once.
    store.leave(g, b).await.unwrap();
    assert_eq!(store.live(g).await.unwrap(), vec![0]);
    assert!(!store.fence_commit(g, b, 1, tb, Offset(8)).await.unwrap());
    assert!(store.claim(g, a, 1).await.unwrap().is_some());
    // Its slot is the next one taken, with a new epoch.
    let b2 = store.join(g, "b again", 4, LONG).await.unwrap();
    assert_eq!((b2.slot, b2.epoch), (1, b.epoch + 1));
    assert_eq!(
        store.renew(g, b, LONG).await.unwrap(),
        None,
        "the old b is out"
    );
}

#[tokio::test]
async fn a_lapsed_lease_loses_its_partitions_and_its_commits() {
    let (_pg, store) = platform().await;
    let g = "events/fanout";
    let short = Duration::from_millis(300);
    let frozen = store.join(g, "frozen", 2, short).await.unwrap();
    let t = store.claim(g, frozen, 0).await.unwrap().unwrap();
    let other = store.join(g, "other", 2, LONG).await.unwrap();
    assert_eq!(store.claim(g, other, 0).await.unwrap(), None);
    tokio::time::sleep(short * 2).await;
    assert_eq!(store.live(g).await.unwrap(), vec![other.slot]);
    // Lapsed: its commit is refused even before anyone took the partition.
    assert!(
        !store
            .fence_commit(g, frozen, 0, t, Offset(3))
            .await
            .unwrap()
    );
    let t2 = store
        .claim(g, other, 0)
        .await
        .unwrap()
        .expect("free once lapsed");
    // Renewed late, it is live again but holds nothing it lost.
    assert_eq!(
        store.renew(g, frozen, LONG).await.unwrap(),
        Some(BTreeMap::new())
    );
    assert!(
        !store
            .fence_commit(g, frozen, 0, t, Offset(3))
            .await
            .unwrap()
    );
    assert!(
        store
            .fence_commit(g, other, 0, t2, Offset(3))
            .await
            .unwrap()
    );
    // A process that joins takes a lapsed slot over; the old one is out.
    let lapsing = store.join(g, "lapsing", 2, short).await.unwrap();
    tokio::time::sleep(short * 2).await;
    let newcomer = store.join(g, "newcomer", 2, LONG).await.unwrap();
    assert_eq!(
        (newcomer.slot, newcomer.epoch),
        (lapsing.slot, lapsing.epoch + 1)
    );
    assert_eq!(store.renew(g, lapsing, LONG).await.unwrap(), None);
}

/// The refusal's message, or a panic naming what was returned instead.
fn refused<T: std::fmt::Debug>(r: Result<T, walhook_sql::StoreError>) -> String {
    match r {
        Err(walhook_sql::StoreError::Refused(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn fixed_shares_and_joined_members_do_not_run_in_one_group() {
    let (_pg, store) = platform().await;
    let g = "events/fanout";

    // A fixed member beside a joined one is refused, and the other way round.
    let joined = store.join(g, "host pid 1", 4, LONG).await.unwrap();
    let why = refused(store.take_fixed_share(g, "host pid 2", (0, 2), LONG).await);
    assert!(
        why.contains("--member 0/2") && why.contains("slot 0 (host pid 1)"),
        "{why}"
    );
    store.leave(g, joined).await.unwrap();
    let (zero, before) = store
        .take_fixed_share(g, "host pid 2", (0, 2), LONG)
        .await
        .unwrap();
    assert_eq!((zero.slot, before), (0, None));
    let err = store.join(g, "host pid 3", 4, LONG).await.unwrap_err();
    assert!(err.to_string().contains("member 0/2 (host pid 2)"), "{err}");
    assert_eq!(store.live(g).await.unwrap(), Vec::<u32>::new());

    // Another N overlaps; the same N's other member does not.
    let why = refused(store.take_fixed_share(g, "host pid 4", (1, 3), LONG).await);
    assert!(
        why.contains("--member 1/3") && why.contains("member 0/2 (host pid 2)"),
        "{why}"
    );
    let (one, _) = store
        .take_fixed_share(g, "host pid 5", (1, 2), LONG)
        .await
        .unwrap();
    assert!(store.renew_fixed_share(g, 2, one, LONG).await.unwrap());

    // The same I/N again (a restart, or a second process): the later takes
    // the share and names the one it replaced; the earlier's renewal fails.
    let (again, before) = store
        .take_fixed_share(g, "host pid 6", (1, 2), LONG)
        .await
        .unwrap();
    assert_eq!((again.slot, again.epoch), (1, one.epoch + 1));
    assert_eq!(before.as_deref(), Some("host pid 5"));
    assert!(!store.renew_fixed_share(g, 2, one, LONG).await.unwrap());
    assert!(store.renew_fixed_share(g, 2, again, LONG).await.unwrap());

    // Once every fixed member left, members join again.
    store.leave_fixed_share(g, 2, zero).await.unwrap();
    store.leave_fixed_share(g, 2, again).await.unwrap();
    let joined = store.join(g, "host pid 7", 4, LONG).await.unwrap();

    // A fixed member whose lease lapsed while a member joined loses its
    // share at its next renewal, even though nobody took its I/N.
    store.leave(g, joined).await.unwrap();
    let short = Duration::from_millis(300);
    let (frozen, _) = store
        .take_fixed_share(g, "host pid 8", (0, 1), short)
        .await
        .unwrap();
    tokio::time::sleep(short * 2).await;
    let joined = store.join(g, "host pid 9", 4, LONG).await.unwrap();
    assert!(!store.renew_fixed_share(g, 1, frozen, LONG).await.unwrap());

    // And the other way round: a joined member frozen past its lease while
    // a fixed member started loses its renewal.
    store.leave(g, joined).await.unwrap();
    let frozen = store.join(g, "host pid 10", 4, short).await.unwrap();
    tokio::time::sleep(short * 2).await;
    store
        .take_fixed_share(g, "host pid 11", (0, 1), LONG)
        .await
        .unwrap();
    assert_eq!(store.renew(g, frozen, LONG).await.unwrap(), None);
}

#[tokio::test]
async fn concurrent_claims_of_one_partition_give_it_to_one_member() {
    let (_pg, store) = platform().await;
    let g = "events/fanout";
    for round in 0..5u32 {
        let mut members = Vec::new();
        for i in 0..6 {
            members.push(store.join(g, &format!("m{i}"), 1, LONG).await.unwrap());
        }
        let winners = futures::future::join_all(members.iter().map(|&m| {
            let store = store.clone();
            async move { store.claim(g, m, 0).await.unwrap() }
        }))
        .await;
        assert_eq!(
            winners.iter().filter(|w| w.is_some()).count(),
            1,
            "round {round}: {winners:?}"
        );
        for m in members {
            store.leave(g, m).await.unwrap();
        }
    }
}

/// Which member reads each partition now, and every overlap seen.
#[derive(Default)]
struct Board {
    reading: BTreeMap<u32, Vec<u32>>,
    overlaps: Vec<String>,
}

/// A reader that commits every 50 ms through its fence and notes itself
/// on the board while it runs.
fn reader(board: Arc<Mutex<Board>>, slot: u32) -> StartReader {
    Box::new(move |p, fence: Fence, stop: CancellationToken| {
        let board = board.clone();
        Box::pin(async move {
            {
                let mut guard = board.lock();
                let Board { reading, overlaps } = &mut *guard;
                let readers = reading.entry(p).or_default();
                if !readers.is_empty() {
                    overlaps.push(format!(
                        "partition {p}: member {slot} started while {readers:?} read"
                    ));
                }
                readers.push(slot);
            }
            let mut next = 0;
            let result = loop {
                tokio::select! {
                    _ = stop.cancelled() => break Ok(()),
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                next += 1;
                if let Err(e) = fence.admit(Offset(next)).await {
                    break Err(BoxError::from(e));
                }
            };
            board
                .lock()
                .reading
                .get_mut(&p)
                .unwrap()
                .retain(|&s| s != slot);
            result
        })
    })
}

struct Running {
    member: Member,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), walhook_pipeline::membership::MembershipError>>,
    counters: Arc<MembershipCounters>,
}

async fn start(
    store: &Platform,
    board: &Arc<Mutex<Board>>,
    settings: &MembershipSettings,
) -> Running {
    let member = store
        .join(&settings.key(), "test", settings.partitions, settings.lease)
        .await
        .unwrap();
    let counters = Arc::new(MembershipCounters::new(&settings.key(), member));
    let stop = CancellationToken::new();
    let task = tokio::spawn(hold_partitions(
        Arc::new(store.clone()),
        member,
        settings.clone(),
        counters.clone(),
        reader(board.clone(), member.slot),
        stop.clone(),
    ));
    Running {
        member,
        stop,
        task,
        counters,
    }
}

/// Waits until every partition is read by exactly one member and the
/// members' counts are `want` (slot to partitions).
async fn settled(board: &Arc<Mutex<Board>>, want: &BTreeMap<u32, usize>, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now: BTreeMap<u32, usize> = {
            let b = board.lock();
            let mut by_member = BTreeMap::new();
            for readers in b.reading.values() {
                for &s in readers {
                    *by_member.entry(s).or_default() += 1;
                }
            }
            by_member
        };
        let single = board.lock().reading.values().all(|r| r.len() <= 1);
        if &now == want && single {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not settled within {within:?}: reading {:?}, want {want:?}",
            board.lock().reading
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_the_partitions_as_they_join_leave_and_die() {
    let (_pg, store) = platform().await;
    let settings = MembershipSettings {
        topic: "events".into(),
        group: "fanout".into(),
        partitions: 8,
        lease: Duration::from_secs(2),
    };
    let board = Arc::new(Mutex::new(Board::default()));
    let within = Duration::from_secs(10);
    let mut members = Vec::new();
    for _ in 0..3 {
        members.push(start(&store, &board, &settings).await);
    }
    settled(&board, &BTreeMap::from([(0, 3), (1, 3), (2, 2)]), within).await;
    // A fourth joins: two each.
    members.push(start(&store, &board, &settings).await);
    settled(
        &board,
        &BTreeMap::from([(0, 2), (1, 2), (2, 2), (3, 2)]),
        within,
    )
    .await;
    // One leaves in order: the rest take its partitions at once.
    let leaving = members.remove(1);
    leaving.stop.cancel();
    leaving.task.await.unwrap().unwrap();
    settled(&board, &BTreeMap::from([(0, 3), (2, 3), (3, 2)]), within).await;
    assert_eq!(
        board.lock().overlaps,
        Vec::<String>::new(),
        "overlaps while rebalancing"
    );
    assert!(members.iter().all(|m| {
        m.counters
            .changes
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }));

    // One dies (its coordinator stops renewing; its readers go on, as a
    // frozen process's would): after its lease, the others take its
    // partitions, and its readers' commits are refused.
    let dead = members.remove(0);
    dead.task.abort();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let taken = {
            let b = board.lock();
            b.reading
                .values()
                .all(|r| r.iter().any(|&s| s != dead.member.slot))
        };
        let dead_stopped = board
            .lock()
            .reading
            .values()
            .all(|r| !r.contains(&dead.member.slot));
        if taken && dead_stopped {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dead member's partitions were not taken over: {:?}",
            board.lock().reading
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        dead.counters
            .fenced
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0,
        "the dead member's readers were never refused"
    );
    settled(&board, &BTreeMap::from([(2, 4), (3, 4)]), within).await;
    for m in members {
        m.stop.cancel();
        m.task.await.unwrap().unwrap();
    }
    assert!(board.lock().reading.values().all(Vec::is_empty));
    assert!(store.live("events/fanout").await.unwrap().is_empty());
    // The refusal names the partition.
    let refused = LogError::Fenced {
        topic: "events".into(),
        partition: 3,
        group: "fanout".into(),
        next: 9,
    };
    assert!(refused.to_string().contains("partition 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_slot_was_taken_over_stops_its_readers_and_ends() {
    let (pg, store) = platform().await;
    let settings = MembershipSettings {
        topic: "events".into(),
        group: "fanout".into(),
        partitions: 2,
        lease: Duration::from_secs(2),
    };
    let board = Arc::new(Mutex::new(Board::default()));
    let m = start(&store, &board, &settings).await;
    settled(&board, &BTreeMap::from([(0, 2)]), Duration::from_secs(10)).await;
    // Another process took the slot (as a join does once a lease lapsed).
    pg.connect("postgres")
        .await
        .unwrap()
        .execute(
            "UPDATE walhook.stage_members SET epoch = epoch + 1, holder = 'newcomer' WHERE slot = $1",
            &[&i32::try_from(m.member.slot).unwrap()],
        )
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), m.task)
        .await
        .expect("the member did not notice")
        .unwrap();
    let e = ended.expect_err("a member that is out must end with an error");
    assert!(
        matches!(
            e,
            walhook_pipeline::membership::MembershipError::Out { slot: 0, .. }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("restart joins the group again"),
        "{e}"
    );
    assert!(
        board.lock().reading.values().all(Vec::is_empty),
        "readers left running"
    );
}
