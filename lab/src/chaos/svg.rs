//! Small line charts as SVG, one per sampled series, with the moments of
//! the faults marked: the soak report's pictures.

use std::fmt::Write;

/// One sampled series: (seconds, value or `None` when the sample failed).
pub struct Series {
    /// The chart's title.
    pub title: &'static str,
    /// The values' unit, shown after the largest.
    pub unit: &'static str,
    /// The samples in time order.
    pub points: Vec<(f64, Option<f64>)>,
}

const W: f64 = 440.0;
const H: f64 = 150.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 10.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 22.0;
const COLUMNS: usize = 2;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn number(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Every series as a chart in a grid of two columns; `marks` are (seconds,
/// label) drawn as dashed vertical lines on each; time runs 0 to `t_max`.
pub fn small_multiples(series: &[Series], marks: &[(f64, String)], t_max: f64) -> String {
    let rows = series.len().div_ceil(COLUMNS).max(1);
    let (width, height) = (W * COLUMNS as f64, H * rows as f64);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img">"#
    );
    let t_max = t_max.max(1.0);
    for (n, s) in series.iter().enumerate() {
        let (ox, oy) = ((n % COLUMNS) as f64 * W, (n / COLUMNS) as f64 * H);
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let max = s.points.iter().filter_map(|p| p.1).fold(0.0f64, f64::max);
        let top = if max > 0.0 { max * 1.1 } else { 1.0 };
        let x = |t: f64| ox + LEFT + pw * (t / t_max).clamp(0.0, 1.0);
        let y = |v: f64| oy + TOP + ph * (1.0 - (v / top).clamp(0.0, 1.0));
        let _ = write!(
            out,
            r##"<g><title>{title}</title><text x="{tx}" y="{ty}" font-weight="bold">{title}</text><rect x="{rx}" y="{ry}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#bbb"/><text x="{lx}" y="{l0}" text-anchor="end">0</text><text x="{lx}" y="{lm}" text-anchor="end">{maxl} {unit}</text><text x="{rx}" y="{bx}">0 min</text><text x="{ex}" y="{bx}" text-anchor="end">{mins:.0} min</text>"##,
            title = esc(s.title),
            tx = ox + LEFT,
            ty = oy + 15.0,
            rx = ox + LEFT,
            ry = oy + TOP,
            lx = ox + LEFT - 4.0,
            l0 = oy + TOP + ph,
            lm = y(max) + 4.0,
            maxl = number(max),
            unit = esc(s.unit),
            bx = oy + H - 6.0,
            ex = ox + LEFT + pw,
            mins = t_max / 60.0,
        );
        for (t, label) in marks {
            let _ = write!(
                out,
                r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{y1}" stroke="#d55" stroke-dasharray="3,3"><title>{label}</title></line>"##,
                x = x(*t),
                y0 = oy + TOP,
                y1 = oy + TOP + ph,
                label = esc(label),
            );
        }
        // One polyline per run of successful samples.
        let mut run: Vec<String> = Vec::new();
        let flush = |run: &mut Vec<String>, out: &mut String| {
            if run.len() > 1 {
                let _ = write!(
                    out,
                    r##"<polyline fill="none" stroke="#3d6fc4" stroke-width="1.5" points="{}"/>"##,
                    run.join(" ")
                );
            } else if let Some(p) = run.first() {
                let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(
                    out,
                    r##"<circle cx="{cx}" cy="{cy}" r="1.5" fill="#3d6fc4"/>"##
                );
            }
            run.clear();
        };
        for (t, v) in &s.points {
            match v {
                Some(v) => run.push(format!("{:.1},{:.1}", x(*t), y(*v))),
                None => flush(&mut run, &mut out),
            }
        }
        flush(&mut run, &mut out);
        out.push_str("</g>");
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_splits_the_line_and_labels_are_escaped() {
        let svg = small_multiples(
            &[Series {
                title: "RSS <walhook>",
                unit: "MiB",
                points: vec![
                    (0.0, Some(1.0)),
                    (10.0, Some(2.0)),
                    (20.0, None),
                    (30.0, Some(2.0)),
                    (40.0, Some(2.0)),
                ],
            }],
            &[(15.0, "postgres-kill & restart".into())],
            40.0,
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("RSS &lt;walhook&gt;"));
        assert!(svg.contains("postgres-kill &amp; restart"));
        assert!(!svg.contains("<walhook>"));
        assert!(svg.contains("2.00 MiB"));
    }
}
