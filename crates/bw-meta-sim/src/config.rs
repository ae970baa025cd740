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
//! portfolio_id = "506914307656635"   # its business portfolio (default: the WABA's, else business_id)
//!
//! [webhook]                           # see `WebhookConfig`
//! url = "http://127.0.0.1:8080/webhook"
//!
//! # Account model (reference §3.3, §3.5, §4.5, §6, §0); every key is optional.
//! business_id = "506914307656634"     # the default business portfolio of every number
//! api_date = "2026-12-06"             # "today" for API version expiry (default: the system clock)
//! user_ids = true                     # webhooks carry business-scoped user ids (Meta: since April 2026)
//! enforce_service_window = false      # true: non-template sends outside a 24 h window fail 131047 (async)
//! us_marketing_code = 131049          # marketing templates to US numbers fail async with it; 0 = deliver
//!
//! [portfolios."506914307656634"]      # messaging limit per portfolio; none configured = unlimited
//! tier = "TIER_2K"                    # TIER_250 | TIER_2K | TIER_10K | TIER_100K | TIER_UNLIMITED | a number
//! waba_ids = ["102290129340398"]      # WABAs (and so numbers) in this portfolio
//!
//! [messaging_limit]                   # how the portfolio limit fails (reference §3.3: code and channel UNCERTAIN)
//! window_ms = 86400000                # rolling window of unique users
//! code = 131048                       # the code past the tier
//! mode = "async"                      # accepted, then a failed status (the safe reading); or "sync"
//!
//! [[templates]]                       # templates with a state; others are approved (unless known_templates)
//! name = "otp_login"
//! language = "en_US"                  # omit: every language
//! category = "AUTHENTICATION"         # MARKETING | UTILITY | AUTHENTICATION (pricing, 131049/131050 rules)
//! status = "APPROVED"                 # PAUSED → 132015, DISABLED → 132016, REJECTED, ... → 132001
//! otp_type = "copy_code"              # copy_code | one_tap | zero_tap: user-id sends fail 131062
//! paced = false                       # true: sends are held (held_for_quality_assessment) until released
//!
//! [[users]]                           # the user directory (reference §6); others get derived user ids
//! phone = "+16505551234"
//! user_id = "US.13491208655302741918" # default: derived per portfolio
//! username = "@sheena"                # in contacts[].profile on delivered/read and inbound
//! share_phone = false                 # false: webhooks omit the phone (recipient_id, wa_id, from)
//! ```

use crate::inject::Mode;
use crate::limits::{Limits, Tier};
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
    /// The default business portfolio of every number (reference §3.3: limits are per portfolio).
    pub business_id: String,
    /// Messaging-limit tier per portfolio, and which WABAs belong to it. A portfolio not listed is unlimited.
    pub portfolios: BTreeMap<String, PortfolioConfig>,
    pub messaging_limit: MessagingLimitConfig,
    /// Templates with a category, a status or an OTP type.
    pub templates: Vec<TemplateConfig>,
    /// Users with a fixed user id, a username or a hidden phone number.
    pub users: Vec<UserConfig>,
    /// `YYYY-MM-DD`: the date API versions expire against; None: the system clock.
    pub api_date: Option<String>,
    /// Webhooks and answers carry business-scoped user ids (`recipient_user_id`, `user_id`, `from_user_id`).
    pub user_ids: bool,
    /// Non-template sends to a user without an open customer service window fail with 131047 (async).
    /// Off by default: most tests send text messages to recipients that never wrote.
    pub enforce_service_window: bool,
    /// Marketing templates to US numbers fail asynchronously with this code (Meta does not deliver them; the
    /// code is not named by Meta, BSPs report 131049). 0 delivers them.
    pub us_marketing_code: i64,
}

/// One business portfolio.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PortfolioConfig {
    pub tier: Tier,
    pub waba_ids: Vec<String>,
}

