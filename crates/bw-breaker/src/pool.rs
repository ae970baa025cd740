//! The pooled fast trip: the fast trip's evidence summed over every number sent with one access token
//! (`lua/pool_evidence.lua`, on the token's own hash slot), and the trip of the numbers it names
//! (`lua/pool_trip.lua`, each on its number's slot, the normal CLOSED -> OPEN transition). Why per token and why
//! only the numbers that contributed failures: docs/decisions/pooled-evidence.md. The decision is mirrored in
//! [`crate::evidence::Pool`].

use crate::breaker::{Breaker, app_key, lock, parse_record};
use crate::error::BreakerError;
use crate::evidence::PoolTest;
use crate::scripts;
use crate::types::{OutcomeItem, OutcomeKind, RecordResult, Scope};
use rand::RngExt;

/// What one batch did to its token's pool.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PoolResult {
    /// The pooled evidence after the batch (at the trip, before it is spent).
    pub evidence: f64,
    /// The second test's pooled evidence after the batch ([`crate::evidence::Declared`]).
    pub unavailable_evidence: f64,
    /// The test that made the pool trip with this batch, if any.
    pub tripped: Option<PoolTest>,
    /// The numbers the pool named, each with what its trip did (a number that was not CLOSED stays as it was:
    /// no transition).
    pub trips: Vec<(Scope, RecordResult)>,
}

/// The pool's part of a batch: calls (successes and transient failures, canaries left out: they probe a scope
/// that is not CLOSED), the recipient key of each transient failure, Meta's declared unavailability first, and
/// how many of those there are.
pub(crate) fn pool_batch(outcomes: &[OutcomeItem]) -> (u64, Vec<&str>, usize) {
    let mut calls = 0;
    let (mut declared, mut other) = (Vec::new(), Vec::new());
    for o in outcomes.iter().filter(|o| !o.canary) {
        match o.kind {
            OutcomeKind::Success => calls += 1,
            OutcomeKind::Unavailable => {
                calls += 1;
                declared.push(o.recipient_key.as_str());
            }
            OutcomeKind::Transient => {
                calls += 1;
                other.push(o.recipient_key.as_str());
            }
            _ => {}
        }
    }
    let n = declared.len();
    declared.extend(other);
    (calls, declared, n)
}

impl Breaker {
    /// The pool key of this process's sends: the token's, or the app key's when no token is set.
    fn pool_key(&self) -> String {
        let account = lock(&self.inner.account).clone();
        match &account.token_fp {
            Some(fp) => scripts::token_pool_key(fp),
            None => scripts::app_pool_key(&app_key(&account)),
        }
    }

    /// Feeds a batch of `scope`'s outcomes (the same batch as [`Breaker::record`]) into its token's pooled
    /// evidence, and when the pool trips opens every number it names (its `bw.v1` transition published as any
    /// trip's). One round trip, plus one per named number on a trip. Does nothing when the pooled trip is off
    /// (`pool_trip_evidence` 0), while Redis is unreachable (each number's local fallback decides alone), or for
    /// a batch without successes or transient failures.
    pub async fn record_pooled(&self, scope: &Scope, outcomes: &[OutcomeItem]) -> PoolResult {
        let cfg = &self.inner.cfg;
        let needed = cfg.pool_trip_evidence;
        let (calls, failed, declared) = pool_batch(outcomes);
        if needed <= 0.0 || calls == 0 || self.redis_skipped() {
            return PoolResult::default();
        }
        let mut inv = scripts::POOL_EVIDENCE.prepare_invoke();
        inv.key(self.pool_key()).arg(&self.inner.defaults).arg(needed);
        inv.arg(cfg.pool_unavailable_rate).arg(cfg.pool_unavailable_evidence);
        inv.arg(scope.index_member()).arg(calls).arg(declared);
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
        let mut result =
            PoolResult { evidence: reply.0, unavailable_evidence: reply.1, tripped: reply.2, trips: Vec::new() };
        let reason = match reply.2 {
            Some(PoolTest::Unavailable) => format!(
                "pooled fast trip: Meta declares its service unavailable, evidence {:.1} >= {} over the token's \
                 numbers, this one failing too",
                reply.1, cfg.pool_unavailable_evidence
            ),
            _ => format!(
                "pooled fast trip: evidence {:.1} >= {needed} over the token's numbers, this one failing too",
                reply.0
            ),
        };
        for member in reply.3 {
            let Some(named) = Scope::from_index_member(&member) else { continue };
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
        match self.call("pool_trip", inv).await.and_then(parse_record) {
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

/// (evidence, the second test's evidence, the test that tripped, named members) of `pool_evidence.lua`.
type PoolReply = (f64, f64, Option<PoolTest>, Vec<String>);

fn parse_pool(value: redis::Value) -> Result<PoolReply, BreakerError> {
    let mut reply = scripts::Reply::new(value)?;
    let evidence = reply.float()?;
    let unavailable = reply.float()?;
    let tripped = match reply.int()? {
        1 => Some(PoolTest::Evidence),
        2 => Some(PoolTest::Unavailable),
        _ => None,
    };
    let mut named = Vec::new();
    while reply.remaining() > 0 {
        named.push(reply.string()?);
    }
    Ok((evidence, unavailable, tripped, named))
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
            item("f", OutcomeKind::Unavailable, false),
            item("g", OutcomeKind::Unavailable, true),
        ];
        // Meta's declared unavailability first, whatever the order of the batch.
        assert_eq!(pool_batch(&batch), (3, vec!["f", "b"], 1));
    }
}
