//! The drill's final report: figures computed from the accounting check, the ledger, the simulator's oracle
//! and the observed breaker events, into a [`DrillReport`] ([`crate::render`] prints and writes it).

use crate::chart::Sample;
use crate::figures::percentile;
use crate::model::{AlertRow, DrillReport, Header, LogScan, Mark, SenderRow};
use crate::observe::Observed;
use crate::options::DrillOptions;
use crate::producer::Produced;
use crate::validation;
use bw_meta_sim::{OracleSnapshot, Scenario, WebhookCounters};
use bw_ops::account::AccountingReport;
use bw_proto::v1::{BreakerState, LedgerEntry, OperationState};
use std::collections::{BTreeMap, HashSet};

/// Everything the report is computed from.
pub(crate) struct Inputs<'a> {
    pub opts: &'a DrillOptions,
    pub produced: &'a Produced,
    pub accounting: &'a AccountingReport,
    pub entries: &'a [LedgerEntry],
    pub oracle: &'a OracleSnapshot,
    pub observed: &'a Observed,
    pub drained_at: Option<f64>,
    pub max_dlq: u64,
    /// What held a run that did not settle ([`crate::stuck`]); empty when it settled.
    pub unsettled: Vec<String>,
    pub sender_rate: f64,
    /// The dispatchers' ramp after a close (ms) and its starting share.
    pub ramp_ms: u64,
    pub ramp_start: f64,
    /// The simulator's counters as JSON (tolerant of old and new shapes, see [`crate::errors`]).
    pub counters: &'a serde_json::Value,
    pub webhooks: WebhookCounters,
    pub scenario: &'a Scenario,
    pub samples: &'a [Sample],
    pub marks: Vec<Mark>,
    pub chaos: Vec<(f64, String)>,
    pub log_scan: Option<LogScan>,
    pub header: Header,
    /// Each sender's WABA, and the WABA pauses the drill lifted as an operator: (seconds since start, WABA).
    pub sender_waba: &'a BTreeMap<String, String>,
    pub lifts: &'a [(f64, String)],
    pub owners: &'a BTreeMap<String, String>,
    pub zone: String,
}

