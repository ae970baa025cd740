//! The pooled fast trip: the fast trip's evidence summed over every number sent with one access token
//! (`lua/pool_evidence.lua`, on the token's own hash slot), and the trip of the numbers it names
//! (`lua/pool_trip.lua`, each on its number's slot, the normal CLOSED -> OPEN transition). Why per token and why
//! only the numbers that contributed failures: docs/decisions/pooled-evidence.md. The decision is mirrored in
//! [`crate::evidence::Pool`].

use crate::{Breaker, OutcomeItem, OutcomeKind, RecordResult, Scope, lock, scripts};
use rand::RngExt;

/// What one batch did to its token's pool.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolResult {
    /// The pooled evidence after the batch (at the trip, before it is spent).
    pub evidence: f64,
    /// True when the batch made the pool trip.
    pub tripped: bool,
    /// The numbers the pool named, each with what its trip did (a number that was not CLOSED stays as it was:
    /// no transition).
    pub trips: Vec<(Scope, RecordResult)>,
}

/// The pool's part of a batch: calls (successes and transient failures, canaries left out: they probe a scope
/// that is not CLOSED) and the recipient key of each transient failure.
pub(crate) fn pool_batch(outcomes: &[OutcomeItem]) -> (u64, Vec<&str>) {
    let mut calls = 0;
    let mut failed = Vec::new();
    for o in outcomes.iter().filter(|o| !o.canary) {
        match o.kind {
            OutcomeKind::Success => calls += 1,
            OutcomeKind::Transient => {
                calls += 1;
                failed.push(o.recipient_key.as_str());
            }
            _ => {}
        }
    }
    (calls, failed)
}

impl Breaker {
    /// The pool key of this process's sends: the token's, or the app key's when no token is set.
    fn pool_key(&self) -> String {
        let account = lock(&self.inner.account).clone();
        match &account.token_fp {
            Some(fp) => scripts::token_pool_key(fp),
            None => scripts::app_pool_key(&crate::app_key(&account)),
        }
    }

    /// Feeds a batch of `scope`'s outcomes (the same batch as [`Breaker::record`]) into its token's pooled
    /// evidence, and when the pool trips opens every number it names (its `bw.v1` transition published as any
    /// trip's). One round trip, plus one per named number on a trip. Does nothing when the pooled trip is off
    /// (`pool_trip_evidence` 0), while Redis is unreachable (each number's local fallback decides alone), or for
    /// a batch without successes or transient failures.
    pub async fn record_pooled(&self, scope: &Scope, outcomes: &[OutcomeItem]) -> PoolResult {
        let needed = self.inner.cfg.pool_trip_evidence;
        let (calls, failed) = pool_batch(outcomes);
        if needed <= 0.0 || calls == 0 || self.redis_skipped() {
            return PoolResult::default();
        }
        let mut inv = scripts::POOL_EVIDENCE.prepare_invoke();
        inv.key(self.pool_key()).arg(&self.inner.defaults).arg(needed).arg(scope.index_member()).arg(calls);
        for key in &failed {
            inv.arg(*key);
        }
        let reply = match self.call("pool_evidence", inv).await.and_then(parse_pool) {
            Ok(reply) => reply,
            Err(e) => {
                // The number's own checks still ran in its record call; the pool misses one batch.
                tracing::debug!(error = %e, "pooled evidence not recorded");
                return PoolResult::default();
            }
        };
        let mut result = PoolResult { evidence: reply.0, tripped: reply.1, trips: Vec::new() };
        for member in reply.2 {
            let Some(named) = Scope::from_index_member(&member) else { continue };
            let reason = format!(
                "pooled fast trip: evidence {:.1} >= {needed} over the token's numbers, this one failing too",
                reply.0
            );
            if let Some(r) = self.pool_trip(&named, &reason).await {
                result.trips.push((named, r));
            }
        }
        result
    }

    /// Opens `scope` through `pool_trip.lua` when it is CLOSED; publishes the transition.
    async fn pool_trip(&self, scope: &Scope, reason: &str) -> Option<RecordResult> {
        let rand: f64 = rand::rng().random();
        let mut inv = scripts::POOL_TRIP.prepare_invoke();
        inv.key(scripts::cfg_key(scope)).key(scripts::state_key(scope));
        inv.arg(&self.inner.defaults).arg(&scope.phone_number_id).arg(rand).arg(reason);
        match self.call("pool_trip", inv).await.and_then(crate::parse_record) {
            Ok((head, raw)) => {
                self.remember(scope, &head);
                let transitions = self.publish(scope, &head, raw).await;
                Some(RecordResult { state: head.state, incident_id: head.incident_id, transitions, degraded: false })
            }
            Err(e) => {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "pooled trip not recorded");
                None
            }
        }
    }
}

/// (evidence, tripped, named members) of `pool_evidence.lua`.
fn parse_pool(value: redis::Value) -> Result<(f64, bool, Vec<String>), crate::BreakerError> {
    let mut reply = scripts::Reply::new(value)?;
    let evidence = reply.float()?;
    let tripped = reply.int()? == 1;
    let mut named = Vec::new();
    while reply.remaining() > 0 {
        named.push(reply.string()?);
    }
    Ok((evidence, tripped, named))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &str, kind: OutcomeKind, canary: bool) -> OutcomeItem {
        OutcomeItem { recipient_key: key.to_string(), kind, canary }
    }

    #[test]
    fn the_pool_counts_successes_and_transient_failures_of_non_canaries() {
        let batch = [
            item("a", OutcomeKind::Success, false),
            item("b", OutcomeKind::Transient, false),
            item("c", OutcomeKind::Transient, true),
            item("d", OutcomeKind::Permanent, false),
            item("e", OutcomeKind::Success, true),
        ];
        assert_eq!(pool_batch(&batch), (2, vec!["b"]));
    }
}
