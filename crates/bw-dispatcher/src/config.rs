//! The dispatcher's configuration: the compiled defaults (`default.toml`), [`Config`] and its sections, the
//! checks made when it loads, and the start-up warning about the Meta credentials.

use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::service::ServiceConfig;
use serde::Deserialize;
use std::time::Duration;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Dispatcher configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub redis: RedisConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub meta: MetaConfig,
    pub dispatch: DispatchConfig,
    /// Breaker client settings (local fallback, command timeouts); defaults when absent.
    #[serde(default)]
    pub breaker: bw_breaker::BreakerConfig,
    /// Whether senders are checked against the sender registry before each send (the compiled default).
    #[serde(default)]
    pub tenancy: bw_wire::tenancy::TenancyConfig,
    /// The portfolio messaging-limit budget (`budget.rs`).
    #[serde(default)]
    pub budget: crate::budget::BudgetConfig,
}

/// How to reach Meta.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetaConfig {
    pub base_url: String,
    pub api_version: String,
    /// Start even though `api_version` has ended (`bw_common::api_versions::check`).
    #[serde(default)]
    pub allow_expired_api_version: bool,
    /// The Meta app the token belongs to: app-wide limits (code 4) pause every number on it. Empty: the
    /// token's fingerprint stands for the app.
    #[serde(default, deserialize_with = "bw_common::config::text")]
    pub app_id: String,
    #[serde(deserialize_with = "bw_common::config::text")]
    pub access_token: String,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub pool_max_idle_per_host: usize,
}

impl std::fmt::Debug for MetaConfig {
    // The token never appears in logs, even through a debug print of the config.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaConfig")
            .field("base_url", &self.base_url)
            .field("api_version", &self.api_version)
            .field("access_token", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Dispatch behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// BW_SEND partitions this instance serves (`nats.send_partitions`); empty: every partition.
    #[serde(default)]
    pub partitions: Vec<usize>,
    pub batch_size: usize,
    pub max_in_flight: usize,
    pub max_retries: u32,
    pub retry_base_ms: u64,
    pub retry_cap_ms: u64,
    pub retry_budget_ms: u64,
    pub ack_wait_ms: u64,
    pub unknown_review_ms: u64,
    pub long_pause_ms: u64,
    /// E.164 prefixes Meta does not deliver marketing templates to: such a message ends FAILED unsent and is
    /// never replayed (`gates.rs`).
    pub marketing_undeliverable: Vec<String>,
    pub publish_outcomes: bool,
    pub shutdown_grace_ms: u64,
    pub idle_wait_ms: u64,
    pub hold_max_ms: u64,
    pub readmit_interval_ms: u64,
    /// An admitted message that reaches the wire more than this long after its send slot goes back to
    /// admission instead of leaving late (0: never). See `send::Flown::Late`.
    pub late_send_tolerance_ms: u64,
    /// How long a reading of every sender's priority backlog is reused (the priority gate, `priority.rs`).
    pub priority_backlog_refresh_ms: u64,
    /// Redelivery delay of a marketing message held back while its sender has a priority backlog.
    pub priority_hold_ms: u64,
    /// Older priority first: a live priority message waits while its sender's priority replays are in the rh
    /// lane, until it is this old (or its deadline is nearer); 0 switches the rule off (`priority.rs`, rule 3).
    pub live_priority_hold_max_ms: u64,
    /// Write the wamid → operation link after each send (the third ledger write). Statuses carry
    /// `biz_opaque_callback_data`, which names the operation; the link is the fallback for one without it, and
    /// the reference leaves open whether Meta's `failed` statuses carry it, so the default keeps it (the safe
    /// reading). Off saves a durable write per message: for deployments whose own traffic shows every failed
    /// status carrying it (`bw_status_callback_data_total`, `deploy/runbooks/wamid-link.md`).
    pub wamid_link: bool,
    /// How "this send may be on the wire" becomes durable before the POST: a ledger mark per message, or a
    /// grouped record in the partition's wire journal (`journal.rs`, docs/decisions/wire-journal.md).
    #[serde(default)]
    pub wire_guarantee: WireGuarantee,
    /// Journal mode: length of a dispatcher's lease on a send partition (KV `BW_WIRE_OWNERS`), renewed every third.
    #[serde(default = "default_wire_lease_ms")]
    pub wire_lease_ms: u64,
    /// Journal mode: most sends one journal record names.
    #[serde(default = "default_journal_max_group")]
    pub journal_max_group: usize,
    /// Journal mode: how often the owner appends a checkpoint (the settled prefix and the still-open attempts).
    #[serde(default = "default_journal_checkpoint_ms")]
    pub journal_checkpoint_ms: u64,
    /// Journal mode: the byte limit of each `BW_WIRE_<n>` stream.
    #[serde(default = "default_journal_max_bytes")]
    pub journal_max_bytes: i64,
}

/// `dispatch.wire_guarantee`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireGuarantee {
    /// A compare-and-set on the ledger entry per send (`send.rs`, `mark_in_flight`).
    #[default]
    Mark,
    /// One record per group of sends in the partition's journal, appended by the partition's fenced owner.
    Journal,
}

