//! Pauses above the number (app, WABA, token) and the account: reading, setting and clearing them.

use crate::breaker::*;
use crate::error::*;
use crate::parent::*;
use crate::scripts;
use crate::types::*;
use bw_common::classify::{PauseScope, RateScope};
use std::collections::HashMap;
use std::time::Duration;

impl Breaker {
    /// Sets the app and the access token this breaker's sends use (call at start-up and whenever the token
    /// changes). App pauses are keyed by `app_id` (by the token's fingerprint when it is empty), token halts by
    /// the token's fingerprint: a new token is not under the old token's halt. The token is not kept. The scopes
    /// this process sends for are recorded with it for the coordinator ([`Breaker::scope_accounts`]).
    pub fn set_account(&self, app_id: &str, access_token: &str) {
        let token_fp = (!access_token.is_empty()).then(|| token_fingerprint(access_token));
        *lock(&self.inner.account) = Account { app_id: app_id.to_string(), token_fp };
        lock(&self.inner.registered).clear();
    }

    /// The account of this process's sends (app key and token fingerprint), None before [`Breaker::set_account`].
    pub(crate) fn account(&self) -> Option<ScopeAccount> {
        let account = lock(&self.inner.account).clone();
        if account.app_id.is_empty() && account.token_fp.is_none() {
            return None;
        }
        Some(ScopeAccount { app: app_key(&account), token_fp: account.token_fp })
    }

    /// The parents whose pauses cover `scope`: its WABA, the app and the token (when set).
    pub(crate) fn parents_of(&self, scope: &Scope) -> Vec<Parent> {
        let account = lock(&self.inner.account).clone();
        ScopeAccount { app: app_key(&account), token_fp: account.token_fp }.parents(scope)
    }

    /// Reads (or takes from the cache) the pauses of the scope's parents: the first refusal (for every send, and
    /// for marketing sends only), and the end of a parent pause that ended within `pause_ramp_ms` (0 if none)
    /// for the ramp.
    pub(crate) async fn parent_check(&self, scope: &Scope) -> ParentCheck {
        let parents = self.parents_of(scope);
        let refresh = Duration::from_millis(self.inner.cfg.parent_refresh_ms);
        let stale: Vec<&Parent> = {
            let cache = lock(&self.inner.parents);
            parents.iter().filter(|p| cache.get(&p.key()).is_none_or(|e| e.fetched.elapsed() >= refresh)).collect()
        };
        if !stale.is_empty() && !self.redis_skipped() {
            let reads = futures::future::join_all(stale.iter().map(|p| async move {
                let key = p.key();
                let inv = scripts::parent_invocation(&key, "read", &scripts::PauseArgs::default());
                (key, self.call("parent_pause", inv).await.and_then(scripts::parent_reply))
            }))
            .await;
            // A failed read keeps what was known (or nothing) and leaves it to the admission call to find out
            // whether Redis is down: a slow parent read alone never sends the scope to the local fallback.
            for (key, reply) in reads {
                match reply {
                    Ok(reply) => self.remember_parent(key, &reply),
                    Err(e) => tracing::debug!(parent = %key, error = %e, "parent pause read failed"),
                }
            }
        }
        let cache = lock(&self.inner.parents);
        let ramp = self.inner.cfg.defaults.pause_ramp_ms as i64;
        let mut check = ParentCheck::default();
        for parent in &parents {
            let Some(e) = cache.get(&parent.key()) else { continue };
            let server_now = e.server_now_ms + e.fetched.elapsed().as_millis() as i64;
            let block = if e.halted {
                let retry = if e.retry_ms > 0 { e.retry_ms } else { self.inner.cfg.token_halt_retry_ms };
                Some((parent.deny_reason(), retry))
            } else if e.paused_until_ms > server_now {
                Some((parent.deny_reason(), (e.paused_until_ms - server_now) as u64))
            } else {
                None
            };
            let slot = if e.marketing_only { &mut check.marketing_block } else { &mut check.block };
            if slot.is_none() {
                *slot = block;
            }
            if e.last_end_ms > 0 && e.last_end_ms <= server_now && e.last_end_ms + ramp > server_now {
                check.ended_ms = check.ended_ms.max(e.last_end_ms);
            }
        }
        check
    }

