//! Scale-out on a real Fluvio cluster: capture, fan-out members and a
//! standby dispatcher as separate processes, killed at the dangerous points
//! and around a broker crash. Skipped, saying why, where no cluster can be
//! had (`scripts/test.sh` makes that a failure on machines with the tools).

// Test code spawns freely.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Duration;

use walhook_devkit::fluvio::{ClusterTls, FluvioCluster};
use walhook_devkit::receiver::Received;
use walhook_devkit::tls::TestCa;

use crate::support::api::free_port;
use crate::support::{Child, World, assert_recent_window_reconciles};

/// The value of series `name` at http://`listen`/metrics, and the page.
async fn try_scrape(listen: &str, name: &str) -> (Option<f64>, String) {
    let text = reqwest::get(format!("http://{listen}/metrics"))
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| panic!("GET {listen}/metrics: {e}"))
        .text()
        .await
        .unwrap();
    let value = text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok());
    (value, text)
}

/// The value of series `name` at http://`listen`/metrics; it must be there.
async fn scrape(listen: &str, name: &str) -> f64 {
    match try_scrape(listen, name).await {
        (Some(value), _) => value,
        (None, text) => panic!("{name} missing from\n{text}"),
    }
}

/// The `[log]` section of a deployment on `cluster`, with topics of its own.
fn fluvio_log(cluster: &FluvioCluster) -> String {
    fluvio_log_named(cluster).0
}

/// [`fluvio_log`], and the name of its events topic.
fn fluvio_log_named(cluster: &FluvioCluster) -> (String, String) {
    let prefix = format!("t{:08x}-", rand::random::<u32>());
    (
        format!(
            "[log]\nkind = \"fluvio\"\nendpoint = \"{}\"\nevents_partitions = 4\ntopic_prefix = \"{prefix}\"\n",
            cluster.endpoint()
        ),
        format!("{prefix}events"),
    )
}

/// Runs `walhook fanout` with `args` beside members it must not run with:
/// it exits with an error, whose text (stderr) is returned.
fn refused_fanout(cfg: &std::path::Path, args: &[&str]) -> String {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Child(
        crate::support::walhook()
            .args(["fanout", "--config"])
            .arg(cfg)
            .args(args)
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap(),
    );
    let status = child
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("walhook fanout {args:?} started beside the running members"));
    assert!(!status.success(), "walhook fanout {args:?}: {status}");
    std::fs::read_to_string(log.path()).unwrap()
}

async fn insert_orders(w: &World, ids: std::ops::RangeInclusive<i64>) {
    for id in ids {
        w.shop
            .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
            .await
            .unwrap();
    }
}

/// A world with the two endpoints [`assert_delivered_once`] checks:
/// `acme-a` (every type) and `acme-b` (`order.created`).
async fn delivery_world() -> World {
    let w = World::new().await;
    w.endpoint("acme", "acme-a", &[]).await;
    w.endpoint("acme", "acme-b", &["order.created"]).await;
    w
}

/// Every order reached both endpoints with a 2xx, each delivery is one row
/// and one `webhook-id`, resends repeat the first bytes, every signature
/// verifies. Returns how many requests were resends.
async fn assert_delivered_once(
    w: &World,
    cluster: &FluvioCluster,
    what: &str,
    orders: i64,
) -> usize {
    wait_every_order(
        w,
        cluster,
        what,
        &["acme-a", "acme-b"],
        orders,
        Duration::from_secs(90),
    )
    .await;
    let want = orders * 2;
    w.wait_count(
        &format!("{what}: the deliveries' rows"),
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        want,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (events, made): (i64, i64) = {
        let r = w
            .platform_sql
            .query_one(
                "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries)",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        (events, made),
        (orders, want),
        "{what}: events or deliveries made twice or missing"
    );
    // One row per attempt id (a delivery and its attempt number): what the
    // archive exports, and analysts count.
    let twice: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM walhook.attempts GROUP BY delivery_id, id HAVING count(*) > 1) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if twice > 0 {
        let rows = w
            .platform_sql
            .query(
                "SELECT a.delivery_id::text, a.number, a.trigger::text, a.started_at::text, a.outcome, \
                        coalesce(a.error_class, ''), d.lease_owner, d.lease_version, d.created_at::text \
                 FROM walhook.attempts a JOIN walhook.deliveries d ON d.id = a.delivery_id \
                 WHERE (a.delivery_id, a.id) IN (SELECT delivery_id, id FROM walhook.attempts \
                                                 GROUP BY 1, 2 HAVING count(*) > 1) \
                 ORDER BY 1, 4",
                &[],
            )
            .await
            .unwrap();
        let shown: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{} #{} {} at {} {} {} (held by {:?} v{}, made {})",
                    r.get::<_, String>(0),
                    r.get::<_, i32>(1),
                    r.get::<_, String>(2),
                    r.get::<_, String>(3),
                    r.get::<_, String>(4),
                    r.get::<_, String>(5),
                    r.get::<_, Option<String>>(6),
                    r.get::<_, i64>(7),
                    r.get::<_, String>(8)
                )
            })
            .collect();
        panic!(
            "{what}: {twice} attempt ids recorded twice:\n{}",
            shown.join("\n")
        );
    }
    let (ids, again) = resends_identical(w, what);
    assert_eq!(ids as i64, want, "{what}: {ids} webhook-ids");
    w.assert_pending_consistent().await;
    w.assert_plans_written().await;
    again
}

/// Waits until every order of `1..=orders` reached every one of `paths`
/// with a 2xx; panics after `within`, naming `what`.
async fn wait_every_order(
    w: &World,
    cluster: &FluvioCluster,
    what: &str,
    paths: &[&str],
    orders: i64,
    within: Duration,
) {
    let expected: HashSet<(String, String)> = (1..=orders)
        .flat_map(|id| paths.iter().map(move |p| ((*p).to_owned(), id.to_string())))
        .collect();
    let order_of = |r: &Received| -> String {
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        body["object_id"].as_str().unwrap_or_default().to_owned()
    };
    let all_there = |got: &[Received]| {
        let seen: HashSet<(String, String)> = got
            .iter()
            .filter(|r| (200..300).contains(&r.status))
            .map(|r| (r.path.clone(), order_of(r)))
            .collect();
        expected.is_subset(&seen)
    };
    assert!(
        w.receiver.wait_until(within, all_there).await,
        "{what}: deliveries lost: {}\nthe cluster:\n{}",
        w.state().await,
        cluster.describe()
    );
}

