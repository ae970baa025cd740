//! Output helpers readable at 3 a.m.: UTC timestamps, short ages, aligned tables, a progress bar.

use bw_ops::ops::BatchReport;
use std::io::{IsTerminal, Write};

/// `2026-03-01 04:12:09Z` for a Unix ms timestamp; `-` for 0.
pub fn utc(ms: i64) -> String {
    if ms <= 0 {
        return "-".into();
    }
    bw_common::time::utc_short(ms)
}

/// `3d4h`, `2h05m`, `4m10s`, `12s` for a duration in ms.
pub fn age(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        s if s >= 86_400 => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

/// Renders rows as left-aligned columns separated by two spaces, with a header row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths.get(i).copied().unwrap_or(0).saturating_sub(cell.chars().count());
            s.push_str(cell);
            if i + 1 < cells.len() {
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row.clone()));
    }
    out
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
pub struct ProgressBar {
    label: &'static str,
    draw: bool,
}

impl ProgressBar {
    pub fn new(label: &'static str) -> ProgressBar {
        ProgressBar { label, draw: std::io::stderr().is_terminal() }
    }

    pub fn update(&mut self, done: usize, total: usize) {
        if !self.draw || total == 0 {
            return;
        }
        let width = 30;
        let filled = done * width / total;
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r{} [{}{}] {done}/{total} {:>3}%",
            self.label,
            "#".repeat(filled),
            "-".repeat(width - filled),
            done * 100 / total
        );
        if done == total {
            let _ = writeln!(err);
        }
        let _ = err.flush();
    }
}

/// The outcome counts of a batch move (replay, purge, release, drop); exit 1 when any entry errored.
pub(crate) fn write_batch(out: &mut (dyn Write + Send), report: &BatchReport) -> anyhow::Result<i32> {
    writeln!(out, "selected {}", report.selected)?;
    for (label, n) in &report.outcomes {
        writeln!(out, "  {label:<20} {n:>8}")?;
    }
    for (op, why) in report.left.iter().take(20) {
        writeln!(out, "  left {op}: {why}")?;
    }
    if report.errors > 0 {
        writeln!(out, "  errors {:>8} (left in place; run again)", report.errors)?;
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1_700_000_000_000), "2023-11-14 22:13:20Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(age(12_000), "12s");
        assert_eq!(age(250_000), "4m10s");
        assert_eq!(age(7_500_000), "2h05m");
        assert_eq!(age(3 * 86_400_000 + 4 * 3_600_000), "3d4h");
        let t = table(&["SCOPE", "DEPTH"], &[vec!["1001".into(), "5".into()], vec!["22".into(), "12345".into()]]);
        assert_eq!(t, "SCOPE  DEPTH\n1001   5\n22     12345\n");
    }
}