    pub(crate) fn remember_parent(&self, key: String, reply: &scripts::ParentReply) {
        let mut cache = lock(&self.inner.parents);
        let last_end_ms = match cache.get(&key) {
            Some(old) if reply.paused_until_ms == 0 => old.last_end_ms.max(old.paused_until_ms),
            _ => reply.paused_until_ms,
        };
        cache.insert(
            key,
            ParentEntry {
                fetched: tokio::time::Instant::now(),
                server_now_ms: reply.now_ms,
                paused_until_ms: reply.paused_until_ms,
                halted: reply.halted,
                marketing_only: reply.marketing,
                retry_ms: reply.retry_ms,
                last_end_ms,
            },
        );
    }

    /// Reads a pause (no change). Fails without Redis.
    pub async fn parent_status(&self, parent: &Parent) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let inv = scripts::parent_invocation(&key, "read", &scripts::PauseArgs::default());
        let reply = scripts::parent_reply(self.call("parent_pause", inv).await?)?;
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// Operator: lifts a pause or a token halt at once (a number's at once everywhere, the others for every
    /// dispatcher within `parent_refresh_ms`).
    pub async fn clear_parent(&self, parent: &Parent) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let inv = scripts::parent_invocation(&key, "clear", &scripts::PauseArgs::default());
        let reply = scripts::parent_reply(self.call("parent_pause", inv).await?)?;
        tracing::info!(level = parent.level().label(), id = %parent.id(), "pause lifted by an operator");
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// Pauses `parent` as `spec` says (an operator's or a webhook's pause; answers' pauses come through
    /// [`Breaker::record`]). The scope of `spec` is ignored: `parent` names it. Fails without Redis.
    pub async fn pause(&self, parent: &Parent, spec: PauseSpec) -> Result<ParentStatus, BreakerError> {
        self.pause_because(parent, spec, None).await
    }

    /// [`Breaker::pause`] with the reason `bwctl scope` shows (a webhook's own words: "account_update
    /// ACCOUNT_RESTRICTION ..."); `None` derives it from the code and scope.
    pub async fn pause_because(
        &self,
        parent: &Parent,
        spec: PauseSpec,
        reason: Option<&str>,
    ) -> Result<ParentStatus, BreakerError> {
        let key = parent.key();
        let (mode, mut args) = self.pause_args(spec);
        if let Some(reason) = reason {
            args.reason = reason.to_string();
        }
        let reply =
            scripts::parent_reply(self.call("parent_pause", scripts::parent_invocation(&key, mode, &args)).await?)?;
        self.noted_pause(parent, &reply);
        self.remember_parent(key, &reply);
        Ok(ParentStatus::from_reply(&reply))
    }

    /// The mode and arguments of `parent_pause.lua` for a pause.
    pub(crate) fn pause_args(&self, spec: PauseSpec) -> (&'static str, scripts::PauseArgs) {
        let lifted_by = if spec.scope == PauseScope::Token { "new_token" } else { "operator" };
        let reason = pause_reason(spec.code, spec.scope);
        let base = scripts::PauseArgs {
            reason,
            code: spec.code,
            source: spec.source.label(),
            marketing: spec.marketing_only,
            ..Default::default()
        };
        match spec.end {
            PauseEnd::For(ms) => ("pause", scripts::PauseArgs { ms: ms.max(1), lift: "time", ..base }),
            PauseEnd::Probe(ms) => (
                "pause",
                scripts::PauseArgs {
                    ms: ms.max(1),
                    lift: "probe",
                    extra_ms: bw_common::classify::PROBE_PAUSE_MAX_MS.max(ms),
                    ..base
                },
            ),
            PauseEnd::Lifted => (
                "halt",
                scripts::PauseArgs {
                    ms: self.inner.cfg.token_halt_ttl_ms,
                    lift: lifted_by,
                    extra_ms: self.inner.cfg.token_halt_retry_ms,
                    ..base
                },
            ),
        }
    }

