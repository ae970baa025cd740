//! Breaker settings: [`ScopeLimits`] (the per-scope thresholds and rates the scripts enforce; defaults passed
//! to every script, overridden field by field by the scope's config hash the coordinator writes) and
//! [`BreakerConfig`] (this client's command timeout and local fallback).

use serde::Deserialize;

/// Per-scope breaker and rate-limit settings. Field names are the names used in the Redis config hash.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScopeLimits {
    /// Failure rate (0..1) the breaker tolerates: the window trips only on evidence that the number fails more
    /// often than this (see `failure_z`), and the fast trip weighs its evidence against it.
    pub failure_threshold: f64,
    /// Calls needed in the window before the failure rate can trip.
    pub min_calls: u32,
    /// The sliding window trips when the Wilson lower bound (z standard deviations) of its failure rate is at or
    /// above `failure_threshold`: failures - calls p >= z sqrt(calls p (1 - p)), and the rate itself at or above
    /// the threshold. 0 gives the bare rate compare, which tripped on a steady 4 % in every simulated 10-minute
    /// run (a 10 s window of 750 calls at 4 % reaches 5 % about once a minute); z 3 still tripped 52 of 4,000
    /// runs at 4 %, z 4 one, z 4.5 none (docs/performance.md). Checked once per recorded batch, so the order of
    /// outcomes within a batch does not matter ([`crate::evidence::window_trips`]).
    pub failure_z: f64,
    /// Length of the sliding window, ms.
    pub window_ms: u64,
    /// Sub-buckets of the window (1..=60); the window slides by window_ms / window_buckets.
    pub window_buckets: u32,
    /// Consecutive 130429 episodes (at most one per `aimd_cut_gap_ms`, no success between) that trip the
    /// breaker. 130429 never counts toward the failure rate.
    pub consecutive_rate_limits: u32,
    /// OPEN cooldown of the first trip, ms.
    pub cooldown_ms: u64,
    /// Cap of the cooldown when it grows on re-trips, ms.
    pub cooldown_max_ms: u64,
    /// Cooldown multiplier per re-trip within one incident.
    pub cooldown_growth: f64,
    /// Random extra share of the cooldown (0.2: up to +20%).
    pub cooldown_jitter: f64,
    /// Canaries admitted per second while HALF_OPEN.
    pub canaries_per_s: u32,
    /// Canary successes that close a HALF_OPEN breaker.
    pub close_after_successes: u32,
    /// Ramp-up after closing, ms (0: full rate at once).
    pub ramp_ms: u64,
    /// Share of the sender rate right after closing (0..1).
    pub ramp_start: f64,
    /// Sustained sender rate, messages per second (keep at or under Meta's limit).
    pub rate_per_s: f64,
    /// Meta's stated throughput of the number, messages per second (meta-cloud-api.md §3.1: 80, 1,000 after an
    /// upgrade, 20 for a coexistence number); 0: unknown, and `rate_per_s` applies as configured. When known (here
    /// or from the `THROUGHPUT_UPGRADE` webhook, which wins: [`crate::throughput`]), the sender rate is this times
    /// `throughput_margin`, never above it.
    pub throughput_mps: f64,
    /// Share of Meta's stated throughput the sender rate uses (0..1): 0.925 is today's 74 of 80, which leaves room
    /// for inbound messages seen late and for jitter between admission and Meta's clock.
    pub throughput_margin: f64,
    /// Sender bucket size (burst), messages.
    pub burst: f64,
    /// Share of the bucket only priority traffic may use.
    pub reserve_fraction: f64,
    /// Extra tokens above the reserve that replay must leave, so live marketing wins ties.
    pub replay_headroom: f64,
    /// Pair GCRA emission interval: one send per this many ms to one recipient on average (Meta §3.2: 6 s).
    pub pair_interval_ms: u64,
    /// Pair GCRA burst: sends to one recipient allowed back to back, borrowed from future quota (Meta: 45;
    /// the default 40 is stricter so that network jitter between admission and Meta's clock never costs a
    /// 131056).
    pub pair_burst: u32,
    /// Cap of the per-pair back-off after consecutive 131056 (4^X s: 1, 4, 16, 64 s ...), ms.
    pub pair_backoff_max_ms: u64,
    /// Fast trip: distinct recipients that must have failed transiently within `fast_trip_window_ms` (of the
    /// first) besides the evidence below (0: fast trip off). A message failing again on its retries counts once,
    /// so retries of one message never fast-trip.
    pub fast_trip_failures: u32,
    /// Fast trip: length of the short window opened by a transient failure in which the distinct recipients
    /// are counted, ms.
    pub fast_trip_window_ms: u64,
    /// Fast trip: the outage failure rate the evidence is weighed against (0..1; at or below
    /// `failure_threshold`, or 1, the fast trip is off: nothing to tell apart).
    /// Each call adds ln(q/p) when it failed and ln((1-q)/(1-p)) when it succeeded (p the threshold, q this),
    /// the evidence never drops below 0 and is summed per batch, so the order within a batch does not matter
    /// ([`crate::evidence`]). 0.2: the outage to catch within about a second at Meta's default rate.
    pub fast_trip_outage_rate: f64,
    /// Fast trip: evidence (natural log of a likelihood ratio) that opens the breaker. 15 means the recent
    /// calls are e^15 (3.3 million) times likelier at `fast_trip_outage_rate` than at the threshold. Simulated
    /// at 75 calls/s (docs/performance.md): a steady 2 % or 4 % trips none of 4,000 ten-minute runs (14: one
    /// at 4 %), and a 20 % outage trips one number after a median 1.3 s (p90 2.2 s), not within 0.5 s. A bare
    /// count (3 failures in 2 s) tripped on 2 % noise.
    pub fast_trip_evidence: f64,
    /// AIMD: the adaptive share of `rate_per_s` is multiplied by this on a 130429.
    pub aimd_decrease: f64,
    /// AIMD: share of `rate_per_s` given back per success (never above the configured rate).
    pub aimd_increase: f64,
    /// AIMD: lowest adaptive share.
    pub aimd_min: f64,
    /// AIMD: at most one cut per this many ms (one burst of 130429 answers is one cut).
    pub aimd_cut_gap_ms: u64,
    /// Ramp after a pause (rate limit, spam, app / WABA / token pause) ends, ms: the backlog is released
    /// gradually from `ramp_start` of the rate (0: full rate at once).
    pub pause_ramp_ms: u64,
    /// Share of the rate used while Meta sends no usage headers (quota blind).
    pub blind_rate_factor: f64,
    /// Meta usage percent above which low priority (marketing, replay) is slowed.
    pub throttle_slow_percent: u32,
    /// Meta usage percent above which marketing and replay are paused.
    pub throttle_pause_percent: u32,
    /// Share of the sender rate low priority gets while slowed.
    pub throttle_slow_factor: f64,
    /// How long a usage report takes to fade to nothing (linearly), ms. Meta's usage is an hourly rolling
    /// window, so the default is an hour: a 95 % reading stays above 90 % for more than three minutes.
    pub usage_ttl_ms: u64,
    /// Retry-after given to low priority while throttled, ms.
    pub throttle_retry_ms: u64,
}

