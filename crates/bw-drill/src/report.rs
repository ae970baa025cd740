//! The drill's final report: figures computed from the accounting check, the ledger, the simulator's oracle
//! and the observed breaker events; printed, and written as JSON, SVG and HTML.

use crate::chart::Sample;
use crate::errors::ErrorSplit;
use crate::producer::Produced;
use crate::validation;
use crate::{DrillOptions, Observed};
use bw_common::proto::{BreakerState, LedgerEntry, OperationState};
use bw_meta_sim::{OracleSnapshot, Scenario, WebhookCounters};
use bw_ops::account::AccountingReport;
use serde_json::json;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

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
    pub owners: &'a BTreeMap<String, String>,
    pub zone: String,
}

/// A vertical mark on the timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// Seconds since the drill's time 0 (the producer's start).
    pub t: f64,
    pub label: String,
    pub kind: MarkKind,
}

/// What a mark stands for (its colour).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkKind {
    Outage,
    Recovery,
    Chaos,
}

impl MarkKind {
    pub fn label(self) -> &'static str {
        match self {
            MarkKind::Outage => "outage",
            MarkKind::Recovery => "recovery",
            MarkKind::Chaos => "chaos",
        }
    }
}

/// One sender's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SenderRow {
    pub sender: String,
    /// Messages the simulator accepted for this sender (oracle).
    pub accepted_by_meta: u64,
    pub sent: u64,
    pub dlq_moves: u64,
    pub rate_limited: u64,
    pub error_answers: u64,
    pub trips: usize,
    pub final_breaker: String,
}

/// An alert as last seen on `bw.alert.v1.*`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlertRow {
    pub dedup_key: String,
    pub rule: String,
    pub severity: String,
    pub scope: String,
    pub summary: String,
    pub started_at_unix_ms: i64,
    /// 0 while firing.
    pub resolved_at_unix_ms: i64,
}

/// What the scan of the service logs for personal data and secrets found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogScan {
    pub files: usize,
    pub bytes: u64,
    pub findings: usize,
}

/// The report's header.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    pub environment: String,
    pub version: String,
    pub started_utc: String,
    pub started_unix_ms: i64,
    pub load: String,
    pub duration_s: f64,
    pub scenario: String,
    pub expected: String,
    pub observed: String,
    /// False when the settle timeout ended the run with work still queued, a breaker open or an alert firing.
    pub settled: bool,
}

/// The drill's outcome.
#[derive(Debug, Clone, Default)]
pub struct DrillReport {
    pub requested: usize,
    pub accepted: usize,
    pub rejected: usize,
    pub unanswered: usize,
    pub sent: u64,
    pub delivered: u64,
    pub read: u64,
    pub failed: u64,
    pub in_dlq: u64,
    pub quarantined: u64,
    pub expired: u64,
    pub unknown: u64,
    pub queued: u64,
    /// Operations that went through the DLQ at least once and were replayed.
    pub replayed: u64,
    /// Moves into the DLQ observed (an operation can be dead-lettered more than once).
    pub dlq_moves: u64,
    pub lost: usize,
    pub in_two_places: usize,
    pub misplaced: usize,
    /// Operations Meta accepted more than once.
    pub duplicates_at_meta: usize,
    /// Of those, how many had an unknown outcome at some point (flagged, expected).
    pub duplicates_flagged_unknown: usize,
    pub time_to_trip_s: Option<f64>,
    /// Per trip, time from the window's error rate crossing the threshold (as replayed from the observed
    /// outcomes) to the trip: the worst and the median, ms.
    pub trip_latency_max_ms: Option<f64>,
    pub trip_latency_p50_ms: Option<f64>,
    /// (seconds since start, sender, latency in seconds) per trip.
    pub trip_latencies: Vec<(f64, String, f64)>,
    pub fail_fast_p50_ms: Option<f64>,
    pub fail_fast_p99_ms: Option<f64>,
    /// Including the durable move to the DLQ.
    pub fail_fast_moved_p50_ms: Option<f64>,
    pub fail_fast_moved_p99_ms: Option<f64>,
    pub time_to_close_s: Option<f64>,
    pub replay_drain_s: Option<f64>,
    /// Replayed operations per second over the drain, as a fraction of the senders' configured rate.
    pub replay_rate_per_s: Option<f64>,
    pub replay_rate_fraction: Option<f64>,
    /// Replay rate once live traffic had ended (replay had the senders to itself), and its fraction of the
    /// senders' configured rate.
    pub replay_solo_rate_per_s: Option<f64>,
    pub replay_solo_rate_fraction: Option<f64>,
    pub max_dlq_depth: u64,
    /// What held a run that did not settle, one finding per line ([`crate::stuck`]).
    pub unsettled: Vec<String>,
    pub breaker_trips: usize,
    pub senders: usize,
    pub sender_rate: f64,
    pub meta_mps: f64,
    /// Requests the simulator answered, and messages it accepted (oracle).
    pub meta_requests: u64,
    pub oracle_accepted: u64,
    pub peak_sent_per_s: f64,
    /// Every error answer by code, injected or self-inflicted.
    pub errors: ErrorSplit,
    /// The simulator's limit-caused answers: (seconds since start, sender, code, the simulator's longest
    /// event-loop stall in the second before, ms).
    pub limit_events: Vec<(f64, String, String, u64)>,
    /// Stalls of the simulator's event loop of at least 50 ms, and the longest, ms.
    pub sim_loop_stalls: usize,
    pub sim_longest_stall_ms: u64,
    pub webhooks: WebhookCounters,
    pub per_sender: Vec<SenderRow>,
    /// Per-category delays, recovery of dead-lettered messages, order violations (`journey`).
    pub journey: crate::journey::Journey,
    pub alerts: Vec<AlertRow>,
    pub chaos: Vec<(f64, String)>,
    pub marks: Vec<Mark>,
    pub log_scan: Option<LogScan>,
    pub header: Header,
    pub validation: Vec<validation::Row>,
    /// IANA zone alert times are also shown in.
    pub zone: String,
}

