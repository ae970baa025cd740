//! Breakwater breaker-coordinator: the authority for per-scope breaker and rate-limit config, and the keeper of
//! every scope's current state.
//!
//! It writes each scope's config hash into Redis (from its config or a hot-reloaded limits file), ticks every
//! known scope so an OPEN breaker moves to HALF_OPEN when its cooldown ends even without traffic, keeps the
//! current `ScopeSnapshot` of every scope in the KV bucket BW_SCOPES (with every pause that holds the scope: its
//! number's own, its WABA's, and its app's and token's as the dispatchers recorded them), counts trips from the transition events
//! every instance publishes on `bw.breaker.v1.*`, and serves the admin API (list, force open/closed, clear,
//! reset, reload) on the admin port; its state-changing routes need an operator token ([`admin`]).
//!
//! Any number of coordinators may run, in one model: **a leader elected through a JetStream KV lease**
//! ([`leader`]). The lease holder runs the ticks and is the only writer of the config hashes and snapshots;
//! the others serve the admin API, count the trip events their share of the queue group receives, learn
//! scopes, and take the lease within about `leader_lease_ms` + `leader_renew_ms` (4 s at the defaults) when the
//! leader dies, at once when it stops gracefully. No transition is ever applied twice whoever ticks: every
//! transition is decided by a Lua script on the Redis state (an OPEN scope moves to HALF_OPEN once), so even
//! two instances ticking at once (a stalled leader past its lease) publish each transition once.
//!
//! When Redis loses its data (restart without persistence, failover to an empty replica) the leader notices the
//! missing [`REDIS_EPOCH_KEY`] before it writes any snapshot, and re-applies the FORCED_OPEN overrides the last
//! BW_SCOPES snapshots record (see `Coordinator::store_checked`).
//!
//! What it must not do: change breaker state other than through the `bw-breaker` scripts. Entry point: [`run`].

pub mod account;
pub mod admin;
pub mod config;
pub mod leader;
pub mod meta_limits;
mod metrics;

pub use config::Config;

use anyhow::Context as _;
use bw_breaker::{Breaker, Parent, ParentStatus, Scope, ScopeAccount, ScopeStatus};
use bw_common::proto::{BreakerState, BreakerTransition};
use bw_common::service::Deps;
use config::Limits;
use futures::{StreamExt, TryStreamExt};
use prost::Message as _;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Redis key the leader sets once Redis holds its data; its absence means Redis is new or lost its data.
/// (Not scope-tagged: one key, never touched by the scripts.)
pub const REDIS_EPOCH_KEY: &str = "bw:coordinator:epoch";

/// Queue group of coordinators on the breaker events.
const EVENTS_QUEUE_GROUP: &str = "bw-breaker-coordinator";

/// Fields of a snapshot whose change is written to BW_SCOPES at once.
type SnapshotKey = (i32, String, i64, i64, String, u32, i64, Vec<(String, String, i64, i64, String)>);

