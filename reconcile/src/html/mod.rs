//! The auditor's HTML page of a [`Report`]: one self-contained file that
//! reads on screen and printed on A4, with no terminal and no network.
//!
//! ```text
//!  header     verdict (CLEAN / N open gaps) · window · parameters ·
//!             software and schema versions · data SHA-256
//!  gaps       counts by class, each with its legend sentence
//!  funnel     inline SVG, one bar per stage, scaled to the largest
//!  tenants    the funnel per tenant, with the total
//!  explained  differences that are not gaps, each reason in a sentence
//!  gap list   · repairs · archive days · capture ledger
//! ```
//!
//! The page has no script and loads nothing: its Content-Security-Policy
//! allows inline styles and `data:` images only, so a value that escaped its
//! escaping could still not run. Every value of the report goes through
//! [`Esc`]: tenant ids, rule names, ids and details come from customers'
//! data and are hostile.

use std::fmt::{self, Display, Write};

mod capture;
mod chart;
mod legend;

use crate::report::{Funnel, GapClass, MAX_LISTED_GAPS, Report};
use capture::{capture, coverage, schema_changes};
use chart::funnel_chart;
use legend::{Prose, class_label, class_legend, explanation_label, explanation_sentence};

/// The page's style: light, print-friendly (A4), numbers in tabular figures.
const STYLE: &str = include_str!("style.css");

/// The report as one self-contained HTML page.
pub fn render(report: &Report) -> String {
    let mut out = String::with_capacity(32 * 1024);
    page(&mut out, report, Audience::Operator).expect("writing to a String does not fail");
    out
}

/// The page of a tenant's view ([`crate::tenant_view::for_tenant`]): the
/// sections about no tenant in particular (archived days, capture's
/// coverage, schema changes, capture's ledger: [`Audience::Operator`] in
/// [`SECTIONS`]), which the view empties, are left out, and the contents list only the sections drawn.
pub fn render_tenant_view(view: &Report) -> String {
    let mut out = String::with_capacity(32 * 1024);
    page(&mut out, view, Audience::Tenant).expect("writing to a String does not fail");
    out
}

/// Who a page, or a section of it, is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Audience {
    /// Every section: an operator's page; for a section, the operator's
    /// page only (it is about capture or the archive as a whole, which no
    /// tenant owns).
    Operator,
    /// A tenant's view; for a section, every page.
    Tenant,
}

/// Text escaped for HTML content and double- or single-quoted attributes.
pub(super) struct Esc<'a>(&'a str);

impl Display for Esc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        while let Some(at) = rest.find(['&', '<', '>', '"', '\'']) {
            f.write_str(&rest[..at])?;
            f.write_str(match rest.as_bytes()[at] {
                b'&' => "&amp;",
                b'<' => "&lt;",
                b'>' => "&gt;",
                b'"' => "&quot;",
                _ => "&#39;",
            })?;
            rest = &rest[at + 1..];
        }
        f.write_str(rest)
    }
}

/// A count with thousands separators: `12,480`.
pub(super) struct Num(u64);

impl Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                f.write_char(',')?;
            }
            f.write_char(digit)?;
        }
        Ok(())
    }
}

/// An optional value, or a dash that says there is none.
pub(super) struct Opt<'a>(pub(super) &'a Option<String>);

impl Display for Opt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(value) => Esc(value).fmt(f),
            None => f.write_str("—"),
        }
    }
}

pub(super) fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

fn page(out: &mut String, report: &Report, audience: Audience) -> fmt::Result {
    let p = &report.parameters;
    writeln!(
        out,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; img-src data:\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>walhook reconciliation {} to {}</title>\n<style>{STYLE}</style>\n</head>\n\
         <body>\n<main>",
        Esc(&p.since),
        Esc(&p.until)
    )?;
    header(out, report)?;
    // One list drives the contents and the body: a section is listed
    // exactly when it is drawn.
    let drawn: Vec<&Section> = SECTIONS
        .iter()
        .filter(|s| audience == Audience::Operator || s.audience == Audience::Tenant)
        .collect();
    out.push_str("<nav aria-label=\"Contents\"><ol>");
    for s in &drawn {
        write!(out, "<li><a href=\"#{}\">{}</a></li>", s.id, s.title)?;
    }
    out.push_str("</ol></nav>\n");
    for s in &drawn {
        (s.draw)(out, report)?;
    }
    out.push_str("</main>\n</body>\n</html>\n");
    Ok(())
}

