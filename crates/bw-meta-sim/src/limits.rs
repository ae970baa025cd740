//! Meta's limits at their real scopes (reference §3, §6):
//!
//! | scope | model | code |
//! |---|---|---|
//! | phone number | throughput: GCRA at `throughput_mps` (80 by default, per-number overrides such as 20 for coexistence numbers or 1,000 for upgraded ones) with a small burst | 130429 |
//! | (number, recipient) pair | GCRA, emission interval 6 s, burst 45: a send is allowed when `TAT − now ≤ 44 × 6 s`, then `TAT = max(TAT, now) + 6 s` (the same model as `lua/admit_send.lua`) | 131056 |
//! | app (every number the simulator serves) | Graph call budget: `app_calls` per rolling `app_window_ms` | 4 |
//! | WABA (the numbers of one WABA) | WABA call budget: `waba_calls` per rolling `waba_window_ms` | 80007 (or 80008) |
//!
//! Throughput and pair limits count messages Meta accepted (a message refused by one takes nothing from the other,
//! as in `lua/admit_send.lua`), and throughput also counts inbound messages (reference §3.1: "inbound and
//! outbound"); the app and WABA budgets count every authenticated
//! call, refused ones included (Graph: "further calls extend the block"), with the debt capped at one window.
//! A rolling window of N calls per W is modelled as GCRA with burst N and one call regained every W / N.
//!
//! Meta documents no app or WABA budget for `/messages` (the app limit is `200 × users` per hour for app-token
//! calls, the WABA budgets are for management endpoints), so both are off by default; throughput and pair limits
//! are on at Meta's figures. State lives in sharded maps behind short `Mutex` critical sections.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Limit settings; [`SimHandle::set_limits`](crate::SimHandle::set_limits) swaps them at runtime and a scenario's
/// `[limits]` table replaces them while the scenario is active.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Master switch; false disables every limit (throughput benchmarks).
    pub enabled: bool,
    /// Messages per second per phone number (Meta: 80 by default, up to 1,000 after an upgrade).
    pub throughput_mps: f64,
    /// How many messages may arrive back to back before the rate applies.
    pub throughput_burst: u32,
    /// Per-number throughput overrides (phone number id → mps), e.g. 20 for a coexistence number or 1,000 for
    /// an upgraded one. They win over [`PhoneNumberConfig::throughput_mps`](crate::PhoneNumberConfig).
    pub number_mps: BTreeMap<String, f64>,
    pub pair_enabled: bool,
    /// GCRA emission interval of the pair limit (Meta: one message per 6 s to the same user).
    pub pair_interval_ms: u64,
    /// Messages a pair may send back to back (Meta: 45); the tolerance is `(pair_burst − 1) × pair_interval_ms`.
    pub pair_burst: u32,
    /// App-level call budget across every number (code 4): this many calls per `app_window_ms`. None: off.
    pub app_calls: Option<u64>,
    pub app_window_ms: u64,
    /// WABA-level call budget across the numbers of one WABA (code `waba_code`). None: off.
    pub waba_calls: Option<u64>,
    pub waba_window_ms: u64,
    /// 80007 (Meta's error page) or 80008 (the Graph BUC page); the reference handles both as RL(WABA).
    pub waba_code: i64,
    /// Retry-After on throttling answers (130429, 131056, 4, 80007/80008). Meta sends none (reference §3.4),
    /// which is the default. [`SimConfig::retry_after`](crate::SimConfig) = true also turns on `seconds`.
    pub retry_after: RetryAfter,
}

/// How (and whether) throttling answers carry `Retry-After`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RetryAfter {
    /// No header (Meta's behaviour).
    #[default]
    None,
    /// `Retry-After: <seconds>` (rounded up, at least 1).
    Seconds,
    /// `Retry-After: <IMF-fixdate>`, e.g. `Tue, 01 Dec 2026 10:00:07 GMT`.
    HttpDate,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            enabled: true,
            throughput_mps: 80.0,
            throughput_burst: 10,
            number_mps: BTreeMap::new(),
            pair_enabled: true,
            pair_interval_ms: 6_000,
            pair_burst: 45,
            app_calls: None,
            app_window_ms: 3_600_000,
            waba_calls: None,
            waba_window_ms: 3_600_000,
            waba_code: 80007,
            retry_after: RetryAfter::None,
        }
    }
}