fn snapshot_key(s: &ScopeStatus) -> SnapshotKey {
    let snap = &s.snapshot;
    (
        snap.state,
        snap.incident_id.clone(),
        snap.open_until_unix_ms,
        snap.paused_until_unix_ms,
        snap.pause_reason.clone(),
        snap.trips,
        (snap.ramp_fraction * 20.0).round() as i64,
        snap.pauses.iter().map(|p| (p.level.clone(), p.id.clone(), p.code, p.until_unix_ms, p.lift.clone())).collect(),
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Inner {
    cfg: Config,
    breaker: Breaker,
    redis: bw_common::redis_conn::RedisConn,
    nats: async_nats::Client,
    js: async_nats::jetstream::Context,
    /// The KV buckets (the ledger, for a template release's moves out of the quarantine).
    buckets: bw_common::nats::Buckets,
    /// Which DLQ partition holds each sender's entries.
    send: bw_common::names::SendPartitions,
    scopes_kv: async_nats::jetstream::kv::Store,
    /// Id of this instance in the leader lease.
    instance: String,
    /// Set by `run`; None (never the leader) before.
    leader: OnceLock<leader::Leadership>,
    /// Set when this instance takes the lease: the tick loop rewrites every config and snapshot first.
    resync_due: AtomicBool,
    /// Guards the state-changing admin routes (`operator.token_sha256`); counts its refusals.
    operator: bw_common::admin::OperatorGate,
    limits: RwLock<Arc<Limits>>,
    /// phone_number_id → scope, for every scope known (configured, indexed in Redis, or seen in an event).
    known: RwLock<HashMap<String, Scope>>,
    written: Mutex<HashMap<String, (SnapshotKey, Instant)>>,
    /// The account (app, token) each scope is sent with, as the dispatchers recorded it (`waba:phone` keys).
    accounts: RwLock<HashMap<String, ScopeAccount>>,
    /// The pauses above the numbers (WABA, app, token) by key, read at most once per `parent_refresh_ms`.
    parents: Mutex<HashMap<String, (Instant, Parent, ParentStatus)>>,
    limits_mtime: Mutex<Option<SystemTime>>,
    metrics: metrics::Metrics,
}

/// The coordinator; cheap to clone (admin handlers hold one).
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl Coordinator {
    /// Validates the config and limits and registers the metrics. Writes nothing yet.
    pub fn new(cfg: Config, deps: &Deps) -> anyhow::Result<Coordinator> {
        cfg.check_coordination().map_err(|e| anyhow::anyhow!("invalid config: {e}"))?;
        let operator_hashes = cfg.operator.token_hashes().map_err(|e| anyhow::anyhow!("invalid config: {e}"))?;
        let limits = cfg.initial_limits().map_err(|e| anyhow::anyhow!("invalid limits: {e}"))?;
        let redis = deps.redis.clone().context("the coordinator needs redis")?;
        let mut breaker_cfg = cfg.breaker.clone();
        breaker_cfg.defaults = limits.default.clone();
        let breaker = Breaker::with_conn(Some(redis.clone()), Some(deps.nats.clone()), breaker_cfg);
        let metrics = metrics::Metrics::register(&deps.metrics);
        let refusals = metrics.admin_refusals.clone();
        let operator = bw_common::admin::OperatorGate::new(operator_hashes).on_refusal(move |r| {
            refusals.get_or_create(&vec![("reason".into(), r.label().into())]).inc();
        });
        let known = limits.scopes.iter().map(|(phone, (scope, _))| (phone.clone(), scope.clone())).collect();
        let limits_mtime = Mutex::new(file_mtime(&cfg.coordinator.limits_file));
        Ok(Coordinator {
            inner: Arc::new(Inner {
                breaker,
                redis,
                nats: deps.nats.clone(),
                js: deps.js.clone(),
                buckets: deps.buckets.clone(),
                send: deps.buckets.send,
                scopes_kv: deps.buckets.scopes.clone(),
                instance: instance_id(),
                leader: OnceLock::new(),
                resync_due: AtomicBool::new(false),
                operator,
                limits: RwLock::new(Arc::new(limits)),
                known: RwLock::new(known),
                written: Mutex::new(HashMap::new()),
                accounts: RwLock::new(HashMap::new()),
                parents: Mutex::new(HashMap::new()),
                limits_mtime,
                metrics,
                cfg,
            }),
        })
    }

    /// The breaker handle (for admin calls).
    pub fn breaker(&self) -> &Breaker {
        &self.inner.breaker
    }

    /// Whether this instance holds the leader lease now (only the leader ticks and writes; see [`leader`]).
    pub fn is_leader(&self) -> bool {
        self.inner.leader.get().is_some_and(|l| l.is_leader())
    }

    /// This instance's id in the leader lease (`<HOSTNAME>-<random>`).
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The instance id holding the lease according to NATS (None before `run` or while nobody holds it).
    pub async fn leader_holder(&self) -> Option<String> {
        match self.inner.leader.get() {
            Some(l) => l.holder().await,
            None => None,
        }
    }

    /// The gate of the state-changing admin routes.
    pub fn operator_gate(&self) -> &bw_common::admin::OperatorGate {
        &self.inner.operator
    }

    pub(crate) fn metrics(&self) -> &metrics::Metrics {
        &self.inner.metrics
    }

    fn limits(&self) -> Arc<Limits> {
        self.inner.limits.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every known scope, sorted by phone_number_id.
    pub fn known_scopes(&self) -> Vec<Scope> {
        let mut scopes: Vec<Scope> =
            self.inner.known.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        scopes.sort_by(|a, b| a.phone_number_id.cmp(&b.phone_number_id));
        scopes
    }

    /// The known scope of a phone_number_id.
    pub fn scope(&self, phone_number_id: &str) -> Option<Scope> {
        self.inner.known.read().unwrap_or_else(|p| p.into_inner()).get(phone_number_id).cloned()
    }

    /// Adds a scope; returns true when it was new.
    fn learn(&self, scope: &Scope) -> bool {
        let mut known = self.inner.known.write().unwrap_or_else(|p| p.into_inner());
        if known.contains_key(&scope.phone_number_id) {
            return false;
        }
        known.insert(scope.phone_number_id.clone(), scope.clone());
        true
    }

    /// Writes a scope's effective limits into its Redis config hash (replacing it atomically). Only the
    /// leader writes; on other instances this does nothing.
    async fn write_config(&self, scope: &Scope) -> anyhow::Result<()> {
        if !self.is_leader() {
            return Ok(());
        }
        let limits = self.limits();
        let key = bw_breaker::scripts::cfg_key(scope);
        let fields = limits.for_scope(&scope.phone_number_id).fields();
        let mut conn = self.inner.redis.clone();
        redis::pipe().atomic().del(&key).hset_multiple(&key, &fields).query_async::<()>(&mut conn).await?;
        Ok(())
    }

    async fn write_all_configs(&self) {
        for scope in self.known_scopes() {
            if let Err(e) = self.write_config(&scope).await {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
            }
        }
    }

    /// Re-reads the limits (file or inline config), and on success rewrites every config hash (on the leader;
    /// another instance keeps them for when it leads).
    pub async fn reload(&self) -> Result<usize, String> {
        let result = self.inner.cfg.initial_limits();
        match result {
            Ok(limits) => {
                for (scope, _) in limits.scopes.values() {
                    self.learn(scope);
                }
                let n = limits.scopes.len();
                *self.inner.limits.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(limits);
                self.write_all_configs().await;
                self.inner.metrics.reloads.get_or_create(&vec![("result".into(), "ok".into())]).inc();
                tracing::info!(scopes_with_overrides = n, "limits reloaded");
                Ok(n)
            }
            Err(e) => {
                self.inner.metrics.reloads.get_or_create(&vec![("result".into(), "error".into())]).inc();
                tracing::error!(error = %e, "limits reload rejected; keeping the previous limits");
                Err(e)
            }
        }
    }

    /// The pauses above the number that cover `scope`: its WABA's, and the app's and token's of the account its
    /// dispatchers recorded (none recorded yet: the WABA's alone).
    fn parents_of(&self, scope: &Scope) -> Vec<Parent> {
        let accounts = self.inner.accounts.read().unwrap_or_else(|p| p.into_inner());
        match accounts.get(&scope.index_member()) {
            Some(account) => account.parents(scope),
            None => vec![Parent::Waba(scope.waba_id.clone())],
        }
    }

    /// Reads the pauses above the numbers of `scopes` that were not read within `parent_refresh_ms`
    /// (concurrently, one call per key). A failed read keeps what was known.
    async fn refresh_parents(&self, scopes: &[Scope]) {
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
    fn parent_pauses(&self, scope: &Scope, now_ms: i64) -> Vec<bw_common::proto::ScopePause> {
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
    fn count_pauses(&self, statuses: Vec<ScopeStatus>) {
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
    async fn store(&self, status: &ScopeStatus, force: bool) {
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
    /// data: see [`REDIS_EPOCH_KEY`]).
    pub async fn tick_scope(&self, scope: &Scope, force_store: bool) -> Option<ScopeStatus> {
        let ticked = self.tick_only(scope).await?;
        let status = ticked.0.clone();
        self.store_checked(vec![ticked], force_store).await;
        Some(status)
    }

    /// Ticks one scope; the state and whether a transition happened.
    async fn tick_only(&self, scope: &Scope) -> Option<(ScopeStatus, bool)> {
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
    async fn store_checked(&self, ticked: Vec<(ScopeStatus, bool)>, force_store: bool) {
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
    async fn redis_epoch(&self) -> Option<bool> {
        let mut conn = self.inner.redis.clone();
        let exists: redis::RedisResult<bool> = redis::cmd("EXISTS").arg(REDIS_EPOCH_KEY).query_async(&mut conn).await;
        exists.ok()
    }

    /// Redis answered without the epoch key: it is new or lost its data. Re-applies every FORCED_OPEN the last
    /// snapshots in BW_SCOPES record and Redis no longer has, unless Redis shows a later transition of the scope
    /// (the safe reading: an operator stopped those sends and nothing since says otherwise);
    /// a lost FORCED_CLOSED is only reported (re-applying it would send through failures). Then rewrites every
    /// config hash and sets the epoch key.
    async fn restore_after_redis_loss(&self) {
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
        if let Err(e) = redis::cmd("SET").arg(REDIS_EPOCH_KEY).arg(value).query_async::<()>(&mut conn).await {
            tracing::warn!(error = %e, "cannot set the coordinator epoch in redis; retrying next round");
        }
    }

    /// Every snapshot in BW_SCOPES.
    async fn stored_snapshots(&self) -> anyhow::Result<Vec<bw_common::proto::ScopeSnapshot>> {
        let kv = &self.inner.scopes_kv;
        let keys: Vec<String> = kv.keys().await?.try_collect().await?;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(value) = kv.get(&key).await?
                && let Ok(snapshot) = bw_common::proto::ScopeSnapshot::decode(value.as_ref())
            {
                out.push(snapshot);
            }
        }
        Ok(out)
    }

    /// Learns the scopes that have entries in the DLQ (one stream-info request for the subjects; the first
    /// entry of an unknown sender names its WABA). The Redis scope index can be lost with a Redis master, and a
    /// sender whose messages all wait in the DLQ sends nothing that would index it again: without this its
    /// breaker would never get a snapshot in BW_SCOPES, and replay, which follows the snapshots, would never
    /// drain it.
    async fn discover_dlq(&self) {
        use bw_common::names;
        // Only the leader ticks and writes snapshots; an instance that takes the lease discovers at once.
        if !self.is_leader() {
            return;
        }
        let send = self.inner.send;
        let Ok(counts) = bw_ops::scan::dlq_subject_counts(&self.inner.js, send).await else {
            return;
        };
        let unknown: std::collections::BTreeSet<&str> =
            counts.keys().map(|s| names::phone_of_subject(s)).filter(|p| self.scope(p).is_none()).collect();
        for phone in unknown {
            let (stream, filter) = (send.dlq_stream_of(phone), send.dlq_scope_filter(phone));
            let Ok(Some(first)) = bw_ops::scan::first_message(&self.inner.js, &stream, &filter).await else {
                continue;
            };
            let Ok(envelope) = bw_common::proto::DlqEnvelope::decode(first.payload.as_ref()) else { continue };
            let Some(request) = envelope.request.as_ref() else { continue };
            let scope = Scope::new(request.waba_id.clone(), request.phone_number_id.clone());
            if scope.waba_id.is_empty() || scope.phone_number_id.is_empty() || !self.learn(&scope) {
                continue;
            }
            tracing::info!(phone_number_id = %scope.phone_number_id, "scope learned from its dlq entries");
            if let Err(e) = self.write_config(&scope).await {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
            }
        }
    }

    /// Reads the scope index other services fill (and the account each scope is sent with); writes the config of
    /// newly seen scopes.
    async fn discover(&self) {
        self.discover_dlq().await;
        match self.inner.breaker.scope_accounts().await {
            Ok(accounts) => *self.inner.accounts.write().unwrap_or_else(|p| p.into_inner()) = accounts,
            Err(e) => tracing::debug!(error = %e, "cannot read the scope accounts"),
        }
        let mut conn = self.inner.redis.clone();
        let members: Vec<String> =
            match redis::cmd("SMEMBERS").arg(bw_common::names::SCOPES_INDEX_KEY).query_async(&mut conn).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "cannot read the scope index");
                    return;
                }
            };
        for member in members {
            if let Some(scope) = Scope::from_index_member(&member)
                && self.learn(&scope)
                && let Err(e) = self.write_config(&scope).await
            {
                tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
            }
        }
    }

    /// Handles one transition event published by any instance (each event reaches one coordinator: queue
    /// group). Every instance counts the trips it receives; only the leader writes and ticks.
    async fn on_event(&self, event: BreakerTransition) {
        let Some(s) = event.scope.as_ref() else {
            return;
        };
        let scope = Scope::new(s.waba_id.clone(), s.phone_number_id.clone());
        if scope.waba_id.is_empty() || scope.phone_number_id.is_empty() {
            return;
        }
        if event.to() == BreakerState::Open {
            self.inner.metrics.trips.get_or_create(&vec![("scope".into(), scope.phone_number_id.clone())]).inc();
        }
        if self.learn(&scope)
            && let Err(e) = self.write_config(&scope).await
        {
            tracing::warn!(phone_number_id = %scope.phone_number_id, error = %e, "cannot write scope config");
        }
        if self.is_leader() {
            self.tick_scope(&scope, true).await;
        }
    }

    fn limits_file_changed(&self) -> bool {
        let path = &self.inner.cfg.coordinator.limits_file;
        if path.is_empty() {
            return false;
        }
        let now = file_mtime(path);
        let mut last = lock(&self.inner.limits_mtime);
        if now != *last {
            *last = now;
            true
        } else {
            false
        }
    }

    /// Runs the loops until `shutdown`: the leader lease, the event subscription and the tick loop (which
    /// ticks and writes only while this instance leads). Dropping the returned future stops the loops as a
    /// crash would (the lease is not given back and expires); `shutdown` releases it for a fast hand-over.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let c = &self.inner.cfg.coordinator;
        let leadership = leader::Leadership::open(
            &self.inner.js,
            self.inner.instance.clone(),
            Duration::from_millis(c.leader_lease_ms),
            self.inner.cfg.nats.replicas,
            self.inner.cfg.nats.limits.service_bucket_max_bytes,
        )
        .await?;
        if self.inner.leader.set(leadership).is_err() {
            anyhow::bail!("Coordinator::run called twice on one coordinator");
        }
        let events = self
            .inner
            .nats
            .queue_subscribe(bw_common::names::BREAKER_WILDCARD, EVENTS_QUEUE_GROUP.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("cannot subscribe to breaker events: {e}"))?;
        // The loops stop on `stop`: the shutdown token, or this future dropped (the guard).
        let stop = shutdown.child_token();
        let _guard = stop.clone().drop_guard();
        let tracker = TaskTracker::new();

        let this = self.clone();
        let token = stop.clone();
        let graceful = shutdown.clone();
        tracker.spawn(
            async move {
                let Some(lease) = this.inner.leader.get() else {
                    return;
                };
                let renew = Duration::from_millis(this.inner.cfg.coordinator.leader_renew_ms.max(10));
                let mut every = tokio::time::interval(renew);
                every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = every.tick() => {}
                    }
                    let change = lease.step().await;
                    this.inner.metrics.leader.set(i64::from(lease.is_leader()));
                    match change {
                        leader::Change::Acquired => {
                            tracing::info!(instance = %lease.instance(), "coordinator lease taken: this instance leads");
                            this.inner.metrics.leader_changes.inc();
                            this.inner.resync_due.store(true, Ordering::SeqCst);
                        }
                        leader::Change::Lost => {
                            tracing::warn!(instance = %lease.instance(), "coordinator lease lost: this instance follows");
                            this.inner.metrics.state.clear();
                        }
                        leader::Change::Same => {}
                    }
                }
                if graceful.is_cancelled() {
                    lease.release().await;
                    this.inner.metrics.leader.set(0);
                    tracing::info!(instance = %lease.instance(), "coordinator lease released");
                }
            }
            .instrument(tracing::info_span!("coordinator.lease")),
        );

        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                let mut events = events;
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        msg = events.next() => match msg {
                            Some(msg) => match BreakerTransition::decode(msg.payload.as_ref()) {
                                Ok(event) => this.on_event(event).await,
                                Err(e) => tracing::warn!(subject = %msg.subject, error = %e, "undecodable breaker event"),
                            },
                            None => break,
                        },
                    }
                }
            }
            .instrument(tracing::info_span!("coordinator.events")),
        );

        // Meta's account signals (`account`): every instance binds the one consumer; retried until it runs.
        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                while let Err(e) = this.clone().consume_account_signals(token.clone()).await {
                    tracing::warn!(error = %e, "account signals not consumed yet; retrying");
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
            .instrument(tracing::info_span!("coordinator.account")),
        );

        let this = self.clone();
        let token = stop.clone();
        tracker.spawn(
            async move {
                let c = &this.inner.cfg.coordinator;
                let mut tick = tokio::time::interval(Duration::from_millis(c.tick_ms.max(10)));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut last_discovery = Instant::now();
                let mut last_resync = Instant::now();
                let mut last_poll = Instant::now();
                let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        _ = tick.tick() => {}
                        Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                            tracing::info!("SIGHUP: reloading limits");
                            let _ = this.reload().await;
                            continue;
                        }
                    }
                    if last_poll.elapsed() >= Duration::from_millis(c.limits_poll_ms) {
                        last_poll = Instant::now();
                        if this.limits_file_changed() {
                            tracing::info!(file = %c.limits_file, "limits file changed: reloading");
                            let _ = this.reload().await;
                        }
                    }
                    if last_discovery.elapsed() >= Duration::from_millis(c.scope_discovery_ms) {
                        last_discovery = Instant::now();
                        this.discover().await;
                    }
                    if !this.is_leader() {
                        continue;
                    }
                    if this.inner.resync_due.swap(false, Ordering::SeqCst) {
                        // Just took the lease: what the previous leader wrote may be stale or missing.
                        last_resync = Instant::now();
                        this.discover().await;
                        this.write_all_configs().await;
                        this.tick_all(true).await;
                        continue;
                    }
                    if last_resync.elapsed() >= Duration::from_millis(c.config_resync_ms) {
                        last_resync = Instant::now();
                        this.write_all_configs().await;
                    }
                    this.tick_all(false).await;
                }
            }
            .instrument(tracing::info_span!("coordinator.tick")),
        );

        stop.cancelled().await;
        tracker.close();
        if tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.is_err() {
            tracing::warn!("coordinator tasks did not stop within 5 s");
        }
        Ok(())
    }
}

/// `<HOSTNAME>-<8 random hex>`: the pod name in Kubernetes, unique per process.
fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "coordinator".into());
    let host: String = host.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.').take(63).collect();
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &random[..8])
}

fn file_mtime(path: &str) -> Option<SystemTime> {
    if path.is_empty() {
        return None;
    }
    std::fs::metadata(PathBuf::from(path)).and_then(|m| m.modified()).ok()
}

/// Runs the coordinator: mounts the breaker API on the admin server, then runs the loops until `shutdown`.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    let coordinator = Coordinator::new(cfg, &deps)?;
    deps.admin.mount(admin::router(coordinator.clone()), coordinator.operator_gate().clone());
    deps.health.set_started();
    coordinator.run(shutdown).await
}
