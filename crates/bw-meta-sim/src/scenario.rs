//! Fault scenarios: time windows (offsets from the moment the scenario is set) with an error rate, a weighted
//! mix of faults, added latency, and an optional phone-number filter.
//!
//! TOML format (see `scenarios/flash-sale-outage.toml`):
//!
//! ```toml
//! name = "flash-sale-outage"
//! seed = 42                    # optional; fixes every random choice when requests are sequential
//! selection = "random"         # or "deterministic": exact error counts (every 1/rate-th request) and
//!                              # smooth weighted round-robin over the fault mix
//! latency = { kind = "fixed", ms = 5 }          # optional base latency for every request
//!
//! [[windows]]
//! name = "outage"
//! start_ms = 10000             # offset from scenario start
//! duration_ms = 30000          # omit: until the scenario is replaced
//! error_rate = 0.28            # share of requests in the window that get a fault
//! phone_number_ids = ["1234"]  # optional filter
//! latency = { kind = "normal", mean_ms = 400, stddev_ms = 150 }  # or uniform{min_ms,max_ms}, fixed{ms}
//! faults = [
//!   { kind = "http", status = 503, meta_body = true, weight = 1 },  # code defaults per status
//!   { kind = "error", code = 130429, weight = 1 },                  # Meta error with its usual HTTP status
//!   { kind = "hang", hold_ms = 5000, accept = true },               # hold the request, then drop it
//!   { kind = "reset", after_processing = true },                    # drop the connection without answering
//!   { kind = "async_failure", code = 131026 },                      # 200, then a `failed` status webhook
//! ]
//! ```
//!
//! A full outage is a window with `error_rate = 1.0`; recovery is the end of the window.

use crate::ids::Rng;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A fault schedule. Construct in Rust or parse with [`Scenario::from_toml`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: String,
    /// Seed for the scenario's RNG (fault draws, latency); default 1.
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub selection: Selection,
    /// Latency added to every request, in or out of windows.
    #[serde(default)]
    pub latency: Option<Latency>,
    #[serde(default)]
    pub windows: Vec<Window>,
}

/// How faults are picked inside a window.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// Each request fails with probability `error_rate`; the fault is drawn by weight.
    #[default]
    Random,
    /// Request n fails when floor((n+1)·rate) > floor(n·rate); the fault is chosen by smooth weighted
    /// round-robin. Counts are exact whatever the concurrency.
    Deterministic,
}

/// One time window of a scenario.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Window {
    #[serde(default)]
    pub name: String,
    pub start_ms: u64,
    /// None: open-ended.
    #[serde(default)]
    pub duration_ms: Option<u64>,
    #[serde(default)]
    pub error_rate: f64,
    #[serde(default)]
    pub faults: Vec<Fault>,
    #[serde(default)]
    pub latency: Option<Latency>,
    /// Only requests for these phone_number_ids are affected; empty: all.
    #[serde(default)]
    pub phone_number_ids: Vec<String>,
}

/// One entry of a window's fault mix.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Fault {
    #[serde(flatten)]
    pub kind: FaultKind,
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

/// What a fault does to a request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FaultKind {
    /// An HTTP error status (500/502/503/504...). With `meta_body`, Meta's error JSON with `code` (default per
    /// status: 500→131000, 502→1, 503→2, 504→133004); without, a plain-text gateway body.
    /// `after_processing`: the message was accepted before the error (recorded in the oracle).
    Http {
        status: u16,
        #[serde(default)]
        meta_body: bool,
        #[serde(default)]
        code: Option<i64>,
        #[serde(default)]
        after_processing: bool,
    },
    /// A Meta error code with its usual HTTP status (throttle codes use the configured throttle status),
    /// optionally overridden.
    Error {
        code: i64,
        #[serde(default)]
        http_status: Option<u16>,
        #[serde(default)]
        subcode: Option<i64>,
    },
    /// Hold the request open for `hold_ms` (past the client's timeout), then drop the connection.
    /// `accept`: the message was accepted before the hang (unknown outcome for the client).
    Hang {
        hold_ms: u64,
        #[serde(default)]
        accept: bool,
    },
    /// Drop the connection without a response. `after_processing`: the message was accepted first.
    Reset {
        #[serde(default)]
        after_processing: bool,
    },
    /// Accept (200) and later report `failed` with `code` in a status webhook (e.g. 131049, 131026).
    AsyncFailure { code: i64 },
}

