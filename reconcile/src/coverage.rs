//! Whether capture had confirmed each source's WAL past the window's end:
//! without it, changes committed in the window may still be uncaptured,
//! and a funnel that starts at capture's ledger would not show them.
//!
//! ```text
//!  source WAL ──slot──▶ capture ──▶ ledger (per commit minute; the mark: last commit counted)
//!                          └──────▶ checkpoint (confirmed LSN, slot lag at the last heartbeat, saved at)
//! ```
//!
//! A source is confirmed through `t` (the window's end, or the run's start
//! for a window that ends later) when either holds:
//!
//! - the ledger counted a commit of a minute at or after `t`: commits
//!   reach capture in WAL order, so every earlier one was counted too;
//! - capture saved its position at least one heartbeat interval after
//!   `t`, with the slot's lag then at most `caught_up_bytes`: the
//!   heartbeat it measured at was emitted after `t`, and the slot had
//!   confirmed the WAL up to it. An idle source is confirmed this way
//!   (capture's heartbeats move the slot and the checkpoint).
//!
//! Otherwise the window gets a `capture_behind` gap naming the source, the
//! slot's lag and the last commit captured. A run whose window reaches the
//! present first waits (up to [`Check::wait`]) for capture's next
//! checkpoint, so a live capture is not reported behind for the seconds it
//! has not yet had.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::ReconcileError;
use crate::findings::{Findings, gap};
use crate::report::{GapClass, SourceCoverage};
use crate::window::rfc3339;

/// How coverage is judged (from `[source]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// How often capture emits a heartbeat (`[source] heartbeat_interval`):
    /// a checkpoint saved this long after `t` was measured after `t`.
    pub heartbeat: Duration,
    /// The slot lag, in bytes, at or under which capture counts as caught
    /// up (`[source] lag_warning_bytes`).
    pub caught_up_bytes: u64,
    /// How long a run waits for capture's checkpoints to pass `t` before it
    /// reads the window.
    pub wait: Duration,
}

impl Default for Check {
    fn default() -> Self {
        Check {
            heartbeat: Duration::from_secs(10),
            caught_up_bytes: 1 << 30,
            wait: Duration::from_secs(30),
        }
    }
}

/// Time a checkpoint is saved after the heartbeat it measured at, at most
/// (the checkpoint writer saves twice a second).
const SAVE_SLACK: Duration = Duration::from_secs(1);

/// One source's position as the platform database records it.
struct Position {
    confirmed_lsn: Option<String>,
    lag: Option<i64>,
    saved_at: Option<SystemTime>,
    last_commit_lsn: Option<String>,
    last_minute: Option<SystemTime>,
}

const POSITIONS_SQL: &str = "\
WITH sources AS (SELECT source FROM walhook.capture_checkpoints \
                 UNION SELECT source FROM walhook.capture_ledger_marks) \
SELECT s.source, c.confirmed_lsn::text, c.slot_lag_bytes, c.updated_at, \
       nullif(m.commit_lsn, '0/0'::pg_lsn)::text, \
       (SELECT max(l.window_start) FROM walhook.capture_ledger l WHERE l.source = s.source) \
FROM sources s \
LEFT JOIN walhook.capture_checkpoints c ON c.source = s.source \
LEFT JOIN walhook.capture_ledger_marks m ON m.source = s.source \
ORDER BY 1";

async fn positions(
    client: &tokio_postgres::Client,
) -> Result<BTreeMap<String, Position>, ReconcileError> {
    Ok(client
        .query(POSITIONS_SQL, &[])
        .await
        .map_err(ReconcileError::query("read capture's positions"))?
        .iter()
        .map(|r| {
            (
                r.get(0),
                Position {
                    confirmed_lsn: r.get(1),
                    lag: r.get(2),
                    saved_at: r.get(3),
                    last_commit_lsn: r.get(4),
                    last_minute: r.get(5),
                },
            )
        })
        .collect())
}

