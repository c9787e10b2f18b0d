//! The contract every [`Log`] implementation must pass.
//!
//! Each check creates its own topics (names carry a random suffix, so a real
//! cluster can be shared between runs) through the factory it is given, and
//! fails with a message naming the broken rule. The embedded log runs the
//! suite in its unit tests; the Fluvio adapter runs it against a cluster when
//! one is configured.

// Contract code is test code: it spawns freely.
#![allow(clippy::disallowed_methods)]

use std::future::Future;
use std::time::Duration;

use super::{Consumer, Log, LogError, Message, Producer, TopicSpec, partition_for};
use crate::ids::Offset;

/// A record used by the contract checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRecord(pub u64, pub String);

impl Message for TestRecord {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.0.to_be_bytes());
        out.extend_from_slice(self.1.as_bytes());
    }

    fn decode(bytes: &[u8]) -> Result<Self, LogError> {
        if bytes.len() < 8 {
            return Err(LogError::Decode("test record shorter than 8 bytes".into()));
        }
        let (n, s) = bytes.split_at(8);
        let n = u64::from_be_bytes(n.try_into().map_err(|_| LogError::Decode("n".into()))?);
        let s = String::from_utf8(s.to_vec()).map_err(|e| LogError::Decode(e.to_string()))?;
        Ok(TestRecord(n, s))
    }
}

/// A failed contract rule.
#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    /// A rule did not hold.
    #[error("log contract broken: {0}")]
    Broken(String),
    /// The log itself failed.
    #[error("log error during contract check")]
    Log(#[from] LogError),
}

fn check(ok: bool, rule: impl FnOnce() -> String) -> Result<(), ContractError> {
    if ok {
        Ok(())
    } else {
        Err(ContractError::Broken(rule()))
    }
}

const WAIT: Duration = Duration::from_secs(30);

async fn within<T>(
    what: &str,
    fut: impl Future<Output = Result<T, LogError>>,
) -> Result<T, ContractError> {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(ContractError::Broken(format!(
            "{what} did not finish within {WAIT:?}"
        ))),
    }
}

fn unique(name: &str) -> String {
    format!("walhook-contract-{name}-{:08x}", rand::random::<u32>())
}

fn spec(name: &str, partitions: u32, durable: &[&str]) -> TopicSpec {
    TopicSpec {
        name: name.to_owned(),
        partitions,
        capacity: 10_000,
        durable_groups: durable.iter().map(|s| (*s).to_owned()).collect(),
    }
}

async fn read_n<M: Message, C: Consumer<M>>(
    consumer: &mut C,
    n: usize,
) -> Result<Vec<super::Record<M>>, ContractError> {
    let mut out = Vec::new();
    while out.len() < n {
        let batch = within("poll", consumer.poll(n - out.len())).await?;
        check(!batch.is_empty(), || "poll returned no records".into())?;
        out.extend(batch);
    }
    Ok(out)
}

/// Runs every check. `make` builds a log that has the given topics.
pub async fn run_all<L, F, Fut>(make: F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    order_and_offsets(&make).await?;
    keys_map_to_stable_partitions(&make).await?;
    groups_resume_at_their_commit(&make).await?;
    commits_only_move_forward(&make).await?;
    receipts_resolve_and_records_are_readable(&make).await?;
    poll_waits_for_new_records(&make).await?;
    Ok(())
}

/// Records of one key come back in send order with consecutive offsets.
pub async fn order_and_offsets<L, F, Fut>(make: &F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("order");
    let log = make(vec![spec(&topic, 3, &[])]).await?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let sent: Vec<TestRecord> = (0..100).map(|i| TestRecord(i, format!("r{i}"))).collect();
    for chunk in sent.chunks(7) {
        let batch = chunk
            .iter()
            .map(|r| (b"same-key".to_vec(), r.clone()))
            .collect();
        within("receipt", producer.send_all(batch).await?).await?;
    }
    let partition = partition_for(b"same-key", log.partitions(&topic)?);
    let mut consumer = log
        .consumer::<TestRecord>(&topic, partition, "reader")
        .await?;
    let got = read_n(&mut consumer, sent.len()).await?;
    let messages: Vec<TestRecord> = got.iter().map(|r| r.message.clone()).collect();
    check(messages == sent, || {
        "records of one key came back out of order".into()
    })?;
    for pair in got.windows(2) {
        check(pair[1].offset.0 == pair[0].offset.0 + 1, || {
            format!(
                "offsets not consecutive: {} then {}",
                pair[0].offset, pair[1].offset
            )
        })?;
    }
    Ok(())
}

