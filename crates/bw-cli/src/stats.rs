//! The per-scope statistics of `bwctl dlq stats` and `bwctl quarantine stats`.

use crate::fmt;
use bw_common::time::now_ms;
use bw_ops::inspect::QueueStats;
use clap::Args;
use std::io::Write;

#[derive(Debug, Args, Clone, Default)]
pub struct ScopeArg {
    /// phone_number_id of one scope (default: every scope).
    #[arg(long)]
    pub scope: Option<String>,
}

pub(crate) fn write_stats(
    out: &mut (dyn Write + Send),
    stats: &[QueueStats],
    undecodable: usize,
) -> anyhow::Result<i32> {
    let now = now_ms();
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            let reasons = s.reasons.iter().map(|(r, n)| format!("{r}={n}")).collect::<Vec<_>>().join(" ");
            vec![
                s.scope.clone(),
                s.depth.to_string(),
                fmt::utc(s.oldest_at_unix_ms),
                fmt::age(s.oldest_age_ms(now)),
                reasons,
            ]
        })
        .collect();
    write!(out, "{}", fmt::table(&["SCOPE", "DEPTH", "OLDEST", "AGE", "REASONS"], &rows))?;
    let total: u64 = stats.iter().map(|s| s.depth).sum();
    writeln!(out, "total {total} in {} scope(s); {undecodable} undecodable", stats.len())?;
    Ok(0)
}
