//! Checks that belong to one kind of scenario: a WABA restricted mid-sale (a 368 or 131031 injection aimed at
//! one WABA), and sub-threshold noise (every fault window under the breakers' failure threshold).
//!
//! Everything here is a pure function of the scenario and of what the drill observed, so the verdicts are
//! unit-tested without a drill. The matrix rows built from them are required for PASS only in their scenario.

use bw_meta_sim::Scenario;
use std::collections::{BTreeMap, BTreeSet};

/// Codes that restrict a whole WABA until Meta lifts it (reference: "Pause scope by error code", WABA rows).
pub const RESTRICTION_CODES: [i64; 2] = [368, 131031];

/// Share of its pre-restriction rate each number of an untouched WABA must keep during the restriction.
pub const KEPT_RATE_MIN: f64 = 0.9;

/// Seconds at the start of a run left out of a rate baseline (the producer and the limiters ramp up).
const WARMUP_S: f64 = 3.0;

/// A WABA restriction the scenario injects.
#[derive(Debug, Clone, PartialEq)]
pub struct Restriction {
    pub waba_id: String,
    pub code: i64,
    /// Seconds since the scenario's clock started.
    pub start_s: f64,
    pub end_s: f64,
}

/// Every timed restriction of one WABA in the scenario (an injection of a restriction code aimed at WABAs, with
/// an end: an open-ended one is never lifted, and its held messages would wait for an operator).
pub fn restrictions(scenario: &Scenario) -> Vec<Restriction> {
    let mut out = Vec::new();
    for inj in scenario.injections.iter().filter(|i| RESTRICTION_CODES.contains(&i.code)) {
        let Some(duration_ms) = inj.duration_ms else { continue };
        for waba in &inj.waba_ids {
            out.push(Restriction {
                waba_id: waba.clone(),
                code: inj.code,
                start_s: inj.start_ms as f64 / 1000.0,
                end_s: (inj.start_ms + duration_ms) as f64 / 1000.0,
            });
        }
    }
    out
}

/// The WABAs the drill's senders belong to: `default` first, then every other WABA a scenario injection names,
/// in file order. One WABA unless the scenario aims at another.
pub fn wabas(scenario: &Scenario, default: &str) -> Vec<String> {
    let mut out = vec![default.to_string()];
    for waba in scenario.injections.iter().flat_map(|i| i.waba_ids.iter()) {
        if !out.contains(waba) {
            out.push(waba.clone());
        }
    }
    out
}

/// Each sender's WABA: the senders are spread round-robin over `wabas` (sender i to WABA i mod n).
pub fn sender_wabas(senders: &[String], wabas: &[String]) -> Vec<String> {
    (0..senders.len()).map(|i| wabas[i % wabas.len().max(1)].clone()).collect()
}

/// Events per second of `times` (seconds) within `[from, to)`; None for an empty or negative span.
pub fn rate_in(times: &[f64], from: f64, to: f64) -> Option<f64> {
    (to > from).then(|| times.iter().filter(|t| **t >= from && **t < to).count() as f64 / (to - from))
}

/// One number of an untouched WABA: its send rate before and during the restriction.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptRate {
    pub sender: String,
    pub waba_id: String,
    /// Messages Meta accepted per second, in the span as long as the restriction just before it (after warm-up).
    pub before_per_s: f64,
    /// Messages Meta accepted per second during the restriction.
    pub during_per_s: f64,
}

impl KeptRate {
    /// `during / before`; None when the number sent nothing before (no baseline to keep).
    pub fn ratio(&self) -> Option<f64> {
        (self.before_per_s > 0.0).then(|| self.during_per_s / self.before_per_s)
    }
}

/// The rates of every sender outside the restricted WABA, from the per-sender timeline of sends (`sent_at`:
/// seconds since start of each `sent` outcome). The baseline is the span of the restriction's length just
/// before it, cut to start after the warm-up.
pub fn kept_rates(
    sent_at: &BTreeMap<String, Vec<f64>>,
    sender_waba: &BTreeMap<String, String>,
    r: &Restriction,
) -> Vec<KeptRate> {
    let length = r.end_s - r.start_s;
    let from = (r.start_s - length).max(WARMUP_S.min(r.start_s));
    sender_waba
        .iter()
        .filter(|(_, waba)| **waba != r.waba_id)
        .map(|(sender, waba)| {
            let times = sent_at.get(sender).map(Vec::as_slice).unwrap_or(&[]);
            KeptRate {
                sender: sender.clone(),
                waba_id: waba.clone(),
                before_per_s: rate_in(times, from, r.start_s).unwrap_or(0.0),
                during_per_s: rate_in(times, r.start_s, r.end_s).unwrap_or(0.0),
            }
        })
        .collect()
}

