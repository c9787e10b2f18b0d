//! Small inline SVG charts (no script, no external asset): bars of
//! attempts with the part that succeeded, one bar per time slot.

use maud::{Markup, html};

/// One time slot's bar.
pub(crate) struct Bar {
    /// Height, in the chart's unit (attempts, milliseconds…).
    pub total: f64,
    /// The part drawn green over the red total (succeeded); equal to
    /// `total` for a one-colour bar.
    pub good: f64,
    /// What a pointer over the bar shows.
    pub title: String,
}

/// Labels under a chart.
pub(crate) struct Axis<'a> {
    /// What the chart shows, for screen readers.
    pub label: &'a str,
    /// Under the first slot.
    pub left: &'a str,
    /// Under the last slot.
    pub right: &'a str,
}

/// A bar chart `width` × `height` pixels (plus a line of labels) with one
/// bar per slot, oldest first; an empty slot has no bar.
pub(crate) fn bars(slots: &[Option<Bar>], width: f64, height: f64, axis: &Axis<'_>) -> Markup {
    let max = slots
        .iter()
        .flatten()
        .map(|b| b.total)
        .fold(0.0f64, f64::max)
        .max(1.0);
    let step = width / slots.len().max(1) as f64;
    let gap = if step > 3.0 { 1.0 } else { 0.0 };
    let scaled = |v: f64| height * v / max;
    let full = height + 16.0;
    html! {
        svg class="chart" width=(width) height=(full) viewBox={ "0 0 " (width) " " (full) }
            role="img" aria-label=(axis.label) {
            @for (i, slot) in slots.iter().enumerate() {
                @if let Some(b) = slot {
                    @let x = format!("{:.1}", i as f64 * step);
                    @let w = format!("{:.1}", step - gap);
                    rect x=(x) y=(format!("{:.1}", height - scaled(b.total))) width=(w)
                        height=(format!("{:.1}", scaled(b.total))) fill=(if b.good < b.total { "#c44" } else { "#3a3" }) {
                        title { (b.title) }
                    }
                    @if b.good > 0.0 && b.good < b.total {
                        rect x=(x) y=(format!("{:.1}", height - scaled(b.good))) width=(w)
                            height=(format!("{:.1}", scaled(b.good))) fill="#3a3" {
                            title { (b.title) }
                        }
                    }
                }
            }
            text x="0" y=(height + 13.0) font-size="11" { (axis.left) }
            text x=(width) y=(height + 13.0) font-size="11" text-anchor="end" { (axis.right) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_tallest_and_escape_their_titles() {
        let slots = [
            Some(Bar {
                total: 10.0,
                good: 5.0,
                title: "<b>".into(),
            }),
            None,
            Some(Bar {
                total: 5.0,
                good: 5.0,
                title: "ok".into(),
            }),
        ];
        let axis = Axis {
            label: "a",
            left: "then",
            right: "now",
        };
        let svg = bars(&slots, 300.0, 100.0, &axis).into_string();
        // The tallest bar fills the height; the half-green bar draws both.
        assert!(
            svg.contains(r##"y="0.0" width="99.0" height="100.0" fill="#c44""##),
            "{svg}"
        );
        assert!(
            svg.contains(r##"y="50.0" width="99.0" height="50.0" fill="#3a3""##),
            "{svg}"
        );
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"), "{svg}");
        // The empty slot leaves a gap: the third bar starts at 200.
        assert!(svg.contains(r#"x="200.0""#), "{svg}");
    }
}