impl Limits {
    /// Everything off.
    pub fn disabled() -> Limits {
        Limits { enabled: false, ..Limits::default() }
    }

    /// The throughput of `phone_number_id`: its override here, else `configured` (the number's config), else
    /// the default.
    pub fn mps_for(&self, phone_number_id: &str, configured: Option<f64>) -> f64 {
        self.number_mps.get(phone_number_id).copied().or(configured).unwrap_or(self.throughput_mps)
    }

    /// A precise complaint about the first invalid setting.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 { Ok(()) } else { Err(format!("limits.{name} must be positive, not {v}")) }
        };
        positive("throughput_mps", self.throughput_mps)?;
        for (number, mps) in &self.number_mps {
            positive(&format!("number_mps.\"{number}\""), *mps)?;
        }
        if self.throughput_burst == 0 {
            return Err("limits.throughput_burst must be at least 1".into());
        }
        if self.pair_interval_ms == 0 || self.pair_burst == 0 {
            return Err("limits.pair_interval_ms and limits.pair_burst must be at least 1".into());
        }
        for (name, calls, window) in
            [("app", self.app_calls, self.app_window_ms), ("waba", self.waba_calls, self.waba_window_ms)]
        {
            if calls == Some(0) {
                return Err(format!("limits.{name}_calls must be at least 1 (omit it to switch the limit off)"));
            }
            if calls.is_some() && window == 0 {
                return Err(format!("limits.{name}_window_ms must be positive"));
            }
        }
        if ![80007, 80008].contains(&self.waba_code) {
            return Err(format!("limits.waba_code must be 80007 or 80008, not {}", self.waba_code));
        }
        Ok(())
    }
}

/// A refusal: how long until the caller is back within the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refused {
    pub wait: Duration,
}

const SHARDS: usize = 32;
const SWEEP_AT: usize = 8_192;

/// One GCRA table: key → theoretical arrival time (ns since the limiter's base).
#[derive(Debug)]
struct Table<K> {
    shards: Vec<Mutex<HashMap<K, u64>>>,
}

impl<K: Hash + Eq + Clone> Table<K> {
    fn new() -> Table<K> {
        Table { shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect() }
    }

    fn clear(&self) {
        for s in &self.shards {
            lock(s).clear();
        }
    }

    /// GCRA with emission interval `t` and tolerance `tau`: allowed when `TAT − now ≤ tau`, then
    /// `TAT = max(TAT, now) + t`. With `refused_cap > 0`, a refused call still adds `t`, up to
    /// `TAT = now + tau + refused_cap` (a wait of at most `refused_cap`). Ok(TAT − now after the call).
    fn take(&self, shard: usize, key: &K, now: u64, t: u64, tau: u64, refused_cap: u64) -> Result<u64, Refused> {
        let mut map = lock(&self.shards[shard]);
        if map.len() > SWEEP_AT {
            map.retain(|_, tat| *tat > now);
        }
        let tat = map.get(key).copied().unwrap_or(now).max(now);
        if tat - now > tau {
            if refused_cap > 0 {
                map.insert(key.clone(), (tat + t).min(now + tau + refused_cap));
            }
            return Err(Refused { wait: Duration::from_nanos(tat - now - tau) });
        }
        map.insert(key.clone(), tat + t);
        Ok(tat + t - now)
    }

    /// Whether a call would be allowed now, without taking it.
    fn peek(&self, shard: usize, key: &K, now: u64, tau: u64) -> Result<(), Refused> {
        let map = lock(&self.shards[shard]);
        let tat = map.get(key).copied().unwrap_or(now).max(now);
        if tat - now > tau { Err(Refused { wait: Duration::from_nanos(tat - now - tau) }) } else { Ok(()) }
    }