/// What one operation held by the restriction became (from the simulator's oracle and the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldFate {
    /// Accepted by Meta exactly once, after the lift.
    SentOnceAfterLift,
    /// Accepted by Meta before the lift (it went out through the restriction: the hold did not hold).
    SentBeforeLift,
    /// Accepted by Meta more than once.
    SentTwice,
    /// Its deadline passed while it was held (an OTP): EXPIRED, never sent, as its deadline asks.
    Expired,
    /// Not accepted by Meta and not expired.
    Unsent,
}

/// The fate of a held operation: `accepted` is (times accepted, first acceptance unix ms) from the oracle.
pub fn held_fate(accepted: Option<(u32, i64)>, expired: bool, lifted_unix_ms: i64) -> HeldFate {
    match accepted {
        Some((n, _)) if n > 1 => HeldFate::SentTwice,
        Some((_, first)) if first < lifted_unix_ms => HeldFate::SentBeforeLift,
        Some(_) => HeldFate::SentOnceAfterLift,
        None if expired => HeldFate::Expired,
        None => HeldFate::Unsent,
    }
}

/// The figures of the "one WABA restricted mid-sale" rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WabaCheck {
    pub waba_id: String,
    pub code: i64,
    pub start_s: f64,
    pub end_s: f64,
    /// When the drill (as the operator) lifted the WABA's pause, seconds since start; None if it did not.
    pub lifted_s: Option<f64>,
    /// The restricted WABA's numbers and the other numbers.
    pub restricted: Vec<String>,
    pub others: Vec<KeptRate>,
    /// Answers with a restriction code Meta gave the restricted numbers.
    pub restriction_answers: u64,
    /// Sends refused by the WABA pause (`waba_paused`), of the restricted numbers and of the others.
    pub paused_refusals: u64,
    pub others_paused_refusals: u64,
    /// Health-breaker trips (CLOSED to OPEN) of the restricted numbers and of the others, from the restriction on.
    pub restricted_trips: usize,
    pub others_trips: usize,
    /// Distinct operations held (refused by the pause, or answered with the code), and what became of them.
    pub held: u64,
    pub fates: BTreeMap<&'static str, u64>,
}

impl WabaCheck {
    /// The lowest share of its rate a number of the other WABAs kept; None when none had a baseline.
    pub fn min_kept(&self) -> Option<f64> {
        self.others.iter().filter_map(KeptRate::ratio).reduce(f64::min)
    }

    pub fn fate(&self, f: HeldFate) -> u64 {
        self.fates.get(fate_label(f)).copied().unwrap_or(0)
    }

    /// Paused in the WABA scope: refused as `waba_paused`, none of their health breakers tripped, and the other
    /// WABAs neither paused nor tripped.
    pub fn paused_in_scope(&self) -> bool {
        self.paused_refusals > 0
            && self.restricted_trips == 0
            && self.others_paused_refusals == 0
            && self.others_trips == 0
    }

    /// Every number of the other WABAs kept at least [`KEPT_RATE_MIN`] of its rate.
    pub fn others_kept_rate(&self) -> bool {
        !self.others.is_empty() && self.others.iter().all(|k| k.ratio().is_some_and(|r| r >= KEPT_RATE_MIN))
    }

    /// Every held message was sent once after the lift, or expired at its deadline.
    pub fn held_sent_once(&self) -> bool {
        self.lifted_s.is_some()
            && self.held > 0
            && self.fate(HeldFate::SentOnceAfterLift) + self.fate(HeldFate::Expired) == self.held
    }
}

pub fn fate_label(f: HeldFate) -> &'static str {
    match f {
        HeldFate::SentOnceAfterLift => "sent_once_after_lift",
        HeldFate::SentBeforeLift => "sent_before_lift",
        HeldFate::SentTwice => "sent_twice",
        HeldFate::Expired => "expired",
        HeldFate::Unsent => "unsent",
    }
}

