//! Admission: [`Breaker::admit`] and its paths (known OPEN, local fallback, Redis).

use crate::breaker::*;
use crate::types::*;
use crate::{metrics, scripts};
use bw_proto::v1::BreakerState;
use rand::RngExt;

impl Breaker {
    /// Admits a batch of sends of one scope in one round trip. Never fails: without Redis it answers from the
    /// local fallback with `degraded = true`.
    pub async fn admit(&self, scope: &Scope, items: &[AdmitItem]) -> Admission {
        self.admit_ordered(scope, items, &[]).await
    }

    /// [`Breaker::admit`] with the per-recipient order gate: `operation_ids[i]` is the operation of `items[i]`
    /// (missing or empty: not gated). An operation registered in its recipient's order set
    /// ([`crate::OrderBook::register`]) behind one still waiting is refused with [`DenyReason::OrderWait`], and
    /// [`Admission::blockers`] names the earliest one. Same single round trip; the local fallback (Redis
    /// unreachable) does not gate.
    ///
    /// A gated batch skips the refusals decided without the script (a scope known to be OPEN, a parent pause):
    /// the gate is read first, so a message behind an earlier one waits for it instead of following it into
    /// the DLQ. It costs the round trip the OPEN cache would have saved; under a parent pause the refusal then
    /// replaces every decision but order_wait. While Redis is unreachable every message gets the local
    /// fallback's answer (a bounded rate): the order sets cannot be read, so order is not kept then.
    pub async fn admit_ordered(&self, scope: &Scope, items: &[AdmitItem], operation_ids: &[String]) -> Admission {
        let gated = operation_ids.iter().any(|op| !op.is_empty());
        if !gated && let Some(admission) = self.admit_known_open(scope, items.len()) {
            return admission;
        }
        let parents = self.parent_check(scope).await;
        if let Some((reason, retry_after_ms)) = parents.block {
            let deny = Decision::Deny { reason, retry_after_ms: retry_after_ms.max(1) };
            let admission = if gated {
                let mut admission = self.admit_uncached(scope, items, operation_ids, parents.ended_ms).await;
                for d in &mut admission.decisions {
                    if !matches!(d, Decision::Deny { reason: DenyReason::OrderWait, .. }) {
                        *d = deny;
                    }
                }
                admission
            } else {
                self.refused_here(scope, vec![deny; items.len()])
            };
            self.count_decisions(&admission);
            return admission;
        }
        let admission = match parents.marketing_block {
            Some((reason, retry_after_ms)) => {
                let deny = Decision::Deny { reason, retry_after_ms: retry_after_ms.max(1) };
                self.admit_without_marketing(scope, items, operation_ids, parents.ended_ms, deny).await
            }
            None => self.admit_uncached(scope, items, operation_ids, parents.ended_ms).await,
        };
        self.count_decisions(&admission);
        admission
    }

    /// An admission decided here without the scope script (a pause above the number refuses every item).
    pub(crate) fn refused_here(&self, scope: &Scope, decisions: Vec<Decision>) -> Admission {
        let (state, incident_id) = self.last_known(scope).unwrap_or((BreakerState::Closed, String::new()));
        Admission {
            decisions,
            state,
            incident_id,
            degraded: false,
            server_now_ms: bw_common::time::now_ms(),
            blockers: Vec::new(),
            slot_gap_ms: 0.0,
        }
    }

    /// Under a marketing-only pause (131063 on the WABA): marketing and marketing replays are refused with
    /// `deny` without taking tokens or slots; the others are admitted as usual.
    pub(crate) async fn admit_without_marketing(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
        deny: Decision,
    ) -> Admission {
        let held = |item: &AdmitItem| matches!(item.class, TrafficClass::Marketing | TrafficClass::Replay);
        let rest: Vec<usize> = (0..items.len()).filter(|&i| !held(&items[i])).collect();
        if rest.is_empty() {
            return self.refused_here(scope, vec![deny; items.len()]);
        }
        let sub_items: Vec<AdmitItem> = rest.iter().map(|&i| items[i].clone()).collect();
        let sub_ops: Vec<String> = rest.iter().map(|&i| operation_ids.get(i).cloned().unwrap_or_default()).collect();
        let sub = self.admit_uncached(scope, &sub_items, &sub_ops, parent_ended_ms).await;
        let mut decisions = vec![deny; items.len()];
        let mut blockers = if sub.blockers.is_empty() { Vec::new() } else { vec![None; items.len()] };
        for (j, &i) in rest.iter().enumerate() {
            if let Some(d) = sub.decisions.get(j) {
                decisions[i] = *d;
            }
            if let Some(b) = sub.blockers.get(j) {
                blockers[i] = b.clone();
            }
        }
        Admission { decisions, blockers, ..sub }
    }

    /// Refuses `n` sends of a scope known to be OPEN, at once and without I/O; None when the scope is not known
    /// to be OPEN (then ask [`Breaker::admit`]). Always None unless [`Breaker::follow_transitions`] was called.
    pub fn admit_known_open(&self, scope: &Scope, n: usize) -> Option<Admission> {
        let admission = self.known_open(scope, n)?;
        metrics::Metrics::inc(&self.inner.metrics.known_open, "op", "admit");
        self.count_decisions(&admission);
        Some(admission)
    }

    pub(crate) fn count_decisions(&self, admission: &Admission) {
        for d in &admission.decisions {
            let label = match d {
                Decision::Allow { canary: false, .. } => "allow",
                Decision::Allow { canary: true, .. } => "canary",
                Decision::Deny { reason, .. } => reason.label(),
            };
            metrics::Metrics::inc(&self.inner.metrics.decisions, "reason", label);
        }
    }

    pub(crate) async fn admit_uncached(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
    ) -> Admission {
        match self.admit_redis(scope, items, operation_ids, parent_ended_ms).await {
            Some(admission) => admission,
            None => {
                metrics::Metrics::inc(&self.inner.metrics.degraded, "op", "admit");
                let last = self.last_known(scope);
                // Without Redis the order sets cannot be read: the fallback's bounded rate applies to every message
                // (sending goes on, slowly), and order is not kept until Redis answers again.
                lock(&self.inner.local).admit(&self.inner.cfg, &scope.index_member(), last, items)
            }
        }
    }

    pub(crate) async fn admit_redis(
        &self,
        scope: &Scope,
        items: &[AdmitItem],
        operation_ids: &[String],
        parent_ended_ms: i64,
    ) -> Option<Admission> {
        if self.redis_skipped() {
            return None;
        }
        let rand: f64 = rand::rng().random();
        let inv = scripts::admit_invocation(scope, &self.inner.defaults, rand, parent_ended_ms, items, operation_ids);
        let parsed = match self.call("admit_send", inv).await {
            Ok(value) => parse_admit(value, items.len()),
            Err(e) => Err(e),
        };
        match parsed {
            Ok((admission, head, transitions)) => {
                self.remember(scope, &head);
                self.register_scope(scope).await;
                self.publish(scope, &head, transitions).await;
                Some(admission)
            }
            Err(e) => {
                self.mark_down("admit", &e);
                None
            }
        }
    }
}