/// Added latency.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Latency {
    Fixed {
        ms: u64,
    },
    Uniform {
        min_ms: u64,
        max_ms: u64,
    },
    /// Normal-ish (sum of uniforms), clamped at 0.
    Normal {
        mean_ms: f64,
        stddev_ms: f64,
    },
}

impl Latency {
    pub fn sample(&self, rng: &Rng) -> Duration {
        let ms = match *self {
            Latency::Fixed { ms } => ms as f64,
            Latency::Uniform { min_ms, max_ms } => {
                let (lo, hi) = (min_ms.min(max_ms) as f64, min_ms.max(max_ms) as f64);
                lo + rng.next_f64() * (hi - lo)
            }
            Latency::Normal { mean_ms, stddev_ms } => {
                // Irwin–Hall with 12 uniforms: mean 6, variance 1.
                let z: f64 = (0..12).map(|_| rng.next_f64()).sum::<f64>() - 6.0;
                (mean_ms + z * stddev_ms).max(0.0)
            }
        };
        Duration::from_micros((ms * 1000.0) as u64)
    }
}

/// Invalid scenario.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("scenario is not valid toml: {0}")]
    Toml(#[from] toml::de::Error),
    #[error("scenario is not valid json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot read scenario file `{path}`: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("window `{window}`: {problem}")]
    Invalid { window: String, problem: String },
    #[error("unknown built-in scenario `{0}` (known: flash-sale-outage)")]
    UnknownBuiltin(String),
}

impl Scenario {
    /// No faults.
    pub fn normal() -> Scenario {
        Scenario { name: "normal".into(), ..Scenario::default() }
    }

    /// Normal, then from `start` for `length` 28% of requests fail with an even mix of 503 (Meta body) and
    /// 130429, with extra latency; then recovery.
    pub fn flash_sale_outage(start: Duration, length: Duration) -> Scenario {
        Scenario {
            name: "flash-sale-outage".into(),
            seed: Some(42),
            selection: Selection::Random,
            latency: None,
            windows: vec![Window {
                name: "outage".into(),
                start_ms: start.as_millis() as u64,
                duration_ms: Some(length.as_millis() as u64),
                error_rate: 0.28,
                faults: vec![
                    Fault {
                        kind: FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
                        weight: 1,
                    },
                    Fault { kind: FaultKind::Error { code: 130429, http_status: None, subcode: None }, weight: 1 },
                ],
                latency: Some(Latency::Normal { mean_ms: 120.0, stddev_ms: 40.0 }),
                phone_number_ids: vec![],
            }],
        }
    }

    /// A full outage: every request gets a bodiless 503 from `start` for `length`.
    pub fn outage(start: Duration, length: Duration) -> Scenario {
        Scenario {
            name: "outage".into(),
            windows: vec![Window {
                name: "outage".into(),
                start_ms: start.as_millis() as u64,
                duration_ms: Some(length.as_millis() as u64),
                error_rate: 1.0,
                faults: vec![Fault {
                    kind: FaultKind::Http { status: 503, meta_body: false, code: None, after_processing: false },
                    weight: 1,
                }],
                latency: None,
                phone_number_ids: vec![],
            }],
            ..Scenario::default()
        }
    }

    /// A built-in scenario by name, with its default timing (outage at 10 s for 30 s).
    pub fn builtin(name: &str) -> Result<Scenario, ScenarioError> {
        match name {
            "flash-sale-outage" => Ok(Scenario::flash_sale_outage(Duration::from_secs(10), Duration::from_secs(30))),
            "normal" => Ok(Scenario::normal()),
            other => Err(ScenarioError::UnknownBuiltin(other.to_string())),
        }
    }

    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let s: Scenario = toml::from_str(text)?;
        s.validate()?;
        Ok(s)
    }

    pub fn from_json(text: &[u8]) -> Result<Scenario, ScenarioError> {
        let s: Scenario = serde_json::from_slice(text)?;
        s.validate()?;
        Ok(s)
    }

    /// A built-in name, or a path to a TOML file.
    pub fn load(name_or_path: &str) -> Result<Scenario, ScenarioError> {
        if let Ok(s) = Scenario::builtin(name_or_path) {
            return Ok(s);
        }
        let text = std::fs::read_to_string(name_or_path)
            .map_err(|source| ScenarioError::Io { path: name_or_path.to_string(), source })?;
        Scenario::from_toml(&text)
    }

    pub fn validate(&self) -> Result<(), ScenarioError> {
        for w in &self.windows {
            let bad = |problem: &str| ScenarioError::Invalid { window: w.name.clone(), problem: problem.to_string() };
            if !(0.0..=1.0).contains(&w.error_rate) {
                return Err(bad("error_rate must be between 0 and 1"));
            }
            if w.error_rate > 0.0 && w.faults.iter().all(|f| f.weight == 0) {
                return Err(bad("error_rate > 0 needs at least one fault with weight > 0"));
            }
            for f in &w.faults {
                if let FaultKind::Http { status, .. } = f.kind
                    && !(400..=599).contains(&status)
                {
                    return Err(bad("http fault status must be 4xx or 5xx"));
                }
            }
        }
        Ok(())
    }
}