impl Default for ScopeLimits {
    fn default() -> Self {
        ScopeLimits {
            failure_threshold: 0.05,
            min_calls: 50,
            failure_z: 4.5,
            window_ms: 10_000,
            window_buckets: 10,
            consecutive_rate_limits: 5,
            cooldown_ms: 30_000,
            cooldown_max_ms: 300_000,
            cooldown_growth: 2.0,
            cooldown_jitter: 0.2,
            canaries_per_s: 2,
            close_after_successes: 5,
            ramp_ms: 60_000,
            ramp_start: 0.1,
            rate_per_s: 74.0,
            throughput_mps: 0.0,
            throughput_margin: 0.925,
            burst: 10.0,
            reserve_fraction: 0.25,
            replay_headroom: 2.0,
            pair_interval_ms: 6_000,
            pair_burst: 40,
            pair_backoff_max_ms: 3_600_000,
            fast_trip_failures: 3,
            fast_trip_window_ms: 2_000,
            fast_trip_outage_rate: 0.2,
            fast_trip_evidence: 15.0,
            aimd_decrease: 0.7,
            aimd_increase: 0.002,
            aimd_min: 0.1,
            aimd_cut_gap_ms: 1_000,
            pause_ramp_ms: 10_000,
            blind_rate_factor: 0.8,
            throttle_slow_percent: 80,
            throttle_pause_percent: 90,
            throttle_slow_factor: 0.5,
            usage_ttl_ms: 3_600_000,
            throttle_retry_ms: 5_000,
        }
    }
}

