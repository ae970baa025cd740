//! A self-contained SVG timeline of the drill: throughput, error rate, breaker state and DLQ depth over time.

/// One sample per second.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the drill started.
    pub t: f64,
    /// Messages Meta accepted per second (all dispatchers).
    pub sent_per_s: f64,
    /// Share of Meta calls that failed in that second, 0..1.
    pub error_rate: f64,
    /// Scopes OPEN or HALF_OPEN.
    pub scopes_open: u32,
    /// Scopes HALF_OPEN.
    pub scopes_half_open: u32,
    /// Messages waiting in BW_DLQ.
    pub dlq_depth: u64,
}

fn polyline(samples: &[Sample], x: impl Fn(f64) -> f64, y: impl Fn(&Sample) -> f64) -> String {
    samples.iter().map(|s| format!("{:.1},{:.1}", x(s.t), y(s))).collect::<Vec<_>>().join(" ")
}

/// Renders four stacked panels sharing the time axis. `marks` are vertical lines (time, label).
pub fn render(samples: &[Sample], marks: &[(f64, String)], title: &str) -> String {
    let width = 960.0;
    let panel_h = 130.0;
    let left = 70.0;
    let right = 20.0;
    let top = 40.0;
    let gap = 30.0;
    let t_max = samples.iter().map(|s| s.t).fold(1.0_f64, f64::max);
    let x = |t: f64| left + (t / t_max) * (width - left - right);
    let panels: [(&str, &str, Box<dyn Fn(&Sample) -> f64>); 4] = [
        ("sent / s", "#2b7bb9", Box::new(|s: &Sample| s.sent_per_s)),
        ("error rate %", "#d9534f", Box::new(|s: &Sample| s.error_rate * 100.0)),
        ("scopes open", "#f0ad4e", Box::new(|s: &Sample| s.scopes_open as f64)),
        ("DLQ depth", "#6f42c1", Box::new(|s: &Sample| s.dlq_depth as f64)),
    ];
    let height = top + 4.0 * (panel_h + gap) + 20.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"16\">{}</text>\n",
        escape(title)
    );
    for (i, (label, color, value)) in panels.iter().enumerate() {
        let y0 = top + i as f64 * (panel_h + gap);
        let max = samples.iter().map(|s| value(s)).fold(0.0_f64, f64::max).max(1.0);
        let y = |s: &Sample| y0 + panel_h - (value(s) / max) * panel_h;
        svg.push_str(&format!(
            "<rect x=\"{left}\" y=\"{y0}\" width=\"{}\" height=\"{panel_h}\" fill=\"#f8f9fa\" stroke=\"#ccc\"/>\n\
             <text x=\"5\" y=\"{}\">{}</text><text x=\"5\" y=\"{}\" fill=\"#666\">max {:.0}</text>\n\
             <polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            width - left - right,
            y0 + 15.0,
            escape(label),
            y0 + 30.0,
            max,
            polyline(samples, x, y)
        ));
    }
    let bottom = top + 4.0 * (panel_h + gap) - gap;
    for (t, label) in marks {
        let xm = x(*t);
        svg.push_str(&format!(
            "<line x1=\"{xm:.1}\" y1=\"{top}\" x2=\"{xm:.1}\" y2=\"{bottom}\" stroke=\"#333\" stroke-dasharray=\"4 3\"/>\n\
             <text x=\"{:.1}\" y=\"{}\" fill=\"#333\">{}</text>\n",
            xm + 3.0,
            bottom + 14.0,
            escape(label)
        ));
    }
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#666\">{t_max:.0} s</text>\n</svg>\n",
        width - right - 30.0,
        bottom + 28.0
    ));
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_panel_and_mark() {
        let samples: Vec<Sample> = (0..10)
            .map(|i| Sample {
                t: i as f64,
                sent_per_s: 50.0,
                error_rate: if i > 4 { 0.3 } else { 0.0 },
                scopes_open: (i > 5) as u32,
                scopes_half_open: 0,
                dlq_depth: i * 10,
            })
            .collect();
        let svg = render(&samples, &[(5.0, "outage <start>".into())], "drill");
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("outage &lt;start&gt;"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
