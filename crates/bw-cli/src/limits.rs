//! `bwctl throughput` and `bwctl template-pace` (issue #36): show and clear what Meta's webhooks set on the send
//! path beyond pauses. A number's stated throughput (`THROUGHPUT_UPGRADE`, `bw_breaker::throughput`: its own
//! hash in the number's slot) raises its rate to the stated limit times the margin; a template's RED quality
//! paces its marketing fleet-wide (`bw_breaker::template_rules`). Clearing the limit makes the number's configured
//! `throughput_mps`, else `rate_per_s`, apply at the next admission; clearing the pace keeps Meta's quality and
//! sets the pace to 0 (not slowed) until Meta reports the template again. Each clear asks for confirmation and is
//! written to the audit stream (`bw_ops::audit`) before and after it runs, as the console's actions are.

use crate::fmt;
use async_nats::jetstream;
use bw_breaker::template_rules::{Rules, TemplateRules};
use bw_breaker::templates::ScopeKey;
use bw_breaker::throughput::{Throughput, ThroughputState};
use bw_breaker::{RedisConn, Scope, ScopeLimits};
use bw_common::nats::Buckets;
use bw_ops::views::mask_digits;
use clap::Subcommand;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum ThroughputCommand {
    /// Meta's stated throughput of a number (from its THROUGHPUT_UPGRADE webhook), when and how it was stated.
    Show(NumberArgs),
    /// Forget it: the number's configured throughput_mps, else rate_per_s, applies again at the next admission.
    Clear {
        #[command(flatten)]
        number: NumberArgs,
        /// Why (ticket, incident); digit runs are masked in the audit stream.
        #[arg(long)]
        reason: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct NumberArgs {
    /// The number's phone_number_id.
    #[arg(long)]
    pub phone: String,
    /// Its WABA; default: the one its BW_SCOPES snapshot names.
    #[arg(long)]
    pub waba: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum TemplatePaceCommand {
    /// Meta's category and quality of a template and the pace of its marketing while RED.
    Show {
        /// The template's scope key, `tpl:<waba_id>:<language>:<name>` (as `bwctl quarantine ls` prints it).
        #[arg(long)]
        template: String,
    },
    /// Stop pacing its marketing (pace 0); Meta's quality stays recorded until Meta reports the template again.
    Clear {
        #[arg(long)]
        template: String,
        /// Why (ticket, incident); digit runs are masked in the audit stream.
        #[arg(long)]
        reason: String,
        /// Do not ask for confirmation.
        #[arg(long)]
        yes: bool,
    },
}

/// How long one Redis command may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The breaker's Redis (a single node, as `--redis-url` gives it).
pub(crate) async fn redis(redis_url: &str) -> anyhow::Result<RedisConn> {
    let conn = bw_common::redis_conn::connect(redis_url, TIMEOUT, Duration::from_secs(5))
        .await
        .map_err(|e| anyhow::anyhow!("the breaker's Redis is unreachable (--redis-url): {e}"))?;
    Ok(RedisConn::Single(conn))
}

/// One line about a number's stated throughput.
pub fn throughput_text(s: &ThroughputState) -> String {
    if s.mps == 0 {
        return "none stated: the configured throughput_mps, else rate_per_s, applies".into();
    }
    let event = if s.event.is_empty() { "stated".to_string() } else { s.event.clone() };
    format!("{} messages/s ({event} at {}): sent at that limit times throughput_margin", s.mps, fmt::utc(s.at_ms))
}

/// One line about a template's pace.
pub fn pace_text(r: &Rules) -> String {
    let quality = if r.quality.is_empty() { "-" } else { r.quality.as_str() };
    let category = if r.category.is_empty() { "-" } else { r.category.as_str() };
    let pace = if r.is_red() {
        format!("marketing paced at {} sends/min fleet-wide", r.red_per_min)
    } else {
        "not paced".to_string()
    };
    format!("quality {quality}, category {category}: {pace}")
}

/// The WABA of `phone`: `--waba`, else its BW_SCOPES snapshot's.
async fn scope_of(buckets: &Buckets, number: &NumberArgs) -> anyhow::Result<Result<Scope, String>> {
    if !number.phone.bytes().all(|b| b.is_ascii_digit()) || number.phone.is_empty() {
        return Ok(Err("--phone is a phone_number_id (digits)".into()));
    }
    if let Some(waba) = &number.waba {
        return Ok(Ok(Scope::new(waba.clone(), number.phone.clone())));
    }
    let snapshots = bw_ops::ops::scope_snapshots(buckets).await?;
    let waba = snapshots
        .into_iter()
        .find(|(phone, _)| *phone == number.phone)
        .and_then(|(_, s)| s.scope.map(|x| x.waba_id))
        .filter(|w| !w.is_empty());
    Ok(waba
        .map(|w| Scope::new(w, number.phone.clone()))
        .ok_or_else(|| format!("no BW_SCOPES snapshot names the WABA of {}: give it with --waba", number.phone)))
}

/// Writes one audit entry of a bwctl action (who: `bwctl:<$USER>`).
async fn audit(
    js: &jetstream::Context,
    action: &str,
    outcome: &str,
    scope: &[(&str, &str)],
    detail: &str,
) -> anyhow::Result<()> {
    let user = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
    let entry = bw_ops::audit::Entry {
        at_unix_ms: bw_common::time::now_ms(),
        who: format!("bwctl:{}", mask_digits(&user)),
        role: "operator".into(),
        action: action.into(),
        outcome: outcome.into(),
        scope: scope.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        detail: detail.into(),
    };
    bw_ops::audit::ensure_stream(js, audit_replicas(js).await).await?;
    bw_ops::audit::write(js, &entry).await
}

/// Replicas of the audit stream when bwctl is the first to write it: the ledger's (the deployment's choice).
async fn audit_replicas(js: &jetstream::Context) -> usize {
    match js.get_stream(format!("KV_{}", bw_wire::names::ledger_bucket(0))).await {
        Ok(mut s) => s.info().await.map(|i| i.config.num_replicas).unwrap_or(1),
        Err(_) => 1,
    }
}

/// `bwctl throughput`.
pub(crate) async fn throughput(
    js: &jetstream::Context,
    buckets: &Buckets,
    redis_url: &str,
    cmd: &ThroughputCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let number = match cmd {
        ThroughputCommand::Show(n) | ThroughputCommand::Clear { number: n, .. } => n,
    };
    let scope = match scope_of(buckets, number).await? {
        Ok(s) => s,
        Err(why) => {
            writeln!(out, "{why}")?;
            return Ok(1);
        }
    };
    // The scripts take the scope's defaults as an argument; the scope's config hash overrides them, and read and
    // clear use neither.
    let tput = Throughput::new(redis(redis_url).await?, TIMEOUT, &ScopeLimits::default());
    let before = tput.read(&scope).await?;
    let ThroughputCommand::Clear { reason, yes, .. } = cmd else {
        writeln!(out, "{} (WABA {}): {}", scope.phone_number_id, scope.waba_id, throughput_text(&before))?;
        return Ok(0);
    };
    if before.mps == 0 {
        writeln!(out, "{}: {}; nothing to clear", scope.phone_number_id, throughput_text(&before))?;
        return Ok(0);
    }
    let what = format!(
        "forget the stated throughput of {} ({} messages/s): its configured rate applies again",
        scope.phone_number_id, before.mps
    );
    if !crate::exit::confirm(*yes, &what, out)? {
        return Ok(crate::exit::EXIT_ABORTED);
    }
    let scope_fields = [("phone_number_id", scope.phone_number_id.as_str()), ("waba_id", scope.waba_id.as_str())];
    let reason = mask_digits(reason);
    audit(js, "throughput_clear", "requested", &scope_fields, &reason).await?;
    match tput.clear(&scope).await {
        Ok(after) => {
            let detail = format!("{reason}; was {} messages/s", before.mps);
            audit(js, "throughput_clear", "done", &scope_fields, &detail).await?;
            writeln!(out, "cleared: {}: {}", scope.phone_number_id, throughput_text(&after))?;
            Ok(0)
        }
        Err(e) => {
            audit(js, "throughput_clear", "failed", &scope_fields, &e.to_string()).await?;
            Err(e.into())
        }
    }
}

/// `bwctl template-pace`.
pub(crate) async fn template_pace(
    js: &jetstream::Context,
    redis_url: &str,
    cmd: &TemplatePaceCommand,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let text = match cmd {
        TemplatePaceCommand::Show { template } | TemplatePaceCommand::Clear { template, .. } => template,
    };
    let key = match ScopeKey::parse(text) {
        Ok(k @ ScopeKey::Template { .. }) => k,
        Ok(_) => {
            writeln!(out, "--template is a template's scope key, `tpl:<waba_id>:<language>:<name>`")?;
            return Ok(1);
        }
        Err(why) => {
            writeln!(out, "{why}")?;
            return Ok(1);
        }
    };
    let rules = TemplateRules::new(redis(redis_url).await?);
    let before = rules.read(&key).await?;
    let TemplatePaceCommand::Clear { reason, yes, .. } = cmd else {
        writeln!(out, "{key}: {}", pace_text(&before))?;
        return Ok(0);
    };
    if !before.is_red() {
        writeln!(out, "{key}: {}; nothing to clear", pace_text(&before))?;
        return Ok(0);
    }
    let what = format!("stop pacing the marketing of {key} ({} sends/min while RED)", before.red_per_min);
    if !crate::exit::confirm(*yes, &what, out)? {
        return Ok(crate::exit::EXIT_ABORTED);
    }
    let scope_key = key.to_string();
    let scope_fields = [("template", scope_key.as_str())];
    let reason = mask_digits(reason);
    audit(js, "template_pace_clear", "requested", &scope_fields, &reason).await?;
    // Meta's quality stays; pace 0 is "not slowed" (`Rules::is_red`), and a later quality update sets it again.
    match rules.set_quality(&key, &before.quality, 0).await {
        Ok(after) => {
            let detail = format!("{reason}; was {} sends/min", before.red_per_min);
            audit(js, "template_pace_clear", "done", &scope_fields, &detail).await?;
            writeln!(out, "cleared: {key}: {}", pace_text(&after))?;
            Ok(0)
        }
        Err(e) => {
            audit(js, "template_pace_clear", "failed", &scope_fields, &e.to_string()).await?;
            Err(e.into())
        }
    }
}

/// SCAN steps `bwctl scopes` takes looking for templates' rules (COUNT 1,000 each: about 100,000 keys looked at on
/// a big Redis); past it the table says it is partial instead of blocking the operator or Redis longer.
const SCAN_STEPS: usize = 100;

/// Templates with rules (`bw:{qs}:rules:<scope key>`), found by a bounded SCAN; true when the cap cut it short.
async fn templates_with_rules(conn: &RedisConn) -> anyhow::Result<(Vec<ScopeKey>, bool)> {
    let RedisConn::Single(manager) = conn else {
        anyhow::bail!("bwctl reads a single Redis node");
    };
    let mut manager = manager.clone();
    let prefix = bw_breaker::template_rules::rules_key(&ScopeKey::Code(0));
    let prefix = prefix.trim_end_matches("code:0");
    let (mut cursor, mut found) = (0u64, Vec::new());
    for _ in 0..SCAN_STEPS {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}tpl:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut manager)
            .await?;
        found.extend(keys.iter().filter_map(|k| ScopeKey::parse(k.strip_prefix(prefix)?).ok()));
        if next == 0 {
            return Ok((found, false));
        }
        cursor = next;
    }
    Ok((found, true))
}

/// The tables `bwctl scopes` ends with: numbers with a stated throughput, templates paced while RED. A Redis it
/// cannot reach is said, not fatal.
pub(crate) async fn show_all(redis_url: &str, scopes: &[Scope], out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let conn = match redis(redis_url).await {
        Ok(c) => c,
        Err(e) => {
            writeln!(out, "\nstated throughput and template paces: {e}")?;
            return Ok(());
        }
    };
    let tput = Throughput::new(conn.clone(), TIMEOUT, &ScopeLimits::default());
    let mut rows = Vec::new();
    for scope in scopes {
        let s = tput.read(scope).await?;
        if s.mps > 0 {
            rows.push(vec![
                scope.phone_number_id.clone(),
                scope.waba_id.clone(),
                s.mps.to_string(),
                if s.event.is_empty() { "-".into() } else { s.event.clone() },
                fmt::utc(s.at_ms),
            ]);
        }
    }
    if !rows.is_empty() {
        writeln!(out)?;
        write!(out, "{}", fmt::table(&["SCOPE", "WABA", "STATED-MPS", "EVENT", "SINCE"], &rows))?;
    }
    let rules = TemplateRules::new(conn.clone());
    let (templates, partial) = templates_with_rules(&conn).await?;
    let mut rows = Vec::new();
    for key in templates {
        let r = rules.read(&key).await?;
        if r.is_red() {
            rows.push(vec![key.to_string(), r.quality.clone(), r.category.clone(), r.red_per_min.to_string()]);
        }
    }
    rows.sort();
    if !rows.is_empty() {
        writeln!(out)?;
        write!(out, "{}", fmt::table(&["TEMPLATE", "QUALITY", "CATEGORY", "PACE-PER-MIN"], &rows))?;
    }
    if partial {
        writeln!(out, "(template paces: the first {SCAN_STEPS} SCAN steps only; `bwctl template-pace show` for one)")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_say_what_applies() {
        assert!(throughput_text(&ThroughputState::default()).contains("configured throughput_mps"));
        let s = ThroughputState {
            mps: 1000,
            at_ms: 1_796_118_258_268,
            event: "THROUGHPUT_UPGRADE".into(),
            ..Default::default()
        };
        assert!(
            throughput_text(&s).starts_with("1000 messages/s (THROUGHPUT_UPGRADE at 20"),
            "{}",
            throughput_text(&s)
        );
        let red = Rules { category: "MARKETING".into(), quality: "RED".into(), red_per_min: 6 };
        assert_eq!(pace_text(&red), "quality RED, category MARKETING: marketing paced at 6 sends/min fleet-wide");
        assert!(pace_text(&Rules { red_per_min: 0, ..red }).ends_with("not paced"));
    }
}
