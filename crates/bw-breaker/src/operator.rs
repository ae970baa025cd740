//! State reads and operator calls: snapshot, status, tick, force, reset, and transition publishing.

use crate::breaker::*;
use crate::error::*;
use crate::types::*;
use crate::{metrics, scripts};
use bw_proto::v1::{self as proto, BreakerState, BreakerTransition};
use prost::Message as _;

impl Breaker {
    /// Reads the current state of a scope (no change). Unlike the send path this fails without Redis.
    pub async fn snapshot(&self, scope: &Scope) -> Result<proto::ScopeSnapshot, BreakerError> {
        Ok(self.status(scope).await?.snapshot)
    }

    /// Like [`Breaker::snapshot`], with live counters.
    pub async fn status(&self, scope: &Scope) -> Result<ScopeStatus, BreakerError> {
        let inv = scripts::scope_invocation(&scripts::READ_SCOPE, scope, &self.inner.defaults);
        let value = self.call("read_scope", inv).await?;
        let (status, _) = parse_status(scope, value)?;
        Ok(status)
    }

    /// Moves an OPEN scope whose cooldown ended to HALF_OPEN (the coordinator ticks known scopes with this)
    /// and returns its state; publishes the transition if one happened.
    pub async fn tick(&self, scope: &Scope) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let inv = scripts::scope_invocation(&scripts::TICK_SCOPE, scope, &self.inner.defaults);
        self.status_call("tick_scope", scope, inv).await
    }

    /// Operator override; publishes the transition.
    pub async fn force(
        &self,
        scope: &Scope,
        forced: Forced,
    ) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let mode = match forced {
            Forced::Open => "open",
            Forced::Closed => "closed",
            Forced::Clear => "clear",
        };
        let mut inv = scripts::scope_invocation(&scripts::FORCE_BREAKER, scope, &self.inner.defaults);
        inv.arg(mode);
        self.status_call("force_breaker", scope, inv).await
    }

    /// Wipes window, counters, pause, incident and override; the scope is CLOSED at full rate.
    pub async fn reset(&self, scope: &Scope) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let mut inv = scripts::scope_invocation(&scripts::FORCE_BREAKER, scope, &self.inner.defaults);
        inv.arg("reset");
        self.status_call("force_breaker", scope, inv).await
    }

    pub(crate) async fn status_call(
        &self,
        script: &'static str,
        scope: &Scope,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<(ScopeStatus, Vec<BreakerTransition>), BreakerError> {
        let value = self.call(script, inv).await?;
        let (status, raw) = parse_status(scope, value)?;
        let head = scripts::Head {
            state: status.snapshot.state(),
            incident_id: status.snapshot.incident_id.clone(),
            open_until_ms: status.snapshot.open_until_unix_ms,
            calls: status.snapshot.calls_in_window,
            failures: status.failures_in_window,
            now_ms: status.snapshot.updated_at_unix_ms,
        };
        self.remember(scope, &head);
        let transitions = self.publish(scope, &head, raw).await;
        Ok((status, transitions))
    }

    /// Turns raw transitions into events and publishes them (core NATS, captured by BW_EVENTS).
    pub(crate) async fn publish(
        &self,
        scope: &Scope,
        head: &scripts::Head,
        raw: Vec<scripts::RawTransition>,
    ) -> Vec<BreakerTransition> {
        let mut out = Vec::with_capacity(raw.len());
        for t in raw {
            let event = BreakerTransition {
                scope: Some(scope.to_proto()),
                from: t.from as i32,
                to: t.to as i32,
                at_unix_ms: t.at_ms,
                incident_id: t.incident_id,
                reason: t.reason,
                failure_rate: failure_rate(head.calls, head.failures),
                calls_in_window: head.calls,
                open_until_unix_ms: if t.to == BreakerState::Open { head.open_until_ms } else { 0 },
            };
            tracing::info!(
                phone_number_id = %scope.phone_number_id,
                from = t.from.as_str_name(),
                to = t.to.as_str_name(),
                incident_id = %event.incident_id,
                reason = %event.reason,
                "breaker transition"
            );
            metrics::Metrics::inc(&self.inner.metrics.transitions, "to", t.to.as_str_name());
            if let Some(nats) = &self.inner.nats {
                let subject = bw_wire::names::breaker_subject(&scope.phone_number_id);
                if let Err(e) = nats.publish(subject, event.encode_to_vec().into()).await {
                    tracing::warn!(error = %e, "cannot publish breaker transition");
                }
            }
            out.push(event);
        }
        out
    }
}
