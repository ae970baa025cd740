//! The portfolio messaging-limit gate (issue #36 item 2; meta-cloud-api.md §3.3): before a send, a template to a
//! recipient outside its customer service window must fit its business portfolio's budget of unique users in a
//! rolling 24 h (`bw_breaker::budget`, `lua/portfolio_budget.lua`), or it is held.
//!
//! - Counted: templates only. A free-form message is allowed only inside an open window (Meta refuses it with
//!   131047 outside one), and replies inside a window do not count. A template counts unless ingest saw an
//!   inbound message of that user to that number in the last 24 h (`bw-ingest` `inbound.rs`). The producer's
//!   `customer_last_inbound_unix_ms` is not trusted for this: a wrong claim would spend Meta's limit unseen.
//! - The portfolio: the sender registry's `portfolio_id`, else `budget.portfolios` (WABA → portfolio), else the
//!   WABA itself (a portfolio per WABA: exact when each portfolio has one WABA; configure the others).
//! - The limit: what Meta said last, by webhook (`business_capability_update`, applied by the coordinator) or
//!   by the Graph read this process makes once per portfolio (`whatsapp_business_manager_messaging_limit` of the
//!   number); while Meta said nothing, `budget.limits` for the portfolio, else `budget.unknown_limit`, 250 by
//!   default: the lowest tier, the safe reading (nothing sent that Meta would fail).
//! - The reserve: marketing stops `budget.reserve_percent` (10 %) short of the limit; authentication, utility
//!   and support templates may use it all. So marketing is held first.
//!
//! Holding keeps every promise: a held message leaves its lane (`Worker::hold_out_of_lane`): the same request is
//! published to the sender's held subject in its BW_SEND partition and the lane's copy is acked, so held
//! messages wait in the pending set of the partition's own `dispatcher-held` consumer, never in a lane's
//! (`max_ack_pending` 50,000), and a flash sale past its limit never stops the lane's other messages. There it is
//! given back with a delayed redelivery (a nak with delay; no delivery limit), so it is neither sent nor
//! dead-lettered, its ledger state stays QUEUED (the place it is in) and nothing else can take it. Its first hold
//! writes the reason into the ledger entry (one revision, so one feed event, with the portfolio and the figures,
//! never a number) and each hold publishes a `budget_held` outcome. Each delivery passes every check again (ledger,
//! deadline, registry, gates), so a held message whose deadline passed ends EXPIRED, and it is sent at most once
//! like any other. It goes out when the window slides (the delay never exceeds the time until the oldest counted
//! user leaves the window) or the tier rises (within `budget.hold_max_ms`, the longest delay: each redelivery
//! doubles it from `budget.hold_ms`).
//!
//! Redis unreachable: marketing is held for `budget.hold_ms`; authentication, utility and support go on, at the
//! breaker's bounded local fallback rate. An OTP must not wait for the counting store, and the users such a gap
//! can add are bounded by that rate times the gap, which the reserve absorbs for short outages. Recipients are
//! keyed by `bw_common::mask::recipient_key`; logs and metrics name the portfolio only.
//!
//! This module holds the budget's config, store, metrics and rules; the gate itself is `Worker::budget_gate`
//! (`gates.rs`), beside the other gates.

use crate::rounds::Rounds;
use bw_breaker::budget::{Admit, BudgetItem, PortfolioBudget};
use bw_common::admin::MetricsRegistry;
use bw_proto::v1::Category;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The start of the ledger reason of a held message (a redelivery does not write it again).
pub(crate) const HELD_PREFIX: &str = "held: portfolio messaging limit";

/// `[budget]` of the dispatcher's config.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Off: no message is counted or held (Meta then fails what passes its limit).
    pub enabled: bool,
    /// The limit of a portfolio whose tier neither a webhook nor `limits` states; -1 unlimited.
    pub unknown_limit: i64,
    /// Limits by portfolio id (unique users per 24 h; -1 unlimited), used until Meta's webhook states one.
    pub limits: BTreeMap<String, i64>,
    /// Portfolio by WABA id, for numbers whose registry record has no `portfolio_id`.
    pub portfolios: BTreeMap<String, String>,
    /// Share of the limit only authentication, utility and support templates may use, in percent.
    pub reserve_percent: u32,
    /// First redelivery delay of a held message; doubled at each redelivery up to `hold_max_ms`.
    pub hold_ms: u64,
    pub hold_max_ms: u64,
    /// Bound on one budget call to Redis.
    pub timeout_ms: u64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig {
            enabled: true,
            unknown_limit: bw_breaker::budget::LOWEST_TIER,
            limits: BTreeMap::new(),
            portfolios: BTreeMap::new(),
            reserve_percent: 10,
            hold_ms: 5_000,
            hold_max_ms: 30_000,
            timeout_ms: 250,
        }
    }
}

