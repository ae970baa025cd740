//! The report's outputs: the text printed at the end, `report.json`, and the files written beside it
//! (`timeline.svg`, `report.html`, `validation.md`).

use crate::chart::{self, Sample};
use crate::model::{DrillReport, Status};
use crate::observe::Observed;
use crate::{html, journey, validation};
use serde_json::json;
use std::path::Path;

fn pct(v: Option<f64>) -> String {
    v.map(|f| format!("{:.0}%", f * 100.0)).unwrap_or_else(|| "n/a".into())
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map(|v| format!("{v:.2} {unit}")).unwrap_or_else(|| "n/a".into())
}

/// The human-readable report.
pub fn text(r: &DrillReport) -> String {
    let mut s = String::new();
    s.push_str("\n==== flash-sale drill report ====\n");
    if !r.header.settled && !r.header.version.is_empty() {
        s.push_str(
            "WARNING: the run did not settle before the timeout (work queued, a breaker open or an alert firing)\n",
        );
        for line in &r.unsettled {
            s.push_str(&format!("  held: {line}\n"));
        }
    }
    s.push_str(&format!(
        "requested {}  accepted {}  rejected {}  unanswered {}\n",
        r.requested, r.accepted, r.rejected, r.unanswered
    ));
    s.push_str(&format!(
        "final states: sent {}  delivered {}  read {}  failed(after Meta accepted) {}  quarantined {}  expired {}  unknown {}  in DLQ {}  queued {}\n",
        r.sent, r.delivered, r.read, r.failed, r.quarantined, r.expired, r.unknown, r.in_dlq, r.queued
    ));
    s.push_str(&format!(
        "DLQ moves {}  replayed operations {}  max DLQ depth {}  breaker trips {}\n",
        r.dlq_moves, r.replayed, r.max_dlq_depth, r.breaker_trips
    ));
    s.push_str(&format!("LOST {}   (in two places {}, misplaced {})\n", r.lost, r.in_two_places, r.misplaced));
    s.push_str(&format!(
        "duplicates at Meta {}: flagged (went through BW_UNKNOWN) {}, unflagged {}\n",
        r.duplicates_at_meta,
        r.duplicates_flagged_unknown,
        r.duplicates_unflagged()
    ));
    s.push_str(&format!(
        "rate-limit answers (4, 80007, 130429, 131056): injected {}, self-inflicted {} ({})\n",
        r.errors.rate_limit_injected(),
        r.errors.rate_limit_self_inflicted(),
        r.errors.source.label()
    ));
    if !r.limit_events.is_empty() {
        let shown: Vec<String> = r
            .limit_events
            .iter()
            .take(10)
            .map(|(t, sender, code, stall)| {
                format!("{t:.1} s {code} sender {sender} (simulator loop stalled {stall} ms in the second before)")
            })
            .collect();
        s.push_str(&format!(
            "  limit-caused answers ({} in all, first {}): {}\n",
            r.limit_events.len(),
            shown.len(),
            shown.join("; ")
        ));
    }
    s.push_str(&format!(
        "  simulator event-loop stalls of 50 ms or more: {}, longest {} ms\n",
        r.sim_loop_stalls, r.sim_longest_stall_ms
    ));
    s.push_str(&journey::text(&r.journey));
    for (t, label) in &r.chaos {
        s.push_str(&format!("chaos at {t:.1} s: {label}\n"));
    }
    let pending = r.validation.iter().filter(|v| v.status == Status::Pending).count();
    let failed: Vec<&str> = r.validation.iter().filter(|v| v.status == Status::Failed).map(|v| v.key).collect();
    s.push_str(&format!(
        "validation matrix: {} passed, {} failed{}, {pending} pending (validation.md)\n",
        r.validation.iter().filter(|v| v.status == Status::Passed).count(),
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(" ({})", failed.join(", ")) }
    ));
    // The scenario's own rows, which PASS requires, in full.
    for v in r.validation.iter().filter(|v| v.required) {
        s.push_str(&format!("  {} [{}]: {}: {}\n", v.key, v.status.label(), v.control, v.evidence));
    }
    s.push_str(&format!(
        "time to trip after the outage began {}; trip after the window's error rate crossed the threshold p50 {} max {}; fail-fast while OPEN (decision) p50 {} p99 {}, with the durable DLQ move p50 {} p99 {}; time to close after recovery {}\n",
        opt(r.time_to_trip_s, "s"),
        opt(r.trip_latency_p50_ms, "ms"),
        opt(r.trip_latency_max_ms, "ms"),
        opt(r.fail_fast_p50_ms, "ms"),
        opt(r.fail_fast_p99_ms, "ms"),
        opt(r.fail_fast_moved_p50_ms, "ms"),
        opt(r.fail_fast_moved_p99_ms, "ms"),
        opt(r.time_to_close_s, "s")
    ));
    s.push_str(&format!(
        "replay drain {}; replay rate {} ({} of the senders' configured rate; replay yields to live traffic), {} ({}) once live traffic ended\n",
        opt(r.replay_drain_s, "s"),
        opt(r.replay_rate_per_s, "msg/s"),
        pct(r.replay_rate_fraction),
        opt(r.replay_solo_rate_per_s, "msg/s"),
        pct(r.replay_solo_rate_fraction)
    ));
    s.push_str(if r.passed() {
        "RESULT: PASS (zero lost, no unflagged duplicates, no self-inflicted rate-limit answers)\n"
    } else {
        "RESULT: FAIL\n"
    });
    s
}

