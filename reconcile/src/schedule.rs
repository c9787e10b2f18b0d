//! `walhook run`'s reconcile schedule, and how a finished run is kept.
//!
//! Every `every` (the first after at most 15 minutes) the rolling window of
//! length `window` that ended `settle` ago is reconciled; each run is
//! stored in the platform database (GET /v1/reconciliations, the
//! `walhook_reconcile_*` metrics) and, with a report directory, written
//! there as JSON and HTML. Gaps are logged as errors; a failed or panicking
//! run is logged and the next one runs.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use walhook_pipeline::objstore::ObjectStore;
use walhook_pipeline::supervise::error_chain;
use walhook_sql::Platform;

use crate::reconciler::Silent;
use crate::{Reconciler, Report, Request, Settings, Window};

/// The first run waits at most this long after start.
pub const FIRST_RUN_AFTER: Duration = Duration::from_secs(15 * 60);

/// What the schedule runs (`[reconcile]`).
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Time between runs.
    pub every: Duration,
    /// The length of the window each run reconciles.
    pub window: Duration,
    /// How long before now the window ends (work in flight settles).
    pub settle: Duration,
    /// Repair what can be repaired.
    pub repair: bool,
    /// Where each run's JSON and HTML reports are written, if anywhere.
    pub report_dir: Option<PathBuf>,
    /// The reconciler's settings.
    pub settings: Settings,
}

/// Why a finished run could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum KeepError {
    /// The report did not encode as JSON.
    #[error("could not encode the report")]
    Encode(#[from] serde_json::Error),
    /// The platform database refused it.
    #[error("could not store the reconciliation in the platform database")]
    Store(#[source] walhook_sql::StoreError),
    /// The report directory could not be created.
    #[error("[reconcile] report_dir {}: cannot create it", path.display())]
    ReportDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A report file could not be written.
    #[error("{}: cannot write the report there", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Stores a finished run of `request` (trigger `command` or `scheduled`,
/// begun at `started`); returns its id.
pub async fn store_run(
    platform: &Platform,
    request: &Request,
    report: &Report,
    trigger: &str,
    started: SystemTime,
) -> Result<i64, KeepError> {
    platform
        .save_reconciliation(&walhook_sql::reconcile::NewReconciliation {
            trigger,
            since: request.window.since,
            until: request.window.until,
            tenant_id: request.tenant.as_deref(),
            repair: request.repair,
            clean: report.clean,
            open_gaps: report.open_gaps() as i64,
            repaired: report.repaired_count() as i64,
            gap_counts: serde_json::to_value(&report.gap_counts)?,
            data_sha256: &report.data_sha256,
            report: serde_json::to_value(report)?,
            started_at: started,
        })
        .await
        .map_err(KeepError::Store)
}

/// Writes a run's reports into `dir` (`reconcile-<since>.json` and
/// `.html`), creating it.
pub fn write_reports(dir: &Path, report: &Report) -> Result<(), KeepError> {
    let write = |path: PathBuf, body: String| {
        std::fs::write(&path, body).map_err(|source| KeepError::Write { path, source })
    };
    std::fs::create_dir_all(dir).map_err(|source| KeepError::ReportDir {
        path: dir.to_owned(),
        source,
    })?;
    let stem = format!(
        "reconcile-{}",
        report.parameters.since.replace([':', '-'], "")
    );
    write(
        dir.join(format!("{stem}.json")),
        serde_json::to_string_pretty(report)? + "\n",
    )?;
    write(
        dir.join(format!("{stem}.html")),
        crate::html::render(report),
    )
}

/// Runs the schedule until `shutdown` resolves; `open` opens the archive
/// store for each run (without it a run reconciles the hot tables only,
/// and says so).
#[allow(clippy::disallowed_methods)] // bare spawn: each run in a task of its own so that a panic is logged; the schedule awaits it
pub async fn run_every<S, O, F>(
    schedule: Schedule,
    platform: Platform,
    open: O,
    shutdown: impl Future<Output = ()>,
) where
    S: ObjectStore,
    O: Fn() -> F,
    F: Future<Output = Result<S, String>>,
{
    let mut wait = schedule.every.min(FIRST_RUN_AFTER);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = schedule.every;
        let store = match open().await {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(
                    error = %e,
                    "cannot open the archive store; reconciling without reading archived days"
                );
                None
            }
        };
        let request = Request {
            window: Window::rolling(SystemTime::now(), schedule.window, schedule.settle),
            tenant: None,
            repair: schedule.repair,
        };
        let reconciler = Reconciler::new(platform.clone(), store, schedule.settings.clone());
        let (report_dir, run_platform) = (schedule.report_dir.clone(), platform.clone());
        let run = tokio::spawn(async move {
            let started = SystemTime::now();
            let report = reconciler
                .run(&request, &Silent)
                .await
                .map_err(|e| error_chain(&e))?;
            let id = store_run(&run_platform, &request, &report, "scheduled", started)
                .await
                .map_err(|e| error_chain(&e))?;
            if let Some(dir) = &report_dir {
                write_reports(dir, &report).map_err(|e| error_chain(&e))?;
            }
            Ok::<_, String>((id, report))
        });
        match run.await {
            Ok(Ok((id, report))) if report.clean => tracing::info!(
                reconciliation = id,
                since = %report.parameters.since,
                until = %report.parameters.until,
                events = report.funnel.events,
                deliveries = report.funnel.materialised_deliveries,
                repaired = report.repaired_count(),
                "reconciled: clean"
            ),
            Ok(Ok((id, report))) => tracing::error!(
                reconciliation = id,
                since = %report.parameters.since,
                until = %report.parameters.until,
                gaps = report.open_gaps(),
                classes = %serde_json::to_string(&report.gap_counts).unwrap_or_default(),
                "reconciliation found gaps; see GET /v1/reconciliations/{id}"
            ),
            Ok(Err(e)) => tracing::error!(
                error = %e,
                "the reconciliation failed; trying again at the next run"
            ),
            Err(e) => tracing::error!(
                error = %e,
                "the reconciliation panicked; trying again at the next run"
            ),
        }
    }
}
