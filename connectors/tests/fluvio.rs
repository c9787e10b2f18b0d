//! The Fluvio log against a real cluster (one SC, one SPU on loopback,
//! started from the tools built from Fluvio's source; skipped, with the
//! reason printed, where none can be had).

use std::time::Duration;

use walhook_connectors::fluvio::{FluvioLog, FluvioSettings};
use walhook_devkit::fluvio::FluvioCluster;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::contract::{self, TestRecord};
use walhook_pipeline::log::{Consumer, Log, Producer, TopicSpec};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_with_another_partition_count_is_refused() {
    let Some(cluster) = FluvioCluster::start("a_topic_with_another_partition_count_is_refused")
    else {
        return;
    };
    let spec = |partitions| TopicSpec {
        name: "walhook-mismatch".into(),
        partitions,
        capacity: 0,
        durable_groups: vec![],
    };
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
    let topic = TopicSpec {
        name: "walhook-crash".into(),
        partitions: 1,
        capacity: 0,
        durable_groups: vec![],
    };
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
    let topic = TopicSpec {
        name: "walhook-probed".into(),
        partitions: 2,
        capacity: 0,
        durable_groups: vec![],
    };
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
    let topic = TopicSpec {
        name: "walhook-lagging".into(),
        partitions: 2,
        capacity: 0,
        durable_groups: vec![],
    };
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

    let want = vec![
        ConsumerLag {
            topic: "walhook-lagging".into(),
            partition: 0,
            group: "g".into(),
            lag: 2,
        },
        ConsumerLag {
            topic: "walhook-lagging".into(),
            partition: 1,
            group: "g".into(),
            lag: 3,
        },
    ];
    // The commit is made in the background, and the SC learns the high
    // watermarks from the SPU: wait for both.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let marks = log.probe().await.expect("the cluster answers");
        let lags = log.consumer_lag(&marks).await.expect("lags");
        if lags == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "lags {lags:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
