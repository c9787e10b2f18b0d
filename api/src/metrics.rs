//! The Prometheus registry served at `/metrics`: the API's own metrics, and
//! those of the pipeline stages running in the same process.
//!
//! ```text
//!  API middleware ──▶ requests, durations
//!  pipeline (walhook run) ──▶ PipelineMetrics: attempt outcomes by class,
//!                              first-attempt latency, capture lag (fed as they happen)
//!                         └─▶ collectors registered by the binary (its atomic counters,
//!                              read at scrape time)
//!  /metrics scrape ──SQL──▶ gauges no one process can count: pending deliveries, the
//!                              oldest one's age, circuits, capture checkpoints (read at
//!                              most once per [api].metrics_cache, however many scrapes)
//! ```
//!
//! Names are the constants of [`names`] (the pipeline's, with the API's
//! beside them); counters get `_total` when encoded.
//!
//! Every label value comes from a bounded set, never from what a caller
//! sent: methods outside the standard set are refused before this
//! middleware ([`crate::edge`]) and would be `OTHER` here anyway; routes
//! are the router's templates (`unmatched` for any unknown path); status
//! codes are the server's own; tenants and endpoints are the first
//! [`MAX_LABELLED`](walhook_pipeline::metrics::MAX_LABELLED) seen, then `other`; the SQL gauges' names are capped
//! the same way; refusals have a closed set of reasons ([`Refusal`]).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use walhook_sql::Platform;

pub use walhook_pipeline::metrics::names;
use walhook_pipeline::metrics::{HistogramFamily, PipelineMetrics};

use self::bounded::capped;
pub use self::bounded::{ReasonLabel, Refusal, STANDARD_METHODS, method_label};
use crate::ApiState;
use crate::cache::TtlCache;

mod bounded;

/// Labels of API requests.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The method.
    pub method: String,
    /// The route template (`/v1/webhook-endpoints/{id}`), never the raw
    /// path, so ids do not explode the label set.
    pub route: String,
    /// The status code.
    pub status: u16,
}

/// Labels of durations.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template.
    pub route: String,
}

/// A label with one value.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NameLabel {
    /// The value (a circuit state, a source name).
    pub name: String,
}

/// The shortest time between two log lines for one reason of refusal.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

/// A kind label (`new`, `retry`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// The kind.
    pub kind: String,
}

/// A gap class label (`class="missing_delivery"`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// The gap class.
    pub class: String,
}

#[derive(Debug, Default)]
struct SqlGauges {
    pending: Gauge,
    oldest_due_age: Family<KindLabel, Gauge<f64, AtomicU64>>,
    checkpoint_slot_lag: Family<NameLabel, Gauge>,
    oldest_pending_age: Gauge<f64, AtomicU64>,
    overdue_unleased: Gauge,
    circuits: Family<NameLabel, Gauge>,
    checkpoint_age: Family<NameLabel, Gauge<f64, AtomicU64>>,
    archive_rows: Family<NameLabel, Gauge>,
    archive_bytes: Family<NameLabel, Gauge>,
    archive_failures: Family<NameLabel, Gauge>,
    archive_failed_days: Family<NameLabel, Gauge>,
    archive_oldest_hot_age: Family<NameLabel, Gauge<f64, AtomicU64>>,
    archive_xid_age: Family<NameLabel, Gauge>,
    archive_freeze_progress: Family<NameLabel, Gauge<f64, AtomicU64>>,
    reconcile_gaps: Family<ClassLabel, Gauge>,
    reconcile_open_gaps: Gauge,
    reconcile_last_clean: Gauge<f64, AtomicU64>,
    reconcile_last_run: Gauge<f64, AtomicU64>,
    database_up: Gauge,
}

fn request_histogram() -> Histogram {
    // 1 ms to about 8 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

#[derive(Debug)]
struct ApiMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: HistogramFamily<RouteLabels>,
    refusals: Family<ReasonLabel, Counter>,
}

