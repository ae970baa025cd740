//! The fast trip decides on evidence (bw_breaker::evidence, lua/record_outcomes.lua): the same (calls,
//! failures) table against the Rust mirror and the script on a real redis-server, order independence within a
//! batch, and seeded simulations of noise and an outage at the compiled defaults.

use crate::support::{breaker, scope};
use bw_breaker::evidence::{Evidence, FastTrip, batch_trips};
use bw_breaker::{Breaker, OutcomeItem, OutcomeKind, ScopeLimits};
use bw_common::proto::BreakerState;

/// The compiled defaults with the sliding window's rate trip out of reach (min_calls), so a batch can only open
/// the breaker through the fast trip. Every fast-trip knob stays at its default.
fn fast_only() -> ScopeLimits {
    ScopeLimits { min_calls: u32::MAX, ..ScopeLimits::default() }
}

/// A batch of `failures` transient failures (distinct recipients) and `calls - failures` successes, in the
/// order given by `fail_at` (true: this position fails).
fn batch(prefix: &str, fail_at: &[bool]) -> Vec<OutcomeItem> {
    fail_at
        .iter()
        .enumerate()
        .map(|(i, f)| OutcomeItem {
            recipient_key: format!("{prefix}{i}"),
            kind: if *f { OutcomeKind::Transient } else { OutcomeKind::Success },
            canary: false,
        })
        .collect()
}

fn failures_first(calls: usize, failures: usize) -> Vec<bool> {
    (0..calls).map(|i| i < failures).collect()
}

async fn lua_trips(b: &Breaker, outcomes: &[OutcomeItem]) -> bool {
    let r = b.record(&scope(), outcomes).await;
    assert!(!r.degraded);
    if r.state == BreakerState::Open {
        assert!(r.transitions[0].reason.contains("fast trip"), "{:?}", r.transitions);
        true
    } else {
        assert_eq!(r.state, BreakerState::Closed);
        false
    }
}

/// Tiny deterministic generator (xorshift64*), so the simulations are the same on every run.
struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_f64() * n as f64) as usize
    }
}

/// (calls, failures, trips at the defaults). 14 nats at q = 0.2 against p = 0.05: each failure adds ln 4 and
/// each success ln(0.8/0.95), so a batch trips when 1.386 f - 0.172 (n - f) >= 14 and f >= 3 recipients.
const TABLE: &[(u64, u64, bool)] = &[
    (3, 3, false),   // the old rule's trip: 3 distinct failures, now 4.2 nats
    (52, 3, false),  // the noise trip: 3 in 52 calls
    (10, 10, false), // 13.9 nats
    (11, 11, true),  // 15.2
    (13, 12, true),  // 16.5
    (20, 13, true),  // 16.8
    (40, 15, true),  // 16.5
    (50, 3, false),
    (100, 4, false),  // the order example
    (100, 20, false), // 13.98: just short
    (100, 25, true),
    (150, 30, true),
    (1000, 50, false), // exactly at the threshold: evidence for q is against
    (1000, 200, true),
    (2, 0, false),
    (0, 0, false),
];

#[test]
fn table_matches_the_rust_mirror() {
    let limits = fast_only();
    let e = Evidence::of(&limits).expect("on");
    for &(calls, failures, trips) in TABLE {
        let expect = failures >= 3 && e.llr(calls, failures) >= 14.0;
        assert_eq!(expect, trips, "({calls}, {failures})");
        assert_eq!(batch_trips(&limits, calls, failures), trips, "({calls}, {failures})");
    }
}