pub(crate) fn build(i: Inputs<'_>) -> DrillReport {
    let count = |s: OperationState| i.entries.iter().filter(|e| e.state() == s).count() as u64;
    let flagged: HashSet<&str> =
        i.entries.iter().filter(|e| e.flagged_unknown).map(|e| e.operation_id.as_str()).collect();
    let duplicates = i.oracle.duplicates();
    let outage_start = i.opts.outage_start_s as f64;
    let outage_end = outage_start + i.opts.outage_length_s as f64;
    let trips: Vec<&(f64, BreakerState, BreakerState, String)> =
        i.observed.transitions.iter().filter(|t| t.2 == BreakerState::Open && t.1 == BreakerState::Closed).collect();
    let first_trip = trips.iter().map(|t| t.0).filter(|t| *t >= outage_start - 1.0).reduce(f64::min);
    let closes = || i.observed.transitions.iter().filter(|t| t.2 == BreakerState::Closed).map(|t| t.0);
    let last_close = closes().filter(|t| *t >= outage_end).reduce(f64::max);
    let first_close = closes().filter(|t| *t >= outage_start).reduce(f64::min);
    let replayed = i.entries.iter().filter(|e| e.replays > 0).count() as u64;
    let replay_drain_s = match (first_close, i.drained_at) {
        (Some(c), Some(d)) if d > c => Some(d - c),
        _ => None,
    };
    let replay_rate = replay_drain_s.map(|d| replayed as f64 / d.max(1.0));
    let configured = i.sender_rate * i.opts.senders as f64;
    let trips_latency = trip_latencies(i.observed, &bw_breaker::ScopeLimits::default());
    let mut trip_latency_us: Vec<u64> = trips_latency.iter().map(|t| (t.2 * 1e6) as u64).collect();
    let live_end = i.observed.last_live_sent_s;
    let solo: Vec<f64> = i.observed.replay_sent_s.iter().copied().filter(|t| *t > live_end).collect();
    let solo_rate = solo
        .iter()
        .copied()
        .reduce(f64::max)
        .filter(|last| *last - live_end >= 1.0)
        .map(|last| solo.len() as f64 / (last - live_end));
    let mut fail_fast = i.observed.fail_fast_us.clone();
    let mut fail_fast_moved = i.observed.fail_fast_moved_us.clone();
    let errors = crate::errors::split(i.counters, i.scenario, &i.observed.answers);
    let per_sender = i
        .observed
        .senders
        .iter()
        .map(|(phone, c)| SenderRow {
            sender: phone.clone(),
            accepted_by_meta: i
                .oracle
                .messages
                .iter()
                .filter(|m| &m.phone_number_id == phone)
                .map(|m| u64::from(m.count))
                .sum(),
            sent: c.sent,
            dlq_moves: c.dlq_moves,
            rate_limited: c.rate_limited,
            error_answers: c.error_answers,
            trips: trips.iter().filter(|t| &t.3 == phone).count(),
            final_breaker: i.observed.states.get(phone).map(|s| format!("{s:?}")).unwrap_or_else(|| "Closed".into()),
        })
        .collect();
    let started_ms = i.observed.started_unix_ms;
    let at_ms = |t: f64| started_ms + (t * 1000.0) as i64;
    let since_start = |unix_ms: u64| (unix_ms as i64 - started_ms) as f64 / 1000.0;
    // Older simulators report neither list.
    let listed = |key: &str| -> Vec<serde_json::Value> {
        i.counters.get(key).and_then(serde_json::Value::as_array).cloned().unwrap_or_default()
    };
    let field = |v: &serde_json::Value, key: &str| v.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
    let text =
        |v: &serde_json::Value, key: &str| v.get(key).and_then(serde_json::Value::as_str).unwrap_or("").to_string();
    let limit_events = listed("limit_events")
        .iter()
        .map(|e| {
            (since_start(field(e, "at_unix_ms")), text(e, "phone_number_id"), text(e, "code"), field(e, "stall_ms"))
        })
        .collect();
    let stalls = listed("loop_stalls");
    let mut closed_unix_ms: BTreeMap<String, i64> = BTreeMap::new();
    for (t, _, to, scope) in &i.observed.transitions {
        if *to == BreakerState::Closed && *t >= outage_end {
            closed_unix_ms.entry(scope.clone()).or_insert_with(|| at_ms(*t));
        }
    }
    let journey = crate::journey::compute(&crate::journey::JourneyInputs {
        entries: i.entries,
        oracle: i.oracle,
        // A fault window still open when the run ended (a shortened noise run) had no recovery to measure from.
        recovery_unix_ms: (i.opts.outage_length_s > 0 && i.samples.last().is_some_and(|s| s.t >= outage_end))
            .then(|| at_ms(outage_end)),
        closed_unix_ms: &closed_unix_ms,
        sender_rate: i.sender_rate,
        ramp_ms: i.ramp_ms,
        ramp_start: i.ramp_start,
    });
    let mut alerts: Vec<AlertRow> = i
        .observed
        .alerts
        .values()
        .map(|a| AlertRow {
            dedup_key: a.dedup_key.clone(),
            rule: a.rule.clone(),
            severity: format!("{:?}", a.severity()).to_ascii_lowercase(),
            scope: a.scope.clone(),
            summary: a.summary.clone(),
            started_at_unix_ms: a.started_at_unix_ms,
            resolved_at_unix_ms: a.resolved_at_unix_ms,
        })
        .collect();
    alerts.sort_by_key(|a| (a.started_at_unix_ms, a.dedup_key.clone()));
    let waba = waba_check(&i, started_ms);
    let budget = budget_check(&i);
    let mut r = DrillReport {
        requested: i.opts.messages,
        accepted: i.produced.accepted.len(),
        rejected: i.produced.rejected.len(),
        unanswered: i.produced.unanswered.len(),
        sent: count(OperationState::Sent),
        delivered: count(OperationState::Delivered),
        read: count(OperationState::Read),
        failed: count(OperationState::Failed),
        in_dlq: count(OperationState::Dlq),
        quarantined: count(OperationState::Quarantined),
        expired: count(OperationState::Expired),
        unknown: count(OperationState::Unknown),
        queued: count(OperationState::Queued),
        replayed,
        dlq_moves: i.observed.by_result.get("dlq").copied().unwrap_or(0),
        lost: i.accounting.lost_count(),
        in_two_places: i.accounting.in_two_places.len(),
        misplaced: i.accounting.misplaced.len(),
        duplicates_at_meta: duplicates.len(),
        duplicates_flagged_unknown: duplicates
            .iter()
            .filter(|d| d.operation_id.as_deref().is_some_and(|op| flagged.contains(op)))
            .count(),
        time_to_trip_s: first_trip.map(|t| (t - outage_start).max(0.0)),
        trip_latency_max_ms: percentile(&mut trip_latency_us, 1.0),
        trip_latency_p50_ms: percentile(&mut trip_latency_us, 0.50),
        trip_latencies: trips_latency,
        fail_fast_p50_ms: percentile(&mut fail_fast, 0.50),
        fail_fast_p99_ms: percentile(&mut fail_fast, 0.99),
        fail_fast_moved_p50_ms: percentile(&mut fail_fast_moved, 0.50),
        fail_fast_moved_p99_ms: percentile(&mut fail_fast_moved, 0.99),
        time_to_close_s: last_close.map(|t| t - outage_end),
        replay_drain_s,
        replay_rate_per_s: replay_rate,
        replay_rate_fraction: replay_rate.map(|r| r / configured),
        replay_solo_rate_per_s: solo_rate,
        replay_solo_rate_fraction: solo_rate.map(|r| r / configured),
        max_dlq_depth: i.max_dlq,
        unsettled: i.unsettled.clone(),
        breaker_trips: trips.len(),
        senders: i.opts.senders,
        sender_rate: i.sender_rate,
        meta_mps: i.opts.meta_mps,
        meta_requests: i.counters.get("requests").and_then(serde_json::Value::as_u64).unwrap_or(0),
        oracle_accepted: i.oracle.total_accepted(),
        peak_sent_per_s: i.samples.iter().map(|s| s.sent_per_s).fold(0.0, f64::max),
        errors,
        limit_events,
        sim_loop_stalls: stalls.len(),
        sim_longest_stall_ms: stalls.iter().map(|l| field(l, "ms")).max().unwrap_or(0),
        webhooks: i.webhooks,
        per_sender,
        journey,
        alerts,
        chaos: i.chaos,
        marks: i.marks,
        log_scan: i.log_scan,
        header: i.header,
        validation: Vec::new(),
        zone: i.zone,
        waba,
        noise: crate::scoped::noise(i.scenario, bw_breaker::ScopeLimits::default().failure_threshold),
        budget,
        failure_share: crate::scoped::failure_share(&i.observed.calls),
    };
    r.header.observed = format!(
        "{} accepted of {} requested; {} lost; {} unflagged duplicates ({} flagged); {} self-inflicted rate-limit answers ({} injected)",
        r.accepted,
        r.requested,
        r.lost,
        r.duplicates_unflagged(),
        r.duplicates_flagged_unknown,
        r.errors.rate_limit_self_inflicted(),
        r.errors.rate_limit_injected()
    );
    if !r.header.settled {
        r.header.observed.insert_str(0, "did NOT settle before the timeout; ");
    }
    r.validation = validation::rows(&r, i.owners);
    r
}

