//! Ingest's configuration: the compiled defaults (`default.toml`), the sections and the checks serde cannot make.

use crate::auth::{self, ApiKeyConfig, AuthMode};
use crate::callback::{self, CallbackConfig};
use crate::intake::OrderConfig;
use crate::reconciler::Policies;
use crate::{cidr, egress, inbound_rate, secret, validate};
use bw_common::config::{AdminConfig, ConfigError, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::service::ServiceConfig;
use bw_wire::tenancy::TenancyConfig;
use serde::Deserialize;
use std::time::Duration;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Ingest configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub http: HttpConfig,
    pub intake: IntakeConfig,
    pub webhook: WebhookConfig,
    pub reconciler: ReconcilerConfig,
    pub feed: FeedConfig,
    pub shutdown: ShutdownConfig,
    /// Where the per-recipient order sets live (the breaker's Redis).
    pub redis: RedisConfig,
    pub order: OrderConfig,
    /// Signed HTTP callbacks to producers, by name (none by default).
    #[serde(default)]
    pub callbacks: std::collections::BTreeMap<String, CallbackConfig>,
    /// Who owns which sender: the sender registry (compiled default) or dev mode.
    #[serde(default)]
    pub tenancy: TenancyConfig,
    /// Where outgoing requests (callbacks) may connect.
    pub egress: EgressConfig,
    pub inbound_rate: inbound_rate::InboundRateConfig,
}

/// Destinations of outgoing requests ([`egress`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// Ranges (CIDR, or single addresses) callbacks may reach although they are loopback, private, link-local
    /// and the like. Empty: only global addresses.
    pub allow_cidrs: Vec<String>,
}

/// Outcome feed and status query.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// Run the feed publisher (durable consumer feed-publisher on the ledger's stream) in this instance.
    pub enabled: bool,
    /// Serve status queries on bw.status.v1.* (and GET /v1/messages/{operation_id}).
    pub status_enabled: bool,
    /// Revisions handled at once per instance.
    pub max_in_flight: usize,
    /// IANA time zone in which status answers show times beside UTC.
    pub display_time_zone: String,
}

/// HTTP listeners.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Producer intake, and the webhook routes unless `webhook_listen` is set.
    pub listen: String,
    /// Separate address for the webhook routes; empty serves them on `listen`.
    pub webhook_listen: String,
}

/// Producer intake.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeConfig {
    pub nats_enabled: bool,
    /// Requests handled at once per instance, by the NATS and the HTTP intake each; the HTTP intake answers
    /// 429 with Retry-After past it, the NATS intake waits.
    pub max_in_flight: usize,
    /// Fill of BW_SEND or the ledger (bytes or messages, of its limit) from which new requests are refused
    /// with REJECT_REASON_STORAGE_FULL.
    pub storage_full_ratio: f64,
    pub max_request_bytes: usize,
    pub max_text_chars: usize,
    pub max_template_params: usize,
    pub max_param_chars: usize,
    pub max_components_bytes: usize,
    pub max_labels: usize,
    /// HTTP intake authentication (`required` by default: no configured key, no HTTP intake).
    pub auth: AuthMode,
    /// Producer keys by name: sha256 of the key and the senders it may send for.
    #[serde(default)]
    pub api_keys: std::collections::BTreeMap<String, ApiKeyConfig>,
}

impl IntakeConfig {
    /// The validation limits.
    pub fn limits(&self) -> validate::Limits {
        validate::Limits {
            max_request_bytes: self.max_request_bytes,
            max_text_chars: self.max_text_chars,
            max_template_params: self.max_template_params,
            max_param_chars: self.max_param_chars,
            max_components_bytes: self.max_components_bytes,
            max_labels: self.max_labels,
        }
    }
}

/// Meta webhooks.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub path: String,
    #[serde(deserialize_with = "secret::string")]
    pub verify_token: String,
    #[serde(deserialize_with = "secret::string")]
    pub app_secret: String,
    pub max_body_bytes: usize,
    /// Delivery bodies being read and stored at once per instance; past it 503 with Retry-After.
    pub max_bodies_in_flight: usize,
    /// A body not received whole within this long gets 408.
    pub body_read_timeout_ms: u64,
    /// Badly signed (or unsigned) requests a source may send at once, and how many more per minute.
    pub bad_signature_burst: u32,
    pub bad_signature_per_minute: u32,
    /// Sources whose bad signatures are counted at most (bounded memory).
    pub bad_signature_sources: usize,
    /// Proxies (CIDR) whose `X-Forwarded-For` names the source of a request.
    pub trusted_proxies: Vec<String>,
    pub process: bool,
    pub max_in_flight: usize,
    pub ack_wait_ms: u64,
}

