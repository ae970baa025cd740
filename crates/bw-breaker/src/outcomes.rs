//! Outcomes and usage: [`Breaker::record`], usage observations and late claims.

use crate::breaker::*;
use crate::types::*;
use crate::{metrics, scripts};
use bw_proto::v1::{self as proto};
use prost::Message as _;
use rand::RngExt;
use std::time::Duration;

impl Breaker {
    /// Records a batch of outcomes of one scope in one round trip; returns the state and the transitions.
    /// Never fails: without Redis the outcomes feed the local fallback breaker.
    pub async fn record(&self, scope: &Scope, outcomes: &[OutcomeItem]) -> RecordResult {
        self.record_releasing(scope, outcomes, &[]).await
    }

    /// [`Breaker::record`], and in the same round trip removes `releases` from their recipients' order sets
    /// (operations Meta accepted or that ended for good, see `lua/order_register.lua`). Without Redis the
    /// releases are lost; the dispatcher a lost release blocks heals it from the ledger.
    pub async fn record_releasing(
        &self,
        scope: &Scope,
        outcomes: &[OutcomeItem],
        releases: &[OrderRelease],
    ) -> RecordResult {
        self.record_pauses(scope, outcomes).await;
        if !self.redis_skipped() {
            let rand: f64 = rand::rng().random();
            let inv = scripts::record_invocation(scope, &self.inner.defaults, rand, outcomes, releases);
            let parsed = match self.call("record_outcomes", inv).await {
                Ok(value) => parse_record(value),
                Err(e) => Err(e),
            };
            match parsed {
                Ok((head, raw)) => {
                    self.remember(scope, &head);
                    self.register_scope(scope).await;
                    let transitions = self.publish(scope, &head, raw).await;
                    return RecordResult {
                        state: head.state,
                        incident_id: head.incident_id,
                        transitions,
                        degraded: false,
                    };
                }
                Err(e) => self.mark_down("record", &e),
            }
        }
        metrics::Metrics::inc(&self.inner.metrics.degraded, "op", "record");
        let last = self.last_known(scope);
        let (state, incident_id) =
            lock(&self.inner.local).record(&self.inner.cfg, &scope.index_member(), last, outcomes);
        RecordResult { state, incident_id, transitions: Vec::new(), degraded: true }
    }

    /// Feeds the Meta usage percent (X-Business-Use-Case-Usage). Sent to Redis only when the throttle band
    /// changes or the last report is getting old, so it costs almost no round trips. The scripts fade a
    /// reading over `usage_ttl_ms` (Meta's hourly window), so a reading in a throttling band is refreshed every
    /// twentieth of it (it fades by at most 5 % before the next one), a calm reading every third.
    pub async fn observe_usage(&self, scope: &Scope, usage_percent: u32) {
        let limits = &self.inner.cfg.defaults;
        let band: i8 = if usage_percent >= limits.throttle_pause_percent {
            2
        } else if usage_percent >= limits.throttle_slow_percent {
            1
        } else {
            0
        };
        let refresh = Duration::from_millis(if band > 0 { limits.usage_ttl_ms / 20 } else { limits.usage_ttl_ms / 3 });
        self.inner.metrics.visibility(&scope.index_member(), true);
        if self.send_usage(scope, band, refresh, usage_percent.to_string()).await {
            self.publish_quota(scope, usage_percent).await;
        }
    }

    /// Publishes the `quota` signal alerting's QuotaUsage rule consumes (fires at 80 %, critical at 90 %,
    /// resolves below): as often as the reading goes to Redis, i.e. when its band changes or it is refreshed,
    /// never per send.
    pub(crate) async fn publish_quota(&self, scope: &Scope, usage_percent: u32) {
        let Some(nats) = &self.inner.nats else { return };
        let signal = proto::Signal {
            kind: "quota".into(),
            waba_id: scope.waba_id.clone(),
            phone_number_id: scope.phone_number_id.clone(),
            meta_code: 0,
            detail: format!("usage {usage_percent}% of Meta's business use case quota (X-Business-Use-Case-Usage)"),
            at_unix_ms: bw_common::time::now_ms(),
            operation_id: String::new(),
        };
        if let Err(e) = nats.publish(bw_wire::names::signal_subject("quota"), signal.encode_to_vec().into()).await {
            tracing::debug!(error = %e, "quota signal not published");
        }
    }

