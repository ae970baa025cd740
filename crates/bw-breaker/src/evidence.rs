//! The breaker's trip decisions on evidence, mirrored from `lua/record_outcomes.lua`: the sliding window's
//! ([`window_trips`], Lua `window_trips`: a Wilson lower bound of the window's failure rate) and the fast trip's
//! (Lua `fast_llr`, `fast_check`), and [`sim`], which replays seeded traffic through both.
//!
//! The fast trip is a CUSUM of
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

use crate::config::ScopeLimits;

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

/// Whether the sliding window's `calls` and `failures` open a CLOSED breaker (Lua `window_trips`): at least
/// `min_calls` calls, the rate at or above `failure_threshold` (the exact per-mille compare), and the Wilson lower
/// bound of the rate at z = `failure_z` at or above it too, i.e. failures - calls p >= z sqrt(calls p (1 - p)).
/// The expressions are the Lua's, operation for operation, so both round alike.
pub fn window_trips(limits: &ScopeLimits, calls: u64, failures: u64) -> bool {
    let permille = (limits.failure_threshold * 1000.0 + 0.5).floor() as u64;
    if calls == 0 || calls < u64::from(limits.min_calls) || failures * 1000 < calls * permille {
        return false;
    }
    // z 0 is the bare rate, decided by the exact compare above (7 - 100 * 0.07 is below 0 in floats).
    let (p, z, n, f) = (limits.failure_threshold, limits.failure_z, calls as f64, failures as f64);
    z <= 0.0 || f - n * p >= z * (n * p * (1.0 - p)).sqrt()
}

/// The sliding window of one scope as the prelude keeps it (`window_add`, `window_sum`): `window_buckets`
/// buckets of `window_ms / window_buckets` ms, each holding its bucket number, calls and failures.
#[derive(Debug, Clone)]
pub struct Window {
    bucket_ms: u64,
    buckets: Vec<(i64, u64, u64)>,
}

impl Window {
    /// An empty window for `limits`.
    pub fn new(limits: &ScopeLimits) -> Window {
        let n = limits.window_buckets.clamp(1, 60);
        let window_ms = limits.window_ms.max(u64::from(n));
        Window { bucket_ms: (window_ms / u64::from(n)).max(1), buckets: vec![(-1, 0, 0); n as usize] }
    }

    /// Adds calls and failures answered at `now_ms`.
    pub fn add(&mut self, now_ms: u64, calls: u64, failures: u64) {
        let n = (now_ms / self.bucket_ms) as i64;
        let len = self.buckets.len() as i64;
        let b = &mut self.buckets[(n % len) as usize];
        if b.0 != n {
            *b = (n, 0, 0);
        }
        b.1 += calls;
        b.2 += failures;
    }

    /// (calls, failures) in the window at `now_ms`.
    pub fn sum(&self, now_ms: u64) -> (u64, u64) {
        let n = (now_ms / self.bucket_ms) as i64;
        let len = self.buckets.len() as i64;
        self.buckets.iter().filter(|b| b.0 > n - len && b.0 <= n).fold((0, 0), |(c, f), b| (c + b.1, f + b.2))
    }
}

/// Codes by which Meta itself states that its service is unavailable (meta-cloud-api.md §2.3: 2 "API Service:
/// downtime or overload", 131016 "A service is temporarily unavailable", 133004 "Server temporarily
/// unavailable"), answered in Meta's JSON error body. They weigh in the pool's second test
/// ([`crate::OutcomeKind::Unavailable`]); 1 ("invalid request or possible server error") and 131000 ("unknown
/// error") do not state an outage and stay with the ambiguous failures (a bodiless 5xx, a timeout, a reset).
pub const UNAVAILABLE_CODES: [i64; 3] = [2, 131016, 133004];

/// Whether Meta's error `code` states that its service is unavailable ([`UNAVAILABLE_CODES`]).
pub fn declares_unavailable(code: i64) -> bool {
    UNAVAILABLE_CODES.contains(&code)
}

/// The pool's second, shorter test (`lua/pool_evidence.lua`): the CUSUM of Meta's declared unavailability, each
/// such answer a failure at the tolerated rate `rate` against the outage rate q, every other call a success, and
/// its own trip level `needed`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Declared {
    /// Tolerated share of calls that Meta answers "unavailable" (`BreakerConfig::pool_unavailable_rate`).
    pub rate: f64,
    /// Evidence that trips it (`BreakerConfig::pool_unavailable_evidence`; 0 is off).
    pub needed: f64,
}

