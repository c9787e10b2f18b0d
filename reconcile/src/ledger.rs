//! Capture's ledger against the events stored: per source and minute, the
//! events capture made (counted once per transaction, after they were
//! durable) and the events in `walhook.events`; and capture's incidents.
//!
//! The funnel's first stage is the source's own rows of the ledger
//! ([`SOURCE_RULE`]): each row change committed in the window, once. The
//! rules' rows (what each rule looked at, made and left out) go to the
//! per-rule table. A column change of a captured table is explained
//! (`schema_changed`, with the schema versions events carry from it on);
//! incidents that lose or withhold data stay gaps.

use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::time::SystemTime;

use walhook_pipeline::capture::ledger::SOURCE_RULE;
use walhook_pipeline::capture::{IncidentKind, schema_change_versions};
use walhook_pipeline::ids::Lsn;

use crate::ReconcileError;
use crate::findings::{Findings, gap};
use crate::report::{CaptureRow, Explanation, GapClass, SchemaChange, SchemaVersion};
use crate::window::rfc3339;

/// The first and last commit LSN of what a sum counted.
type LsnRange = (Option<Lsn>, Option<Lsn>);

/// Per (source, minute): events capture made, and the LSNs they spanned.
type Minutes = BTreeMap<(String, SystemTime), (i64, LsnRange)>;

/// What the ledger stage returns for the report.
#[derive(Debug, Default)]
pub struct Ledger {
    /// The ledger's rows per source and rule.
    pub capture: Vec<CaptureRow>,
    /// The column changes of captured tables.
    pub schema_changes: Vec<SchemaChange>,
}