impl ScopeLimits {
    /// Field name / value pairs, as stored in the scope's Redis config hash.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("failure_threshold", self.failure_threshold.to_string()),
            ("min_calls", self.min_calls.to_string()),
            ("failure_z", self.failure_z.to_string()),
            ("window_ms", self.window_ms.to_string()),
            ("window_buckets", self.window_buckets.to_string()),
            ("consecutive_rate_limits", self.consecutive_rate_limits.to_string()),
            ("cooldown_ms", self.cooldown_ms.to_string()),
            ("cooldown_max_ms", self.cooldown_max_ms.to_string()),
            ("cooldown_growth", self.cooldown_growth.to_string()),
            ("cooldown_jitter", self.cooldown_jitter.to_string()),
            ("canaries_per_s", self.canaries_per_s.to_string()),
            ("close_after_successes", self.close_after_successes.to_string()),
            ("ramp_ms", self.ramp_ms.to_string()),
            ("ramp_start", self.ramp_start.to_string()),
            ("rate_per_s", self.rate_per_s.to_string()),
            ("throughput_mps", self.throughput_mps.to_string()),
            ("throughput_margin", self.throughput_margin.to_string()),
            ("burst", self.burst.to_string()),
            ("reserve_fraction", self.reserve_fraction.to_string()),
            ("replay_headroom", self.replay_headroom.to_string()),
            ("pair_interval_ms", self.pair_interval_ms.to_string()),
            ("pair_burst", self.pair_burst.to_string()),
            ("pair_backoff_max_ms", self.pair_backoff_max_ms.to_string()),
            ("fast_trip_failures", self.fast_trip_failures.to_string()),
            ("fast_trip_window_ms", self.fast_trip_window_ms.to_string()),
            ("fast_trip_outage_rate", self.fast_trip_outage_rate.to_string()),
            ("fast_trip_evidence", self.fast_trip_evidence.to_string()),
            ("aimd_decrease", self.aimd_decrease.to_string()),
            ("aimd_increase", self.aimd_increase.to_string()),
            ("aimd_min", self.aimd_min.to_string()),
            ("aimd_cut_gap_ms", self.aimd_cut_gap_ms.to_string()),
            ("pause_ramp_ms", self.pause_ramp_ms.to_string()),
            ("blind_rate_factor", self.blind_rate_factor.to_string()),
            ("throttle_slow_percent", self.throttle_slow_percent.to_string()),
            ("throttle_pause_percent", self.throttle_pause_percent.to_string()),
            ("throttle_slow_factor", self.throttle_slow_factor.to_string()),
            ("usage_ttl_ms", self.usage_ttl_ms.to_string()),
            ("throttle_retry_ms", self.throttle_retry_ms.to_string()),
        ]
    }

    /// The defaults argument every script takes: `name=value;name=value;...`.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        for (name, value) in self.fields() {
            out.push_str(name);
            out.push('=');
            out.push_str(&value);
            out.push(';');
        }
        out
    }

    /// Checks ranges; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        let unit = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) { Ok(()) } else { Err(format!("`{name}` must be within 0..1, got {v}")) }
        };
        unit("failure_threshold", self.failure_threshold)?;
        unit("ramp_start", self.ramp_start)?;
        unit("reserve_fraction", self.reserve_fraction)?;
        unit("throttle_slow_factor", self.throttle_slow_factor)?;
        unit("aimd_decrease", self.aimd_decrease)?;
        unit("aimd_increase", self.aimd_increase)?;
        unit("aimd_min", self.aimd_min)?;
        unit("blind_rate_factor", self.blind_rate_factor)?;
        unit("throughput_margin", self.throughput_margin)?;
        if !(self.throughput_mps.is_finite() && self.throughput_mps >= 0.0) || self.throughput_margin <= 0.0 {
            return Err("`throughput_mps` must not be negative and `throughput_margin` must be positive".into());
        }
        if self.aimd_min <= 0.0 || self.blind_rate_factor <= 0.0 {
            return Err("`aimd_min` and `blind_rate_factor` must be positive".into());
        }
        if !(1..=60).contains(&self.window_buckets) {
            return Err(format!("`window_buckets` must be within 1..=60, got {}", self.window_buckets));
        }
        if self.window_ms < u64::from(self.window_buckets) {
            return Err("`window_ms` must be at least `window_buckets`".into());
        }
        if self.rate_per_s <= 0.0 || self.burst < 1.0 {
            return Err("`rate_per_s` must be positive and `burst` at least 1".into());
        }
        if self.cooldown_growth < 1.0 || self.cooldown_jitter < 0.0 {
            return Err("`cooldown_growth` must be at least 1 and `cooldown_jitter` not negative".into());
        }
        if self.pair_burst == 0 || self.pair_interval_ms == 0 {
            return Err("`pair_burst` and `pair_interval_ms` must be positive".into());
        }
        unit("fast_trip_outage_rate", self.fast_trip_outage_rate)?;
        if !(self.failure_z.is_finite() && self.failure_z >= 0.0) {
            return Err(format!("`failure_z` must not be negative, got {}", self.failure_z));
        }
        if !(self.fast_trip_evidence.is_finite() && self.fast_trip_evidence > 0.0) {
            return Err(format!("`fast_trip_evidence` must be positive, got {}", self.fast_trip_evidence));
        }
        if self.replay_headroom < 0.0 {
            return Err("`replay_headroom` must not be negative".into());
        }
        Ok(())
    }
}

