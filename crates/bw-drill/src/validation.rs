//! The validation matrix: one row per control the drill can check (quotas, windows, bursts, headers,
//! limiters, queues, retries, dedup, cache, webhooks, alerts, logs), each with its pass criterion, the
//! evidence the drill measured (figure and where it came from), a status and an owner.
//!
//! A row whose evidence this run did not measure is **pending**, never passed: "nothing went wrong" is not
//! evidence. Owners come from a TOML file (`--owners FILE`, table `[owners]`, one key per row) or from the
//! compiled [`DEFAULT_OWNERS`].

use crate::model::{DrillReport, Row, Status};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Compiled owners of the rows.
pub const DEFAULT_OWNERS: &str = include_str!("../validation-owners.toml");

/// The row keys, in display order.
pub const ROWS: [&str; 20] = [
    "quotas",
    "windows",
    "bursts",
    "headers",
    "limiters",
    "queues",
    "retries",
    "order",
    "recovery",
    "dedup",
    "cache",
    "webhooks",
    "alerts",
    "logs",
    "waba_scope",
    "waba_rate",
    "waba_held",
    "noise",
    "budget_reserve",
    "budget_order",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OwnersFile {
    owners: BTreeMap<String, String>,
}

/// Parses an owners file; every key must be a row and every row must have an owner.
pub fn parse_owners(text: &str) -> Result<BTreeMap<String, String>, String> {
    let file: OwnersFile = toml::from_str(text).map_err(|e| format!("owners file: {e}"))?;
    if let Some(unknown) = file.owners.keys().find(|k| !ROWS.contains(&k.as_str())) {
        return Err(format!("owners file: unknown row `{unknown}` (rows: {})", ROWS.join(", ")));
    }
    if let Some(missing) = ROWS.iter().find(|r| !file.owners.contains_key(**r)) {
        return Err(format!("owners file: no owner for row `{missing}`"));
    }
    Ok(file.owners)
}

fn verdict(measured: bool, ok: bool) -> Status {
    match (measured, ok) {
        (false, _) => Status::Pending,
        (true, true) => Status::Passed,
        (true, false) => Status::Failed,
    }
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "n/a".into())
}