/// The whole report as JSON (the same data as the HTML page, the timeline included).
pub fn to_json(r: &DrillReport, samples: &[Sample], observed: &Observed) -> serde_json::Value {
    let zone = bw_common::time::parse_zone(&r.zone).ok();
    let times = |ms: i64| {
        if ms <= 0 {
            return serde_json::Value::Null;
        }
        json!({
            "unix_ms": ms,
            "utc": bw_common::time::format_utc(ms),
            "local": zone.map(|z| bw_common::time::format_local(ms, z)),
        })
    };
    json!({
        "header": {
            "environment": r.header.environment, "version": r.header.version, "started_utc": r.header.started_utc,
            "load": r.header.load, "duration_s": r.header.duration_s, "scenario": r.header.scenario,
            "expected": r.header.expected, "observed": r.header.observed, "display_zone": r.zone,
            "settled": r.header.settled,
        },
        "passed": r.passed(),
        "requested": r.requested, "accepted": r.accepted, "rejected": r.rejected, "unanswered": r.unanswered,
        "sent": r.sent, "delivered": r.delivered, "read": r.read, "failed": r.failed, "in_dlq": r.in_dlq,
        "quarantined": r.quarantined, "expired": r.expired, "unknown": r.unknown, "queued": r.queued,
        "replayed": r.replayed, "dlq_moves": r.dlq_moves, "lost": r.lost, "in_two_places": r.in_two_places,
        "misplaced": r.misplaced,
        "duplicates": {
            "at_meta": r.duplicates_at_meta, "flagged": r.duplicates_flagged_unknown,
            "unflagged": r.duplicates_unflagged(),
        },
        "duplicates_at_meta": r.duplicates_at_meta, "duplicates_flagged_unknown": r.duplicates_flagged_unknown,
        "rate_limit": {
            "injected": r.errors.rate_limit_injected(), "self_inflicted": r.errors.rate_limit_self_inflicted(),
            "source": r.errors.source.label(),
        },
        "errors": r.errors.codes.iter().map(|c| json!({
            "code": c.key, "total": c.total, "injected": c.injected, "self_inflicted": c.self_inflicted,
            "rate_limit": c.rate_limit,
        })).collect::<Vec<_>>(),
        "limit_events": r.limit_events.iter().map(|e| json!({
            "t": e.0, "sender": e.1, "code": e.2, "sim_stall_ms": e.3,
        })).collect::<Vec<_>>(),
        "sim_loop_stalls": r.sim_loop_stalls, "sim_longest_stall_ms": r.sim_longest_stall_ms,
        "meta_requests": r.meta_requests, "oracle_accepted": r.oracle_accepted, "peak_sent_per_s": r.peak_sent_per_s,
        "time_to_trip_s": r.time_to_trip_s, "trip_latency_p50_ms": r.trip_latency_p50_ms,
        "trip_latency_max_ms": r.trip_latency_max_ms,
        "trip_latencies": r.trip_latencies.iter().map(|t| json!({"t": t.0, "scope": t.1, "latency_ms": t.2 * 1000.0})).collect::<Vec<_>>(),
        "fail_fast_p50_ms": r.fail_fast_p50_ms, "fail_fast_p99_ms": r.fail_fast_p99_ms,
        "fail_fast_with_dlq_move_p50_ms": r.fail_fast_moved_p50_ms,
        "fail_fast_with_dlq_move_p99_ms": r.fail_fast_moved_p99_ms,
        "time_to_close_s": r.time_to_close_s, "replay_drain_s": r.replay_drain_s,
        "replay_rate_per_s": r.replay_rate_per_s, "replay_rate_fraction": r.replay_rate_fraction,
        "replay_solo_rate_per_s": r.replay_solo_rate_per_s, "replay_solo_rate_fraction": r.replay_solo_rate_fraction,
        "max_dlq_depth": r.max_dlq_depth, "breaker_trips": r.breaker_trips, "unsettled": r.unsettled,
        "webhooks": {
            "statuses_scheduled": r.webhooks.statuses_scheduled, "statuses_delivered": r.webhooks.statuses_delivered,
            "statuses_dropped": r.webhooks.statuses_dropped, "post_failures": r.webhooks.post_failures,
        },
        "senders": r.per_sender.iter().map(|p| json!({
            "sender": p.sender, "accepted_by_meta": p.accepted_by_meta, "sent": p.sent, "dlq_moves": p.dlq_moves,
            "rate_limited": p.rate_limited, "error_answers": p.error_answers, "trips": p.trips,
            "final_breaker": p.final_breaker,
        })).collect::<Vec<_>>(),
        "journey": r.journey,
        "alerts": r.alerts.iter().map(|a| json!({
            "dedup_key": a.dedup_key, "rule": a.rule, "severity": a.severity, "scope": a.scope, "summary": a.summary,
            "fired": times(a.started_at_unix_ms), "resolved": times(a.resolved_at_unix_ms),
        })).collect::<Vec<_>>(),
        "chaos": r.chaos.iter().map(|(t, l)| json!({"t": t, "event": l})).collect::<Vec<_>>(),
        "log_scan": r.log_scan.as_ref().map(|l| json!({"files": l.files, "bytes": l.bytes, "findings": l.findings})),
        "validation": r.validation.iter().map(|v| json!({
            "row": v.key, "control": v.control, "criterion": v.criterion, "evidence": v.evidence,
            "status": v.status.label(), "owner": v.owner, "required": v.required,
        })).collect::<Vec<_>>(),
        "scenario_checks": scenario_json(r),
        "timeline": {
            "samples": samples.iter().map(|s| json!({
                "t": s.t, "sent_per_s": s.sent_per_s, "error_rate": s.error_rate, "errors_per_s": s.errors_per_s,
                "scopes_open": s.scopes_open, "scopes_half_open": s.scopes_half_open, "dlq_depth": s.dlq_depth,
            })).collect::<Vec<_>>(),
            "marks": r.marks.iter().map(|m| json!({"t": m.t, "label": m.label, "kind": m.kind.label()})).collect::<Vec<_>>(),
            "transitions": observed.transitions.iter().map(|t| json!({"t": t.0, "from": format!("{:?}", t.1), "to": format!("{:?}", t.2), "scope": t.3})).collect::<Vec<_>>(),
        },
    })
}

