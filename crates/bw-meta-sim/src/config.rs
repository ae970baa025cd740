//! Simulator configuration (TOML for the binary, a plain struct for tests).
//!
//! ```toml
//! listen = "127.0.0.1:8089"
//! access_tokens = ["sim-token"]      # empty: any non-empty bearer token is accepted
//! app_secret = "sim-app-secret"       # keys X-Hub-Signature-256
//! waba_id = "102290129340398"
//! display_phone_number = "15550001234"
//! known_templates = []                # non-empty: other template names fail with 132001
//! throttle_http_status = 400          # HTTP status of 130429/131056/131048/4/80007 (Meta's old table: 429)
//! usage_headers = true                # X-Business-Use-Case-Usage and X-App-Usage on every answer
//! retry_after = false                 # Retry-After (seconds) on throttling errors; Meta sends none
//!                                     # (limits.retry_after = "seconds" | "http_date" picks the format)
//! dump_path = "meta-sim-oracle.json"  # oracle dump on shutdown and POST /_sim/dump
//!
//! [limits]                            # see `Limits`: throughput, pair, app (code 4), WABA (80007) budgets
//! throughput_mps = 80.0
//! number_mps = { "106540352242923" = 20.0 }   # e.g. a coexistence number
//!
//! [phone_numbers."106540352242922"]   # optional per-number overrides
//! display_phone_number = "15550009999"
//! throughput_mps = 1000.0
//! waba_id = "102290129340399"         # the WABA whose budget this number shares (default: waba_id)
//!
//! [webhook]                           # see `WebhookConfig`
//! url = "http://127.0.0.1:8080/webhook"
//! ```

use crate::limits::Limits;
use crate::scenario::Scenario;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Everything the simulator needs to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimConfig {
    /// Loopback by default; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Accepted bearer tokens; empty accepts any non-empty token.
    pub access_tokens: Vec<String>,
    pub app_secret: String,
    pub waba_id: String,
    pub display_phone_number: String,
    pub phone_numbers: BTreeMap<String, PhoneNumberConfig>,
    /// Approved template names; empty approves every name.
    pub known_templates: Vec<String>,
    pub throttle_http_status: u16,
    pub usage_headers: bool,
    pub retry_after: bool,
    pub limits: Limits,
    pub webhook: WebhookConfig,
    /// Scenario active from start (library use; the binary takes `--scenario`).
    #[serde(skip)]
    pub scenario: Option<Scenario>,
    pub dump_path: Option<PathBuf>,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            access_tokens: vec![],
            app_secret: "sim-app-secret".into(),
            waba_id: "102290129340398".into(),
            display_phone_number: "15550001234".into(),
            phone_numbers: BTreeMap::new(),
            known_templates: vec![],
            throttle_http_status: 400,
            usage_headers: true,
            retry_after: false,
            limits: Limits::default(),
            webhook: WebhookConfig::default(),
            scenario: None,
            dump_path: None,
        }
    }
}

impl SimConfig {
    /// The WABA of `phone_number_id`.
    pub fn waba_of(&self, phone_number_id: &str) -> &str {
        self.phone_numbers.get(phone_number_id).and_then(|p| p.waba_id.as_deref()).unwrap_or(&self.waba_id)
    }

    pub fn from_toml(text: &str) -> anyhow::Result<SimConfig> {
        let cfg: SimConfig = toml::from_str(text)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        self.limits.validate().map_err(anyhow::Error::msg)?;
        for (id, p) in &self.phone_numbers {
            if let Some(mps) = p.throughput_mps {
                anyhow::ensure!(
                    mps.is_finite() && mps > 0.0,
                    "phone_numbers.\"{id}\".throughput_mps must be positive, not {mps}"
                );
            }
        }
        anyhow::ensure!((400..=599).contains(&self.throttle_http_status), "throttle_http_status must be 4xx or 5xx");
        anyhow::ensure!(self.webhook.batch_max >= 1, "webhook.batch_max must be at least 1");
        anyhow::ensure!(self.webhook.max_attempts >= 1, "webhook.max_attempts must be at least 1");
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.webhook.duplicate_rate),
            "webhook.duplicate_rate must be between 0 and 1"
        );
        if let Some(s) = &self.scenario {
            s.validate()?;
        }
        Ok(())
    }
}