#[tokio::test]
async fn the_same_table_decides_in_lua_and_in_rust() {
    let redis = bw_testkit::RedisServer::start();
    let limits = fast_only();
    let b = breaker(&redis.url(), limits.clone()).await;
    let mut tripped = 0;
    for &(calls, failures, trips) in TABLE {
        let rust = batch_trips(&limits, calls, failures);
        assert_eq!(rust, trips, "({calls}, {failures})");
        let lua = lua_trips(&b, &batch("t", &failures_first(calls as usize, failures as usize))).await;
        assert_eq!(lua, rust, "({calls}, {failures})");
        tripped += usize::from(rust);
    }
    // Both decisions occur in the table.
    assert!(tripped >= 3 && tripped < TABLE.len(), "{tripped}");
    // Around the boundary, every failure count up to the trip: Lua and Rust agree call for call.
    for calls in [11u64, 30, 74, 148] {
        for failures in 0..=calls.min(40) {
            let rust = batch_trips(&limits, calls, failures);
            let lua = lua_trips(&b, &batch("b", &failures_first(calls as usize, failures as usize))).await;
            assert_eq!(lua, rust, "({calls}, {failures})");
        }
    }
}

#[tokio::test]
async fn the_order_within_a_batch_does_not_matter() {
    let redis = bw_testkit::RedisServer::start();
    let limits = fast_only();
    let b = breaker(&redis.url(), limits.clone()).await;
    // The example: 96 successes then 4 failures, and 4 failures first.
    let last: Vec<bool> = (0..100).map(|i| i >= 96).collect();
    assert!(!lua_trips(&b, &batch("a", &last)).await);
    assert!(!lua_trips(&b, &batch("a", &failures_first(100, 4))).await);
    // Cases on both sides of the boundary, each in 8 seeded permutations.
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for &(calls, failures) in &[(13usize, 12usize), (20, 13), (40, 14), (40, 16), (100, 25), (100, 20), (52, 3)] {
        let rust = batch_trips(&limits, calls as u64, failures as u64);
        for _ in 0..8 {
            let mut order = failures_first(calls, failures);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            assert_eq!(lua_trips(&b, &batch("p", &order)).await, rust, "({calls}, {failures}) {order:?}");
            // The Rust mirror over the same permutation, as one batch.
            let keys: Vec<String> = (0..calls).map(|i| format!("p{i}")).collect();
            let items: Vec<(&str, bool)> = keys.iter().map(String::as_str).zip(order.iter().copied()).collect();
            assert_eq!(FastTrip::new(&limits).record(0, &items), rust);
        }
    }
}

#[tokio::test]
async fn batches_over_time_build_the_same_evidence_in_lua_and_rust() {
    let redis = bw_testkit::RedisServer::start();
    let limits = fast_only();
    let b = breaker(&redis.url(), limits.clone()).await;
    let mut rng = Rng(7);
    for case in 0..6 {
        let s = scope();
        let mut mirror = FastTrip::new(&limits);
        let rate = [0.02, 0.1, 0.2, 0.3, 0.05, 0.25][case];
        let mut tripped = false;
        for round in 0..60 {
            let n = 1 + rng.below(12);
            let order: Vec<bool> = (0..n).map(|_| rng.next_f64() < rate).collect();
            let outcomes = batch(&format!("c{round}-"), &order);
            let keys: Vec<String> = outcomes.iter().map(|o| o.recipient_key.clone()).collect();
            let items: Vec<(&str, bool)> = keys.iter().map(String::as_str).zip(order.iter().copied()).collect();
            // The whole case takes well under the 2 s guard window of the script's clock; the mirror's clock
            // stands still, so both see every failure in the window.
            let rust = mirror.record(0, &items);
            let r = b.record(&s, &outcomes).await;
            assert_eq!(r.state == BreakerState::Open, rust, "case {case} round {round} evidence {}", mirror.value);
            if rust {
                tripped = true;
                break;
            }
        }
        if rate >= 0.2 {
            assert!(tripped, "case {case}: {rate} over 60 batches did not trip");
        }
    }
}

/// Calls per second at the compiled default rate.
fn full_rate() -> f64 {
    ScopeLimits::default().rate_per_s
}