/// Per sender, what the drill saw that the WABA rows need.
#[derive(Clone)]
pub struct WabaInputs<'a> {
    pub sender_waba: &'a BTreeMap<String, String>,
    pub sent_at: &'a BTreeMap<String, Vec<f64>>,
    /// (seconds since start, sender) of every CLOSED to OPEN transition.
    pub trips: Vec<(f64, String)>,
    /// Sends refused as `waba_paused`, per sender.
    pub paused_refusals: &'a BTreeMap<String, u64>,
    /// Error answers as (seconds since start, code, sender).
    pub answers: &'a [(f64, i64, String)],
    /// Operations held by the restriction, each with its fate.
    pub held: &'a BTreeSet<String>,
    pub fate: &'a dyn Fn(&str) -> HeldFate,
    pub lifted_s: Option<f64>,
}

/// The figures of the restriction `r`.
pub fn waba_check(r: &Restriction, i: &WabaInputs<'_>) -> WabaCheck {
    let restricted: Vec<String> =
        i.sender_waba.iter().filter(|(_, w)| **w == r.waba_id).map(|(s, _)| s.clone()).collect();
    let is_restricted = |s: &str| restricted.iter().any(|x| x == s);
    let trips_from = |restricted_side: bool| {
        i.trips.iter().filter(|(t, s)| *t >= r.start_s && is_restricted(s.as_str()) == restricted_side).count()
    };
    let refusals = |restricted_side: bool| -> u64 {
        i.paused_refusals.iter().filter(|(s, _)| is_restricted(s.as_str()) == restricted_side).map(|(_, n)| n).sum()
    };
    let mut fates = BTreeMap::new();
    for op in i.held {
        *fates.entry(fate_label((i.fate)(op.as_str()))).or_insert(0) += 1;
    }
    WabaCheck {
        waba_id: r.waba_id.clone(),
        code: r.code,
        start_s: r.start_s,
        end_s: r.end_s,
        lifted_s: i.lifted_s,
        others: kept_rates(i.sent_at, i.sender_waba, r),
        restriction_answers: i
            .answers
            .iter()
            .filter(|(_, code, s)| RESTRICTION_CODES.contains(code) && is_restricted(s.as_str()))
            .count() as u64,
        paused_refusals: refusals(true),
        others_paused_refusals: refusals(false),
        restricted_trips: trips_from(true),
        others_trips: trips_from(false),
        held: i.held.len() as u64,
        fates,
        restricted,
    }
}

/// Sub-threshold noise: the scenario's fault windows all fail at a rate under the breakers' threshold, and it
/// injects no scoped codes. Such noise must trip no breaker.
#[derive(Debug, Clone, PartialEq)]
pub struct Noise {
    /// The highest error rate of a window, and the threshold it stays under.
    pub max_error_rate: f64,
    pub threshold: f64,
    /// Seconds the noise lasts in all (open-ended windows counted to `run_s`).
    pub noisy_s: f64,
}

impl Noise {
    /// The run saw the noise: the breaker counted at least half the configured rate of its calls as failures.
    /// A run whose noise never reached the breaker proves nothing about tripping on it.
    pub fn observed(&self, failure_share: Option<f64>) -> bool {
        failure_share.is_some_and(|f| f >= self.max_error_rate / 2.0)
    }
}

/// The scenario's noise, if it is sub-threshold noise (see [`Noise`]).
pub fn noise(scenario: &Scenario, threshold: f64) -> Option<Noise> {
    let faulty: Vec<_> = scenario.windows.iter().filter(|w| w.error_rate > 0.0).collect();
    let max = faulty.iter().map(|w| w.error_rate).fold(0.0, f64::max);
    if faulty.is_empty() || max >= threshold || !scenario.injections.is_empty() {
        return None;
    }
    let noisy_s = faulty.iter().map(|w| w.duration_ms.map_or(f64::INFINITY, |d| d as f64 / 1000.0)).sum();
    Some(Noise { max_error_rate: max, threshold, noisy_s })
}