/// Client settings of the breaker library.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Timeout of one script call, ms; past it the call counts as Redis unreachable.
    pub command_timeout_ms: u64,
    /// After a Redis failure, answer locally for this long before trying Redis again, ms.
    pub redis_retry_after_ms: u64,
    /// Local fallback: sender rate of this instance per scope, messages per second.
    pub fallback_rate_per_s: f64,
    /// Local fallback: bucket size per scope.
    pub fallback_burst: f64,
    /// Local fallback: failure rate that opens the local breaker.
    pub fallback_failure_threshold: f64,
    /// Local fallback: calls needed in the 10 s window before the local breaker may open.
    pub fallback_min_calls: u32,
    /// Local fallback: cooldown of the local breaker, ms.
    pub fallback_cooldown_ms: u64,
    /// Retry-after given to replay while degraded (replay does not run without Redis), ms.
    pub fallback_replay_retry_ms: u64,
    /// How long a read of the app / WABA / token pause keys is trusted before admission reads them again, ms.
    /// A pause recorded by this process is known here at once; one recorded elsewhere within this bound. (The
    /// number's own pause is read by the admission script itself, at once everywhere.)
    pub parent_refresh_ms: u64,
    /// Lifetime of the key of a pause held until lifted (a token halt, a WABA restriction, a number's
    /// registration), ms: the pause lasts until an operator lifts it (or, for a token, the token changes); after
    /// this the key expires and the next send probes.
    pub token_halt_ttl_ms: u64,
    /// Retry-after given to sends held by a pause until lifted (token, WABA, number), ms.
    pub token_halt_retry_ms: u64,
    /// Pooled fast trip (`lua/pool_evidence.lua`, [`crate::evidence::Pool`]): the evidence, summed over every
    /// number sent with one access token, that opens the breakers of the numbers that contributed failures
    /// (0: off). The same per-call weights as the number's own fast trip (`fast_trip_outage_rate` against
    /// `failure_threshold`) and the same distinct-recipient guard, from `defaults`. 16, simulated over 4 numbers
    /// at 75 calls/s each (docs/performance.md): a steady 2 % or 4 % on every number trips none of 4,000
    /// ten-minute runs, a token-wide 20 % outage trips after a median 0.34 s. Every dispatcher must use the
    /// same value: they feed one pool.
    pub pool_trip_evidence: f64,
    /// The pool's second, shorter test (`lua/pool_evidence.lua`, [`crate::evidence::Declared`]): the share of
    /// calls that Meta may answer with its own "service unavailable" code (2, 131016, 133004 in its JSON error
    /// body) before that is evidence of an outage. Each such answer weighs ln(q / this) against the outage rate
    /// q (`fast_trip_outage_rate`), every other call ln((1 - q) / (1 - this)). Ambiguous failures (a bodiless
    /// 5xx, a timeout, 131000) never feed it. 0 (or at least q): off.
    pub pool_unavailable_rate: f64,
    /// Evidence of the second test that opens the breakers of the numbers that contributed (0: off). 10 at a
    /// rate of 0.01, simulated (docs/performance.md): the drill's outage (Meta answering code 2 on 14 % of the
    /// calls and 130429, a 1 s pause each, on another 14 %) trips its first number within 0.5 s in most runs,
    /// where the main test needs seconds; Meta's "unavailable" on a steady 0.5 % of the calls trips rarely, on
    /// 2 % it trips (Meta then states an outage on one call in fifty).
    pub pool_unavailable_evidence: f64,
    /// Limits used when a scope has no config hash in Redis (the coordinator normally writes one).
    pub defaults: ScopeLimits,
}

