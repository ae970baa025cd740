//! Error answers of the simulated Meta, split by code into **injected** (the scenario's faults) and
//! **self-inflicted** (a limit the simulator enforces, exceeded by Breakwater's own sending).
//!
//! The simulator counts every answer by code (`Counters::by_outcome`). Where it also reports which answers
//! its scenario injected (a map whose name contains `inject`, at the top level of the counters or per code),
//! that split is used as is ([`SplitSource::Simulator`]). Older simulators report only totals; then the split
//! is derived from the scenario ([`SplitSource::Scenario`]): a code the scenario never injects is entirely
//! ours; a code only faults produce (5xx, resets, hangs) is entirely injected; a rate-limit code the scenario
//! *and* a limit can both produce (130429 in the flash-sale outage) counts as injected only for the answers
//! the drill observed inside a window that injects it (1 s grace after the window for answers in flight),
//! the rest as self-inflicted. That derivation can only over-count self-inflicted answers outside windows, and
//! could under-count a limit hit inside an injecting window; the report names the source so a reader knows.

use bw_meta_sim::{FaultKind, Scenario};
use serde_json::Value;
use std::collections::BTreeMap;

/// Meta's rate-limit codes: app (4), WABA (80007), throughput (130429), pair (131056).
pub const RATE_LIMIT_CODES: [i64; 4] = [4, 80007, 130429, 131056];

/// Seconds after a window's end during which an observed answer still counts as the window's.
const WINDOW_GRACE_S: f64 = 1.0;

/// Where the injected/self-inflicted split came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SplitSource {
    /// The simulator's own per-code injected counters.
    Simulator,
    /// Derived from the scenario's windows and the answers the drill observed.
    #[default]
    Scenario,
}

impl SplitSource {
    pub fn label(self) -> &'static str {
        match self {
            SplitSource::Simulator => "simulator counters",
            SplitSource::Scenario => "derived from the scenario windows (simulator reports totals only)",
        }
    }
}

/// Answers with one outcome key (a Meta code such as `130429`, or `http_503`, `reset`, `hang`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeCount {
    pub key: String,
    pub total: u64,
    pub injected: u64,
    /// `total - injected`: for a rate-limit code, a limit our own sending exceeded.
    pub self_inflicted: u64,
    pub rate_limit: bool,
}

/// Every non-200 answer by key, and where the split came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorSplit {
    pub codes: Vec<CodeCount>,
    pub source: SplitSource,
}

impl ErrorSplit {
    fn sum(&self, f: impl Fn(&CodeCount) -> u64, rate_limit_only: bool) -> u64 {
        self.codes.iter().filter(|c| !rate_limit_only || c.rate_limit).map(f).sum()
    }
    /// Rate-limit answers the scenario injected.
    pub fn rate_limit_injected(&self) -> u64 {
        self.sum(|c| c.injected, true)
    }
    /// Rate-limit answers caused by our own sending.
    pub fn rate_limit_self_inflicted(&self) -> u64 {
        self.sum(|c| c.self_inflicted, true)
    }
    /// Every error answer.
    pub fn total(&self) -> u64 {
        self.sum(|c| c.total, false)
    }
    /// Rate-limit answers of one code (total, injected, self-inflicted).
    pub fn code(&self, key: &str) -> Option<&CodeCount> {
        self.codes.iter().find(|c| c.key == key)
    }
}

/// An error answer the drill observed in a dispatch outcome: (seconds since the scenario was set, code, sender).
pub type ObservedAnswer = (f64, i64, String);

/// Whether one answered call counts in the breaker's failure window, as the dispatcher tells the breaker
/// (`outcome_kind` in bw-dispatcher, `lua/record_outcomes.lua`): `Some(false)` a success, `Some(true)` a
/// transient failure (a transient Meta code; no answer; 5xx or 2xx without Meta's body: an unknown outcome),
/// `None` when the window does not count it (rate limits, credentials, permanent and unclassified errors, a
/// bodiless 4xx). It goes by Meta's answer, not by where the message went: a message held back by 130429 past
/// its budget goes to the DLQ, but its answer was a rate limit, which never counts as a failure.
pub fn breaker_failure(result: &str, meta_code: i64, http_status: u32) -> Option<bool> {
    use bw_common::classify::{ErrorClass, classify_code};
    if result == "sent" {
        return Some(false);
    }
    if meta_code != 0 {
        return (classify_code(meta_code) == ErrorClass::Transient).then_some(true);
    }
    // No Meta code: a refusal before processing (a bodiless 4xx, or Meta's body with code 0, credentials)
    // never counts; no answer or a 5xx/2xx without Meta's body is an unknown outcome, a transient failure.
    (!(400..500).contains(&http_status) && matches!(result, "retry" | "dlq" | "unknown")).then_some(true)
}

fn is_rate_limit(key: &str) -> bool {
    key.parse::<i64>().is_ok_and(|c| RATE_LIMIT_CODES.contains(&c))
}

