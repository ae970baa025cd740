//! `bwctl dlq`: per-scope and per-incident statistics, masked inspection, replay now (of chosen scopes, or
//! exactly one breaker incident in per-recipient acceptance order with a progress line and the incident's
//! report) and purge with confirmation.

use crate::exit::{EXIT_ABORTED, confirm};
use crate::fmt::{self, write_batch};
use crate::stats::{ScopeArg, write_stats};
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_common::time::now_ms;
use bw_ops::incident::{self, IncidentStats, Incidents};
use bw_ops::inspect::{self, DlqItem, dlq_reason_label, masked};
use bw_ops::ops;
use bw_proto::v1::BreakerState;
use clap::Subcommand;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Depth, oldest age and reasons per scope, then per breaker incident (depth, held for manual release,
    /// oldest, categories).
    Stats(ScopeArg),
    /// Entries, personal data masked.
    Inspect {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Replay now into the replay lane (same operation ids; the ledger prevents duplicates).
    Replay {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Entries moved per second.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Also replay scopes whose breaker is not CLOSED.
        #[arg(long)]
        force: bool,
        /// Replay exactly the entries of this breaker incident (as `dlq stats` shows it), in per-recipient
        /// acceptance order, releasing it if replay holds it; prints the incident's report.
        #[arg(long)]
        incident: Option<String>,
    },
    /// Remove entries for good: each ends EXPIRED in the ledger ("purged by operator from dlq").
    Purge {
        #[command(flatten)]
        scope: ScopeArg,
        #[arg(long, default_value_t = usize::MAX, hide_default_value = true)]
        limit: usize,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// Runs one `bwctl dlq` command.
pub(crate) async fn run(
    js: &jetstream::Context,
    buckets: &Buckets,
    cmd: DlqCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    match cmd {
        DlqCommand::Stats(s) => {
            let (items, bad) = inspect::dlq_items(js, buckets.send, s.scope.as_deref()).await?;
            let code = write_stats(out, &inspect::dlq_stats(&items), bad.len())?;
            writeln!(out)?;
            write_incident_stats(js, &items, out).await?;
            Ok(code)
        }
        DlqCommand::Inspect { scope, limit } => {
            let (items, _) = inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?;
            let rows = items
                .iter()
                .take(limit)
                .map(|i| {
                    let e = &i.envelope;
                    let m = masked(&e.request.clone().unwrap_or_default());
                    let code = e.last_error.as_ref().map(|x| x.meta_code.to_string()).unwrap_or_else(|| "-".into());
                    vec![
                        i.sequence.to_string(),
                        m.operation_id,
                        m.phone_number_id,
                        m.recipient,
                        m.category.into(),
                        m.payload,
                        dlq_reason_label(e.reason()).into(),
                        code,
                        e.replay_attempts.to_string(),
                        fmt::utc(e.dead_lettered_at_unix_ms),
                        fmt::utc(e.not_before_unix_ms),
                    ]
                })
                .collect::<Vec<_>>();
            let header = [
                "SEQ",
                "OPERATION",
                "SCOPE",
                "RECIPIENT",
                "CATEGORY",
                "PAYLOAD",
                "REASON",
                "CODE",
                "REPLAYS",
                "DEAD-LETTERED",
                "NOT-BEFORE",
            ];
            write!(out, "{}", fmt::table(&header, &rows))?;
            writeln!(out, "{} of {} shown", rows.len(), items.len())?;
            Ok(0)
        }
        DlqCommand::Replay { scope, limit, rate, force, incident } => {
            anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate must be a positive number");
            if let Some(id) = incident {
                let id = parse_incident(&id)?;
                return replay_incident(js, buckets, &id, scope.scope.as_deref(), rate, force, out).await;
            }
            let states = ops::scope_snapshots(buckets).await?;
            let allow = |phone: &str| {
                force
                    || states
                        .get(phone)
                        .is_some_and(|s| matches!(s.state(), BreakerState::Closed | BreakerState::ForcedClosed))
            };
            let held: Vec<String> =
                inspect::dlq_stats(&inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?.0)
                    .into_iter()
                    .map(|s| s.scope)
                    .filter(|p| !allow(p))
                    .collect();
            for phone in &held {
                writeln!(out, "scope {phone}: breaker not CLOSED; skipped (use --force to replay anyway)")?;
            }
            let mut bar = fmt::ProgressBar::new("replay");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report =
                ops::replay_dlq_now(js, buckets, scope.scope.as_deref(), &allow, limit, rate, &mut progress).await?;
            write_batch(out, &report)
        }
        DlqCommand::Purge { scope, limit, yes } => {
            let n = inspect::dlq_items(js, buckets.send, scope.scope.as_deref()).await?.0.len().min(limit);
            if !confirm(yes, &format!("purge {n} DLQ entries (they end EXPIRED, never sent)"), out)? {
                return Ok(EXIT_ABORTED);
            }
            let mut bar = fmt::ProgressBar::new("purge");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::purge_dlq(js, buckets, scope.scope.as_deref(), limit, &mut progress).await?;
            write_batch(out, &report)
        }
    }
}

/// An incident id as the breaker mints it (`<phone>-<digits>`, or a fallback's `<key>-local-<ms>`): 1 to 128
/// characters of letters, digits, `-`, `_`, `:`.
pub fn parse_incident(id: &str) -> anyhow::Result<String> {
    let id = id.trim();
    anyhow::ensure!(
        !id.is_empty()
            && id.len() <= 128
            && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == ':'),
        "--incident must be an incident id (1 to 128 letters, digits, '-', '_' or ':'), as `bwctl dlq stats` shows it"
    );
    Ok(id.to_string())
}

/// The per-incident table printed after the per-scope one.
pub async fn write_incident_stats(
    js: &jetstream::Context,
    items: &[DlqItem],
    out: &mut (dyn Write + Send),
) -> anyhow::Result<()> {
    // The bucket exists once replay ran; without it nothing is held.
    let progress = match js.get_key_value(bw_wire::names::INCIDENTS_BUCKET).await {
        Ok(_) => Incidents::open(js, 1).await?.list(None).await?,
        Err(_) => Vec::new(),
    };
    let stats = incident::dlq_incident_stats(items, &progress);
    write!(out, "{}", incident_table(&stats, now_ms()))?;
    Ok(())
}

fn incident_table(stats: &[IncidentStats], now: i64) -> String {
    let rows: Vec<Vec<String>> = stats
        .iter()
        .map(|s| {
            let categories = s.categories.iter().map(|(c, n)| format!("{c}={n}")).collect::<Vec<_>>().join(" ");
            vec![
                if s.incident_id.is_empty() { "(none)".into() } else { s.incident_id.clone() },
                s.scope.clone(),
                s.depth.to_string(),
                s.held.to_string(),
                fmt::utc(s.oldest_at_unix_ms),
                fmt::age(if s.oldest_at_unix_ms > 0 { now - s.oldest_at_unix_ms } else { 0 }),
                categories,
            ]
        })
        .collect();
    fmt::table(&["INCIDENT", "SCOPE", "DEPTH", "HELD", "OLDEST", "AGE", "CATEGORIES"], &rows)
}

/// `bwctl dlq replay --incident ID`.
pub async fn replay_incident(
    js: &jetstream::Context,
    buckets: &Buckets,
    incident: &str,
    scope: Option<&str>,
    rate: f64,
    force: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let states = ops::scope_snapshots(buckets).await?;
    let closed = |phone: &str| {
        states.get(phone).is_some_and(|s| matches!(s.state(), BreakerState::Closed | BreakerState::ForcedClosed))
    };
    let (items, _) = bw_ops::inspect::dlq_items(js, buckets.send, scope).await?;
    let selected = incident::incident_entries(items, incident);
    if selected.is_empty() {
        writeln!(out, "incident {incident}: no DLQ entry carries it; nothing replayed")?;
        return Ok(1);
    }
    let mut refused: Vec<&str> = selected.iter().map(|i| bw_wire::names::phone_of_subject(&i.subject)).collect();
    refused.sort_unstable();
    refused.dedup();
    refused.retain(|p| !closed(p));
    if !refused.is_empty() && !force {
        for phone in refused {
            writeln!(out, "scope {phone}: breaker not CLOSED; incident {incident} not replayed (use --force)")?;
        }
        return Ok(1);
    }
    let incidents = Incidents::open(js, 1).await?;
    incident::ensure_event_subjects(js).await?;
    let mut bar = Progress::new("incident replay");
    let mut progress = |d: usize, t: usize| bar.update(d, t);
    let started = Instant::now();
    let select = incident::IncidentSelect { incident, scope, rate_per_s: rate };
    let report = incident::replay_incident(js, buckets, &incidents, select, &closed, &mut progress).await?;
    let took = started.elapsed();
    writeln!(out, "incident {incident}: {} entries in {:.1}s", report.batch.selected, took.as_secs_f64())?;
    let code = write_batch(out, &report.batch)?;
    for e in &report.finished {
        writeln!(
            out,
            "incident {} finished on scope {}: {} messages (replayed {}, expired {}, quarantined {}, other {}) in {}",
            e.incident_id,
            e.phone_number_id,
            e.messages,
            e.replayed,
            e.expired,
            e.quarantined,
            e.other,
            fmt::age(e.took_ms)
        )?;
    }
    Ok(code)
}

/// Progress on stderr: on a terminal one redrawn line (done/total, rate, ETA); otherwise a plain line every
/// few seconds and at the end, so logs of a long run show it moving. Never shows a phone number.
pub struct Progress {
    label: &'static str,
    tty: bool,
    started: Instant,
    last_line: Option<Instant>,
}

/// How often a plain progress line is written when stderr is not a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(5);

impl Progress {
    pub fn new(label: &'static str) -> Progress {
        Progress { label, tty: std::io::stderr().is_terminal(), started: Instant::now(), last_line: None }
    }

    pub fn update(&mut self, done: usize, total: usize) {
        let now = Instant::now();
        let finished = done >= total;
        if !self.tty && !finished && self.last_line.is_some_and(|t| now - t < PLAIN_EVERY) {
            return;
        }
        self.last_line = Some(now);
        let line = progress_line(self.label, done, total, now - self.started);
        let mut err = std::io::stderr();
        let _ = if self.tty {
            write!(err, "\r{line}\x1b[K{}", if finished { "\n" } else { "" })
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }
}

/// `label 40/120 (33%) 12.5/s ETA 6s`.
pub fn progress_line(label: &str, done: usize, total: usize, elapsed: Duration) -> String {
    let pct = (done * 100).checked_div(total).unwrap_or(100);
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { done as f64 / secs } else { 0.0 };
    let eta = if done >= total {
        "done".to_string()
    } else if rate > 0.0 {
        format!("ETA {}", fmt::age((((total - done) as f64 / rate) * 1000.0) as i64))
    } else {
        "ETA ?".to_string()
    };
    format!("{label} {done}/{total} ({pct}%) {rate:.1}/s {eta}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_shows_counts_rate_and_eta() {
        assert_eq!(progress_line("x", 40, 120, Duration::from_secs(4)), "x 40/120 (33%) 10.0/s ETA 8s");
        assert_eq!(progress_line("x", 120, 120, Duration::from_secs(10)), "x 120/120 (100%) 12.0/s done");
        assert_eq!(progress_line("x", 0, 5, Duration::ZERO), "x 0/5 (0%) 0.0/s ETA ?");
    }

    #[test]
    fn incident_ids_are_checked() {
        assert_eq!(parse_incident(" 1001-1700000000123456 ").expect("valid"), "1001-1700000000123456");
        assert!(parse_incident("9:1001-local-17").is_ok());
        for bad in ["", "a b", "x;rm", &"9".repeat(129)] {
            let err = parse_incident(bad).expect_err(bad).to_string();
            assert!(err.contains("--incident"), "{err}");
        }
    }
}
