//! Turns observations into alert changes: breaker transitions and signals from BW_EVENTS, and conditions the
//! poller finds. Every change goes through the CAS state ([`StateStore`]); only the winner publishes the
//! [`Alert`] on `bw.alert.v1.<rule>` and notifies.

use crate::display::runbook_url;
use crate::metrics::{Metrics, labels};
use crate::model::{Firing, Rule, dedup_key};
use crate::notify::{Notifier, StormGate};
use crate::sinks::Event;
use crate::state::{Change, StateError, StateStore};
use async_nats::jetstream;
use bw_proto::v1::{Alert, BreakerState, BreakerTransition, Severity, Signal};
use bw_wire::names;
use prost::Message;
use std::sync::Arc;

/// Shared handles of the engine (cheap to clone).
#[derive(Clone)]
pub(crate) struct Engine {
    pub store: StateStore,
    pub gate: Arc<StormGate>,
    pub notifier: Notifier,
    pub metrics: Metrics,
    pub js: jetstream::Context,
    pub runbook_base: String,
    pub touch_every_ms: i64,
    pub quota_warning_percent: f64,
    pub quota_critical_percent: f64,
}

/// Why an event could not be handled.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EventError {
    /// The payload is not what the subject promises; retrying cannot help.
    #[error("undecodable {what} on `{subject}`: {detail}")]
    Malformed { what: &'static str, subject: String, detail: String },
    /// State unavailable; retry later.
    #[error(transparent)]
    State(#[from] StateError),
}

fn scope_label(waba: &str, phone: &str) -> String {
    match (waba.is_empty(), phone.is_empty()) {
        (_, true) => waba.to_string(),
        (true, false) => phone.to_string(),
        (false, false) => format!("{waba}/{phone}"),
    }
}

impl Engine {
    /// Fires `f` (idempotent) and notifies if this instance won.
    pub(crate) async fn fire(&self, f: Firing) -> Result<(), StateError> {
        let now = bw_common::time::now_ms();
        let url = runbook_url(&self.runbook_base, f.rule.runbook());
        // The storm budget is taken only when a new firing is written, not when a firing alert is seen again.
        let gate = self.gate.clone();
        let rule = f.rule;
        let admit = move || gate.admit(rule, now);
        let change = self.store.fire(&f, &admit, &url, now, self.touch_every_ms).await?;
        self.apply(f.rule, change, now).await;
        Ok(())
    }

    /// Raises a firing alert's severity.
    pub(crate) async fn escalate(
        &self,
        rule: Rule,
        key: &str,
        severity: Severity,
        summary: &str,
    ) -> Result<(), StateError> {
        let change = self.store.escalate(key, severity, summary).await?;
        self.apply(rule, change, bw_common::time::now_ms()).await;
        Ok(())
    }

    /// Resolves `key` as of `at_ms` and notifies if this instance won.
    pub(crate) async fn resolve(&self, rule: Rule, key: &str, at_ms: i64, tombstone: bool) -> Result<(), StateError> {
        let change = self.store.resolve(key, at_ms, tombstone).await?;
        self.apply(rule, change, at_ms).await;
        Ok(())
    }

    async fn apply(&self, rule: Rule, change: Change, at_ms: i64) {
        let (state, event) = match change {
            Change::Fired(s) => (s, Event::Fired),
            Change::Escalated(s) => (s, Event::Escalated),
            Change::Resolved(s) => (s, Event::Resolved),
            Change::Unchanged => return,
        };
        let Some(alert) = state.alert else { return };
        let rule_label = labels([("rule", rule.name())]);
        match event {
            Event::Fired => {
                let severity = crate::model::severity_word(alert.severity);
                self.metrics.fired.get_or_create(&labels([("rule", rule.name()), ("severity", severity)])).inc();
            }
            Event::Escalated => {
                self.metrics.escalated.get_or_create(&rule_label).inc();
            }
            Event::Resolved => {
                self.metrics.resolved.get_or_create(&rule_label).inc();
            }
        }
        tracing::info!(rule = rule.name(), dedup_key = %alert.dedup_key, event = event.word(), "alert changed");
        self.publish(&alert, event).await;
        if state.individual {
            self.notifier.individual(alert, event, at_ms).await;
        } else {
            self.notifier.digested(rule, alert, event).await;
        }
    }

    async fn publish(&self, alert: &Alert, event: Event) {
        let mut headers = async_nats::HeaderMap::new();
        let msg_id = format!("{}:{}:{}:{}", alert.dedup_key, event.word(), alert.started_at_unix_ms, alert.severity);
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        bw_wire::trace::inject(&tracing::Span::current(), &mut headers);
        let subject = names::alert_subject(&alert.rule);
        let payload = bytes::Bytes::from(alert.encode_to_vec());
        if let Err(e) = bw_common::nats::publish_durable(&self.js, subject, headers, payload).await {
            // The sinks still get it; the NATS copy is informational.
            tracing::warn!(dedup_key = %alert.dedup_key, error = %e, "cannot publish alert");
        }
    }

    /// Handles one breaker transition.
    pub(crate) async fn on_breaker(&self, subject: &str, payload: &[u8]) -> Result<(), EventError> {
        let t = BreakerTransition::decode(payload).map_err(|e| EventError::Malformed {
            what: "BreakerTransition",
            subject: subject.into(),
            detail: e.to_string(),
        })?;
        let scope = t.scope.clone().unwrap_or_default();
        let phone = if scope.phone_number_id.is_empty() {
            subject.rsplit('.').next().unwrap_or_default().to_string()
        } else {
            scope.phone_number_id.clone()
        };
        let scope_text = scope_label(&scope.waba_id, &phone);
        let key = dedup_key(Rule::BreakerOpen, &phone);
        let to = BreakerState::try_from(t.to).unwrap_or(BreakerState::Unspecified);
        match to {
            BreakerState::Open | BreakerState::ForcedOpen => {
                let forced = to == BreakerState::ForcedOpen;
                let mut labels = vec![
                    ("incident_id".to_string(), t.incident_id.clone()),
                    ("reason".to_string(), t.reason.clone()),
                    ("failure_rate".to_string(), format!("{:.3}", t.failure_rate)),
                    ("calls_in_window".to_string(), t.calls_in_window.to_string()),
                    ("forced".to_string(), forced.to_string()),
                ];
                if t.open_until_unix_ms > 0 {
                    labels.push(("open_until_unix_ms".into(), t.open_until_unix_ms.to_string()));
                }
                let summary = if forced {
                    format!("breaker FORCED OPEN by an operator for sender {scope_text}: {}", t.reason)
                } else {
                    format!(
                        "breaker OPEN for sender {scope_text}: {} (failure rate {:.0}% over {} calls); sends go to the DLQ",
                        t.reason,
                        t.failure_rate * 100.0,
                        t.calls_in_window
                    )
                };
                let severity = if forced { Severity::Info } else { Severity::Warning };
                self.fire(Firing {
                    rule: Rule::BreakerOpen,
                    target: phone,
                    scope: scope_text,
                    severity,
                    summary,
                    at_unix_ms: t.at_unix_ms,
                    labels,
                })
                .await?;
            }
            BreakerState::Closed | BreakerState::ForcedClosed => {
                self.resolve(Rule::BreakerOpen, &key, t.at_unix_ms, true).await?;
            }
            // HALF_OPEN keeps the alert firing: the scope is probing, not healthy yet.
            BreakerState::HalfOpen | BreakerState::Unspecified => {}
        }
        Ok(())
    }

    /// Handles one signal.
    pub(crate) async fn on_signal(&self, subject: &str, payload: &[u8]) -> Result<(), EventError> {
        let s = Signal::decode(payload).map_err(|e| EventError::Malformed {
            what: "Signal",
            subject: subject.into(),
            detail: e.to_string(),
        })?;
        let target = if s.phone_number_id.is_empty() { s.waba_id.clone() } else { s.phone_number_id.clone() };
        let scope = scope_label(&s.waba_id, &s.phone_number_id);
        let shown = if scope.is_empty() { "fleet".to_string() } else { scope.clone() };
        let mut labels = vec![("kind".to_string(), s.kind.clone()), ("detail".to_string(), s.detail.clone())];
        if s.meta_code != 0 {
            labels.push(("meta_code".into(), s.meta_code.to_string()));
        }
        let at = if s.at_unix_ms > 0 { s.at_unix_ms } else { bw_common::time::now_ms() };
        let (rule, severity, summary) = match s.kind.as_str() {
            "credentials" => (
                Rule::CredentialsInvalid,
                Severity::Critical,
                format!(
                    "Meta refused {shown} for its token, WABA or number (code {}); that scope is paused",
                    s.meta_code
                ),
            ),
            "poison" => (
                Rule::PoisonMessages,
                Severity::Warning,
                format!("replay gave up on a message of {shown}; it is quarantined for a human"),
            ),
            "status_error" => (
                Rule::StatusErrors,
                Severity::Warning,
                format!("Meta reported failed deliveries for {shown} (code {})", s.meta_code),
            ),
            "dlq_limit" => (Rule::DlqLimit, Severity::Critical, format!("DLQ limit reached for {shown}: {}", s.detail)),
            "quarantine_scope" => {
                // One alert per quarantine scope (a template or a code), never per number or recipient.
                let Some(key) = quarantine_scope_of(&s.detail) else {
                    return Err(EventError::Malformed {
                        what: "quarantine_scope Signal",
                        subject: subject.into(),
                        detail: "no scope key in detail".into(),
                    });
                };
                labels.push(("scope_key".into(), key.clone()));
                let summary = format!(
                    "messages held in quarantine scope {key} (Meta code {}): held until released or dropped",
                    s.meta_code
                );
                let firing = Firing {
                    rule: Rule::QuarantineScope,
                    target: key.clone(),
                    scope: key,
                    severity: Severity::Warning,
                    summary,
                    at_unix_ms: at,
                    labels,
                };
                self.fire(firing).await?;
                return Ok(());
            }
            // Meta's account signals, applied by the coordinator (deploy/runbooks/account-signals.md).
            "account_restricted" => (
                Rule::AccountRestricted,
                Severity::Critical,
                format!("Meta restricted {shown}; its numbers are held: {}", s.detail),
            ),
            "account_alert" => {
                (Rule::AccountAlert, Severity::Warning, format!("Meta says about {shown}: {}", s.detail))
            }
            "quota" => {
                let Some(percent) = parse_percent(&s.detail) else {
                    return Err(EventError::Malformed {
                        what: "quota Signal",
                        subject: subject.into(),
                        detail: "no usage percent in detail".into(),
                    });
                };
                labels.push(("usage_percent".into(), format!("{percent:.1}")));
                if percent < self.quota_warning_percent {
                    self.resolve(Rule::QuotaUsage, &dedup_key(Rule::QuotaUsage, &target), at, false).await?;
                    return Ok(());
                }
                let severity =
                    if percent >= self.quota_critical_percent { Severity::Critical } else { Severity::Warning };
                (Rule::QuotaUsage, severity, format!("quota usage of {shown} at {percent:.0}%"))
            }
            other => {
                tracing::debug!(kind = other, "signal kind without an alert rule ignored");
                return Ok(());
            }
        };
        self.fire(Firing { rule, target, scope, severity, summary, at_unix_ms: at, labels }).await?;
        Ok(())
    }
}

/// The scope key in a `quarantine_scope` signal's detail ("held in quarantine scope <key>: ..."): a template
/// ("tpl:<waba>:<language>:<name>") or a code ("code:<code>").
pub(crate) fn quarantine_scope_of(detail: &str) -> Option<String> {
    let rest = detail.split_once("quarantine scope ")?.1;
    let key = rest.split([' ', ',']).next()?.trim_end_matches(':');
    (key.starts_with("tpl:") || key.starts_with("code:")).then(|| key.to_string())
}

/// The usage percent in a quota signal's detail: the number after `percent=` (`"usage_percent=85.5"`), else
/// the first number followed by `%` (`"tier 2: 91.2% used"`), else the first number (`"85"`).
pub(crate) fn parse_percent(detail: &str) -> Option<f64> {
    let numbers = numbers(detail);
    if let Some(at) = detail.find("percent=") {
        return numbers.iter().find(|(start, _, _)| *start >= at).map(|(_, _, v)| *v);
    }
    numbers.iter().find(|(_, end, _)| detail[*end..].starts_with('%')).or_else(|| numbers.first()).map(|(_, _, v)| *v)
}

fn numbers(text: &str) -> Vec<(usize, usize, f64)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
                i += 1;
            }
            if let Ok(v) = text[start..i].trim_end_matches('.').parse() {
                out.push((start, i, v));
            }
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{parse_percent, quarantine_scope_of};

    #[test]
    fn finds_the_quarantine_scope_key() {
        let d = "held in quarantine scope tpl:100:en_US:promo: Meta refused template promo (en_US) with code 132015";
        assert_eq!(quarantine_scope_of(d).as_deref(), Some("tpl:100:en_US:promo"));
        assert_eq!(quarantine_scope_of("held in quarantine scope code:424242: ...").as_deref(), Some("code:424242"));
        assert_eq!(quarantine_scope_of("held in quarantine scope +15551234567: x"), None);
        assert_eq!(quarantine_scope_of("nothing"), None);
    }

    #[test]
    fn finds_usage_percent() {
        for (input, expect) in [
            ("usage_percent=85.5", Some(85.5)),
            ("92%", Some(92.0)),
            ("80", Some(80.0)),
            ("tier 2 quota: 91.2% used", Some(91.2)),
            ("tier=2 usage_percent=81", Some(81.0)),
            ("none", None),
        ] {
            assert_eq!(parse_percent(input), expect, "{input}");
        }
    }
}