/// Compares the ledger with the stored events over `[since, until)`; days in
/// `archived` are left to the archive stage.
pub async fn run(
    client: &tokio_postgres::Client,
    since: SystemTime,
    until: SystemTime,
    archived: &HashSet<chrono::NaiveDate>,
    findings: &mut Findings,
) -> Result<Ledger, ReconcileError> {
    // One read of the window's ledger rows (one per source, rule and
    // minute), summed here per rule for the report and per minute for the
    // comparison with the stored events.
    let rows = client
        .query(
            "SELECT source, rule, window_start, changes, events, filtered, incidents, \
                    first_commit_lsn::text, last_commit_lsn::text \
             FROM walhook.capture_ledger WHERE window_start >= $1 AND window_start < $2",
            &[&since, &until],
        )
        .await
        .map_err(ReconcileError::query("read capture's ledger"))?;
    let lsn = |text: String| Lsn::from_str(&text).ok();
    let widen = |range: &mut LsnRange, first: Option<Lsn>, last: Option<Lsn>| {
        range.0 = range.0.into_iter().chain(first).min();
        range.1 = range.1.into_iter().chain(last).max();
    };
    let mut by_rule: BTreeMap<(String, String), ([u64; 4], LsnRange)> = BTreeMap::new();
    let mut made: Minutes = BTreeMap::new();
    // Per (source, minute): the source's own count of changes, and the
    // most any one rule looked at (a lower bound for minutes a ledger
    // without source rows counted).
    let mut changes: BTreeMap<(String, SystemTime), (Option<u64>, u64)> = BTreeMap::new();
    for r in rows {
        let (source, rule, minute): (String, String, SystemTime) = (r.get(0), r.get(1), r.get(2));
        let counts = [3, 4, 5, 6].map(|i| r.get::<_, i64>(i).max(0) as u64);
        let (first, last) = (lsn(r.get(7)), lsn(r.get(8)));
        let once = changes.entry((source.clone(), minute)).or_default();
        if rule == SOURCE_RULE {
            once.0 = Some(once.0.unwrap_or(0) + counts[0]);
            continue;
        }
        once.1 = once.1.max(counts[0]);
        let (sums, range) = by_rule.entry((source.clone(), rule)).or_default();
        for (sum, n) in sums.iter_mut().zip(counts) {
            *sum += n;
        }
        widen(range, first, last);
        let (events, range) = made.entry((source, minute)).or_default();
        *events += counts[1] as i64;
        widen(range, first, last);
    }
    let text = |l: Option<Lsn>| l.map(|l| l.to_string());
    let capture: Vec<CaptureRow> = by_rule
        .into_iter()
        .map(|((source, rule), (sums, (first, last)))| CaptureRow {
            source,
            rule,
            changes: sums[0],
            events: sums[1],
            filtered: sums[2],
            incidents: sums[3],
            first_commit_lsn: text(first),
            last_commit_lsn: text(last),
        })
        .collect();
    findings.funnel.captured_changes = Some(
        changes
            .values()
            .map(|(source, most)| source.unwrap_or(*most))
            .sum(),
    );
    findings.funnel.captured_events = Some(capture.iter().map(|c| c.events).sum());
    findings.explain(
        Explanation::FilteredByRule,
        None,
        capture.iter().map(|c| c.filtered).sum(),
    );

    // Events are compared from the first commit each source's ledger
    // counted: older ones were made before the ledger existed.
    let stored = client
        .query(
            "WITH firsts AS (SELECT source, min(first_commit_lsn) AS lsn FROM walhook.capture_ledger GROUP BY 1) \
             SELECT e.source, date_trunc('minute', e.occurred_at), count(*), \
                    coalesce(e.commit_lsn >= f.lsn, false) \
             FROM walhook.events e LEFT JOIN firsts f ON f.source = e.source \
             WHERE e.occurred_at >= $1 AND e.occurred_at < $2 AND e.commit_lsn <> '0/0'::pg_lsn \
             GROUP BY 1, 2, 4",
            &[&since, &until],
        )
        .await
        .map_err(ReconcileError::query("count the stored events by minute"))?;
    let mut found: BTreeMap<(String, SystemTime), i64> = BTreeMap::new();
    for r in stored {
        let n: i64 = r.get(2);
        if r.get::<_, bool>(3) {
            found.insert((r.get(0), r.get(1)), n);
        } else {
            findings.explain(Explanation::BeforeLedger, None, n as u64);
        }
    }
    let day = |t: SystemTime| chrono::DateTime::<chrono::Utc>::from(t).date_naive();
    let keys: std::collections::BTreeSet<(String, SystemTime)> =
        made.keys().chain(found.keys()).cloned().collect();
    for key in keys {
        if archived.contains(&day(key.1)) {
            continue;
        }
        let (n_made, (first, last)) = made.get(&key).copied().unwrap_or_default();
        let n_found = found.get(&key).copied().unwrap_or(0);
        if n_made == n_found {
            continue;
        }
        let (source, minute) = &key;
        let subject = format!("{source}@{}", rfc3339(*minute));
        let lsns = match (first, last) {
            (Some(a), Some(b)) => format!(" (commit LSNs {a}..{b})"),
            _ => String::new(),
        };
        if n_made > n_found {
            findings.gap(gap(
                GapClass::MissingEvent,
                &subject,
                None,
                format!(
                    "capture made {n_made} event(s) of source {source:?} in the minute from {}{lsns}; \
                     {n_found} are stored",
                    rfc3339(*minute)
                ),
            ));
        } else {
            findings.gap(gap(
                GapClass::UnexpectedEvent,
                &subject,
                None,
                format!(
                    "{n_found} event(s) of source {source:?} are stored for the minute from {}; \
                     capture made {n_made}{lsns}",
                    rfc3339(*minute)
                ),
            ));
        }
    }

    let incidents = client
        .query(
            "SELECT id, source, kind, commit_lsn::text, rule, table_name, detail, seen_at \
             FROM walhook.capture_incidents WHERE seen_at >= $1 AND seen_at < $2 ORDER BY id",
            &[&since, &until],
        )
        .await
        .map_err(ReconcileError::query("read capture incidents"))?;
    let mut schema_changes = Vec::new();
    for r in incidents {
        let id: i64 = r.get(0);
        let source: String = r.get(1);
        let kind: String = r.get(2);
        let lsn: Option<String> = r.get(3);
        let rule: Option<String> = r.get(4);
        let table: Option<String> = r.get(5);
        let detail: String = r.get(6);
        if kind == IncidentKind::SchemaChange.as_str() {
            // Nothing is lost: the rows that follow are events of the new
            // shape.
            findings.explain(Explanation::SchemaChanged, None, 1);
            schema_changes.push(SchemaChange {
                source,
                table,
                commit_lsn: lsn,
                seen_at: rfc3339(r.get(7)),
                versions: schema_change_versions(&detail)
                    .into_iter()
                    .map(|(event_type, schema_version)| SchemaVersion {
                        event_type,
                        schema_version,
                    })
                    .collect(),
                detail,
            });
            continue;
        }
        findings.gap(gap(
            GapClass::CaptureIncident,
            &id.to_string(),
            None,
            format!(
                "{kind} in source {source:?}{}{}{}: {detail}",
                lsn.map(|l| format!(" at commit LSN {l}"))
                    .unwrap_or_default(),
                rule.map(|r| format!(", rule {r:?}")).unwrap_or_default(),
                table.map(|t| format!(", table {t}")).unwrap_or_default(),
            ),
        ));
    }
    // Events lost between capture and fan-out: records of the events topic
    // that the log's retention removed before a fan-out member read them
    // (the member stopped there; see `LogError::Gap`). Shown in every
    // window the incident was open in.
    let gaps = client
        .query(
            "SELECT id, subject, detail FROM walhook.incidents \
             WHERE stage = $1 AND kind = $2 AND first_seen < $4 \
               AND (resolved_at IS NULL OR resolved_at >= $3) ORDER BY id",
            &[
                &walhook_pipeline::incident::Stage::Fanout.as_str(),
                &walhook_pipeline::incident::IncidentKind::LogGap.as_str(),
                &since,
                &until,
            ],
        )
        .await
        .map_err(ReconcileError::query("read log gaps"))?;
    for r in gaps {
        let id: i64 = r.get(0);
        let subject: String = r.get(1);
        let detail: String = r.get(2);
        findings.gap(gap(
            GapClass::CaptureIncident,
            &format!("log-gap-{id}"),
            None,
            format!("log_gap on {subject}: {detail}"),
        ));
    }
    Ok(Ledger {
        capture,
        schema_changes,
    })
}
