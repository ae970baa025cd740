//! `bwctl account`: proves every accepted operation is in exactly one place (`bw_ops::account`).

use crate::exit::EXIT_LOST;
use anyhow::Context as _;
use async_nats::jetstream;
use bw_common::nats::Buckets;
use std::io::Write;

/// `bwctl account [--expected FILE]`: exit [`EXIT_LOST`] when any operation is lost.
pub(crate) async fn run(
    js: &jetstream::Context,
    buckets: &Buckets,
    expected: Option<std::path::PathBuf>,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let ids: Vec<String> = match expected {
        Some(path) => std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect(),
        None => Vec::new(),
    };
    let report = bw_ops::account::account_expected(js, buckets, &ids).await?;
    write!(out, "{report}")?;
    if report.lost_count() > 0 {
        writeln!(out, "LOST: {} operation(s)", report.lost_count())?;
        return Ok(EXIT_LOST);
    }
    writeln!(
        out,
        "{}",
        if report.is_clean() {
            "OK: every operation is in exactly one place"
        } else {
            "OK: nothing lost (see findings above)"
        }
    )?;
    Ok(0)
}
