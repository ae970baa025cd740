//! Replay configuration (see `default.toml` for every key with its meaning).

use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use serde::Deserialize;
use std::collections::HashMap;

/// The whole service configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub replay: ReplayConfig,
    #[serde(default)]
    pub failover: FailoverConfig,
    /// Whether DLQ entries' senders are checked against the sender registry before a replay (the default).
    #[serde(default)]
    pub tenancy: bw_wire::tenancy::TenancyConfig,
}

/// The `[replay]` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayConfig {
    #[serde(deserialize_with = "digits")]
    pub instance_id: String,
    pub soak_ms: u64,
    /// How long a closed breaker must have been CLOSED before its priority entries are replayed (at most
    /// `soak_ms`).
    pub priority_soak_ms: u64,
    /// Most priority DLQ entries moved into the `rh` lane per second per scope.
    pub priority_rate_per_s: f64,
    /// Most priority replays waiting in the `rh` lane per scope (a per-scope `max_lane_depth` override wins).
    #[serde(default = "default_priority_max_lane_depth")]
    pub priority_max_lane_depth: u64,
    pub rate_per_s: f64,
    pub burst: f64,
    pub max_lane_depth: u64,
    pub max_in_flight: usize,
    pub batch_size: usize,
    pub fetch_wait_ms: u64,
    pub ack_wait_ms: u64,
    pub max_replays: u32,
    pub window_hours: u64,
    pub idle_ms: u64,
    pub lease_ttl_ms: u64,
    pub stats_interval_ms: u64,
    pub shutdown_grace_ms: u64,
    /// While a breaker is HALF_OPEN, entries moved per second as canaries (0: wait for CLOSED).
    pub probe_rate_per_s: f64,
    /// While HALF_OPEN, at most this many replayed entries wait in the rp lane.
    pub probe_max_lane_depth: u64,
    /// Categories whose DLQ entries of a breaker incident are held for manual release (`bwctl dlq replay
    /// --incident`) instead of replayed when the breaker closes. Empty: every incident replays on close.
    #[serde(default)]
    pub hold_categories: Vec<String>,
    /// How long a held entry waits before replay looks at it again (it may have been released).
    #[serde(default = "default_hold_recheck_ms")]
    pub hold_recheck_ms: u64,
    #[serde(default)]
    pub scopes: HashMap<String, ScopeOverride>,
}

fn default_hold_recheck_ms() -> u64 {
    30_000
}

fn default_priority_max_lane_depth() -> u64 {
    200
}

const CATEGORIES: [&str; 4] = ["authentication", "transactional", "support", "marketing"];

/// Per-scope pacing overrides (`[replay.scopes.<phone_number_id>]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeOverride {
    pub rate_per_s: Option<f64>,
    pub burst: Option<f64>,
    pub max_lane_depth: Option<u64>,
}

/// Pacing in force for one scope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    pub rate_per_s: f64,
    pub burst: f64,
    pub max_lane_depth: u64,
}

impl ReplayConfig {
    /// The soak before priority entries are replayed: `priority_soak_ms`, never longer than `soak_ms`.
    pub fn priority_soak(&self) -> u64 {
        self.priority_soak_ms.min(self.soak_ms)
    }

    /// Pacing of priority entries of `phone_number_id` (the `rh` lane): the priority rate, the scope's lane
    /// depth bound.
    pub fn priority_pacing(&self, phone_number_id: &str) -> Pacing {
        let o = self.scopes.get(phone_number_id).cloned().unwrap_or_default();
        Pacing {
            rate_per_s: self.priority_rate_per_s,
            burst: self.burst.max(1.0),
            max_lane_depth: o.max_lane_depth.unwrap_or(self.priority_max_lane_depth),
        }
    }

    /// Pacing while the scope's breaker is HALF_OPEN: a trickle of canaries, never more than the lane cap.
    pub fn probe_pacing(&self) -> Pacing {
        Pacing { rate_per_s: self.probe_rate_per_s, burst: 1.0, max_lane_depth: self.probe_max_lane_depth.max(1) }
    }

    /// Pacing of `phone_number_id`, with its override applied.
    pub fn pacing(&self, phone_number_id: &str) -> Pacing {
        let o = self.scopes.get(phone_number_id).cloned().unwrap_or_default();
        Pacing {
            rate_per_s: o.rate_per_s.unwrap_or(self.rate_per_s),
            burst: o.burst.unwrap_or(self.burst),
            max_lane_depth: o.max_lane_depth.unwrap_or(self.max_lane_depth),
        }
    }
}

/// The `[failover]` section.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailoverConfig {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub open_for_ms: u64,
    #[serde(default)]
    pub categories: Vec<String>,
    #[serde(default)]
    pub secondaries: HashMap<String, Secondary>,
}