/// A section after the header.
struct Section {
    id: &'static str,
    title: &'static str,
    /// The least page it is drawn on.
    audience: Audience,
    draw: fn(&mut String, &Report) -> fmt::Result,
}

const fn sec(
    id: &'static str,
    title: &'static str,
    audience: Audience,
    draw: fn(&mut String, &Report) -> fmt::Result,
) -> Section {
    Section {
        id,
        title,
        audience,
        draw,
    }
}

/// The sections after the header, in page order.
const SECTIONS: [Section; 10] = [
    sec(
        "gap-classes",
        "Gaps by class",
        Audience::Tenant,
        gap_classes,
    ),
    sec("funnel-section", "Funnel", Audience::Tenant, funnel_chart),
    sec("tenants", "Funnel per tenant", Audience::Tenant, tenants),
    sec(
        "explained",
        "Explained differences",
        Audience::Tenant,
        explained,
    ),
    sec("gaps", "Gap list", Audience::Tenant, gap_list),
    sec("repairs", "Repairs", Audience::Tenant, repairs),
    sec(
        "archive",
        "Archive days checked",
        Audience::Operator,
        archive,
    ),
    sec(
        "coverage",
        "Capture's progress",
        Audience::Operator,
        coverage,
    ),
    sec(
        "schema-changes",
        "Schema changes",
        Audience::Operator,
        schema_changes,
    ),
    sec(
        "capture",
        "Capture ledger per rule",
        Audience::Operator,
        capture,
    ),
];

/// Opens section `id` of [`SECTIONS`] with its heading.
pub(super) fn section(out: &mut String, id: &str) -> fmt::Result {
    let title = SECTIONS.iter().find(|s| s.id == id).map_or(id, |s| s.title);
    writeln!(
        out,
        "<section aria-labelledby=\"{id}\">\n<h2 id=\"{id}\">{title}</h2>"
    )
}

/// A table's opening and header row; a column named `#…` holds numbers.
pub(super) fn table_head(out: &mut String, class: &str, columns: &[&str]) -> fmt::Result {
    write!(out, "<table class=\"{class}\"><thead><tr>")?;
    for column in columns {
        match column.strip_prefix('#') {
            Some(name) => write!(out, "<th scope=\"col\" class=\"n\">{name}</th>")?,
            None => write!(out, "<th scope=\"col\">{column}</th>")?,
        }
    }
    out.push_str("</tr></thead><tbody>\n");
    Ok(())
}

/// The attribute that marks a row needing attention.
pub(super) fn problem(flag: bool) -> &'static str {
    if flag { " class=\"problem\"" } else { "" }
}

/// A number cell, greyed when zero.
pub(super) fn num_cell(out: &mut String, value: u64) -> fmt::Result {
    let zero = if value == 0 { " zero" } else { "" };
    write!(out, "<td class=\"n{zero}\">{}</td>", Num(value))
}

