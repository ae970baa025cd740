//! A self-contained SVG timeline of the drill: throughput, error answers, breaker state and DLQ depth, stacked
//! on one shared time axis labelled in seconds, with marks for outage windows, recovery and chaos events.
//! The SVG scales to its container (viewBox, width 100%), so the page never scrolls sideways.

use crate::model::{Mark, MarkKind};

/// One sample per second.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the drill started.
    pub t: f64,
    /// Messages Meta accepted per second (all dispatchers).
    pub sent_per_s: f64,
    /// Share of Meta calls that failed in that second, 0..1.
    pub error_rate: f64,
    /// Error answers from Meta in that second.
    pub errors_per_s: f64,
    /// Scopes OPEN or HALF_OPEN.
    pub scopes_open: u32,
    /// Scopes HALF_OPEN.
    pub scopes_half_open: u32,
    /// Messages waiting in BW_DLQ.
    pub dlq_depth: u64,
}

type Value = fn(&Sample) -> f64;

const PANELS: [(&str, &str, Value); 4] = [
    ("sent / s", "#2b7bb9", |s| s.sent_per_s),
    ("error answers / s", "#d9534f", |s| s.errors_per_s),
    ("breakers open", "#f0ad4e", |s| f64::from(s.scopes_open)),
    ("DLQ depth", "#6f42c1", |s| s.dlq_depth as f64),
];

fn mark_color(kind: MarkKind) -> &'static str {
    match kind {
        MarkKind::Outage => "#c0392b",
        MarkKind::Recovery => "#27ae60",
        MarkKind::Chaos => "#8e44ad",
    }
}

fn polyline(samples: &[Sample], x: impl Fn(f64) -> f64, y: impl Fn(&Sample) -> f64) -> String {
    samples.iter().map(|s| format!("{:.1},{:.1}", x(s.t), y(s))).collect::<Vec<_>>().join(" ")
}

/// A tick step (seconds) giving about 10 labelled ticks.
fn tick_step(t_max: f64) -> f64 {
    let raw = (t_max / 10.0).max(1.0);
    [1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0].into_iter().find(|s| *s >= raw).unwrap_or(600.0)
}

/// Renders the stacked panels. Every mark is a dashed vertical line across all panels, numbered, with its
/// label in a legend under the axis (labels never overlap each other).
pub fn render(samples: &[Sample], marks: &[Mark], title: &str) -> String {
    let width = 960.0;
    let panel_h = 110.0;
    let left = 70.0;
    let right = 20.0;
    let top = 40.0;
    let gap = 18.0;
    let plot_w = width - left - right;
    let t_max = samples.iter().map(|s| s.t).chain(marks.iter().map(|m| m.t)).fold(1.0_f64, f64::max);
    let x = |t: f64| left + (t / t_max) * plot_w;
    let bottom = top + PANELS.len() as f64 * (panel_h + gap) - gap;
    let legend_top = bottom + 44.0;
    let height = legend_top + 18.0 * marks.len() as f64 + 10.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {width} {height}\" width=\"100%\" \
         preserveAspectRatio=\"xMinYMin meet\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\" \
         aria-label=\"{t}\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"16\">{t}</text>\n",
        t = escape(title)
    );
    for (i, (label, color, value)) in PANELS.iter().enumerate() {
        let y0 = top + i as f64 * (panel_h + gap);
        let max = samples.iter().map(value).fold(0.0_f64, f64::max).max(1.0);
        let y = |s: &Sample| y0 + panel_h - (value(s) / max) * panel_h;
        svg.push_str(&format!(
            "<rect x=\"{left}\" y=\"{y0}\" width=\"{plot_w}\" height=\"{panel_h}\" fill=\"#f8f9fa\" stroke=\"#ccc\"/>\n\
             <text x=\"5\" y=\"{}\">{}</text><text x=\"5\" y=\"{}\" fill=\"#666\">max {:.0}</text>\n\
             <polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            y0 + 15.0,
            escape(label),
            y0 + 30.0,
            max,
            polyline(samples, x, y)
        ));
    }
    // The shared time axis: gridlines through every panel, labelled in seconds under the last one.
    let step = tick_step(t_max);
    let mut t = 0.0;
    while t <= t_max + 1e-9 {
        let xt = x(t);
        svg.push_str(&format!(
            "<line x1=\"{xt:.1}\" y1=\"{top}\" x2=\"{xt:.1}\" y2=\"{bottom}\" stroke=\"#e3e3e3\"/>\n\
             <text x=\"{xt:.1}\" y=\"{:.1}\" fill=\"#444\" text-anchor=\"middle\">{t:.0} s</text>\n",
            bottom + 14.0
        ));
        t += step;
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#444\" text-anchor=\"middle\">seconds since the producer started</text>\n",
        left + plot_w / 2.0,
        bottom + 30.0
    ));
    for (n, m) in marks.iter().enumerate() {
        let xm = x(m.t);
        let color = mark_color(m.kind);
        svg.push_str(&format!(
            "<line x1=\"{xm:.1}\" y1=\"{top}\" x2=\"{xm:.1}\" y2=\"{bottom}\" stroke=\"{color}\" stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{color}\" font-size=\"11\">{}</text>\n\
             <text x=\"{left}\" y=\"{:.1}\" fill=\"{color}\">{} at {:.1} s: {} ({})</text>\n",
            xm + 2.0,
            top + 12.0 + 12.0 * (n % 3) as f64,
            n + 1,
            legend_top + 18.0 * n as f64,
            n + 1,
            m.t,
            escape(&m.label),
            m.kind.label()
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// Escapes text for SVG and HTML.
pub fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_panel_tick_and_mark() {
        let samples: Vec<Sample> = (0..=40)
            .map(|i| Sample {
                t: f64::from(i),
                sent_per_s: 50.0,
                error_rate: if i > 4 { 0.3 } else { 0.0 },
                errors_per_s: if i > 4 { 15.0 } else { 0.0 },
                scopes_open: u32::from(i > 5),
                scopes_half_open: 0,
                dlq_depth: u64::from(i as u32) * 10,
            })
            .collect();
        let marks = vec![
            Mark { t: 5.0, label: "outage <start>".into(), kind: MarkKind::Outage },
            Mark { t: 20.0, label: "Meta recovers".into(), kind: MarkKind::Recovery },
            Mark { t: 12.5, label: "kill -9 dispatcher-1".into(), kind: MarkKind::Chaos },
        ];
        let svg = render(&samples, &marks, "drill");
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("1 at 5.0 s: outage &lt;start&gt; (outage)"), "{svg}");
        assert!(svg.contains("3 at 12.5 s: kill -9 dispatcher-1 (chaos)"));
        // 40 s: a tick every 5 s, labelled.
        for t in ["0 s", "5 s", "20 s", "40 s"] {
            assert!(svg.contains(&format!(">{t}</text>")), "tick {t}");
        }
        assert!(svg.contains("viewBox=\"0 0 960 ") && svg.contains("width=\"100%\""));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
