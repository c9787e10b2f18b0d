//! `[reconcile]`: how `walhook run` reconciles rolling windows, and the
//! defaults `walhook reconcile` judges with.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use serde::Deserialize;

/// `[reconcile]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// How often `walhook run` reconciles; `0s` turns it off (then run
    /// `walhook reconcile` from cron).
    #[serde(with = "walhook_pipeline::duration")]
    pub every: Duration,
    /// The length of each scheduled window.
    #[serde(with = "walhook_pipeline::duration")]
    pub window: Duration,
    /// How long before now a scheduled window ends, so that work still in
    /// flight (fan-out catching up, a first attempt under way) is not
    /// taken for a gap.
    #[serde(with = "walhook_pipeline::duration")]
    pub settle: Duration,
    /// How long past its due time a pending delivery may wait before it
    /// counts as overdue.
    #[serde(with = "walhook_pipeline::duration")]
    pub grace: Duration,
    /// Whether scheduled runs repair what they can (re-drive missing
    /// deliveries, re-enqueue overdue ones).
    pub repair: bool,
    /// A folder where scheduled runs also write their HTML and JSON reports
    /// (relative paths are read from the config file's folder); none by
    /// default (reports are in the platform database and on the API).
    pub report_dir: Option<PathBuf>,
    /// How long a run waits for capture to show it is past the window's
    /// end (its next checkpoint after a heartbeat) before it reports the
    /// source as `capture_behind`.
    #[serde(with = "walhook_pipeline::duration")]
    pub capture_wait: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            every: Duration::from_secs(15 * 60),
            window: Duration::from_secs(3600),
            settle: Duration::from_secs(120),
            grace: Duration::from_secs(60),
            repair: false,
            report_dir: None,
            capture_wait: Duration::from_secs(30),
        }
    }
}

impl ReconcileConfig {
    /// Checks the values; the message names the field and the fix.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.window < Duration::from_secs(60) {
            bail!(
                "[reconcile] window = {:?} is shorter than a minute, the ledger's unit: use \"1m\" or more (default \"1h\")",
                self.window
            );
        }
        if !self.every.is_zero() && self.every < Duration::from_secs(10) {
            bail!(
                "[reconcile] every = {:?} is more often than every 10 seconds: use \"10s\" or more (default \"15m\"), or \"0s\" to turn scheduled runs off",
                self.every
            );
        }
        if self.grace.is_zero() {
            bail!(
                "[reconcile] grace = \"0s\" would call every delivery overdue the moment it is due: use a few seconds or more (default \"1m\")"
            );
        }
        Ok(())
    }

    /// The reconciler's settings: this section's grace and capture wait,
    /// `[source]`'s heartbeat and lag warning, `[retry]`'s deadline.
    pub fn settings(
        &self,
        source: &walhook_connectors::postgres::SourceConfig,
        deadline: Duration,
    ) -> walhook_reconcile::Settings {
        walhook_reconcile::Settings {
            grace: self.grace,
            deadline,
            capture: walhook_reconcile::coverage::Check {
                heartbeat: source.heartbeat_interval,
                caught_up_bytes: source.lag_warning_bytes,
                wait: self.capture_wait,
            },
        }
    }

    /// Reads a relative `report_dir` from `dir`.
    pub fn resolve_paths(&mut self, dir: &Path) {
        if let Some(p) = self.report_dir.as_mut()
            && p.is_relative()
        {
            *p = dir.join(&*p);
        }
    }
}
