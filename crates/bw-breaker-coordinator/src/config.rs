//! Coordinator configuration and the per-scope limits it is the authority for.

use bw_breaker::{BreakerConfig, Scope, ScopeLimits};
use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Service configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub redis: RedisConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub coordinator: CoordinatorConfig,
    /// The coordinator's own breaker client settings (its `defaults` are replaced by `[limits.default]`).
    #[serde(default)]
    pub breaker: BreakerConfig,
    #[serde(default)]
    pub limits: LimitsTable,
}

impl bw_common::service::ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&RedisConfig> {
        Some(&self.redis)
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn validate(&self) -> Result<(), String> {
        self.breaker.defaults.validate().map_err(|e| format!("breaker.defaults: {e}"))?;
        self.initial_limits().map(|_| ()).map_err(|e| format!("invalid limits: {e}"))
    }
}

/// Timing of the coordinator's loops.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    pub tick_ms: u64,
    pub snapshot_refresh_ms: u64,
    pub config_resync_ms: u64,
    pub scope_discovery_ms: u64,
    pub limits_file: String,
    pub limits_poll_ms: u64,
    pub tick_concurrency: usize,
}

/// The `[limits]` table as written: defaults plus per-scope overrides (keyed by phone_number_id), kept as
/// TOML so an override names only the fields it changes.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsTable {
    #[serde(default)]
    pub default: toml::Table,
    #[serde(default)]
    pub scopes: BTreeMap<String, toml::Table>,
}

/// Resolved limits: the defaults and every configured scope with its effective limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub default: ScopeLimits,
    /// phone_number_id → (scope, limits).
    pub scopes: HashMap<String, (Scope, ScopeLimits)>,
}

impl Limits {
    /// Effective limits of a scope.
    pub fn for_scope(&self, phone_number_id: &str) -> &ScopeLimits {
        self.scopes.get(phone_number_id).map(|(_, l)| l).unwrap_or(&self.default)
    }
}

fn parse_limits(table: toml::Table, what: &str) -> Result<ScopeLimits, String> {
    let limits = ScopeLimits::deserialize(toml::Value::Table(table)).map_err(|e| format!("{what}: {e}"))?;
    limits.validate().map_err(|e| format!("{what}: {e}"))?;
    Ok(limits)
}

impl LimitsTable {
    /// Validates and resolves every scope; the error names the scope and field.
    pub fn resolve(&self) -> Result<Limits, String> {
        let default = parse_limits(self.default.clone(), "limits.default")?;
        let mut scopes = HashMap::new();
        for (phone, table) in &self.scopes {
            let what = format!("limits.scopes.\"{phone}\"");
            if phone.is_empty() || !phone.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{what}: the key must be a phone_number_id (digits)"));
            }
            let mut table = table.clone();
            let waba_id = match table.remove("waba_id") {
                Some(toml::Value::String(w)) if !w.is_empty() => w,
                _ => {
                    return Err(format!("{what}: `waba_id` (a non-empty string) is required"));
                }
            };
            let mut merged = self.default.clone();
            merged.extend(table);
            let limits = parse_limits(merged, &what)?;
            scopes.insert(phone.clone(), (Scope::new(waba_id, phone.clone()), limits));
        }
        Ok(Limits { default, scopes })
    }
}

/// Shape of a `limits_file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    limits: LimitsTable,
}

/// Reads and resolves a limits file.
pub fn load_limits_file(path: &Path) -> Result<Limits, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let file: LimitsFile = toml::from_str(&text).map_err(|e| format!("invalid `{}`: {e}", path.display()))?;
    file.limits.resolve()
}

impl Config {
    /// The limits in force at start: the limits file when set, else the inline `[limits]`.
    pub fn initial_limits(&self) -> Result<Limits, String> {
        if self.coordinator.limits_file.is_empty() {
            self.limits.resolve()
        } else {
            load_limits_file(Path::new(&self.coordinator.limits_file))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(extra: &str) -> Result<Config, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("c.toml");
        std::fs::write(&path, extra).map_err(|e| e.to_string())?;
        bw_common::config::load("breaker-coordinator", crate::DEFAULT_CONFIG, Some(&path), &HashMap::new())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_load_and_overrides_merge_per_field() {
        let cfg = load("").expect("defaults load");
        let limits = cfg.initial_limits().expect("resolve");
        assert_eq!(limits.default, ScopeLimits::default());
        let cfg = load("[limits.scopes.\"123\"]\nwaba_id = \"9\"\nrate_per_s = 200.0\n").expect("loads");
        let limits = cfg.initial_limits().expect("resolve");
        let (scope, l) = &limits.scopes["123"];
        assert_eq!(scope.waba_id, "9");
        assert_eq!(l.rate_per_s, 200.0);
        assert_eq!(l.burst, ScopeLimits::default().burst);
    }

    #[test]
    fn bad_limits_are_clear_errors() {
        let cfg = load("[limits.scopes.\"123\"]\nrate_per_s = 2.0\n").expect("loads");
        assert!(cfg.initial_limits().expect_err("no waba").contains("waba_id"));
        let cfg = load("[limits.scopes.\"123\"]\nwaba_id = \"9\"\nrate_per_sec = 2.0\n").expect("loads");
        assert!(cfg.initial_limits().expect_err("typo").contains("rate_per_sec"));
        let cfg = load("[limits.default]\nfailure_threshold = 2.0\n").expect("loads");
        assert!(cfg.initial_limits().expect_err("range").contains("failure_threshold"));
        assert!(load("[coordinator]\ntick_msec = 5\n").expect_err("unknown").contains("tick_msec"));
    }
}