impl Declared {
    /// Off.
    pub const OFF: Declared = Declared { rate: 0.0, needed: 0.0 };

    /// Log-likelihood ratio of a batch of `calls` calls of which `declared` were Meta's declared unavailability,
    /// against outage rate `q` (the Lua's expression), or None when the test is off.
    pub fn llr(&self, q: f64, calls: u64, declared: u64) -> Option<f64> {
        if self.needed <= 0.0 || self.rate <= 0.0 || self.rate >= q {
            return None;
        }
        let (calls, declared) = (calls as f64, declared as f64);
        Some(declared * (q / self.rate).ln() + (calls - declared) * ((1.0 - q) / (1.0 - self.rate)).ln())
    }
}

/// Which of the pool's tests tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolTest {
    /// The fast trip's evidence over every transient failure.
    Evidence,
    /// The second test, Meta's declared unavailability ([`Declared`]).
    Unavailable,
}

/// The pooled fast trip of one access token, as `lua/pool_evidence.lua` keeps it: the fast trip's evidence
/// summed over the batches of every number of the token, the second test's ([`Declared`]), the distinct failed
/// recipients of any of them within `fast_trip_window_ms`, and each number's own evidence of both tests and last
/// transient failure. At `needed` (or the second test's level), with the recipient guard, the pool trips and
/// names the numbers with a failure within the window and evidence of their own above 0 in either test; the trip
/// spends the pool's evidence and the named numbers' own. The expressions are the Lua's.
#[derive(Debug, Clone)]
pub struct Pool {
    evidence: Option<Evidence>,
    q: f64,
    needed: f64,
    declared: Declared,
    guard: usize,
    window_ms: u64,
    /// The pooled evidence.
    pub value: f64,
    /// The second test's pooled evidence.
    pub declared_value: f64,
    since_ms: Option<u64>,
    recipients: Vec<String>,
    /// Per number: (own evidence, own evidence of the second test, last transient failure ms).
    numbers: std::collections::BTreeMap<String, (f64, f64, Option<u64>)>,
}

impl Pool {
    /// A fresh pool at `limits`, tripping at `needed` (`BreakerConfig::pool_trip_evidence`; 0 is off, the second
    /// test too) or on the second test `declared`.
    pub fn new(limits: &ScopeLimits, needed: f64, declared: Declared) -> Pool {
        Pool {
            evidence: Evidence::of(limits).filter(|_| needed > 0.0),
            q: limits.fast_trip_outage_rate,
            needed,
            declared,
            guard: limits.fast_trip_failures as usize,
            window_ms: limits.fast_trip_window_ms,
            value: 0.0,
            declared_value: 0.0,
            since_ms: None,
            recipients: Vec::new(),
            numbers: std::collections::BTreeMap::new(),
        }
    }

    fn open(&self, now_ms: u64) -> bool {
        self.since_ms.is_some_and(|s| now_ms.saturating_sub(s) <= self.window_ms)
    }

    /// Records one batch of `member` answered at `now_ms`: `calls` successes and transient failures, and the
    /// recipient key of each transient failure, the first `declared` of them Meta's declared unavailability.
    /// Returns the test that tripped and the numbers named when the batch trips the pool (sorted as the script
    /// sorts them), else None.
    pub fn record(
        &mut self,
        now_ms: u64,
        member: &str,
        calls: u64,
        failed: &[&str],
        declared: usize,
    ) -> Option<(PoolTest, Vec<String>)> {
        let e = self.evidence?;
        let fails = failed.len() as u64;
        if calls == 0 || fails > calls || declared > failed.len() {
            return None;
        }
        let llr = e.llr(calls, fails);
        let dllr = self.declared.llr(self.q, calls, declared as u64);
        for key in failed {
            if !self.open(now_ms) {
                self.since_ms = Some(now_ms);
                self.recipients.clear();
            }
            if !self.recipients.iter().any(|r| r == key) {
                self.recipients.push((*key).to_string());
            }
        }
        let own = self.numbers.entry(member.to_string()).or_insert((0.0, 0.0, None));
        own.0 = (own.0 + llr).max(0.0);
        if let Some(d) = dllr {
            own.1 = (own.1 + d).max(0.0);
        }
        if fails > 0 {
            own.2 = Some(now_ms);
        }
        self.value = (self.value + llr).max(0.0);
        if let Some(d) = dllr {
            self.declared_value = (self.declared_value + d).max(0.0);
        }
        let test = if self.value >= self.needed {
            PoolTest::Evidence
        } else if dllr.is_some() && self.declared_value >= self.declared.needed {
            PoolTest::Unavailable
        } else {
            return None;
        };
        if !(self.open(now_ms) && self.recipients.len() >= self.guard) {
            return None;
        }
        let window_ms = self.window_ms;
        let mut named = Vec::new();
        for (m, (own, own_declared, last)) in self.numbers.iter_mut() {
            if last.is_some_and(|l| now_ms.saturating_sub(l) <= window_ms) && (*own > 0.0 || *own_declared > 0.0) {
                named.push(m.clone());
                *own = 0.0;
                *own_declared = 0.0;
            }
        }
        self.value = 0.0;
        self.declared_value = 0.0;
        Some((test, named))
    }
}

