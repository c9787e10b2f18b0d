//! The capture sections: whether capture was past the window's end for
//! each source, the column changes of captured tables, and the ledger per
//! source and rule.

use std::fmt::{self, Write};

use super::{Esc, Opt, num_cell, problem, section, table_head, yes_no};
use crate::report::Report;

/// Per source: whether capture had confirmed its WAL past the window's end.
pub(super) fn coverage(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "coverage")?;
    out.push_str(
        "<p class=\"note\">Whether capture had confirmed each source's WAL past the window's \
         end: until it has, changes committed in the window may be counted nowhere.</p>\n",
    );
    if report.capture_coverage.is_empty() {
        out.push_str("<p>No capture source has recorded a position.</p>\n</section>\n");
        return Ok(());
    }
    let columns = [
        "Source",
        "Through",
        "Confirmed",
        "Slot lag (bytes)",
        "Confirmed LSN",
        "Last commit captured",
        "Evidence",
    ];
    table_head(out, "coverage", &columns)?;
    for c in &report.capture_coverage {
        writeln!(
            out,
            "<tr{}><th scope=\"row\">{}</th><td>{}</td><td>{}</td><td class=\"num\">{}</td>\
             <td class=\"id\">{}</td><td class=\"id\">{} {}</td><td>{}</td></tr>",
            problem(!c.confirmed),
            Esc(&c.source),
            Esc(&c.through),
            yes_no(c.confirmed),
            c.slot_lag_bytes.map_or("–".into(), |l| l.to_string()),
            Opt(&c.confirmed_lsn),
            Opt(&c.last_commit_lsn),
            Opt(&c.last_commit_minute),
            Esc(&c.evidence),
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

/// The column changes of captured tables, with their new schema versions.
pub(super) fn schema_changes(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "schema-changes")?;
    if report.schema_changes.is_empty() {
        out.push_str("<p>No captured table changed its columns in this window.</p>\n</section>\n");
        return Ok(());
    }
    out.push_str(
        "<p class=\"note\">Explained, not gaps: the rows that followed each change became \
         events of the schema version named.</p>\n",
    );
    let columns = [
        "Source",
        "Table",
        "Commit LSN",
        "Seen at",
        "New schema versions",
        "Columns",
    ];
    table_head(out, "schema-changes", &columns)?;
    for c in &report.schema_changes {
        let versions: Vec<String> = c
            .versions
            .iter()
            .map(|v| format!("{} v{}", v.event_type, v.schema_version))
            .collect();
        writeln!(
            out,
            "<tr><th scope=\"row\">{}</th><td>{}</td><td class=\"id\">{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            Esc(&c.source),
            Opt(&c.table),
            Opt(&c.commit_lsn),
            Esc(&c.seen_at),
            Esc(&versions.join(", ")),
            Esc(&c.detail),
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

/// Capture's ledger per source and rule.
pub(super) fn capture(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "capture")?;
    out.push_str(
        "<p class=\"note\">What each rule of each source looked at, made and left out over the window (a change two rules look at is in both rows; the funnel counts it once).</p>\n",
    );
    if report.capture.is_empty() {
        out.push_str("<p>Capture's ledger has no row for this window.</p>\n</section>\n");
        return Ok(());
    }
    let columns = [
        "Source",
        "Rule",
        "#Changes",
        "#Events",
        "#Filtered",
        "#Incidents",
        "First commit LSN",
        "Last commit LSN",
    ];
    table_head(out, "capture", &columns)?;
    for row in &report.capture {
        write!(
            out,
            "<tr{}><th scope=\"row\">{}</th><td>{}</td>",
            problem(row.incidents > 0),
            Esc(&row.source),
            Esc(&row.rule)
        )?;
        for value in [row.changes, row.events, row.filtered, row.incidents] {
            num_cell(out, value)?;
        }
        writeln!(
            out,
            "<td class=\"id\">{}</td><td class=\"id\">{}</td></tr>",
            Opt(&row.first_commit_lsn),
            Opt(&row.last_commit_lsn)
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}
