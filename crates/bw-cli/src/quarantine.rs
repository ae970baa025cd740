//! `bwctl quarantine`: per-scope statistics, masked inspection, replay now and purge of chosen entries, and the
//! quarantine scopes (a template held by 132001 / 132007 / 132015 / 132016, or an unclassified code): `ls`, and the
//! operator's release or drop of a whole scope (`bw_ops::quarantine`). Scope keys name a template or a code, never
//! a phone number.

use crate::exit::{EXIT_ABORTED, confirm};
use crate::fmt::{self, write_batch};
use crate::stats::{ScopeArg, write_stats};
use anyhow::Context as _;
use async_nats::jetstream;
use bw_breaker::templates::{ScopeKey, TemplateHolds};
use bw_common::nats::Buckets;
use bw_common::time::now_ms;
use bw_ops::inspect::{self, masked, quarantine_reason_label};
use bw_ops::ops::{self, QuarantineFilter};
use clap::{Args, Subcommand};
use std::io::Write;

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Depth, oldest age and reasons per scope.
    Stats(ScopeArg),
    /// Quarantine scopes (a held template, an unclassified code): messages, code, age, and the hold.
    Ls,
    /// Lift a scope's hold and re-queue each of its held messages once.
    Release {
        /// The scope key as `ls` prints it: `tpl:<waba_id>:<language>:<name>` or `code:<code>`.
        #[arg(long)]
        scope: String,
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
    },
    /// End every message held under a scope FAILED, never sent, with the reason in its ledger entry.
    Drop {
        /// The scope key as `ls` prints it.
        #[arg(long)]
        scope: String,
        /// Why (kept in each message's ledger entry, shown to its producer).
        #[arg(long)]
        reason: String,
        #[arg(long)]
        yes: bool,
    },
    /// Entries, personal data masked.
    Inspect {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Replay now into the replay lane (the replay limit does not apply; deadline and 24 h window do).
    Replay {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
    },
    /// Remove entries for good: each ends EXPIRED in the ledger ("purged by operator from quarantined").
    Purge {
        #[command(flatten)]
        select: QuarantineSelect,
        #[arg(long, default_value_t = usize::MAX, hide_default_value = true)]
        limit: usize,
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, Args, Clone, Default)]
pub struct QuarantineSelect {
    #[arg(long)]
    pub scope: Option<String>,
    /// permanent_error, poison, unknown_review, window_closed, operator, sender_revoked.
    #[arg(long)]
    pub reason: Option<String>,
    /// Operation ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub ids: Vec<String>,
}

impl QuarantineSelect {
    fn filter(&self) -> anyhow::Result<QuarantineFilter> {
        let reason = match &self.reason {
            Some(label) => Some(
                inspect::parse_quarantine_reason(label)
                    .with_context(|| format!("unknown quarantine reason `{label}`"))?,
            ),
            None => None,
        };
        Ok(QuarantineFilter { scope: self.scope.clone(), reason, operation_ids: self.ids.clone() })
    }
}

