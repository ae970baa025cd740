//! The [`Breaker`] client: its shared state, Redis calls and fallback bookkeeping, and the reply parsers.
//! Admission, outcomes, parents and pauses, and operator calls are further `impl Breaker` blocks in their own
//! modules.

use crate::config::BreakerConfig;
use crate::error::*;
use crate::parent::*;
use crate::types::*;
use crate::{local, metrics, scripts};
use bw_common::classify::PauseScope;
use bw_proto::v1::{self as proto, BreakerState, BreakerTransition};
use prost::Message as _;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct Inner {
    pub(crate) redis: Option<RedisConn>,
    pub(crate) nats: Option<async_nats::Client>,
    pub(crate) cfg: BreakerConfig,
    pub(crate) defaults: String,
    pub(crate) local: Mutex<local::LocalBreakers>,
    /// Last state Redis reported per scope, to seed the fallback.
    pub(crate) last_known: Mutex<HashMap<String, (BreakerState, String)>>,
    pub(crate) registered: Mutex<HashSet<String>>,
    /// Last usage band sent per scope, and when.
    pub(crate) usage_sent: Mutex<HashMap<String, (i8, tokio::time::Instant)>>,
    /// Unix ms until which calls go straight to the fallback.
    pub(crate) redis_down_until: AtomicI64,
    /// When a script call last got its answer (unix ms): a timeout while others are answered is congestion.
    pub(crate) redis_answered_at: AtomicI64,
    /// Scopes Redis last reported OPEN, until their cooldown ends, with the incident: admissions for them are
    /// refused here without a round trip. Only used once [`Breaker::follow_transitions`] keeps it fresh.
    pub(crate) open_until: Mutex<HashMap<String, (tokio::time::Instant, String)>>,
    pub(crate) cache_open: std::sync::atomic::AtomicBool,
    pub(crate) round_trips: AtomicU64,
    pub(crate) metrics: metrics::Metrics,
    pub(crate) account: Mutex<Account>,
    pub(crate) parents: Mutex<HashMap<String, ParentEntry>>,
}

/// Client of the distributed breaker; cheap to clone.
#[derive(Clone)]
pub struct Breaker {
    pub(crate) inner: Arc<Inner>,
}