    /// Meta answered a send of the scope without usage headers: the scope is quota blind (metric
    /// `bw_breaker_quota_visibility` = 0) and admission applies `blind_rate_factor` to its rate until an answer
    /// carries them again. Costs a round trip only when the visibility changes (or every 30 s).
    pub async fn observe_no_usage(&self, scope: &Scope) {
        self.inner.metrics.visibility(&scope.index_member(), false);
        self.send_usage(scope, -1, Duration::from_secs(30), "none".to_string()).await;
    }

    /// Claims one late send from the sender's fleet-wide late allowance (`claim_late.lua`): a token bucket in
    /// the scope's state hash, shared by every dispatcher process, holding at most `burst` late sends (or what
    /// one ms refills, if more: Redis time is whole ms) and refilled by one per `refill_ms`. `Some(true)` when
    /// this late send may go now, `Some(false)` when it may not; `None` when Redis did not answer (the caller then
    /// falls back to an allowance of its own process).
    /// Costs a round trip per late send, none on time.
    pub async fn claim_late(&self, scope: &Scope, refill_ms: f64, burst: f64) -> Option<bool> {
        self.claim_late_many(scope, refill_ms, burst, 1).await.map(|granted| granted == 1)
    }

    /// Claims `wanted` late sends at once from the same allowance as [`Breaker::claim_late`], in one round trip:
    /// how many of them may go now (0 to `wanted`), or `None` when Redis did not answer.
    pub async fn claim_late_many(&self, scope: &Scope, refill_ms: f64, burst: f64, wanted: u32) -> Option<u32> {
        if self.redis_skipped() {
            return None;
        }
        let wanted = wanted.max(1);
        let mut inv = scripts::CLAIM_LATE.prepare_invoke();
        inv.key(scripts::cfg_key(scope))
            .key(scripts::state_key(scope))
            .arg(format!("{refill_ms:.6}"))
            .arg(burst)
            .arg(wanted);
        match self.call("claim_late", inv).await {
            Ok(redis::Value::Int(granted)) if (0..=i64::from(wanted)).contains(&granted) => Some(granted as u32),
            Ok(other) => {
                tracing::warn!(reply = ?other, "claim_late answered an unexpected reply");
                None
            }
            // Not a sign that Redis is down: at a high rate on a loaded machine many late claims queue on the
            // connection at once and one passes the command timeout. Marking Redis down for that sent every
            // admission to the local fallback (5 msg/s per scope) for a second and the pipeline bench from about
            // 1,000 msg/s to 20-65 msg/s. The caller uses its own process's allowance for this claim; admission
            // decides whether Redis is down.
            Err(e) => {
                tracing::debug!(error = %e, "late claim unanswered; this process's own allowance decides");
                None
            }
        }
    }

    /// Sends a usage reading to Redis unless the same band went there within `refresh`; true when sent.
    ///
    /// The reading is claimed before its call goes out, so the answers that arrive while it is on its way do not
    /// send it again: at a dispatcher's start (or when the band changes) thousands of answers come back within
    /// the first round trip, and each used to send the same reading. They queued past the command timeout, which
    /// took Redis for down and sent every admission to the local fallback (5 msg/s per scope) for a second at a
    /// time: the pipeline bench lost about half its throughput to it. A failed call gives the claim back.
    pub(crate) async fn send_usage(&self, scope: &Scope, band: i8, refresh: Duration, arg: String) -> bool {
        let key = scope.index_member();
        let previous = {
            let mut sent = lock(&self.inner.usage_sent);
            if let Some((last_band, at)) = sent.get(&key)
                && *last_band == band
                && at.elapsed() < refresh
            {
                return false;
            }
            if self.redis_skipped() {
                return false;
            }
            sent.insert(key.clone(), (band, tokio::time::Instant::now()))
        };
        let mut inv = scripts::OBSERVE_USAGE.prepare_invoke();
        inv.key(scripts::cfg_key(scope)).key(scripts::state_key(scope)).arg(arg);
        match self.call("observe_usage", inv).await {
            Ok(_) => true,
            Err(e) => {
                let mut sent = lock(&self.inner.usage_sent);
                match previous {
                    Some(p) => sent.insert(key, p),
                    None => sent.remove(&key),
                };
                drop(sent);
                self.mark_down("observe_usage", &e);
                false
            }
        }
    }
}