/// Simulated time: one call answered every 1/rate s, each its own batch (the most checks, the most chances to
/// trip), failing with probability `p_before` until `change_ms` and `p_after` from then. Returns the
/// simulated ms of the first fast trip.
fn simulate(seed: u64, end_ms: f64, change_ms: f64, p_before: f64, p_after: f64) -> Option<f64> {
    let limits = ScopeLimits::default();
    let mut trip = FastTrip::new(&limits);
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let step = 1000.0 / full_rate();
    let mut i = 0u64;
    loop {
        let t = i as f64 * step;
        if t >= end_ms {
            return None;
        }
        let p = if t < change_ms { p_before } else { p_after };
        let key = format!("r{i}");
        if trip.record(t as u64, &[(key.as_str(), rng.next_f64() < p)]) {
            return Some(t);
        }
        i += 1;
    }
}

#[test]
fn steady_noise_under_the_threshold_never_trips_at_the_defaults() {
    let limits = ScopeLimits::default();
    assert_eq!(limits.failure_threshold, 0.05);
    for rate in [0.02, 0.04] {
        for seed in 1..=8 {
            assert_eq!(simulate(seed, 600_000.0, f64::INFINITY, rate, rate), None, "{rate} seed {seed}");
        }
    }
}

/// A 20 % outage starting at 10 s (after 2 % noise). Information bound: in the first 0.5 s a number at 74/s
/// answers 37 calls; a count that trips on >= k of them with P(trip) >= 0.5 at 20 % (k <= 7) also trips
/// P(Bin(37, 0.04) >= 7) = 6e-4 of 0.5 s windows at 4 %, several times in 10 minutes. So at the defaults the
/// fast trip catches the outage in about 1.6 s (median of these 16 seeds; the sliding window needs about
/// 2.5 s), and this test holds it to 2 s, not to 0.5 s.
#[test]
fn an_outage_trips_within_seconds_at_the_defaults() {
    let mut latencies: Vec<f64> = (1..=16)
        .map(|seed| {
            let at = simulate(seed, 30_000.0, 10_000.0, 0.02, 0.2).expect("the outage trips");
            assert!(at >= 10_000.0, "seed {seed} tripped before the outage, at {at} ms");
            at - 10_000.0
        })
        .collect();
    latencies.sort_by(f64::total_cmp);
    let median = latencies[latencies.len() / 2];
    eprintln!("20 % outage, fast-trip latency over 16 seeds (ms): {latencies:?}");
    assert!(median <= 2_000.0, "{latencies:?}");
    assert!(latencies.iter().all(|l| *l <= 4_000.0), "{latencies:?}");
}

/// The real Lua path under a 4 % stream: 10 minutes' worth of calls at the default rate (44,400), recorded in
/// batches of 10 as fast as Redis takes them (the script's clock runs faster than the stream's, which only
/// makes the distinct-recipient guard easier to meet). Run by hand:
/// `cargo nextest run -p bw-breaker --run-ignored only lua_noise_stream --no-capture`.
#[tokio::test]
#[ignore]
async fn lua_noise_stream() {
    let redis = bw_testkit::RedisServer::start();
    let limits = fast_only();
    let b = breaker(&redis.url(), limits.clone()).await;
    for rate in [0.02, 0.04, 0.2] {
        for seed in 1..=3u64 {
            let s = scope();
            let mut rng = Rng(seed * 1_000_003);
            let total = (full_rate() * 600.0) as usize;
            let mut sent = 0;
            let mut trip_at = None;
            while sent < total {
                let order: Vec<bool> = (0..10).map(|_| rng.next_f64() < rate).collect();
                let r = b.record(&s, &batch(&format!("s{sent}-"), &order)).await;
                sent += 10;
                if r.state == BreakerState::Open {
                    trip_at = Some(sent);
                    break;
                }
            }
            eprintln!("lua stream: rate {rate} seed {seed}: {sent} calls, trip after {trip_at:?} calls");
            if rate < 0.05 {
                assert_eq!(trip_at, None, "rate {rate} seed {seed}");
            } else {
                assert!(trip_at.is_some_and(|n| n <= 400), "rate {rate} seed {seed}: {trip_at:?}");
            }
        }
    }
}
