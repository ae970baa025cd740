//! Notification payloads for the three sink styles, and delivery with bounded retries.
//!
//! Payloads are built as `serde_json::Value` from the proto [`Alert`]: a generic JSON webhook, a Slack-style
//! incoming webhook (`text` + `blocks`), and a PagerDuty Events v2 style event (`routing_key`, `event_action`,
//! `dedup_key`, `payload{summary, source, severity, timestamp, custom_details}`). Sink URLs and the routing key
//! may be secrets and are never logged.

use crate::config::DeliveryConfig;
use crate::metrics::{Metrics, labels};
use crate::model::severity_word;
use bw_common::time::Tz;
use bw_common::time::{format_local, format_utc, rfc3339_ms as rfc3339};
use bw_proto::v1::{Alert, AlertStatus};
use serde_json::{Value, json};
use std::time::Duration;

/// What happened to an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    Fired,
    Escalated,
    Resolved,
}

impl Event {
    pub(crate) fn word(self) -> &'static str {
        match self {
            Event::Fired => "fired",
            Event::Escalated => "escalated",
            Event::Resolved => "resolved",
        }
    }
}

/// A storm digest: many alerts of one rule within one interval, sent as one notification.
#[derive(Debug, Clone)]
pub(crate) struct Digest {
    pub rule: String,
    /// Storm dedup key of the rule (`storm.<rule>`).
    pub dedup_key: String,
    pub severity: i32,
    pub runbook_url: String,
    pub fired: usize,
    pub resolved: usize,
    pub escalated: usize,
    /// Up to `digest_max_listed` scopes, for the reader.
    pub listed_scopes: Vec<String>,
    pub interval_ms: u64,
    pub at_unix_ms: i64,
}

/// One notification to render for every sink.
#[derive(Debug, Clone)]
pub(crate) enum Notice {
    Alert { alert: Alert, event: Event, at_unix_ms: i64 },
    Digest(Digest),
}

/// Settings shared by the renderers.
#[derive(Debug, Clone)]
pub(crate) struct RenderContext {
    pub zone: Tz,
    pub source: String,
}

fn times(ctx: &RenderContext, unix_ms: i64) -> Value {
    if unix_ms <= 0 {
        return Value::Null;
    }
    json!({ "unix_ms": unix_ms, "utc": format_utc(unix_ms), "local": format_local(unix_ms, ctx.zone) })
}

fn status_word(alert: &Alert) -> &'static str {
    if alert.status == AlertStatus::Resolved as i32 { "resolved" } else { "firing" }
}

/// Generic JSON webhook body.
pub(crate) fn generic(ctx: &RenderContext, notice: &Notice) -> Value {
    match notice {
        Notice::Alert { alert, event, at_unix_ms } => json!({
            "kind": "alert",
            "event": event.word(),
            "status": status_word(alert),
            "dedup_key": alert.dedup_key,
            "rule": alert.rule,
            "severity": severity_word(alert.severity),
            "scope": alert.scope,
            "summary": alert.summary,
            "runbook_url": alert.runbook_url,
            "source": ctx.source,
            "at": times(ctx, *at_unix_ms),
            "started_at": times(ctx, alert.started_at_unix_ms),
            "resolved_at": times(ctx, alert.resolved_at_unix_ms),
            "labels": alert.labels,
        }),
        Notice::Digest(d) => json!({
            "kind": "digest",
            "event": "digest",
            "dedup_key": d.dedup_key,
            "rule": d.rule,
            "severity": severity_word(d.severity),
            "summary": digest_summary(d),
            "fired": d.fired,
            "escalated": d.escalated,
            "resolved": d.resolved,
            "scopes": d.listed_scopes,
            "interval_s": d.interval_ms / 1000,
            "runbook_url": d.runbook_url,
            "source": ctx.source,
            "at": times(ctx, d.at_unix_ms),
        }),
    }
}

fn digest_summary(d: &Digest) -> String {
    format!(
        "{}: {} fired, {} escalated, {} resolved in the last {} s (grouped to avoid an alert storm)",
        d.rule,
        d.fired,
        d.escalated,
        d.resolved,
        d.interval_ms / 1000
    )
}

fn headline(alert: &Alert, event: Event) -> String {
    let icon = match (event, alert.severity) {
        (Event::Resolved, _) => "RESOLVED",
        (_, 3) => "CRITICAL",
        (_, 2) => "WARNING",
        _ => "INFO",
    };
    let scope = if alert.scope.is_empty() { "fleet" } else { alert.scope.as_str() };
    format!("[{icon}] {} ({scope})", alert.rule)
}