/// Which check opened the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TripPath {
    /// The sliding window's Wilson bound ([`window_trips`]).
    Window,
    /// The fast trip's evidence ([`FastTrip`]).
    Fast,
    /// The token's pooled evidence named the number ([`Pool`], [`PoolTest::Evidence`]).
    Pooled,
    /// The pool's second test, Meta's declared unavailability, named the number ([`PoolTest::Unavailable`]).
    PooledUnavailable,
}

/// One CLOSED scope's trip checks over time, in the script's order: every outcome of a batch into the window,
/// then the window check (when the batch held a failure), then the fast trip.
#[derive(Debug, Clone)]
pub struct ScopeTrips {
    limits: ScopeLimits,
    /// The sliding window.
    pub window: Window,
    /// The fast trip's state.
    pub fast: FastTrip,
}

impl ScopeTrips {
    /// A fresh CLOSED scope.
    pub fn new(limits: &ScopeLimits) -> ScopeTrips {
        ScopeTrips { limits: limits.clone(), window: Window::new(limits), fast: FastTrip::new(limits) }
    }

    /// Records one batch answered at `now_ms`, each item (recipient key, failed transiently); successes and
    /// transient failures only (a 130429 is neither a call nor a failure). Returns the path that tripped.
    pub fn record(&mut self, now_ms: u64, batch: &[(&str, bool)]) -> Option<TripPath> {
        let failures = batch.iter().filter(|(_, f)| *f).count() as u64;
        self.window.add(now_ms, batch.len() as u64, failures);
        if failures > 0 {
            let (calls, fails) = self.window.sum(now_ms);
            if window_trips(&self.limits, calls, fails) {
                return Some(TripPath::Window);
            }
        }
        self.fast.record(now_ms, batch).then_some(TripPath::Fast)
    }
}

pub mod sim {
    //! Seeded traffic through [`ScopeTrips`](super::ScopeTrips), as the dispatcher records it: calls answered
    //! evenly at `rate_per_s`, recorded in batches every `flush_ms` (the dispatcher flushes outcomes every 20 ms
    //! or 32 items, so at 75/s a number's batch holds one or two calls). Deterministic: no clock, no threads.

    use crate::config::ScopeLimits;
    use crate::evidence::{ScopeTrips, TripPath};

    /// Tiny deterministic generator (xorshift64*), so a seed gives the same run everywhere.
    #[derive(Debug, Clone)]
    pub struct Rng(u64);

    impl Rng {
        /// A generator for `seed` (any value).
        pub fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        /// Uniform in [0, 1).
        pub fn next_f64(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// What Meta answers: shares of the attempts that fail transiently and ambiguously (a bodiless 5xx, 131000,
    /// timeouts), that Meta answers with its own "unavailable" code ([`super::UNAVAILABLE_CODES`], also transient
    /// failures), and that are throttled (130429: neither a call nor a failure of the window); the rest succeed.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Mix {
        /// Share of ambiguous transient failures.
        pub transient: f64,
        /// Share of Meta's declared unavailability (code 2, 131016, 133004).
        pub unavailable: f64,
        /// Share of 130429 answers.
        pub throttle: f64,
    }

    impl Mix {
        /// Ambiguous transient failures only.
        pub fn errors(transient: f64) -> Mix {
            Mix { transient, unavailable: 0.0, throttle: 0.0 }
        }

        /// Meta's declared unavailability only.
        pub fn unavailable(unavailable: f64) -> Mix {
            Mix { transient: 0.0, unavailable, throttle: 0.0 }
        }

        /// The drill's outage (crates/bw-meta-sim/scenarios/flash-sale-outage.toml): 28 % of the attempts fail,
        /// half 503 with Meta's code 2, half 130429.
        pub fn drill_outage() -> Mix {
            Mix { transient: 0.0, unavailable: 0.14, throttle: 0.14 }
        }