/// How the portfolio messaging limit fails past its tier.
///
/// The reference (§3.3, §2.3) names no code and no channel. It says the limit counts the unique users a
/// portfolio *delivers to* outside a customer service window, so the simulator reads it the safe way for a
/// sender: Meta accepts the message (200, wamid) and it fails later in a `failed` status, so a sender cannot
/// learn the limit from the answer and must budget unique recipients itself. The code defaults to 131048
/// ("restrictions on how many messages can be sent from this phone number"), the documented code nearest in
/// meaning; both are settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct MessagingLimitConfig {
    pub window_ms: u64,
    pub code: i64,
    pub mode: Mode,
}

impl Default for MessagingLimitConfig {
    fn default() -> Self {
        MessagingLimitConfig { window_ms: 86_400_000, code: 131048, mode: Mode::Async }
    }
}

/// A template's state.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    pub name: String,
    /// None: every language of that name.
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default = "utility")]
    pub category: String,
    #[serde(default = "approved")]
    pub status: String,
    #[serde(default)]
    pub otp_type: Option<OtpType>,
    /// `message_template_id` in webhooks; default: derived from the name and language.
    #[serde(default)]
    pub id: Option<u64>,
    /// Under template pacing from the start: sends are held (`held_for_quality_assessment`) until a
    /// `template_pacing` release or a pause (reference §3.5).
    #[serde(default)]
    pub paced: bool,
}

fn utility() -> String {
    "UTILITY".into()
}

fn approved() -> String {
    "APPROVED".into()
}

/// The OTP button of an authentication template; these cannot be sent to a user id (131062, reference §6).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OtpType {
    CopyCode,
    OneTap,
    ZeroTap,
}

/// One WhatsApp user of the directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    pub phone: String,
    #[serde(default)]
    pub user_id: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    /// false: the user's phone cannot be shared, so webhooks about them carry only the user id.
    #[serde(default = "yes")]
    pub share_phone: bool,
}

fn yes() -> bool {
    true
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
            business_id: "506914307656634".into(),
            portfolios: BTreeMap::new(),
            messaging_limit: MessagingLimitConfig::default(),
            templates: vec![],
            users: vec![],
            api_date: None,
            user_ids: true,
            enforce_service_window: false,
            us_marketing_code: 131049,
        }
    }
}

impl SimConfig {
    /// The WABA of `phone_number_id`.
    pub fn waba_of(&self, phone_number_id: &str) -> &str {
        self.phone_numbers.get(phone_number_id).and_then(|p| p.waba_id.as_deref()).unwrap_or(&self.waba_id)
    }

    /// The business portfolio of `waba_id`: the portfolio listing it, else `business_id`.
    pub fn portfolio_of_waba(&self, waba_id: &str) -> &str {
        self.portfolios
            .iter()
            .find(|(_, p)| p.waba_ids.iter().any(|w| w == waba_id))
            .map_or(&self.business_id, |(id, _)| id)
    }