/// Slack-style incoming webhook body.
pub(crate) fn slack(ctx: &RenderContext, notice: &Notice) -> Value {
    match notice {
        Notice::Alert { alert, event, at_unix_ms } => {
            let head = headline(alert, *event);
            let mut lines = vec![
                format!("*{}*", alert.summary),
                format!("*Scope:* {}", if alert.scope.is_empty() { "fleet" } else { &alert.scope }),
                format!("*Severity:* {}", severity_word(alert.severity)),
                format!(
                    "*Started:* {} / {}",
                    format_utc(alert.started_at_unix_ms),
                    format_local(alert.started_at_unix_ms, ctx.zone)
                ),
            ];
            if alert.status == AlertStatus::Resolved as i32 {
                lines.push(format!(
                    "*Resolved:* {} / {}",
                    format_utc(alert.resolved_at_unix_ms),
                    format_local(alert.resolved_at_unix_ms, ctx.zone)
                ));
            } else if *event == Event::Escalated {
                lines.push(format!("*Escalated:* {}", format_local(*at_unix_ms, ctx.zone)));
            }
            json!({
                "text": format!("{head}: {}", alert.summary),
                "blocks": [
                    { "type": "header", "text": { "type": "plain_text", "text": head } },
                    { "type": "section", "text": { "type": "mrkdwn", "text": lines.join("\n") } },
                    { "type": "context", "elements": [
                        { "type": "mrkdwn", "text": format!("Runbook: {} | key `{}`", alert.runbook_url, alert.dedup_key) }
                    ] }
                ]
            })
        }
        Notice::Digest(d) => {
            let summary = digest_summary(d);
            let mut scopes = d.listed_scopes.join(", ");
            let total = d.fired + d.escalated + d.resolved;
            if total > d.listed_scopes.len() {
                scopes.push_str(&format!(" (+{} more)", total - d.listed_scopes.len()));
            }
            json!({
                "text": format!("[DIGEST] {summary}"),
                "blocks": [
                    { "type": "header", "text": { "type": "plain_text", "text": format!("[DIGEST] {}", d.rule) } },
                    { "type": "section", "text": { "type": "mrkdwn", "text": format!(
                        "*{summary}*\n*Scopes:* {scopes}\n*At:* {} / {}",
                        format_utc(d.at_unix_ms), format_local(d.at_unix_ms, ctx.zone)) } },
                    { "type": "context", "elements": [ { "type": "mrkdwn", "text": format!("Runbook: {}", d.runbook_url) } ] }
                ]
            })
        }
    }
}

/// PagerDuty Events v2 style body.
pub(crate) fn pagerduty(ctx: &RenderContext, routing_key: &str, notice: &Notice) -> Value {
    match notice {
        Notice::Alert { alert, event, at_unix_ms } => {
            let action = if alert.status == AlertStatus::Resolved as i32 { "resolve" } else { "trigger" };
            json!({
                "routing_key": routing_key,
                "event_action": action,
                "dedup_key": alert.dedup_key,
                "payload": {
                    "summary": headline(alert, *event) + ": " + &alert.summary,
                    "source": ctx.source,
                    "severity": severity_word(alert.severity),
                    "timestamp": rfc3339(*at_unix_ms),
                    "component": alert.scope,
                    "group": alert.rule,
                    "custom_details": {
                        "rule": alert.rule,
                        "scope": alert.scope,
                        "event": event.word(),
                        "started_at_utc": format_utc(alert.started_at_unix_ms),
                        "started_at_local": format_local(alert.started_at_unix_ms, ctx.zone),
                        "runbook_url": alert.runbook_url,
                        "labels": alert.labels,
                    }
                },
                "links": [ { "href": alert.runbook_url, "text": "Runbook" } ]
            })
        }
        Notice::Digest(d) => json!({
            "routing_key": routing_key,
            "event_action": "trigger",
            "dedup_key": d.dedup_key,
            "payload": {
                "summary": digest_summary(d),
                "source": ctx.source,
                "severity": severity_word(d.severity),
                "timestamp": rfc3339(d.at_unix_ms),
                "group": d.rule,
                "custom_details": {
                    "fired": d.fired, "escalated": d.escalated, "resolved": d.resolved,
                    "scopes": d.listed_scopes, "at_local": format_local(d.at_unix_ms, ctx.zone),
                    "runbook_url": d.runbook_url,
                }
            },
            "links": [ { "href": d.runbook_url, "text": "Runbook" } ]
        }),
    }
}

/// Which style a sink speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SinkKind {
    Webhook,
    Slack,
    PagerDuty,
}

impl SinkKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            SinkKind::Webhook => "webhook",
            SinkKind::Slack => "slack",
            SinkKind::PagerDuty => "pagerduty",
        }
    }
}

/// Why one delivery try failed.
#[derive(Debug, thiserror::Error)]
enum TryError {
    #[error("sink answered {0}")]
    Status(u16),
    #[error("sink unreachable: {0}")]
    Transport(String),
}

impl TryError {
    /// 4xx other than 408/429 mean the payload is refused: retrying the same body cannot help.
    fn retryable(&self) -> bool {
        match self {
            TryError::Status(code) => *code >= 500 || *code == 408 || *code == 429,
            TryError::Transport(_) => true,
        }
    }
}

/// Posts `body` to `url`, retrying with exponential backoff up to `cfg.max_attempts` tries. Returns whether
/// the sink accepted it.
pub(crate) async fn deliver(
    http: &reqwest::Client,
    kind: SinkKind,
    url: &str,
    body: &Value,
    cfg: &DeliveryConfig,
    metrics: &Metrics,
) -> bool {
    let sink = labels([("sink", kind.name())]);
    let mut delay = Duration::from_millis(cfg.backoff_base_ms.max(1));
    for attempt in 1..=cfg.max_attempts {
        let result =
            http.post(url)
                .timeout(Duration::from_millis(cfg.timeout_ms))
                .json(body)
                .send()
                .await
                .map_err(|e| TryError::Transport(e.without_url().to_string()))
                .and_then(|resp| {
                    if resp.status().is_success() { Ok(()) } else { Err(TryError::Status(resp.status().as_u16())) }
                });
        match result {
            Ok(()) => return true,
            Err(e) if e.retryable() && attempt < cfg.max_attempts => {
                metrics.sink_retries.get_or_create(&sink).inc();
                tracing::warn!(sink = kind.name(), attempt, error = %e, "sink delivery failed; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_millis(cfg.backoff_cap_ms.max(1)));
            }
            Err(e) => {
                metrics.sink_failures.get_or_create(&sink).inc();
                tracing::error!(sink = kind.name(), attempt, error = %e, "sink delivery gave up");
                return false;
            }
        }
    }
    false
}
