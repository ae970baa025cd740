//! Prometheus metrics of the coordinator (names in deploy/metrics.md).

use bw_common::admin::MetricsRegistry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

type Labels = Vec<(String, String)>;

#[derive(Clone, Default)]
pub(crate) struct Metrics {
    /// CLOSED/HALF_OPEN → OPEN transitions, by scope (phone_number_id).
    pub trips: Family<Labels, Counter>,
    /// Current state by scope: the proto BreakerState number.
    pub state: Family<Labels, Gauge>,
    /// Tick rounds over every known scope.
    pub ticks: Counter,
    /// Limit reloads by result (ok, error).
    pub reloads: Family<Labels, Counter>,
}

impl Metrics {
    pub(crate) fn register(registry: &MetricsRegistry) -> Metrics {
        let m = Metrics::default();
        if let Ok(mut r) = registry.lock() {
            r.register("bw_breaker_trips", "Breaker trips (to OPEN) by scope", m.trips.clone());
            r.register(
                "bw_breaker_state",
                "Breaker state by scope (1 closed, 2 open, 3 half open, 4 forced open, 5 forced closed)",
                m.state.clone(),
            );
            r.register("bw_breaker_coordinator_ticks", "Tick rounds over every known scope", m.ticks.clone());
            r.register("bw_breaker_limit_reloads", "Limit reloads by result", m.reloads.clone());
        }
        m
    }
}
