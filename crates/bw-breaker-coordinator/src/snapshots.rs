//! Ticks and snapshots: each known scope ticked (cooldown → HALF_OPEN without traffic), its state with every
//! pause that holds it stored in BW_SCOPES by the leader, and the FORCED_OPEN overrides restored after Redis
//! lost its data.

use crate::coordinator::{Coordinator, lock, snapshot_key};
use bw_breaker::{Parent, ParentStatus, Scope, ScopeStatus};
use bw_proto::v1::BreakerState;
use bw_wire::names::COORDINATOR_EPOCH_KEY;
use futures::{StreamExt, TryStreamExt};
use prost::Message as _;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

impl Coordinator {
    /// The pauses above the number that cover `scope`: its WABA's, and the app's and token's of the account its
    /// dispatchers recorded (none recorded yet: the WABA's alone).
    pub(crate) fn parents_of(&self, scope: &Scope) -> Vec<Parent> {
        let accounts = self.inner.accounts.read().unwrap_or_else(|p| p.into_inner());
        match accounts.get(&scope.index_member()) {
            Some(account) => account.parents(scope),
            None => vec![Parent::Waba(scope.waba_id.clone())],
        }
    }

    /// Reads the pauses above the numbers of `scopes` that were not read within `parent_refresh_ms`
    /// (concurrently, one call per key). A failed read keeps what was known.
    pub(crate) async fn refresh_parents(&self, scopes: &[Scope]) {
        let refresh = Duration::from_millis(self.inner.breaker.config().parent_refresh_ms);
        let stale: HashMap<String, Parent> = {
            let cache = lock(&self.inner.parents);
            scopes
                .iter()
                .flat_map(|s| self.parents_of(s))
                .filter(|p| cache.get(&p.key()).is_none_or(|(at, _, _)| at.elapsed() >= refresh))
                .map(|p| (p.key(), p))
                .collect()
        };
        let concurrency = self.inner.cfg.coordinator.tick_concurrency.max(1);
        let read: Vec<(String, Parent, Option<ParentStatus>)> = futures::stream::iter(stale)
            .map(|(key, parent)| async move {
                let status = self.inner.breaker.parent_status(&parent).await;
                if let Err(e) = &status {
                    tracing::debug!(parent = %key, error = %e, "pause read failed");
                }
                (key, parent, status.ok())
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let mut cache = lock(&self.inner.parents);
        for (key, parent, status) in read {
            if let Some(status) = status {
                cache.insert(key, (Instant::now(), parent, status));
            }
        }
    }

    /// The pauses above the number in force for `scope`, from what [`Coordinator::refresh_parents`] read.
    pub(crate) fn parent_pauses(&self, scope: &Scope, now_ms: i64) -> Vec<bw_proto::v1::ScopePause> {
        let cache = lock(&self.inner.parents);
        self.parents_of(scope)
            .iter()
            .filter_map(|p| cache.get(&p.key()))
            .filter(|(_, _, status)| status.active(now_ms))
            .map(|(_, parent, status)| status.to_proto(parent))
            .collect()
    }

    /// Forgets what was read of a pause (an operator lifted or set it here): the next store reads it again.
    pub(crate) fn forget_parent(&self, parent: &Parent) {
        lock(&self.inner.parents).remove(&parent.key());
    }

    /// Sets the pause gauge from the pauses in force over `statuses` and above their numbers (each pause counted
    /// once, from what the last store read).
    pub(crate) fn count_pauses(&self, statuses: Vec<ScopeStatus>) {
        let now = bw_common::time::now_ms();
        let mut seen: HashMap<(String, String), (String, i64, String)> = HashMap::new();
        for status in statuses {
            let Some(s) = status.snapshot.scope.as_ref() else { continue };
            let scope = Scope::new(s.waba_id.clone(), s.phone_number_id.clone());
            for p in status.snapshot.pauses.iter().chain(self.parent_pauses(&scope, now).iter()) {
                seen.insert((p.level.clone(), p.id.clone()), (p.level.clone(), p.code, p.lift.clone()));
            }
        }
        let metric = &self.inner.metrics.pauses;
        metric.clear();
        let mut counts: HashMap<(String, i64, String), i64> = HashMap::new();
        for v in seen.into_values() {
            *counts.entry(v).or_default() += 1;
        }
        for ((level, code, lift), n) in counts {
            metric
                .get_or_create(&vec![("level".into(), level), ("code".into(), code.to_string()), ("lift".into(), lift)])
                .set(n);
        }
    }

    /// Records the state of a scope: gauge, and BW_SCOPES when something significant changed or it is old.
    /// The snapshot carries every pause that holds the scope. Only the leader records; on other instances this
    /// does nothing.
    pub(crate) async fn store(&self, status: &ScopeStatus, force: bool) {
        if !self.is_leader() {
            return;
        }
        let Some(s) = status.snapshot.scope.as_ref() else {
            return;
        };
        let scope = Scope::new(s.waba_id.clone(), s.phone_number_id.clone());
        self.refresh_parents(std::slice::from_ref(&scope)).await;
        let mut status = status.clone();
        status.snapshot.pauses.extend(self.parent_pauses(&scope, bw_common::time::now_ms()));
        let status = &status;
        let Some(scope) = status.snapshot.scope.as_ref() else {
            return;
        };
        let phone = scope.phone_number_id.clone();
        self.inner
            .metrics
            .state
            .get_or_create(&vec![("scope".into(), phone.clone())])
            .set(status.snapshot.state.into());
        let key = snapshot_key(status);
        let refresh = Duration::from_millis(self.inner.cfg.coordinator.snapshot_refresh_ms);
        let due = force
            || match lock(&self.inner.written).get(&phone) {
                Some((last, at)) => *last != key || at.elapsed() >= refresh,
                None => true,
            };
        if !due {
            return;
        }
        match self.inner.scopes_kv.put(phone.as_str(), status.snapshot.encode_to_vec().into()).await {
            Ok(_) => {
                lock(&self.inner.written).insert(phone, (key, Instant::now()));
            }
            Err(e) => {
                tracing::warn!(phone_number_id = %phone, error = %e, "cannot write scope snapshot")
            }
        }
    }

    /// Ticks one scope (cooldown → HALF_OPEN) and stores its state (on the leader, once Redis proves it kept its
    /// data: see [`COORDINATOR_EPOCH_KEY`]).
    pub async fn tick_scope(&self, scope: &Scope, force_store: bool) -> Option<ScopeStatus> {
        let ticked = self.tick_only(scope).await?;
        let status = ticked.0.clone();
        self.store_checked(vec![ticked], force_store).await;
        Some(status)
    }

    /// Ticks one scope; the state and whether a transition happened.
    pub(crate) async fn tick_only(&self, scope: &Scope) -> Option<(ScopeStatus, bool)> {
        match self.inner.breaker.tick(scope).await {
            Ok((status, transitions)) => Some((status, !transitions.is_empty())),
            Err(e) => {
                tracing::debug!(phone_number_id = %scope.phone_number_id, error = %e, "tick failed");
                None
            }
        }
    }

    pub(crate) async fn tick_all(&self, force_store: bool) {
        let scopes = self.known_scopes();
        let concurrency = self.inner.cfg.coordinator.tick_concurrency.max(1);
        let ticked: Vec<(ScopeStatus, bool)> = futures::stream::iter(scopes)
            .map(|scope| async move { self.tick_only(&scope).await })
            .buffer_unordered(concurrency)
            .filter_map(std::future::ready)
            .collect()
            .await;
        let gauge_due = self.is_leader();
        let statuses: Vec<ScopeStatus> =
            if gauge_due { ticked.iter().map(|(s, _)| s.clone()).collect() } else { vec![] };
        self.store_checked(ticked, force_store).await;
        if gauge_due {
            self.count_pauses(statuses);
        }
        self.inner.metrics.ticks.inc();
    }

    /// Stores states read from Redis, but only once Redis proves it still holds its data: the epoch key,
    /// read after the states on the same connection, is there. Without it the states may come from a Redis
    /// that lost everything (restart without persistence, failover to an empty replica), and writing them
    /// would erase the last snapshots, the only record of the operators' overrides: restore those first.
    pub(crate) async fn store_checked(&self, ticked: Vec<(ScopeStatus, bool)>, force_store: bool) {
        if !self.is_leader() {
            return;
        }
        match self.redis_epoch().await {
            Some(true) => {
                let scopes: Vec<Scope> = ticked
                    .iter()
                    .filter_map(|(s, _)| s.snapshot.scope.as_ref())
                    .map(|s| Scope::new(s.waba_id.clone(), s.phone_number_id.clone()))
                    .collect();
                self.refresh_parents(&scopes).await;
                let concurrency = self.inner.cfg.coordinator.tick_concurrency.max(1);
                futures::stream::iter(ticked)
                    .for_each_concurrent(concurrency, |(status, changed)| async move {
                        self.store(&status, force_store || changed).await;
                    })
                    .await;
            }
            Some(false) => self.restore_after_redis_loss().await,
            None => {}
        }
    }

    /// Whether Redis holds the epoch key (None: Redis did not answer).
    pub(crate) async fn redis_epoch(&self) -> Option<bool> {
        let mut conn = self.inner.redis.clone();
        let exists: redis::RedisResult<bool> =
            redis::cmd("EXISTS").arg(COORDINATOR_EPOCH_KEY).query_async(&mut conn).await;
        exists.ok()
    }

    /// Redis answered without the epoch key: it is new or lost its data. Re-applies every FORCED_OPEN the last
    /// snapshots in BW_SCOPES record and Redis no longer has, unless Redis shows a later transition of the scope
    /// (the safe reading: an operator stopped those sends and nothing since says otherwise);
    /// a lost FORCED_CLOSED is only reported (re-applying it would send through failures). Then rewrites every
    /// config hash and sets the epoch key.
    pub(crate) async fn restore_after_redis_loss(&self) {
        let snapshots = match self.stored_snapshots().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read BW_SCOPES to restore overrides; retrying next round");
                return;
            }
        };
        if !snapshots.is_empty() {
            self.inner.metrics.redis_epoch_missing.inc();
            tracing::error!(
                snapshots = snapshots.len(),
                "redis holds no coordinator epoch: it restarted empty or failed over to a replica without our data \
                 (or this is the first start of a coordinator that keeps one); breaker state, pair timers and \
                 pauses may be gone (see deploy/runbooks/coordinator.md)"
            );
        }
        for snapshot in snapshots {
            let Some(s) = snapshot.scope.as_ref() else {
                continue;
            };
            let scope = Scope::new(s.waba_id.clone(), s.phone_number_id.clone());
            if scope.waba_id.is_empty() || scope.phone_number_id.is_empty() {
                continue;
            }
            self.learn(&scope);
            let recorded = snapshot.state();
            if !matches!(recorded, BreakerState::ForcedOpen | BreakerState::ForcedClosed) {
                continue;
            }
            let (now, since) = match self.inner.breaker.status(&scope).await {
                Ok(status) => (status.snapshot.state(), status.snapshot.since_unix_ms),
                Err(e) => {
                    tracing::warn!(error = %e, "redis unavailable while restoring overrides; retrying next round");
                    return;
                }
            };
            // Redis shows a transition at or after the recorded override (an operator's clear or reset on any
            // instance, a trip): that is newer than the snapshot, so it stands.
            if now == recorded || since >= snapshot.since_unix_ms {
                continue;
            }
            if recorded == BreakerState::ForcedClosed {
                tracing::warn!(
                    phone_number_id = %scope.phone_number_id,
                    "a FORCED_CLOSED override was lost with redis and is not re-applied; force it again if still wanted"
                );
                continue;
            }
            match self.inner.breaker.force(&scope, bw_breaker::Forced::Open).await {
                Ok(_) => {
                    self.inner.metrics.overrides_restored.inc();
                    tracing::warn!(
                        phone_number_id = %scope.phone_number_id,
                        incident_id = %snapshot.incident_id,
                        "re-applied a FORCED_OPEN override lost with redis"
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot re-apply a FORCED_OPEN override; retrying next round");
                    return;
                }
            }
        }
        self.write_all_configs().await;
        let mut conn = self.inner.redis.clone();
        let value = format!("{} {}", self.inner.instance, bw_common::time::now_ms());
        if let Err(e) = redis::cmd("SET").arg(COORDINATOR_EPOCH_KEY).arg(value).query_async::<()>(&mut conn).await {
            tracing::warn!(error = %e, "cannot set the coordinator epoch in redis; retrying next round");
        }
    }

    /// Every snapshot in BW_SCOPES.
    pub(crate) async fn stored_snapshots(&self) -> anyhow::Result<Vec<bw_proto::v1::ScopeSnapshot>> {
        let kv = &self.inner.scopes_kv;
        let keys: Vec<String> = kv.keys().await?.try_collect().await?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(value) = kv.get(&key).await?
                && let Ok(snapshot) = bw_proto::v1::ScopeSnapshot::decode(value.as_ref())
            {
                out.push(snapshot);
            }
        }
        Ok(out)
    }
}
