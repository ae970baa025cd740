//! Measures the breaker's trip decisions at the compiled defaults with the Rust mirror of the scripts
//! (`bw_breaker::evidence`), over seeded simulated traffic: no Redis, no clock, the same figures on every run.
//!
//! `cargo run --release -p bw-breaker --example trip_sim -- [runs] [key=value ...]`
//! (runs: 10-minute runs per noise rate and outage runs per case, default 1000; key=value overrides a
//! `ScopeLimits` field among failure_z, fast_trip_evidence, fast_trip_outage_rate, fast_trip_failures, min_calls;
//! `pooled=E` sets `BreakerConfig::pool_trip_evidence`, 0 leaves the pooled trip out).
//! The pooled rows run 4 numbers of one token, each with its own checks, and the token's pool
//! (`bw_breaker::evidence::Pool`, the mirror of `lua/pool_evidence.lua`).
//! The figures are in docs/performance.md ("Breaker trips on evidence").

use bw_breaker::evidence::TripPath;
use bw_breaker::evidence::sim::{Mix, Traffic, quantile, run, run_token};
use bw_breaker::{BreakerConfig, ScopeLimits};

fn main() {
    let mut runs = 1000u64;
    let mut pooled_needed = BreakerConfig::default().pool_trip_evidence;
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
                Some(TripPath::Window | TripPath::Pooled) => window += 1,
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
        ("drill: 14 % 503 + 14 % 130429 after 20 s at 0 %", Mix::errors(0.0), Mix { transient: 0.14, throttle: 0.14 }),
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
        pooled(&limits, pooled_needed, runs);
    }
}

/// Seconds from `change_ms` to a trip at `at_ms`.
fn secs(at_ms: u64, change_ms: u64) -> f64 {
    (at_ms as f64 - change_ms as f64) / 1000.0
}

/// 4 numbers of one token: each number's own checks and the pool at `needed`.
fn pooled(limits: &ScopeLimits, needed: f64, runs: u64) {
    println!("4 numbers of one token, pooled trip at evidence {needed}; each number also keeps its own checks");
    for rate in [0.02, 0.04, 0.05] {
        let traffic = [Traffic::steady(Mix::errors(rate), 600_000); 4];
        let (mut any, mut by_pool) = (0, 0);
        for seed in 0..runs {
            let trips = run_token(limits, needed, &traffic, seed);
            any += usize::from(trips.iter().any(Option::is_some));
            by_pool += usize::from(trips.iter().flatten().any(|t| t.path == TripPath::Pooled));
        }
        println!(
            "steady {:>2.0} % on all 4 for 10 min: {any} of {runs} runs tripped a number ({by_pool} through the pool)",
            rate * 100.0
        );
    }
    let cases = [
        ("token-wide 20 % outage after 20 s at 2 %", Mix::errors(0.02), Mix::errors(0.2)),
        ("token-wide drill outage, 14 % 503 + 14 % 130429", Mix::errors(0.0), Mix { transient: 0.14, throttle: 0.14 }),
    ];
    for (name, before, after) in cases {
        let traffic = Traffic::outage(before, 20_000, after, 30_000);
        let (mut first, mut all) = (Vec::new(), Vec::new());
        let (mut early, mut never, mut pooled_first) = (0, 0, 0);
        for seed in 0..runs {
            let trips = run_token(limits, needed, &[traffic; 4], seed);
            if trips.iter().flatten().any(|t| t.at_ms <= traffic.change_ms) {
                early += 1;
                continue;
            }
            let Some(f) = trips.iter().flatten().min_by_key(|t| t.at_ms) else {
                never += 1;
                continue;
            };
            pooled_first += usize::from(f.path == TripPath::Pooled);
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
            let trips = run_token(limits, needed, &[bad, healthy, healthy, healthy], seed);
            healthy_trips += trips[1..].iter().filter(|t| t.is_some()).count();
            if let Some(t) = trips[0] {
                bad_by_pool += usize::from(t.path == TripPath::Pooled);
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
