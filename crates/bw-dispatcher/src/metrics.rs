//! Dispatcher metrics (names listed in deploy/metrics.md).

use bw_common::admin::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

type Labels = Vec<(&'static str, String)>;

/// Counters and histograms of the dispatcher.
#[derive(Clone)]
pub(crate) struct Metrics {
    /// Final result of each handled delivery: sent, retry, dlq, quarantined, expired, unknown, rate_limited,
    /// already_handled, undecodable.
    pub results: Family<Labels, Counter>,
    /// Admission decisions by reason (allow, breaker_open, sender_rate...).
    pub decisions: Family<Labels, Counter>,
    /// Meta answers by error code ("200" for success, "transport" for no answer).
    pub meta_responses: Family<Labels, Counter>,
    /// Duration of Meta calls.
    pub meta_seconds: Histogram,
    /// Messages refused for now and waiting in memory for their slot.
    pub held: Gauge,
    /// Deliveries that met another delivery's on-the-wire mark and left without sending.
    pub mark_conflicts: Counter,
    /// Accepted sends whose answer carried no usage header (no quota visibility).
    pub no_usage_headers: Counter,
    /// Order-set members removed because the ledger showed they had ended (a lost release, an operator's purge).
    pub order_healed: Counter,
    /// Admitted sends that reached the wire too late for their send slot and went back to admission.
    pub late_slots: Counter,
    /// Days the configured Graph API version stays usable (negative once ended), by version.
    pub api_version_days_left: Family<Labels, Gauge>,
    /// Messages quarantined under a quarantine scope, by scope key (a template or a code, never a number).
    pub quarantine_held: Family<Labels, Counter>,
    /// The wire journal's appends, group sizes and take-overs (`journal.rs`).
    pub journal: crate::journal::JournalMetrics,
}

impl Metrics {
    pub(crate) fn register(registry: &MetricsRegistry) -> Metrics {
        let m = Metrics {
            results: Family::default(),
            decisions: Family::default(),
            meta_responses: Family::default(),
            meta_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            held: Gauge::default(),
            mark_conflicts: Counter::default(),
            no_usage_headers: Counter::default(),
            order_healed: Counter::default(),
            late_slots: Counter::default(),
            api_version_days_left: Family::default(),
            quarantine_held: Family::default(),
            journal: crate::journal::JournalMetrics {
                group_size: Some(Histogram::new(exponential_buckets(1.0, 2.0, 10))),
                ..Default::default()
            },
        };
        if let Ok(mut r) = registry.lock() {
            r.register("bw_dispatch_results", "Dispatch results by outcome", m.results.clone());
            r.register("bw_admission_decisions", "Admission decisions by reason", m.decisions.clone());
            r.register("bw_meta_responses", "Meta answers by error code", m.meta_responses.clone());
            r.register("bw_meta_request_seconds", "Duration of Meta send calls", m.meta_seconds.clone());
            r.register("bw_dispatch_held_messages", "Messages waiting in memory for an admission slot", m.held.clone());
            r.register(
                "bw_dispatch_mark_conflicts",
                "Deliveries that met another delivery's on-the-wire mark and left without sending",
                m.mark_conflicts.clone(),
            );
            r.register(
                "bw_meta_no_usage_headers",
                "Accepted sends whose answer carried no usage header (no quota visibility)",
                m.no_usage_headers.clone(),
            );
            r.register(
                "bw_order_members_healed",
                "Order-set members removed by a message they blocked because the ledger showed they had ended",
                m.order_healed.clone(),
            );
            r.register(
                "bw_dispatch_late_slots",
                "Admitted sends that reached the wire too late for their send slot and went back to admission",
                m.late_slots.clone(),
            );
            r.register(
                "bw_meta_api_version_days_left",
                "Days the configured Graph API version stays usable; negative once Meta serves it with an older one",
                m.api_version_days_left.clone(),
            );
            r.register(
                "bw_quarantine_held",
                "Messages held in the quarantine by scope (scope: tpl:<waba>:<language>:<name> or code:<code>)",
                m.quarantine_held.clone(),
            );
            r.register(
                "bw_wire_journal_appends",
                "Records appended to the wire journal (each names a group of sends about to go on the wire)",
                m.journal.appends.clone(),
            );
            if let Some(h) = &m.journal.group_size {
                r.register("bw_wire_journal_group_size", "Sends named by one wire-journal record", h.clone());
            }
            r.register(
                "bw_wire_journal_takeovers",
                "Send partitions this dispatcher took over as wire-journal owner",
                m.journal.takeovers.clone(),
            );
        }
        m
    }

    pub(crate) fn result(&self, result: &str) {
        self.results.get_or_create(&vec![("result", result.to_string())]).inc();
    }

    pub(crate) fn decision(&self, reason: &str) {
        self.decisions.get_or_create(&vec![("reason", reason.to_string())]).inc();
    }

    /// Sets `bw_meta_api_version_days_left` now and then hourly until `shutdown`, so the gauge counts down in a
    /// long-running process. A version the table does not know exports nothing (start-up warned about it).
    pub(crate) fn watch_api_version(&self, version: &str, shutdown: tokio_util::sync::CancellationToken) {
        let gauge = self.api_version_days_left.get_or_create(&vec![("version", version.to_string())]).clone();
        let version = version.to_string();
        let set = move || {
            if let Some(days) = bw_common::api_versions::days_left(&version, bw_common::api_versions::today()) {
                gauge.set(days);
            }
        };
        set();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tick.tick() => set(),
                }
            }
        });
    }

    pub(crate) fn quarantine_held(&self, scope: &str, code: i64) {
        let labels = vec![("scope", scope.to_string()), ("code", code.to_string())];
        self.quarantine_held.get_or_create(&labels).inc();
    }

    pub(crate) fn meta_response(&self, code: &str) {
        self.meta_responses.get_or_create(&vec![("code", code.to_string())]).inc();
    }
}