    /// Logs and counts a pause just written.
    pub(crate) fn noted_pause(&self, parent: &Parent, reply: &scripts::ParentReply) {
        tracing::warn!(
            level = parent.level().label(),
            id = %parent.id(),
            code = reply.code,
            paused_until_unix_ms = reply.paused_until_ms,
            halted = reply.halted,
            lift = %reply.lift,
            source = %reply.source,
            reason = %reply.reason,
            "scope paused"
        );
        self.inner
            .metrics
            .pauses
            .get_or_create(&vec![
                ("level".to_string(), parent.level().label().to_string()),
                ("code".to_string(), reply.code.to_string()),
            ])
            .inc();
    }

    /// Records the pauses a batch of outcomes calls for, each on its scope's key: the number's own, its WABA's,
    /// the app's, the token's (a token pause without a token set falls to the number: never wider than known).
    /// One script call per key, the longest pause of the batch. Errors leave the scope's own fallback to act.
    pub(crate) async fn record_pauses(&self, scope: &Scope, outcomes: &[OutcomeItem]) {
        let account = lock(&self.inner.account).clone();
        let mut specs: HashMap<String, (Parent, PauseSpec)> = HashMap::new();
        for item in outcomes {
            let spec = match item.kind {
                OutcomeKind::Pause(spec) => spec,
                OutcomeKind::RateLimited { scope: s @ (RateScope::App | RateScope::Waba), pause_ms } => PauseSpec {
                    scope: s.scope(),
                    code: 0,
                    end: PauseEnd::For(pause_ms),
                    marketing_only: false,
                    source: PauseSource::Answer,
                },
                _ => continue,
            };
            let parent = match spec.scope {
                PauseScope::PhoneNumber => Parent::Number(scope.clone()),
                PauseScope::Waba => Parent::Waba(scope.waba_id.clone()),
                PauseScope::App => Parent::App(app_key(&account)),
                PauseScope::Token => match &account.token_fp {
                    Some(fp) => Parent::Token(fp.clone()),
                    None => Parent::Number(scope.clone()),
                },
                _ => continue,
            };
            match specs.get_mut(&parent.key()) {
                Some((_, kept)) => *kept = longer(*kept, spec),
                None => {
                    specs.insert(parent.key(), (parent, spec));
                }
            }
        }
        if specs.is_empty() || self.redis_skipped() {
            return;
        }
        let calls = futures::future::join_all(specs.into_values().map(|(parent, spec)| async move {
            let (mode, args) = self.pause_args(spec);
            let reply = self.call("parent_pause", scripts::parent_invocation(&parent.key(), mode, &args)).await;
            (parent, reply.and_then(scripts::parent_reply))
        }))
        .await;
        for (parent, reply) in calls {
            match reply {
                Ok(reply) => {
                    self.noted_pause(&parent, &reply);
                    self.remember_parent(parent.key(), &reply);
                }
                Err(e) => self.mark_down("parent_pause", &e),
            }
        }
    }

    /// The account (app key, token fingerprint) each scope's dispatchers send with, as they recorded it: scopes
    /// by `waba:phone` ([`Scope::index_member`]). Fails without Redis.
    pub async fn scope_accounts(&self) -> Result<HashMap<String, ScopeAccount>, BreakerError> {
        let redis = self.inner.redis.as_ref().ok_or(BreakerError::NoRedis)?;
        let mut conn = redis.clone();
        let timeout = Duration::from_millis(self.inner.cfg.command_timeout_ms.max(1_000));
        let all: HashMap<String, String> = match tokio::time::timeout(
            timeout,
            redis::cmd("HGETALL").arg(scripts::SCOPE_ACCOUNTS_KEY).query_async(&mut conn),
        )
        .await
        {
            Ok(result) => result?,
            Err(_) => {
                return Err(BreakerError::Timeout { script: "scope_accounts", timeout_ms: timeout.as_millis() as u64 });
            }
        };
        Ok(all.into_iter().filter_map(|(k, v)| ScopeAccount::decode(&v).map(|a| (k, a))).collect())
    }
}