impl DrillReport {
    /// True when nothing was lost, every duplicate at Meta was a flagged unknown outcome, and no rate-limit
    /// answer was caused by our own sending.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.in_two_places == 0
            && self.duplicates_unflagged() == 0
            && self.errors.rate_limit_self_inflicted() == 0
    }

    /// Duplicates at Meta that never went through BW_UNKNOWN: a blind resend.
    pub fn duplicates_unflagged(&self) -> usize {
        self.duplicates_at_meta.saturating_sub(self.duplicates_flagged_unknown)
    }
}

/// The `p` quantile (0..1, nearest rank) of millisecond values, in seconds; None for no values.
pub(crate) fn percentile(values: &mut [u64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let idx = ((values.len() as f64 - 1.0) * p).round() as usize;
    Some(values[idx] as f64 / 1000.0)
}

/// Seconds with one decimal, or `missing`.
pub(crate) fn secs_or(v: Option<f64>, missing: &str) -> String {
    v.map(|v| format!("{v:.1} s")).unwrap_or_else(|| missing.to_string())
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
        recovery_unix_ms: (i.opts.outage_length_s > 0).then(|| at_ms(outage_end)),
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

fn pct(v: Option<f64>) -> String {
    v.map(|f| format!("{:.0}%", f * 100.0)).unwrap_or_else(|| "n/a".into())
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map(|v| format!("{v:.2} {unit}")).unwrap_or_else(|| "n/a".into())
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
    s.push_str(&crate::journey::text(&r.journey));
    for (t, label) in &r.chaos {
        s.push_str(&format!("chaos at {t:.1} s: {label}\n"));
    }
    let pending = r.validation.iter().filter(|v| v.status == validation::Status::Pending).count();
    let failed: Vec<&str> =
        r.validation.iter().filter(|v| v.status == validation::Status::Failed).map(|v| v.key).collect();
    s.push_str(&format!(
        "validation matrix: {} passed, {} failed{}, {pending} pending (validation.md)\n",
        r.validation.iter().filter(|v| v.status == validation::Status::Passed).count(),
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(" ({})", failed.join(", ")) }
    ));
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
pub(crate) fn to_json(r: &DrillReport, samples: &[Sample], observed: &Observed) -> serde_json::Value {
    let zone = bw_alerting::parse_zone(&r.zone).ok();
    let times = |ms: i64| {
        if ms <= 0 {
            return serde_json::Value::Null;
        }
        json!({
            "unix_ms": ms,
            "utc": bw_alerting::format_utc(ms),
            "local": zone.map(|z| bw_alerting::format_local(ms, z)),
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
            "status": v.status.label(), "owner": v.owner,
        })).collect::<Vec<_>>(),
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

/// Writes `report.json`, `timeline.svg`, `report.html` and `validation.md` to `dir`.
pub(crate) fn write(dir: &Path, r: &DrillReport, samples: &[Sample], observed: &Observed) -> anyhow::Result<()> {
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&to_json(r, samples, observed))?)?;
    let svg = crate::chart::render(samples, &r.marks, "Breakwater drill: throughput, errors, breakers, DLQ");
    std::fs::write(dir.join("timeline.svg"), &svg)?;
    std::fs::write(dir.join("report.html"), crate::html::page(r, &svg))?;
    std::fs::write(dir.join("validation.md"), validation::markdown(r, &r.validation))?;
    Ok(())
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
