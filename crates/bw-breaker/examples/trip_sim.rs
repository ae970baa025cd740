//! Measures the breaker's trip decisions at the compiled defaults with the Rust mirror of the scripts
//! (`bw_breaker::evidence`), over seeded simulated traffic: no Redis, no clock, the same figures on every run.
//!
//! `cargo run --release -p bw-breaker --example trip_sim -- [runs] [key=value ...]`
//! (runs: 10-minute runs per noise rate and outage runs per case, default 1000; key=value overrides a
//! `ScopeLimits` field among failure_z, fast_trip_evidence, fast_trip_outage_rate, fast_trip_failures, min_calls;
//! `pooled=E` sets `BreakerConfig::pool_trip_evidence`, 0 leaves the pooled trip out; `unavailable=E` and
//! `unavailable_rate=R` set the pool's second test, `pool_unavailable_evidence` (0: off) and its rate).
//! The pooled rows run 4 numbers of one token, each with its own checks, and the token's pool
//! (`bw_breaker::evidence::Pool`, the mirror of `lua/pool_evidence.lua`). The drill rows model the drill's outage
//! as the drill meets it: Meta answers after 120 ms and each 130429 pauses its number's sends for 1 s.
//! The figures are in docs/performance.md ("Breaker trips on evidence").

use bw_breaker::evidence::sim::{Mix, Traffic, quantile, run, run_token};
use bw_breaker::evidence::{Declared, TripPath};
use bw_breaker::{BreakerConfig, ScopeLimits};

fn main() {
    let mut runs = 1000u64;
    let defaults = BreakerConfig::default();
    let mut pooled_needed = defaults.pool_trip_evidence;
    let mut declared = Declared { rate: defaults.pool_unavailable_rate, needed: defaults.pool_unavailable_evidence };
    let mut limits = ScopeLimits::default();
    for arg in std::env::args().skip(1) {
        match arg.split_once('=') {
            None => runs = arg.parse().expect("runs: a number"),
            Some((k, v)) => {
                let f: f64 = v.parse().expect("a number");
                match k {
                    "failure_z" => limits.failure_z = f,
                    "fast_trip_evidence" => limits.fast_trip_evidence = f,
                    "fast_trip_outage_rate" => limits.fast_trip_outage_rate = f,
                    "fast_trip_failures" => limits.fast_trip_failures = f as u32,
                    "min_calls" => limits.min_calls = f as u32,
                    "pooled" => pooled_needed = f,
                    "unavailable" => declared.needed = f,
                    "unavailable_rate" => declared.rate = f,
                    _ => panic!("unknown key {k}"),
                }
            }
        }
    }
    limits.validate().expect("valid limits");
    println!(
        "limits: threshold {} min_calls {} z {} | fast: q {} evidence {} guard {} in {} ms | {runs} runs per case",
        limits.failure_threshold,
        limits.min_calls,
        limits.failure_z,
        limits.fast_trip_outage_rate,
        limits.fast_trip_evidence,
        limits.fast_trip_failures,
        limits.fast_trip_window_ms
    );
    println!("one number at 75 attempts/s, outcomes recorded every 20 ms");
    for rate in [0.02, 0.04, 0.05] {
        let traffic = Traffic::steady(Mix::errors(rate), 600_000);
        let (mut fast, mut window) = (0, 0);
        for seed in 0..runs {
            match run(&limits, &traffic, seed).map(|t| t.path) {
                Some(TripPath::Fast) => fast += 1,
                Some(TripPath::Window | TripPath::Pooled | TripPath::PooledUnavailable) => window += 1,
                None => {}
            }
        }
        println!(
            "steady {:>2.0} % for 10 min: {} of {runs} runs tripped ({:.2} %; fast {fast}, window {window})",
            rate * 100.0,
            fast + window,
            100.0 * (fast + window) as f64 / runs as f64
        );
    }
    let cases = [
        ("20 % outage after 20 s at 2 %", Mix::errors(0.02), Mix::errors(0.2)),
        ("drill: 14 % 503 + 14 % 130429 after 20 s at 0 %", Mix::errors(0.0), Mix::drill_outage()),
    ];
    for (name, before, after) in cases {
        let traffic = Traffic::outage(before, 20_000, after, 60_000);
        let mut per_number = Vec::new();
        let (mut early, mut never, mut fast) = (0, 0, 0);
        for seed in 0..runs {
            match run(&limits, &traffic, seed) {
                Some(t) if t.at_ms < traffic.change_ms => early += 1,
                Some(t) => {
                    per_number.push((t.at_ms - traffic.change_ms) as f64 / 1000.0);
                    fast += usize::from(t.path == TripPath::Fast);
                }
                None => never += 1,
            }
        }
        // The first of 4 numbers to trip (the drill's "first trip"): consecutive seeds taken 4 at a time.
        let mut first_of_4: Vec<f64> =
            per_number.chunks(4).filter(|c| c.len() == 4).map(|c| c.iter().copied().fold(f64::MAX, f64::min)).collect();
        first_of_4.sort_by(f64::total_cmp);
        per_number.sort_by(f64::total_cmp);
        let within = per_number.iter().filter(|l| **l <= 0.5).count();
        println!(
            "{name}: per number median {:.2} s, p90 {:.2} s, max {:.2} s, within 0.5 s {within} of {}; fast {fast}; \
             tripped before the outage {early}, never {never}; first of 4 numbers: median {:.2} s, p90 {:.2} s",
            quantile(&per_number, 0.5),
            quantile(&per_number, 0.9),
            quantile(&per_number, 1.0),
            per_number.len(),
            quantile(&first_of_4, 0.5),
            quantile(&first_of_4, 0.9),
        );
    }
    if pooled_needed > 0.0 {
        pooled(&limits, pooled_needed, declared, runs);
    }
}