fn header(out: &mut String, report: &Report) -> fmt::Result {
    let p = &report.parameters;
    writeln!(
        out,
        "<header>\n<p class=\"eyebrow\">walhook reconciliation report</p>\n\
         <h1>{} to {}</h1>",
        Esc(&p.since),
        Esc(&p.until)
    )?;
    let (open, repaired) = (report.open_gaps(), report.repaired_count());
    if report.clean {
        let sentence = if repaired > 0 {
            format!(
                "Every difference between the stages of this window is explained, and the {} \
                 gap(s) found were repaired by this run.",
                Num(repaired)
            )
        } else {
            "No gap was found: every difference between the stages of this window is explained."
                .to_owned()
        };
        writeln!(
            out,
            "<div class=\"verdict clean\" role=\"status\"><p class=\"badge\" id=\"verdict\">\
             CLEAN</p><p>{sentence}</p></div>"
        )?;
    } else {
        let (gaps, are) = if open == 1 {
            ("gap", "is")
        } else {
            ("gaps", "are")
        };
        writeln!(
            out,
            "<div class=\"verdict open\" role=\"status\"><p class=\"badge\" id=\"verdict\">\
             {n} open {gaps}</p><p>{n} {gaps} found in this window {are} neither explained nor \
             repaired. The <a href=\"#gaps\">gap list</a> names each one; the \
             <a href=\"#gap-classes\">legend</a> says what to do.</p></div>",
            n = Num(open),
        )?;
    }
    let tenant = match &p.tenant {
        Some(tenant) => format!("<span class=\"tenant\">{}</span>", Esc(tenant)),
        None => "every tenant".to_owned(),
    };
    let repair = if p.repair {
        "yes: gaps of repairable classes were fixed (see <a href=\"#repairs\">Repairs</a>)"
    } else {
        "no: this run changed nothing"
    };
    writeln!(
        out,
        "<table class=\"meta\"><caption>What was reconciled, by what, and the fingerprint of \
         the result.</caption><tbody>\n\
         <tr><th scope=\"row\">Window since (inclusive)</th><td><code>{since}</code></td></tr>\n\
         <tr><th scope=\"row\">Window until (exclusive)</th><td><code>{until}</code></td></tr>\n\
         <tr><th scope=\"row\">State read as of</th><td><code>{as_of}</code> (\"due\" and \
         \"overdue\" are judged at this time)</td></tr>\n\
         <tr><th scope=\"row\">Tenant</th><td>{tenant}</td></tr>\n\
         <tr><th scope=\"row\">Repair</th><td>{repair}</td></tr>\n\
         <tr><th scope=\"row\">Grace for pending deliveries</th><td>{grace} seconds</td></tr>\n\
         <tr><th scope=\"row\">Software</th><td>walhook <code>{software}</code></td></tr>\n\
         <tr><th scope=\"row\">Report format</th><td><code>{format}</code>, schema version \
         {schema}</td></tr>\n\
         <tr><th scope=\"row\">Generated at</th><td><code>{generated}</code></td></tr>\n\
         <tr><th scope=\"row\">Data SHA-256</th><td><code class=\"hash\">{hash}</code><br>\
         <span class=\"note\">The SHA-256 of the report's data in canonical JSON, without \
         the time it was generated: two runs over the same window and the same data give the \
         same hash, whenever they run.</span></td></tr>\n\
         </tbody></table>\n</header>",
        since = Esc(&p.since),
        until = Esc(&p.until),
        as_of = Esc(&p.as_of),
        grace = Num(p.grace_seconds),
        software = Esc(&report.software_version),
        format = Esc(&report.format),
        schema = report.schema_version,
        generated = Esc(&report.generated_at),
        hash = Esc(&report.data_sha256),
    )
}

fn gap_classes(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "gap-classes")?;
    out.push_str(
        "<p class=\"note\">Every gap found, listed or not, by class; the last column is the \
         legend: what a gap of the class means and what to do.</p>\n",
    );
    let columns = [
        "Class",
        "#Found",
        "#Repaired",
        "#Open",
        "What it means and what to do",
    ];
    table_head(out, "classes", &columns)?;
    let (mut found_total, mut repaired_total) = (0, 0);
    for class in GapClass::ALL {
        let found = report.gap_counts.get(&class).copied().unwrap_or(0);
        let repaired: u64 = report
            .repairs
            .iter()
            .filter(|r| r.class == class)
            .map(|r| r.repaired)
            .sum();
        let open = found.saturating_sub(repaired);
        (found_total, repaired_total) = (found_total + found, repaired_total + repaired);
        write!(
            out,
            "<tr id=\"class-{id}\"{row}><th scope=\"row\">{label}<br><code>{id}</code></th>",
            id = class.as_str(),
            row = problem(open > 0),
            label = Esc(class_label(class)),
        )?;
        for value in [found, repaired, open] {
            num_cell(out, value)?;
        }
        let tag = if class.repairable() {
            " <span class=\"tag yes\">repairable</span>"
        } else {
            ""
        };
        writeln!(out, "<td>{}{tag}</td></tr>", Prose(class_legend(class)))?;
    }
    write!(out, "</tbody><tfoot><tr><th scope=\"row\">All classes</th>")?;
    for value in [
        found_total,
        repaired_total,
        found_total.saturating_sub(repaired_total),
    ] {
        write!(out, "<td class=\"n\">{}</td>", Num(value))?;
    }
    out.push_str("<td></td></tr></tfoot></table>\n</section>\n");
    Ok(())
}

