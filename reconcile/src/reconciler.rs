//! One reconciliation: read every stage of the window at one snapshot,
//! check the archived days, repair when asked, seal the report.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use walhook_archive::dates::NaiveDateSql;
use walhook_archive::table::Table;
use walhook_pipeline::objstore::ObjectStore;
use walhook_sql::Platform;

use crate::findings::Findings;
use crate::report::{FORMAT, Parameters, Report, SCHEMA_VERSION};
use crate::window::{Window, rfc3339};
use crate::{ReconcileError, cold, coverage, history, hot, ledger, repair};

/// How runs judge and repair.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long past due a pending delivery may wait before it is overdue.
    pub grace: Duration,
    /// The delivery deadline of re-driven deliveries (`[retry] deadline`).
    pub deadline: Duration,
    /// How capture's progress past the window's end is judged.
    pub capture: coverage::Check,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            grace: Duration::from_secs(60),
            deadline: Duration::from_secs(24 * 3600),
            capture: coverage::Check::default(),
        }
    }
}

/// What to reconcile.
#[derive(Debug, Clone)]
pub struct Request {
    /// The window.
    pub window: Window,
    /// One tenant only (the capture ledger, which does not know tenants,
    /// is then left out).
    pub tenant: Option<String>,
    /// Repair what can be repaired.
    pub repair: bool,
}

/// Where a run reports how far it got.
pub trait Progress: Send + Sync {
    /// A stage begins.
    fn stage(&self, _name: &str) {}
    /// `n` more rows were read.
    fn rows(&self, _n: u64) {}
}

/// Progress nobody watches.
pub struct Silent;

impl Progress for Silent {}

/// Runs reconciliations against one platform database and archive store.
pub struct Reconciler<S> {
    platform: Platform,
    store: Option<S>,
    settings: Settings,
}

impl<S: ObjectStore> Reconciler<S> {
    /// A reconciler; `store` is the archive's (archived days are listed but
    /// not read without it).
    pub fn new(platform: Platform, store: Option<S>, settings: Settings) -> Self {
        Reconciler {
            platform,
            store,
            settings,
        }
    }

