//! Configuration of the alerting service. Every field has a commented default in `default.toml`.

use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::service::ServiceConfig;
use serde::Deserialize;

/// Alerting configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub alerting: AlertingConfig,
    pub rules: RulesConfig,
    pub storm: StormConfig,
    pub display: DisplayConfig,
    pub delivery: DeliveryConfig,
    pub sinks: SinksConfig,
}

/// Consumption and state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertingConfig {
    /// How often stream depths, scope snapshots and alert states are checked.
    pub poll_interval_ms: u64,
    /// When the durable event consumer is first created, start this far in the past.
    pub initial_lookback_ms: u64,
    /// Alert states (and resolved tombstones) older than this are dropped by the KV bucket.
    pub state_ttl_hours: u64,
    /// Signal-based alerts (credentials, poison, status errors, DLQ limit, quota) resolve after this long
    /// without a new signal for the same key.
    pub signal_quiet_resolve_ms: u64,
    /// JetStream ack wait of the event consumer.
    pub ack_wait_ms: u64,
    /// Events fetched per pull.
    pub batch_size: usize,
    /// Redeliveries of an event that keeps failing before it is terminated (logged, counted).
    pub max_deliver: i64,
}

/// Thresholds of every rule.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RulesConfig {
    /// A breaker OPEN longer than this escalates from warning to critical.
    pub breaker_escalate_after_ms: i64,
    /// DLQ messages of one scope at or above this fire `dlq_depth`.
    pub dlq_depth_threshold: u64,
    /// Oldest DLQ message of one scope at or above this age fires `dlq_oldest_age`.
    pub dlq_oldest_age_s: u64,
    /// Fill ratio of a refusing stream's message or byte limit (BW_SEND, BW_DLQ, BW_UNKNOWN, BW_QUARANTINE,
    /// BW_WEBHOOKS, the ledger's buckets) that fires `stream_near_limit`, well before the stream would refuse
    /// anything.
    pub stream_near_limit_ratio: f64,
    /// Window over which quarantine growth is measured.
    pub quarantine_growth_window_ms: u64,
    /// New quarantined messages within the window that fire `quarantine_growth`.
    pub quarantine_growth_threshold: u64,
    /// BW_UNKNOWN messages at or above this fire `unknown_backlog`.
    pub unknown_backlog_threshold: u64,
    /// Oldest BW_UNKNOWN message at or above this age also fires `unknown_backlog`.
    pub unknown_oldest_age_s: u64,
    /// A BW_SEND partition with messages no dispatcher has taken, no dispatcher waiting on it, and no delivery
    /// for this long fires `send_unserved` (every dispatcher serving it is down, or none is given it).
    pub send_unserved_after_s: u64,
    /// Quota usage percent that fires a warning.
    pub quota_warning_percent: f64,
    /// Quota usage percent that fires (or escalates to) critical.
    pub quota_critical_percent: f64,
}

/// Storm control: per rule, at most `max_individual` notifications per interval; the rest go in one digest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StormConfig {
    pub interval_ms: u64,
    pub max_individual: u32,
    /// Scopes listed by name in one digest (the count is always exact).
    pub digest_max_listed: usize,
}

/// How alerts are shown.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisplayConfig {
    /// IANA zone for the local time shown next to UTC.
    pub time_zone: String,
    /// Prefix of runbook links; empty means the repository-relative `deploy/runbooks`.
    pub runbook_base_url: String,
    /// `source` of PagerDuty events and of the generic payload.
    pub source: String,
}

/// Retries of sink deliveries.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryConfig {
    /// Tries per notification and sink (first try included).
    pub max_attempts: u32,
    pub backoff_base_ms: u64,
    pub backoff_cap_ms: u64,
    /// Per-request timeout.
    pub timeout_ms: u64,
    /// Notifications waiting per sink. When a sink is so slow that its queue fills, further notifications
    /// for that sink only are counted as failures (the alert is still in the state bucket and on NATS), so
    /// one dead sink never holds up the others.
    pub queue_capacity: usize,
}

/// The three sink styles.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinksConfig {
    pub webhook: SinkConfig,
    pub slack: SinkConfig,
    pub pagerduty: PagerDutyConfig,
}

