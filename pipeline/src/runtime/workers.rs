//! Fan-out and its dispatcher: a group of workers on a share of the
//! events partitions.
//!
//! ```text
//!  events log (embedded or Fluvio) ──▶ fan-out ×P ──▶ deliveries (in-process) ──▶ forwarders ──▶ dispatcher
//! ```
//!
//! A [`Workers`] group reads a chosen set of events partitions, fans their
//! events out, and sends the deliveries it made with a dispatcher of its
//! own (node `settings.node_id`). Fan-out makes each delivery already leased
//! to that node, and hands its job on in memory: the first attempt needs no
//! claim and no second hop through the log. What a group held when it died
//! is taken back by its next start (same node id) or, once its lease lapsed,
//! by any other dispatcher node (`walhook dispatch`).
//!
//! So the unit of scale-out is a worker process owning some events
//! partitions ([`Share`]: fixed, or its share among the live members of the
//! group as it changes, see [`crate::membership`]), with capture
//! (`walhook capture`) writing the events topic on its own. With
//! [`WorkerSettings::route`] the group fans out only: its jobs cross
//! processes through the deliveries topic keyed by endpoint, to the
//! dispatchers of [`crate::routing`] (`[log] dispatch = "by-endpoint"`),
//! so that one dispatcher decides each endpoint's limits;
//! `docs/scale-out.md` compares the two.
//!
//! Every long-lived task runs under the caller's [`Supervisor`]: if one
//! ends, fails or panics while the process runs, the group's fail token is
//! cancelled and the caller stops in order. [`Workers::stop`] goes
//! upstream first: fan-out finishes its batch, the forwarders stop, and
//! dispatch drains the attempts in flight.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::delivery::DeliveryJob;
use crate::dispatch::egress::Egress;
use crate::dispatch::observe::AttemptObserver;
use crate::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use crate::endpoint::SubscriptionCache;
use crate::event::Event;
use crate::failpoint;
use crate::fanout::{FanoutCounters, FanoutOperator, FanoutSettings};
use crate::ids::Offset;
use crate::log::embedded::EmbeddedLog;
use crate::log::{Consumer, Log, LogError, TopicSpec};
use crate::membership::{
    BoxError, FencedConsumer, Member, MembershipCounters, MembershipSettings, MembershipStore,
    StartReader, hold_partitions,
};
use crate::store::{DispatchStore, FanoutStore};
use crate::supervise::Supervisor;

/// The topic capture writes and fan-out reads.
pub const EVENTS: &str = "events";
/// The in-process topic from fan-out to the dispatcher.
pub const DELIVERIES: &str = "deliveries";
/// The consumer group of fan-out on the events topic.
pub const FANOUT_GROUP: &str = "fanout";

/// The events topic: `partitions` partitions; with the embedded log a
/// record is durable once fan-out committed it (its deliveries are in
/// Postgres).
pub fn events_topic(name: &str, partitions: u32, capacity: usize) -> TopicSpec {
    TopicSpec {
        name: name.to_owned(),
        partitions,
        capacity,
        durable_groups: vec![FANOUT_GROUP.into()],
    }
}

/// Which events partitions a worker group reads.
pub enum Share {
    /// These, for as long as it runs (`walhook run`, `walhook fanout
    /// --member I/N`).
    Fixed(Vec<u32>),
    /// Its share among the live members of its group, as it changes
    /// (`walhook fanout` without `--member`).
    Leased(Leased),
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Share::Fixed(p) => f.debug_tuple("Fixed").field(p).finish(),
            Share::Leased(l) => f.debug_tuple("Leased").field(&l.member).finish(),
        }
    }
}

/// A member of the fan-out group, joined in the membership store.
pub struct Leased {
    /// Where the group's members and holdings are kept.
    pub store: Arc<dyn MembershipStore>,
    /// This member.
    pub member: Member,
    /// Its lease.
    pub lease: std::time::Duration,
    /// Its counters (metrics).
    pub counters: Arc<MembershipCounters>,
}

/// What a worker group needs besides the events log.
pub struct WorkerSettings {
    /// The events topic's name.
    pub events_topic: String,
    /// Which events partitions this group reads.
    pub share: Share,
    /// Partitions of the in-process deliveries topic.
    pub deliveries_partitions: u32,
    /// Records held per deliveries partition before fan-out waits.
    pub capacity: usize,
    /// Fan-out's settings (its lease owner is set to the dispatcher's node).
    pub fanout: FanoutSettings,
    /// The dispatcher's settings.
    pub dispatch: DispatchSettings,
    /// Told about every attempt (metrics), when given.
    pub observer: Option<Arc<dyn AttemptObserver>>,
    /// Fan-out alone, its jobs sent to this deliveries topic by their
    /// routes (`walhook fanout` with `[log] dispatch = "by-endpoint"`);
    /// `None`: to this group's own dispatcher, in memory.
    pub route: Option<(Arc<crate::routing::Routes>, String)>,
}

