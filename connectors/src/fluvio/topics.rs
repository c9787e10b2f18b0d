//! Start-up: [`FluvioLog::connect`] opens the client, creates the topics
//! that do not exist and checks those that do (partition count, retention),
//! and waits until every partition has a leader and consumer offsets can be
//! stored.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fluvio::metadata::topic::{
    CleanupPolicy, SegmentBasedPolicy, TopicResolution, TopicSpec as FluvioTopicSpec,
    TopicStorageConfig,
};
use walhook_pipeline::log::{LogError, TopicSpec};

use super::connection::{open_client, tls_hint};
use super::watch::Health;
use super::{FluvioLog, FluvioSettings, Inner, backend, broken};

impl FluvioLog {
    /// Connects to the cluster, creates the topics that do not exist and
    /// checks those that do, and waits until every partition has a leader.
    ///
    /// A topic that exists with another number of partitions is refused
    /// with an error naming both figures: keys would map to other
    /// partitions than the ones already written, and one object's events
    /// would lose their order.
    pub async fn connect(
        settings: FluvioSettings,
        topics: Vec<TopicSpec>,
    ) -> Result<FluvioLog, LogError> {
        let deadline = Instant::now() + settings.connect_timeout;
        let client = open_within(&settings).await?;
        let admin = client.admin().await;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let existing = admin
            .list::<FluvioTopicSpec, String>(names.clone())
            .await
            .map_err(backend)?;
        let mut partitions = HashMap::new();
        for spec in &topics {
            match existing.iter().find(|m| m.name == spec.name) {
                Some(found) => {
                    check_retention(&spec.name, &found.spec, &settings)?;
                    let have = found.spec.partitions();
                    if have != spec.partitions {
                        return Err(broken(format!(
                            "Fluvio topic {:?} has {have} partitions but the configuration asks for {}: \
                             set the [log] partition count back to {have}, or use new topic names \
                             ([log] topic_prefix) once the old topics are drained",
                            spec.name, spec.partitions
                        )));
                    }
                }
                None => {
                    let mut create =
                        FluvioTopicSpec::new_computed(spec.partitions, settings.replication, None);
                    create.set_cleanup_policy(CleanupPolicy::Segment(SegmentBasedPolicy {
                        time_in_seconds: retention_secs(settings.retention),
                    }));
                    create.set_storage(TopicStorageConfig {
                        segment_size: Some(settings.segment_size),
                        max_partition_size: None,
                    });
                    if let Err(e) = admin.create(spec.name.clone(), false, create).await {
                        // Another process may have created it meanwhile.
                        let again = admin
                            .list::<FluvioTopicSpec, String>(vec![spec.name.clone()])
                            .await
                            .map_err(backend)?;
                        if !again.iter().any(|m| m.name == spec.name) {
                            return Err(LogError::Backend(
                                e.context(format!("cannot create Fluvio topic {:?}", spec.name))
                                    .into(),
                            ));
                        }
                    }
                }
            }
            partitions.insert(spec.name.clone(), spec.partitions);
        }
        // Wait until every topic is provisioned (its partitions have
        // leaders); producers and consumers fail before that.
        loop {
            let found = admin
                .list::<FluvioTopicSpec, String>(names.clone())
                .await
                .map_err(backend)?;
            let waiting = topics.iter().find(|spec| {
                !found.iter().any(|m| {
                    m.name == spec.name
                        && matches!(m.status.resolution, TopicResolution::Provisioned)
                })
            });
            let Some(spec) = waiting else { break };
            if Instant::now() > deadline {
                return Err(broken(format!(
                    "Fluvio topic {:?} was not provisioned within {:?}: check that the cluster has an SPU online \
                     (`fluvio cluster spu list`) and enough SPUs for replication {}",
                    spec.name, settings.connect_timeout, settings.replication
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Consumer offsets live in a system topic the SC makes after it
        // starts; until then every consumer of a group fails and backs off
        // for a second or more. Wait for it here, once.
        loop {
            match client.consumer_offsets().await {
                Ok(_) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(LogError::Backend(
                        e.context(format!(
                            "the Fluvio cluster at {} cannot store consumer offsets yet (its system topic \
                             `consumer-offset` is missing); check the SC's log",
                            settings.endpoint
                        ))
                        .into(),
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        Ok(FluvioLog {
            inner: Arc::new(Inner {
                client: parking_lot::Mutex::new(Arc::new(client)),
                settings,
                health: Health::default(),
                partitions,
                commits: parking_lot::Mutex::new(HashMap::new()),
                record_times: parking_lot::Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// The segment size of a topic created without one (Fluvio's
/// `SPU_LOG_SEGMENT_MAX_BYTES`, 1 GiB).
const FLUVIO_DEFAULT_SEGMENT_SIZE: u32 = 1 << 30;

/// `retention` in whole seconds, as Fluvio keeps it.
fn retention_secs(retention: Duration) -> u32 {
    u32::try_from(retention.as_secs()).unwrap_or(u32::MAX)
}

/// Checks an existing topic's retention against the settings: a topic that
/// keeps its records for less time than `[log] retention` is refused (a
/// consumer down for longer than the topic keeps records would find them
/// gone); one that keeps them longer, or other segments, is only noted.
/// A client of the cluster, or an error naming the endpoint once
/// `connect_timeout` passed without an answer.
async fn open_within(settings: &FluvioSettings) -> Result<fluvio::Fluvio, LogError> {
    tokio::time::timeout(settings.connect_timeout, open_client(settings))
        .await
        .map_err(|_| {
            broken(format!(
                "no Fluvio cluster answered at {} within {:?}: check [log] endpoint and that the cluster runs{}",
                settings.endpoint,
                settings.connect_timeout,
                tls_hint(settings)
            ))
        })?
        .map_err(broken)
}

/// What [`FluvioLog::inspect`] found of one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicReport {
    /// The topic.
    pub name: String,
    /// What was found when it is usable as configured, or why it is not
    /// (with the fix).
    pub verdict: Result<String, String>,
}

impl FluvioLog {
    /// Reads the cluster's view of `topics` without changing anything
    /// (`walhook doctor`): a topic that exists with another partition
    /// count, a shorter retention, or partitions without a leader is
    /// refused as [`FluvioLog::connect`] would refuse it; one that does not
    /// exist yet is fine (the start creates it).
    pub async fn inspect(
        settings: FluvioSettings,
        topics: Vec<TopicSpec>,
    ) -> Result<Vec<TopicReport>, LogError> {
        let client = open_within(&settings).await?;
        let admin = client.admin().await;
        let names: Vec<String> = topics.iter().map(|t| t.name.clone()).collect();
        let existing = admin
            .list::<FluvioTopicSpec, String>(names)
            .await
            .map_err(backend)?;
        Ok(topics
            .iter()
            .map(|spec| {
                let verdict = match existing.iter().find(|m| m.name == spec.name) {
                    None => Ok(format!(
                        "does not exist yet; the first start creates it with {} partitions",
                        spec.partitions
                    )),
                    Some(found) => {
                        let have = found.spec.partitions();
                        if have != spec.partitions {
                            Err(format!(
                                "has {have} partitions but the configuration asks for {}: set the [log] \
                                 partition count back to {have}, or use new topic names ([log] topic_prefix)",
                                spec.partitions
                            ))
                        } else if found.spec.retention_secs()
                            < retention_secs(settings.retention)
                        {
                            Err(format!(
                                "keeps its records for {} s, less than [log] retention = {:?}: set [log] \
                                 retention to at most \"{}s\", or use new topics ([log] topic_prefix)",
                                found.spec.retention_secs(),
                                settings.retention,
                                found.spec.retention_secs()
                            ))
                        } else if !matches!(found.status.resolution, TopicResolution::Provisioned) {
                            Err("is not provisioned (a partition has no leader): check that the cluster \
                                 has an SPU online (`fluvio cluster spu list`)"
                                .into())
                        } else {
                            Ok(format!(
                                "{have} partitions, records kept {} s, provisioned",
                                found.spec.retention_secs()
                            ))
                        }
                    }
                };
                TopicReport {
                    name: spec.name.clone(),
                    verdict,
                }
            })
            .collect())
    }
}

fn check_retention(
    name: &str,
    found: &FluvioTopicSpec,
    settings: &FluvioSettings,
) -> Result<(), LogError> {
    let (have, want) = (found.retention_secs(), retention_secs(settings.retention));
    if have < want {
        return Err(broken(format!(
            "Fluvio topic {name:?} keeps its records for {have} s, less than [log] retention = {:?} ({want} s): \
             a member down for longer than the topic keeps records would find them gone. Set [log] retention \
             to at most \"{have}s\", or use new topics ([log] topic_prefix) created with the longer retention",
            settings.retention
        )));
    }
    if have > want {
        tracing::info!(
            topic = name,
            topic_retention_secs = have,
            configured_secs = want,
            "the Fluvio topic keeps its records longer than [log] retention; it was created so"
        );
    }
    let segment = found
        .get_storage()
        .and_then(|s| s.segment_size)
        .unwrap_or(FLUVIO_DEFAULT_SEGMENT_SIZE);
    if segment != settings.segment_size {
        tracing::info!(
            topic = name,
            topic_segment_size = segment,
            configured = settings.segment_size,
            "the Fluvio topic's segment size differs from [log] segment_size; it was created so"
        );
    }
    Ok(())
}