fn tenants(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "tenants")?;
    if report.tenants.is_empty() {
        out.push_str("<p>No tenant had events in this window.</p>\n</section>\n");
        return Ok(());
    }
    // Two tables of a few columns each, so both fit an A4 page's width.
    let all_gaps = report.gap_counts.values().sum();
    type Columns = fn(&Funnel, u64) -> Vec<u64>;
    let tables: [(&str, &[&str], Columns); 2] = [
        (
            "Events and deliveries",
            &[
                "Tenant",
                "#Events stored",
                "#Events archived",
                "#Deliveries expected",
                "#Deliveries made",
                "#Deliveries attempted",
                "#Gaps",
            ],
            |f, gaps| {
                let deliveries = [f.expected_deliveries, f.materialised_deliveries];
                [
                    &[f.events, f.events_archived][..],
                    &deliveries,
                    &[f.attempted_deliveries, gaps],
                ]
                .concat()
            },
        ),
        (
            "Outcomes and attempts",
            &[
                "Tenant",
                "#Succeeded",
                "#Failed",
                "#Exhausted",
                "#Cancelled",
                "#Pending due",
                "#Pending scheduled",
                "#Attempts expected",
                "#Attempts hot",
            ],
            |f, _| {
                vec![
                    f.succeeded,
                    f.failed,
                    f.exhausted,
                    f.cancelled,
                    f.pending_due,
                    f.pending_scheduled,
                    f.attempts_expected,
                    f.attempts_hot,
                ]
            },
        ),
    ];
    for (title, columns, values) in tables {
        writeln!(out, "<h3>{title}</h3>")?;
        table_head(out, "tenants", columns)?;
        for tenant in &report.tenants {
            write!(
                out,
                "<tr{}><th scope=\"row\" class=\"tenant\">{}</th>",
                problem(tenant.gaps > 0),
                Esc(&tenant.tenant)
            )?;
            for value in values(&tenant.funnel, tenant.gaps) {
                num_cell(out, value)?;
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody><tfoot><tr><th scope=\"row\">All tenants</th>");
        for value in values(&report.funnel, all_gaps) {
            write!(out, "<td class=\"n\">{}</td>", Num(value))?;
        }
        out.push_str("</tr></tfoot></table>\n");
    }
    out.push_str("</section>\n");
    Ok(())
}

