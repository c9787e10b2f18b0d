//! A report as a few lines for a terminal (`walhook reconcile`'s text
//! format; the JSON and HTML formats are the report itself and [`crate::html`]).

use crate::report::{Funnel, Report};

/// The report as a few lines for a terminal.
pub fn summary(report: &Report) -> String {
    use std::fmt::Write;
    let p = &report.parameters;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "reconciliation of [{}, {}){} as of {}",
        p.since,
        p.until,
        p.tenant
            .as_ref()
            .map(|t| format!(" for tenant {t:?}"))
            .unwrap_or_default(),
        p.as_of
    );
    for (name, value) in funnel_lines(&report.funnel) {
        let _ = writeln!(s, "  {name:<28} {value:>12}");
    }
    for e in &report.explained {
        let _ = writeln!(
            s,
            "  explained: {:<30} {:>10}{}",
            serde_json::to_value(e.reason)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            e.count,
            e.tenant
                .as_ref()
                .map(|t| format!("  (tenant {t})"))
                .unwrap_or_default()
        );
    }
    for a in report.archive.iter().filter(|a| !a.verified) {
        let _ = writeln!(
            s,
            "  archive: {} {} g{} {}: {}",
            a.table,
            a.day,
            a.generation,
            a.state,
            a.problem.as_deref().unwrap_or("not verified")
        );
    }
    for (class, n) in &report.gap_counts {
        let _ = writeln!(s, "  GAPS {:<28} {n:>10}", class.as_str());
    }
    for g in report.gaps.iter().take(20) {
        let _ = writeln!(
            s,
            "    {}{}: {}",
            g.id,
            if g.repaired { " (repaired)" } else { "" },
            g.detail
        );
    }
    if report.gaps.len() > 20 || report.gaps_not_listed > 0 {
        let _ = writeln!(
            s,
            "    … {} more (see --format json or html)",
            report.gaps.len().saturating_sub(20) as u64 + report.gaps_not_listed
        );
    }
    for r in &report.repairs {
        let _ = writeln!(
            s,
            "  repaired {} {}: {}",
            r.repaired,
            r.class.as_str(),
            r.action
        );
    }
    let _ = writeln!(
        s,
        "{} (data sha256 {})",
        if report.clean {
            "CLEAN: every difference is explained".to_string()
        } else {
            format!("{} GAP(S) remain unexplained", report.open_gaps())
        },
        report.data_sha256
    );
    s
}

fn funnel_lines(f: &Funnel) -> Vec<(&'static str, u64)> {
    let mut out = Vec::new();
    if let Some(n) = f.captured_changes {
        out.push(("captured changes", n));
    }
    if let Some(n) = f.captured_events {
        out.push(("captured events", n));
    }
    out.extend([
        ("events", f.events),
        ("  of them archived", f.events_archived),
        ("expected deliveries", f.expected_deliveries),
        ("materialised deliveries", f.materialised_deliveries),
        ("attempted deliveries", f.attempted_deliveries),
        ("succeeded", f.succeeded),
        ("failed", f.failed),
        ("exhausted", f.exhausted),
        ("cancelled", f.cancelled),
        ("pending, due", f.pending_due),
        ("pending, scheduled", f.pending_scheduled),
        ("attempts counted", f.attempts_expected),
        ("attempts (hot table)", f.attempts_hot),
        ("deliveries archived", f.deliveries_archived),
        ("attempts archived", f.attempts_archived),
    ]);
    out
}