/// The outcome key a fault produces in the simulator's counters (None: it answers 200).
pub fn fault_key(kind: &FaultKind) -> Option<String> {
    match kind {
        FaultKind::Http { status, meta_body: true, code, .. } => {
            Some(code.unwrap_or_else(|| bw_meta_sim::errors::default_code_for_status(*status)).to_string())
        }
        FaultKind::Http { status, meta_body: false, .. } => Some(format!("http_{status}")),
        FaultKind::Error { code, .. } => Some(code.to_string()),
        FaultKind::Hang { .. } => Some("hang".into()),
        FaultKind::Reset { .. } => Some("reset".into()),
        FaultKind::AsyncFailure { .. } => None,
        // Kinds a newer simulator adds: it also reports its injected counters, so the split never needs them.
        #[allow(unreachable_patterns)]
        _ => None,
    }
}

fn number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_f64().map(|f| f.max(0.0) as u64))
}

/// Totals per key from `by_outcome` (a number per key, or an object with `total` or numeric fields).
fn totals(counters: &Value) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    if let Some(map) = counters.get("by_outcome").and_then(Value::as_object) {
        for (k, v) in map {
            let n = match v {
                Value::Object(o) => {
                    o.get("total").and_then(number).unwrap_or_else(|| o.values().filter_map(number).sum())
                }
                other => number(other).unwrap_or(0),
            };
            out.insert(k.clone(), n);
        }
    }
    out
}

