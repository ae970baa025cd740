//! The console's configuration (`default.toml` documents every key).

use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use serde::Deserialize;

/// The whole service configuration.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub redis: RedisConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub console: ConsoleConfig,
    pub auth: AuthConfig,
}

/// The `[console]` section.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    pub listen: String,
    pub refresh_ms: u64,
    pub page_size: usize,
    pub action_rate_per_s: f64,
    pub coordinator_url: String,
    pub operator_token: String,
}

/// How people sign in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    Keys,
    Proxy,
}

/// A role: viewers read, operators also act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
        }
    }
}

/// One console key, configured by its hash.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Who holds it (shown on pages and written to the audit stream).
    pub name: String,
    /// Hex sha256 of the key.
    pub sha256: String,
    pub role: Role,
}

/// The `[auth]` section.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub mode: AuthMode,
    pub viewers_without_key: bool,
    pub proxy_user_header: String,
    pub proxy_operators: Vec<String>,
    pub session_ttl_s: u64,
    pub keys: Vec<KeyConfig>,
}

impl Config {
    /// Values serde accepts but the console cannot use.
    pub fn check(&self) -> Result<(), String> {
        let c = &self.console;
        if c.refresh_ms < 1000 {
            return Err(format!("console.refresh_ms must be at least 1000 (got {})", c.refresh_ms));
        }
        if !(1..=500).contains(&c.page_size) {
            return Err(format!("console.page_size must be 1 to 500 (got {})", c.page_size));
        }
        if !(c.action_rate_per_s > 0.0 && c.action_rate_per_s.is_finite()) {
            return Err("console.action_rate_per_s must be a positive number".into());
        }
        for k in &self.auth.keys {
            if k.sha256.len() != 64 || !k.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("auth.keys `{}`: sha256 must be 64 hex digits", k.name));
            }
            if k.name.is_empty() || k.name.len() > 64 || k.name.chars().any(char::is_control) {
                return Err("auth.keys: every name must be 1 to 64 printable characters".into());
            }
        }
        if self.auth.mode == AuthMode::Proxy && self.auth.proxy_user_header.trim().is_empty() {
            return Err("auth.proxy_user_header must name a header in proxy mode".into());
        }
        Ok(())
    }
}

impl bw_common::service::ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    /// None when `redis.url` and `redis.cluster_nodes` are empty: the console then runs without Redis and
    /// refuses only the release of a template-held quarantine scope.
    fn redis(&self) -> Option<&RedisConfig> {
        (!self.redis.url.trim().is_empty() || !self.redis.cluster_nodes.is_empty()).then_some(&self.redis)
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn validate(&self) -> Result<(), String> {
        self.check()
    }
    /// The pages read NATS only; Redis serves template releases alone.
    fn readiness_needs_redis(&self) -> bool {
        false
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config").field("listen", &self.console.listen).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_load_bind_loopback_and_need_a_key() {
        let cfg: Config = bw_common::service::load_config("console", crate::DEFAULT_CONFIG, None, &Default::default())
            .expect("defaults load");
        assert!(cfg.console.listen.starts_with("127.0.0.1:"));
        assert_eq!(cfg.auth.mode, AuthMode::Keys);
        assert!(!cfg.auth.viewers_without_key);
        assert!(cfg.auth.keys.is_empty());
        assert_eq!(cfg.console.refresh_ms, 1000);
    }

    #[test]
    fn a_refresh_faster_than_a_second_is_refused() {
        let env = [("BW_CONSOLE__CONSOLE__REFRESH_MS".to_string(), "200".to_string())].into_iter().collect();
        let err = bw_common::service::load_config::<Config>("console", crate::DEFAULT_CONFIG, None, &env)
            .expect_err("refused")
            .to_string();
        assert!(err.contains("refresh_ms"), "{err}");
    }
}
