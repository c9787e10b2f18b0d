//! One walhook process: the roles it runs, each a named task under one
//! [`Supervisor`], and their ordered stop.
//!
//! A [`Process`] is what the binary maps its configuration onto: the log,
//! the platform store, the egress, and the roles (capture from a
//! [`ChangeSource`], a worker group of fan-out and its dispatcher, a member
//! of the dispatch group or a dispatcher node alone, and scheduled
//! [`Task`]s such as the archive and reconcile rounds). `walhook run`,
//! `capture`, `fanout` and `dispatch` differ only in the roles they hand
//! over.
//!
//! If a task ends, fails or panics while the process runs, the process
//! stops in order and [`Running::wait`] returns the error naming it;
//! nothing is lost, since everything not yet durable is read again after
//! the restart. Shutdown goes upstream first: capture stops reading and
//! waits for its receipts, the scheduled tasks stop, fan-out finishes its
//! batch, and dispatch drains the attempts in flight. What is left is
//! pending in Postgres and is claimed again at the next start. After a
//! failure the stop is bounded ([`FAILED_STOP_DEADLINE`]).

use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::capture::{
    CaptureCounters, CheckpointStore, CountingObserver, run_capture, save_checkpoints,
};
use super::log::LogControl;
use super::workers::{Leased, Share, WorkerCounters, WorkerSettings, Workers};
use crate::capture::{CaptureIncidentStore, CaptureLedgerStore, ChangeSource};
use crate::dispatch::egress::Egress;
use crate::dispatch::observe::AttemptObserver;
use crate::dispatch::{DispatchCounters, DispatchSettings, Dispatcher};
use crate::endpoint::{EndpointSource, RefreshSettings, SubscriptionCache};
use crate::event::Event;
use crate::fanout::{FanoutCounters, FanoutSettings};
use crate::ids::Lsn;
use crate::log::{Log, LogError};
use crate::membership::{MembershipCounters, MembershipSettings, hold_partitions};
use crate::metrics::{MetricsObserver, PipelineMetrics};
use crate::routing::{DISPATCH_GROUP, PartitionDispatch, Routes};
use crate::store::{DispatchStore, FanoutStore};
use crate::supervise::{Stopped, Supervisor, TaskError};

/// What the platform store of a process provides: fan-out's and dispatch's
/// tables, capture's incidents, ledger and checkpoints, and the endpoints.
pub trait PlatformStore:
    FanoutStore
    + DispatchStore
    + CaptureIncidentStore
    + CaptureLedgerStore
    + CheckpointStore
    + EndpointSource
{
}

impl<T> PlatformStore for T where
    T: FanoutStore
        + DispatchStore
        + CaptureIncidentStore
        + CaptureLedgerStore
        + CheckpointStore
        + EndpointSource
{
}

/// Capture: the source, read into the events topic.
#[derive(Debug)]
pub struct CaptureRole<C> {
    /// The source, prepared (its slot and publication exist).
    pub source: C,
    /// The slot its checkpoints name.
    pub slot: String,
}

/// A worker group's share of the events topic.
#[derive(Debug)]
pub struct WorkerRole {
    /// The events partitions read.
    pub share: Share,
    /// The dispatcher node id of the group.
    pub node_id: String,
    /// Fan-out alone, to the deliveries topic by these routes (`[log]
    /// dispatch = "by-endpoint"`).
    pub route: Option<(Arc<Routes>, String)>,
}

/// Dispatch without fan-out in this process.
pub enum DispatchRole {
    /// A member of the dispatch group on the deliveries topic: a dispatcher
    /// per deliveries partition it holds (`[log] dispatch = "by-endpoint"`).
    Member {
        /// Its membership.
        leased: Leased,
        /// The base of its dispatchers' node ids
        /// (`<base>-p<partition>.<token>`).
        node_id: String,
        /// The routes (the fan-out members' own).
        routes: Arc<Routes>,
    },
    /// A dispatcher node fed by no log: it claims from the platform store
    /// what is due and held by no live node (`walhook dispatch`).
    Node {
        /// Its node id.
        node_id: String,
    },
}