/// Injected answers per key if the simulator reports them: a top-level (or nested one level) object whose
/// name contains `inject` mapping keys to numbers, or per-key objects in `by_outcome` with an `inject*` field.
pub fn simulator_injected(counters: &Value) -> Option<BTreeMap<String, u64>> {
    let as_map = |v: &Value| -> Option<BTreeMap<String, u64>> {
        let o = v.as_object()?;
        let m: BTreeMap<String, u64> = o.iter().filter_map(|(k, v)| Some((k.clone(), number(v)?))).collect();
        // An empty map is a real answer: nothing was injected.
        (m.len() == o.len()).then_some(m)
    };
    let obj = counters.as_object()?;
    for (name, v) in obj {
        if name.contains("inject")
            && let Some(m) = as_map(v)
        {
            return Some(m);
        }
    }
    for (_, v) in obj {
        if let Some(inner) = v.as_object() {
            for (name, v) in inner {
                if name.contains("inject")
                    && let Some(m) = as_map(v)
                {
                    return Some(m);
                }
            }
        }
    }
    let by_outcome = obj.get("by_outcome")?.as_object()?;
    let mut out = BTreeMap::new();
    for (k, v) in by_outcome {
        if let Some(o) = v.as_object()
            && let Some(n) = o.iter().find(|(f, _)| f.contains("inject")).and_then(|(_, v)| number(v))
        {
            out.insert(k.clone(), n);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Splits the simulator's error answers (its `/_sim/counters` JSON) into injected and self-inflicted.
pub fn split(counters: &Value, scenario: &Scenario, observed: &[ObservedAnswer]) -> ErrorSplit {
    let totals = totals(counters);
    let reported = simulator_injected(counters);
    let source = if reported.is_some() { SplitSource::Simulator } else { SplitSource::Scenario };
    let mut codes = Vec::new();
    for (key, total) in totals.into_iter().filter(|(k, n)| k != "200" && *n > 0) {
        let rate_limit = is_rate_limit(&key);
        let injected = match &reported {
            Some(m) => m.get(&key).copied().unwrap_or(0),
            None => derived_injected(&key, total, scenario, observed),
        }
        .min(total);
        codes.push(CodeCount { key, total, injected, self_inflicted: total - injected, rate_limit });
    }
    ErrorSplit { codes, source }
}

fn derived_injected(key: &str, total: u64, scenario: &Scenario, observed: &[ObservedAnswer]) -> u64 {
    let injecting: Vec<&bw_meta_sim::Window> = scenario
        .windows
        .iter()
        .filter(|w| w.error_rate > 0.0 && w.faults.iter().any(|f| fault_key(&f.kind).as_deref() == Some(key)))
        .collect();
    if injecting.is_empty() {
        return 0;
    }
    // Only limits produce 130429 and 131056 besides faults; every other code comes from faults alone.
    let limit_can_produce = key == "130429" || key == "131056";
    if !limit_can_produce {
        return total;
    }
    let Ok(code) = key.parse::<i64>() else { return 0 };
    observed
        .iter()
        .filter(|(t, c, phone)| {
            *c == code
                && injecting.iter().any(|w| {
                    let start = w.start_ms as f64 / 1000.0;
                    let end = w.duration_ms.map_or(f64::INFINITY, |d| (w.start_ms + d) as f64 / 1000.0);
                    let matches = w.phone_number_ids.is_empty() || w.phone_number_ids.iter().any(|p| p == phone);
                    matches && *t >= start && *t <= end + WINDOW_GRACE_S
                })
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn flash() -> Scenario {
        // Outage 10 s .. 40 s injecting 503 (code 2) and 130429.
        Scenario::flash_sale_outage(Duration::from_secs(10), Duration::from_secs(30))
    }

    #[test]
    fn the_breaker_window_counts_answers_as_the_dispatcher_reports_them() {
        assert_eq!(breaker_failure("sent", 0, 200), Some(false));
        // Transient: a transient code, a 5xx without Meta's body (unknown), no answer at all.
        assert_eq!(breaker_failure("retry", 131000, 500), Some(true));
        assert_eq!(breaker_failure("dlq", 2, 503), Some(true));
        assert_eq!(breaker_failure("unknown", 0, 503), Some(true));
        assert_eq!(breaker_failure("unknown", 0, 0), Some(true));
        assert_eq!(breaker_failure("retry", 0, 0), Some(true));
        // A 130429 held back past its budget goes to the DLQ, yet it is a rate limit: not in the window.
        assert_eq!(breaker_failure("dlq", 130429, 400), None);
        assert_eq!(breaker_failure("rate_limited", 130429, 400), None);
        assert_eq!(breaker_failure("dlq", 131056, 400), None);
        // Credentials, permanent and bodiless 4xx answers never count.
        assert_eq!(breaker_failure("dlq", 190, 401), None);
        assert_eq!(breaker_failure("dlq", 0, 401), None);
        assert_eq!(breaker_failure("quarantined", 131026, 400), None);
        assert_eq!(breaker_failure("dlq", 0, 429), None);
    }

    #[test]
    fn derives_injected_from_the_scenario_when_the_simulator_reports_totals_only() {
        let counters =
            json!({"requests": 100, "by_outcome": {"200": 60, "2": 20, "130429": 15, "131056": 3, "hang": 2}});
        let scenario = flash();
        assert!(
            scenario.windows[0].faults.iter().any(|f| fault_key(&f.kind).as_deref() == Some("130429")),
            "{scenario:?}"
        );
        // 12 throughput answers seen inside the outage (one within the grace), 3 outside it.
        let mut observed: Vec<ObservedAnswer> =
            (0..11).map(|i| (11.0 + f64::from(i), 130429, "p".to_string())).collect();
        observed.push((40.5, 130429, "p".into()));
        observed.extend((0..3).map(|i| (50.0 + f64::from(i), 130429, "p".to_string())));
        let s = split(&counters, &scenario, &observed);
        assert_eq!(s.source, SplitSource::Scenario);
        let t = s.code("130429").expect("130429");
        assert_eq!((t.total, t.injected, t.self_inflicted, t.rate_limit), (15, 12, 3, true));
        // 503 with a Meta body (code 2) only comes from faults; the pair limit is never injected here.
        assert_eq!(s.code("2").map(|c| (c.injected, c.rate_limit)), Some((20, false)));
        assert_eq!(s.code("131056").map(|c| (c.injected, c.self_inflicted)), Some((0, 3)));
        assert_eq!(s.code("hang").map(|c| c.injected), Some(0), "the flash-sale scenario injects no hangs");
        assert_eq!(s.rate_limit_self_inflicted(), 6);
        assert_eq!(s.rate_limit_injected(), 12);
        assert!(s.code("200").is_none());
    }

    #[test]
    fn an_empty_injected_map_means_nothing_was_injected() {
        let counters = json!({"by_outcome": {"200": 5, "130429": 3}, "injected": {}, "limit_exceeded": {"130429": 3}});
        let s = split(&counters, &flash(), &[(20.0, 130429, "p".into())]);
        assert_eq!(s.source, SplitSource::Simulator);
        assert_eq!(s.code("130429").map(|c| (c.injected, c.self_inflicted)), Some((0, 3)));
    }

    #[test]
    fn uses_the_simulator_split_in_either_shape() {
        let scenario = flash();
        for counters in [
            json!({"by_outcome": {"200": 5, "130429": 9, "2": 4}, "injected": {"130429": 7, "2": 4}}),
            json!({"by_outcome": {"200": 5, "130429": 9, "2": 4}, "faults": {"injected_by_code": {"130429": 7, "2": 4}}}),
            json!({"by_outcome": {"200": 5, "130429": {"injected": 7, "limit": 2}, "2": {"injected": 4, "limit": 0}}}),
            // The simulator's own shape: by_outcome = injected + limit_exceeded + answers to the request itself.
            json!({"requests": 18, "by_outcome": {"200": 5, "130429": 9, "2": 4}, "injected": {"130429": 7, "2": 4},
                   "limit_exceeded": {"130429": 2}, "accepted_unacknowledged": 0}),
        ] {
            let s = split(&counters, &scenario, &[]);
            assert_eq!(s.source, SplitSource::Simulator, "{counters}");
            let t = s.code("130429").expect("130429");
            assert_eq!((t.total, t.injected, t.self_inflicted), (9, 7, 2), "{counters}");
            assert_eq!(s.code("2").map(|c| (c.total, c.injected)), Some((4, 4)));
        }
    }
}