/// A scenario that is running: its clock and per-window counters.
#[derive(Debug)]
pub struct Active {
    pub scenario: Scenario,
    pub started: Instant,
    pub rng: Rng,
    windows: Vec<WindowState>,
}

#[derive(Debug)]
struct WindowState {
    seen: AtomicU64,
    /// Smooth weighted round-robin current weights (deterministic mode).
    swrr: Mutex<Vec<i64>>,
}

/// What the scenario decided for one request.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    pub latency: Duration,
    pub fault: Option<FaultKind>,
    /// Name of the window that produced the fault.
    pub window: Option<String>,
}

impl Active {
    pub fn start(scenario: Scenario) -> Active {
        let windows = scenario
            .windows
            .iter()
            .map(|w| WindowState { seen: AtomicU64::new(0), swrr: Mutex::new(vec![0; w.faults.len()]) })
            .collect();
        let rng = Rng::new(scenario.seed.unwrap_or(1));
        Active { scenario, started: Instant::now(), rng, windows }
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Decides latency and fault for a request to `phone_number_id` now.
    pub fn decide(&self, phone_number_id: &str) -> Decision {
        let now = self.elapsed_ms();
        let mut d = Decision::default();
        if let Some(l) = &self.scenario.latency {
            d.latency += l.sample(&self.rng);
        }
        for (w, state) in self.scenario.windows.iter().zip(&self.windows) {
            let active = now >= w.start_ms && w.duration_ms.is_none_or(|len| now < w.start_ms + len);
            let matches = w.phone_number_ids.is_empty() || w.phone_number_ids.iter().any(|p| p == phone_number_id);
            if !active || !matches {
                continue;
            }
            if let Some(l) = &w.latency {
                d.latency += l.sample(&self.rng);
            }
            if d.fault.is_some() || w.faults.is_empty() {
                continue;
            }
            let fire = match self.scenario.selection {
                Selection::Random => self.rng.next_f64() < w.error_rate,
                Selection::Deterministic => {
                    let n = state.seen.fetch_add(1, Ordering::Relaxed);
                    ((n + 1) as f64 * w.error_rate).floor() > (n as f64 * w.error_rate).floor()
                }
            };
            if fire {
                let idx = match self.scenario.selection {
                    Selection::Random => pick_weighted(&w.faults, self.rng.next_u64()),
                    Selection::Deterministic => pick_swrr(&w.faults, &state.swrr),
                };
                d.fault = idx.map(|i| w.faults[i].kind.clone());
                d.window = Some(w.name.clone());
            }
        }
        d
    }
}

fn pick_weighted(faults: &[Fault], r: u64) -> Option<usize> {
    let total: u64 = faults.iter().map(|f| u64::from(f.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut x = r % total;
    for (i, f) in faults.iter().enumerate() {
        if x < u64::from(f.weight) {
            return Some(i);
        }
        x -= u64::from(f.weight);
    }
    None
}

fn pick_swrr(faults: &[Fault], current: &Mutex<Vec<i64>>) -> Option<usize> {
    let mut cur = current.lock().unwrap_or_else(|e| e.into_inner());
    let total: i64 = faults.iter().map(|f| i64::from(f.weight)).sum();
    if total == 0 {
        return None;
    }
    let mut best = 0;
    for (i, f) in faults.iter().enumerate() {
        cur[i] += i64::from(f.weight);
        if cur[i] > cur[best] {
            best = i;
        }
    }
    cur[best] -= total;
    Some(best)
}

#[cfg(test)]
mod tests;