/// The counters of a worker group.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    /// Fan-out's.
    pub fanout: Arc<FanoutCounters>,
    /// Dispatch's.
    pub dispatch: Arc<DispatchCounters>,
}

/// A running group of fan-out operators and their dispatcher.
pub struct Workers {
    fanout_stop: CancellationToken,
    fanout_tasks: Vec<JoinHandle<()>>,
    /// The dispatcher in this process; `None` when the jobs go to the
    /// deliveries topic ([`WorkerSettings::route`]).
    local: Option<LocalDispatch>,
}

/// The in-process hop from fan-out to this process's dispatcher.
struct LocalDispatch {
    forward_stop: CancellationToken,
    forwarders: Vec<JoinHandle<()>>,
    dispatch_stop: CancellationToken,
    dispatch_task: JoinHandle<()>,
    deliveries: EmbeddedLog,
}

impl Workers {
    /// Starts the dispatcher, the forwarders and one fan-out operator per
    /// partition in `settings.partitions`, all under `supervisor`; with
    /// [`WorkerSettings::route`], fan-out alone, sending to the deliveries
    /// topic of `events`' log.
    pub async fn start<L, E, S>(
        events: &L,
        egress: Arc<E>,
        store: Arc<S>,
        directory: Arc<SubscriptionCache>,
        settings: WorkerSettings,
        counters: &WorkerCounters,
        supervisor: &Supervisor,
    ) -> Result<Workers, LogError>
    where
        L: Log,
        E: Egress,
        S: FanoutStore + DispatchStore,
    {
        let fanout_stop = CancellationToken::new();
        if let Some((routes, topic)) = settings.route.clone() {
            // Plans held by the topic, jobs keyed to their partition.
            let fanout = FanoutSettings {
                lease_owner: Some(crate::routing::TOPIC_HELD.into()),
                route: Some(routes),
                ..settings.fanout.clone()
            };
            let jobs = events.producer::<DeliveryJob>(&topic)?;
            let fanout_tasks = start_fanout(
                events,
                jobs,
                store,
                directory,
                settings,
                fanout,
                counters,
                supervisor,
                &fanout_stop,
            )
            .await?;
            return Ok(Workers {
                fanout_stop,
                fanout_tasks,
                local: None,
            });
        }
        let deliveries = EmbeddedLog::new([TopicSpec {
            name: DELIVERIES.into(),
            partitions: settings.deliveries_partitions.max(1),
            capacity: settings.capacity,
            durable_groups: vec![],
        }]);

        // Dispatch.
        let (jobs_tx, jobs_rx) = mpsc::channel::<DeliveryJob>(4096);
        let dispatch_stop = CancellationToken::new();
        let node = settings.dispatch.node_id.clone();
        let mut dispatcher = Dispatcher::new(
            egress,
            store.clone(),
            directory.clone(),
            settings.dispatch.clone(),
            counters.dispatch.clone(),
        );
        if let Some(observer) = settings.observer.clone() {
            dispatcher = dispatcher.with_observer(observer);
        }
        let dispatch_task =
            supervisor.spawn("dispatch", dispatcher.run(jobs_rx, dispatch_stop.clone()));
        let forward_stop = CancellationToken::new();
        let mut forwarders = Vec::new();
        for p in 0..deliveries.partitions(DELIVERIES)? {
            let consumer = deliveries
                .consumer::<DeliveryJob>(DELIVERIES, p, "dispatch")
                .await?;
            forwarders.push(supervisor.spawn(
                format!("the forwarder of deliveries partition {p}"),
                forward(consumer, jobs_tx.clone(), forward_stop.clone()),
            ));
        }
        drop(jobs_tx);

        // Fan-out, leasing what it makes to this group's dispatcher.
        let fanout = FanoutSettings {
            lease_owner: Some(node),
            ..settings.fanout.clone()
        };
        let jobs = deliveries.producer::<DeliveryJob>(DELIVERIES)?;
        let fanout_tasks = start_fanout(
            events,
            jobs,
            store,
            directory,
            settings,
            fanout,
            counters,
            supervisor,
            &fanout_stop,
        )
        .await?;
        Ok(Workers {
            fanout_stop,
            fanout_tasks,
            local: Some(LocalDispatch {
                forward_stop,
                forwarders,
                dispatch_stop,
                dispatch_task,
                deliveries,
            }),
        })
    }

    /// Wakes every task waiting on the in-process log (after a failure:
    /// nothing there is waited for any more).
    pub fn close(&self) {
        if let Some(local) = &self.local {
            local.deliveries.close();
        }
    }