    /// Reconciles `request.window`; the report says what was found and, with
    /// `repair`, what was fixed.
    pub async fn run(
        &self,
        request: &Request,
        progress: &dyn Progress,
    ) -> Result<Report, ReconcileError> {
        let Window { since, until } = request.window;
        let tenant = request.tenant.as_deref();
        let mut findings = Findings::default();

        // Capture must be past the window's end (or, for a window that
        // ends later, past the run's start) before the window is read:
        // give a live capture the moment it needs to show it.
        let through = until.min(SystemTime::now());
        progress.stage("capture's progress");
        {
            let client = self.platform.client().await?;
            self.settings.capture.wait_for(&client, through).await?;
        }

        // Two sessions at one snapshot: the merge reads two sorted streams.
        progress.stage("snapshot");
        let a = deadpool_postgres::Object::take(self.platform.client().await?);
        let b = deadpool_postgres::Object::take(self.platform.client().await?);
        let begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; \
                     SET LOCAL TIME ZONE 'UTC'; SET LOCAL work_mem = '256MB'";
        a.batch_execute(begin)
            .await
            .map_err(ReconcileError::query("begin the snapshot"))?;
        let row = a
            .query_one("SELECT pg_export_snapshot(), now()", &[])
            .await
            .map_err(ReconcileError::query("export the snapshot"))?;
        let snapshot: String = row.get(0);
        let as_of: SystemTime = row.get(1);
        b.batch_execute(&format!("{begin}; SET TRANSACTION SNAPSHOT '{snapshot}'"))
            .await
            .map_err(ReconcileError::query("share the snapshot"))?;

        let dropped = a
            .query(
                "SELECT table_name, day FROM walhook.archive_partitions WHERE state = 'dropped'",
                &[],
            )
            .await
            .map_err(ReconcileError::query("read the archive catalog"))?;
        let mut archived_event_days = HashSet::new();
        let mut last_attempts_day = None;
        for r in dropped {
            let day = r.get::<_, NaiveDateSql>(1).0;
            match r.get::<_, &str>(0) {
                "events" => {
                    archived_event_days.insert(day);
                }
                "attempts" => last_attempts_day = last_attempts_day.max(Some(day)),
                _ => {}
            }
        }
        let after_day = |d: Option<chrono::NaiveDate>| {
            d.and_then(|d| d.succ_opt())
                .map(|d| {
                    SystemTime::from(d.and_hms_opt(0, 0, 0).expect("midnight exists").and_utc())
                })
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        let replaying: HashSet<[u8; 16]> = a
            .query(
                "SELECT DISTINCT delivery_id FROM walhook.replay_requests WHERE done_at IS NULL",
                &[],
            )
            .await
            .map_err(ReconcileError::query("read open replays"))?
            .iter()
            .map(|r| *r.get::<_, uuid::Uuid>(0).as_bytes())
            .collect();

        progress.stage("subscriptions");
        let history = history::History::load(&a).await?;

        let ledger = if tenant.is_none() {
            progress.stage("capture ledger");
            ledger::run(&a, since, until, &archived_event_days, &mut findings).await?
        } else {
            ledger::Ledger::default()
        };
        let capture_coverage = self
            .settings
            .capture
            .run(&a, through, &mut findings)
            .await?;

        // Archived days: verified, and the window's rows of dropped ones
        // read, at the snapshot the hot rows are read at.
        progress.stage("archive");
        let day = |d: Duration| d.as_secs().div_ceil(24 * 3600);
        let span = cold::Span {
            since,
            until,
            tenant: request.tenant.clone(),
            days: request.window.days(),
            deliveries_after: 1,
            attempts_after: day(self.settings.deadline) + 1,
        };
        let (archive, archived) =
            cold::run(&a, self.store.as_ref(), &span, &mut findings, &|what| {
                progress.stage(&format!("archive: {what}"))
            })
            .await?;

        // Attempts of dropped days are read from the store; without it, or
        // when a day of them could not be read, deliveries that may have
        // attempts there are not compared with their attempts.
        let unread = |table: Table| {
            archived
                .unread
                .iter()
                .filter(move |(t, _)| *t == table)
                .map(|(_, d)| *d)
        };
        let hot_attempts_from = match &self.store {
            Some(_) => after_day(unread(Table::Attempts).max()),
            None => after_day(last_attempts_day),
        };
        // Deliveries naming an event of a dropped day that could not be
        // read are explained by the archive's gap, not missing events.
        let unread_event_days: HashSet<chrono::NaiveDate> = match &self.store {
            Some(_) => unread(Table::Events).collect(),
            None => archived_event_days.clone(),
        };

        progress.stage("events and deliveries");
        let ctx = hot::Context {
            since,
            until,
            tenant,
            history: &history,
            archived_event_days: &unread_event_days,
            hot_attempts_from,
            replaying: &replaying,
            as_of,
            grace: self.settings.grace,
        };
        hot::run(&a, &b, &ctx, archived.sorted(), &mut findings, &|n| {
            progress.rows(n)
        })
        .await?;
        // Read-only: ending the sessions ends the snapshot.
        drop((a, b));

        let mut repairs = Vec::new();
        if request.repair {
            progress.stage("repair");
            repairs = repair::run(&self.platform, &self.settings, &mut findings).await?;
        }

        let (gaps, gaps_not_listed) = findings.gaps();
        let mut report = Report {
            format: FORMAT.into(),
            schema_version: SCHEMA_VERSION,
            software_version: env!("CARGO_PKG_VERSION").into(),
            generated_at: rfc3339(SystemTime::now()),
            parameters: Parameters {
                since: rfc3339(since),
                until: rfc3339(until),
                tenant: request.tenant.clone(),
                repair: request.repair,
                grace_seconds: self.settings.grace.as_secs(),
                as_of: rfc3339(as_of),
            },
            capture: ledger.capture,
            capture_coverage,
            schema_changes: ledger.schema_changes,
            funnel: findings.funnel.clone(),
            tenants: findings.tenant_funnels(),
            explained: findings.explained(),
            archive,
            gap_counts: findings.gap_counts.clone(),
            gaps,
            gaps_not_listed,
            repairs,
            clean: false,
            data_sha256: String::new(),
        };
        report.seal();
        Ok(report)
    }
}
