//! Coordinator configuration and the per-scope limits it is the authority for.

use bw_breaker::{BreakerConfig, Scope, ScopeLimits};
use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Compiled defaults, every key commented (the shared sections come from bw-common's base.toml).
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

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
    /// Who may call the state-changing admin routes.
    pub operator: OperatorConfig,
    /// The coordinator's own breaker client settings (its `defaults` are replaced by `[limits.default]`).
    #[serde(default)]
    pub breaker: BreakerConfig,
    #[serde(default)]
    pub limits: LimitsTable,
    /// Which portfolio Meta's tier webhooks apply to (`account.rs`); the dispatcher's `budget.portfolios`.
    #[serde(default)]
    pub budget: BudgetPortfolios,
}

/// `[budget]`: portfolio by WABA id for numbers whose sender-registry record has no `portfolio_id` (the same map
/// as the dispatcher's `budget.portfolios`, so a tier lands on the budget the dispatcher counts).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetPortfolios {
    #[serde(default)]
    pub portfolios: std::collections::BTreeMap<String, String>,
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
        self.check_coordination()?;
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
    /// Length of the leader lease (the lease bucket's `max_age`), ms.
    pub leader_lease_ms: u64,
    /// How often the leader renews the lease and the others try to take it, ms.
    pub leader_renew_ms: u64,
}

/// Operator authentication of the state-changing admin routes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorConfig {
    /// Lower-case hex sha256 of each accepted operator token, comma-separated (two during a rotation).
    /// Empty: every state-changing admin route answers 403.
    pub token_sha256: String,
}

impl OperatorConfig {
    /// The accepted token hashes; the error names the position of a malformed one (never its value).
    pub fn token_hashes(&self) -> Result<Vec<[u8; 32]>, String> {
        let mut out = Vec::new();
        for (i, part) in self.token_sha256.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate() {
            let bytes = hex::decode(part).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()).ok_or_else(|| {
                format!("operator.token_sha256: entry {} is not 64 hex digits (a sha256 of the token)", i + 1)
            })?;
            out.push(bytes);
        }
        Ok(out)
    }
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
    /// Loads and validates the config from the compiled defaults, an optional file and an env map.
    pub fn load(file: Option<&Path>, env: &HashMap<String, String>) -> Result<Config, bw_common::config::ConfigError> {
        bw_common::service::load_config("breaker-coordinator", DEFAULT_CONFIG, file, env)
    }

    /// Checks lease timing and the operator token hashes (part of `ServiceConfig::validate`).
    pub fn check_coordination(&self) -> Result<(), String> {
        let c = &self.coordinator;
        if c.leader_lease_ms < 1000 {
            return Err("coordinator.leader_lease_ms must be at least 1000".into());
        }
        if c.leader_renew_ms == 0 || c.leader_renew_ms.saturating_mul(2) > c.leader_lease_ms {
            return Err("coordinator.leader_renew_ms must be positive and at most half of leader_lease_ms".into());
        }
        self.operator.token_hashes().map(|_| ())
    }

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
        bw_common::config::load("breaker-coordinator", DEFAULT_CONFIG, Some(&path), &HashMap::new())
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

    /// bw-breaker's compiled `ScopeLimits::default()` is the one source of the scope-limit defaults: the
    /// coordinator's `[limits.default]` states it key by key, and the dispatcher's `[breaker]` states the client
    /// settings' compiled values and leaves `defaults` to it. A value edited in either file fails here.
    #[test]
    fn scope_limit_defaults_have_one_source() {
        let cfg = load("").expect("defaults load");
        assert_eq!(cfg.limits.resolve().expect("resolve").default, ScopeLimits::default());
        let mut every: Vec<&str> = ScopeLimits::default().fields().into_iter().map(|(k, _)| k).collect();
        every.sort_unstable();
        let mut keys: Vec<&str> = cfg.limits.default.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, every, "[limits.default] documents every ScopeLimits key");
        let dispatcher: toml::Table =
            toml::from_str(include_str!("../../bw-dispatcher/default.toml")).expect("dispatcher defaults parse");
        let breaker = dispatcher.get("breaker").cloned().expect("the dispatcher's [breaker]");
        assert!(breaker.get("defaults").is_none(), "the dispatcher takes the scope limits from bw-breaker");
        let breaker = BreakerConfig::deserialize(breaker).expect("the dispatcher's [breaker] is a BreakerConfig");
        assert_eq!(breaker, BreakerConfig::default(), "the dispatcher's [breaker] states the compiled values");
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

    #[test]
    fn defaults_are_valid_and_refuse_operator_actions() {
        let cfg = load("").expect("defaults load");
        bw_common::service::ServiceConfig::validate(&cfg).expect("defaults validate");
        assert!(cfg.operator.token_hashes().expect("hashes").is_empty(), "no operator token by default");
        let h = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
        let cfg = load(&format!("[operator]\ntoken_sha256 = \"{h}, {h}\"\n")).expect("loads");
        assert_eq!(cfg.operator.token_hashes().expect("hashes").len(), 2);
        let cfg = load("[operator]\ntoken_sha256 = \"secret-token-in-clear\"\n").expect("loads");
        let err = bw_common::service::ServiceConfig::validate(&cfg).expect_err("not a hash");
        assert!(err.contains("entry 1") && !err.contains("secret-token"), "{err}");
        let cfg = load("[coordinator]\nleader_lease_ms = 3000\nleader_renew_ms = 2000\n").expect("loads");
        assert!(
            bw_common::service::ServiceConfig::validate(&cfg).expect_err("renew too slow").contains("leader_renew_ms")
        );
    }
}