/// Builds the matrix from the report's measured figures.
pub fn rows(r: &DrillReport, owners: &BTreeMap<String, String>) -> Vec<Row> {
    let e = &r.errors;
    let source = e.source.label();
    let code = |k: &str| e.code(k).map(|c| c.self_inflicted).unwrap_or(0);
    let calls = r.meta_requests > 0;
    let mut out = Vec::new();
    let mut push = |key: &'static str, control: String, criterion: &str, evidence: String, status: Status| {
        let owner = owners.get(key).cloned().unwrap_or_else(|| "unassigned".into());
        out.push(Row { key, control, criterion: criterion.into(), evidence, status, owner, required: false });
    };
    push(
        "quotas",
        format!("per-sender rate {:.1} msg/s, under Meta's {:.0} msg/s throughput", r.sender_rate, r.meta_mps),
        "0 self-inflicted 130429 (throughput) answers",
        format!(
            "{} self-inflicted of {} 130429 answers ({source})",
            code("130429"),
            e.code("130429").map_or(0, |c| c.total)
        ),
        verdict(calls, code("130429") == 0),
    );
    push(
        "windows",
        "breaker failure window (10 s in 10 buckets, at least 50 calls)".into(),
        "every trip within 1 s of the window's error rate crossing the threshold",
        format!(
            "{} trips; trip latency p50 {} max {} (replayed from observed outcomes)",
            r.trip_latencies.len(),
            ms(r.trip_latency_p50_ms),
            ms(r.trip_latency_max_ms)
        ),
        verdict(!r.trip_latencies.is_empty(), r.trip_latency_max_ms.is_some_and(|m| m <= 1000.0)),
    );
    push(
        "bursts",
        format!("sender burst 5 (Meta tolerates 10), {} senders", r.senders),
        "peak Meta acceptances per second at most the senders' Meta allowance",
        format!(
            "peak {:.0} sent/s vs allowance {:.0}/s (1 s samples of observed outcomes)",
            r.peak_sent_per_s,
            r.meta_mps * r.senders as f64
        ),
        verdict(calls, r.peak_sent_per_s <= r.meta_mps * r.senders as f64 + 10.0 * r.senders as f64),
    );
    push(
        "headers",
        "usage headers (X-Business-Use-Case-Usage) slow sending before a limit".into(),
        "sending slows as reported usage nears 100%",
        "not measured: the drill does not record usage headers".into(),
        Status::Pending,
    );
    let rl_self = e.rate_limit_self_inflicted();
    push(
        "limiters",
        "Redis Lua limiter admits each sender at its configured rate".into(),
        "0 self-inflicted rate-limit answers (4, 80007, 130429, 131056)",
        format!(
            "{rl_self} self-inflicted, {} injected; self-inflicted by code 4: {}, 80007: {}, 130429: {}, 131056: {} ({source})",
            e.rate_limit_injected(),
            code("4"),
            code("80007"),
            code("130429"),
            code("131056")
        ),
        verdict(calls, rl_self == 0),
    );
    push(
        "queues",
        "every accepted operation is in exactly one place (accounting check)".into(),
        "0 lost, 0 in two places, 0 misplaced",
        format!(
            "{} accepted: {} lost, {} in two places, {} misplaced (bw_ops::account over the ledger and streams)",
            r.accepted, r.lost, r.in_two_places, r.misplaced
        ),
        verdict(r.accepted > 0, r.lost == 0 && r.in_two_places == 0 && r.misplaced == 0),
    );
    push(
        "retries",
        "dead-lettered messages are replayed once the breaker closes".into(),
        "DLQ and send queue empty at the end",
        format!(
            "{} DLQ moves, {} operations replayed, {} left in DLQ, {} queued; drain {}",
            r.dlq_moves,
            r.replayed,
            r.in_dlq,
            r.queued,
            r.replay_drain_s.map(|d| format!("{d:.1} s")).unwrap_or_else(|| "n/a".into())
        ),
        verdict(r.dlq_moves > 0, r.in_dlq == 0 && r.queued == 0),
    );
    let kept: Vec<&crate::journey::CategoryRow> =
        r.journey.categories.iter().filter(|c| c.category != "authentication").collect();
    let violations: u64 = kept.iter().map(|c| c.order_violations).sum();
    push(
        "order",
        "per recipient, a later message never reaches Meta before an earlier one still waiting (authentication exempt)"
            .into(),
        "0 order violations in transactional, support and marketing",
        format!(
            "{violations} violations ({}; simulator oracle against ingest acceptance order)",
            kept.iter().map(|c| format!("{} {}", c.category, c.order_violations)).collect::<Vec<_>>().join(", ")
        ),
        verdict(kept.iter().any(|c| c.accepted_by_meta > 0), violations == 0),
    );
    push(
        "recovery",
        "dead-lettered priority messages go before marketing once their sender closes".into(),
        "every dead-lettered priority message accepted within backlog / rate + 5 s of its sender's close; 0 live promotions ahead of them",
        format!(
            "{} of {} late; {} live promotions accepted while priority waited",
            r.journey.priority_late, r.journey.priority_checked, r.journey.promotions_ahead_of_priority
        ),
        verdict(
            r.journey.priority_checked > 0,
            r.journey.priority_late == 0 && r.journey.promotions_ahead_of_priority == 0,
        ),
    );
    push(
        "dedup",
        "an operation Meta may have accepted is never resent blindly".into(),
        "0 unflagged duplicates at Meta",
        format!(
            "{} duplicates at Meta: {} flagged (went through BW_UNKNOWN), {} unflagged (simulator oracle)",
            r.duplicates_at_meta,
            r.duplicates_flagged_unknown,
            r.duplicates_unflagged()
        ),
        verdict(r.oracle_accepted > 0, r.duplicates_unflagged() == 0),
    );
    push(
        "cache",
        "ingest answers a resubmitted operation id from the ledger (idempotency)".into(),
        "a resubmission is accepted once and sent once",
        "not measured: the drill's producer submits each operation once".into(),
        Status::Pending,
    );
    let w = &r.webhooks;
    push(
        "webhooks",
        "status webhooks are acknowledged and recorded".into(),
        "no status update dropped by the simulator; delivered statuses reach the ledger",
        format!(
            "{} statuses delivered, {} dropped, {} failed posts (simulator); ledger delivered {} read {}",
            w.statuses_delivered, w.statuses_dropped, w.post_failures, r.delivered, r.read
        ),
        verdict(w.statuses_scheduled > 0, w.statuses_dropped == 0 && r.delivered + r.read > 0),
    );
    let breaker_alerts: Vec<_> = r.alerts.iter().filter(|a| a.rule == "breaker_open").collect();
    let resolved = breaker_alerts.iter().filter(|a| a.resolved_at_unix_ms > 0).count();
    push(
        "alerts",
        "a tripped breaker raises breaker_open, which resolves by itself when it closes".into(),
        "breaker_open fired while a breaker was OPEN and every one resolved by the end",
        format!(
            "{} trips; {} breaker_open alerts, {resolved} resolved (bw.alert.v1.* observed)",
            r.breaker_trips,
            breaker_alerts.len()
        ),
        verdict(r.breaker_trips > 0, !breaker_alerts.is_empty() && resolved == breaker_alerts.len()),
    );
    push(
        "logs",
        "no full phone number, access token or app secret in any service log".into(),
        "0 findings over every service log",
        match &r.log_scan {
            Some(s) => format!("{} findings in {} log files ({} bytes scanned)", s.findings, s.files, s.bytes),
            None => "not measured: no service logs".into(),
        },
        // Empty logs prove nothing: measured only when there was text to scan.
        verdict(r.log_scan.as_ref().is_some_and(|s| s.bytes > 0), r.log_scan.as_ref().is_some_and(|s| s.findings == 0)),
    );
    scenario_rows(r, &mut push);
    // The scenario's own rows are required for PASS; the others were marked pending above when not this scenario.
    for row in &mut out {
        row.required = match row.key {
            "waba_scope" | "waba_rate" | "waba_held" => r.waba.is_some(),
            "noise" => r.noise.is_some(),
            "budget_reserve" | "budget_order" => r.budget.is_some(),
            _ => false,
        };
    }
    out
}

