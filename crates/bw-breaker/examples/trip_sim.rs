//! Measures the breaker's trip decisions at the compiled defaults with the Rust mirror of the scripts
//! (`bw_breaker::evidence`), over seeded simulated traffic: no Redis, no clock, the same figures on every run.
//!
//! `cargo run --release -p bw-breaker --example trip_sim -- [runs] [key=value ...]`
//! (runs: 10-minute runs per noise rate and outage runs per case, default 1000; key=value overrides a
//! `ScopeLimits` field among failure_z, fast_trip_evidence, fast_trip_outage_rate, fast_trip_failures, min_calls;
//! `pooled=E` also measures the pooled-evidence prototype over 4 numbers tripping at E).
//! The figures are in docs/performance.md ("Breaker trips on evidence").

use bw_breaker::ScopeLimits;
use bw_breaker::evidence::TripPath;
use bw_breaker::evidence::sim::{Mix, Traffic, quantile, run, run_pooled};

fn main() {
    let mut runs = 1000u64;
    let mut pooled_needed = 0.0f64;
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
                Some(TripPath::Window) => window += 1,
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
        println!("pooled evidence over 4 numbers sharing a token, trips at {pooled_needed} (prototype)");
        for rate in [0.02, 0.04, 0.05] {
            let traffic = Traffic::steady(Mix::errors(rate), 600_000);
            let tripped =
                (0..runs).filter(|seed| run_pooled(&limits, &traffic, 4, pooled_needed, *seed).0.is_some()).count();
            println!("pooled, steady {:>2.0} % on all 4 for 10 min: {tripped} of {runs} runs tripped", rate * 100.0);
        }
        let cases = [
            ("pooled, 20 % outage after 20 s at 2 %", Mix::errors(0.02), Mix::errors(0.2)),
            ("pooled, drill 14 % 503 + 14 % 130429", Mix::errors(0.0), Mix { transient: 0.14, throttle: 0.14 }),
        ];
        for (name, before, after) in cases {
            let traffic = Traffic::outage(before, 20_000, after, 30_000);
            let (mut pooled, mut single, mut early) = (Vec::new(), Vec::new(), 0);
            for seed in 0..runs {
                let (p, s) = run_pooled(&limits, &traffic, 4, pooled_needed, seed);
                for (at, out) in [(p, &mut pooled), (s, &mut single)] {
                    match at {
                        Some(t) if t < traffic.change_ms => early += 1,
                        Some(t) => out.push((t - traffic.change_ms) as f64 / 1000.0),
                        None => {}
                    }
                }
            }
            pooled.sort_by(f64::total_cmp);
            single.sort_by(f64::total_cmp);
            let within = pooled.iter().filter(|l| **l <= 0.5).count();
            println!(
                "{name}: pooled median {:.2} s, p90 {:.2} s, within 0.5 s {within} of {}; first per-number trip \
                 median {:.2} s, p90 {:.2} s; trips before the outage {early}",
                quantile(&pooled, 0.5),
                quantile(&pooled, 0.9),
                pooled.len(),
                quantile(&single, 0.5),
                quantile(&single, 0.9),
            );
        }
    }
}