/// Runs one `bwctl quarantine` command; `redis_url` is the breaker's Redis, where template holds live.
pub(crate) async fn run(
    js: &jetstream::Context,
    buckets: &Buckets,
    redis_url: &str,
    cmd: QuarantineCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    match cmd {
        QuarantineCommand::Stats(s) => {
            let (items, bad) = inspect::quarantine_items(js, s.scope.as_deref()).await?;
            write_stats(out, &inspect::quarantine_stats(&items), bad.len())
        }
        QuarantineCommand::Inspect { select, limit } => {
            let filter = select.filter()?;
            let (items, _) = inspect::quarantine_items(js, filter.scope.as_deref()).await?;
            let rows = items
                .iter()
                .filter(|i| filter.reason.is_none_or(|r| i.entry.reason() == r))
                .filter(|i| {
                    filter.operation_ids.is_empty()
                        || filter
                            .operation_ids
                            .iter()
                            .any(|id| i.entry.request.as_ref().is_some_and(|r| &r.operation_id == id))
                })
                .take(limit)
                .map(|i| {
                    let m = masked(&i.entry.request.clone().unwrap_or_default());
                    let code = i.entry.error.as_ref().map(|x| x.meta_code.to_string()).unwrap_or_else(|| "-".into());
                    vec![
                        i.sequence.to_string(),
                        m.operation_id,
                        m.phone_number_id,
                        m.recipient,
                        m.category.into(),
                        m.payload,
                        quarantine_reason_label(i.entry.reason()).into(),
                        code,
                        i.entry.detail.clone(),
                        fmt::utc(i.entry.quarantined_at_unix_ms),
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
                "DETAIL",
                "QUARANTINED",
            ];
            write!(out, "{}", fmt::table(&header, &rows))?;
            writeln!(out, "{} of {} shown", rows.len(), items.len())?;
            Ok(0)
        }
        QuarantineCommand::Ls => ls(js, redis_url, out).await,
        QuarantineCommand::Release { scope, rate } => release(js, buckets, redis_url, &scope, rate, out).await,
        QuarantineCommand::Drop { scope, reason, yes } => drop(js, buckets, &scope, &reason, yes, out).await,
        QuarantineCommand::Replay { select, limit, rate } => {
            anyhow::ensure!(rate > 0.0, "--rate must be positive");
            let filter = select.filter()?;
            let mut bar = fmt::ProgressBar::new("replay");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::replay_quarantine_now(js, buckets, &filter, limit, rate, &mut progress).await?;
            write_batch(out, &report)
        }
        QuarantineCommand::Purge { select, limit, yes } => {
            let filter = select.filter()?;
            let (items, _) = inspect::quarantine_items(js, filter.scope.as_deref()).await?;
            let n = items.iter().filter(|i| filter.reason.is_none_or(|r| i.entry.reason() == r)).count().min(limit);
            if !confirm(yes, &format!("purge up to {n} quarantine entries (they end EXPIRED, never sent)"), out)? {
                return Ok(EXIT_ABORTED);
            }
            let mut bar = fmt::ProgressBar::new("purge");
            let mut progress = |d: usize, t: usize| bar.update(d, t);
            let report = ops::purge_quarantine(js, buckets, &filter, limit, &mut progress).await?;
            write_batch(out, &report)
        }
    }
}

/// Parses `--scope` with a precise error that never echoes the text (it may be a mistyped phone number).
pub fn parse_scope(text: &str) -> anyhow::Result<ScopeKey> {
    ScopeKey::parse(text).map_err(|e| anyhow::anyhow!("--scope: {e}"))
}

async fn holds(redis_url: &str) -> anyhow::Result<TemplateHolds> {
    let conn =
        bw_common::redis_conn::connect(redis_url, std::time::Duration::from_secs(2), std::time::Duration::from_secs(5))
            .await
            .context("the template holds live in the breaker's Redis (--redis-url / BW_REDIS_URL)")?;
    Ok(TemplateHolds::new(bw_breaker::RedisConn::Single(conn)))
}

/// `bwctl quarantine ls`: every scope with held messages, and whether its hold is in force.
pub async fn ls(js: &jetstream::Context, redis_url: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let scopes = bw_ops::quarantine::scopes(js).await?;
    if scopes.is_empty() {
        writeln!(out, "no quarantine scope holds messages")?;
        return Ok(0);
    }
    let holds = holds(redis_url).await.ok();
    let now = now_ms();
    let mut rows = Vec::new();
    for s in &scopes {
        let hold = match (&holds, ScopeKey::parse(&s.scope_key)) {
            (Some(h), Ok(key)) if key.is_template() => match h.read(&key).await {
                Ok(Some(hold)) if hold.until_ms > 0 => format!("held {} more", fmt::age(hold.until_ms - now)),
                Ok(Some(_)) => "held until released".to_string(),
                Ok(None) => "not held (release to send)".to_string(),
                Err(_) => "unknown (redis)".to_string(),
            },
            (None, Ok(key)) if key.is_template() => "unknown (redis)".to_string(),
            _ => "-".to_string(),
        };
        rows.push(vec![
            s.scope_key.clone(),
            s.reason.to_string(),
            s.meta_code.to_string(),
            s.entries.to_string(),
            fmt::age(now - s.oldest_unix_ms),
            hold,
        ]);
    }
    write!(out, "{}", fmt::table(&["SCOPE", "REASON", "CODE", "MESSAGES", "OLDEST", "HOLD"], &rows))?;
    Ok(0)
}

/// `bwctl quarantine release --scope KEY`: lifts the hold and re-queues each held message once.
pub async fn release(
    js: &jetstream::Context,
    buckets: &Buckets,
    redis_url: &str,
    scope: &str,
    rate: f64,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    anyhow::ensure!(rate > 0.0, "--rate must be positive");
    let key = parse_scope(scope)?;
    let shown = key.to_string();
    let entries = bw_ops::quarantine::scopes(js).await?.iter().find(|s| s.scope_key == shown).map_or(0, |s| s.entries);
    let holds = if key.is_template() { Some(holds(redis_url).await?) } else { None };
    let held = match &holds {
        Some(h) => h.read(&key).await.context("reading the scope's hold")?.is_some(),
        None => false,
    };
    if entries == 0 && !held {
        anyhow::bail!("no quarantine scope {shown}: nothing is held under it (see `bwctl quarantine ls`)");
    }
    let lift = async {
        match &holds {
            Some(h) => h.release_everywhere(&key).await.map(|was| was.is_some()).map_err(|e| e.to_string()),
            None => Ok(false),
        }
    };
    let mut bar = fmt::ProgressBar::new("release");
    let mut progress = |d: usize, t: usize| bar.update(d, t);
    let released = bw_ops::quarantine::release_scope(js, buckets, &shown, lift, rate, &mut progress).await?;
    writeln!(
        out,
        "scope {shown}: hold {}; {} pass(es) over the quarantine",
        if released.hold_lifted { "lifted" } else { "was not in force" },
        released.passes
    )?;
    write_batch(out, &released.report)
}

/// `bwctl quarantine drop --scope KEY --reason ...`: every held message ends FAILED with the reason.
pub async fn drop(
    js: &jetstream::Context,
    buckets: &Buckets,
    scope: &str,
    reason: &str,
    yes: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let key = parse_scope(scope)?;
    let reason = reason.trim();
    anyhow::ensure!(
        !reason.is_empty() && reason.len() <= 200 && !reason.chars().any(char::is_control),
        "--reason must be 1 to 200 printable characters (it goes into each message's ledger entry)"
    );
    let shown = key.to_string();
    let entries = bw_ops::quarantine::scopes(js).await?.iter().find(|s| s.scope_key == shown).map_or(0, |s| s.entries);
    if entries == 0 {
        anyhow::bail!("no quarantine scope {shown}: no message is held under it (see `bwctl quarantine ls`)");
    }
    if !confirm(yes, &format!("end {entries} messages of scope {shown} FAILED (never sent)"), out)? {
        return Ok(EXIT_ABORTED);
    }
    let mut bar = fmt::ProgressBar::new("drop");
    let mut progress = |d: usize, t: usize| bar.update(d, t);
    let report = bw_ops::quarantine::drop_scope(js, buckets, &shown, reason, &mut progress).await?;
    write_batch(out, &report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_keys_are_refused_precisely_without_echoing_them() {
        assert!(parse_scope("tpl:100:en_US:promo").is_ok());
        assert!(parse_scope("code:424242").is_ok());
        for bad in ["+5491155551234", "5491155551234", "tpl:100:en_US", "code:abc", "template:promo"] {
            let err = parse_scope(bad).expect_err(bad).to_string();
            assert!(err.starts_with("--scope: ") && err.contains("scope key"), "{err}");
            assert!(!err.contains("5491155551234"), "never echoed: {err}");
        }
    }
}