/// The registry and the metrics in it.
pub struct Metrics {
    registry: Mutex<Registry>,
    api: ApiMetrics,
    /// Fed by the pipeline in this process.
    pub pipeline: Arc<PipelineMetrics>,
    sql: Arc<SqlGauges>,
    /// When the SQL gauges were last read.
    gauge_cache: TtlCache<()>,
    /// When each reason of refusal was last logged.
    refusal_logged: Mutex<std::collections::HashMap<Refusal, Instant>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with the API's, the pipeline's and the SQL gauges.
    pub fn new() -> Self {
        use names::*;
        let mut registry = Registry::default();
        let api = ApiMetrics {
            requests: Family::default(),
            durations: Family::new_with_constructor(request_histogram),
            refusals: Family::default(),
        };
        for reason in Refusal::ALL {
            let _ = api.refusals.get_or_create(&ReasonLabel {
                reason: reason.as_str().to_owned(),
            });
        }
        registry.register(
            API_REFUSALS,
            "Requests and connections refused before they were served, by reason",
            api.refusals.clone(),
        );
        registry.register(
            API_REQUESTS,
            "API requests by method, route and status",
            api.requests.clone(),
        );
        registry.register(
            API_REQUEST_DURATION,
            "API request durations by route",
            api.durations.clone(),
        );
        let pipeline = Arc::new(PipelineMetrics::default());
        pipeline.register(&mut registry);
        let sql = Arc::new(SqlGauges::default());
        registry.register(
            DELIVERIES_PENDING,
            "Pending deliveries",
            sql.pending.clone(),
        );
        registry.register(
            DELIVERIES_OLDEST_PENDING_AGE,
            "Age of the oldest pending delivery in seconds (0 when none)",
            sql.oldest_pending_age.clone(),
        );
        registry.register(
            DELIVERIES_OVERDUE_UNLEASED,
            "Pending deliveries that are due and held by no dispatcher",
            sql.overdue_unleased.clone(),
        );
        registry.register(
            ENDPOINT_CIRCUITS,
            "Endpoints per circuit state",
            sql.circuits.clone(),
        );
        registry.register(
            DELIVERIES_OLDEST_DUE_AGE,
            "Age of the oldest due delivery by kind (new: first attempt; retry), seconds",
            sql.oldest_due_age.clone(),
        );
        registry.register(
            CAPTURE_CHECKPOINT_SLOT_LAG,
            "WAL a capture source's slot retained at its last checkpoint, bytes",
            sql.checkpoint_slot_lag.clone(),
        );
        registry.register(
            CAPTURE_CHECKPOINT_AGE,
            "Seconds since a capture source's checkpoint last moved",
            sql.checkpoint_age.clone(),
        );
        registry.register(
            ARCHIVE_ROWS,
            "Rows archived to Parquet and dropped from the hot tables, by table",
            sql.archive_rows.clone(),
        );
        registry.register(
            ARCHIVE_BYTES,
            "Parquet bytes of the archived rows, by table",
            sql.archive_bytes.clone(),
        );
        registry.register(
            ARCHIVE_VERIFICATION_FAILURES,
            "Archive verifications that found an object or a count not matching, by table",
            sql.archive_failures.clone(),
        );
        registry.register(
            ARCHIVE_FAILED_DAYS,
            "Days that failed to archive and no run has archived since, by table",
            sql.archive_failed_days.clone(),
        );
        registry.register(
            ARCHIVE_OLDEST_HOT_AGE,
            "Seconds since the oldest day still in the hot tables began, by table",
            sql.archive_oldest_hot_age.clone(),
        );
        registry.register(
            ARCHIVE_XID_AGE,
            "Transactions since the oldest row not yet frozen in the table's partitions, by table",
            sql.archive_xid_age.clone(),
        );
        registry.register(
            ARCHIVE_FREEZE_PROGRESS,
            "The largest share of its effective autovacuum_freeze_max_age a partition's oldest unfrozen row has reached, by table (at 1 the anti-wraparound vacuum starts)",
            sql.archive_freeze_progress.clone(),
        );
        registry.register(
            RECONCILE_GAPS,
            "Gaps the latest reconciliation over every tenant found, by class",
            sql.reconcile_gaps.clone(),
        );
        registry.register(
            RECONCILE_OPEN_GAPS,
            "Gaps the latest reconciliation left unrepaired",
            sql.reconcile_open_gaps.clone(),
        );
        registry.register(
            RECONCILE_LAST_CLEAN,
            "End of the latest reconciliation window found clean, Unix seconds",
            sql.reconcile_last_clean.clone(),
        );
        registry.register(
            RECONCILE_LAST_RUN,
            "When the latest reconciliation ended, Unix seconds",
            sql.reconcile_last_run.clone(),
        );
        registry.register(
            METRICS_DATABASE_UP,
            "1 when the last scrape could read the platform database",
            sql.database_up.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            api,
            pipeline,
            sql,
            gauge_cache: TtlCache::default(),
            refusal_logged: Mutex::default(),
        }
    }

    /// Adds a collector read at every scrape (the binary registers one over
    /// the pipeline's atomic counters).
    pub fn register_collector(&self, collector: Box<dyn Collector>) {
        self.registry.lock().register_collector(collector);
    }

    /// Refreshes the SQL gauges from `platform` (when given) if they are
    /// older than `max_age`, then encodes every metric in the text
    /// exposition format. However often it is called, the gauges' queries
    /// run at most once per `max_age` (see [`crate::cache`]).
    pub async fn render(&self, platform: Option<&Platform>, max_age: Duration) -> String {
        if let Some(platform) = platform {
            self.gauge_cache
                .get(max_age, || self.read_gauges(platform))
                .await;
        }
        walhook_pipeline::metrics::encode(&self.registry.lock())
    }

