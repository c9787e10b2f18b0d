//! The producer: records keyed to partitions with the port's own hash,
//! receipts that resolve once the cluster stored them, and a Fluvio
//! producer made again on a new connection after it failed.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use fluvio::{
    Fluvio, Isolation, PartitionId, Partitioner, PartitionerConfig, TopicProducerConfigBuilder,
    TopicProducerPool,
};
use walhook_pipeline::log::{LogError, Message, Producer, Receipt, partition_for};

use super::connection::within;
use super::{Inner, backend, broken};

/// How long the leader may take to store a produced batch on its replicas.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a receipt waits for a record's answer before the producer is
/// given up (longer than [`PRODUCE_TIMEOUT`] plus a batch's linger).
const RECEIPT_TIMEOUT: Duration = Duration::from_secs(15);

/// Maps keys with the port's own hash (see [`partition_for`]).
struct PortPartitioner;

impl Partitioner for PortPartitioner {
    fn partition(&self, config: &PartitionerConfig, key: Option<&[u8]>, _: &[u8]) -> PartitionId {
        partition_for(key.unwrap_or_default(), config.partition_count())
    }
}

/// Appends to one Fluvio topic. The client's producer is made on the
/// first send (making it talks to the cluster; the port's `producer` call
/// does not wait), shared by the clones, and made again after it failed:
/// a Fluvio producer that met an error refuses every later record (seen
/// after a broker crash: capture's every restart failed at once, for as
/// long as the process lived), so a failed one is dropped, and the next
/// send makes a new one on a new connection.
pub struct FluvioProducer<M> {
    pub(super) inner: Arc<Inner>,
    pub(super) topic: String,
    pub(super) slot: Arc<parking_lot::Mutex<ProducerSlot>>,
    pub(super) _record: PhantomData<fn(M)>,
}

/// The producer in use, or why the next send makes a new one.
#[derive(Default)]
pub(super) struct ProducerSlot {
    current: Option<Arc<Pooled>>,
    /// The client of a producer that failed: the next producer is made on
    /// a new connection.
    failed_client: Option<Arc<Fluvio>>,
}

/// A producer and the client it was made on.
struct Pooled {
    pool: TopicProducerPool,
    client: Arc<Fluvio>,
}

impl<M> Clone for FluvioProducer<M> {
    fn clone(&self) -> Self {
        FluvioProducer {
            inner: self.inner.clone(),
            topic: self.topic.clone(),
            slot: self.slot.clone(),
            _record: PhantomData,
        }
    }
}

/// Drops `failed` from `slot` (unless a newer producer replaced it), so
/// that the next send makes a new one on a new connection.
fn discard(slot: &parking_lot::Mutex<ProducerSlot>, failed: &Arc<Pooled>) {
    let mut slot = slot.lock();
    if slot
        .current
        .as_ref()
        .is_some_and(|current| Arc::ptr_eq(current, failed))
    {
        slot.current = None;
        slot.failed_client = Some(failed.client.clone());
    }
}

impl<M> FluvioProducer<M> {
    async fn get(&self) -> Result<Arc<Pooled>, LogError> {
        let failed_client = {
            let mut slot = self.slot.lock();
            if let Some(current) = &slot.current {
                return Ok(current.clone());
            }
            slot.failed_client.take()
        };
        let client = match failed_client {
            Some(failed) => self.inner.reconnect(&failed).await?,
            None => self.inner.client(),
        };
        let config = TopicProducerConfigBuilder::default()
            .partitioner(Arc::new(PortPartitioner))
            .isolation(Isolation::ReadCommitted)
            // How long the leader may take to have a batch stored by its
            // replicas (Fluvio's 1.5 s is often too short for followers
            // that are catching up, e.g. after a failover).
            .timeout(PRODUCE_TIMEOUT)
            .build()
            .map_err(backend)?;
        let made = within(client.topic_producer_with_config(self.topic.clone(), config)).await;
        let pool = match made {
            Ok(pool) => pool,
            Err(error) => {
                self.slot.lock().failed_client = Some(client);
                let error = format!(
                    "cannot make a producer for Fluvio topic {:?} at {}: {error}",
                    self.topic, self.inner.settings.endpoint
                );
                self.inner.health.op(Err(&error));
                return Err(broken(error));
            }
        };
        let pooled = Arc::new(Pooled { pool, client });
        let mut slot = self.slot.lock();
        // Another send may have made one meanwhile: use that one.
        Ok(slot.current.get_or_insert(pooled).clone())
    }
}

impl<M: Message> Producer<M> for FluvioProducer<M> {
    async fn send_all(&self, records: Vec<(Vec<u8>, M)>) -> Result<Receipt, LogError> {
        let pooled = self.get().await?;
        let mut outputs = Vec::with_capacity(records.len());
        for (key, record) in records {
            let mut bytes = Vec::new();
            record.encode(&mut bytes);
            match pooled.pool.send(key, bytes).await {
                Ok(output) => outputs.push(output),
                Err(e) => {
                    let error = format!("{e:#}");
                    tracing::warn!(topic = %self.topic, %error, "a Fluvio producer failed; the next send makes a new one");
                    self.inner.health.op(Err(&error));
                    discard(&self.slot, &pooled);
                    return Err(backend(e));
                }
            }
        }
        let (inner, slot, topic) = (self.inner.clone(), self.slot.clone(), self.topic.clone());
        Ok(Receipt::new(async move {
            for output in outputs {
                // A produce request in flight when its SPU died is answered
                // only by the client's 60 s request timeout: a waiter
                // (fan-out storing jobs before its offset moves) would
                // stall that long. Past the leader's own time to store a
                // batch, the producer is given up and the records are sent
                // again (at least once) by a new one.
                let error = match tokio::time::timeout(RECEIPT_TIMEOUT, output.wait()).await {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(_) => format!(
                        "no answer within {} s (the partition's leader may have died)",
                        RECEIPT_TIMEOUT.as_secs()
                    ),
                };
                tracing::warn!(%topic, %error, "a Fluvio producer's records were not stored; the next send makes a new producer");
                inner.health.op(Err(&error));
                discard(&slot, &pooled);
                return Err(broken(error));
            }
            inner.health.op(Ok(()));
            Ok(())
        }))
    }
}
