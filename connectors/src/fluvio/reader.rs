//! The reader task of a consumer: it owns the partition's stream and keeps
//! its `next()` running (never cancelled), reopens it on a new connection
//! when it fails or ends, reads again over records the client passed over,
//! and stops with [`LogError::Gap`] when records are gone.

use std::sync::Arc;
use std::time::Instant;

use fluvio::consumer::{ConsumerConfigExt, ConsumerRecord};
use fluvio::{Fluvio, Offset as FluvioOffset};
use futures::StreamExt;
use tokio::sync::mpsc;
use walhook_pipeline::ids::Offset;
use walhook_pipeline::log::{LogError, Message, Record};

use super::connection::{on_new_connections, within};
use super::consumer::Place;
use super::{Inner, backend};

/// The records of one partition as the client's stream yields them.
pub(super) type Records =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<ConsumerRecord, String>> + Send>>;

/// Opens a stream of `config` on `client`, and again on a new connection
/// after each failure (see [`on_new_connections`]).
pub(super) async fn open_stream(
    inner: &Inner,
    config: &ConsumerConfigExt,
    client: Arc<Fluvio>,
    what: &str,
    deadline: Option<Instant>,
) -> Result<(Arc<Fluvio>, Records), LogError> {
    on_new_connections(
        inner,
        client,
        &format!("open {what}"),
        deadline,
        |c| async move {
            let stream = within(c.consumer_with_config(config.clone())).await?;
            let records: Records = Box::pin(stream.map(|r| r.map_err(|e| e.to_string())));
            Ok(records)
        },
    )
    .await
}

/// The most bytes one fetch of a partition's stream returns. The client's
/// default (about 1 MB) cuts a busy partition's fetches inside a batch,
/// and this client then passes over the rest of that batch (see [`read`]):
/// with 32 MiB the deliveries topic at 8,000 jobs/s was read without one
/// such jump, where 1 MB gave 75 in 30 s. Memory is taken only as records
/// wait.
pub(super) const FETCH_MAX_BYTES: i32 = 32 << 20;

/// Reads the partition into `out` until the consumer is dropped. The
/// client's stream reconnects by itself; should it fail or end anyway, a
/// new stream opens on a new connection at the next offset not read, so a
/// broker crash costs a pause, never the consumer. A record that cannot
/// be decoded is handed on as an error (definite: reading again would not
/// change it).
///
/// Offsets of a partition follow one another; a record past the one
/// expected (the group's next, then the one after the last read) means
/// the records between are gone (retention removed them): the reader hands
/// on [`LogError::Gap`] and stops, never skipping them. The client itself
/// may pass over the rest of a batch that a fetch response cut off (seen
/// under load with large records; Fluvio fixed it in a later client), so a
/// jump is first read again from the expected offset on a new stream; only
/// a jump that repeats there is a gap.
pub(super) async fn read<M: Message>(
    inner: Arc<Inner>,
    config: ConsumerConfigExt,
    (mut client, mut stream): (Arc<Fluvio>, Records),
    out: mpsc::Sender<Result<Record<M>, LogError>>,
    (place, mut next): (Place, Option<i64>),
) {
    let what = place.to_string();
    // The offset a jump was last read again from.
    let mut reread: Option<i64> = None;
    loop {
        let error = match stream.next().await {
            Some(Ok(r)) => {
                inner.health.op(Ok(()));
                if let Some(want) = next
                    && r.offset > want
                    && reread != Some(want)
                {
                    tracing::warn!(partition = %what, expected = want, found = r.offset, "the Fluvio stream passed over records; reading them again from the expected offset");
                    reread = Some(want);
                    let on = client.clone();
                    if !reopen(
                        &inner,
                        &config,
                        (&mut client, &mut stream),
                        on,
                        &what,
                        Some(want),
                        &out,
                    )
                    .await
                    {
                        return;
                    }
                    continue;
                }
                if let Some(want) = next
                    && r.offset > want
                {
                    let gap = LogError::Gap {
                        topic: place.topic,
                        partition: place.partition,
                        group: place.group,
                        expected: u64::try_from(want).unwrap_or(0),
                        found: u64::try_from(r.offset).unwrap_or(0),
                    };
                    tracing::error!(partition = %what, error = %gap, "records of a Fluvio partition are gone before they were read");
                    let _ = out.send(Err(gap)).await;
                    return;
                }
                next = Some(r.offset + 1);
                reread = None;
                let record = u64::try_from(r.offset).map_err(backend).and_then(|offset| {
                    Ok(Record {
                        offset: Offset(offset),
                        message: M::decode(r.value())?,
                    })
                });
                if out.send(record).await.is_err() {
                    // The consumer is gone: nobody reads any more.
                    return;
                }
                continue;
            }
            Some(Err(e)) => e,
            None => "the stream ended".to_owned(),
        };
        inner.health.op(Err(&error));
        tracing::warn!(partition = %what, %error, "a Fluvio partition's stream failed; reopening it");
        // Where this stream stopped, or the group's stored position when
        // nothing was read yet, on a new connection.
        let fresh = match inner.reconnect(&client).await {
            Ok(fresh) => fresh,
            Err(_) => client.clone(),
        };
        if !reopen(
            &inner,
            &config,
            (&mut client, &mut stream),
            fresh,
            &what,
            next,
            &out,
        )
        .await
        {
            return;
        }
    }
}

/// Replaces the stream (and its client) with one opened on `on` that starts
/// at `at` (the group's stored position when `None`); `false` after
/// handing a failure on to `out`, which the reader then ends on (its
/// consumer reads the error; a consumer already gone needs nothing).
async fn reopen<M: Message>(
    inner: &Arc<Inner>,
    config: &ConsumerConfigExt,
    (client, stream): (&mut Arc<Fluvio>, &mut Records),
    on: Arc<Fluvio>,
    what: &str,
    at: Option<i64>,
    out: &mpsc::Sender<Result<Record<M>, LogError>>,
) -> bool {
    let mut config = config.clone();
    let opened = match at.map(FluvioOffset::absolute).transpose() {
        Ok(at) => {
            if let Some(at) = at {
                config.offset_start = at;
            }
            open_stream(inner, &config, on, what, None).await
        }
        Err(e) => Err(backend(e)),
    };
    match opened {
        Ok(opened) => {
            (*client, *stream) = opened;
            true
        }
        Err(e) => {
            let _ = out.send(Err(e)).await;
            false
        }
    }
}