/// A secondary sender.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secondary {
    #[serde(deserialize_with = "digits")]
    pub waba_id: String,
    #[serde(deserialize_with = "digits")]
    pub phone_number_id: String,
}

/// Ids are digits; an environment override such as `..._PHONE_NUMBER_ID=1002` parses as a TOML integer, so
/// accept both forms.
fn digits<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Id {
        Text(String),
        Number(u64),
    }
    Ok(match Id::deserialize(d)? {
        Id::Text(s) => s,
        Id::Number(n) => n.to_string(),
    })
}

impl Config {
    /// Checks values serde cannot: positive rates and sizes, known categories.
    pub fn validate(&self) -> Result<(), String> {
        let r = &self.replay;
        let mut rates = vec![
            ("replay.rate_per_s".to_string(), r.rate_per_s),
            ("replay.priority_rate_per_s".to_string(), r.priority_rate_per_s),
        ];
        for (phone, o) in &r.scopes {
            if let Some(rate) = o.rate_per_s {
                rates.push((format!("replay.scopes.{phone}.rate_per_s"), rate));
            }
        }
        for (key, rate) in rates {
            if !(rate > 0.0 && rate.is_finite()) {
                return Err(format!("{key} must be a positive number, got {rate}"));
            }
        }
        if r.batch_size == 0 || r.max_in_flight == 0 {
            return Err("replay.batch_size and replay.max_in_flight must be at least 1".into());
        }
        if r.max_replays == 0 {
            return Err("replay.max_replays must be at least 1".into());
        }
        if r.lease_ttl_ms < 1000 {
            return Err("replay.lease_ttl_ms must be at least 1000".into());
        }
        for c in &self.failover.categories {
            if !CATEGORIES.contains(&c.as_str()) {
                return Err(format!("failover.categories: unknown category `{c}`"));
            }
        }
        for c in &r.hold_categories {
            if !CATEGORIES.contains(&c.as_str()) {
                return Err(format!(
                    "replay.hold_categories: unknown category `{c}` (expected one of {})",
                    CATEGORIES.join(", ")
                ));
            }
        }
        if r.hold_recheck_ms < 100 {
            return Err("replay.hold_recheck_ms must be at least 100".into());
        }
        Ok(())
    }
}

impl bw_common::service::ServiceConfig for Config {
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
    fn shutdown_grace(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.replay.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)]) -> Result<Config, String> {
        let env: HashMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let cfg: Config =
            bw_common::config::load("replay", crate::DEFAULT_CONFIG, None, &env).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    #[test]
    fn defaults_load_and_overrides_apply() {
        let cfg = load(&[
            ("BW_REPLAY__REPLAY__SCOPES__1001__RATE_PER_S", "7.5"),
            ("BW_REPLAY__FAILOVER__SECONDARIES__1001__PHONE_NUMBER_ID", "1002"),
            ("BW_REPLAY__FAILOVER__SECONDARIES__1001__WABA_ID", "\"77\""),
        ])
        .expect("loads");
        assert_eq!(cfg.failover.secondaries["1001"].phone_number_id, "1002");
        assert_eq!(cfg.failover.secondaries["1001"].waba_id, "77");
        assert!(!cfg.failover.enabled);
        assert_eq!(cfg.replay.max_replays, 5);
        assert_eq!(cfg.replay.pacing("1001").rate_per_s, 7.5);
        assert_eq!(cfg.replay.pacing("2002").rate_per_s, 40.0);
        assert!(cfg.replay.hold_categories.is_empty(), "by default every incident replays on close");
        let held = load(&[("BW_REPLAY__REPLAY__HOLD_CATEGORIES", "[\"marketing\"]")]).expect("hold loads");
        assert_eq!(held.replay.hold_categories, ["marketing"]);
    }

    #[test]
    fn bad_values_are_clear_errors() {
        let err = load(&[("BW_REPLAY__REPLAY__RATE_PER_SEC", "3")]).expect_err("typo");
        assert!(err.contains("rate_per_sec"), "{err}");
        let err = load(&[("BW_REPLAY__REPLAY__RATE_PER_S", "0")]).expect_err("zero rate");
        assert!(err.contains("replay.rate_per_s"), "{err}");
        let err = load(&[("BW_REPLAY__FAILOVER__CATEGORIES", "[\"promo\"]")]).expect_err("category");
        assert!(err.contains("promo"), "{err}");
        let err = load(&[("BW_REPLAY__REPLAY__HOLD_CATEGORIES", "[\"promo\"]")]).expect_err("hold category");
        assert!(err.contains("replay.hold_categories") && err.contains("promo"), "{err}");
    }
}
