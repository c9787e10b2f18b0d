//! The Fluvio log against a real cluster (one SC, one SPU on loopback,
//! started from the tools built from Fluvio's source; skipped, with the
//! reason printed, where none can be had).

use std::time::Duration;

use walhook_connectors::fluvio::{ClientIdentity, FluvioLog, FluvioSettings, FluvioTls, TlsVerify};
use walhook_devkit::fluvio::FluvioCluster;
use walhook_devkit::tls::TestCa;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::contract::{self, TestRecord};
use walhook_pipeline::log::{Consumer, Log, Producer, TopicSpec};

/// A topic of `partitions` partitions (the embedded log's settings left
/// out: a Fluvio topic has no use for them).
fn topic(name: &str, partitions: u32) -> TopicSpec {
    TopicSpec {
        name: name.into(),
        partitions,
        capacity: 0,
        durable_groups: vec![],
    }
}

fn settings(cluster: &FluvioCluster) -> FluvioSettings {
    FluvioSettings::new(cluster.endpoint())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_contract_holds_on_a_real_cluster() {
    let Some(cluster) = FluvioCluster::start("the_log_contract_holds_on_a_real_cluster") else {
        return;
    };
    let settings = settings(&cluster);
    contract::run_all(|topics| FluvioLog::connect(settings.clone(), topics))
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("the Fluvio log keeps the log contract");
}

/// The contract again on three SPUs, every partition on all three
/// (replication 3): what a production cluster looks like.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_contract_holds_on_a_replicated_cluster() {
    let Some(cluster) = FluvioCluster::builder("the_log_contract_holds_on_a_replicated_cluster")
        .spus(3)
        .start()
    else {
        return;
    };
    let mut settings = settings(&cluster);
    settings.replication = 3;
    contract::run_all(|topics| FluvioLog::connect(settings.clone(), topics))
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("the Fluvio log keeps the log contract with three replicas");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_another_partition_count_is_refused() {
    let Some(cluster) = FluvioCluster::start("a_topic_with_another_partition_count_is_refused")
    else {
        return;
    };
    let spec = |partitions| topic("walhook-mismatch", partitions);
    FluvioLog::connect(settings(&cluster), vec![spec(2)])
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("creates the topic");
    let err = FluvioLog::connect(settings(&cluster), vec![spec(3)])
        .await
        .err()
        .expect("another partition count is refused");
    let text = format!("{:#}", anyhow::Error::from(err));
    assert!(
        text.contains("has 2 partitions") && text.contains("asks for 3"),
        "{text}"
    );
}

/// Records written before the SPU is killed and after it is back are all
/// read, in order, by a consumer that stayed open across the crash; its
/// group's commit survives the crash too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_and_a_producer_ride_out_a_broker_crash() {
    let Some(cluster) = FluvioCluster::start("a_consumer_and_a_producer_ride_out_a_broker_crash")
    else {
        return;
    };
    if std::env::var(walhook_devkit::fluvio::ENDPOINT_ENV).is_ok() {
        eprintln!(
            "skipped: the SPU of a cluster named by WALHOOK_FLUVIO_ENDPOINT is not ours to kill"
        );
        return;
    }
    let topic = topic("walhook-crash", 1);
    let log = FluvioLog::connect(settings(&cluster), vec![topic])
        .await
        .expect("connect");
    let producer = log
        .producer::<TestRecord>("walhook-crash")
        .expect("producer");
    let send = |from: u64| {
        let producer = producer.clone();
        async move {
            let batch = (from..from + 50)
                .map(|i| (b"k".to_vec(), TestRecord(i, String::new())))
                .collect();
            producer.send_all(batch).await?.await
        }
    };
    send(0).await.expect("first half stored");
    let mut consumer = log
        .consumer::<TestRecord>("walhook-crash", 0, "g")
        .await
        .expect("consumer");
    let mut seen = Vec::new();
    while seen.len() < 50 {
        seen.extend(consumer.poll(100).await.expect("poll"));
    }
    consumer.commit(Offset(50)).await.expect("commit");

    cluster.restart_spu();

    let second = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match send(50).await {
                Ok(()) => return,
                Err(e) => {
                    eprintln!("send after the crash: {e:#}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    second
        .await
        .expect("the producer recovers after the SPU restart");
    let read = tokio::time::timeout(Duration::from_secs(60), async {
        while seen.iter().filter(|r| r.message.0 >= 50).count() < 50 {
            seen.extend(consumer.poll(100).await.expect("poll after the crash"));
        }
    });
    read.await
        .expect("the consumer reads what was sent after the crash");
    // At least once: a retried batch may repeat, never reorder or skip.
    let mut numbers: Vec<u64> = seen.iter().map(|r| r.message.0).collect();
    numbers.dedup();
    let distinct: std::collections::BTreeSet<u64> = numbers.iter().copied().collect();
    assert_eq!(distinct.len(), 100, "every record read: {numbers:?}");
    drop(consumer);
    let mut again = log
        .consumer::<TestRecord>("walhook-crash", 0, "g")
        .await
        .expect("consumer after the crash");
    let first = again.poll(1).await.expect("poll");
    assert_eq!(
        first[0].offset,
        Offset(50),
        "the group resumes at its commit made before the crash"
    );
}

/// The probe sees a partition without a live leader while the SPU is down,
/// and the log reports how long the cluster has failed; once the SPU is
/// back the probe succeeds and the log answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_tells_when_the_cluster_cannot_serve() {
    use walhook_connectors::fluvio::Reachability;
    let Some(cluster) = FluvioCluster::start("the_probe_tells_when_the_cluster_cannot_serve")
    else {
        return;
    };
    let topic = topic("walhook-probed", 2);
    let mut settings = settings(&cluster);
    settings.give_up_after = Duration::from_secs(1);
    let log = FluvioLog::connect(settings, vec![topic])
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("connects");
    log.probe()
        .await
        .expect("a healthy cluster passes the probe");
    assert_eq!(log.reachability(), Reachability::Answering);

    cluster.kill_spu();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let error = loop {
        match log.probe().await {
            Err(e) => break format!("{:#}", anyhow::Error::from(e)),
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the probe still passes 20 s after the SPU died"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(error.contains("walhook-probed-"), "{error}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let _ = log.probe().await;
    let said = log
        .unreachable_past_limit()
        .expect("past give_up_after the log says the cluster is unreachable");
    assert!(
        said.contains(cluster.endpoint()) && said.contains("give_up_after"),
        "{said}"
    );

    cluster.restart_spu();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while log.probe().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe still fails 30 s after the SPU came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(log.reachability(), Reachability::Answering);
}

/// A group's lag per partition: what was stored after its committed
/// position, and everything on a partition it never read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_lag_counts_what_each_group_has_not_committed() {
    use walhook_connectors::fluvio::ConsumerLag;
    let Some(cluster) =
        FluvioCluster::start("consumer_lag_counts_what_each_group_has_not_committed")
    else {
        return;
    };
    let topic = topic("walhook-lagging", 2);
    let log = FluvioLog::connect(settings(&cluster), vec![topic])
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("connects");
    let producer = log
        .producer::<TestRecord>("walhook-lagging")
        .expect("producer");
    // Keys that land on partition 0 and on partition 1.
    let key_on = |p: u32| {
        (0u32..)
            .map(|i| format!("k{i}").into_bytes())
            .find(|k| walhook_pipeline::log::partition_for(k, 2) == p)
            .unwrap()
    };
    let batch = (0..5u64)
        .map(|i| (key_on(0), TestRecord(i, String::new())))
        .chain((0..3u64).map(|i| (key_on(1), TestRecord(i, String::new()))))
        .collect();
    let sent = std::time::SystemTime::now();
    producer.send_all(batch).await.unwrap().await.unwrap();
    let mut consumer = log
        .consumer::<TestRecord>("walhook-lagging", 0, "g")
        .await
        .expect("consumer");
    let mut seen = Vec::new();
    while seen.len() < 5 {
        seen.extend(consumer.poll(10).await.expect("poll"));
    }
    consumer.commit(Offset(3)).await.expect("commit");

    let want = [
        ("walhook-lagging", 0, "g", 2),
        ("walhook-lagging", 1, "g", 3),
    ];
    // The commit is made in the background, and the SC learns the high
    // watermarks from the SPU: wait for both.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let marks = log.probe().await.expect("the cluster answers");
        let lags: Vec<ConsumerLag> = log.consumer_lag(&marks).await.expect("lags");
        let counts: Vec<_> = lags
            .iter()
            .map(|l| (l.topic.as_str(), l.partition, l.group.as_str(), l.lag))
            .collect();
        if counts == want {
            // The oldest unread record of each partition was sent before
            // `sent` plus a moment, and has waited since.
            let waited = sent.elapsed().unwrap();
            for l in &lags {
                assert!(
                    l.oldest_unread_age > Duration::ZERO
                        && l.oldest_unread_age <= waited + Duration::from_secs(2),
                    "{l:?}, sent {waited:?} ago"
                );
            }
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lags {counts:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The certificates of a TLS cluster and of walhook, written where the
/// settings can name them.
struct TlsFiles {
    dir: tempfile::TempDir,
    cluster: walhook_devkit::fluvio::ClusterTls,
}

impl TlsFiles {
    fn new(client_certs: bool) -> TlsFiles {
        let ca = TestCa::new("walhook test CA").unwrap();
        let dir = tempfile::tempdir().unwrap();
        ca.write_pem(dir.path(), "ca.pem").unwrap();
        let client = ca.client_cert("walhook").unwrap();
        client.write(dir.path(), "client").unwrap();
        // Someone else's CA, and a certificate it signed.
        let other = TestCa::new("another CA").unwrap();
        other.write_pem(dir.path(), "other-ca.pem").unwrap();
        let stranger = other.client_cert("stranger").unwrap();
        stranger.write(dir.path(), "stranger").unwrap();
        let server = ca.server_cert(&["fluvio.test", "*.fluvio.test"]).unwrap();
        TlsFiles {
            dir,
            cluster: walhook_devkit::fluvio::ClusterTls {
                server,
                ca_pem: ca.pem(),
                client_certs,
            },
        }
    }

    fn settings(&self, cluster: &FluvioCluster, ca: &str, client: Option<&str>) -> FluvioSettings {
        let path = |f: &str| self.dir.path().join(f);
        let mut s = settings(cluster);
        s.connect_timeout = Duration::from_secs(15);
        s.tls = Some(FluvioTls {
            ca_file: Some(path(ca)),
            client: client.map(|name| ClientIdentity {
                cert_file: path(&format!("{name}.pem")),
                key_file: path(&format!("{name}.key")),
            }),
            domain: "fluvio.test".into(),
            verify: TlsVerify::Full,
        });
        s
    }
}

async fn connect_error(settings: FluvioSettings) -> String {
    let topics = vec![topic("walhook-tls", 1)];
    match FluvioLog::connect(settings, topics).await {
        Ok(_) => panic!("the connection was let through"),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    }
}

/// A cluster that speaks TLS and demands client certificates: walhook
/// keeps the log contract over it with the right CA and certificate, and
/// a wrong CA, a missing or foreign client certificate, or plain TCP are
/// refused with an error that names the setting to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_client_certificates_lets_in_only_the_right_client() {
    let files = TlsFiles::new(true);
    let Some(cluster) = FluvioCluster::builder(
        "a_tls_cluster_with_client_certificates_lets_in_only_the_right_client",
    )
    .tls(files.cluster.clone())
    .start() else {
        return;
    };
    let good = files.settings(&cluster, "ca.pem", Some("client"));
    contract::run_all(|topics| FluvioLog::connect(good.clone(), topics))
        .await
        .map_err(|e| format!("{:?}", anyhow::Error::from(e)))
        .expect("the Fluvio log keeps the log contract over TLS");

    let wrong_ca = connect_error(files.settings(&cluster, "other-ca.pem", Some("client"))).await;
    assert!(
        wrong_ca.contains("did not verify against [log.tls].ca_file")
            && wrong_ca.contains("other-ca.pem"),
        "{wrong_ca}"
    );
    let no_cert = connect_error(files.settings(&cluster, "ca.pem", None)).await;
    assert!(
        no_cert.contains("demands a client certificate") && no_cert.contains("cert_file"),
        "{no_cert}"
    );
    let stranger = connect_error(files.settings(&cluster, "ca.pem", Some("stranger"))).await;
    assert!(
        stranger.contains("refused walhook's client certificate")
            && stranger.contains("stranger.pem"),
        "{stranger}"
    );
    let mut plain = settings(&cluster);
    plain.connect_timeout = Duration::from_secs(10);
    let plain = connect_error(plain).await;
    assert!(plain.contains("[log.tls]"), "{plain}");

    // A name the certificates do not list: refused under verify-full,
    // let through by verify-ca (the chain is still checked).
    let mut elsewhere = files.settings(&cluster, "ca.pem", Some("client"));
    let tls = elsewhere.tls.as_mut().unwrap();
    tls.domain = "elsewhere.test".into();
    let wrong_name = connect_error(elsewhere.clone()).await;
    assert!(
        wrong_name.contains("not valid for \"elsewhere.test\"")
            && wrong_name.contains("[log.tls].domain"),
        "{wrong_name}"
    );
    elsewhere.tls.as_mut().unwrap().verify = TlsVerify::Ca;
    FluvioLog::connect(elsewhere, vec![])
        .await
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
        .expect("verify-ca checks the chain, not the name");
}

/// Records a group had not read that the topic's retention removed stop
/// its next consumer with a definite error naming the offsets: nothing is
/// skipped. A group without a stored position starts at the first record
/// the partition still has. Topics are created with the retention and
/// segment size of the settings, and a topic that keeps its records for
/// less than the settings ask is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_gone_at_retention_stop_the_consumer_instead_of_being_skipped() {
    let Some(cluster) = FluvioCluster::start(
        "records_gone_at_retention_stop_the_consumer_instead_of_being_skipped",
    ) else {
        return;
    };
    let spec = || topic("walhook-retention", 1);
    let mut short = settings(&cluster);
    // Fluvio's least retention, and its smallest segments: each closed
    // segment goes once its last write is 10 s old.
    short.retention = Duration::from_secs(10);
    short.segment_size = 1024;
    let log = FluvioLog::connect(short.clone(), vec![spec()])
        .await
        .map_err(|e| format!("{:#}", anyhow::Error::from(e)))
        .expect("connect");
    let producer = log
        .producer::<TestRecord>("walhook-retention")
        .expect("producer");
    // One record per batch, about 300 bytes each: a new segment every few.
    for i in 0..40u64 {
        producer
            .send_all(vec![(b"k".to_vec(), TestRecord(i, "x".repeat(300)))])
            .await
            .unwrap()
            .await
            .expect("stored");
    }
    let mut slow = log
        .consumer::<TestRecord>("walhook-retention", 0, "slow")
        .await
        .expect("consumer");
    let read = slow.poll(5).await.expect("poll");
    let next = read.last().unwrap().offset.0 + 1;
    slow.commit(Offset(next)).await.expect("commit");
    drop(slow);

    // Wait until retention removed the first segments: a group with no
    // stored position then starts past the slow group's next record.
    let started = std::time::Instant::now();
    let first = loop {
        let mut fresh = log
            .consumer::<TestRecord>(
                "walhook-retention",
                0,
                &format!("fresh-{}", started.elapsed().as_millis()),
            )
            .await
            .expect("consumer");
        let first = fresh.poll(1).await.expect("a fresh group reads")[0]
            .offset
            .0;
        if first > next {
            break first;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "retention removed nothing within 180 s (first offset still {first})\n{}",
            cluster.describe()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    let mut slow = log
        .consumer::<TestRecord>("walhook-retention", 0, "slow")
        .await
        .expect("consumer");
    let err = tokio::time::timeout(Duration::from_secs(30), slow.poll(10))
        .await
        .expect("the consumer answers")
        .expect_err("the records the group never read are gone: no skipping past them");
    assert!(!err.is_transient(), "a gap is definite: {err}");
    match &err {
        walhook_pipeline::log::LogError::Gap {
            topic,
            partition,
            group,
            expected,
            found,
        } => {
            assert_eq!(
                (topic.as_str(), *partition, group.as_str(), *expected),
                ("walhook-retention", 0, "slow", next)
            );
            assert!(*found >= first, "found {found}, first {first}");
        }
        other => panic!("not a gap: {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&format!("records {next} to")) && text.contains("[log] retention"),
        "{text}"
    );

    // The topic exists with 10 s: a deployment asking for longer is refused.
    let mut longer = settings(&cluster);
    longer.retention = Duration::from_secs(3600);
    let refused = match FluvioLog::connect(longer, vec![spec()]).await {
        Ok(_) => panic!("a topic keeping records for less than [log] retention was accepted"),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    };
    assert!(
        refused.contains("keeps its records for 10 s") && refused.contains("[log] retention"),
        "{refused}"
    );
}