/// Seconds from `change_ms` to a trip at `at_ms`.
fn secs(at_ms: u64, change_ms: u64) -> f64 {
    (at_ms as f64 - change_ms as f64) / 1000.0
}

fn is_pooled(t: &bw_breaker::evidence::sim::Trip) -> bool {
    matches!(t.path, TripPath::Pooled | TripPath::PooledUnavailable)
}

/// 4 numbers of one token: each number's own checks and the pool at `needed` and its second test `declared`.
fn pooled(limits: &ScopeLimits, needed: f64, declared: Declared, runs: u64) {
    println!(
        "4 numbers of one token, pooled trip at evidence {needed}, Meta's declared unavailability at rate {} \
         evidence {}; each number also keeps its own checks",
        declared.rate, declared.needed
    );
    let noise = [
        ("ambiguous", 0.02, Mix::errors(0.02)),
        ("ambiguous", 0.04, Mix::errors(0.04)),
        ("ambiguous", 0.05, Mix::errors(0.05)),
        ("declared unavailable", 0.005, Mix::unavailable(0.005)),
        ("declared unavailable", 0.01, Mix::unavailable(0.01)),
        ("declared unavailable", 0.02, Mix::unavailable(0.02)),
        ("declared unavailable", 0.04, Mix::unavailable(0.04)),
    ];
    for (kind, rate, mix) in noise {
        let traffic = [Traffic::steady(mix, 600_000); 4];
        let (mut any, mut by_pool, mut by_second) = (0, 0, 0);
        for seed in 0..runs {
            let trips = run_token(limits, needed, declared, &traffic, seed);
            any += usize::from(trips.iter().any(Option::is_some));
            by_pool += usize::from(trips.iter().flatten().any(is_pooled));
            by_second += usize::from(trips.iter().flatten().any(|t| t.path == TripPath::PooledUnavailable));
        }
        println!(
            "steady {:.1} % {kind} on all 4 for 10 min: {any} of {runs} runs tripped a number ({by_pool} through the \
             pool, {by_second} of them on the second test)",
            rate * 100.0
        );
    }
    let cases = [
        (
            "token-wide 20 % outage after 20 s at 2 %",
            Traffic::outage(Mix::errors(0.02), 20_000, Mix::errors(0.2), 30_000),
        ),
        (
            "token-wide drill outage at full rate, 14 % code 2 + 14 % 130429",
            Traffic::outage(Mix::errors(0.0), 20_000, Mix::drill_outage(), 30_000),
        ),
        ("token-wide drill outage as the drill meets it (120 ms, 1 s pause per 130429)", Traffic::drill(30_000)),
        (
            "the same with ambiguous 503s (no Meta body)",
            Traffic { after: Mix { transient: 0.14, unavailable: 0.0, throttle: 0.14 }, ..Traffic::drill(30_000) },
        ),
    ];
    for (name, traffic) in cases {
        let (mut first, mut all) = (Vec::new(), Vec::new());
        let (mut early, mut never, mut pooled_first) = (0, 0, 0);
        for seed in 0..runs {
            let trips = run_token(limits, needed, declared, &[traffic; 4], seed);
            if trips.iter().flatten().any(|t| t.at_ms <= traffic.change_ms) {
                early += 1;
                continue;
            }
            let Some(f) = trips.iter().flatten().min_by_key(|t| t.at_ms) else {
                never += 1;
                continue;
            };
            pooled_first += usize::from(is_pooled(f));
            first.push(secs(f.at_ms, traffic.change_ms));
            if trips.iter().all(Option::is_some) {
                let last = trips.iter().flatten().map(|t| t.at_ms).max().unwrap_or(0);
                all.push(secs(last, traffic.change_ms));
            }
        }
        first.sort_by(f64::total_cmp);
        all.sort_by(f64::total_cmp);
        let within = first.iter().filter(|l| **l <= 0.5).count();
        println!(
            "{name}: first trip median {:.2} s, p90 {:.2} s, within 0.5 s {within} of {} ({:.0} %), through the pool \
             {pooled_first}; all 4 tripped in {} runs, median {:.2} s, p90 {:.2} s; before the outage {early}, \
             never {never}",
            quantile(&first, 0.5),
            quantile(&first, 0.9),
            first.len(),
            100.0 * within as f64 / first.len().max(1) as f64,
            all.len(),
            quantile(&all, 0.5),
            quantile(&all, 0.9),
        );
    }
    for healthy_rate in [0.0, 0.02] {
        let bad = Traffic::outage(Mix::errors(healthy_rate), 20_000, Mix::errors(0.2), 30_000);
        let healthy = Traffic::steady(Mix::errors(healthy_rate), 50_000);
        let (mut lat, mut healthy_trips, mut bad_by_pool) = (Vec::new(), 0, 0);
        for seed in 0..runs {
            let trips = run_token(limits, needed, declared, &[bad, healthy, healthy, healthy], seed);
            healthy_trips += trips[1..].iter().filter(|t| t.is_some()).count();
            if let Some(t) = trips[0] {
                bad_by_pool += usize::from(is_pooled(&t));
                lat.push(secs(t.at_ms, bad.change_ms));
            }
        }
        lat.sort_by(f64::total_cmp);
        println!(
            "one number at 20 % among 3 healthy at {:.0} %: it trips in {} of {runs} runs, median {:.2} s, p90 {:.2} s \
             ({bad_by_pool} through the pool); healthy numbers tripped: {healthy_trips}",
            healthy_rate * 100.0,
            lat.len(),
            quantile(&lat, 0.5),
            quantile(&lat, 0.9),
        );
    }
}
