//! The soak's report: the faults it injected, its verdict and readings in
//! `soak.json`, the sampled series as charts in `soak.svg` and in
//! `soak.html` with a table of the verdict and the faults, and the summary
//! printed at the end.

use serde::Serialize;

use crate::chaos::svg::{Series, small_multiples};

use super::sample::Sample;

/// A fault injected (or walhook found dead and restarted).
#[derive(Debug, Clone, Serialize)]
pub(super) struct Mark {
    pub(super) t: f64,
    pub(super) fault: String,
    pub(super) injected: String,
}

/// The whole soak's result.
#[derive(Debug, Serialize)]
pub(super) struct SoakReport {
    pub(super) length_seconds: f64,
    pub(super) rate_orders_per_sec: u32,
    pub(super) endpoints: usize,
    pub(super) orders_committed: u64,
    pub(super) webhooks_expected: u64,
    pub(super) lost: u64,
    pub(super) unexpected: u64,
    pub(super) unstable_ids: u64,
    pub(super) bad_signatures: u64,
    pub(super) duplicate_sends: u64,
    pub(super) attempts_after_unknown_outcome: i64,
    pub(super) walhook_restarts: u32,
    pub(super) drained_seconds: f64,
    pub(super) rss_mib_after_warmup: f64,
    pub(super) rss_mib_at_end: f64,
    pub(super) rss_drift: f64,
    pub(super) open_fds_after_warmup: u64,
    pub(super) open_fds_at_end: u64,
    pub(super) pg_sessions_after_warmup: i64,
    pub(super) pg_sessions_at_end: i64,
    pub(super) slot_lag_mib_max: f64,
    pub(super) queue_tables_mib_max: f64,
    pub(super) clean: bool,
    pub(super) faults: Vec<Mark>,
    pub(super) samples: Vec<Sample>,
}

/// The sampled series as charts.
fn charts(report: &SoakReport) -> String {
    let series = |title, unit, f: fn(&Sample) -> Option<f64>| Series {
        title,
        unit,
        points: report.samples.iter().map(|s| (s.t, f(s))).collect(),
    };
    let marks: Vec<(f64, String)> = report
        .faults
        .iter()
        .map(|m| (m.t, format!("{} ({})", m.fault, m.injected)))
        .collect();
    small_multiples(
        &[
            series("walhook RSS", "MiB", |s| s.rss_mib),
            series("walhook open descriptors", "", |s| {
                s.open_fds.map(|v| v as f64)
            }),
            series("Postgres sessions (walhook)", "", |s| {
                s.pg_sessions.map(|v| v as f64)
            }),
            series("slot lag", "MiB", |s| s.slot_lag_mib),
            series("queue tables (pending, fanouts)", "MiB", |s| {
                s.queue_tables_mib
            }),
            series(
                "history tables (events, deliveries, attempts)",
                "MiB",
                |s| s.history_tables_mib,
            ),
            series("requests answered", "/s", |s| Some(s.requests_per_sec)),
        ],
        &marks,
        report.length_seconds,
    )
}

/// Writes `soak.json`, `soak.svg` and `soak.html` into `dir`.
pub(super) fn write_report(dir: &std::path::Path, report: &SoakReport) -> anyhow::Result<()> {
    let svg = charts(report);
    std::fs::write(dir.join("soak.json"), serde_json::to_vec_pretty(report)?)?;
    std::fs::write(dir.join("soak.svg"), &svg)?;
    let row = |name: &str, value: String| {
        format!("<tr><th scope=\"row\">{name}</th><td>{value}</td></tr>")
    };
    let rows = [
        row("length", format!("{:.0} min", report.length_seconds / 60.0)),
        row(
            "rate",
            format!(
                "{} orders/s ({} endpoints)",
                report.rate_orders_per_sec, report.endpoints
            ),
        ),
        row("orders committed", report.orders_committed.to_string()),
        row("webhooks expected", report.webhooks_expected.to_string()),
        row("lost", report.lost.to_string()),
        row("unexpected", report.unexpected.to_string()),
        row("unstable ids", report.unstable_ids.to_string()),
        row("bad signatures", report.bad_signatures.to_string()),
        row(
            "duplicate sends",
            format!(
                "{} (attempts noted previous_outcome_unknown: {})",
                report.duplicate_sends, report.attempts_after_unknown_outcome
            ),
        ),
        row("walhook restarts", report.walhook_restarts.to_string()),
        row(
            "RSS after warm-up → at end",
            format!(
                "{:.1} → {:.1} MiB (drift {:+.1} %)",
                report.rss_mib_after_warmup,
                report.rss_mib_at_end,
                report.rss_drift * 100.0
            ),
        ),
        row(
            "open descriptors after warm-up → at end (medians)",
            format!(
                "{} → {}",
                report.open_fds_after_warmup, report.open_fds_at_end
            ),
        ),
        row(
            "Postgres sessions after warm-up → at end (medians)",
            format!(
                "{} → {}",
                report.pg_sessions_after_warmup, report.pg_sessions_at_end
            ),
        ),
        row(
            "slot lag, largest",
            format!("{:.1} MiB", report.slot_lag_mib_max),
        ),
        row(
            "backlog drained after the writes",
            format!("{:.1} s", report.drained_seconds),
        ),
        row(
            "verdict",
            if report.clean {
                "clean".into()
            } else {
                "NOT CLEAN".into()
            },
        ),
    ];
    let faults: String = report
        .faults
        .iter()
        .map(|m| {
            format!(
                "<tr><td>{:.0} s</td><td>{}</td><td>{}</td></tr>",
                m.t,
                html_escape(&m.fault),
                html_escape(&m.injected)
            )
        })
        .collect();
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>walhook soak</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:62em}}table{{border-collapse:collapse}}\
         th,td{{text-align:left;padding:2px 10px;border-bottom:1px solid #ddd}}</style></head><body>\
         <h1>walhook soak</h1><table>{}</table><h2>Samples</h2>\
         <p>Dashed red lines: faults (hover for what was done).</p>{svg}\
         <h2>Faults</h2><table><tr><th>at</th><th>fault</th><th>what was done</th></tr>{faults}</table></body></html>",
        rows.concat()
    );
    std::fs::write(dir.join("soak.html"), html)?;
    Ok(())
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Prints the verdict and the readings, and where the report is.
pub(super) fn print_summary(r: &SoakReport, dir: &std::path::Path) {
    println!(
        "\n  {} orders, {} webhooks expected: lost {}, unexpected {}, unstable ids {}, bad signatures {}, duplicate sends {} (unknown outcomes noted {})",
        r.orders_committed,
        r.webhooks_expected,
        r.lost,
        r.unexpected,
        r.unstable_ids,
        r.bad_signatures,
        r.duplicate_sends,
        r.attempts_after_unknown_outcome
    );
    println!(
        "  RSS {:.1} → {:.1} MiB ({:+.1} %), descriptors {} → {}, Postgres sessions {} → {}, slot lag ≤ {:.1} MiB, drained {:.1} s after the writes, walhook restarts {}, faults {}",
        r.rss_mib_after_warmup,
        r.rss_mib_at_end,
        r.rss_drift * 100.0,
        r.open_fds_after_warmup,
        r.open_fds_at_end,
        r.pg_sessions_after_warmup,
        r.pg_sessions_at_end,
        r.slot_lag_mib_max,
        r.drained_seconds,
        r.walhook_restarts,
        r.faults.len()
    );
    println!(
        "  report: {}  {}",
        dir.join("soak.html").display(),
        if r.clean { "clean" } else { "NOT CLEAN" }
    );
}