    /// Counts a refusal; true when it should also be logged: the first of
    /// its reason in a second. Refusals are what a flood is made of, so
    /// logging each would let an outsider fill the log; the counter has
    /// them all.
    #[must_use = "log the refusal when this says so"]
    pub fn refused(&self, reason: Refusal) -> bool {
        self.api
            .refusals
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_owned(),
            })
            .inc();
        let now = Instant::now();
        let mut logged = self.refusal_logged.lock();
        match logged.get(&reason) {
            Some(at) if now.duration_since(*at) < REFUSAL_LOG_EVERY => false,
            _ => {
                logged.insert(reason, now);
                true
            }
        }
    }

    /// How many refusals for `reason` were counted.
    pub fn refusals(&self, reason: Refusal) -> u64 {
        self.api
            .refusals
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_owned(),
            })
            .get()
    }

    /// How many times the SQL gauges were read.
    pub fn gauge_reads(&self) -> u64 {
        self.gauge_cache.reads()
    }

    async fn read_gauges(&self, platform: &Platform) {
        match platform.pipeline_gauges().await {
            Ok(g) => {
                self.sql.pending.set(g.pending);
                self.sql.oldest_pending_age.set(g.oldest_pending_age_secs);
                self.sql.overdue_unleased.set(g.overdue_unleased);
                self.sql.circuits.clear();
                for (state, n) in capped(g.circuits, |a, b| a + b) {
                    self.sql
                        .circuits
                        .get_or_create(&NameLabel { name: state })
                        .set(n);
                }
                for (kind, age) in [
                    ("new", g.oldest_due_new_secs),
                    ("retry", g.oldest_due_retry_secs),
                ] {
                    self.sql
                        .oldest_due_age
                        .get_or_create(&KindLabel { kind: kind.into() })
                        .set(age);
                }
                self.sql.checkpoint_age.clear();
                self.sql.checkpoint_slot_lag.clear();
                let capture = g
                    .capture
                    .into_iter()
                    .map(|(source, lag, age)| (source, (lag, age)))
                    .collect();
                // Past the cap, the worst lag and age stand for the rest.
                let worst = |(l1, a1): (Option<i64>, f64), (l2, a2): (Option<i64>, f64)| {
                    (l1.max(l2), a1.max(a2))
                };
                for (source, (lag, age)) in capped(capture, worst) {
                    if let Some(lag) = lag {
                        self.sql
                            .checkpoint_slot_lag
                            .get_or_create(&NameLabel {
                                name: source.clone(),
                            })
                            .set(lag);
                    }
                    self.sql
                        .checkpoint_age
                        .get_or_create(&NameLabel { name: source })
                        .set(age);
                }
                let archive = g
                    .archive
                    .into_iter()
                    .map(|a| (a.table.clone(), a))
                    .collect();
                let fold = |mut a: walhook_sql::gauges::ArchiveGauges,
                            b: walhook_sql::gauges::ArchiveGauges| {
                    a.rows += b.rows;
                    a.bytes += b.bytes;
                    a.verification_failures += b.verification_failures;
                    a.oldest_hot_age_secs = a.oldest_hot_age_secs.max(b.oldest_hot_age_secs);
                    a.xid_age = a.xid_age.max(b.xid_age);
                    a.freeze_progress = a.freeze_progress.max(b.freeze_progress);
                    a
                };
                for (table, a) in capped(archive, fold) {
                    let label = NameLabel { name: table };
                    self.sql.archive_rows.get_or_create(&label).set(a.rows);
                    self.sql.archive_bytes.get_or_create(&label).set(a.bytes);
                    self.sql
                        .archive_failures
                        .get_or_create(&label)
                        .set(a.verification_failures);
                    self.sql
                        .archive_failed_days
                        .get_or_create(&label)
                        .set(a.failed_days);
                    self.sql
                        .archive_oldest_hot_age
                        .get_or_create(&label)
                        .set(a.oldest_hot_age_secs);
                    self.sql
                        .archive_xid_age
                        .get_or_create(&label)
                        .set(a.xid_age);
                    self.sql
                        .archive_freeze_progress
                        .get_or_create(&label)
                        .set(a.freeze_progress);
                }
                if let Some(r) = g.reconcile {
                    for class in walhook_reconcile::GapClass::ALL {
                        let n = r
                            .gaps
                            .iter()
                            .find(|(c, _)| c == class.as_str())
                            .map_or(0, |(_, n)| *n);
                        self.sql
                            .reconcile_gaps
                            .get_or_create(&ClassLabel {
                                class: class.as_str().to_owned(),
                            })
                            .set(n);
                    }
                    self.sql.reconcile_open_gaps.set(r.open_gaps);
                    self.sql.reconcile_last_clean.set(r.last_clean_until);
                    self.sql.reconcile_last_run.set(r.last_run_at);
                }
                self.sql.database_up.set(1);
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics: cannot read the platform database");
                self.sql.database_up.set(0);
            }
        }
    }
}

/// Middleware counting requests and timing them by route.
pub async fn track(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method()).to_owned();
    let started = Instant::now();
    let response = next.run(request).await;
    let m = &state.metrics.api;
    m.requests
        .get_or_create(&RequestLabels {
            method,
            route: route.clone(),
            status: response.status().as_u16(),
        })
        .inc();
    m.durations
        .get_or_create(&RouteLabels { route })
        .observe(started.elapsed().as_secs_f64());
    response
}
