//! Shared helpers: a breaker over a fresh Redis with short windows, unique scopes.

use bw_breaker::{AdmitItem, Breaker, BreakerConfig, OutcomeItem, OutcomeKind, Scope, ScopeLimits, TrafficClass};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

static NEXT: AtomicU32 = AtomicU32::new(1);

/// A scope no other test uses.
pub(crate) fn scope() -> Scope {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    Scope::new(format!("waba{n}"), format!("10{n:04}"))
}

pub(crate) async fn manager(url: &str) -> redis::aio::ConnectionManager {
    bw_common::redis_conn::connect(url, Duration::from_millis(500), Duration::from_secs(5))
        .await
        .expect("redis connects")
}

/// Limits with short windows and no ramp; tests override what they need.
pub(crate) fn limits() -> ScopeLimits {
    ScopeLimits {
        failure_threshold: 0.5,
        min_calls: 4,
        // The bare rate compare: these tests exercise the window's mechanics with a handful of calls; the Wilson
        // bound of the defaults is tested in evidence.rs.
        failure_z: 0.0,
        window_ms: 60_000,
        window_buckets: 10,
        cooldown_ms: 60_000,
        cooldown_jitter: 0.0,
        canaries_per_s: 1000,
        close_after_successes: 3,
        ramp_ms: 0,
        rate_per_s: 1000.0,
        burst: 1000.0,
        pair_burst: 1000,
        // The fast trip is tested on its own at the default config; these tests exercise the sliding window.
        fast_trip_failures: 0,
        ..ScopeLimits::default()
    }
}

pub(crate) fn config(limits: ScopeLimits) -> BreakerConfig {
    BreakerConfig { command_timeout_ms: 500, redis_retry_after_ms: 200, defaults: limits, ..BreakerConfig::default() }
}

pub(crate) async fn breaker(url: &str, limits: ScopeLimits) -> Breaker {
    Breaker::new(Some(manager(url).await), None, config(limits))
}

pub(crate) fn items(n: usize, class: TrafficClass) -> Vec<AdmitItem> {
    (0..n).map(|i| AdmitItem { recipient_key: format!("r{i}"), class }).collect()
}

pub(crate) fn outcomes(n: usize, kind: OutcomeKind, canary: bool) -> Vec<OutcomeItem> {
    (0..n).map(|i| OutcomeItem { recipient_key: format!("r{i}"), kind, canary }).collect()
}
