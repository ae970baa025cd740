//! The drill's report as data: [`DrillReport`] and its parts. A leaf: the computation (`report`) and the
//! renderers (`render`, `html`, `chart`, `validation`) depend on it, never the other way.

use crate::budget::BudgetCheck;
use crate::errors::ErrorSplit;
use crate::journey::Journey;
use crate::scoped::{Noise, WabaCheck};
use bw_meta_sim::WebhookCounters;

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
    pub journey: Journey,
    pub alerts: Vec<AlertRow>,
    pub chaos: Vec<(f64, String)>,
    pub marks: Vec<Mark>,
    pub log_scan: Option<LogScan>,
    pub header: Header,
    pub validation: Vec<Row>,
    /// IANA zone alert times are also shown in.
    pub zone: String,
    /// The "one WABA restricted mid-sale" figures, when the scenario restricts a WABA.
    pub waba: Option<WabaCheck>,
    /// The scenario's sub-threshold noise, when it is one, and the share of calls the breaker counted as
    /// failures over the run.
    pub noise: Option<Noise>,
    pub failure_share: Option<f64>,
    /// The portfolio messaging limit's holds, when the scenario announces a tier.
    pub budget: Option<BudgetCheck>,
}

impl DrillReport {
    /// True when nothing was lost, every duplicate at Meta was a flagged unknown outcome, and no rate-limit
    /// answer was caused by our own sending.
    ///
    /// A scenario's own rows (the WABA restriction's, sub-threshold noise's) must have passed too.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.in_two_places == 0
            && self.duplicates_unflagged() == 0
            && self.errors.rate_limit_self_inflicted() == 0
            && self.validation.iter().filter(|r| r.required).all(|r| r.status == Status::Passed)
    }

    /// Duplicates at Meta that never went through BW_UNKNOWN: a blind resend.
    pub fn duplicates_unflagged(&self) -> usize {
        self.duplicates_at_meta.saturating_sub(self.duplicates_flagged_unknown)
    }
}

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed,
    /// Not measured by this run.
    Pending,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Pending => "pending",
        }
    }
}

/// One row of the matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub key: &'static str,
    pub control: String,
    pub criterion: String,
    pub evidence: String,
    pub status: Status,
    pub owner: String,
    /// The row belongs to this run's scenario (a WABA restriction, sub-threshold noise): PASS needs it passed.
    pub required: bool,
}
