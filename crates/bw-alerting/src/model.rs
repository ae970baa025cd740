//! Rules, dedup keys and the alert state kept in the KV bucket.

use bw_proto::v1::{AlertState, AlertStatus, Severity};

/// KV bucket of alert states (key = dedup key). Owned by this service and created at start.
pub const STATE_BUCKET: &str = bw_wire::names::ALERTS_BUCKET;
/// Durable consumer of the alerting instances on BW_EVENTS (breaker transitions and signals).
pub const CONSUMER: &str = "alerting";
/// Subjects the event consumer reads.
pub const EVENT_FILTERS: [&str; 2] = [bw_wire::names::BREAKER_ALL, bw_wire::names::SIGNAL_ALL];

/// Every rule: its name (subject token, metric label, dedup-key prefix) and runbook file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    BreakerOpen,
    DlqDepth,
    DlqOldestAge,
    StreamNearLimit,
    QuarantineGrowth,
    UnknownBacklog,
    QuotaUsage,
    CredentialsInvalid,
    PoisonMessages,
    StatusErrors,
    DlqLimit,
    SendUnserved,
    /// Messages held by quarantine scope: a template Meta refused (132001, 132007, 132015, 132016) or a code
    /// Breakwater does not know. Targeted at the scope key (template or code), never a phone number.
    QuarantineScope,
    AccountRestricted,
    AccountAlert,
}

impl Rule {
    pub const ALL: [Rule; 15] = [
        Rule::BreakerOpen,
        Rule::DlqDepth,
        Rule::DlqOldestAge,
        Rule::StreamNearLimit,
        Rule::QuarantineGrowth,
        Rule::UnknownBacklog,
        Rule::QuotaUsage,
        Rule::CredentialsInvalid,
        Rule::PoisonMessages,
        Rule::StatusErrors,
        Rule::DlqLimit,
        Rule::SendUnserved,
        Rule::QuarantineScope,
        Rule::AccountRestricted,
        Rule::AccountAlert,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::BreakerOpen => "breaker_open",
            Rule::DlqDepth => "dlq_depth",
            Rule::DlqOldestAge => "dlq_oldest_age",
            Rule::StreamNearLimit => "stream_near_limit",
            Rule::QuarantineGrowth => "quarantine_growth",
            Rule::UnknownBacklog => "unknown_backlog",
            Rule::QuotaUsage => "quota_usage",
            Rule::CredentialsInvalid => "credentials_invalid",
            Rule::PoisonMessages => "poison_messages",
            Rule::StatusErrors => "status_errors",
            Rule::DlqLimit => "dlq_limit",
            Rule::SendUnserved => "send_unserved",
            Rule::QuarantineScope => "quarantine_scope",
            Rule::AccountRestricted => "account_restricted",
            Rule::AccountAlert => "account_alert",
        }
    }

    pub fn from_name(name: &str) -> Option<Rule> {
        Rule::ALL.into_iter().find(|r| r.name() == name)
    }

    pub fn runbook(self) -> &'static str {
        match self {
            Rule::BreakerOpen => "meta-down.md",
            Rule::DlqDepth | Rule::DlqOldestAge | Rule::StreamNearLimit | Rule::DlqLimit | Rule::PoisonMessages => {
                "dlq-growing.md"
            }
            Rule::QuarantineGrowth | Rule::StatusErrors => "quality-restrictions.md",
            Rule::UnknownBacklog => "unknown-outcomes.md",
            Rule::QuotaUsage => "quota-exhausted.md",
            Rule::CredentialsInvalid => "invalid-credentials.md",
            Rule::SendUnserved => "service-down.md",
            Rule::QuarantineScope => "quarantine-scopes.md",
            Rule::AccountRestricted | Rule::AccountAlert => "account-signals.md",
        }
    }

    /// Rules fed by signals resolve after a quiet period instead of on an explicit "clear" event.
    pub fn resolves_when_quiet(self) -> bool {
        matches!(
            self,
            Rule::QuotaUsage
                | Rule::CredentialsInvalid
                | Rule::PoisonMessages
                | Rule::StatusErrors
                | Rule::DlqLimit
                | Rule::QuarantineScope
                | Rule::AccountRestricted
                | Rule::AccountAlert
        )
    }
}

/// Alert target inside the fleet: a sender scope, or the whole fleet.
pub(crate) const FLEET: &str = "fleet";

/// Dedup key `<rule>.<target>`; the target is sanitised to KV key characters. Same rule and target, same key.
pub fn dedup_key(rule: Rule, target: &str) -> String {
    let target: String = if target.is_empty() { FLEET.into() } else { sanitize(target) };
    format!("{}.{target}", rule.name())
}

/// Target of the storm digest of a rule; no sender scope is named like this.
pub(crate) const STORM_TARGET: &str = "_storm";

/// Key of the storm digest of a rule (one PagerDuty incident for all digested alerts of the rule).
pub fn storm_key(rule: Rule) -> String {
    dedup_key(rule, STORM_TARGET)
}

fn sanitize(raw: &str) -> String {
    raw.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '_' }).collect()
}

/// Reads of the state the KV bucket holds per dedup key (`bw_proto::v1::AlertState`).
pub(crate) trait AlertStateExt {
    fn is_firing(&self) -> bool;
    fn severity(&self) -> Severity;
}

impl AlertStateExt for AlertState {
    fn is_firing(&self) -> bool {
        self.alert.as_ref().is_some_and(|a| a.status == AlertStatus::Firing as i32)
    }

    fn severity(&self) -> Severity {
        self.alert.as_ref().and_then(|a| Severity::try_from(a.severity).ok()).unwrap_or(Severity::Unspecified)
    }
}

/// Lowercase severity word (PagerDuty accepts critical, error, warning, info).
pub(crate) fn severity_word(severity: i32) -> &'static str {
    match Severity::try_from(severity) {
        Ok(Severity::Critical) => "critical",
        Ok(Severity::Warning) => "warning",
        _ => "info",
    }
}

/// A condition observed by a rule: fire (or keep firing) this alert.
#[derive(Debug, Clone)]
pub(crate) struct Firing {
    pub rule: Rule,
    /// Phone number id or [`FLEET`].
    pub target: String,
    /// `waba/phone` or empty for fleet-wide alerts.
    pub scope: String,
    pub severity: Severity,
    pub summary: String,
    pub at_unix_ms: i64,
    pub labels: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_keys_are_stable_and_kv_safe() {
        assert_eq!(dedup_key(Rule::BreakerOpen, "1065"), "breaker_open.1065");
        assert_eq!(dedup_key(Rule::StreamNearLimit, ""), "stream_near_limit.fleet");
        assert_eq!(dedup_key(Rule::QuotaUsage, "a b/c.d*"), "quota_usage.a_b_c_d_");
        for rule in Rule::ALL {
            assert_eq!(Rule::from_name(rule.name()), Some(rule));
        }
    }
}