fn default_wire_lease_ms() -> u64 {
    10_000
}
fn default_journal_max_group() -> usize {
    256
}
fn default_journal_checkpoint_ms() -> u64 {
    500
}
fn default_journal_max_bytes() -> i64 {
    64 * 1024 * 1024
}

impl ServiceConfig for Config {
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
        self.budget.validate()?;
        self.breaker.validate_pool().map_err(|e| format!("breaker: {e}"))?;
        let invalid = |m: &str| Err(m.to_string());
        if self.dispatch.ack_wait_ms <= self.meta.request_timeout_ms {
            return invalid("dispatch.ack_wait_ms must exceed meta.request_timeout_ms");
        }
        if self.dispatch.batch_size == 0 || self.dispatch.max_in_flight < self.dispatch.batch_size {
            return invalid("dispatch.batch_size must be > 0 and <= dispatch.max_in_flight");
        }
        if self.dispatch.hold_max_ms * 2 > self.dispatch.ack_wait_ms {
            return invalid("dispatch.hold_max_ms must be at most half of dispatch.ack_wait_ms");
        }
        if self.dispatch.priority_backlog_refresh_ms == 0 || self.dispatch.priority_hold_ms == 0 {
            return invalid("dispatch.priority_backlog_refresh_ms and dispatch.priority_hold_ms must be > 0");
        }
        if self.dispatch.retry_base_ms == 0 || self.dispatch.retry_cap_ms < self.dispatch.retry_base_ms {
            return invalid("dispatch.retry_base_ms must be > 0 and <= dispatch.retry_cap_ms");
        }
        // The lease is renewed every third of its length: shorter ones leave no room for a slow renewal.
        if self.dispatch.wire_lease_ms < 300 {
            return invalid("dispatch.wire_lease_ms must be at least 300");
        }
        if self.dispatch.journal_max_group == 0 || self.dispatch.journal_checkpoint_ms == 0 {
            return invalid("dispatch.journal_max_group and dispatch.journal_checkpoint_ms must be > 0");
        }
        if self.dispatch.journal_max_bytes < 1024 * 1024 {
            return invalid("dispatch.journal_max_bytes must be at least 1 MiB");
        }
        let send = self.nats.send_partitions;
        if let Some(p) = self.dispatch.partitions.iter().find(|p| **p >= send) {
            return Err(format!(
                "dispatch.partitions names partition {p}, but nats.send_partitions is {send} (partitions 0 to {})",
                send.saturating_sub(1)
            ));
        }
        Ok(())
    }
    fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.dispatch.shutdown_grace_ms)
    }
}

impl Config {
    /// Loads and validates the config from the compiled defaults, an optional file and an env map.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &std::collections::HashMap<String, String>,
    ) -> Result<Config, bw_common::config::ConfigError> {
        bw_common::service::load_config("dispatcher", DEFAULT_CONFIG, file, env)
    }
}

/// Access tokens the local stack, the drill and the simulator's examples use: fine against the simulator, a
/// mistake anywhere else.
const LOCAL_ACCESS_TOKENS: [&str; 4] = ["local-access-token", "sim-token", "drill-access-token", "e2e-access-token"];

/// What is wrong with the Meta credentials at start-up, if anything (never the token itself): an empty token,
/// or a well-known local one aimed at a Meta that is not on this machine.
pub(crate) fn credentials_warning(meta: &MetaConfig) -> Option<&'static str> {
    if meta.access_token.is_empty() {
        return Some(
            "meta.access_token is empty: Meta answers every send with 190 and the senders pause for credentials; \
             set BW_DISPATCHER__META__ACCESS_TOKEN",
        );
    }
    let local = bw_common::config::points_at_this_machine(&meta.base_url);
    (LOCAL_ACCESS_TOKENS.contains(&meta.access_token.as_str()) && !local).then_some(
        "meta.access_token is a well-known local default but meta.base_url is not on this machine: set the real \
         token (BW_DISPATCHER__META__ACCESS_TOKEN)",
    )
}