/// Every request's signature verifies and every resend repeats the first
/// request of its `webhook-id` byte for byte; returns how many ids and how
/// many resends.
fn resends_identical(w: &World, what: &str) -> (usize, usize) {
    let mut first: HashMap<String, Received> = HashMap::new();
    let mut again = 0;
    for r in w.receiver.received() {
        assert_eq!(r.verified, Some(true), "{what}: {r:?}");
        match first.get(&r.webhook_id) {
            Some(earlier) => {
                assert_eq!(earlier.body, r.body, "{what}: a resend changed the bytes");
                assert_eq!(earlier.path, r.path);
                again += 1;
            }
            None => {
                first.insert(r.webhook_id.clone(), r);
            }
        }
    }
    (first.len(), again)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_processes_on_fluvio_lose_nothing_through_kills_and_a_broker_crash() {
    let Some(cluster) = FluvioCluster::start(
        "separate_processes_on_fluvio_lose_nothing_through_kills_and_a_broker_crash",
    ) else {
        return;
    };
    let w = delivery_world().await;
    let cfg = w.config(&fluvio_log(&cluster));
    let mut capture = Child::stage("capture", &cfg, &[], &[]);
    let member0 = Child::stage("fanout", &cfg, &["--member", "0/2"], &[]);
    let mut member1 = Child::stage("fanout", &cfg, &["--member", "1/2"], &[]);
    let standby = Child::stage("dispatch", &cfg, &["--node-id", "standby"], &[]);
    w.wait_streaming().await;
    // The fixed members hold their shares: a member that would join the
    // group, or a fixed one of another count, does not start beside them.
    w.wait_count(
        "both fixed shares taken",
        "SELECT count(*) FROM walhook.stage_members WHERE grp LIKE '%#fixed/2' AND lease_until > now()",
        2,
    )
    .await;
    let why = refused_fanout(&cfg, &[]);
    assert!(
        why.contains("member 0/2") && why.contains("member 1/2") && why.contains("--member too"),
        "{why}"
    );
    let why = refused_fanout(&cfg, &["--member", "2/3"]);
    assert!(
        why.contains("--member 2/3") && why.contains("the same N"),
        "{why}"
    );

    insert_orders(&w, 1..=20).await;
    w.wait_count(
        "first wave fanned out",
        "SELECT count(*) FROM walhook.events",
        20,
    )
    .await;
    // A fan-out member dies; its restart resumes at its committed offsets.
    member1.kill();
    insert_orders(&w, 21..=40).await;
    member1 = Child::stage("fanout", &cfg, &["--member", "1/2"], &[]);
    // The broker crashes while capture writes.
    let writer = write_orders(&w, 41..=60, Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(150)).await;
    cluster.restart_spu();
    writer.await.unwrap();
    // Capture dies too, and starts again where the slot was confirmed.
    capture.0.kill().unwrap();
    capture.0.wait().unwrap();
    insert_orders(&w, 61..=70).await;
    capture = Child::stage("capture", &cfg, &[], &[]);

    assert_delivered_once(&w, &cluster, "kills and a broker crash", 70).await;
    // Both members sent: each is a dispatcher node of its own.
    let nodes: Vec<String> = w
        .platform_sql
        .query(
            "SELECT node_id FROM walhook.dispatch_nodes ORDER BY node_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(nodes, ["local-fanout-0", "local-fanout-1", "standby"]);
    // Reconciliation of the window finds every stage in agreement: the
    // capture ledger (written by capture once the cluster stored the
    // events), the events and deliveries fan-out made, and the attempts.
    assert_recent_window_reconciles(&cfg);
    // A second process given 0/2 takes the share over; the first stops at
    // its next renewal, with an error for its supervisor.
    let member0_again = Child::stage("fanout", &cfg, &["--member", "0/2"], &[]);
    let mut member0 = member0;
    let status = member0
        .wait_exit(Duration::from_secs(30))
        .expect("the member whose share was taken over kept running");
    assert!(!status.success(), "{status}");
    for child in [capture, member0_again, member1, standby] {
        assert!(
            child.terminate().success(),
            "a process did not stop cleanly"
        );
    }
}

/// Orders `ids` inserted one by one, `every` apart, on a connection of
/// their own (a producer that keeps writing while the test does other
/// things).
fn write_orders(
    w: &World,
    ids: std::ops::RangeInclusive<i64>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let shop = w.shop_url();
    tokio::spawn(async move {
        let (client, conn) = tokio_postgres::connect(&shop, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        for id in ids {
            client
                .execute("INSERT INTO orders VALUES ($1, 'acme', 1)", &[&id])
                .await
                .unwrap();
            tokio::time::sleep(every).await;
        }
    })
}

/// Panics unless every process still runs (none exited and none was
/// restarted by the test).
fn assert_all_running(children: &mut [&mut Child], what: &str) {
    for child in children.iter_mut() {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("{what}: a walhook process exited ({status}) instead of healing");
        }
    }
}

/// The broker crashes three times under load (SIGKILL, down for a few
/// seconds, started again on the same ports and data) while capture, two
/// fan-out members and a standby dispatcher run as separate processes, and
/// no process is restarted: capture's producer is made again on a new
/// connection and capture resumes from the slot, the members' readers
/// reopen, and every delivery is made within 60 s of each restart, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stage_heals_from_broker_crashes_with_no_process_restarted() {
    let Some(cluster) =
        FluvioCluster::start("every_stage_heals_from_broker_crashes_with_no_process_restarted")
    else {
        return;
    };
    let w = delivery_world().await;
    let (log, events) = fluvio_log_named(&cluster);
    let cfg = w.config(&log);
    let mut capture = Child::stage("capture", &cfg, &[], &[]);
    let listen = format!("127.0.0.1:{}", free_port());
    let mut member0 = Child::stage(
        "fanout",
        &cfg,
        &["--member", "0/2", "--metrics-listen", &listen],
        &[],
    );
    let mut member1 = Child::stage("fanout", &cfg, &["--member", "1/2"], &[]);
    let mut standby = Child::stage("dispatch", &cfg, &["--node-id", "standby"], &[]);
    w.wait_streaming().await;

    // Writes in flight when the broker dies (a produce request cut off is
    // what poisons a Fluvio producer). Three crashes in the suite;
    // WALHOOK_SPU_CRASHES=20 for the long run the issue asks for.
    const PER_ROUND: i64 = 300;
    let rounds: i64 = std::env::var("WALHOOK_SPU_CRASHES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3);
    for round in 0..rounds {
        let first = round * PER_ROUND + 1;
        let last = first + PER_ROUND - 1;
        let writer = write_orders(&w, first..=last, Duration::from_millis(10));
        // The crash lands at a random moment of the writes, the broker
        // down for 2 to 4 s.
        tokio::time::sleep(Duration::from_millis(rand::random_range(100..1500))).await;
        cluster.kill_spu();
        tokio::time::sleep(Duration::from_millis(rand::random_range(2000..4000))).await;
        cluster.restart_spu();
        let restarted = std::time::Instant::now();
        writer.await.unwrap();
        let what = format!("broker crash {}", round + 1);
        let expected: HashSet<(String, String)> = (1..=last)
            .flat_map(|id| ["acme-a", "acme-b"].map(|p| (p.to_owned(), id.to_string())))
            .collect();
        let arrived = w
            .receiver
            .wait_until(Duration::from_secs(60), |got| {
                let seen: HashSet<(String, String)> = got
                    .iter()
                    .filter(|r| (200..300).contains(&r.status))
                    .filter_map(|r| {
                        let body: serde_json::Value = serde_json::from_slice(&r.body).ok()?;
                        Some((r.path.clone(), body["object_id"].as_str()?.to_owned()))
                    })
                    .collect();
                expected.is_subset(&seen)
            })
            .await;
        assert!(
            arrived,
            "{what}: deliveries missing 60 s after the restart ({:?} since): {}\nthe cluster:\n{}",
            restarted.elapsed(),
            w.state().await,
            cluster.describe()
        );
        assert_all_running(
            &mut [&mut capture, &mut member0, &mut member1, &mut standby],
            &what,
        );
    }
    assert_delivered_once(&w, &cluster, "broker crashes", rounds * PER_ROUND).await;
    // Member 0 reports the fan-out group's lag on every partition, its
    // own and member 1's: nothing left behind once all is delivered.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    for partition in 0..4 {
        let series = format!(
            "walhook_log_consumer_lag{{topic=\"{events}\",partition=\"{partition}\",group=\"fanout\"}}"
        );
        loop {
            let (lag, _) = try_scrape(&listen, &series).await;
            if lag == Some(0.0) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{series} is {lag:?}, not 0, 30 s after everything was delivered"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    assert_recent_window_reconciles(&cfg);
    for child in [capture, member0, member1, standby] {
        assert!(
            child.terminate().success(),
            "a process did not stop cleanly"
        );
    }
}

/// A stage whose cluster stays away longer than `[log] give_up_after`
/// says so on `/healthz` first, then exits with an error naming the
/// cluster, instead of retrying for ever while nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_cannot_reach_the_cluster_fails_its_health_check_and_exits() {
    let Some(cluster) = FluvioCluster::start(
        "a_stage_that_cannot_reach_the_cluster_fails_its_health_check_and_exits",
    ) else {
        return;
    };
    let w = World::new().await;
    let cfg = w.config(&format!(
        "{}give_up_after = \"10s\"\n",
        fluvio_log(&cluster)
    ));
    let listen = format!("127.0.0.1:{}", free_port());
    // Its log goes to a file: a pipe nobody reads while it runs could fill
    // and stall it.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = crate::support::walhook()
        .args(["fanout", "--config"])
        .arg(&cfg)
        .args(["--member", "0/1", "--metrics-listen", &listen])
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let health = || async {
        let r = reqwest::get(format!("http://{listen}/healthz"))
            .await
            .ok()?;
        Some((r.status().as_u16(), r.text().await.unwrap_or_default()))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while health().await.map(|h| h.0) != Some(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "the member never answered /healthz"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Running: its dispatcher node has registered.
    w.wait_count(
        "the member's node",
        "SELECT count(*) FROM walhook.dispatch_nodes WHERE node_id = 'local-fanout-0'",
        1,
    )
    .await;

    cluster.kill_spu();
    let killed = std::time::Instant::now();
    let mut unhealthy = None;
    let mut seen = Vec::new();
    while killed.elapsed() < Duration::from_secs(30) {
        let answer = health().await;
        seen.push(format!("{:?}: {answer:?}", killed.elapsed()));
        match answer {
            Some((503, why)) => {
                unhealthy = Some(why);
                break;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            // The process is gone already: the check below says why.
            None => break,
        }
    }
    let why = unhealthy.unwrap_or_else(|| {
        panic!(
            "/healthz never answered 503 while the cluster was away ({}); the member's log:\n{}",
            seen.join(", "),
            std::fs::read_to_string(log.path()).unwrap_or_default()
        )
    });
    assert!(
        why.contains(cluster.endpoint()),
        "/healthz does not name the cluster: {why}"
    );

    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if killed.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!(
                "the member still runs {:?} after the cluster went away:\n{}",
                killed.elapsed(),
                std::fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stderr = std::fs::read_to_string(log.path()).unwrap_or_default();
    assert!(
        !status.success(),
        "the member exited with success: {stderr}"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(60),
        "the member took {:?} to give up",
        killed.elapsed()
    );
    assert!(
        stderr.contains(cluster.endpoint()) && stderr.contains("give_up_after"),
        "the exit does not name the cluster and the setting: {stderr}"
    );
}

/// The dangerous points of each process, hit exactly; after the restart of
/// the process that died nothing is lost, nothing is made twice, and an
/// answered POST that was not recorded is sent again with the same bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_process_crashes_at_its_dangerous_points_and_loses_nothing() {
    let Some(cluster) =
        FluvioCluster::start("each_process_crashes_at_its_dangerous_points_and_loses_nothing")
    else {
        return;
    };
    for (stage, failpoint, resent) in [
        ("capture", "capture.after_handoff=abort@3", false),
        ("capture", "capture.before_confirm=abort@3", false),
        ("fanout", "fanout.after_materialize=abort@1", false),
        ("fanout", "dispatch.after_send=abort@5", true),
    ] {
        let w = delivery_world().await;
        let cfg = w.config(&fluvio_log(&cluster));
        let member = ["--member", "0/1"];
        let env = [("WALHOOK_FAILPOINTS", failpoint)];
        let (mut crashing, other) = if stage == "capture" {
            (
                Child::stage("capture", &cfg, &[], &env),
                Child::stage("fanout", &cfg, &member, &[]),
            )
        } else {
            (
                Child::stage("fanout", &cfg, &member, &env),
                Child::stage("capture", &cfg, &[], &[]),
            )
        };
        w.wait_streaming().await;
        insert_orders(&w, 1..=20).await;
        let status = crashing
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{failpoint} did not fire within 30 s"));
        assert!(!status.success(), "{failpoint}: {status}");
        let before_restart = w.receiver.count();
        let restarted = if stage == "capture" {
            Child::stage("capture", &cfg, &[], &[])
        } else {
            Child::stage("fanout", &cfg, &member, &[])
        };
        let again = assert_delivered_once(&w, &cluster, failpoint, 20).await;
        if resent {
            assert!(
                before_restart >= 5 && again >= 1,
                "{failpoint}: the POST answered before the crash was not sent again \
                 ({before_restart} before the restart, {again} repeats)"
            );
        }
        assert!(restarted.terminate().success(), "{failpoint}");
        assert!(other.terminate().success(), "{failpoint}");
    }
}

/// A cluster of three SPUs that speaks TLS and demands client certificates
/// (`[log.tls]`, files relative to the config; topics replicated three
/// times): `walhook run` with every stage in one process, stopped midway,
/// then capture and two members that join their group as processes of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walhook_runs_on_a_tls_fluvio_cluster_of_three_spus_in_one_process_or_several() {
    let ca = TestCa::new("walhook test CA").unwrap();
    let tls = ClusterTls {
        server: ca.server_cert(&["fluvio.test", "*.fluvio.test"]).unwrap(),
        ca_pem: ca.pem(),
        client_certs: true,
    };
    let Some(cluster) = FluvioCluster::builder(
        "walhook_runs_on_a_tls_fluvio_cluster_of_three_spus_in_one_process_or_several",
    )
    .spus(3)
    .tls(tls)
    .start() else {
        return;
    };
    let w = delivery_world().await;
    let (log, topic) = fluvio_log_named(&cluster);
    let client = ca.client_cert("walhook").unwrap();
    // Three SPUs, each checked as <id>.fluvio.test, every partition on all
    // of them.
    let cfg = w.config(&format!(
        "{log}replication = 3\n[log.tls]\nca_file = \"fluvio-ca.pem\"\ncert_file = \"fluvio-client.pem\"\n\
         key_file = \"fluvio-client.key\"\ndomain = \"fluvio.test\"\n"
    ));
    let dir = cfg.parent().unwrap();
    ca.write_pem(dir, "fluvio-ca.pem").unwrap();
    client.write(dir, "fluvio-client").unwrap();
    let first = Child::run(&cfg);
    w.wait_streaming().await;
    insert_orders(&w, 1..=15).await;
    w.wait_count(
        "events fanned out",
        "SELECT count(*) FROM walhook.events",
        15,
    )
    .await;
    assert!(first.terminate().success(), "a clean stop");
    insert_orders(&w, 16..=30).await;
    // Then the stages as processes of their own, on the same TLS cluster:
    // capture and two members that join their group.
    let split: Vec<Child> = ["capture", "fanout", "fanout"]
        .iter()
        .map(|stage| Child::stage(stage, &cfg, &[], &[]))
        .collect();
    assert_delivered_once(&w, &cluster, "walhook on a TLS cluster of three SPUs", 30).await;
    assert_eq!(
        live_holdings(&w).await.len(),
        4,
        "the members hold every partition"
    );
    // The events went through the cluster, not an in-process log.
    let described = cluster.describe();
    assert!(
        described.lines().any(|l| l.contains(&topic)),
        "no topic {topic} on the cluster:\n{described}"
    );
    for child in split {
        assert!(child.terminate().success());
    }
}

/// A member change (two members, then three) moves partitions between
/// processes without losing or repeating anything: each partition resumes
/// at the group's committed offset, whoever reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_change_rebalances_without_loss() {
    let Some(cluster) = FluvioCluster::start("a_member_change_rebalances_without_loss") else {
        return;
    };
    let w = delivery_world().await;
    let cfg = w.config(&fluvio_log(&cluster));
    let capture_port = free_port().to_string();
    let capture_listen = format!("127.0.0.1:{capture_port}");
    let capture = Child::stage("capture", &cfg, &["--metrics-listen", &capture_listen], &[]);
    let two: Vec<Child> = ["0/2", "1/2"]
        .iter()
        .map(|m| Child::stage("fanout", &cfg, &["--member", m], &[]))
        .collect();
    w.wait_streaming().await;
    insert_orders(&w, 1..=20).await;
    let fanned = w
        .count_reaching(
            "SELECT count(*) FROM walhook.events",
            20,
            Duration::from_secs(60),
        )
        .await;
    if fanned < 20 {
        // Where did the rest stop: in capture, in the log, or in a member?
        panic!(
            "the first orders fanned out: {fanned} of 20 after 60 s; capture counted {} events; {}\nthe cluster:\n{}",
            scrape(&capture_listen, "walhook_capture_events_total").await,
            w.state().await,
            cluster.describe()
        );
    }
    for child in two {
        assert!(child.terminate().success(), "a member did not stop cleanly");
    }
    // Written while no member runs: they wait in the log.
    insert_orders(&w, 21..=30).await;
    let member_listen = format!("127.0.0.1:{}", free_port());
    let three: Vec<Child> = ["0/3", "1/3", "2/3"]
        .iter()
        .map(|m| {
            let metrics: &[&str] = if *m == "0/3" {
                &["--metrics-listen", &member_listen]
            } else {
                &[]
            };
            Child::stage(
                "fanout",
                &cfg,
                &[&["--member", m][..], metrics].concat(),
                &[],
            )
        })
        .collect();
    insert_orders(&w, 31..=40).await;
    assert_delivered_once(&w, &cluster, "a member change", 40).await;
    // Each stage process serves its own metrics.
    assert!(scrape(&capture_listen, "walhook_capture_events_total").await >= 40.0);
    assert!(scrape(&member_listen, "walhook_fanout_events_total").await >= 1.0);
    assert!(
        scrape(
            &member_listen,
            "walhook_dispatch_deliveries_succeeded_total"
        )
        .await
            >= 2.0
    );
    for child in three.into_iter().chain([capture]) {
        assert!(
            child.terminate().success(),
            "a process did not stop cleanly"
        );
    }
}

/// The bytes of a record, whatever it holds (for looking at the events
/// topic from the test).
#[derive(Clone)]
struct Raw;

impl walhook_pipeline::log::Message for Raw {
    fn encode(&self, _: &mut Vec<u8>) {}
    fn decode(_: &[u8]) -> Result<Self, walhook_pipeline::log::LogError> {
        Ok(Raw)
    }
}

/// A fan-out member kept down past the events topic's retention: its
/// restart stops at the records it can no longer read, with an error that
/// names them, records a `log_gap` incident, and `walhook reconcile` over
/// the window shows the gap; it never skips past them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_down_past_retention_stops_at_the_gap_and_reconcile_shows_it() {
    use walhook_pipeline::log::{Consumer, Log};
    let Some(cluster) = FluvioCluster::start(
        "a_member_down_past_retention_stops_at_the_gap_and_reconcile_shows_it",
    ) else {
        return;
    };
    let w = World::new().await;
    w.endpoint("acme", "acme-a", &[]).await;
    let (log, topic) = fluvio_log_named(&cluster);
    // Fluvio's least retention and smallest segments.
    let cfg = w.config(&format!("{log}retention = \"10s\"\nsegment_size = 1024\n"));
    let _capture = Child::stage("capture", &cfg, &[], &[]);
    let member = Child::stage("fanout", &cfg, &["--member", "0/1"], &[]);
    w.wait_streaming().await;
    insert_orders(&w, 1..=8).await;
    w.wait_count(
        "first wave fanned out",
        "SELECT count(*) FROM walhook.events",
        8,
    )
    .await;
    assert!(member.terminate().success());
    // Written while the member is down; capture stores them in the topic.
    write_orders(&w, 9..=100, Duration::from_millis(10))
        .await
        .unwrap();

    // Wait until retention removed records the member had not read: a group
    // without a stored position then starts past every offset of the first
    // wave (at most 8 per partition) on some partition.
    let mut settings = walhook_connectors::fluvio::FluvioSettings::new(cluster.endpoint());
    settings.retention = Duration::from_secs(10);
    settings.segment_size = 1024;
    let spec = walhook_pipeline::runtime::events_topic(&topic, 4, 0);
    let fluvio = walhook_connectors::fluvio::FluvioLog::connect(settings, vec![spec])
        .await
        .expect("the test's own look at the topic");
    let started = std::time::Instant::now();
    'evicted: loop {
        for p in 0..4 {
            let group = format!("look-{}-{p}", started.elapsed().as_millis());
            let mut look = fluvio.consumer::<Raw>(&topic, p, &group).await.unwrap();
            let first = tokio::time::timeout(Duration::from_secs(5), look.poll(1)).await;
            if let Ok(Ok(records)) = first
                && records[0].offset.0 > 8
            {
                break 'evicted;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "retention removed nothing within 180 s\n{}",
            cluster.describe()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut restarted = Child(
        crate::support::walhook()
            .args(["fanout", "--config"])
            .arg(&cfg)
            .args(["--member", "0/1"])
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap(),
    );
    let status = restarted.wait_exit(Duration::from_secs(60));
    let said = std::fs::read_to_string(stderr.path()).unwrap();
    let Some(status) = status else {
        panic!(
            "the member stops at the gap instead of reading past it; within 60 s it said:\n{said}\n{}",
            cluster.describe()
        );
    };
    assert!(!status.success(), "{said}");
    assert!(
        said.contains("are gone from the log before group") && said.contains(&topic),
        "{said}"
    );
    // One incident per partition found with a gap: the first stops the
    // member, and another partition's reader may find its own gap first.
    let (incidents, all_say_why): (i64, Option<bool>) = {
        let row = w
            .platform_sql
            .query_one(
                "SELECT count(*), bool_and(detail LIKE '%[log] retention%') FROM walhook.incidents \
                 WHERE stage = 'fanout' AND kind = 'log_gap' AND resolved_at IS NULL",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(
        (1..=4).contains(&incidents),
        "a log_gap incident per partition with a gap: {incidents}"
    );
    assert_eq!(all_say_why, Some(true), "each names [log] retention");

    let now = chrono::Utc::now();
    let fmt =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let out = crate::support::run(
        crate::support::walhook()
            .args(["reconcile", "--config"])
            .arg(&cfg)
            .args(["--format", "json"])
            .args(["--since", &fmt(now - chrono::Duration::minutes(10))])
            .args(["--until", &fmt(now + chrono::Duration::minutes(1))]),
    );
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(3),
        "reconcile reports gaps: {report}"
    );
    assert!(
        report.contains("log_gap on ") && report.contains("capture_incident"),
        "{report}"
    );
}

/// Waits until every follower has caught up with its leader; a follower
/// that lags without moving for 20 s gets its copy dropped (see the
/// failover test). When the same followers are stuck again after that, the
/// partition's leader is restarted: on a loaded machine (CI) a follower
/// copied afresh was seen to stop at the first record the new leader
/// wrote, again and again, with the leader's high watermark held there,
/// and only new connections to the leader moved it. Gives up after two
/// minutes (the test's own checks then say what is missing).
async fn heal_stuck_followers(cluster: &FluvioCluster) {
    let started = std::time::Instant::now();
    let mut stuck_since: Option<(Vec<(String, u32)>, std::time::Instant)> = None;
    let mut dropped: Option<Vec<(String, u32)>> = None;
    let mut caught_up = 0;
    while started.elapsed() < Duration::from_secs(120) {
        let lagging = cluster.lagging_replicas();
        if lagging.is_empty() {
            caught_up += 1;
            if caught_up >= 3 {
                return;
            }
            stuck_since = None;
        } else {
            caught_up = 0;
            match &stuck_since {
                Some((same, since)) if *same == lagging => {
                    if since.elapsed() > Duration::from_secs(20) {
                        if dropped.as_ref() == Some(&lagging) {
                            let leaders: BTreeSet<u32> = lagging
                                .iter()
                                .filter_map(|(partition, _)| cluster.leader_of_named(partition))
                                .collect();
                            eprintln!(
                                "Fluvio left the same followers behind after their copies were dropped: {lagging:?}; restarting their leaders {leaders:?}\n{}",
                                cluster.describe()
                            );
                            for leader in leaders {
                                cluster.restart_spu_id(leader);
                            }
                            dropped = None;
                        } else {
                            eprintln!(
                                "Fluvio left followers behind for 20 s: {lagging:?}; dropping their copies\n{}",
                                cluster.describe()
                            );
                            for (partition, spu) in &lagging {
                                cluster.reset_replica(*spu, partition);
                            }
                            dropped = Some(lagging.clone());
                        }
                        stuck_since = None;
                    }
                }
                _ => stuck_since = Some((lagging, std::time::Instant::now())),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Leader failover on a replicated cluster: three SPUs, every partition on
/// all three; the SPU leading the events topic's partition 0 is SIGKILLed
/// while capture writes and two fan-out members read. A follower takes
/// over the lead. Fluvio (0.50) commits a record only once every replica
/// has it, so no record is committed while the dead SPU is away: capture
/// waits (its slot holds the changes) and the members wait, and once the
/// SPU is back and has caught up, everything flows: nothing lost, nothing
/// delivered twice beyond at least once (resends carry the first bytes), no
/// process restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_leader_dies_under_load_and_a_replica_takes_over_with_nothing_lost() {
    let Some(cluster) = FluvioCluster::builder(
        "a_partition_leader_dies_under_load_and_a_replica_takes_over_with_nothing_lost",
    )
    .spus(3)
    .start() else {
        return;
    };
    let w = delivery_world().await;
    let (log, topic) = fluvio_log_named(&cluster);
    let cfg = w.config(&format!("{log}replication = 3\n"));
    let mut capture = Child::stage("capture", &cfg, &[], &[]);
    let mut member0 = Child::stage("fanout", &cfg, &["--member", "0/2"], &[]);
    let mut member1 = Child::stage("fanout", &cfg, &["--member", "1/2"], &[]);
    w.wait_streaming().await;
    insert_orders(&w, 1..=10).await;
    w.wait_count(
        "first orders fanned out",
        "SELECT count(*) FROM walhook.events",
        10,
    )
    .await;

    let leader = cluster
        .leader_of(&topic, 0)
        .unwrap_or_else(|| panic!("no leader for {topic}-0:\n{}", cluster.describe()));
    let writer = write_orders(&w, 11..=150, Duration::from_millis(20));
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.kill_spu_id(leader);
    let killed = std::time::Instant::now();
    // A replica leads now.
    loop {
        match cluster.leader_of(&topic, 0) {
            Some(now) if now != leader => break,
            _ => {}
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no other SPU took over {topic}-0 from {leader}:\n{}",
            cluster.describe()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Down for a few seconds while the writes go on, then back on the same
    // ports and data: it rejoins as a follower and catches up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_all_running(
        &mut [&mut capture, &mut member0, &mut member1],
        "while the leader is down",
    );
    cluster.restart_spu_id(leader);
    writer.await.unwrap();
    // Fluvio 0.50 now and then leaves followers behind after a failover
    // (about one run in four here: on one partition a follower stops
    // fetching, its log ends at the offset of the crash while the leader's
    // grows, and since a record commits only on every replica, the
    // partition commits nothing more). That is the broker's recovery, not
    // walhook's; the operator's remedy (drop the stuck SPU's copy of the
    // partition, let it fetch afresh) is applied here, loudly, so that the
    // test checks walhook's part: nothing lost, nothing twice.
    heal_stuck_followers(&cluster).await;
    assert_delivered_once(&w, &cluster, "leader failover", 150).await;
    assert_all_running(
        &mut [&mut capture, &mut member0, &mut member1],
        "leader failover",
    );

    // The old leader follows now; traffic goes on.
    insert_orders(&w, 151..=160).await;
    assert_delivered_once(&w, &cluster, "after the old leader's return", 160).await;
    assert_all_running(
        &mut [&mut capture, &mut member0, &mut member1],
        "after the old leader's return",
    );
    assert_recent_window_reconciles(&cfg);
}

/// The partitions held by live members, as (partition, slot).
async fn live_holdings(w: &World) -> Vec<(i32, i32)> {
    w.platform_sql
        .query(
            "SELECT p.partition, p.slot FROM walhook.stage_partitions p \
             JOIN walhook.stage_members m ON m.grp = p.grp AND m.slot = p.slot AND m.epoch = p.epoch \
             WHERE m.lease_until > now() ORDER BY p.partition",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Waits until the live holdings satisfy `done`; panics after `limit`
/// naming `what`. Returns how long it took.
async fn wait_holdings(
    w: &World,
    what: &str,
    limit: Duration,
    done: impl Fn(&[(i32, i32)]) -> bool,
) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let now = live_holdings(w).await;
        if done(&now) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{what}: not within {limit:?}; live holdings (partition, slot): {now:?}\n{}",
            w.state().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every one of `partitions` held once, and each of `slots` holding
/// exactly `each`.
fn shared_evenly(h: &[(i32, i32)], partitions: i32, slots: &[i32], each: usize) -> bool {
    let all: Vec<i32> = h.iter().map(|&(p, _)| p).collect();
    all == (0..partitions).collect::<Vec<_>>()
        && slots
            .iter()
            .all(|s| h.iter().filter(|&&(_, held)| held == *s).count() == each)
}

/// The value of the series `name` whose labels contain `label`.
async fn scrape_labelled(listen: &str, name: &str, label: &str) -> f64 {
    let (_, text) = try_scrape(listen, "#none").await;
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("{name}{{{label}}} missing from\n{text}"))
}

/// Four `walhook fanout` members started without `--member` join the group
/// and share the partitions, one each. A member frozen (SIGSTOP) past its
/// lease loses its partitions to the others, and once resumed its commit
/// for the batch it held is refused (the fence), after which it takes a
/// share again. A member killed (SIGKILL) loses its partitions within the
/// lease; started again, it takes its share back. Nothing is lost, nothing
/// is delivered twice beyond at-least-once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_without_a_share_split_the_partitions_and_move_them_when_one_dies_or_freezes() {
    let Some(cluster) = FluvioCluster::start(
        "members_without_a_share_split_the_partitions_and_move_them_when_one_dies_or_freezes",
    ) else {
        return;
    };
    let w = delivery_world().await;
    let lease = Duration::from_secs(4);
    let cfg = w.config(&format!("{}member_lease = \"4s\"\n", fluvio_log(&cluster)));
    let capture = Child::stage("capture", &cfg, &[], &[]);
    // The first member holds its first batch for 6 s between storing it
    // and committing its offset: frozen there, it has work it may no
    // longer commit when it wakes.
    let a_listen = format!("127.0.0.1:{}", free_port());
    let a = Child::stage(
        "fanout",
        &cfg,
        &["--metrics-listen", &a_listen],
        &[(
            "WALHOOK_FAILPOINTS",
            "fanout.after_materialize=sleep(6000)@1",
        )],
    );
    wait_holdings(
        &w,
        "the first member holds every partition",
        Duration::from_secs(60),
        |h| shared_evenly(h, 4, &[0], 4),
    )
    .await;
    w.wait_streaming().await;
    insert_orders(&w, 1..=1).await;
    w.wait_count(
        "the first order stored",
        "SELECT count(*) FROM walhook.events",
        1,
    )
    .await;
    a.signal("STOP");
    let others: Vec<Child> = (0..3)
        .map(|_| Child::stage("fanout", &cfg, &[], &[]))
        .collect();
    wait_holdings(
        &w,
        "the frozen member's partitions taken over",
        lease * 6,
        |h| h.len() == 4 && h.iter().all(|&(_, s)| s != 0),
    )
    .await;
    insert_orders(&w, 2..=10).await;
    a.signal("CONT");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while scrape_labelled(
        &a_listen,
        "walhook_member_fenced_commits_total",
        "member=\"0\"",
    )
    .await
        < 1.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the resumed member's commit was not refused"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_holdings(
        &w,
        "four members, one partition each",
        Duration::from_secs(60),
        |h| shared_evenly(h, 4, &[0, 1, 2, 3], 1),
    )
    .await;
    assert_eq!(
        scrape_labelled(&a_listen, "walhook_member_partitions", "member=\"0\"").await,
        1.0
    );
    // A fixed share does not start beside members that joined.
    let why = refused_fanout(&cfg, &["--member", "0/2"]);
    assert!(
        why.contains("--member 0/2: members that joined group") && why.contains("without --member"),
        "{why}"
    );
    assert!(
        scrape_labelled(
            &a_listen,
            "walhook_member_assignment_changes_total",
            "member=\"0\""
        )
        .await
            >= 3.0
    );

    // SIGKILL the member in slot 1: within its lease (and a renewal), the
    // others hold its partition.
    let mut others = others;
    let pid_of_slot = |slot: i32| {
        let w = &w;
        async move {
            w.platform_sql
                .query_one(
                    "SELECT holder FROM walhook.stage_members WHERE slot = $1",
                    &[&slot],
                )
                .await
                .unwrap()
                .get::<_, String>(0)
        }
    };
    let holder = pid_of_slot(1).await;
    let victim = others
        .iter()
        .position(|c| holder.ends_with(&format!("pid {}", c.0.id())))
        .unwrap_or_else(|| panic!("no child is {holder:?}"));
    others.remove(victim).kill();
    let moved = wait_holdings(&w, "the killed member's partition moved", lease * 4, |h| {
        shared_evenly(h, 4, &[], 0) && h.iter().all(|&(_, s)| s != 1)
    })
    .await;
    assert!(
        moved <= lease + lease / 2 + Duration::from_secs(2),
        "the killed member's partition moved after {moved:?}, not within its lease"
    );
    insert_orders(&w, 11..=20).await;
    // Started again, it takes the free slot and a share.
    others.push(Child::stage("fanout", &cfg, &[], &[]));
    wait_holdings(
        &w,
        "rebalanced after the restart",
        Duration::from_secs(60),
        |h| shared_evenly(h, 4, &[0, 1, 2, 3], 1),
    )
    .await;
    insert_orders(&w, 21..=30).await;
    assert_delivered_once(&w, &cluster, "members without a share", 30).await;
    for child in others.into_iter().chain([a, capture]) {
        assert!(
            child.terminate().success(),
            "a process did not stop cleanly"
        );
    }
    // Stopped in order, every member gave its partitions back.
    assert_eq!(live_holdings(&w).await, Vec::<(i32, i32)>::new());
}

/// `walhook chaos --log fluvio`: fault rounds on capture and two fan-out
/// members as separate processes over a throwaway Fluvio cluster (process
/// kills, failpoints, an SPU crash, a member frozen past its lease, a
/// kill -9 of Postgres), judged against the business database.
#[tokio::test]
async fn walhook_chaos_on_fluvio_rounds_are_clean() {
    chaos_on_fluvio_is_clean(
        "walhook_chaos_on_fluvio_rounds_are_clean",
        &[
            "sigkill",
            "spu-kill",
            "member-freeze",
            "capture.after_handoff",
            "fanout.after_materialize",
            "fanout.after_commit",
            "dispatch.after_send",
            "postgres-kill",
        ],
        false,
    );
}

#[tokio::test]
async fn walhook_chaos_on_fluvio_with_dispatch_by_endpoint_rounds_are_clean() {
    chaos_on_fluvio_is_clean(
        "walhook_chaos_on_fluvio_with_dispatch_by_endpoint_rounds_are_clean",
        &[
            "sigkill",
            "dispatch.after_send",
            "member-freeze",
            "fanout.after_materialize",
            "dispatch.after_record",
            "spu-kill",
        ],
        true,
    );
}

/// `walhook chaos --log fluvio` with one round of each of `faults` (and
/// `--by-endpoint` when asked): nothing lost or changed, and each fault hit
/// a process of the stage it names.
fn chaos_on_fluvio_is_clean(test: &str, faults: &[&str], by_endpoint: bool) {
    if walhook_devkit::fluvio::find_tools().is_none() {
        assert!(
            std::env::var(walhook_devkit::fluvio::REQUIRED_ENV).as_deref() != Ok("1"),
            "{test}: no Fluvio tools"
        );
        eprintln!("{test}: skipped: no Fluvio tools (set WALHOOK_FLUVIO_TOOLS)");
        return;
    }
    let faults_arg = faults.join(",");
    let rounds_arg = faults.len().to_string();
    let mut args = vec![
        "--log",
        "fluvio",
        "--rounds",
        &rounds_arg,
        "--seed",
        "3",
        "--writes",
        "60",
        "--faults",
        &faults_arg,
    ];
    if by_endpoint {
        args.push("--by-endpoint");
    }
    let (report, text) = crate::support::run_chaos(&args);
    let rounds = report["rounds"].as_array().unwrap();
    let seen: HashSet<&str> = rounds
        .iter()
        .map(|r| r["fault"].as_str().unwrap())
        .collect();
    assert_eq!(seen, faults.iter().copied().collect::<HashSet<_>>());
    for r in rounds {
        assert!(r["expected"].as_u64().unwrap() > 0, "{r}");
        for field in ["lost", "unexpected", "unstable_ids", "bad_signatures"] {
            assert_eq!(r[field], 0, "{field}: {r}");
        }
        let fault = r["fault"].as_str().unwrap();
        let injected = r["injected"].as_str().unwrap();
        // A dispatch member reads only its partitions' endpoints, which
        // may be few in a round: its failpoint may stay unreached there.
        let may_miss = by_endpoint && fault.starts_with("dispatch.");
        if (fault.contains('.') || fault == "sigkill") && !may_miss {
            assert_eq!(r["walhook_restarted"], true, "{r}");
        }
        // Each fault hit the process its stage names.
        if fault.starts_with("capture.") {
            assert!(injected.contains("walhook capture"), "{r}");
        }
        let dispatching = if by_endpoint {
            "a dispatch member"
        } else {
            "a fan-out member"
        };
        if fault.starts_with("fanout.") {
            assert!(injected.contains("a fan-out member"), "{r}");
        }
        if fault.starts_with("dispatch.") {
            assert!(injected.contains(dispatching), "{r}");
        }
        if fault == "member-freeze" {
            assert!(
                injected.contains("a fan-out member") || injected.contains(dispatching),
                "{r}"
            );
        }
    }
    assert_eq!(report["clean"], true);
    assert!(
        text.contains("walhook capture and 2 fan-out members"),
        "{text}"
    );
    if by_endpoint {
        assert!(text.contains("2 dispatch members"), "{text}");
    }
}

/// The live holdings (partition, slot) of the dispatch group.
async fn dispatch_holdings(w: &World) -> Vec<(i32, i32)> {
    w.platform_sql
        .query(
            "SELECT p.partition, p.slot FROM walhook.stage_partitions p \
             JOIN walhook.stage_members m ON m.grp = p.grp AND m.slot = p.slot AND m.epoch = p.epoch \
             WHERE m.lease_until > now() AND p.grp LIKE '%/dispatch' ORDER BY p.partition",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispatch_members_by_endpoint_hold_each_endpoints_in_flight_cap_across_members() {
    let Some(cluster) = FluvioCluster::start(
        "dispatch_members_by_endpoint_hold_each_endpoints_in_flight_cap_across_members",
    ) else {
        return;
    };
    let w = World::new().await;
    // Slow receivers with a cap of 2 each: with a dispatcher per member
    // each would see up to 2 per member.
    let paths: Vec<String> = (0..4).map(|i| format!("slow-{i}")).collect();
    // And one that fails at first: its retries are held by the dispatcher
    // of its partition (rows leased to that node), and taken over with it.
    // Retries up to 20 s later (full jitter): held long enough to be
    // seen before the kill.
    let flaky = w
        .endpoint_with("acme", "flaky", &[], |e| {
            e.retry.base_delay_seconds = Some(20);
        })
        .await;
    w.receiver.set_behaviour(
        "flaky",
        walhook_devkit::receiver::Behaviour::FailFirst { n: 3, status: 503 },
    );
    for path in &paths {
        w.endpoint_with("acme", path, &[], |e| e.max_in_flight = Some(2))
            .await;
        w.receiver.set_behaviour(
            path,
            walhook_devkit::receiver::Behaviour::Delay {
                wait: Duration::from_millis(150),
                status: 200,
            },
        );
    }
    let lease = Duration::from_secs(4);
    let cfg = w.config(&format!(
        "{}dispatch = \"by-endpoint\"\ndeliveries_partitions = 2\nmember_lease = \"4s\"\n",
        fluvio_log(&cluster)
    ));
    let mut capture = Child::stage("capture", &cfg, &[], &[]);
    let mut fanout = Child::stage("fanout", &cfg, &[], &[]);
    let a = Child::stage("dispatch", &cfg, &[], &[]);
    let b = Child::stage("dispatch", &cfg, &[], &[]);
    let started = std::time::Instant::now();
    loop {
        let h = dispatch_holdings(&w).await;
        if h.len() == 2 && h[0].1 != h[1].1 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "two dispatch members should hold one deliveries partition each: {h:?}\n{}",
            w.state().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    w.wait_streaming().await;
    let orders = 40i64;
    insert_orders(&w, 1..=20).await;
    // The member that dispatches the flaky endpoint is killed once its
    // first failures are recorded (their retries held by its dispatcher):
    // the partition moves to the other member within the lease, with the
    // retries and the jobs it had read.
    assert!(
        w.receiver
            .wait_until(Duration::from_secs(60), |got| {
                got.iter().any(|r| r.path == "flaky" && r.status == 503)
            })
            .await,
        "nothing was sent: {}",
        w.state().await
    );
    let flaky_partition = walhook_pipeline::routing::partition_of(
        flaky,
        walhook_pipeline::ids::DeliveryId([0; 16]),
        2,
        1,
    ) as i32;
    let holder: String = w
        .platform_sql
        .query_one(
            "SELECT m.holder FROM walhook.stage_partitions p \
             JOIN walhook.stage_members m ON m.grp = p.grp AND m.slot = p.slot AND m.epoch = p.epoch \
             WHERE p.grp LIKE '%/dispatch' AND p.partition = $1",
            &[&flaky_partition],
        )
        .await
        .unwrap()
        .get(0);
    let (victim, mut b) = if holder.ends_with(&format!(" pid {}", a.0.id())) {
        (a, b)
    } else {
        (b, a)
    };
    // Its failures recorded: rows held by the victim's dispatcher.
    let started = std::time::Instant::now();
    let held_retries = loop {
        let held: i64 = w
            .platform_sql
            .query_one(
                "SELECT count(*) FROM walhook.pending WHERE endpoint_id = $1 AND lease_owner IS NOT NULL",
                &[&uuid::Uuid::from_bytes(flaky.0)],
            )
            .await
            .unwrap()
            .get(0);
        if held > 0 || started.elapsed() > Duration::from_secs(5) {
            break held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    victim.kill();
    insert_orders(&w, 21..=orders).await;
    let all_paths: Vec<&str> = paths.iter().map(String::as_str).chain(["flaky"]).collect();
    wait_every_order(
        &w,
        &cluster,
        "after a dispatch member's SIGKILL",
        &all_paths,
        orders,
        lease * 2 + Duration::from_secs(90),
    )
    .await;
    let survivor = dispatch_holdings(&w).await;
    assert!(
        survivor.len() == 2 && survivor[0].1 == survivor[1].1,
        "the survivor should hold both deliveries partitions: {survivor:?}"
    );
    for path in &paths {
        let peak = w.receiver.peak_in_flight(path);
        assert!(
            peak <= 2,
            "{path} (max_in_flight = 2) saw {peak} requests at once with two dispatch members"
        );
        assert!(peak >= 1);
    }
    // The load pressed against the cap (it would have been 2 per member).
    assert!(
        paths.iter().any(|p| w.receiver.peak_in_flight(p) == 2),
        "no endpoint reached its cap: the test shows nothing"
    );
    let want = orders * all_paths.len() as i64;
    w.wait_count(
        "every delivery succeeded",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        want,
    )
    .await;
    let (events, made, twice, nodes): (i64, i64, i64, i64) = {
        let r = w
            .platform_sql
            .query_one(
                "SELECT (SELECT count(*) FROM walhook.events), (SELECT count(*) FROM walhook.deliveries), \
                        (SELECT count(*) FROM (SELECT 1 FROM walhook.attempts GROUP BY delivery_id, id \
                                               HAVING count(*) > 1) t), \
                        (SELECT count(*) FROM walhook.dispatch_nodes WHERE node_id LIKE '%-dispatch-%-p%')",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    assert_eq!(
        (events, made, twice),
        (orders, want, 0),
        "events, deliveries, attempt ids twice"
    );
    assert!(
        nodes >= 3,
        "a dispatcher node per partition and holding (two, then the survivor's take-over): {nodes}"
    );
    // Every webhook-id once or resent with the same bytes; signatures hold.
    let (ids, _) = resends_identical(&w, "dispatch by endpoint");
    assert_eq!(ids as i64, want);
    w.assert_pending_consistent().await;
    w.assert_plans_written().await;
    assert!(
        held_retries >= 1,
        "the killed member held no retry of the flaky endpoint: the test shows less than it says"
    );
    assert_all_running(&mut [&mut capture, &mut fanout, &mut b], "after the kill");
    // The killed member comes back: the partitions split again.
    let a = Child::stage("dispatch", &cfg, &[], &[]);
    let started = std::time::Instant::now();
    loop {
        let h = dispatch_holdings(&w).await;
        if h.len() == 2 && h[0].1 != h[1].1 {
            break;
        }
        assert!(
            started.elapsed() < lease * 6,
            "the restarted member should take a partition back: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    insert_orders(&w, orders + 1..=orders + 4).await;
    w.wait_count(
        "the orders after the rebalance delivered",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        want + 4 * all_paths.len() as i64,
    )
    .await;
    for path in &paths {
        assert!(w.receiver.peak_in_flight(path) <= 2, "{path}");
    }
    drop(a);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walhook_run_on_fluvio_dispatches_by_endpoint_in_one_process_and_stops_cleanly() {
    let Some(cluster) = FluvioCluster::start(
        "walhook_run_on_fluvio_dispatches_by_endpoint_in_one_process_and_stops_cleanly",
    ) else {
        return;
    };
    let w = delivery_world().await;
    let cfg = w.config(&format!(
        "{}dispatch = \"by-endpoint\"\ndeliveries_partitions = 3\n",
        fluvio_log(&cluster)
    ));
    let first = Child::run(&cfg);
    w.wait_streaming().await;
    insert_orders(&w, 1..=10).await;
    w.wait_count(
        "the first orders delivered",
        "SELECT count(*) FROM walhook.deliveries WHERE status = 'succeeded'",
        20,
    )
    .await;
    assert!(first.terminate().success(), "a clean stop");
    insert_orders(&w, 11..=20).await;
    let second = Child::run(&cfg);
    assert_delivered_once(&w, &cluster, "walhook run with dispatch by endpoint", 20).await;
    // The jobs went through the cluster's deliveries topic.
    let described = cluster.describe();
    assert!(
        described.lines().any(|l| l.contains("-deliveries ")),
        "no deliveries topic on the cluster:\n{described}"
    );
    // Its dispatchers ran as one node per deliveries partition.
    let nodes: i64 = w
        .platform_sql
        .query_one(
            "SELECT count(DISTINCT substring(node_id from '-p[0-9]+\\.')) FROM walhook.dispatch_nodes",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(nodes, 3, "a dispatcher per deliveries partition");
    assert!(second.terminate().success());
}

/// `walhook doctor` on Fluvio: a topic the first start will create is
/// fine; one that exists with another partition count is named with the
/// fix, as the start would refuse it; nothing is created by the check.
#[tokio::test]
async fn doctor_reads_the_fluvio_topics_without_creating_them() {
    let Some(cluster) =
        FluvioCluster::start("doctor_reads_the_fluvio_topics_without_creating_them")
    else {
        return;
    };
    let w = World::new().await;
    let (log, events) = fluvio_log_named(&cluster);
    let cfg = w.config(&log);
    let doctor = || {
        crate::support::run(
            crate::support::walhook()
                .args(["doctor", "--json", "--config"])
                .arg(&cfg),
        )
    };
    let out = doctor();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", crate::support::stderr(&out)));
    let topic = |report: &serde_json::Value| {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == format!("log.topic.{events}"))
            .cloned()
            .unwrap_or_else(|| panic!("no finding for {events}: {report}"))
    };
    assert_eq!(report["ok"], true, "{report}");
    let found = topic(&report);
    assert_eq!(found["verdict"], "ok");
    assert!(
        found["detail"]
            .as_str()
            .unwrap()
            .contains("does not exist yet"),
        "{found}"
    );

    // The topic made with 2 partitions where the config asks for 4.
    let two_partitions = vec![walhook_pipeline::log::TopicSpec {
        name: events.clone(),
        partitions: 2,
        capacity: 1024,
        durable_groups: vec![],
    }];
    let settings = walhook_connectors::fluvio::FluvioSettings::new(cluster.endpoint().to_owned());
    walhook_connectors::fluvio::FluvioLog::connect(settings.clone(), two_partitions.clone())
        .await
        .unwrap();
    let out = doctor();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let found = topic(&report);
    assert_eq!(found["verdict"], "fail", "{found}");
    assert!(
        found["detail"]
            .as_str()
            .unwrap()
            .contains("has 2 partitions but the configuration asks for 4"),
        "{found}"
    );
    // Still 2: the check changed nothing.
    let reports = walhook_connectors::fluvio::FluvioLog::inspect(settings, two_partitions.clone())
        .await
        .unwrap();
    assert!(reports[0].verdict.is_ok(), "{reports:?}");
}