/// A plain HTTP sink.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub enabled: bool,
    /// Full URL; may embed a secret (Slack), so it is never logged.
    pub url: String,
}

impl std::fmt::Debug for SinkConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkConfig").field("enabled", &self.enabled).field("url", &"<redacted>").finish()
    }
}

/// A PagerDuty Events v2 style sink.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PagerDutyConfig {
    pub enabled: bool,
    pub url: String,
    /// Integration key; a secret, never logged.
    pub routing_key: String,
}

impl std::fmt::Debug for PagerDutyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PagerDutyConfig")
            .field("enabled", &self.enabled)
            .field("url", &"<redacted>")
            .field("routing_key", &"<redacted>")
            .finish()
    }
}

impl ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&RedisConfig> {
        None
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn validate(&self) -> Result<(), String> {
        Config::validate(self)
    }
}

impl Config {
    /// Checks values serde cannot: zone names, ratios, enabled sinks with URLs.
    pub fn validate(&self) -> Result<(), String> {
        bw_common::time::parse_zone(&self.display.time_zone)?;
        let r = &self.rules;
        if !(r.stream_near_limit_ratio > 0.0 && r.stream_near_limit_ratio < 1.0) {
            return Err(format!("rules.stream_near_limit_ratio must be in (0, 1), got {}", r.stream_near_limit_ratio));
        }
        if r.quota_warning_percent > r.quota_critical_percent {
            return Err("rules.quota_warning_percent must not exceed rules.quota_critical_percent".into());
        }
        if self.alerting.poll_interval_ms == 0 || self.storm.interval_ms == 0 {
            return Err("alerting.poll_interval_ms and storm.interval_ms must be positive".into());
        }
        if self.delivery.max_attempts == 0 || self.delivery.queue_capacity == 0 || self.alerting.batch_size == 0 {
            return Err(
                "delivery.max_attempts, delivery.queue_capacity and alerting.batch_size must be positive".into()
            );
        }
        for (name, enabled, url) in [
            ("webhook", self.sinks.webhook.enabled, &self.sinks.webhook.url),
            ("slack", self.sinks.slack.enabled, &self.sinks.slack.url),
            ("pagerduty", self.sinks.pagerduty.enabled, &self.sinks.pagerduty.url),
        ] {
            if enabled && !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!("sinks.{name}.url must be an http(s) URL when the sink is enabled"));
            }
        }
        if self.sinks.pagerduty.enabled && self.sinks.pagerduty.routing_key.is_empty() {
            return Err("sinks.pagerduty.routing_key is required when the sink is enabled".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Config;
    use std::collections::HashMap;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, String> {
        let env: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (format!("BW_ALERTING__{k}"), v.to_string())).collect();
        let cfg: Config =
            bw_common::config::load("alerting", crate::DEFAULT_CONFIG, None, &env).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    #[test]
    fn defaults_load_and_bad_values_are_clear_errors() {
        let cfg = load(&[]).expect("compiled defaults are valid");
        assert_eq!(cfg.display.time_zone, "America/Argentina/Buenos_Aires");
        assert_eq!(cfg.rules.breaker_escalate_after_ms, 120_000);
        for (pairs, expect) in [
            (vec![("RULES__DLQ_DEPTH_TRESHOLD", "5")], "dlq_depth_treshold"),
            (vec![("DISPLAY__TIME_ZONE", "Mars/Olympus")], "Mars/Olympus"),
            (vec![("SINKS__SLACK__ENABLED", "true")], "sinks.slack.url"),
            (vec![("SINKS__PAGERDUTY__ENABLED", "true"), ("SINKS__PAGERDUTY__URL", "http://pd")], "routing_key"),
            (vec![("RULES__STREAM_NEAR_LIMIT_RATIO", "1.5")], "stream_near_limit_ratio"),
        ] {
            let err = load(&pairs).expect_err("invalid config rejected");
            assert!(err.contains(expect), "{err}");
        }
        let debug = format!("{:?}", load(&[("SINKS__PAGERDUTY__ROUTING_KEY", "secret-rk")]).expect("valid"));
        assert!(!debug.contains("secret-rk"), "routing key must not appear in Debug output");
    }
}
