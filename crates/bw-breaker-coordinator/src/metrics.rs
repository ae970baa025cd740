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
    /// 1 while this instance holds the leader lease.
    pub leader: Gauge,
    /// Times this instance took the leader lease.
    pub leader_changes: Counter,
    /// State-changing admin requests refused, by reason (disabled, missing, malformed, invalid).
    pub admin_refusals: Family<Labels, Counter>,
    /// Authorised operator actions, by action.
    pub operator_actions: Family<Labels, Counter>,
    /// Times the leader found Redis without its epoch while BW_SCOPES had snapshots (Redis lost its data, or
    /// the first start of a coordinator that keeps one).
    pub redis_epoch_missing: Counter,
    /// FORCED_OPEN overrides re-applied after Redis lost them.
    pub overrides_restored: Counter,
    /// Pauses in force over the known scopes, by level (number, waba, app, token), Meta code and lift.
    pub pauses: Family<Labels, Gauge>,
    /// Meta's account signals handled, by result (applied, ignored, retry, undecodable).
    pub account_signals: Family<Labels, Counter>,
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
            r.register(
                "bw_breaker_coordinator_leader",
                "1 while this instance holds the coordinator leader lease",
                m.leader.clone(),
            );
            r.register(
                "bw_breaker_coordinator_leader_acquired",
                "Times this instance took the coordinator leader lease",
                m.leader_changes.clone(),
            );
            r.register(
                "bw_breaker_coordinator_admin_refusals",
                "State-changing admin requests refused, by reason",
                m.admin_refusals.clone(),
            );
            r.register(
                "bw_breaker_coordinator_redis_epoch_missing",
                "Times the leader found Redis without its epoch key while BW_SCOPES had snapshots",
                m.redis_epoch_missing.clone(),
            );
            r.register(
                "bw_breaker_coordinator_overrides_restored",
                "FORCED_OPEN overrides re-applied after Redis lost them",
                m.overrides_restored.clone(),
            );
            r.register(
                "bw_breaker_pauses",
                "Pauses in force over the known scopes, by level (number, waba, app, token), Meta code and lift",
                m.pauses.clone(),
            );
            r.register(
                "bw_breaker_coordinator_account_signals",
                "Meta's account signals handled, by result (applied, ignored, retry, undecodable)",
                m.account_signals.clone(),
            );
            r.register(
                "bw_breaker_coordinator_operator_actions",
                "Authorised operator actions, by action",
                m.operator_actions.clone(),
            );
        }
        m
    }
}