        /// What `x` in [0, 1) draws: None for a 130429, else Some(failed, declared).
        fn draw(&self, x: f64) -> Option<(bool, bool)> {
            if x < self.throttle {
                return None;
            }
            let x = x - self.throttle;
            Some((x < self.unavailable + self.transient, x < self.unavailable))
        }
    }

    /// One number's traffic: `before` until `change_ms`, `after` from then, until `end_ms`.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Traffic {
        /// Attempts sent per second while the number is not paused.
        pub rate_per_s: f64,
        /// Recording period, ms.
        pub flush_ms: u64,
        /// Mix before `change_ms`.
        pub before: Mix,
        /// Mix from `change_ms`.
        pub after: Mix,
        /// When the mix changes (an outage's start), ms.
        pub change_ms: u64,
        /// End of the run, ms.
        pub end_ms: u64,
        /// Time from a send to its answer, ms ([`run_token`] only).
        pub latency_ms: u64,
        /// How long a 130429 answer pauses the number's sends, ms (0: never; [`run_token`] only). The
        /// dispatcher pauses a number for the answer's Retry-After, 1 s without one.
        pub throttle_pause_ms: u64,
    }

    impl Traffic {
        /// A steady mix for `end_ms` at 75 attempts/s, recorded every 20 ms.
        pub fn steady(mix: Mix, end_ms: u64) -> Traffic {
            Traffic::outage(mix, end_ms, mix, 0)
        }

        /// `before` for `change_ms`, then `after` for `after_ms`, at 75 attempts/s, recorded every 20 ms.
        pub fn outage(before: Mix, change_ms: u64, after: Mix, after_ms: u64) -> Traffic {
            Traffic {
                rate_per_s: 75.0,
                flush_ms: 20,
                before,
                after,
                change_ms,
                end_ms: change_ms + after_ms,
                latency_ms: 0,
                throttle_pause_ms: 0,
            }
        }

        /// The drill's outage after 20 s of success, for `after_ms`: [`Mix::drill_outage`], answered after 120 ms
        /// (the scenario's mean latency), each 130429 pausing the number for 1 s.
        pub fn drill(after_ms: u64) -> Traffic {
            Traffic {
                latency_ms: 120,
                throttle_pause_ms: 1_000,
                ..Traffic::outage(Mix::errors(0.0), 20_000, Mix::drill_outage(), after_ms)
            }
        }
    }

