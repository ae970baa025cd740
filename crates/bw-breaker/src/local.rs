//! The local conservative fallback used while Redis is unreachable.
//!
//! Per scope and per process: a token bucket at `fallback_rate_per_s` (a fraction of the fleet rate, so N
//! instances together stay under Meta's limit), a failure-rate breaker over a 10 x 1 s window, a pair limiter
//! with burst 1, and no replay at all. A scope Redis last reported OPEN starts OPEN here. Nothing of this is
//! written back to Redis; when Redis answers again its state is authoritative.

use crate::config::BreakerConfig;
use crate::types::AdmitItem;
use crate::types::{Admission, Decision, DenyReason, OutcomeItem, OutcomeKind, TrafficClass};
use bw_proto::v1::BreakerState;
use std::collections::HashMap;
use tokio::time::{Duration, Instant};

const WINDOW_BUCKETS: usize = 10;
const MAX_PAIRS: usize = 10_000;
const CANARIES_PER_S: u32 = 1;
const CLOSE_AFTER: u32 = 3;

struct LocalScope {
    state: BreakerState,
    open_until: Instant,
    tokens: f64,
    refilled_at: Instant,
    /// Ring of (second, calls, failures).
    window: [(u64, u32, u32); WINDOW_BUCKETS],
    pairs: HashMap<String, Instant>,
    canary_second: u64,
    canaries: u32,
    successes: u32,
    paused_until: Instant,
    incident_id: String,
    /// Next send slot of this process (sends are spaced at the fallback rate).
    next_slot: Instant,
}

pub(crate) struct LocalBreakers {
    epoch: Instant,
    scopes: HashMap<String, LocalScope>,
}

impl LocalBreakers {
    pub(crate) fn new() -> LocalBreakers {
        LocalBreakers { epoch: Instant::now(), scopes: HashMap::new() }
    }