impl BudgetConfig {
    pub(crate) fn validate(&self) -> Result<(), String> {
        let bad = |l: i64| l == 0 || l < -1;
        if bad(self.unknown_limit) {
            return Err("budget.unknown_limit must be a positive count or -1 (unlimited)".into());
        }
        if let Some((p, _)) = self.limits.iter().find(|(_, l)| bad(**l)) {
            return Err(format!("budget.limits.{p} must be a positive count or -1 (unlimited)"));
        }
        if self.reserve_percent > 100 {
            return Err("budget.reserve_percent must be at most 100".into());
        }
        if self.hold_ms == 0 || self.hold_max_ms < self.hold_ms || self.timeout_ms == 0 {
            return Err("budget.hold_ms and budget.timeout_ms must be > 0, budget.hold_max_ms >= hold_ms".into());
        }
        Ok(())
    }
}

/// The gate's Redis side, config and metrics.
pub(crate) struct Budget {
    pub(crate) store: PortfolioBudget,
    pub(crate) cfg: BudgetConfig,
    pub(crate) used: Family<Vec<(&'static str, String)>, Gauge>,
    pub(crate) limit: Family<Vec<(&'static str, String)>, Gauge>,
    pub(crate) held: Family<Vec<(&'static str, String)>, Counter>,
    /// Portfolios this process added to the list `bwctl scopes` reads.
    pub(crate) noted: Mutex<HashSet<String>>,
    /// Portfolios whose tier this process asked Meta for: None once learned, else when the last try failed.
    pub(crate) asked: tokio::sync::Mutex<HashMap<String, Option<Instant>>>,
    /// Until when Redis counts as unreachable after a failed call: no message waits for its timeout meanwhile.
    pub(crate) down_until: Mutex<Option<Instant>>,
    /// The last limit Redis reported per portfolio: the fallback after Redis lost its state (a restart), so a
    /// portfolio Meta put at a high tier is not cut to `unknown_limit` until the next tier webhook.
    pub(crate) last_limit: Mutex<HashMap<String, i64>>,
    /// Window reads by number and admissions by portfolio, each joined into one round trip per round
    /// (`rounds.rs`): a batch of templates costs a few calls, not two per message.
    pub(crate) windows: Rounds<String, bool>,
    pub(crate) admits: Rounds<BudgetItem, Admit>,
}

impl Budget {
    pub(crate) fn new(
        redis: Option<bw_breaker::RedisConn>,
        cfg: BudgetConfig,
        registry: &MetricsRegistry,
    ) -> Option<Budget> {
        let redis = redis.filter(|_| cfg.enabled)?;
        let b = Budget {
            store: PortfolioBudget::new(redis),
            cfg,
            used: Family::default(),
            limit: Family::default(),
            held: Family::default(),
            noted: Mutex::default(),
            asked: tokio::sync::Mutex::default(),
            down_until: Mutex::default(),
            last_limit: Mutex::default(),
            windows: Rounds::default(),
            admits: Rounds::default(),
        };
        if let Ok(mut r) = registry.lock() {
            r.register(
                "bw_portfolio_budget_used",
                "Unique users a business portfolio reached outside a service window in the last 24 h",
                b.used.clone(),
            );
            r.register(
                "bw_portfolio_budget_limit",
                "A business portfolio's messaging limit (unique users per 24 h; -1 unlimited)",
                b.limit.clone(),
            );
            r.register(
                "bw_portfolio_budget_held",
                "Deliveries held by the portfolio messaging-limit budget, by portfolio and class",
                b.held.clone(),
            );
        }
        Some(b)
    }

    /// Whether a call failed within the last [`STORE_DOWN`].
    pub(crate) fn store_down(&self) -> bool {
        self.down_until.lock().map(|d| d.is_some_and(|t| Instant::now() < t)).unwrap_or(false)
    }

    pub(crate) fn mark_down(&self) {
        if let Ok(mut d) = self.down_until.lock() {
            *d = Some(Instant::now() + STORE_DOWN);
        }
    }

    /// The limit used when Redis holds none for `portfolio`: the last one Redis reported, else config, else
    /// `unknown_limit`.
    pub(crate) fn fallback(&self, portfolio: &str) -> i64 {
        let last = self.last_limit.lock().ok().and_then(|m| m.get(portfolio).copied());
        last.or_else(|| self.cfg.limits.get(portfolio).copied()).unwrap_or(self.cfg.unknown_limit)
    }

    pub(crate) fn remember_limit(&self, portfolio: &str, limit: i64) {
        if let Ok(mut m) = self.last_limit.lock() {
            m.insert(portfolio.to_string(), limit);
        }
    }
}

/// How long a failed Redis call makes the gate skip Redis: each message would otherwise wait for the timeout.
const STORE_DOWN: Duration = Duration::from_secs(1);

/// Authentication, utility and support templates may use the reserve; marketing (and an unset category) not.
pub(crate) fn reserved(category: Category) -> bool {
    category.is_priority()
}

/// The delay of a held message's `delivered`-th delivery: `hold_ms` doubled per delivery up to `hold_max_ms`,
/// never past the moment a slot frees (`wait_ms`).
pub(crate) fn hold_delay(cfg: &BudgetConfig, delivered: i64, wait_ms: u64) -> Duration {
    let doublings = delivered.saturating_sub(1).clamp(0, 16) as u32;
    let backoff = cfg.hold_ms.saturating_mul(1u64 << doublings).min(cfg.hold_max_ms);
    Duration::from_millis(backoff.min(wait_ms.max(1)))
}

/// The reason a held message shows in its ledger entry and outcome: the portfolio and the figures only.
pub(crate) fn held_reason(portfolio: &str, used: i64, limit: i64, cap: i64, reserved: bool) -> String {
    let class = if reserved {
        "the whole limit is used".to_string()
    } else {
        format!("marketing may use {cap} (the rest is reserved for authentication and utility)")
    };
    format!(
        "{HELD_PREFIX} of portfolio {portfolio}: {used} of {limit} unique users reached in 24 h, {class}; waits \
         for the window to slide or the tier to rise"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_off_to_the_cap_and_never_past_a_freed_slot() {
        let cfg = BudgetConfig::default();
        assert_eq!(hold_delay(&cfg, 1, u64::MAX), Duration::from_millis(5_000));
        assert_eq!(hold_delay(&cfg, 2, u64::MAX), Duration::from_millis(10_000));
        assert_eq!(hold_delay(&cfg, 9, u64::MAX), Duration::from_millis(30_000));
        assert_eq!(hold_delay(&cfg, 9, 700), Duration::from_millis(700), "a slot frees sooner");
        assert_eq!(hold_delay(&cfg, 0, 0), Duration::from_millis(1));
    }

    #[test]
    fn the_compiled_default_is_the_lowest_tier_with_a_tenth_reserved() {
        let cfg = BudgetConfig::default();
        assert_eq!((cfg.unknown_limit, cfg.reserve_percent, cfg.enabled), (250, 10, true));
        assert!(cfg.validate().is_ok());
        let zero = BudgetConfig { unknown_limit: 0, ..BudgetConfig::default() };
        assert!(zero.validate().is_err(), "0 is no tier");
        let bad = BudgetConfig { limits: BTreeMap::from([("1".into(), -5)]), ..BudgetConfig::default() };
        assert!(bad.validate().expect_err("refused").contains("budget.limits.1"));
    }

    #[test]
    fn reasons_name_the_portfolio_and_figures_and_marketing_is_held_first() {
        let r = held_reason("506914307656634", 1800, 2000, 1800, false);
        assert!(r.starts_with(HELD_PREFIX) && r.contains("1800 of 2000") && r.contains("marketing may use 1800"));
        assert!(held_reason("5", 2000, 2000, 2000, true).contains("whole limit"));
        assert!(reserved(Category::Authentication) && reserved(Category::Transactional));
        assert!(!reserved(Category::Marketing) && !reserved(Category::Unspecified));
    }
}