/// The first WABA restriction of the scenario, measured (see [`crate::scoped`]).
fn waba_check(i: &Inputs<'_>, started_ms: i64) -> Option<crate::scoped::WabaCheck> {
    use crate::scoped::{self, HeldFate};
    let restriction = scoped::restrictions(i.scenario).into_iter().next()?;
    let lifted_s = i.lifts.iter().find(|(_, w)| *w == restriction.waba_id).map(|(t, _)| *t);
    let lifted_unix_ms = lifted_s.map_or(i64::MAX, |t| started_ms + (t * 1000.0) as i64);
    // Per operation, acceptances in all and the first one (an operation may have several oracle entries).
    let mut accepted: BTreeMap<&str, (u32, i64)> = BTreeMap::new();
    for m in &i.oracle.messages {
        let Some(op) = m.operation_id.as_deref() else { continue };
        let e = accepted.entry(op).or_insert((0, i64::MAX));
        *e = (e.0 + m.count, e.1.min(m.first_accepted_ms as i64));
    }
    let expired: HashSet<&str> =
        i.entries.iter().filter(|e| e.state() == OperationState::Expired).map(|e| e.operation_id.as_str()).collect();
    let fate = |op: &str| -> HeldFate {
        if lifted_s.is_none() {
            return HeldFate::Unsent;
        }
        scoped::held_fate(accepted.get(op).copied(), expired.contains(op), lifted_unix_ms)
    };
    let trips = i
        .observed
        .transitions
        .iter()
        .filter(|t| t.1 == BreakerState::Closed && t.2 == BreakerState::Open)
        .map(|t| (t.0, t.3.clone()))
        .collect();
    Some(scoped::waba_check(
        &restriction,
        &scoped::WabaInputs {
            sender_waba: i.sender_waba,
            sent_at: &i.observed.sent_at,
            trips,
            paused_refusals: &i.observed.waba_paused,
            answers: &i.observed.answers,
            held: &i.observed.held_ops,
            fate: &fate,
            lifted_s,
        },
    ))
}