    fn scope<'a>(
        &'a mut self,
        cfg: &BreakerConfig,
        key: &str,
        last_known: Option<(BreakerState, String)>,
        now: Instant,
    ) -> &'a mut LocalScope {
        self.scopes.entry(key.to_string()).or_insert_with(|| {
            let (state, incident_id) = match last_known {
                Some((BreakerState::Open | BreakerState::ForcedOpen | BreakerState::HalfOpen, incident)) => {
                    (BreakerState::Open, incident)
                }
                _ => (BreakerState::Closed, String::new()),
            };
            LocalScope {
                state,
                open_until: now + Duration::from_millis(cfg.fallback_cooldown_ms),
                tokens: cfg.fallback_burst,
                refilled_at: now,
                window: [(0, 0, 0); WINDOW_BUCKETS],
                pairs: HashMap::new(),
                canary_second: 0,
                canaries: 0,
                successes: 0,
                paused_until: now,
                incident_id,
                next_slot: now,
            }
        })
    }

    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs() + 1
    }

    /// Admits a batch locally; the answer is marked degraded.
    pub(crate) fn admit(
        &mut self,
        cfg: &BreakerConfig,
        key: &str,
        last_known: Option<(BreakerState, String)>,
        items: &[AdmitItem],
    ) -> Admission {
        let second = self.second();
        let now = Instant::now();
        let pair_interval = Duration::from_millis(cfg.defaults.pair_interval_ms);
        let s = self.scope(cfg, key, last_known, now);
        if s.state == BreakerState::Open && now >= s.open_until {
            s.state = BreakerState::HalfOpen;
            s.successes = 0;
        }
        let elapsed = now.saturating_duration_since(s.refilled_at).as_secs_f64();
        s.tokens = (s.tokens + elapsed * cfg.fallback_rate_per_s).min(cfg.fallback_burst);
        s.refilled_at = now;
        if s.canary_second != second {
            s.canary_second = second;
            s.canaries = 0;
        }
        if s.pairs.len() > MAX_PAIRS {
            s.pairs.retain(|_, until| *until > now);
        }
        let reserve = cfg.fallback_burst * cfg.defaults.reserve_fraction;
        // Refusals for want of tokens queue up: the n-th is told to wait for n more tokens (as the script does),
        // but at most until Redis is tried again: Redis, not this queue at 5 msg/s (51 s for the last of a batch
        // of 256), decides about them then. The queue's waits stranded a dispatcher's whole in-flight window for
        // up to a minute after Redis answered again (a burst of calls that queued past the command timeout: the
        // pipeline bench went from about 1,000 msg/s to 20-65 msg/s). While Redis stays down this bucket still
        // bounds the rate; the refused messages are only asked about again, every redis_retry_after_ms.
        let retry = |need: f64, have: f64| {
            (((need - have).max(0.0) * 1000.0 / cfg.fallback_rate_per_s).ceil() as u64)
                .min(cfg.redis_retry_after_ms.max(1))
        };
        let mut queued = 0.0;
        let decisions = items
            .iter()
            .map(|item| {
                let deny = |reason, retry_after_ms| Decision::Deny { reason, retry_after_ms };
                if s.paused_until > now {
                    return deny(DenyReason::Paused, (s.paused_until - now).as_millis() as u64);
                }
                if s.state == BreakerState::Open {
                    return deny(
                        DenyReason::BreakerOpen,
                        (s.open_until.saturating_duration_since(now)).as_millis() as u64,
                    );
                }
                if item.class == TrafficClass::Replay {
                    return deny(DenyReason::Degraded, cfg.fallback_replay_retry_ms);
                }
                if s.state == BreakerState::HalfOpen && s.canaries >= CANARIES_PER_S {
                    return deny(DenyReason::CanaryBudget, 1000);
                }
                if let Some(until) = s.pairs.get(&item.recipient_key)
                    && *until > now
                {
                    return deny(DenyReason::PairRate, (*until - now).as_millis() as u64);
                }
                let need = if item.class.is_priority() { 1.0 } else { reserve + 1.0 };
                if s.tokens < need {
                    let reason = if s.tokens >= 1.0 { DenyReason::Reserve } else { DenyReason::SenderRate };
                    queued += 1.0;
                    return deny(reason, retry(need + queued - 1.0, s.tokens));
                }
                s.tokens -= 1.0;
                s.pairs.insert(item.recipient_key.clone(), now + pair_interval);
                let slot = s.next_slot.max(now);
                s.next_slot = slot + Duration::from_secs_f64(1.0 / cfg.fallback_rate_per_s.max(0.001));
                let wait_ms = (slot - now).as_millis() as u64;
                let canary = s.state == BreakerState::HalfOpen;
                if canary {
                    s.canaries += 1;
                }
                Decision::Allow { canary, wait_ms }
            })
            .collect();
        Admission {
            decisions,
            state: s.state,
            incident_id: s.incident_id.clone(),
            degraded: true,
            server_now_ms: bw_common::time::now_ms(),
            blockers: Vec::new(),
            slot_gap_ms: 1000.0 / cfg.fallback_rate_per_s.max(0.001),
        }
    }

    /// Records outcomes locally; returns the local state and incident after them.
    pub(crate) fn record(
        &mut self,
        cfg: &BreakerConfig,
        key: &str,
        last_known: Option<(BreakerState, String)>,
        outcomes: &[OutcomeItem],
    ) -> (BreakerState, String) {
        let second = self.second();
        let now = Instant::now();
        let s = self.scope(cfg, key, last_known, now);
        for outcome in outcomes {
            let slot = (second as usize) % WINDOW_BUCKETS;
            if s.window[slot].0 != second {
                s.window[slot] = (second, 0, 0);
            }
            match outcome.kind {
                OutcomeKind::Success => {
                    s.window[slot].1 += 1;
                    if s.state == BreakerState::HalfOpen && outcome.canary {
                        s.successes += 1;
                        if s.successes >= CLOSE_AFTER {
                            s.state = BreakerState::Closed;
                            s.incident_id.clear();
                            s.window = [(0, 0, 0); WINDOW_BUCKETS];
                        }
                    }
                }
                OutcomeKind::Transient | OutcomeKind::Unavailable => {
                    s.window[slot].1 += 1;
                    s.window[slot].2 += 1;
                    let (calls, fails) = s
                        .window
                        .iter()
                        .filter(|(sec, _, _)| *sec + WINDOW_BUCKETS as u64 > second)
                        .fold((0u32, 0u32), |(c, f), (_, bc, bf)| (c + bc, f + bf));
                    let trip = match s.state {
                        BreakerState::HalfOpen => true,
                        BreakerState::Closed => {
                            calls >= cfg.fallback_min_calls
                                && f64::from(fails) >= f64::from(calls) * cfg.fallback_failure_threshold
                        }
                        _ => false,
                    };
                    if trip {
                        s.state = BreakerState::Open;
                        s.open_until = now + Duration::from_millis(cfg.fallback_cooldown_ms);
                        if s.incident_id.is_empty() {
                            s.incident_id = format!("{key}-local-{}", bw_common::time::now_ms());
                        }
                    }
                }
                OutcomeKind::RateLimited { scope: bw_common::classify::RateScope::Pair, pause_ms } => {
                    s.pairs.insert(outcome.recipient_key.clone(), now + Duration::from_millis(pause_ms));
                }
                OutcomeKind::RateLimited {
                    scope: bw_common::classify::RateScope::Recipient | bw_common::classify::RateScope::Flow,
                    ..
                } => {}
                OutcomeKind::RateLimited { pause_ms, .. } => {
                    s.paused_until = s.paused_until.max(now + Duration::from_millis(pause_ms));
                }
                // Redis holds the pause keys; without it the number alone pauses here, whatever the scope.
                OutcomeKind::Pause(spec) => {
                    let ms = match spec.end {
                        crate::types::PauseEnd::For(ms) | crate::types::PauseEnd::Probe(ms) => ms,
                        crate::types::PauseEnd::Lifted => cfg.token_halt_retry_ms,
                    };
                    s.paused_until = s.paused_until.max(now + Duration::from_millis(ms));
                }
                OutcomeKind::Permanent => {}
            }
        }
        (s.state, s.incident_id.clone())
    }

    /// Forgets the local state of a scope (Redis answered and is authoritative again).
    pub(crate) fn forget(&mut self, key: &str) {
        self.scopes.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(class: TrafficClass) -> AdmitItem {
        AdmitItem { recipient_key: format!("r{}", rand::random::<u32>()), class }
    }

    fn outcome(kind: OutcomeKind, canary: bool) -> OutcomeItem {
        OutcomeItem { recipient_key: "r".into(), kind, canary }
    }

    #[tokio::test(start_paused = true)]
    async fn local_breaker_opens_cools_down_probes_and_closes() {
        let cfg = BreakerConfig::default();
        let mut local = LocalBreakers::new();
        let failures = vec![outcome(OutcomeKind::Transient, false); cfg.fallback_min_calls as usize];
        let (state, incident) = local.record(&cfg, "s", None, &failures);
        assert_eq!(state, BreakerState::Open);
        assert!(incident.contains("local"));
        let a = local.admit(&cfg, "s", None, &[item(TrafficClass::Priority)]);
        assert!(matches!(a.decisions[0], Decision::Deny { reason: DenyReason::BreakerOpen, .. }));
        tokio::time::advance(Duration::from_millis(cfg.fallback_cooldown_ms + 1)).await;
        let a = local.admit(&cfg, "s", None, &[item(TrafficClass::Priority), item(TrafficClass::Priority)]);
        assert_eq!(a.state, BreakerState::HalfOpen);
        assert!(matches!(a.decisions[0], Decision::Allow { canary: true, .. }));
        assert!(matches!(a.decisions[1], Decision::Deny { reason: DenyReason::CanaryBudget, .. }));
        let (state, _) =
            local.record(&cfg, "s", None, &vec![outcome(OutcomeKind::Success, true); CLOSE_AFTER as usize]);
        assert_eq!(state, BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn local_rate_is_bounded_and_refills_at_the_fallback_rate() {
        let cfg = BreakerConfig::default();
        let mut local = LocalBreakers::new();
        let batch: Vec<AdmitItem> = (0..50).map(|_| item(TrafficClass::Priority)).collect();
        let allowed = |a: &Admission| a.decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count();
        assert_eq!(allowed(&local.admit(&cfg, "s", None, &batch)) as f64, cfg.fallback_burst);
        tokio::time::advance(Duration::from_secs(2)).await;
        let a = local.admit(&cfg, "s", None, &batch);
        assert_eq!(allowed(&a) as f64, (2.0 * cfg.fallback_rate_per_s).min(cfg.fallback_burst));
        assert!(a.degraded);
    }
}
