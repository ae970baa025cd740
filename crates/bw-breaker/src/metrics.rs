//! Prometheus metrics of the breaker library; callers register them once with [`crate::Breaker::register_metrics`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;

/// Counters shared by every clone of a [`crate::Breaker`].
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    /// Admission decisions by reason (`allow`, `canary`, `breaker_open`, `sender_rate`...).
    pub decisions: Family<Labels, Counter>,
    /// Breaker transitions seen by this process, by target state.
    pub transitions: Family<Labels, Counter>,
    /// Script calls answered locally because Redis was unreachable, by operation.
    pub degraded: Family<Labels, Counter>,
    /// Redis script round trips made, by script.
    pub round_trips: Family<Labels, Counter>,
    /// Admissions refused without a round trip because the scope is known to be OPEN.
    pub known_open: Family<Labels, Counter>,
    /// Per scope: 1 when Meta's last answer carried usage headers, 0 when it carried none (quota blind).
    pub visibility: Family<Labels, Gauge>,
    /// Pauses written by this process, by level (number, waba, app, token) and Meta code.
    pub pauses: Family<Labels, Counter>,
}

impl Metrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "bw_breaker_client_decisions",
            "Admission decisions of the breaker library by reason",
            self.decisions.clone(),
        );
        registry.register(
            "bw_breaker_transitions_seen",
            "Breaker transitions caused by this process, by target state",
            self.transitions.clone(),
        );
        registry.register(
            "bw_breaker_degraded_calls",
            "Breaker calls answered by the local fallback because Redis was unreachable",
            self.degraded.clone(),
        );
        registry.register(
            "bw_breaker_redis_round_trips",
            "Redis script round trips made by the breaker library, by script",
            self.round_trips.clone(),
        );
        registry.register(
            "bw_breaker_known_open_admissions",
            "Admission batches refused without a Redis round trip because the scope is known to be OPEN",
            self.known_open.clone(),
        );
        registry.register(
            "bw_breaker_quota_visibility",
            "1 when Meta's last answer for the scope carried usage headers, 0 when it carried none (conservative \
             limits apply)",
            self.visibility.clone(),
        );
        registry.register(
            "bw_breaker_pauses_recorded",
            "Pauses of a number, WABA, app or token written by this process, by level and Meta code",
            self.pauses.clone(),
        );
    }

    /// Sets the quota visibility gauge of a scope (`waba:phone`; business identifiers, no personal data).
    pub(crate) fn visibility(&self, scope: &str, seen: bool) {
        self.visibility.get_or_create(&vec![("scope".to_string(), scope.to_string())]).set(i64::from(seen));
    }

    pub(crate) fn inc(family: &Family<Labels, Counter>, name: &str, value: &str) {
        family.get_or_create(&vec![(name.to_string(), value.to_string())]).inc();
    }
}
