//! The `Coordinator`: its state (config, limits, known scopes, what was written), its construction and
//! accessors, and the limits it writes into each scope's Redis config hash. The tick, snapshot and discovery
//! work are `impl Coordinator` blocks of their own modules (`snapshots.rs`, `loops.rs`), which depend on this one.

use crate::config::{Config, Limits};
use crate::{leader, metrics};
use anyhow::Context as _;
use bw_breaker::{Breaker, Parent, ParentStatus, Scope, ScopeAccount, ScopeStatus};
use bw_common::service::Deps;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;
use tokio::time::Instant;

/// Fields of a snapshot whose change is written to BW_SCOPES at once.
pub(crate) type SnapshotKey = (i32, String, i64, i64, String, u32, i64, Vec<(String, String, i64, i64, String)>);

pub(crate) fn snapshot_key(s: &ScopeStatus) -> SnapshotKey {
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) struct Inner {
    pub(crate) cfg: Config,
    pub(crate) breaker: Breaker,
    pub(crate) redis: bw_common::redis_conn::RedisConn,
    pub(crate) nats: async_nats::Client,
    pub(crate) js: async_nats::jetstream::Context,
    /// The KV buckets (the ledger, for a template release's moves out of the quarantine).
    pub(crate) buckets: bw_common::nats::Buckets,
    /// Which DLQ partition holds each sender's entries.
    pub(crate) send: bw_wire::names::SendPartitions,
    pub(crate) scopes_kv: async_nats::jetstream::kv::Store,
    /// Id of this instance in the leader lease.
    pub(crate) instance: String,
    /// Set by `run`; None (never the leader) before.
    pub(crate) leader: OnceLock<leader::Leadership>,
    /// Set when this instance takes the lease: the tick loop rewrites every config and snapshot first.
    pub(crate) resync_due: AtomicBool,
    /// Guards the state-changing admin routes (`operator.token_sha256`); counts its refusals.
    pub(crate) operator: bw_common::admin::OperatorGate,
    pub(crate) limits: RwLock<Arc<Limits>>,
    /// phone_number_id → scope, for every scope known (configured, indexed in Redis, or seen in an event).
    pub(crate) known: RwLock<HashMap<String, Scope>>,
    pub(crate) written: Mutex<HashMap<String, (SnapshotKey, Instant)>>,
    /// The account (app, token) each scope is sent with, as the dispatchers recorded it (`waba:phone` keys).
    pub(crate) accounts: RwLock<HashMap<String, ScopeAccount>>,
    /// The pauses above the numbers (WABA, app, token) by key, read at most once per `parent_refresh_ms`.
    pub(crate) parents: Mutex<HashMap<String, (Instant, Parent, ParentStatus)>>,
    pub(crate) limits_mtime: Mutex<Option<SystemTime>>,
    pub(crate) metrics: metrics::Metrics,
}

/// The coordinator; cheap to clone (admin handlers hold one).
#[derive(Clone)]
pub struct Coordinator {
    pub(crate) inner: Arc<Inner>,
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
        self.inner.leader.get().is_some_and(|l| l.is_held())
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

    pub(crate) fn limits(&self) -> Arc<Limits> {
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
    pub(crate) fn learn(&self, scope: &Scope) -> bool {
        let mut known = self.inner.known.write().unwrap_or_else(|p| p.into_inner());
        if known.contains_key(&scope.phone_number_id) {
            return false;
        }
        known.insert(scope.phone_number_id.clone(), scope.clone());
        true
    }

    /// Writes a scope's effective limits into its Redis config hash (replacing it atomically). Only the
    /// leader writes; on other instances this does nothing.
    pub(crate) async fn write_config(&self, scope: &Scope) -> anyhow::Result<()> {
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

    pub(crate) async fn write_all_configs(&self) {
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

    pub(crate) fn limits_file_changed(&self) -> bool {
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
}

/// `<HOSTNAME>-<8 random hex>`: the pod name in Kubernetes, unique per process.
pub(crate) fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "coordinator".into());
    let host: String = host.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.').take(63).collect();
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &random[..8])
}

pub(crate) fn file_mtime(path: &str) -> Option<SystemTime> {
    if path.is_empty() {
        return None;
    }
    std::fs::metadata(PathBuf::from(path)).and_then(|m| m.modified()).ok()
}