/// The rows of one kind of scenario ([`crate::scoped`], [`crate::budget`]): pending in any other scenario.
fn scenario_rows(r: &DrillReport, push: &mut impl FnMut(&'static str, String, &str, String, Status)) {
    let not_this = |what: &str| format!("not this scenario: it {what}");
    match &r.waba {
        Some(w) => {
            let lifted = w.lifted_s.map(|t| format!("{t:.1} s")).unwrap_or_else(|| "never".into());
            push(
                "waba_scope",
                format!(
                    "WABA {} restricted ({} on every send) {:.0}-{:.0} s: its numbers paused in the WABA scope",
                    w.waba_id, w.code, w.start_s, w.end_s
                ),
                "the restricted WABA's numbers refused as waba_paused, 0 of their health breakers tripped; \
                 the other WABA's numbers neither paused nor tripped",
                format!(
                    "{} numbers restricted: {} restriction answers, {} waba_paused refusals, {} trips; \
                     other numbers: {} waba_paused refusals, {} trips (observed outcomes and breaker transitions)",
                    w.restricted.len(),
                    w.restriction_answers,
                    w.paused_refusals,
                    w.restricted_trips,
                    w.others_paused_refusals,
                    w.others_trips
                ),
                verdict(w.restriction_answers > 0, w.paused_in_scope()),
            );
            push(
                "waba_rate",
                "the other WABA's numbers keep their rate during the restriction".into(),
                "every number of the other WABA sends at >= 90% of its rate before the restriction",
                format!(
                    "{} (sent/s during vs the same span before; per-sender timeline of sent outcomes)",
                    if w.others.is_empty() {
                        "no other WABA's number".to_string()
                    } else {
                        w.others
                            .iter()
                            .map(|k| {
                                format!(
                                    "{}: {:.1} of {:.1} msg/s ({})",
                                    k.sender,
                                    k.during_per_s,
                                    k.before_per_s,
                                    k.ratio().map(|x| format!("{:.0}%", x * 100.0)).unwrap_or_else(|| "n/a".into())
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
                verdict(!w.others.is_empty(), w.others_kept_rate()),
            );
            use crate::scoped::HeldFate as F;
            push(
                "waba_held",
                format!("messages held by the restriction go out once the operator lifts the pause (at {lifted})"),
                "every held message accepted by Meta exactly once after the lift (or expired at its deadline)",
                format!(
                    "{} held: {} sent once after the lift, {} expired at their deadline, \
                     {} sent before the lift, {} sent twice, {} unsent (simulator oracle, ledger)",
                    w.held,
                    w.fate(F::SentOnceAfterLift),
                    w.fate(F::Expired),
                    w.fate(F::SentBeforeLift),
                    w.fate(F::SentTwice),
                    w.fate(F::Unsent)
                ),
                verdict(w.held > 0, w.held_sent_once()),
            );
        }
        None => {
            for key in ["waba_scope", "waba_rate", "waba_held"] {
                push(
                    key,
                    "one WABA restricted mid-sale".into(),
                    "see docs/drill.md",
                    not_this("restricts no WABA"),
                    Status::Pending,
                );
            }
        }
    }
    match &r.noise {
        Some(n) => push(
            "noise",
            format!(
                "sub-threshold noise: {:.0}% errors at most (threshold {:.0}%) for {:.0} s",
                n.max_error_rate * 100.0,
                n.threshold * 100.0,
                n.noisy_s
            ),
            "no breaker tripped, with the noise seen (the breaker counted at least half its rate as failures)",
            format!(
                "{} trips over {} calls; the breaker counted {} of the calls as failures \
                 (observed outcomes and breaker transitions)",
                r.breaker_trips,
                r.meta_requests,
                r.failure_share.map(|f| format!("{:.2}%", f * 100.0)).unwrap_or_else(|| "n/a".into())
            ),
            // Measured only when the noise reached the breaker: a quiet run trips nothing and proves nothing.
            verdict(r.meta_requests > 0 && n.observed(r.failure_share), r.breaker_trips == 0),
        ),
        None => push(
            "noise",
            "sub-threshold noise trips no breaker".into(),
            "no breaker tripped",
            not_this("is not sub-threshold noise"),
            Status::Pending,
        ),
    }
    budget_rows(r, push);
}

/// The portfolio messaging limit's rows ([`crate::budget`]).
fn budget_rows(r: &DrillReport, push: &mut impl FnMut(&'static str, String, &str, String, Status)) {
    let Some(b) = &r.budget else {
        for key in ["budget_reserve", "budget_order"] {
            let what = "portfolio messaging limit reached".to_string();
            push(key, what, "see docs/drill.md", "not this scenario: it announces no tier".into(), Status::Pending);
        }
        return;
    };
    let held = |c: &str| b.held.get(c).copied().unwrap_or(0);
    let first = |c: &str| b.first_held_s.get(c).map(|t| format!("{t:.1} s")).unwrap_or_else(|| "never".into());
    push(
        "budget_reserve",
        "authentication messages may use the reserve: an OTP is held only once the whole limit is used".into(),
        "0 authentication messages held while the portfolio had used less than its limit",
        format!(
            "{} OTPs held, {} of them within the reserve ({} with the portfolio's figures); marketing held from {} \
             (feed: the hold's reason; budget_held outcomes)",
            b.otp_held,
            b.otp_within_reserve,
            b.otp_with_figures,
            b.marketing_first_figures.map(|(u, l)| format!("{u} of {l} users")).unwrap_or_else(|| "n/a".into())
        ),
        // Measured once marketing was held (the reserve was entered) and every held OTP's figures were read.
        verdict(b.reserve_entered() && b.otp_figures_complete(), b.otp_kept_reserve()),
    );
    push(
        "budget_order",
        "marketing is held first, before any authentication or utility message".into(),
        "the first message held is marketing; 0 authentication, utility or support messages held before it",
        format!(
            "first held: marketing {}, transactional {}, authentication {}, support {}; held: {} marketing, {} \
             transactional, {} authentication, {} support; {} priority holds before the first marketing one \
             (budget_held outcomes and feed)",
            first("marketing"),
            first("transactional"),
            first("authentication"),
            first("support"),
            held("marketing"),
            held("transactional"),
            held("authentication"),
            held("support"),
            b.priority_before_marketing
        ),
        verdict(b.any_held(), b.marketing_first()),
    );
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// `validation.md`: the header, then the matrix.
pub fn markdown(r: &DrillReport, rows: &[Row]) -> String {
    let h = &r.header;
    let mut s = String::from("# Breakwater drill: validation matrix\n\n");
    s.push_str(&format!("- Environment: {}\n", md_cell(&h.environment)));
    s.push_str(&format!("- Version: {}\n", md_cell(&h.version)));
    s.push_str(&format!("- Date and time (UTC): {}\n", h.started_utc));
    s.push_str(&format!("- Load: {}\n", md_cell(&h.load)));
    s.push_str(&format!("- Duration: {:.0} s\n", h.duration_s));
    s.push_str(&format!("- Expected: {}\n", md_cell(&h.expected)));
    s.push_str(&format!("- Observed: {}\n", md_cell(&h.observed)));
    s.push_str(&format!("- Result: {}\n\n", if r.passed() { "PASS" } else { "FAIL" }));
    s.push_str("| Row | Control | Pass criterion | Evidence | Status | Owner |\n|---|---|---|---|---|---|\n");
    for row in rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            row.key,
            md_cell(&row.control),
            md_cell(&row.criterion),
            md_cell(&row.evidence),
            row.status.label(),
            md_cell(&row.owner)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_owners_cover_every_row_and_bad_files_are_precise_errors() {
        let owners = parse_owners(DEFAULT_OWNERS).expect("compiled owners are valid");
        assert_eq!(owners.len(), ROWS.len());
        let err = parse_owners("[owners]\nquota = \"x\"\n").expect_err("typo");
        assert!(err.contains("unknown row `quota`"), "{err}");
        let err = parse_owners("[owners]\nquotas = \"x\"\n").expect_err("incomplete");
        assert!(err.contains("no owner for row `windows`"), "{err}");
    }

    #[test]
    fn unmeasured_rows_are_pending_and_failures_fail() {
        let owners = parse_owners(DEFAULT_OWNERS).expect("owners");
        // An empty run measured nothing: every row pending, none passed.
        let rows = rows(&DrillReport::default(), &owners);
        assert_eq!(rows.iter().map(|r| r.key).collect::<Vec<_>>(), ROWS, "the matrix keeps the display order");
        assert!(rows.iter().all(|r| r.status == Status::Pending), "{rows:?}");
        let mut r = DrillReport { accepted: 10, lost: 1, meta_requests: 10, ..Default::default() };
        r.errors.codes.push(crate::errors::CodeCount {
            key: "130429".into(),
            total: 3,
            injected: 1,
            self_inflicted: 2,
            rate_limit: true,
        });
        let rows = super::rows(&r, &owners);
        let status = |k: &str| rows.iter().find(|r| r.key == k).map(|r| r.status);
        assert_eq!(status("queues"), Some(Status::Failed));
        assert_eq!(status("limiters"), Some(Status::Failed));
        assert_eq!(status("quotas"), Some(Status::Failed));
        assert_eq!(status("headers"), Some(Status::Pending));
        let md = markdown(&r, &rows);
        assert!(md.contains("| queues |") && md.contains("| failed |") && md.contains("Result: FAIL"), "{md}");
    }

    #[test]
    fn scenario_rows_are_required_for_pass_only_in_their_scenario() {
        use crate::scoped::{KeptRate, Noise, WabaCheck};
        use bw_proto::v1::Category;
        let owners = parse_owners(DEFAULT_OWNERS).expect("owners");
        let judged = |mut r: DrillReport| {
            r.validation = rows(&r, &owners);
            r
        };
        let status =
            |r: &DrillReport, k: &str| r.validation.iter().find(|v| v.key == k).map(|v| (v.status, v.required));
        let base = DrillReport { accepted: 10, meta_requests: 1_000, ..Default::default() };
        // The default outage: the scenario rows are pending and PASS does not wait for them.
        let r = judged(base.clone());
        assert_eq!(status(&r, "noise"), Some((Status::Pending, false)));
        assert_eq!(status(&r, "waba_rate"), Some((Status::Pending, false)));
        assert!(r.passed());

        // Sub-threshold noise: one trip fails the row and the run.
        let noise = Some(Noise { max_error_rate: 0.02, threshold: 0.05, noisy_s: 600.0 });
        let r =
            judged(DrillReport { noise: noise.clone(), breaker_trips: 1, failure_share: Some(0.02), ..base.clone() });
        assert_eq!(status(&r, "noise"), Some((Status::Failed, true)));
        assert!(!r.passed());
        let r =
            judged(DrillReport { noise: noise.clone(), breaker_trips: 0, failure_share: Some(0.019), ..base.clone() });
        assert_eq!(status(&r, "noise"), Some((Status::Passed, true)));
        assert!(r.passed());
        // No noise reached the breaker: nothing measured, and the run does not pass on it.
        let r = judged(DrillReport { noise, breaker_trips: 0, failure_share: Some(0.0), ..base.clone() });
        assert_eq!(status(&r, "noise"), Some((Status::Pending, true)));
        assert!(!r.passed());

        // One WABA restricted: paused in scope, the other kept 95 % of its rate, both held messages sent once.
        let kept = |during: f64| KeptRate {
            sender: "a".into(),
            waba_id: "A".into(),
            before_per_s: 74.0,
            during_per_s: during,
        };
        let waba = WabaCheck {
            waba_id: "B".into(),
            code: 368,
            restricted: vec!["b".into()],
            others: vec![kept(70.3)],
            restriction_answers: 4,
            paused_refusals: 900,
            lifted_s: Some(45.0),
            held: 2,
            fates: [("sent_once_after_lift", 2)].into(),
            ..Default::default()
        };
        let r = judged(DrillReport { waba: Some(waba.clone()), ..base.clone() });
        for key in ["waba_scope", "waba_rate", "waba_held"] {
            assert_eq!(status(&r, key), Some((Status::Passed, true)), "{key}: {:?}", r.validation);
        }
        assert!(r.passed());
        // The other WABA's number slowed to 81 %: the rate row fails, and so does the run.
        let r =
            judged(DrillReport { waba: Some(WabaCheck { others: vec![kept(60.0)], ..waba.clone() }), ..base.clone() });
        assert_eq!(status(&r, "waba_rate"), Some((Status::Failed, true)));
        assert!(!r.passed());
        // A tier announced: the budget rows are required; an OTP held within the reserve fails the run.
        use crate::budget::{Hold, check};
        let hold = |t: f64, op: &str, f: (i64, i64)| Hold { t, operation_id: op.into(), figures: Some(f) };
        let cat = |op: &str| Some(if op.starts_with('m') { Category::Marketing } else { Category::Authentication });
        let good = check(&[hold(60.0, "m1", (9000, 10000)), hold(80.0, "a1", (10000, 10000))], cat);
        let r = judged(DrillReport { budget: Some(good), ..base.clone() });
        for key in ["budget_reserve", "budget_order"] {
            assert_eq!(status(&r, key), Some((Status::Passed, true)), "{key}: {:?}", r.validation);
        }
        assert!(r.passed());
        let otp_early = check(&[hold(60.0, "m1", (9000, 10000)), hold(70.0, "a1", (9500, 10000))], cat);
        let r = judged(DrillReport { budget: Some(otp_early), ..base.clone() });
        assert_eq!(status(&r, "budget_reserve"), Some((Status::Failed, true)));
        assert!(!r.passed());
        let otp_first = check(&[hold(50.0, "a1", (10000, 10000)), hold(60.0, "m1", (10000, 10000))], cat);
        let r = judged(DrillReport { budget: Some(otp_first), ..base.clone() });
        assert_eq!(status(&r, "budget_order"), Some((Status::Failed, true)));
        // Nothing held although a tier was announced: not measured, and the run does not pass on it.
        let r = judged(DrillReport { budget: Some(check(&[], cat)), ..base.clone() });
        assert_eq!(status(&r, "budget_order"), Some((Status::Pending, true)));
        assert!(!r.passed());

        // The restricted number's health breaker tripped: not a pause in its scope.
        let r = judged(DrillReport { waba: Some(WabaCheck { restricted_trips: 1, ..waba }), ..base });
        assert_eq!(status(&r, "waba_scope"), Some((Status::Failed, true)));
        assert!(!r.passed());
    }
}