impl std::fmt::Debug for DispatchRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DispatchRole::Member {
                leased, node_id, ..
            } => f
                .debug_struct("Member")
                .field("member", &leased.member)
                .field("node_id", node_id)
                .finish_non_exhaustive(),
            DispatchRole::Node { node_id } => {
                f.debug_struct("Node").field("node_id", node_id).finish()
            }
        }
    }
}

/// A scheduled job that runs beside the stages until the process stops
/// (the archive and reconcile rounds). It is stopped by dropping it at the
/// next await once the stop begins, and ending earlier fails the process.
pub struct Task {
    name: String,
    run: Box<dyn FnOnce(CancellationToken) -> BoxFuture<'static, ()> + Send>,
}

impl Task {
    /// A task named `name` (for its failure) running `run` until its token
    /// is cancelled.
    pub fn new<F, Fut>(name: impl Into<String>, run: F) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        Task {
            name: name.into(),
            run: Box::new(move |stop| Box::pin(run(stop))),
        }
    }
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Task").field(&self.name).finish()
    }
}

/// The topics and settings of the stages.
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// The events topic.
    pub events_topic: String,
    /// The deliveries topic (`[log] dispatch = "by-endpoint"`).
    pub deliveries_topic: String,
    /// Partitions of the in-process deliveries topic.
    pub deliveries_partitions: u32,
    /// Records held per partition before a writer waits.
    pub capacity: usize,
    /// Fan-out's settings.
    pub fanout: FanoutSettings,
    /// The dispatchers' settings (each role sets its node id).
    pub dispatch: DispatchSettings,
}

/// Counters of a running process.
#[derive(Debug, Default)]
pub struct Counters {
    /// Capture's.
    pub capture: Arc<CaptureCounters>,
    /// Fan-out's.
    pub fanout: Arc<FanoutCounters>,
    /// Dispatch's.
    pub dispatch: Arc<DispatchCounters>,
    /// The memberships of this process (fan-out without `--member`, the
    /// dispatch members of `[log] dispatch = "by-endpoint"`).
    pub memberships: Vec<Arc<MembershipCounters>>,
}