impl std::fmt::Debug for WebhookConfig {
    // Secrets never appear in logs, even through a debug print of the config.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("path", &self.path)
            .field("verify_token", &"<redacted>")
            .field("app_secret", &"<redacted>")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_bodies_in_flight", &self.max_bodies_in_flight)
            .field("body_read_timeout_ms", &self.body_read_timeout_ms)
            .field("bad_signature_burst", &self.bad_signature_burst)
            .field("bad_signature_per_minute", &self.bad_signature_per_minute)
            .field("bad_signature_sources", &self.bad_signature_sources)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

/// Unknown-outcome reconciler.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerConfig {
    pub enabled: bool,
    pub review_delay_ms: u64,
    pub recheck_ms: u64,
    pub max_in_flight: usize,
    pub policy: Policies,
}

/// Shutdown behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    pub grace_ms: u64,
}

impl ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&bw_common::config::RedisConfig> {
        (!self.order.keep.is_empty() || self.inbound_rate.enabled).then_some(&self.redis) // order sets, inbound count
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
    fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown.grace_ms)
    }
    fn readiness_needs_redis(&self) -> bool {
        // Without Redis only order-keeping intake is refused (UNAVAILABLE, retried by producers); webhooks,
        // statuses and the other categories go on, so readiness must not depend on it.
        false
    }
}

impl Config {
    /// Loads the config from the compiled defaults, an optional file and an env map, and validates it.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &std::collections::HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        // Secrets are taken verbatim: quoted so the loader's scalar parsing never turns them into numbers (and
        // a type error never prints them).
        let env: std::collections::HashMap<String, String> = env
            .iter()
            .map(|(k, v)| {
                let upper = k.to_ascii_uppercase();
                let secret = upper.starts_with("BW_INGEST__")
                    && ["__VERIFY_TOKEN", "__APP_SECRET", "__SHA256", "__SECRET"].iter().any(|s| upper.ends_with(s));
                (k.clone(), if secret { toml_quoted(v) } else { v.clone() })
            })
            .collect();
        bw_common::service::load_config("ingest", DEFAULT_CONFIG, file, &env)
    }

    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        let invalid = |m: &str| Err(m.to_string());
        if !self.webhook.path.starts_with('/') || self.webhook.path == "/v1/messages" {
            return invalid("webhook.path must start with '/' and differ from /v1/messages");
        }
        if self.webhook.max_body_bytes == 0 || self.intake.max_request_bytes == 0 {
            return invalid("webhook.max_body_bytes and intake.max_request_bytes must be > 0");
        }
        auth::Keys::new(self.intake.auth, &self.intake.api_keys, self.tenancy.mode)?;
        if self.feed.display_time_zone.parse::<chrono_tz::Tz>().is_err() {
            return invalid("feed.display_time_zone must be an IANA zone name such as America/Argentina/Buenos_Aires");
        }
        if self.feed.max_in_flight == 0 {
            return invalid("feed.max_in_flight must be > 0");
        }
        if self.intake.max_in_flight == 0 || self.webhook.max_in_flight == 0 || self.reconciler.max_in_flight == 0 {
            return invalid("max_in_flight values must be > 0");
        }
        if !(self.intake.storage_full_ratio > 0.0 && self.intake.storage_full_ratio <= 1.0) {
            return invalid("intake.storage_full_ratio must be > 0 and at most 1");
        }
        let w = &self.webhook;
        if w.max_bodies_in_flight == 0 || w.body_read_timeout_ms == 0 {
            return invalid("webhook.max_bodies_in_flight and webhook.body_read_timeout_ms must be > 0");
        }
        if w.bad_signature_burst == 0 || w.bad_signature_per_minute == 0 || w.bad_signature_sources == 0 {
            return invalid(
                "webhook.bad_signature_burst, bad_signature_per_minute and bad_signature_sources must be > 0",
            );
        }
        cidr::parse_all("webhook.trusted_proxies", &w.trusted_proxies)?;
        let egress = egress::Policy::from_config(&self.egress.allow_cidrs)?;
        use bw_proto::v1::Category;
        let known = [Category::Authentication, Category::Transactional, Category::Support, Category::Marketing];
        if let Some(bad) = self.order.keep.iter().find(|k| !known.iter().any(|c| c.label() == k.as_str())) {
            return Err(format!(
                "order.keep: unknown category `{bad}` (expected authentication, transactional, support or marketing)"
            ));
        }
        if self.order.ttl_ms == 0 {
            return invalid("order.ttl_ms must be > 0");
        }
        for (name, c) in &self.callbacks {
            callback::validate(name, c, self.tenancy.mode)?;
            let url = reqwest::Url::parse(&c.url).map_err(|_| format!("callbacks.{name}.url is not a URL"))?;
            if let Err(refused) = egress.check_literal(&url) {
                return Err(refused_destination(name, refused));
            }
        }
        Ok(())
    }
}

/// The configuration error of a callback whose destination the egress policy refuses. It names the callback
/// and the kind of address, never the address or the URL (which may hold credentials).
pub(crate) fn refused_destination(name: &str, refused: egress::Refused) -> String {
    format!(
        "callbacks.{name}.url: its host is or resolves to a {} address, which callbacks may not reach (it could \
         reach this machine, the cloud's metadata service or a private network); if the receiver really lives \
         there, list its range in egress.allow_cidrs",
        refused.range
    )
}

/// `v` as a TOML basic string.
fn toml_quoted(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