    /// The first trip of a run: when (ms from the run's start) and which check.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub struct Trip {
        /// Simulated time of the batch that tripped, ms.
        pub at_ms: u64,
        /// The check that tripped.
        pub path: TripPath,
    }

    /// One run of `traffic` through a fresh scope at `limits`; the first trip, if any.
    pub fn run(limits: &ScopeLimits, traffic: &Traffic, seed: u64) -> Option<Trip> {
        let mut scope = ScopeTrips::new(limits);
        let mut rng = Rng::new(seed);
        let step = 1000.0 / traffic.rate_per_s;
        let mut next_call = 0.0f64;
        let mut i = 0u64;
        let mut keys: Vec<String> = Vec::new();
        let mut fails: Vec<bool> = Vec::new();
        let mut now = traffic.flush_ms;
        while now <= traffic.end_ms {
            keys.clear();
            fails.clear();
            while next_call < now as f64 {
                let mix = if (next_call as u64) < traffic.change_ms { traffic.before } else { traffic.after };
                if let Some((failed, _)) = mix.draw(rng.next_f64()) {
                    keys.push(format!("r{i}"));
                    fails.push(failed);
                }
                i += 1;
                next_call = i as f64 * step;
            }
            if !keys.is_empty() {
                let batch: Vec<(&str, bool)> = keys.iter().map(String::as_str).zip(fails.iter().copied()).collect();
                if let Some(path) = scope.record(now, &batch) {
                    return Some(Trip { at_ms: now, path });
                }
            }
            now += traffic.flush_ms;
        }
        None
    }

    /// One number's first trip in [`run_token`]: when (ms from the run's start) and which check.
    pub type NumberTrip = Trip;

    /// One answer on its way: (answer time ms, recipient key, failed, declared); None for a 130429.
    type Answer = (u64, String, Option<(bool, bool)>);

    /// One number's sends in [`run_token`]: sent every 1000 / `rate_per_s` ms unless a 130429 answered before
    /// the send time paused the number, each answered `latency_ms` later.
    struct Sender {
        rng: Rng,
        next: u64,
        paused_until: u64,
        in_flight: std::collections::VecDeque<Answer>,
    }

    impl Sender {
        /// Sends every attempt due before `now` and returns the answers that arrived before `now`.
        fn answers(&mut self, t: &Traffic, i: usize, now: u64) -> Vec<Answer> {
            let step = 1000.0 / t.rate_per_s;
            let mut out = Vec::new();
            loop {
                let at = (self.next as f64 * step) as u64;
                // Answers that arrive before this send (or before `now`, when no send is due) may pause it.
                let horizon = at.min(now);
                while self.in_flight.front().is_some_and(|a| a.0 < horizon) {
                    let a = self.in_flight.pop_front().expect("front");
                    if a.2.is_none() && t.throttle_pause_ms > 0 {
                        self.paused_until = self.paused_until.max(a.0 + t.throttle_pause_ms);
                    }
                    out.push(a);
                }
                if at >= now {
                    break;
                }
                if at >= self.paused_until {
                    let mix = if at < t.change_ms { t.before } else { t.after };
                    let drawn = mix.draw(self.rng.next_f64());
                    self.in_flight.push_back((at + t.latency_ms, format!("n{i}r{}", self.next), drawn));
                }
                self.next += 1;
            }
            out
        }
    }

    /// Numbers sharing one access token, each with its own `traffic` (its own seeded draws), through their own
    /// checks ([`ScopeTrips`]) and the token's [`super::Pool`] tripping at `needed` or on its second test
    /// `declared`, as the dispatcher records a batch: the number's own record first, then the pool. A 130429
    /// pauses the number's sends for `throttle_pause_ms`; a number stops sending at its first trip (OPEN for its
    /// cooldown, 30 s at the defaults, which outlasts the runs measured). Returns each number's first trip.
    pub fn run_token(
        limits: &ScopeLimits,
        needed: f64,
        declared: crate::evidence::Declared,
        traffic: &[Traffic],
        seed: u64,
    ) -> Vec<Option<NumberTrip>> {
        let n = traffic.len();
        let mut scopes: Vec<ScopeTrips> = (0..n).map(|_| ScopeTrips::new(limits)).collect();
        let mut pool = crate::evidence::Pool::new(limits, needed, declared);
        let mut senders: Vec<Sender> = (0..n as u64)
            .map(|i| Sender {
                rng: Rng::new(seed.wrapping_mul(7919).wrapping_add(i)),
                next: 0,
                paused_until: 0,
                in_flight: std::collections::VecDeque::new(),
            })
            .collect();
        let members: Vec<String> = (0..n).map(|i| format!("n{i}")).collect();
        let mut trips: Vec<Option<NumberTrip>> = vec![None; n];
        let end = traffic.iter().map(|t| t.end_ms).max().unwrap_or(0);
        let flush = traffic.iter().map(|t| t.flush_ms).min().unwrap_or(20).max(1);
        let mut now = flush;
        while now <= end && trips.iter().any(Option::is_none) {
            for i in 0..n {
                let t = &traffic[i];
                if trips[i].is_some() || now > t.end_ms {
                    continue;
                }
                // Declared failures first: the pool takes them as the first of its failed keys.
                let mut batch: Vec<(String, bool, bool)> = senders[i]
                    .answers(t, i, now)
                    .into_iter()
                    .filter_map(|(_, key, drawn)| drawn.map(|(failed, declared)| (key, failed, declared)))
                    .collect();
                if batch.is_empty() {
                    continue;
                }
                batch.sort_by_key(|b| !b.2);
                let items: Vec<(&str, bool)> = batch.iter().map(|(k, f, _)| (k.as_str(), *f)).collect();
                if let Some(path) = scopes[i].record(now, &items) {
                    trips[i] = Some(Trip { at_ms: now, path });
                }
                let failed: Vec<&str> = batch.iter().filter(|b| b.1).map(|b| b.0.as_str()).collect();
                let declared = batch.iter().filter(|b| b.2).count();
                let Some((test, named)) = pool.record(now, &members[i], items.len() as u64, &failed, declared) else {
                    continue;
                };
                let path = match test {
                    crate::evidence::PoolTest::Evidence => TripPath::Pooled,
                    crate::evidence::PoolTest::Unavailable => TripPath::PooledUnavailable,
                };
                for m in named {
                    let j = members.iter().position(|x| *x == m).unwrap_or(i);
                    if trips[j].is_none() {
                        trips[j] = Some(Trip { at_ms: now, path });
                    }
                }
            }
            now += flush;
        }
        trips
    }

    /// Quantile `q` (0..1) of sorted `values` (nearest rank).
    pub fn quantile(sorted: &[f64], q: f64) -> f64 {
        if sorted.is_empty() {
            return f64::NAN;
        }
        sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
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