fn explained(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "explained")?;
    out.push_str(
        "<p class=\"note\">Differences between stages that are expected, with their reasons. \
         They are not gaps.</p>\n",
    );
    if report.explained.is_empty() {
        out.push_str("<p>No difference between stages needed explaining.</p>\n</section>\n");
        return Ok(());
    }
    table_head(
        out,
        "explained",
        &["Reason", "Tenant", "#Count", "Why this is expected"],
    )?;
    for row in &report.explained {
        writeln!(
            out,
            "<tr><th scope=\"row\">{}</th><td class=\"tenant\">{}</td><td class=\"n\">{}</td>\
             <td>{}</td></tr>",
            Esc(explanation_label(row.reason)),
            Opt(&row.tenant),
            Num(row.count),
            Prose(explanation_sentence(row.reason))
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

fn gap_list(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "gaps")?;
    if report.gaps_not_listed > 0 {
        let (n, gaps, are) = match report.gaps_not_listed {
            1 => (Num(1), "gap", "is"),
            n => (Num(n), "gaps", "are"),
        };
        writeln!(
            out,
            "<p class=\"warn\">{n} more {gaps} {are} counted in <a href=\"#gap-classes\">Gaps \
             by class</a> but not listed here: a report lists at most {} gaps, by class then id. \
             Reconcile a narrower window, or one tenant, to list the rest.</p>",
            Num(MAX_LISTED_GAPS as u64)
        )?;
    }
    if report.gaps.is_empty() {
        out.push_str("<p>No gap was found.</p>\n</section>\n");
        return Ok(());
    }
    table_head(
        out,
        "gaps",
        &["Gap id", "Class", "Tenant", "Subject", "Detail", "Repaired"],
    )?;
    for gap in &report.gaps {
        write!(
            out,
            "<tr><td class=\"id\">{id}</td><td><a href=\"#class-{class}\">{label}</a></td>\
             <td class=\"tenant\">{tenant}</td><td class=\"id\">",
            id = Esc(&gap.id),
            class = gap.class.as_str(),
            label = Esc(class_label(gap.class)),
            tenant = Opt(&gap.tenant),
        )?;
        let subjects = [
            ("event", &gap.event_id),
            ("delivery", &gap.delivery_id),
            ("endpoint", &gap.endpoint_id),
        ];
        let mut any = false;
        for (name, id) in subjects {
            if let Some(id) = id {
                write!(
                    out,
                    "<span class=\"subject\"><span>{name}</span> {}</span>",
                    Esc(id)
                )?;
                any = true;
            }
        }
        if !any {
            out.push('—');
        }
        let repaired = yes_no(gap.repaired);
        writeln!(
            out,
            "</td><td>{}</td><td><span class=\"tag {repaired}\">{repaired}</span></td></tr>",
            Esc(&gap.detail),
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

fn repairs(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "repairs")?;
    if report.repairs.is_empty() {
        out.push_str(if report.parameters.repair {
            "<p>This run was asked to repair and found nothing it could repair.</p>\n</section>\n"
        } else {
            "<p>This run was made without <code>--repair</code>: it changed nothing.</p>\n\
             </section>\n"
        });
        return Ok(());
    }
    table_head(out, "repairs", &["Class", "#Repaired", "What was done"])?;
    for repair in &report.repairs {
        writeln!(
            out,
            "<tr><th scope=\"row\"><a href=\"#class-{}\">{}</a></th><td class=\"n\">{}</td>\
             <td>{}</td></tr>",
            repair.class.as_str(),
            Esc(class_label(repair.class)),
            Num(repair.repaired),
            Esc(&repair.action)
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

fn archive(out: &mut String, report: &Report) -> fmt::Result {
    section(out, "archive")?;
    if report.archive.is_empty() {
        out.push_str("<p>No archived day falls in this window.</p>\n</section>\n");
        return Ok(());
    }
    let columns = [
        "Table",
        "Day",
        "#Generation",
        "State",
        "#Rows",
        "#Files",
        "Verified",
        "Problem",
    ];
    table_head(out, "archive", &columns)?;
    for day in &report.archive {
        let verified = yes_no(day.verified);
        writeln!(
            out,
            "<tr{row}><th scope=\"row\">{table}</th><td class=\"nowrap\">{day}</td>\
             <td class=\"n\">{generation}</td><td>{state}</td><td class=\"n\">{rows}</td>\
             <td class=\"n\">{files}</td><td><span class=\"tag {verified}\">{verified}</span></td>\
             <td>{problem}</td></tr>",
            row = problem(day.problem.is_some() || !day.verified),
            table = Esc(&day.table),
            day = Esc(&day.day),
            generation = day.generation,
            state = Esc(day.state.as_str()),
            rows = Num(day.rows),
            files = Num(day.files),
            problem = Opt(&day.problem),
        )?;
    }
    out.push_str("</tbody></table>\n</section>\n");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::chart::BAR_START;
    use super::*;
    use crate::report::Explanation;
    use crate::report::{Explained, Gap, Parameters, TenantFunnel};

    const HOSTILE: &str = "<script>alert(1)</script>\"'&amp;<img src=x onerror=alert(2)>";

    fn report() -> Report {
        Report {
            generated_at: "2025-03-02T00:05:00Z".to_owned(),
            parameters: Parameters {
                since: "2025-03-01T00:00:00Z".to_owned(),
                until: "2025-03-02T00:00:00Z".to_owned(),
                tenant: Some(HOSTILE.to_owned()),
                repair: false,
                grace_seconds: 300,
                as_of: "2025-03-02T00:04:00Z".to_owned(),
            },
            tenants: vec![TenantFunnel {
                tenant: HOSTILE.to_owned(),
                funnel: Funnel::default(),
                gaps: 1,
            }],
            explained: vec![Explained {
                reason: Explanation::TenantUnknown,
                tenant: Some(HOSTILE.to_owned()),
                count: 1,
            }],
            gap_counts: BTreeMap::from([(GapClass::MissingDelivery, 1)]),
            gaps: vec![Gap {
                id: format!("missing_delivery:{HOSTILE}"),
                class: GapClass::MissingDelivery,
                tenant: Some(HOSTILE.to_owned()),
                event_id: Some(HOSTILE.to_owned()),
                delivery_id: None,
                endpoint_id: None,
                detail: HOSTILE.to_owned(),
                repaired: false,
            }],
            ..crate::report::tests::report()
        }
    }

    #[test]
    fn escape_replaces_every_special_character() {
        assert_eq!(
            Esc(HOSTILE).to_string(),
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;amp;&lt;img src=x \
             onerror=alert(2)&gt;"
        );
        assert_eq!(
            Esc("plain tenant_1 é ü 漢").to_string(),
            "plain tenant_1 é ü 漢"
        );
        assert_eq!(Esc("").to_string(), "");
        assert_eq!(Esc("&&<<").to_string(), "&amp;&amp;&lt;&lt;");
    }

    #[test]
    fn hostile_values_are_escaped_everywhere() {
        let mut report = report();
        report.seal();
        let html = render(&report);
        assert!(
            !html.to_lowercase().contains("<script"),
            "a script tag got through"
        );
        assert!(!html.contains("<img"), "an img tag got through");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        // The tenant (header, tenants, explained, gaps), the gap's id, event and
        // detail, and no raw copy at all.
        assert!(html.matches(&Esc(HOSTILE).to_string()).count() >= 7);
        assert!(!html.contains(HOSTILE));
    }

    #[test]
    fn numbers_have_thousands_separators() {
        let cases = [
            (0, "0"),
            (7, "7"),
            (999, "999"),
            (1000, "1,000"),
            (12_480, "12,480"),
        ];
        for (n, text) in cases {
            assert_eq!(Num(n).to_string(), text);
        }
        assert_eq!(Num(u64::MAX).to_string(), "18,446,744,073,709,551,615");
        assert_eq!(Num(1_234_567).to_string(), "1,234,567");
    }

    #[test]
    fn every_gap_class_and_explanation_has_a_legend_sentence() {
        let check = |text: &str| {
            assert!(
                text.len() > 30 && text.ends_with('.'),
                "not a sentence: {text}"
            );
            assert!(!text.contains("  "), "stray spaces: {text}");
        };
        for class in GapClass::ALL {
            check(class_legend(class));
            assert!(!class_label(class).is_empty());
        }
        // The `match` in `explanation_sentence` is exhaustive, so a new reason
        // without a sentence does not compile; this list checks the wording.
        let reasons = [
            Explanation::FilteredByRule,
            Explanation::EndpointDisabled,
            Explanation::EndpointDeleted,
            Explanation::EventBeforeEndpoint,
            Explanation::TypeNotSubscribed,
            Explanation::TenantUnknown,
            Explanation::TenantDisabled,
            Explanation::PendingQuarantined,
            Explanation::PendingCircuitOpen,
            Explanation::PendingEndpointDisabled,
            Explanation::EndedWithoutAttempt,
            Explanation::BeforeLedger,
            Explanation::EventArchived,
            Explanation::OperationalEvent,
            Explanation::LateAttempt,
        ];
        let mut sentences: Vec<_> = reasons.iter().map(|r| explanation_sentence(*r)).collect();
        for sentence in &sentences {
            check(sentence);
        }
        sentences.sort_unstable();
        sentences.dedup();
        assert_eq!(
            sentences.len(),
            reasons.len(),
            "two reasons share a sentence"
        );
        let mut legends: Vec<_> = GapClass::ALL.iter().map(|c| class_legend(*c)).collect();
        legends.dedup();
        assert_eq!(legends.len(), GapClass::ALL.len());
    }

    #[test]
    fn an_empty_window_draws_zero_bars_with_labels() {
        let mut report = report();
        report.parameters.tenant = None;
        report.gap_counts.clear();
        report.gaps.clear();
        report.tenants.clear();
        report.explained.clear();
        report.seal();
        let html = render(&report);
        assert!(html.contains("id=\"verdict\">CLEAN</p>"));
        for stage in ["events", "terminal", "pending", "attempts_hot"] {
            assert!(
                html.contains(&format!(
                    "data-stage=\"{stage}\" data-value=\"0\" x=\"{BAR_START}\" y=\""
                )),
                "no zero bar for {stage}"
            );
        }
        // No capture ledger, no capture bars.
        assert!(!html.contains("data-stage=\"captured_changes\""));
        assert!(!html.contains("NaN"));
        assert!(html.contains("dominant-baseline=\"central\">0</text>"));
    }

    #[test]
    fn the_verdict_counts_open_gaps() {
        let mut report = report();
        report.gap_counts.insert(GapClass::OverduePending, 2);
        report.seal();
        assert!(render(&report).contains("id=\"verdict\">3 open gaps</p>"));
    }
}
