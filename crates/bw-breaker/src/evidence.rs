//! The fast trip's decision, mirrored from `lua/record_outcomes.lua` (`fast_llr`, `fast_check`): a CUSUM of
//! per-call log-likelihood ratios between the outage rate q (`fast_trip_outage_rate`) and the tolerated rate p
//! (`failure_threshold`). A failed call adds ln(q/p), a successful one ln((1-q)/(1-p)) (negative); the evidence
//! is max(0, evidence + the batch's sum) and the breaker opens at `fast_trip_evidence`, once
//! `fast_trip_failures` distinct recipients failed within `fast_trip_window_ms`.
//!
//! Why not a count: failures that are plausible at the threshold rate must not build evidence. Three failures
//! in 50 calls happen at 2 % about once in twelve windows, so "3 failures in 2 s" tripped healthy numbers. At a
//! rate below p the evidence drifts down and stays near 0; at q it climbs by about 0.14 per call. The batch is
//! summed before the clamp at 0, so the order of outcomes within a batch never changes the decision (the old
//! count started at the first failure, so 96 successes then 4 failures tripped and 4 failures first did not).
//!
//! The expressions are written as in the Lua so both round alike; the table test in tests/it/evidence.rs runs
//! the same (calls, failures) cases against this module and against the script on a real redis-server.

use crate::ScopeLimits;

/// Per-call weights of the evidence for one configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    /// Added per failed call: ln(q / p).
    pub per_failure: f64,
    /// Added per successful call: ln((1 - q) / (1 - p)), negative.
    pub per_success: f64,
    /// Evidence that opens the breaker.
    pub needed: f64,
}

impl Evidence {
    /// The weights of `limits`, or None when the fast trip cannot decide: off (`fast_trip_failures` 0), or an
    /// outage rate not strictly between the threshold and 1 (nothing to tell apart; the Lua skips it too).
    pub fn of(limits: &ScopeLimits) -> Option<Evidence> {
        let (p, q) = (limits.failure_threshold, limits.fast_trip_outage_rate);
        if limits.fast_trip_failures == 0 || p <= 0.0 || q <= p || q >= 1.0 {
            return None;
        }
        Some(Evidence {
            per_failure: (q / p).ln(),
            per_success: ((1.0 - q) / (1.0 - p)).ln(),
            needed: limits.fast_trip_evidence,
        })
    }

    /// Log-likelihood ratio of one batch of `calls` calls of which `failures` failed (Lua `fast_llr`).
    pub fn llr(&self, calls: u64, failures: u64) -> f64 {
        let (calls, failures) = (calls as f64, failures as f64);
        failures * self.per_failure + (calls - failures) * self.per_success
    }

    /// The evidence after a batch (Lua `fast_check`): never below 0, so a healthy past cannot hide an outage.
    pub fn step(&self, evidence: f64, calls: u64, failures: u64) -> f64 {
        (evidence + self.llr(calls, failures)).max(0.0)
    }

    /// Whether `evidence` opens the breaker (given the distinct-recipient guard holds).
    pub fn trips(&self, evidence: f64) -> bool {
        evidence >= self.needed
    }
}

/// Whether one batch of `calls` calls with `failures` failures of distinct recipients, recorded on a fresh
/// CLOSED scope, fast-trips at `limits`: the (calls, failures) → trip table of the tests.
pub fn batch_trips(limits: &ScopeLimits, calls: u64, failures: u64) -> bool {
    match Evidence::of(limits) {
        Some(e) => failures >= u64::from(limits.fast_trip_failures) && e.trips(e.step(0.0, calls, failures)),
        None => false,
    }
}

/// The fast trip of one CLOSED scope over time, as the script keeps it: the evidence and the window of distinct
/// failed recipients (opened by a transient failure, `fast_trip_window_ms` long). Used by the simulations.
#[derive(Debug, Clone)]
pub struct FastTrip {
    limits: ScopeLimits,
    evidence: Option<Evidence>,
    /// Current evidence.
    pub value: f64,
    since_ms: Option<u64>,
    recipients: Vec<String>,
}

impl FastTrip {
    /// A fresh scope.
    pub fn new(limits: &ScopeLimits) -> FastTrip {
        FastTrip {
            limits: limits.clone(),
            evidence: Evidence::of(limits),
            value: 0.0,
            since_ms: None,
            recipients: Vec::new(),
        }
    }

    fn open(&self, now_ms: u64) -> bool {
        self.since_ms.is_some_and(|s| now_ms.saturating_sub(s) <= self.limits.fast_trip_window_ms)
    }

    /// Records one batch answered at `now_ms`: each item is (recipient key, failed transiently). Returns true
    /// when the batch opens the breaker.
    pub fn record(&mut self, now_ms: u64, batch: &[(&str, bool)]) -> bool {
        let Some(e) = self.evidence else { return false };
        let mut failures = 0;
        for (key, failed) in batch {
            if !failed {
                continue;
            }
            failures += 1;
            if !self.open(now_ms) {
                self.since_ms = Some(now_ms);
                self.recipients.clear();
            }
            if !self.recipients.iter().any(|r| r == key) {
                self.recipients.push((*key).to_string());
            }
        }
        if batch.is_empty() {
            return false;
        }
        self.value = e.step(self.value, batch.len() as u64, failures);
        e.trips(self.value) && self.open(now_ms) && self.recipients.len() >= self.limits.fast_trip_failures as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_at_the_defaults() {
        let e = Evidence::of(&ScopeLimits::default()).expect("on by default");
        assert!((e.per_failure - 4f64.ln()).abs() < 1e-12);
        assert!(e.per_success < 0.0);
        // A steady rate at the threshold drifts down; an outage at q climbs.
        assert!(e.llr(1000, 50) < 0.0);
        assert!(e.llr(1000, 200) > 0.0);
        assert!(Evidence::of(&ScopeLimits { fast_trip_failures: 0, ..ScopeLimits::default() }).is_none());
        assert!(Evidence::of(&ScopeLimits { failure_threshold: 0.5, ..ScopeLimits::default() }).is_none());
    }
}