    /// The business portfolio of `phone_number_id`: its own `portfolio_id`, else its WABA's portfolio.
    pub fn portfolio_of(&self, phone_number_id: &str) -> &str {
        match self.phone_numbers.get(phone_number_id).and_then(|p| p.portfolio_id.as_deref()) {
            Some(p) => p,
            None => self.portfolio_of_waba(self.waba_of(phone_number_id)),
        }
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
        anyhow::ensure!(self.messaging_limit.window_ms > 0, "messaging_limit.window_ms must be positive");
        anyhow::ensure!(self.messaging_limit.code >= 0, "messaging_limit.code must not be negative");
        anyhow::ensure!(self.us_marketing_code >= 0, "us_marketing_code must not be negative (0 turns it off)");
        if let Some(d) = &self.api_date {
            anyhow::ensure!(crate::versions::days(d).is_some(), "api_date must be YYYY-MM-DD, not `{d}`");
        }
        for (i, t) in self.templates.iter().enumerate() {
            anyhow::ensure!(!t.name.is_empty(), "templates[{i}].name must not be empty");
            crate::templates::template_status_effect(&t.status)
                .map_err(|e| anyhow::anyhow!("templates[{i}].status: {e}"))?;
            crate::templates::check_category(&t.category)
                .map_err(|e| anyhow::anyhow!("templates[{i}].category: {e}"))?;
        }
        for (i, u) in self.users.iter().enumerate() {
            // The phone itself is never echoed: index only.
            anyhow::ensure!(crate::ids::wa_id(&u.phone).len() >= 7, "users[{i}].phone is not a phone number");
            if let Some(id) = &u.user_id {
                anyhow::ensure!(crate::ids::is_user_id(id), "users[{i}].user_id is not a business-scoped user id");
            }
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
    /// The business portfolio (messaging limit, user ids); default: its WABA's portfolio, else `business_id`.
    pub portfolio_id: Option<String>,
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

        let account = r#"
            business_id = "506914307656634"
            api_date = "2026-12-06"
            user_ids = true
            enforce_service_window = false
            us_marketing_code = 131049
            [portfolios."506914307656634"]
            tier = "TIER_2K"
            waba_ids = ["102290129340398"]
            [portfolios."506914307656635"]
            tier = 100000
            [messaging_limit]
            window_ms = 86400000
            code = 131048
            mode = "async"
            [[templates]]
            name = "otp_login"
            language = "en_US"
            category = "AUTHENTICATION"
            status = "APPROVED"
            otp_type = "copy_code"
            [[users]]
            phone = "+16505551234"
            user_id = "US.13491208655302741918"
            username = "@sheena"
            share_phone = false
            [phone_numbers."106540352242923"]
            portfolio_id = "506914307656635"
        "#;
        let cfg = SimConfig::from_toml(account).expect("the documented account keys parse");
        assert_eq!(cfg.portfolios["506914307656634"].tier, Tier(Some(2_000)));
        assert_eq!(cfg.portfolios["506914307656635"].tier, Tier(Some(100_000)));
        assert_eq!(cfg.portfolio_of("106540352242923"), "506914307656635", "the number's own portfolio");
        assert_eq!(cfg.portfolio_of("106540352242922"), "506914307656634", "its WABA's portfolio");
        assert_eq!(cfg.templates[0].otp_type, Some(OtpType::CopyCode));
        for (text, want) in [
            ("[portfolios.p]\ntier = \"TIER_3K\"\n", "TIER_3K"),
            ("[[templates]]\nname = \"t\"\nstatus = \"PAUSD\"\n", "templates[0].status"),
            ("[[users]]\nphone = \"+16505551234\"\nuser_id = \"16505551234\"\n", "users[0].user_id"),
            ("api_date = \"2026-6-31x\"\n", "api_date"),
            ("[messaging_limit]\nmode = \"later\"\n", "later"),
        ] {
            let err = SimConfig::from_toml(text).expect_err(text).to_string();
            assert!(err.contains(want), "`{want}` in: {err}");
        }
        assert_eq!(Tier::parse("TIER_1K"), Ok(Tier(Some(2_000))), "the old 1K tier is now 2,000");
        assert_eq!(Tier::from_json(&serde_json::json!(-1)), Ok(Tier::UNLIMITED));
        assert_eq!(Tier(Some(10_000)).name(), "TIER_10K");

        let err = SimConfig::from_toml("[limits]\npair_burst_window_ms = 6000\n").expect_err("removed key");
        assert!(err.to_string().contains("pair_burst_window_ms"), "{err}");
        let err = SimConfig::from_toml("[phone_numbers.\"1\"]\nthroughput_mps = 0.0\n").expect_err("zero mps");
        assert!(err.to_string().contains("phone_numbers.\"1\".throughput_mps"), "{err}");
    }
}