/// The messaging limit's holds judged, when the scenario announces a tier; categories from the ledger, by
/// operation id without its tenant (the feed's form).
fn budget_check(i: &Inputs<'_>) -> Option<crate::budget::BudgetCheck> {
    if !crate::budget::announces_tier(i.scenario) {
        return None;
    }
    let bare = |op: &str| bw_wire::tenancy::split_operation_key(op).1.to_string();
    let categories: BTreeMap<String, bw_proto::v1::Category> =
        i.entries.iter().map(|e| (bare(&e.operation_id), e.category())).collect();
    Some(crate::budget::check(&i.observed.budget_holds, |op| categories.get(&bare(op)).copied()))
}

/// For every CLOSED → OPEN transition, the time from the moment the breaker's failure rule first held over
/// the calls observed since the sender's previous close, to the trip (seconds; 0 when the trip was seen first).
/// The window is replayed as the breaker keeps it: `window_buckets` buckets of the wall clock, the current one
/// included.
fn trip_latencies(observed: &Observed, limits: &bw_breaker::ScopeLimits) -> Vec<(f64, String, f64)> {
    let buckets = i64::from(limits.window_buckets.max(1));
    let bucket_ms = (limits.window_ms as i64 / buckets).max(1);
    let bucket = |t: f64| (observed.started_unix_ms + (t * 1000.0) as i64).div_euclid(bucket_ms);
    let mut out = Vec::new();
    for (i, (at, from, to, phone)) in observed.transitions.iter().enumerate() {
        if *from != BreakerState::Closed || *to != BreakerState::Open {
            continue;
        }
        let since = observed.transitions[..i]
            .iter()
            .filter(|t| &t.3 == phone && t.2 == BreakerState::Closed)
            .map(|t| t.0)
            .fold(0.0, f64::max);
        let Some(calls) = observed.calls.get(phone) else { continue };
        // Outcome events are published after the move that follows the answer, so allow them to arrive a
        // little after the trip they caused.
        let calls: Vec<&(f64, bool)> = calls.iter().filter(|c| c.0 >= since && c.0 <= at + 1.0).collect();
        let mut start = 0;
        let (mut n, mut failed) = (0u64, 0u64);
        for &&(t, failure) in &calls {
            n += 1;
            failed += u64::from(failure);
            let current = bucket(t);
            while bucket(calls[start].0) <= current - buckets {
                n -= 1;
                failed -= u64::from(calls[start].1);
                start += 1;
            }
            // The script's own window rule (the rate and its Wilson bound at failure_z), not the bare rate.
            if bw_breaker::evidence::window_trips(limits, n, failed) {
                out.push((*at, phone.clone(), (at - t).max(0.0)));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(from: f64, count: usize, step: f64, failure: bool) -> Vec<(f64, bool)> {
        (0..count).map(|i| (from + i as f64 * step, failure)).collect()
    }

    #[test]
    fn trip_latency_runs_from_the_first_crossing_since_the_last_close() {
        let limits = bw_breaker::ScopeLimits::default();
        assert_eq!((limits.window_ms, limits.window_buckets, limits.min_calls), (10_000, 10, 50));
        let mut o = Observed::default();
        // Sender a: 60 successes, then failures 10 ms apart from 8.0 s. The window's Wilson bound (z 4.5) reaches
        // 5 % at the 12th failure (12 - 0.05 * 72 >= 4.5 sqrt(0.0475 * 72); 8.11 s); the trip is seen at 8.5 s.
        let mut a = calls(1.0, 60, 0.1, false);
        a.extend(calls(8.0, 20, 0.01, true));
        o.calls.insert("a".into(), a);
        o.transitions.push((8.5, BreakerState::Closed, BreakerState::Open, "a".into()));
        // Sender b: an old failure streak before its last close does not count; after the close it needs its own
        // 50 calls, and the trip is seen before the outcome that crossed (latency 0).
        let mut b = calls(0.0, 50, 0.01, true);
        b.extend(calls(20.0, 50, 0.01, false));
        b.extend(calls(20.6, 20, 0.01, true));
        o.calls.insert("b".into(), b);
        o.transitions.push((5.0, BreakerState::HalfOpen, BreakerState::Closed, "b".into()));
        o.transitions.push((20.62, BreakerState::Closed, BreakerState::Open, "b".into()));
        let got = trip_latencies(&o, &limits);
        assert_eq!(got.len(), 2);
        assert!((got[0].2 - 0.39).abs() < 1e-6, "{got:?}");
        assert_eq!(got[1].2, 0.0);
    }
}