/// Records what is known of scope `key`: OPEN for `open_for_ms` more (with its incident), or nothing.
pub(crate) fn know_open(inner: &Inner, key: String, state: BreakerState, open_for_ms: i64, incident_id: &str) {
    let mut open = lock(&inner.open_until);
    if state == BreakerState::Open && open_for_ms > 0 {
        let until = tokio::time::Instant::now() + Duration::from_millis(open_for_ms as u64);
        open.insert(key, (until, incident_id.to_string()));
    } else {
        open.remove(&key);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
impl Breaker {
    /// A breaker over a single Redis (None: always the local fallback) publishing transitions on `nats`.
    pub fn new(
        redis: Option<redis::aio::ConnectionManager>,
        nats: Option<async_nats::Client>,
        cfg: BreakerConfig,
    ) -> Breaker {
        Breaker::with_conn(redis.map(RedisConn::Single), nats, cfg)
    }

    /// A breaker over any [`RedisConn`].
    pub fn with_conn(redis: Option<RedisConn>, nats: Option<async_nats::Client>, cfg: BreakerConfig) -> Breaker {
        let defaults = cfg.defaults.encode();
        Breaker {
            inner: Arc::new(Inner {
                redis,
                nats,
                cfg,
                defaults,
                local: Mutex::new(local::LocalBreakers::new()),
                last_known: Mutex::new(HashMap::new()),
                registered: Mutex::new(HashSet::new()),
                usage_sent: Mutex::new(HashMap::new()),
                redis_down_until: AtomicI64::new(0),
                redis_answered_at: AtomicI64::new(0),
                open_until: Mutex::new(HashMap::new()),
                cache_open: std::sync::atomic::AtomicBool::new(false),
                round_trips: AtomicU64::new(0),
                metrics: metrics::Metrics::default(),
                account: Mutex::new(Account::default()),
                parents: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Registers the library's metrics (call once per process).
    pub fn register_metrics(&self, registry: &bw_common::admin::MetricsRegistry) {
        if let Ok(mut registry) = registry.lock() {
            self.inner.metrics.register(&mut registry);
        }
    }

    /// Redis script round trips made by this breaker (and its clones) so far.
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Ordering::Relaxed)
    }

    /// The client config.
    pub fn config(&self) -> &BreakerConfig {
        &self.inner.cfg
    }

    pub(crate) async fn call(
        &self,
        script: &'static str,
        inv: redis::ScriptInvocation<'_>,
    ) -> Result<redis::Value, BreakerError> {
        let redis = self.inner.redis.as_ref().ok_or(BreakerError::NoRedis)?;
        let timeout_ms = self.inner.cfg.command_timeout_ms;
        self.inner.round_trips.fetch_add(1, Ordering::Relaxed);
        metrics::Metrics::inc(&self.inner.metrics.round_trips, "script", script);
        match tokio::time::timeout(Duration::from_millis(timeout_ms), invoke(redis, &inv)).await {
            Ok(Ok(value)) => {
                self.inner.redis_answered_at.store(bw_common::time::now_ms(), Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(e)) => Err(BreakerError::Redis(e)),
            Err(_) => Err(BreakerError::Timeout { script, timeout_ms }),
        }
    }

    /// True when the send path should skip Redis for now (a recent failure).
    pub(crate) fn redis_skipped(&self) -> bool {
        self.inner.redis.is_none() || bw_common::time::now_ms() < self.inner.redis_down_until.load(Ordering::Relaxed)
    }

    /// After a failed call: Redis counts as unreachable (every call answered locally for
    /// `redis_retry_after_ms`) unless the failure was a timeout while other calls were still being answered
    /// within the command timeout. That is congestion (this process's own burst of calls queued on the
    /// connection), not an outage: marking Redis down for it sent a loaded dispatcher's every admission to the
    /// local fallback (5 msg/s per scope) and the pipeline bench from about 1,000 msg/s to 20-65 msg/s.
    pub(crate) fn mark_down(&self, op: &'static str, error: &BreakerError) {
        let timed_out = match error {
            BreakerError::Timeout { .. } => true,
            // The connection's own response timeout.
            BreakerError::Redis(e) => e.is_timeout(),
            _ => false,
        };
        if timed_out {
            let answered = self.inner.redis_answered_at.load(Ordering::Relaxed);
            if bw_common::time::now_ms() - answered <= self.inner.cfg.command_timeout_ms as i64 {
                tracing::debug!(op, error = %error, "redis call timed out while others are answered: congestion");
                return;
            }
        }
        let until = bw_common::time::now_ms() + self.inner.cfg.redis_retry_after_ms as i64;
        let previous = self.inner.redis_down_until.swap(until, Ordering::Relaxed);
        if previous < bw_common::time::now_ms() {
            tracing::warn!(op, error = %error, "breaker redis unreachable; answering from the local fallback");
        }
    }

    /// Adds the scope to the index of scopes (once per process), and records the account this process sends it
    /// with, so the coordinator knows which app and token pauses cover it.
    pub(crate) async fn register_scope(&self, scope: &Scope) {
        let member = scope.index_member();
        if lock(&self.inner.registered).contains(&member) {
            return;
        }
        if let Some(redis) = &self.inner.redis {
            let timeout = Duration::from_millis(self.inner.cfg.command_timeout_ms);
            let account = self.account();
            let registered = async {
                sadd(redis, bw_wire::names::SCOPES_INDEX_KEY, &member).await?;
                if let Some(account) = &account {
                    let mut conn = redis.clone();
                    redis::cmd("HSET")
                        .arg(scripts::SCOPE_ACCOUNTS_KEY)
                        .arg(&member)
                        .arg(account.encode())
                        .query_async::<()>(&mut conn)
                        .await?;
                }
                Ok::<(), redis::RedisError>(())
            };
            if let Ok(Ok(())) = tokio::time::timeout(timeout, registered).await {
                lock(&self.inner.registered).insert(member);
            }
        }
    }

    pub(crate) fn remember(&self, scope: &Scope, head: &scripts::Head) {
        let key = scope.index_member();
        lock(&self.inner.local).forget(&key);
        lock(&self.inner.last_known).insert(key.clone(), (head.state, head.incident_id.clone()));
        // While OPEN nothing but an operator (force, reset: both publish a transition) changes the state before
        // the cooldown ends, so until then the answer is known without asking Redis.
        let open_for = head.open_until_ms - head.now_ms;
        know_open(&self.inner, key, head.state, open_for, &head.incident_id);
    }

    /// Keeps the OPEN cache fresh from the transitions every process publishes, and turns it on: from then on
    /// admissions for a scope known to be OPEN (from a Redis reply or a trip event) are refused without a Redis
    /// round trip until its cooldown ends or another transition of the scope arrives. Needs the NATS client;
    /// the subscription lives as long as the breaker.
    pub async fn follow_transitions(&self) -> Result<(), async_nats::SubscribeError> {
        let Some(nats) = &self.inner.nats else { return Ok(()) };
        let mut events = nats.subscribe(bw_wire::names::breaker_subject("*")).await?;
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            use futures::StreamExt;
            while let Some(msg) = events.next().await {
                let Some(inner) = inner.upgrade() else { return };
                if let Ok(event) = BreakerTransition::decode(msg.payload.as_ref())
                    && let Some(scope) = &event.scope
                {
                    let key = Scope { waba_id: scope.waba_id.clone(), phone_number_id: scope.phone_number_id.clone() }
                        .index_member();
                    // A trip seen by another instance is known here at once; any other transition ends what
                    // this instance knew.
                    let open_for = event.open_until_unix_ms - bw_common::time::now_ms();
                    know_open(&inner, key, event.to(), open_for, &event.incident_id);
                }
            }
        });
        self.inner.cache_open.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The refusal for a scope known to be OPEN, if it is.
    pub(crate) fn known_open(&self, scope: &Scope, n: usize) -> Option<Admission> {
        if !self.inner.cache_open.load(Ordering::Relaxed) {
            return None;
        }
        let key = scope.index_member();
        let mut open = lock(&self.inner.open_until);
        let (until, incident_id) = open.get(&key)?.clone();
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            open.remove(&key);
            return None;
        }
        let deny = Decision::Deny { reason: DenyReason::BreakerOpen, retry_after_ms: left.as_millis().max(1) as u64 };
        Some(Admission {
            decisions: vec![deny; n],
            state: BreakerState::Open,
            incident_id,
            degraded: false,
            server_now_ms: bw_common::time::now_ms(),
            blockers: Vec::new(),
            slot_gap_ms: 0.0,
        })
    }

    pub(crate) fn last_known(&self, scope: &Scope) -> Option<(BreakerState, String)> {
        lock(&self.inner.last_known).get(&scope.index_member()).cloned()
    }
}

/// Result of reading the parent pauses of a scope.
#[derive(Debug, Default)]
pub(crate) struct ParentCheck {
    /// The refusal every send of the scope gets now, with its retry-after.
    pub(crate) block: Option<(DenyReason, u64)>,
    /// The refusal marketing sends (and marketing replays) get now (a marketing-only pause), with its retry-after.
    pub(crate) marketing_block: Option<(DenyReason, u64)>,
    /// End (Redis ms) of a parent pause that ended less than `pause_ramp_ms` ago, or 0.
    pub(crate) ended_ms: i64,
}

/// The app key of an account: the app id, else the token's fingerprint, else `default`.
pub(crate) fn app_key(account: &Account) -> String {
    if !account.app_id.is_empty() {
        account.app_id.clone()
    } else if let Some(fp) = &account.token_fp {
        format!("tok-{fp}")
    } else {
        "default".to_string()
    }
}

/// The reason text of a pause.
pub(crate) fn pause_reason(code: i64, scope: PauseScope) -> String {
    if code == 0 { format!("{} paused", scope.label()) } else { format!("{} paused: Meta code {code}", scope.label()) }
}

/// Of two pauses of one key in one batch, the one that lasts longer (until lifted beats any time).
pub(crate) fn longer(a: PauseSpec, b: PauseSpec) -> PauseSpec {
    let rank = |s: &PauseSpec| match s.end {
        PauseEnd::Lifted => u64::MAX,
        PauseEnd::For(ms) | PauseEnd::Probe(ms) => ms,
    };
    if rank(&b) > rank(&a) { b } else { a }
}

pub(crate) fn failure_rate(calls: u64, failures: u64) -> f64 {
    if calls == 0 { 0.0 } else { failures as f64 / calls as f64 }
}

pub(crate) type Parsed<T> = Result<T, BreakerError>;

pub(crate) fn parse_admit(
    value: redis::Value,
    n: usize,
) -> Parsed<(Admission, scripts::Head, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let slot_gap_ms = reply.int()?.max(0) as f64 / 1000.0;
    let mut decisions = Vec::with_capacity(n);
    let mut blockers = Vec::with_capacity(n);
    for _ in 0..n {
        let code = reply.int()?;
        let retry_after_ms = reply.int()?.max(0) as u64;
        let blocker = reply.string()?;
        let blocker_age_ms = reply.int()?.max(0) as u64;
        let code = scripts::Code::from_i64(code)
            .ok_or_else(|| BreakerError::BadReply(format!("unknown decision code {code}")))?;
        decisions.push(match code.deny_reason() {
            None => Decision::Allow { canary: code == scripts::Code::Canary, wait_ms: retry_after_ms },
            Some(reason) => Decision::Deny { reason, retry_after_ms },
        });
        blockers.push(
            (code == scripts::Code::OrderWait && !blocker.is_empty())
                .then_some(Blocker { operation_id: blocker, age_ms: blocker_age_ms }),
        );
    }
    let transitions = scripts::transitions(&mut reply)?;
    let admission = Admission {
        decisions,
        state: head.state,
        incident_id: head.incident_id.clone(),
        degraded: false,
        server_now_ms: head.now_ms,
        blockers,
        slot_gap_ms,
    };
    Ok((admission, head, transitions))
}

pub(crate) fn parse_record(value: redis::Value) -> Parsed<(scripts::Head, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let _paused_until = reply.int()?;
    let transitions = scripts::transitions(&mut reply)?;
    Ok((head, transitions))
}

pub(crate) fn parse_status(scope: &Scope, value: redis::Value) -> Parsed<(ScopeStatus, Vec<scripts::RawTransition>)> {
    let mut reply = scripts::Reply::new(value)?;
    let head = scripts::head(&mut reply)?;
    let tail = scripts::snapshot_tail(&mut reply)?;
    let number = scripts::number_pause_tail(&mut reply)?;
    let transitions = scripts::transitions(&mut reply)?;
    let number_pause = ParentStatus {
        paused_until_unix_ms: if number.paused_until_ms > head.now_ms { number.paused_until_ms } else { 0 },
        reason: number.reason,
        halted: number.halted,
        code: number.code,
        since_unix_ms: number.since_ms,
        source: number.source,
        lift: number.lift,
        marketing_only: number.marketing,
    };
    // A number pause that ended is still reported while a probe is due (its key lives): replay then waits too,
    // and sends go only once the probe let them.
    let pending_probe = number_pause.lift == "probe" && number.paused_until_ms > 0;
    let pauses = if number_pause.active(head.now_ms) || pending_probe {
        vec![number_pause.to_proto(&Parent::Number(scope.clone()))]
    } else {
        Vec::new()
    };
    let snapshot = proto::ScopeSnapshot {
        scope: Some(scope.to_proto()),
        state: head.state as i32,
        since_unix_ms: tail.since_ms,
        incident_id: head.incident_id,
        open_until_unix_ms: head.open_until_ms,
        paused_until_unix_ms: if tail.paused_until_ms > head.now_ms { tail.paused_until_ms } else { 0 },
        pause_reason: if tail.paused_until_ms > head.now_ms { tail.pause_reason } else { String::new() },
        failure_rate: failure_rate(head.calls, head.failures),
        calls_in_window: head.calls,
        ramp_fraction: tail.ramp_fraction,
        trips: tail.trips,
        updated_at_unix_ms: head.now_ms,
        pauses,
    };
    let status = ScopeStatus {
        snapshot,
        failures_in_window: head.failures,
        tokens: tail.tokens,
        usage_percent: tail.usage_percent,
        trip_streak: tail.trip_streak,
        adaptive_share: tail.adaptive_share,
        quota_visibility: match tail.visibility {
            1 => QuotaVisibility::Seen,
            0 => QuotaVisibility::Blind,
            _ => QuotaVisibility::Unknown,
        },
        next_slot_wait_ms: tail.next_slot_wait_ms,
    };
    Ok((status, transitions))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeout while other calls are being answered is congestion: Redis is not marked down. A timeout after
    /// nothing answered for the whole command timeout, or a connection error, marks it down.
    #[tokio::test]
    async fn only_a_timeout_with_no_answer_for_the_whole_timeout_marks_redis_down() {
        let redis = bw_testkit::RedisServer::start();
        let conn = bw_common::redis_conn::connect(&redis.url(), Duration::from_millis(500), Duration::from_secs(5))
            .await
            .expect("redis connects");
        let breaker = Breaker::new(Some(conn), None, BreakerConfig::default());
        let scope = Scope::new("111", "222");
        let answered = breaker.admit(&scope, &[]).await;
        assert!(!answered.degraded, "{answered:?}");
        let timeout = BreakerError::Timeout { script: "claim_late", timeout_ms: breaker.config().command_timeout_ms };
        breaker.mark_down("admit", &timeout);
        assert!(!breaker.redis_skipped(), "a call answered just now: congestion, Redis stays in use");
        let stale = bw_common::time::now_ms() - breaker.config().command_timeout_ms as i64 - 1;
        breaker.inner.redis_answered_at.store(stale, Ordering::Relaxed);
        breaker.mark_down("admit", &timeout);
        assert!(breaker.redis_skipped(), "nothing answered for the whole timeout: Redis counts as down");
    }
}