    /// Takes a unit whether or not it fits (traffic that cannot be refused), up to `TAT = now + tau + t`.
    fn force(&self, shard: usize, key: &K, now: u64, t: u64, tau: u64) {
        let mut map = lock(&self.shards[shard]);
        let tat = map.get(key).copied().unwrap_or(now).max(now);
        map.insert(key.clone(), (tat + t).min(now + tau + t));
    }
}

/// Limiter state for all scopes.
#[derive(Debug)]
pub struct Limiter {
    base: Instant,
    hasher: RandomState,
    numbers: Table<String>,
    pairs: Table<(String, String)>,
    app: Table<()>,
    wabas: Table<String>,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter::new()
    }
}

impl Limiter {
    pub fn new() -> Limiter {
        Limiter {
            base: Instant::now(),
            hasher: RandomState::new(),
            numbers: Table::new(),
            pairs: Table::new(),
            app: Table::new(),
            wabas: Table::new(),
        }
    }

    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn shard<K: Hash>(&self, key: &K) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Forgets all state.
    pub fn clear(&self) {
        self.numbers.clear();
        self.pairs.clear();
        self.app.clear();
        self.wabas.clear();
    }

    /// Forgets a number's throughput state (its limit changed: Meta upgraded it).
    pub fn forget_number(&self, phone_number_id: &str) {
        let key = phone_number_id.to_string();
        lock(&self.numbers.shards[self.shard(&key)]).remove(&key);
    }

    /// Takes one unit of the number's throughput. Ok(percent of the burst allowance in use after this message).
    pub fn throughput(&self, phone_number_id: &str, mps: f64, burst: u32) -> Result<u32, Refused> {
        let t = (1e9 / mps.max(0.001)) as u64;
        let tau = t.saturating_mul(u64::from(burst.max(1) - 1));
        let key = phone_number_id.to_string();
        let used = self.numbers.take(self.shard(&key), &key, self.now_ns(), t, tau, 0)?;
        Ok(percent(used, tau + t))
    }

    /// Whether the number's throughput would allow a message now (nothing is taken).
    pub fn throughput_check(&self, phone_number_id: &str, mps: f64, burst: u32) -> Result<(), Refused> {
        let t = (1e9 / mps.max(0.001)) as u64;
        let tau = t.saturating_mul(u64::from(burst.max(1) - 1));
        let key = phone_number_id.to_string();
        self.numbers.peek(self.shard(&key), &key, self.now_ns(), tau)
    }

    /// An inbound message: Meta counts inbound and outbound against the number's throughput (reference §3.1);
    /// it is never refused, but leaves less room for sends (at most one burst of debt).
    pub fn throughput_inbound(&self, phone_number_id: &str, mps: f64, burst: u32) {
        let t = (1e9 / mps.max(0.001)) as u64;
        let tau = t.saturating_mul(u64::from(burst.max(1) - 1));
        let key = phone_number_id.to_string();
        self.numbers.force(self.shard(&key), &key, self.now_ns(), t, tau);
    }

    /// Takes one message of the pair's quota: GCRA, interval `pair_interval_ms`, burst `pair_burst`.
    pub fn pair(&self, phone_number_id: &str, wa_id: &str, limits: &Limits) -> Result<(), Refused> {
        let t = limits.pair_interval_ms.max(1).saturating_mul(1_000_000);
        let tau = t.saturating_mul(u64::from(limits.pair_burst.max(1) - 1));
        let key = (phone_number_id.to_string(), wa_id.to_string());
        self.pairs.take(self.shard(&key), &key, self.now_ns(), t, tau, 0).map(|_| ())
    }