impl BreakerConfig {
    /// Checks the client settings that the scripts read (the pooled trip); the message names the field.
    pub fn validate_pool(&self) -> Result<(), String> {
        if !(self.pool_trip_evidence.is_finite() && self.pool_trip_evidence >= 0.0) {
            return Err(format!("`pool_trip_evidence` must be 0 (off) or positive, got {}", self.pool_trip_evidence));
        }
        if !(0.0..1.0).contains(&self.pool_unavailable_rate) {
            return Err(format!("`pool_unavailable_rate` must be within [0, 1), got {}", self.pool_unavailable_rate));
        }
        if !(self.pool_unavailable_evidence.is_finite() && self.pool_unavailable_evidence >= 0.0) {
            return Err(format!(
                "`pool_unavailable_evidence` must be 0 (off) or positive, got {}",
                self.pool_unavailable_evidence
            ));
        }
        Ok(())
    }
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            command_timeout_ms: 250,
            redis_retry_after_ms: 1_000,
            fallback_rate_per_s: 5.0,
            fallback_burst: 5.0,
            fallback_failure_threshold: 0.2,
            fallback_min_calls: 10,
            fallback_cooldown_ms: 10_000,
            fallback_replay_retry_ms: 5_000,
            parent_refresh_ms: 1_000,
            token_halt_ttl_ms: 7 * 86_400_000,
            token_halt_retry_ms: 600_000,
            pool_trip_evidence: 16.0,
            pool_unavailable_rate: 0.01,
            pool_unavailable_evidence: 10.0,
            defaults: ScopeLimits::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_encode_every_field() {
        let limits = ScopeLimits::default();
        assert_eq!(limits.validate(), Ok(()));
        let encoded = limits.encode();
        assert_eq!(encoded.matches(';').count(), limits.fields().len());
        assert!(encoded.starts_with("failure_threshold=0.05;min_calls=50;"));
        let bad = ScopeLimits { failure_threshold: 1.5, ..ScopeLimits::default() };
        assert!(bad.validate().expect_err("out of range").contains("failure_threshold"));
    }

    #[test]
    fn the_pooled_trip_is_on_by_default_and_validated() {
        let cfg = BreakerConfig::default();
        assert_eq!((cfg.pool_trip_evidence, cfg.validate_pool()), (16.0, Ok(())));
        let off = BreakerConfig { pool_trip_evidence: 0.0, ..BreakerConfig::default() };
        assert_eq!(off.validate_pool(), Ok(()));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let cfg = BreakerConfig { pool_trip_evidence: bad, ..BreakerConfig::default() };
            assert!(cfg.validate_pool().expect_err("refused").contains("pool_trip_evidence"), "{bad}");
            let cfg = BreakerConfig { pool_unavailable_evidence: bad, ..BreakerConfig::default() };
            assert!(cfg.validate_pool().expect_err("refused").contains("pool_unavailable_evidence"), "{bad}");
        }
        for bad in [-0.1, 1.0, f64::NAN] {
            let cfg = BreakerConfig { pool_unavailable_rate: bad, ..BreakerConfig::default() };
            assert!(cfg.validate_pool().expect_err("refused").contains("pool_unavailable_rate"), "{bad}");
        }
    }
}