    /// Stops in order, upstream first: fan-out finishes its batch, the
    /// forwarders stop, and dispatch drains the attempts in flight (what is
    /// left is pending in Postgres, claimed again at the next start).
    pub async fn stop(self) {
        self.fanout_stop.cancel();
        for t in self.fanout_tasks {
            let _ = t.await;
        }
        let Some(local) = self.local else {
            return;
        };
        local.forward_stop.cancel();
        for t in local.forwarders {
            let _ = t.await;
        }
        local.dispatch_stop.cancel();
        let _ = local.dispatch_task.await;
        local.deliveries.close();
    }
}

/// Starts fan-out of the share in `settings`, sending jobs with `jobs`:
/// one operator per fixed partition, or the membership that starts and
/// stops them.
#[allow(clippy::too_many_arguments)]
async fn start_fanout<L, P, S>(
    events: &L,
    jobs: P,
    store: Arc<S>,
    directory: Arc<SubscriptionCache>,
    settings: WorkerSettings,
    fanout_settings: FanoutSettings,
    counters: &WorkerCounters,
    supervisor: &Supervisor,
    fanout_stop: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, LogError>
where
    L: Log,
    P: crate::log::Producer<DeliveryJob>,
    S: FanoutStore,
{
    let mut fanout_tasks = Vec::new();
    match settings.share {
        Share::Fixed(partitions) => {
            for p in partitions {
                let consumer = events
                    .consumer::<Event>(&settings.events_topic, p, FANOUT_GROUP)
                    .await?;
                let mut op = FanoutOperator::new(
                    consumer,
                    jobs.clone(),
                    store.clone(),
                    directory.clone(),
                    fanout_settings.clone(),
                );
                if let Some(observer) = settings.observer.clone() {
                    op = op.with_observer(observer);
                }
                let (stop, counters) = (fanout_stop.clone(), counters.fanout.clone());
                fanout_tasks.push(
                    supervisor.spawn(format!("fan-out of events partition {p}"), async move {
                        op.run(counters, stop).await
                    }),
                );
            }
        }
        Share::Leased(leased) => {
            let (events, topic, observer, fanout_counters) = (
                events.clone(),
                settings.events_topic.clone(),
                settings.observer.clone(),
                counters.fanout.clone(),
            );
            let partitions = events.partitions(&topic)?;
            let start: StartReader = Box::new(move |p, fence, stop| {
                let (events, topic, jobs, store, directory, settings, observer, counters) = (
                    events.clone(),
                    topic.clone(),
                    jobs.clone(),
                    store.clone(),
                    directory.clone(),
                    fanout_settings.clone(),
                    observer.clone(),
                    fanout_counters.clone(),
                );
                Box::pin(async move {
                    let consumer = events.consumer::<Event>(&topic, p, FANOUT_GROUP).await?;
                    let mut op = FanoutOperator::new(
                        FencedConsumer::new(consumer, fence),
                        jobs,
                        store,
                        directory,
                        settings,
                    );
                    if let Some(observer) = observer {
                        op = op.with_observer(observer);
                    }
                    op.run(counters, stop).await.map_err(BoxError::from)
                })
            });
            let membership = MembershipSettings {
                topic: settings.events_topic.clone(),
                group: FANOUT_GROUP.into(),
                partitions,
                lease: leased.lease,
            };
            fanout_tasks.push(supervisor.spawn(
                "the fan-out membership",
                hold_partitions(
                    leased.store,
                    leased.member,
                    membership,
                    leased.counters,
                    start,
                    fanout_stop.clone(),
                ),
            ));
        }
    }
    Ok(fanout_tasks)
}

/// Moves jobs from a deliveries partition to the dispatcher, until `stop`
/// or the log's close. When dispatch is gone it waits for the stop that
/// dispatch's failure brings.
async fn forward<C: Consumer<DeliveryJob>>(
    mut consumer: C,
    out: mpsc::Sender<DeliveryJob>,
    stop: CancellationToken,
) -> Result<(), LogError> {
    loop {
        if failpoint::hit("dispatch.forward") {
            return Ok(());
        }
        let records = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = consumer.poll(256) => match r {
                Ok(r) => r,
                Err(LogError::Closed) => return Ok(()),
                Err(e) => return Err(e),
            },
        };
        let Some(last) = records.last().map(|r| r.offset) else {
            continue;
        };
        for r in records {
            if out.send(r.message).await.is_err() {
                // Dispatch is gone: its own end says why (the supervisor
                // keeps the first failure, which must be the cause, not
                // this consequence). Wait for the stop it brings.
                stop.cancelled().await;
                return Ok(());
            }
        }
        // The deliveries table holds the truth; the log only carries jobs.
        consumer.commit(Offset(last.0 + 1)).await?;
    }
}