    /// Takes a unit of the pair's quota whether or not it fits (a message the business sent outside the API),
    /// up to one interval of debt.
    pub fn pair_force(&self, phone_number_id: &str, wa_id: &str, limits: &Limits) {
        let t = limits.pair_interval_ms.max(1).saturating_mul(1_000_000);
        let tau = t.saturating_mul(u64::from(limits.pair_burst.max(1) - 1));
        let key = (phone_number_id.to_string(), wa_id.to_string());
        self.pairs.force(self.shard(&key), &key, self.now_ns(), t, tau);
    }

    /// Counts one call against the app budget (`calls` per `window_ms`). Ok(percent of the budget in use).
    pub fn app_call(&self, calls: u64, window_ms: u64) -> Result<u32, Refused> {
        let (t, tau) = budget(calls, window_ms);
        let used = self.app.take(0, &(), self.now_ns(), t, tau, window_ms.saturating_mul(1_000_000))?;
        Ok(percent(used, tau + t))
    }

    /// Counts one call against the budget of `waba_id`. Ok(percent of the budget in use).
    pub fn waba_call(&self, waba_id: &str, calls: u64, window_ms: u64) -> Result<u32, Refused> {
        let (t, tau) = budget(calls, window_ms);
        let key = waba_id.to_string();
        let cap = window_ms.saturating_mul(1_000_000);
        let used = self.wabas.take(self.shard(&key), &key, self.now_ns(), t, tau, cap)?;
        Ok(percent(used, tau + t))
    }
}

/// `calls` per `window_ms` as (emission interval, tolerance) in ns.
fn budget(calls: u64, window_ms: u64) -> (u64, u64) {
    let t = window_ms.saturating_mul(1_000_000) / calls.max(1);
    (t.max(1), t.max(1).saturating_mul(calls.max(1) - 1))
}

