//! Replay metrics: DLQ depth and oldest age per scope, replay rate, skips by reason, poison count.

use bw_common::admin::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

type Labels = Vec<(String, String)>;

/// Handles to every replay metric. Cheap to clone.
#[derive(Clone, Default)]
pub struct Metrics {
    pub dlq_depth: Family<Labels, Gauge>,
    pub dlq_oldest_age_seconds: Family<Labels, Gauge>,
    pub replayed: Family<Labels, Counter>,
    pub skipped: Family<Labels, Counter>,
    pub poison: Counter,
    pub draining_scopes: Gauge,
    /// Incidents whose replay this instance saw finish (it published the "replayed" event).
    pub incidents_finished: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &MetricsRegistry) -> Metrics {
        let m = Metrics::default();
        if let Ok(mut r) = registry.lock() {
            r.register("bw_replay_dlq_depth", "DLQ entries waiting per scope", m.dlq_depth.clone());
            r.register(
                "bw_replay_dlq_oldest_age_seconds",
                "Age of the oldest DLQ entry per scope",
                m.dlq_oldest_age_seconds.clone(),
            );
            r.register("bw_replay_replayed", "DLQ entries moved to the replay lane", m.replayed.clone());
            r.register("bw_replay_skipped", "DLQ entries not replayed, by reason", m.skipped.clone());
            r.register("bw_replay_poison", "Entries quarantined as poison after the last replay", m.poison.clone());
            r.register("bw_replay_draining_scopes", "Scopes this instance is draining now", m.draining_scopes.clone());
            r.register(
                "bw_replay_incidents_finished",
                "Incidents whose replay finished here (replayed event published)",
                m.incidents_finished.clone(),
            );
        }
        m
    }

    pub fn replayed(&self, scope: &str) {
        self.replayed.get_or_create(&vec![("scope".into(), scope.into())]).inc();
    }

    pub fn skipped(&self, reason: &str) {
        self.skipped.get_or_create(&vec![("reason".into(), reason.into())]).inc();
    }

    pub fn set_depth(&self, scope: &str, depth: u64, oldest_age_s: i64) {
        let labels = vec![("scope".to_string(), scope.to_string())];
        self.dlq_depth.get_or_create(&labels).set(depth as i64);
        self.dlq_oldest_age_seconds.get_or_create(&labels).set(oldest_age_s);
    }
}
