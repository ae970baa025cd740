//! Meta's sending limits: per-number throughput (GCRA with a small burst → 130429) and the pair rate between a
//! business number and one user (1 per 6 s, bursts up to 45 "borrowed" from future quota → 131056).
//!
//! State lives in sharded maps behind short `Mutex` critical sections, keyed by phone number id and by
//! (phone number id, recipient digits).

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Limit settings; [`SimHandle::set_limits`](crate::SimHandle::set_limits) swaps them at runtime.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Master switch; false disables both limits (throughput benchmarks).
    pub enabled: bool,
    /// Messages per second per phone number (Meta: 80 by default, up to 1,000).
    pub throughput_mps: f64,
    /// How many messages may arrive back to back before the rate applies.
    pub throughput_burst: u32,
    pub pair_enabled: bool,
    /// One message per this interval to the same user (Meta: 6 s).
    pub pair_interval_ms: u64,
    /// Messages a burst may borrow from future quota (Meta: 45).
    pub pair_burst: u32,
    /// A burst must fit in this window; afterwards the borrowed time must be repaid (Meta: 6 s).
    pub pair_burst_window_ms: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            enabled: true,
            throughput_mps: 80.0,
            throughput_burst: 10,
            pair_enabled: true,
            pair_interval_ms: 6_000,
            pair_burst: 45,
            pair_burst_window_ms: 6_000,
        }
    }
}

impl Limits {
    /// Everything off.
    pub fn disabled() -> Limits {
        Limits { enabled: false, ..Limits::default() }
    }
}

/// A refusal: how long until the caller is back within the limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Refused {
    pub wait: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Gcra {
    tat: u64,
    burst_start: u64,
}

const SHARDS: usize = 32;
const SWEEP_AT: usize = 8_192;

/// Limiter state for all numbers and pairs.
#[derive(Debug)]
pub struct Limiter {
    base: Instant,
    hasher: RandomState,
    numbers: Vec<Mutex<HashMap<String, Gcra>>>,
    pairs: Vec<Mutex<HashMap<(String, String), Gcra>>>,
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
            numbers: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            pairs: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
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
        for s in &self.numbers {
            lock(s).clear();
        }
        for s in &self.pairs {
            lock(s).clear();
        }
    }

    /// Takes one unit of the number's throughput. Ok(percent of the burst allowance in use after this message).
    pub fn throughput(&self, phone_number_id: &str, mps: f64, burst: u32) -> Result<u32, Refused> {
        let t = (1e9 / mps.max(0.001)) as u64;
        let tau = t.saturating_mul(u64::from(burst.max(1) - 1));
        let now = self.now_ns();
        let mut map = lock(&self.numbers[self.shard(&phone_number_id)]);
        if map.len() > SWEEP_AT {
            map.retain(|_, g| g.tat > now);
        }
        let g = map.entry(phone_number_id.to_string()).or_insert(Gcra { tat: now, burst_start: now });
        let tat = g.tat.max(now);
        if tat - now > tau {
            return Err(Refused { wait: Duration::from_nanos(tat - now - tau) });
        }
        g.tat = tat + t;
        Ok(percent(g.tat - now, tau + t))
    }

    /// Takes one message of the pair's quota (the Meta model: a burst fits in a window and must be repaid).
    pub fn pair(&self, phone_number_id: &str, wa_id: &str, limits: &Limits) -> Result<(), Refused> {
        let t = limits.pair_interval_ms.saturating_mul(1_000_000);
        let cap = t.saturating_mul(u64::from(limits.pair_burst.max(1)));
        let window = limits.pair_burst_window_ms.saturating_mul(1_000_000);
        let now = self.now_ns();
        let key = (phone_number_id.to_string(), wa_id.to_string());
        let mut map = lock(&self.pairs[self.shard(&key)]);
        if map.len() > SWEEP_AT {
            map.retain(|_, g| g.tat > now);
        }
        match map.get_mut(&key) {
            None => {
                map.insert(key, Gcra { tat: now + t, burst_start: now });
                Ok(())
            }
            Some(g) if g.tat <= now => {
                *g = Gcra { tat: now + t, burst_start: now };
                Ok(())
            }
            Some(g) => {
                if now - g.burst_start < window && g.tat - now + t <= cap {
                    g.tat += t;
                    Ok(())
                } else {
                    Err(Refused { wait: Duration::from_nanos(g.tat - now) })
                }
            }
        }
    }
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
    fn pair_burst_must_fit_and_be_repaid() {
        let l = Limiter::new();
        let lim = Limits { pair_burst: 3, pair_interval_ms: 60_000, pair_burst_window_ms: 60_000, ..Limits::default() };
        assert!(l.pair("p", "1", &lim).is_ok());
        assert!(l.pair("p", "1", &lim).is_ok());
        assert!(l.pair("p", "1", &lim).is_ok());
        let r = l.pair("p", "1", &lim).expect_err("burst of 3 used");
        assert!(r.wait > Duration::from_secs(170), "repay 3 × 60 s: {:?}", r.wait);
        assert!(l.pair("p", "2", &lim).is_ok(), "other recipient unaffected");
    }

    #[test]
    fn pair_burst_window_closes() {
        let l = Limiter::new();
        let lim = Limits { pair_burst: 45, pair_interval_ms: 60_000, pair_burst_window_ms: 0, ..Limits::default() };
        assert!(l.pair("p", "1", &lim).is_ok());
        assert!(l.pair("p", "1", &lim).is_err(), "window of 0: no burst");
    }
}