/// Breaker failures over calls, from the per-sender (time, counted as a failure) call timeline.
pub fn failure_share(calls: &BTreeMap<String, Vec<(f64, bool)>>) -> Option<f64> {
    let total: usize = calls.values().map(Vec::len).sum();
    let failed: usize = calls.values().map(|c| c.iter().filter(|(_, f)| *f).count()).sum();
    (total > 0).then(|| failed as f64 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(text: &str) -> Scenario {
        Scenario::from_toml(text).expect("scenario parses")
    }

    #[test]
    fn restriction_scenario_spreads_senders_over_two_wabas() {
        let s = scenario(
            "name = \"t\"\n[[injections]]\nname = \"r\"\ncode = 368\nstart_ms = 20000\nduration_ms = 30000\n\
             waba_ids = [\"B\"]\n",
        );
        assert_eq!(restrictions(&s), vec![Restriction { waba_id: "B".into(), code: 368, start_s: 20.0, end_s: 50.0 }]);
        let wabas = wabas(&s, "A");
        assert_eq!(wabas, vec!["A".to_string(), "B".to_string()]);
        let senders: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
        assert_eq!(sender_wabas(&senders, &wabas), vec!["A", "B", "A", "B"]);
        // Without a WABA-aimed injection every sender stays on the default WABA, and nothing is a restriction.
        let plain = scenario("name = \"p\"\n");
        assert_eq!(sender_wabas(&senders, &super::wabas(&plain, "A")), vec!["A"; 4]);
        assert!(restrictions(&plain).is_empty());
    }

    fn times(rate: f64, from: f64, to: f64) -> Vec<f64> {
        let n = ((to - from) * rate).round() as usize;
        (0..n).map(|k| from + k as f64 / rate).collect()
    }

    #[test]
    fn kept_rate_compares_the_restriction_with_the_span_before_it() {
        let r = Restriction { waba_id: "B".into(), code: 368, start_s: 20.0, end_s: 40.0 };
        let sender_waba: BTreeMap<String, String> =
            [("a1", "A"), ("a2", "A"), ("b1", "B")].iter().map(|(s, w)| (s.to_string(), w.to_string())).collect();
        let mut sent = BTreeMap::new();
        // a1 keeps 74/s; a2 drops from 74/s to 60/s (81 %); b1 is the restricted one and is ignored.
        sent.insert("a1".to_string(), times(74.0, 0.0, 60.0));
        let mut a2 = times(74.0, 0.0, 20.0);
        a2.extend(times(60.0, 20.0, 40.0));
        sent.insert("a2".to_string(), a2);
        sent.insert("b1".to_string(), times(74.0, 0.0, 20.0));
        let kept = kept_rates(&sent, &sender_waba, &r);
        assert_eq!(kept.iter().map(|k| k.sender.as_str()).collect::<Vec<_>>(), vec!["a1", "a2"]);
        // The baseline is [3 s, 20 s): the warm-up is left out.
        assert!((kept[0].before_per_s - 74.0).abs() < 0.1, "{kept:?}");
        assert!((kept[0].ratio().expect("baseline") - 1.0).abs() < 0.01);
        assert!((kept[1].ratio().expect("baseline") - 60.0 / 74.0).abs() < 0.01);
        let check = |others: Vec<KeptRate>| WabaCheck { others, ..Default::default() };
        assert!(!check(kept.clone()).others_kept_rate(), "81 % is under 90 %");
        assert!(check(kept[..1].to_vec()).others_kept_rate());
        assert!(!check(Vec::new()).others_kept_rate(), "no other WABA measured is no evidence");
        let silent = KeptRate { before_per_s: 0.0, ..kept[0].clone() };
        assert_eq!(silent.ratio(), None);
        assert!(!check(vec![silent]).others_kept_rate(), "no baseline is no evidence");
    }

    #[test]
    fn held_messages_count_once_after_the_lift_or_expired() {
        let lift = 50_000;
        assert_eq!(held_fate(Some((1, 51_000)), false, lift), HeldFate::SentOnceAfterLift);
        assert_eq!(held_fate(Some((1, 49_000)), false, lift), HeldFate::SentBeforeLift);
        assert_eq!(held_fate(Some((2, 51_000)), false, lift), HeldFate::SentTwice);
        assert_eq!(held_fate(None, true, lift), HeldFate::Expired);
        assert_eq!(held_fate(None, false, lift), HeldFate::Unsent);

        let r = Restriction { waba_id: "B".into(), code: 368, start_s: 20.0, end_s: 40.0 };
        let sender_waba: BTreeMap<String, String> =
            [("a1", "A"), ("b1", "B")].iter().map(|(s, w)| (s.to_string(), w.to_string())).collect();
        let refusals: BTreeMap<String, u64> = [("b1".to_string(), 500)].into();
        let answers = vec![(20.1, 368, "b1".to_string()), (20.2, 368, "b1".to_string()), (5.0, 131000, "a1".into())];
        let held: BTreeSet<String> = ["op1", "op2", "op3"].iter().map(|s| s.to_string()).collect();
        let fate = |op: &str| if op == "op3" { HeldFate::Expired } else { HeldFate::SentOnceAfterLift };
        let sent = BTreeMap::new();
        let inputs = WabaInputs {
            sender_waba: &sender_waba,
            sent_at: &sent,
            // A trip of the restricted number before the restriction is not the restriction's.
            trips: vec![(10.0, "b1".into())],
            paused_refusals: &refusals,
            answers: &answers,
            held: &held,
            fate: &fate,
            lifted_s: Some(40.5),
        };
        let c = waba_check(&r, &inputs);
        assert_eq!((c.restriction_answers, c.paused_refusals, c.restricted_trips), (2, 500, 0));
        assert_eq!(c.restricted, vec!["b1".to_string()]);
        assert!(c.paused_in_scope());
        assert!(c.held_sent_once(), "{c:?}");
        // A trip of the restricted number during the restriction fails the row: the pause must hold it, not
        // its health breaker.
        let c = waba_check(&r, &WabaInputs { trips: vec![(21.0, "b1".into())], ..inputs.clone() });
        assert!(!c.paused_in_scope());
        // One held message that went out twice fails the held row; so does no lift.
        let twice = |op: &str| if op == "op1" { HeldFate::SentTwice } else { HeldFate::SentOnceAfterLift };
        assert!(!waba_check(&r, &WabaInputs { fate: &twice, ..inputs.clone() }).held_sent_once());
        assert!(!waba_check(&r, &WabaInputs { lifted_s: None, ..inputs }).held_sent_once());
    }

    #[test]
    fn shipped_scenarios_are_what_their_rows_expect() {
        use bw_common::classify::{Channel, PauseScope, classify};
        // The classification on main pauses the WABA, nothing wider, on a 368 (and holds it until lifted).
        let restricted = classify(Some(368), None, 403, Channel::Sync);
        assert_eq!(restricted.paused_scope(), Some(PauseScope::Waba));
        assert!(!restricted.credentials(), "a policy block is no token problem");
        let threshold = bw_breaker::ScopeLimits::default().failure_threshold;
        let waba = scenario(include_str!("../../bw-meta-sim/scenarios/waba-restricted-mid-sale.toml"));
        assert_eq!(
            restrictions(&waba),
            vec![Restriction { waba_id: "102290129340399".into(), code: 368, start_s: 20.0, end_s: 50.0 }]
        );
        assert_eq!(
            wabas(&waba, crate::setup::WABA_ID),
            vec![crate::setup::WABA_ID.to_string(), "102290129340399".to_string()]
        );
        assert!(noise(&waba, threshold).is_none());
        for (text, rate) in [
            (include_str!("../../bw-meta-sim/scenarios/noise-2pct.toml"), 0.02),
            (include_str!("../../bw-meta-sim/scenarios/noise-4pct.toml"), 0.04),
        ] {
            let s = scenario(text);
            let n = noise(&s, threshold).expect("sub-threshold noise");
            assert_eq!((n.max_error_rate, n.noisy_s), (rate, 600.0));
            assert!(restrictions(&s).is_empty());
            assert_eq!(wabas(&s, crate::setup::WABA_ID).len(), 1);
        }
        let outage =
            Scenario::flash_sale_outage(std::time::Duration::from_secs(15), std::time::Duration::from_secs(20));
        assert!(noise(&outage, threshold).is_none() && restrictions(&outage).is_empty());
    }

    #[test]
    fn noise_is_only_sub_threshold_windows_without_injections() {
        let windowed = |rate: f64| {
            scenario(&format!(
                "name = \"n\"\n[[windows]]\nstart_ms = 5000\nduration_ms = 600000\nerror_rate = {rate}\n\
                 faults = [{{ kind = \"bodiless\", status = 502, after_processing = true }}]\n"
            ))
        };
        let n = noise(&windowed(0.02), 0.05).expect("2 % is noise");
        assert_eq!((n.max_error_rate, n.noisy_s), (0.02, 600.0));
        assert!(noise(&windowed(0.04), 0.05).is_some());
        assert!(noise(&windowed(0.05), 0.05).is_none(), "at the threshold is an outage");
        assert!(noise(&windowed(0.28), 0.05).is_none());
        assert!(noise(&scenario("name = \"quiet\"\n"), 0.05).is_none(), "no faults is not noise");
        let calls: BTreeMap<String, Vec<(f64, bool)>> =
            [("a".to_string(), vec![(1.0, false), (2.0, true)]), ("b".to_string(), vec![(1.0, false); 2])].into();
        assert_eq!(failure_share(&calls), Some(0.25));
        assert_eq!(failure_share(&BTreeMap::new()), None);
        // 2 % configured: 1.2 % counted is the noise seen; 0.5 % or nothing counted is noise that never arrived.
        assert!(n.observed(Some(0.012)) && !n.observed(Some(0.005)) && !n.observed(None));
    }
}