/// A key always lands on `partition_for(key)`.
pub async fn keys_map_to_stable_partitions<L, F, Fut>(make: &F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("keys");
    let log = make(vec![spec(&topic, 4, &[])]).await?;
    let partitions = log.partitions(&topic)?;
    check(partitions == 4, || {
        format!("topic has {partitions} partitions, not 4")
    })?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let keys: Vec<String> = (0..40).map(|i| format!("endpoint-{i}")).collect();
    let batch = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone().into_bytes(), TestRecord(i as u64, k.clone())))
        .collect();
    within("receipt", producer.send_all(batch).await?).await?;
    for p in 0..partitions {
        let expected: Vec<&String> = keys
            .iter()
            .filter(|k| partition_for(k.as_bytes(), partitions) == p)
            .collect();
        let mut consumer = log.consumer::<TestRecord>(&topic, p, "reader").await?;
        let got = read_n(&mut consumer, expected.len()).await?;
        let names: Vec<&String> = got.iter().map(|r| &r.message.1).collect();
        check(names == expected, || {
            format!("partition {p} holds {names:?}, expected {expected:?}")
        })?;
    }
    Ok(())
}

/// A new consumer of a group starts at the group's commit; other groups are
/// independent; uncommitted records are read again (at least once).
pub async fn groups_resume_at_their_commit<L, F, Fut>(make: &F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("resume");
    let log = make(vec![spec(&topic, 1, &[])]).await?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let batch = (0..10)
        .map(|i| (b"k".to_vec(), TestRecord(i, String::new())))
        .collect();
    within("receipt", producer.send_all(batch).await?).await?;
    // Groups attach before anything is committed: a log may drop records
    // that every attached group has committed.
    let mut other = log.consumer::<TestRecord>(&topic, 0, "g2").await?;
    let first = {
        let mut consumer = log.consumer::<TestRecord>(&topic, 0, "g1").await?;
        let got = read_n(&mut consumer, 10).await?;
        within("commit", consumer.commit(Offset(got[5].offset.0))).await?;
        got
    };
    let mut again = log.consumer::<TestRecord>(&topic, 0, "g1").await?;
    let got = read_n(&mut again, 5).await?;
    check(
        got[0].offset == first[5].offset && got[0].message.0 == 5,
        || {
            format!(
                "group resumed at {:?}, expected offset {}",
                got[0], first[5].offset
            )
        },
    )?;
    let got = read_n(&mut other, 1).await?;
    check(got[0].message.0 == 0, || {
        "a new group did not start at the beginning".into()
    })?;
    Ok(())
}

/// Committing an older position does not move a group back.
pub async fn commits_only_move_forward<L, F, Fut>(make: &F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("monotonic");
    let log = make(vec![spec(&topic, 1, &[])]).await?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let batch = (0..10)
        .map(|i| (b"k".to_vec(), TestRecord(i, String::new())))
        .collect();
    within("receipt", producer.send_all(batch).await?).await?;
    let mut consumer = log.consumer::<TestRecord>(&topic, 0, "g").await?;
    let got = read_n(&mut consumer, 10).await?;
    within("commit", consumer.commit(Offset(got[8].offset.0))).await?;
    within("commit", consumer.commit(Offset(got[2].offset.0))).await?;
    drop(consumer);
    let mut again = log.consumer::<TestRecord>(&topic, 0, "g").await?;
    let got = read_n(&mut again, 1).await?;
    check(got[0].message.0 == 8, || {
        format!("group moved back to record {}", got[0].message.0)
    })?;
    Ok(())
}

/// A receipt resolves once its durable groups committed, and the records are
/// then readable by a new consumer.
pub async fn receipts_resolve_and_records_are_readable<L, F, Fut>(
    make: &F,
) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("durable");
    let log = make(vec![spec(&topic, 2, &["downstream"])]).await?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let batch: Vec<_> = (0..20)
        .map(|i| (format!("k{i}").into_bytes(), TestRecord(i, String::new())))
        .collect();
    let receipt = producer.send_all(batch).await?;
    let mut seen = 0;
    for p in 0..log.partitions(&topic)? {
        let mut consumer = log.consumer::<TestRecord>(&topic, p, "downstream").await?;
        let expected = (0..20)
            .filter(|i| partition_for(format!("k{i}").as_bytes(), 2) == p)
            .count();
        let got = read_n(&mut consumer, expected).await?;
        if let Some(last) = got.last() {
            within("commit", consumer.commit(Offset(last.offset.0 + 1))).await?;
        }
        seen += got.len();
    }
    check(seen == 20, || format!("read {seen} of 20 records"))?;
    within("receipt", receipt).await?;
    Ok(())
}

/// `poll` waits for a record sent after it started.
pub async fn poll_waits_for_new_records<L, F, Fut>(make: &F) -> Result<(), ContractError>
where
    L: Log,
    F: Fn(Vec<TopicSpec>) -> Fut,
    Fut: Future<Output = Result<L, LogError>>,
{
    let topic = unique("wait");
    let log = make(vec![spec(&topic, 1, &[])]).await?;
    let mut consumer = log.consumer::<TestRecord>(&topic, 0, "g").await?;
    let producer = log.producer::<TestRecord>(&topic)?;
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let receipt = producer
            .send_all(vec![(b"k".to_vec(), TestRecord(42, "late".into()))])
            .await?;
        receipt.await
    });
    let got = read_n(&mut consumer, 1).await?;
    check(got[0].message == TestRecord(42, "late".into()), || {
        format!("got {:?}", got[0])
    })?;
    sender
        .await
        .map_err(|e| ContractError::Broken(format!("sender panicked: {e}")))??;
    Ok(())
}
