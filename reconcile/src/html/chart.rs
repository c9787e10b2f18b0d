//! The funnel as an inline SVG chart: one bar per stage, scaled to the
//! largest, stacked where a stage splits (terminal, pending).

use std::fmt::{self, Write};

use super::{Esc, Num, section};
use crate::report::{Funnel, Report};

/// One bar of the funnel chart: a stage, its count, and the parts of a
/// stacked bar (name, count, colour).
struct Bar {
    stage: &'static str,
    label: &'static str,
    value: u64,
    colour: &'static str,
    parts: Vec<(&'static str, u64, &'static str)>,
}

/// The funnel's stages in order; capture's two only when the ledger has them.
fn bars(f: &Funnel) -> Vec<Bar> {
    const CAPTURE: &str = "#2a8c8c";
    const STAGE: &str = "#3d6fc4";
    const ATTEMPTS: &str = "#7a52b3";
    let bar = |stage, label, value, colour| Bar {
        stage,
        label,
        value,
        colour,
        parts: Vec::new(),
    };
    let mut bars = Vec::new();
    if let Some(changes) = f.captured_changes {
        bars.push(bar("captured_changes", "Source changes", changes, CAPTURE));
    }
    if let Some(events) = f.captured_events {
        bars.push(bar("captured_events", "Captured events", events, CAPTURE));
    }
    bars.extend([
        bar("events", "Events stored", f.events, STAGE),
        bar(
            "expected_deliveries",
            "Expected deliveries",
            f.expected_deliveries,
            STAGE,
        ),
        bar(
            "materialised_deliveries",
            "Materialised deliveries",
            f.materialised_deliveries,
            STAGE,
        ),
        bar(
            "attempted_deliveries",
            "Attempted deliveries",
            f.attempted_deliveries,
            STAGE,
        ),
        Bar {
            parts: vec![
                ("succeeded", f.succeeded, "#2e8b4a"),
                ("failed", f.failed, "#c0392b"),
                ("exhausted", f.exhausted, "#d9822b"),
                ("cancelled", f.cancelled, "#8a94a6"),
            ],
            ..bar(
                "terminal",
                "Terminal deliveries",
                f.succeeded + f.failed + f.exhausted + f.cancelled,
                "#2e8b4a",
            )
        },
        Bar {
            parts: vec![
                ("due", f.pending_due, "#8f5f00"),
                ("scheduled", f.pending_scheduled, "#c79200"),
            ],
            ..bar(
                "pending",
                "Pending deliveries",
                f.pending_due + f.pending_scheduled,
                "#8f5f00",
            )
        },
        bar(
            "attempts_expected",
            "Attempts expected",
            f.attempts_expected,
            ATTEMPTS,
        ),
        bar(
            "attempts_hot",
            "Attempts (hot table)",
            f.attempts_hot,
            ATTEMPTS,
        ),
    ]);
    bars
}

/// The chart's geometry, in SVG user units.
const CHART_WIDTH: f64 = 900.0;
const LABEL_END: f64 = 196.0;
pub(super) const BAR_START: f64 = 206.0;
const BAR_SPAN: f64 = 590.0;
const BAR_HEIGHT: f64 = 20.0;
const ROW: f64 = 32.0;
const SPLIT_ROW: f64 = 17.0;

pub(super) fn funnel_chart(out: &mut String, report: &Report) -> fmt::Result {
    let (f, p) = (&report.funnel, &report.parameters);
    let bars = bars(f);
    let max = bars.iter().map(|b| b.value).max().unwrap_or(0);
    let width = |value: u64| {
        if max == 0 {
            0.0
        } else {
            value as f64 / max as f64 * BAR_SPAN
        }
    };
    let rows = bars.iter().map(|b| {
        if b.parts.is_empty() {
            ROW
        } else {
            ROW + SPLIT_ROW
        }
    });
    let height = 12.0 + rows.sum::<f64>();
    let summary: Vec<String> = bars
        .iter()
        .map(|b| format!("{} {}", b.label, Num(b.value)))
        .collect();
    section(out, "funnel-section")?;
    writeln!(
        out,
        "<p class=\"note\">Each stage counted from its own table, over every tenant of the \
         window; bars are drawn to the scale of the largest count.</p>\n\
         <svg id=\"funnel\" role=\"img\" xmlns=\"http://www.w3.org/2000/svg\" \
         viewBox=\"0 0 {CHART_WIDTH} {height}\" aria-label=\"{aria}\">\n\
         <title>Funnel from {since} to {until}</title>",
        aria = Esc(&format!("Funnel of the window: {}", summary.join(", "))),
        since = Esc(&p.since),
        until = Esc(&p.until),
    )?;
    let mut y = 6.0;
    for bar in &bars {
        let (w, middle) = (width(bar.value), y + BAR_HEIGHT / 2.0);
        write!(
            out,
            "<g><text class=\"label\" x=\"{LABEL_END}\" y=\"{middle}\" \
             dominant-baseline=\"central\">{label}</text>\
             <rect x=\"{BAR_START}\" y=\"{y}\" width=\"{BAR_SPAN}\" height=\"{BAR_HEIGHT}\" \
             fill=\"#f1f3f7\"/>\
             <rect class=\"bar\" data-stage=\"{stage}\" data-value=\"{value}\" x=\"{BAR_START}\" \
             y=\"{y}\" width=\"{w:.2}\" height=\"{BAR_HEIGHT}\" fill=\"{colour}\"/>",
            label = Esc(bar.label),
            stage = bar.stage,
            value = bar.value,
            colour = bar.colour,
        )?;
        // The parts stacked over the bar, left to right.
        let mut x = BAR_START;
        for (part, value, colour) in &bar.parts {
            let part_width = width(*value);
            if part_width > 0.0 {
                write!(
                    out,
                    "<rect class=\"segment\" data-stage=\"{}.{part}\" data-value=\"{value}\" \
                     x=\"{x:.2}\" y=\"{y}\" width=\"{part_width:.2}\" height=\"{BAR_HEIGHT}\" \
                     fill=\"{colour}\"/>",
                    bar.stage
                )?;
            }
            x += part_width;
        }
        write!(
            out,
            "<text class=\"count\" x=\"{:.2}\" y=\"{middle}\" dominant-baseline=\"central\">{}\
             </text>",
            BAR_START + w + 8.0,
            Num(bar.value)
        )?;
        if !bar.parts.is_empty() {
            let baseline = y + BAR_HEIGHT + 14.0;
            write!(
                out,
                "<text class=\"split\" x=\"{BAR_START}\" y=\"{baseline}\">"
            )?;
            for (i, (part, value, colour)) in bar.parts.iter().enumerate() {
                let dot = if i == 0 { "" } else { " · " };
                write!(
                    out,
                    "{dot}<tspan fill=\"{colour}\" font-weight=\"700\">{part}</tspan> {}",
                    Num(*value)
                )?;
            }
            out.push_str("</text>");
            y += SPLIT_ROW;
        }
        y += ROW;
        out.push_str("</g>\n");
    }
    writeln!(
        out,
        "</svg>\n<p class=\"note\">Expected, materialised, attempted, terminal and pending \
         deliveries and their attempts are counted for events in the hot tables. Of the {} \
         events, {} are in archived days, whose manifests hold {} deliveries and {} \
         attempts.</p>\n</section>",
        Num(f.events),
        Num(f.events_archived),
        Num(f.deliveries_archived),
        Num(f.attempts_archived)
    )
}