/// Why a process could not start, or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// A role that sends was given no egress or no endpoint directory.
    #[error("a process that fans out or dispatches needs an egress and an endpoint directory")]
    Incomplete,
    /// The log refused a topic.
    #[error(transparent)]
    Log(#[from] LogError),
    /// A supervised task failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// A task failed while the workers started, without a recorded cause.
    #[error("a task failed while the workers started")]
    FailedWhileStarting,
    /// Capture failed for good.
    #[error("capture stopped")]
    Capture(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Capture panicked.
    #[error("capture panicked: {0}")]
    CapturePanicked(String),
    /// After a failure, the orderly stop took longer than
    /// [`FAILED_STOP_DEADLINE`].
    #[error("the orderly stop after the failure did not finish within {} s", FAILED_STOP_DEADLINE.as_secs())]
    StopTimedOut(#[source] Option<TaskError>),
    /// The process's own task panicked.
    #[error("the pipeline task panicked: {0}")]
    Panicked(String),
}

/// How long the orderly stop after a task's failure may take before the
/// process exits without it.
pub const FAILED_STOP_DEADLINE: Duration = Duration::from_secs(30);

/// Everything a process runs (see the module docs).
pub struct Process<L, S, E, C> {
    /// The log of the events (and deliveries) topics.
    pub log: L,
    /// The platform store.
    pub store: Arc<S>,
    /// Where requests go out, when a role sends.
    pub egress: Option<Arc<E>>,
    /// The endpoint directory, loaded, when a role sends; the process
    /// keeps it fresh.
    pub directory: Option<Arc<SubscriptionCache>>,
    /// Capture, when this process captures.
    pub capture: Option<CaptureRole<C>>,
    /// Fan-out of some events partitions and their dispatcher.
    pub workers: Option<WorkerRole>,
    /// Dispatch alone.
    pub dispatch: Option<DispatchRole>,
    /// Topics and the stages' settings.
    pub settings: ProcessSettings,
    /// Fed by every stage when given.
    pub metrics: Option<Arc<PipelineMetrics>>,
    /// Scheduled jobs beside the stages.
    pub tasks: Vec<Task>,
}

/// A running process.
pub struct Running {
    /// Its counters.
    pub counters: Arc<Counters>,
    /// The endpoint directory it reads (empty when no role sends).
    pub directory: Arc<SubscriptionCache>,
    task: JoinHandle<Result<(), ProcessError>>,
}

impl Running {
    /// Waits for the process to end (after its shutdown token was
    /// cancelled, or on a failure).
    pub async fn wait(self) -> Result<(), ProcessError> {
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(ProcessError::Panicked(e.to_string())),
        }
    }
}

/// A stop token and the task it stops.
type Stoppable = (CancellationToken, JoinHandle<()>);

async fn stop(stoppable: Option<Stoppable>) {
    if let Some((token, task)) = stoppable {
        token.cancel();
        let _ = task.await;
    }
}

impl<L, S, E, C> Process<L, S, E, C>
where
    L: LogControl,
    S: PlatformStore,
    E: Egress,
    C: ChangeSource,
{
    /// Starts every role; `shutdown` stops them in order.
    pub async fn start(self, shutdown: CancellationToken) -> Result<Running, ProcessError> {
        let Process {
            log,
            store,
            egress,
            directory,
            capture,
            workers,
            dispatch,
            settings,
            metrics,
            tasks,
        } = self;
        let sends = workers.is_some() || dispatch.is_some();
        let (egress, directory) = match (sends, egress, directory) {
            (false, _, directory) => (None, directory.unwrap_or_default()),
            (true, Some(egress), Some(directory)) => (Some(egress), directory),
            (true, _, _) => return Err(ProcessError::Incomplete),
        };

        // Cancelled by the caller, or when a task fails or ends too early.
        let stop_all = shutdown.child_token();
        let failed = CancellationToken::new();
        let supervisor = Supervisor::new(failed.clone());

        let refresher = sends.then(|| {
            let (d, store, stop) = (directory.clone(), store.clone(), CancellationToken::new());
            let until = stop.clone();
            // The refresh ends on its own token.
            let task = supervisor.spawn("the endpoint directory refresher", async move {
                d.refresh(store, RefreshSettings::default(), until).await;
                Ok::<(), Stopped>(())
            });
            (stop, task)
        });
        let counters = Arc::new(Counters {
            memberships: {
                let mut m = Vec::new();
                if let Some(WorkerRole {
                    share: Share::Leased(leased),
                    ..
                }) = &workers
                {
                    m.push(leased.counters.clone());
                }
                if let Some(DispatchRole::Member { leased, .. }) = &dispatch {
                    m.push(leased.counters.clone());
                }
                m
            },
            ..Counters::default()
        });
        let watch = {
            let stop = CancellationToken::new();
            log.watch(metrics.clone(), stop.clone())
                .map(|w| (stop, supervisor.spawn("the Fluvio cluster watch", w)))
        };

        // Told about every attempt; shared by the workers and dispatch.
        let observer = metrics
            .as_ref()
            .map(|m| Arc::new(MetricsObserver::new(m.clone())) as Arc<dyn AttemptObserver>);
        let workers = match (workers, egress.clone()) {
            (Some(role), Some(egress)) => {
                let mut dispatch = settings.dispatch.clone();
                dispatch.node_id = role.node_id.clone();
                let worker_settings = WorkerSettings {
                    events_topic: settings.events_topic.clone(),
                    share: role.share,
                    deliveries_partitions: settings.deliveries_partitions,
                    capacity: settings.capacity,
                    fanout: settings.fanout.clone(),
                    dispatch,
                    observer: observer.clone(),
                    route: role.route,
                };
                let worker_counters = WorkerCounters {
                    fanout: counters.fanout.clone(),
                    dispatch: counters.dispatch.clone(),
                };
                // Boxed: the start's future is large, and nesting it in the
                // select below inline overflows the compiler's layout
                // queries.
                let starting = Box::pin(Workers::start(
                    &log,
                    egress,
                    store.clone(),
                    directory.clone(),
                    worker_settings,
                    &worker_counters,
                    &supervisor,
                ));
                // Opening the partitions waits for their leaders; a task
                // that fails meanwhile (the cluster watch giving up) ends
                // the start.
                tokio::select! {
                    started = starting => Some(started?),
                    _ = failed.cancelled() => {
                        return Err(supervisor
                            .take_failure()
                            .map_or(ProcessError::FailedWhileStarting, ProcessError::Task));
                    }
                }
            }
            _ => None,
        };
        let dispatcher = match (dispatch, egress) {
            (Some(role), Some(egress)) => Some(start_dispatch(
                role,
                &log,
                egress,
                &store,
                &directory,
                &settings,
                &counters,
                observer,
                &supervisor,
            )?),
            _ => None,
        };

        // Capture, restarted after transient errors, and its checkpoints.
        let mut checkpoints = None;
        let capture_task: JoinHandle<Result<(), ProcessError>> = match capture {
            Some(CaptureRole { source, slot }) => {
                let (confirmed, confirmed_rx) = tokio::sync::watch::channel(Lsn::ZERO);
                let lag = Arc::new(AtomicI64::new(-1));
                let observer = Arc::new(CountingObserver {
                    confirmed,
                    lag: lag.clone(),
                    counters: counters.capture.clone(),
                    metrics,
                });
                let stop = CancellationToken::new();
                let writer = supervisor.spawn(
                    "the capture checkpoint writer",
                    save_checkpoints(
                        store.clone(),
                        source.name().to_owned(),
                        slot,
                        confirmed_rx,
                        lag,
                        stop.clone(),
                    ),
                );
                checkpoints = Some((stop, writer));
                let events = log.producer::<Event>(&settings.events_topic)?;
                let run = run_capture(source, events, observer, store.clone(), stop_all.clone());
                // Capture's end starts the orderly stop, so it is awaited
                // here rather than watched by the supervisor.
                #[allow(clippy::disallowed_methods)]
                tokio::spawn(
                    async move { run.await.map_err(|e| ProcessError::Capture(Box::new(e))) },
                )
            }
            // No capture here: the process runs until shutdown.
            None => {
                let stop = stop_all.clone();
                #[allow(clippy::disallowed_methods)]
                tokio::spawn(async move {
                    stop.cancelled().await;
                    Ok(())
                })
            }
        };
        let scheduled: Vec<Stoppable> = tasks
            .into_iter()
            .map(|task| {
                let stop = CancellationToken::new();
                let handle = supervisor.spawn(
                    task.name,
                    run_until_stopped(stop.clone(), (task.run)(stop.clone())),
                );
                (stop, handle)
            })
            .collect();

        let watchdog = (failed.clone(), supervisor.clone());
        let orderly = async move {
            // Capture runs until shutdown, or until it or another task
            // fails.
            let mut capture_task = capture_task;
            let capture_ended = tokio::select! {
                ended = &mut capture_task => ended,
                _ = failed.cancelled() => {
                    // A task failed: capture stops without waiting for
                    // receipts that may never come (closing the log fails
                    // them); what was not confirmed is read again after
                    // the restart.
                    stop_all.cancel();
                    log.close_after_failure();
                    if let Some(w) = &workers {
                        w.close();
                    }
                    capture_task.await
                }
            };
            let capture_failure = match capture_ended {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(e) => Some(ProcessError::CapturePanicked(e.to_string())),
            };
            // Then the rest, upstream first; tasks ending now end on
            // purpose.
            supervisor.stopping();
            for task in scheduled {
                stop(Some(task)).await;
            }
            if let Some(w) = workers {
                w.stop().await;
            }
            stop(dispatcher).await;
            stop(refresher).await;
            stop(watch).await;
            log.close_after_failure();
            stop(checkpoints).await;
            match (supervisor.take_failure(), capture_failure) {
                (Some(e), _) => Err(ProcessError::Task(e)),
                (None, Some(e)) => Err(e),
                (None, None) => Ok(()),
            }
        };
        #[allow(clippy::disallowed_methods)]
        let task = tokio::spawn(async move {
            // Once a task failed the process stops in bounded time, even
            // when a part of the orderly stop waits for what the failed
            // task would have done (seen in a soak: the stop hung and
            // walhook sat idle); what was not confirmed is read again after
            // the restart.
            let (failed, supervisor) = watchdog;
            tokio::pin!(orderly);
            tokio::select! {
                done = &mut orderly => done,
                _ = async {
                    failed.cancelled().await;
                    tokio::time::sleep(FAILED_STOP_DEADLINE).await;
                } => {
                    tracing::error!(
                        deadline_secs = FAILED_STOP_DEADLINE.as_secs(),
                        "a task failed and the orderly stop did not finish in time; exiting without it"
                    );
                    Err(ProcessError::StopTimedOut(supervisor.take_failure()))
                }
            }
        });
        Ok(Running {
            counters,
            directory,
            task,
        })
    }
}

/// `fut` as a supervised task that ends when it does or when `stop` is
/// cancelled (then dropped at its next await): a [`Task`]'s future may
/// ignore its token.
async fn run_until_stopped(
    stop: CancellationToken,
    fut: impl std::future::Future<Output = ()>,
) -> Result<(), Stopped> {
    tokio::select! {
        () = fut => {}
        () = stop.cancelled() => {}
    }
    Ok(())
}

/// Starts the dispatch role: the membership holding deliveries partitions
/// (a dispatcher each), or a dispatcher node fed by no log.
#[allow(clippy::too_many_arguments)]
fn start_dispatch<L: Log, S: PlatformStore, E: Egress>(
    role: DispatchRole,
    log: &L,
    egress: Arc<E>,
    store: &Arc<S>,
    directory: &Arc<SubscriptionCache>,
    settings: &ProcessSettings,
    counters: &Counters,
    observer: Option<Arc<dyn AttemptObserver>>,
    supervisor: &Supervisor,
) -> Result<Stoppable, ProcessError> {
    let stop = CancellationToken::new();
    let mut dispatch = settings.dispatch.clone();
    let task = match role {
        DispatchRole::Member {
            leased,
            node_id,
            routes,
        } => {
            dispatch.node_id = node_id;
            let topic = settings.deliveries_topic.clone();
            let partitions = log.partitions(&topic)?;
            let reader = PartitionDispatch {
                log: log.clone(),
                topic: topic.clone(),
                egress,
                store: store.clone(),
                directory: directory.clone(),
                settings: dispatch,
                routes,
                counters: counters.dispatch.clone(),
                observer,
            }
            .into_reader();
            let membership = MembershipSettings {
                topic,
                group: DISPATCH_GROUP.into(),
                partitions,
                lease: leased.lease,
            };
            supervisor.spawn(
                "the dispatch membership",
                hold_partitions(
                    leased.store,
                    leased.member,
                    membership,
                    leased.counters,
                    reader,
                    stop.clone(),
                ),
            )
        }
        DispatchRole::Node { node_id } => {
            dispatch.node_id = node_id;
            let mut dispatcher = Dispatcher::new(
                egress,
                store.clone(),
                directory.clone(),
                dispatch,
                counters.dispatch.clone(),
            );
            if let Some(observer) = observer {
                dispatcher = dispatcher.with_observer(observer);
            }
            let stop = stop.clone();
            supervisor.spawn("the dispatcher", async move {
                // No log feeds this node: everything it sends it claims
                // from the store. The sender stays open, or the dispatcher
                // would take its close for the end of its work.
                let (_jobs, jobs_rx) = tokio::sync::mpsc::channel(1);
                dispatcher.run(jobs_rx, stop).await
            })
        }
    };
    Ok((stop, task))
}