impl Check {
    /// Whether `p` shows capture past `t`, and how that is known.
    fn judge(&self, p: &Position, t: SystemTime) -> (bool, String) {
        if let Some(minute) = p.last_minute.filter(|m| *m >= t) {
            return (
                true,
                format!(
                    "capture counted a commit of the minute from {}",
                    rfc3339(minute)
                ),
            );
        }
        let measured_after = p
            .saved_at
            .is_some_and(|at| at >= t + self.heartbeat + SAVE_SLACK);
        let caught_up = p
            .lag
            .is_some_and(|l| l >= 0 && l as u64 <= self.caught_up_bytes);
        match (measured_after, caught_up) {
            (true, true) => (
                true,
                format!(
                    "capture saved its position at {} with the slot {} byte(s) behind",
                    p.saved_at.map(rfc3339).unwrap_or_default(),
                    p.lag.unwrap_or(0)
                ),
            ),
            (true, false) => (
                false,
                format!(
                    "capture's slot was {} byte(s) behind at its last checkpoint ({}), over the {} byte(s) counted as caught up",
                    p.lag
                        .map_or("an unknown number of".into(), |l| l.to_string()),
                    p.saved_at.map(rfc3339).unwrap_or_default(),
                    self.caught_up_bytes
                ),
            ),
            (false, _) => (
                false,
                match p.saved_at {
                    Some(at) => format!(
                        "capture last saved its position at {}, before the window's end was confirmed \
                         (is capture running, and keeping up?)",
                        rfc3339(at)
                    ),
                    None => "capture has saved no position".into(),
                },
            ),
        }
    }

    /// Waits (up to [`Check::wait`]) until every source's records show
    /// capture past `t`; returns early when they do. A capture that is
    /// stopped or behind makes this wait its whole bound, then the run
    /// reports it.
    pub async fn wait_for(
        &self,
        client: &tokio_postgres::Client,
        t: SystemTime,
    ) -> Result<(), ReconcileError> {
        let deadline = tokio::time::Instant::now() + self.wait;
        loop {
            let all = positions(client).await?;
            if all.values().all(|p| self.judge(p, t).0) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Judges every source at `t`, recording a `capture_behind` gap for
    /// each one capture had not confirmed past it.
    pub async fn run(
        &self,
        client: &tokio_postgres::Client,
        t: SystemTime,
        findings: &mut Findings,
    ) -> Result<Vec<SourceCoverage>, ReconcileError> {
        let mut out = Vec::new();
        for (source, p) in positions(client).await? {
            let (confirmed, evidence) = self.judge(&p, t);
            let last_commit = match (&p.last_commit_lsn, p.last_minute) {
                (Some(lsn), Some(minute)) => {
                    format!("commit LSN {lsn}, in the minute from {}", rfc3339(minute))
                }
                (Some(lsn), None) => format!("commit LSN {lsn}"),
                _ => "none".into(),
            };
            if !confirmed {
                findings.gap(gap(
                    GapClass::CaptureBehind,
                    &source,
                    None,
                    format!(
                        "capture of source {source:?} had not confirmed its WAL past {}: {evidence}. \
                         Slot lag {} byte(s) (confirmed LSN {}); last commit captured: {last_commit}. \
                         Changes committed in the window may not be counted yet; \
                         reconcile the window again once capture has caught up",
                        rfc3339(t),
                        p.lag.map_or("unknown".into(), |l| l.to_string()),
                        p.confirmed_lsn.as_deref().unwrap_or("none"),
                    ),
                ));
            }
            out.push(SourceCoverage {
                source,
                through: rfc3339(t),
                confirmed,
                evidence,
                confirmed_lsn: p.confirmed_lsn,
                slot_lag_bytes: p.lag,
                checkpoint_at: p.saved_at.map(rfc3339),
                last_commit_lsn: p.last_commit_lsn,
                last_commit_minute: p.last_minute.map(rfc3339),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn position(saved: Option<u64>, lag: Option<i64>, minute: Option<u64>) -> Position {
        Position {
            confirmed_lsn: Some("0/10".into()),
            lag,
            saved_at: saved.map(at),
            last_commit_lsn: Some("0/8".into()),
            last_minute: minute.map(at),
        }
    }

    #[test]
    fn capture_is_past_t_by_a_later_commit_or_a_caught_up_checkpoint_after_a_heartbeat() {
        let check = Check {
            heartbeat: Duration::from_secs(1),
            caught_up_bytes: 1000,
            wait: Duration::ZERO,
        };
        let t = at(6000);
        // A commit of the minute at t was counted.
        assert!(check.judge(&position(None, None, Some(6000)), t).0);
        // The last commit is older; the checkpoint after t + heartbeat is
        // caught up.
        assert!(
            check
                .judge(&position(Some(6002), Some(999), Some(5940)), t)
                .0
        );
        // Saved too soon after t: its lag may have been measured before t.
        assert!(!check.judge(&position(Some(6001), Some(0), Some(5940)), t).0);
        // Saved late, but far behind.
        let (ok, why) = check.judge(&position(Some(6100), Some(5000), Some(5940)), t);
        assert!(!ok);
        assert!(why.contains("5000 byte(s) behind"), "{why}");
        // Nothing saved at all.
        assert!(!check.judge(&position(None, None, None), t).0);
    }
}
