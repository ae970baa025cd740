//! Prometheus metrics of the alerting service (names listed in `deploy/metrics.md`).

use bw_common::admin::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(&'static str, String)>;

/// Every metric the service updates.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    pub fired: Family<Labels, Counter>,
    pub resolved: Family<Labels, Counter>,
    pub escalated: Family<Labels, Counter>,
    pub active: Family<Labels, Gauge>,
    pub notifications: Family<Labels, Counter>,
    pub sink_failures: Family<Labels, Counter>,
    pub sink_retries: Family<Labels, Counter>,
    pub digests: Family<Labels, Counter>,
    pub events: Family<Labels, Counter>,
    pub dlq_depth: Gauge,
    pub dlq_oldest_age: Gauge<f64, AtomicU64>,
    pub dlq_scopes: Gauge,
    pub stream_messages: Family<Labels, Gauge>,
    pub stream_max_messages: Family<Labels, Gauge>,
    pub stream_bytes: Family<Labels, Gauge>,
    pub stream_max_bytes: Family<Labels, Gauge>,
    pub unknown_oldest_age: Gauge<f64, AtomicU64>,
    pub polls: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub(crate) fn register(registry: &MetricsRegistry) -> Metrics {
        let m = Metrics::default();
        if let Ok(mut r) = registry.lock() {
            r.register("bw_alerts_fired", "Alerts fired, by rule and severity", m.fired.clone());
            r.register("bw_alerts_resolved", "Alerts resolved, by rule", m.resolved.clone());
            r.register("bw_alerts_escalated", "Alerts escalated to a higher severity, by rule", m.escalated.clone());
            r.register("bw_alerts_active", "Alerts firing now, by rule (from the shared state)", m.active.clone());
            r.register(
                "bw_alert_notifications",
                "Notifications delivered, by sink and kind (alert, digest)",
                m.notifications.clone(),
            );
            r.register(
                "bw_alert_sink_failures",
                "Notifications a sink did not accept after every retry",
                m.sink_failures.clone(),
            );
            r.register("bw_alert_sink_retries", "Sink delivery retries", m.sink_retries.clone());
            r.register("bw_alert_digests", "Storm digests sent, by rule", m.digests.clone());
            r.register("bw_alert_events", "Events consumed, by kind and result", m.events.clone());
            r.register("bw_dlq_depth", "Messages in BW_DLQ", m.dlq_depth.clone());
            r.register(
                "bw_dlq_oldest_age_seconds",
                "Age of the oldest BW_DLQ message over all scopes",
                m.dlq_oldest_age.clone(),
            );
            r.register("bw_dlq_scopes", "Scopes with at least one BW_DLQ message", m.dlq_scopes.clone());
            r.register("bw_stream_messages", "Messages in a JetStream stream", m.stream_messages.clone());
            r.register(
                "bw_stream_max_messages",
                "Message limit of a JetStream stream (publishes are refused beyond it)",
                m.stream_max_messages.clone(),
            );
            r.register("bw_stream_bytes", "Bytes stored in a JetStream stream", m.stream_bytes.clone());
            r.register(
                "bw_stream_max_bytes",
                "Byte limit of a JetStream stream (publishes are refused beyond it)",
                m.stream_max_bytes.clone(),
            );
            r.register(
                "bw_unknown_oldest_age_seconds",
                "Age of the oldest unknown-outcome message",
                m.unknown_oldest_age.clone(),
            );
            r.register(
                "bw_alert_polls",
                "Periodic checks (stream state, snapshots, reviews) completed",
                m.polls.clone(),
            );
        }
        m
    }
}

/// Label set helper.
pub(crate) fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
}