/// Per-number overrides.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PhoneNumberConfig {
    pub display_phone_number: Option<String>,
    /// Overrides `limits.throughput_mps` for this number (Meta upgrades numbers up to 1,000; coexistence
    /// numbers get 20). `limits.number_mps` wins over it.
    pub throughput_mps: Option<f64>,
    /// The WABA this number belongs to (its 80007 budget and usage header key); default: `SimConfig::waba_id`.
    pub waba_id: Option<String>,
}

/// Status webhooks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where statuses go; None sends nothing.
    pub url: Option<String>,
    /// Delays after acceptance; None skips that status.
    pub sent_delay_ms: Option<u64>,
    pub delivered_delay_ms: Option<u64>,
    pub read_delay_ms: Option<u64>,
    /// Random extra delay per status in [0, jitter_ms]; with a jitter larger than the gaps, statuses arrive
    /// out of order.
    pub jitter_ms: u64,
    /// Up to this many statuses (same phone number) per POST.
    pub batch_max: usize,
    /// How long a batch waits for more statuses once the first is due.
    pub batch_linger_ms: u64,
    /// Share of statuses sent twice.
    pub duplicate_rate: f64,
    /// Shuffle statuses inside each batch.
    pub shuffle_batches: bool,
    /// Retry a failed POST after retry_initial_ms, doubling up to retry_max_ms, max_attempts in all.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    pub max_attempts: u32,
    /// Statuses waiting or in flight; beyond it new statuses are dropped (and counted).
    pub queue_capacity: usize,
    /// Concurrent POSTs (Meta delivers concurrently).
    pub concurrency: usize,
    pub request_timeout_ms: u64,
    /// Recipients (digits or +digits) whose messages are accepted and then fail with this code.
    pub fail_recipients: BTreeMap<String, i64>,
    /// Category reported in pricing for templates (text messages report `service`).
    pub template_category: String,
    /// Seed for jitter, duplicates and shuffles.
    pub seed: u64,
}

impl Default for WebhookConfig {
    fn default() -> WebhookConfig {
        WebhookConfig {
            url: None,
            sent_delay_ms: Some(20),
            delivered_delay_ms: Some(60),
            read_delay_ms: Some(150),
            jitter_ms: 0,
            batch_max: 50,
            batch_linger_ms: 5,
            duplicate_rate: 0.0,
            shuffle_batches: false,
            retry_initial_ms: 100,
            retry_max_ms: 5_000,
            max_attempts: 8,
            queue_capacity: 200_000,
            concurrency: 16,
            request_timeout_ms: 5_000,
            fail_recipients: BTreeMap::new(),
            template_category: "utility".into(),
            seed: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::RetryAfter;

    #[test]
    fn documented_example_parses_and_unknown_keys_are_refused() {
        let text = r#"
            listen = "127.0.0.1:8089"
            access_tokens = ["sim-token"]
            retry_after = false
            [limits]
            throughput_mps = 80.0
            number_mps = { "106540352242923" = 20.0 }
            app_calls = 600
            waba_calls = 5000
            waba_code = 80008
            retry_after = "http_date"
            [phone_numbers."106540352242922"]
            display_phone_number = "15550009999"
            throughput_mps = 1000.0
            waba_id = "102290129340399"
            [webhook]
            url = "http://127.0.0.1:8080/webhook"
        "#;
        let cfg = SimConfig::from_toml(text).expect("the documented example parses");
        assert_eq!(cfg.limits.number_mps.get("106540352242923"), Some(&20.0));
        assert_eq!((cfg.limits.app_calls, cfg.limits.waba_code), (Some(600), 80008));
        assert_eq!(cfg.limits.retry_after, RetryAfter::HttpDate);
        assert_eq!(cfg.waba_of("106540352242922"), "102290129340399");
        assert_eq!(cfg.waba_of("other"), cfg.waba_id);

        let err = SimConfig::from_toml("[limits]\npair_burst_window_ms = 6000\n").expect_err("removed key");
        assert!(err.to_string().contains("pair_burst_window_ms"), "{err}");
        let err = SimConfig::from_toml("[phone_numbers.\"1\"]\nthroughput_mps = 0.0\n").expect_err("zero mps");
        assert!(err.to_string().contains("phone_numbers.\"1\".throughput_mps"), "{err}");
    }
}