fn percent(used: u64, of: u64) -> u32 {
    if of == 0 {
        return 100;
    }
    ((used as u128 * 100 / of as u128).min(100)) as u32
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A messaging-limit tier: a number of unique users per rolling window, or unlimited (None).
///
/// Parsed from every form the reference lists (§4.5 `business_capability_update`, UNCERTAIN format):
/// `"TIER_250"`, `"TIER_2K"`, `"TIER_10K"`, `"TIER_100K"`, `"TIER_UNLIMITED"`, `"UNLIMITED"`, `"2000"`, `2000`,
/// and `-1` (the legacy "unlimited"); `"TIER_1K"` is 2,000 ("the old 1K tier is now 2,000"). Any positive
/// count is accepted so tests can use small tiers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tier(pub Option<u64>);

impl Tier {
    pub const UNLIMITED: Tier = Tier(None);

    /// Parses a string form.
    pub fn parse(s: &str) -> Result<Tier, String> {
        let t = s.trim();
        let n = match t.to_ascii_uppercase().as_str() {
            "TIER_250" => Some(250),
            "TIER_1K" | "TIER_2K" => Some(2_000),
            "TIER_10K" => Some(10_000),
            "TIER_100K" => Some(100_000),
            "TIER_UNLIMITED" | "UNLIMITED" | "-1" => None,
            other => match other.parse::<u64>() {
                Ok(n) if n > 0 => Some(n),
                _ => {
                    return Err(format!(
                        "tier `{t}` is not one of TIER_250, TIER_2K, TIER_10K, TIER_100K, TIER_UNLIMITED \
                         or a positive count"
                    ));
                }
            },
        };
        Ok(Tier(n))
    }

    /// From a webhook-style JSON value (string or number).
    pub fn from_json(v: &serde_json::Value) -> Result<Tier, String> {
        match v {
            serde_json::Value::String(s) => Tier::parse(s),
            serde_json::Value::Number(n) => match n.as_i64() {
                Some(-1) => Ok(Tier::UNLIMITED),
                Some(n) if n > 0 => Ok(Tier(Some(n as u64))),
                _ => Err(format!("tier {n} is not a positive count or -1")),
            },
            other => Err(format!("tier must be a string or a number, not {other}")),
        }
    }

    /// Meta's name for the tier (`TIER_2K`), or the bare count for a count Meta has no tier for.
    pub fn name(&self) -> String {
        match self.0 {
            None => "TIER_UNLIMITED".into(),
            Some(250) => "TIER_250".into(),
            Some(2_000) => "TIER_2K".into(),
            Some(10_000) => "TIER_10K".into(),
            Some(100_000) => "TIER_100K".into(),
            Some(n) => n.to_string(),
        }
    }
}

impl Serialize for Tier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

impl<'de> Deserialize<'de> for Tier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Tier::from_json(&v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_allows_the_burst_then_refuses() {
        let l = Limiter::new();
        let ok = (0..20).filter(|_| l.throughput("p", 1.0, 5).is_ok()).count();
        assert_eq!(ok, 5, "burst of 5 at 1 mps, the rest refused");
        let refused = l.throughput("p", 1.0, 5).expect_err("still over");
        assert!(refused.wait > Duration::from_millis(900));
        assert!(l.throughput("other", 1.0, 5).is_ok(), "numbers are independent");
    }

    #[test]
    fn inbound_takes_throughput_without_being_refused() {
        let l = Limiter::new();
        assert!(l.throughput_check("p", 0.01, 2).is_ok());
        l.throughput_inbound("p", 0.01, 2);
        l.throughput_inbound("p", 0.01, 2);
        l.throughput_inbound("p", 0.01, 2);
        assert!(l.throughput_check("p", 0.01, 2).is_err(), "two inbound messages used the burst of 2");
        assert!(l.throughput("p", 0.01, 2).is_err());
        let wait = l.throughput_check("p", 0.01, 2).expect_err("still over").wait;
        assert!(wait <= Duration::from_secs(100), "debt capped at one burst: {wait:?}");
    }

    #[test]
    fn pair_is_gcra_with_burst_45_at_the_default() {
        let l = Limiter::new();
        let lim = Limits::default();
        let ok = (0..50).filter(|_| l.pair("p", "1", &lim).is_ok()).count();
        assert_eq!(ok, 45, "TAT − now ≤ 44 × 6 s admits exactly 45 back to back");
        let r = l.pair("p", "1", &lim).expect_err("burst used");
        // TAT = now + 45 × 6 s; allowed again once TAT − now ≤ 264 s, i.e. after about 6 s.
        assert!(r.wait <= Duration::from_secs(6) && r.wait > Duration::from_secs(5), "{:?}", r.wait);
        assert!(l.pair("p", "2", &lim).is_ok(), "other recipient unaffected");
        assert!(l.pair("q", "1", &lim).is_ok(), "other business number unaffected");
    }

    #[test]
    fn app_budget_counts_refused_calls_up_to_one_window() {
        let l = Limiter::new();
        assert!((0..3).all(|_| l.app_call(3, 60_000).is_ok()));
        let first = l.app_call(3, 60_000).expect_err("budget of 3 used");
        let again = l.app_call(3, 60_000).expect_err("still over");
        assert!(again.wait > first.wait, "a refused call extends the block");
        assert!(again.wait <= Duration::from_secs(60), "debt capped at one window: {:?}", again.wait);
        let capped = (0..10).fold(again, |_, _| l.app_call(3, 60_000).expect_err("over"));
        assert!(capped.wait <= Duration::from_secs(60), "never more than a window: {:?}", capped.wait);
    }

    #[test]
    fn limits_validate_precisely() {
        assert!(Limits::default().validate().is_ok());
        let bad = Limits { waba_code: 4, ..Limits::default() };
        assert!(bad.validate().expect_err("bad code").contains("waba_code"));
        let bad = Limits { app_calls: Some(0), ..Limits::default() };
        assert!(bad.validate().expect_err("zero").contains("app_calls"));
        let mut bad = Limits::default();
        bad.number_mps.insert("1".into(), -1.0);
        assert!(bad.validate().expect_err("negative").contains("number_mps"));
    }
}