/// The figures of the scenario's own checks (a WABA restriction, sub-threshold noise, the messaging limit), null
/// when not this one.
fn scenario_json(r: &DrillReport) -> serde_json::Value {
    let waba = r.waba.as_ref().map(|w| {
        json!({
            "waba_id": w.waba_id, "code": w.code, "start_s": w.start_s, "end_s": w.end_s, "lifted_s": w.lifted_s,
            "restricted": w.restricted, "restriction_answers": w.restriction_answers,
            "paused_refusals": w.paused_refusals, "restricted_trips": w.restricted_trips,
            "others_paused_refusals": w.others_paused_refusals, "others_trips": w.others_trips,
            "others": w.others.iter().map(|k| json!({
                "sender": k.sender, "waba_id": k.waba_id, "before_per_s": k.before_per_s,
                "during_per_s": k.during_per_s, "kept": k.ratio(),
            })).collect::<Vec<_>>(),
            "min_kept": w.min_kept(), "held": w.held, "held_fates": w.fates,
        })
    });
    let noise = r.noise.as_ref().map(|n| {
        json!({
            "max_error_rate": n.max_error_rate, "threshold": n.threshold, "noisy_s": n.noisy_s,
            "trips": r.breaker_trips, "failure_share": r.failure_share,
        })
    });
    let budget = r.budget.as_ref().map(|b| {
        json!({
            "held": b.held, "first_held_s": b.first_held_s, "otp_held": b.otp_held,
            "otp_within_reserve": b.otp_within_reserve, "otp_with_figures": b.otp_with_figures,
            "marketing_first_figures": b.marketing_first_figures,
            "priority_before_marketing": b.priority_before_marketing,
        })
    });
    json!({ "waba_restriction": waba, "noise": noise, "portfolio_budget": budget })
}

/// Writes `report.json`, `timeline.svg`, `report.html` and `validation.md` to `dir`.
pub fn write(dir: &Path, r: &DrillReport, samples: &[Sample], observed: &Observed) -> anyhow::Result<()> {
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&to_json(r, samples, observed))?)?;
    let svg = chart::render(samples, &r.marks, "Breakwater drill: throughput, errors, breakers, DLQ");
    std::fs::write(dir.join("timeline.svg"), &svg)?;
    std::fs::write(dir.join("report.html"), html::page(r, &svg))?;
    std::fs::write(dir.join("validation.md"), validation::markdown(r, &r.validation))?;
    Ok(())
}
