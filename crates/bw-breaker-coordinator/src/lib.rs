//! Breakwater breaker-coordinator: the authority for per-scope breaker and rate-limit config, and the keeper of
//! every scope's current state.
//!
//! It writes each scope's config hash into Redis (from its config or a hot-reloaded limits file), ticks every
//! known scope so an OPEN breaker moves to HALF_OPEN when its cooldown ends even without traffic, keeps the
//! current `ScopeSnapshot` of every scope in the KV bucket BW_SCOPES, counts trips from the transition events
//! every instance publishes on `bw.breaker.v1.*`, and serves the admin API (list, force open/closed, clear,
//! reset, reload) on the admin port. Any number of coordinators may run: the scripts decide every transition,
//! so ticks are idempotent, and the event subscription is a queue group.
//!
//! What it must not do: change breaker state other than through the `bw-breaker` scripts. Entry point: [`run`].

pub mod admin;
pub mod config;
mod metrics;

pub use config::Config;

use anyhow::Context as _;
use bw_breaker::{Breaker, Scope, ScopeStatus};
use bw_common::proto::{BreakerState, BreakerTransition};
use bw_common::service::Deps;
use config::Limits;
use futures::StreamExt;
use prost::Message as _;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Queue group of coordinators on the breaker events.
const EVENTS_QUEUE_GROUP: &str = "bw-breaker-coordinator";

/// Fields of a snapshot whose change is written to BW_SCOPES at once.
type SnapshotKey = (i32, String, i64, i64, String, u32, i64);

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
    )
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Inner {
    cfg: Config,
    breaker: Breaker,
    redis: redis::aio::ConnectionManager,
    nats: async_nats::Client,
    scopes_kv: async_nats::jetstream::kv::Store,
    limits: RwLock<Arc<Limits>>,
    /// phone_number_id → scope, for every scope known (configured, indexed in Redis, or seen in an event).
    known: RwLock<HashMap<String, Scope>>,
    written: Mutex<HashMap<String, (SnapshotKey, Instant)>>,
    limits_mtime: Mutex<Option<SystemTime>>,
    metrics: metrics::Metrics,
}

/// The coordinator; cheap to clone (admin handlers hold one).
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

impl Coordinator {
    /// Validates the limits and registers the metrics. Writes nothing yet.
    pub fn new(cfg: Config, deps: &Deps) -> anyhow::Result<Coordinator> {
        let limits = cfg.initial_limits().map_err(|e| anyhow::anyhow!("invalid limits: {e}"))?;
        let redis = deps.redis.clone().context("the coordinator needs redis")?;
        let mut breaker_cfg = cfg.breaker.clone();
        breaker_cfg.defaults = limits.default.clone();
        let breaker = Breaker::new(Some(redis.clone()), Some(deps.nats.clone()), breaker_cfg);
        let metrics = metrics::Metrics::register(&deps.metrics);
        let known = limits.scopes.iter().map(|(phone, (scope, _))| (phone.clone(), scope.clone())).collect();
        let limits_mtime = Mutex::new(file_mtime(&cfg.coordinator.limits_file));
        Ok(Coordinator {
            inner: Arc::new(Inner {
                breaker,
                redis,
                nats: deps.nats.clone(),
                scopes_kv: deps.buckets.scopes.clone(),
                limits: RwLock::new(Arc::new(limits)),
                known: RwLock::new(known),
                written: Mutex::new(HashMap::new()),
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

    /// Writes a scope's effective limits into its Redis config hash (replacing it atomically).
    async fn write_config(&self, scope: &Scope) -> anyhow::Result<()> {
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

    /// Re-reads the limits (file or inline config), and on success rewrites every config hash.
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

    /// Records the state of a scope: gauge, and BW_SCOPES when something significant changed or it is old.
    async fn store(&self, status: &ScopeStatus, force: bool) {
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

    /// Ticks one scope (cooldown → HALF_OPEN) and stores its state.
    pub async fn tick_scope(&self, scope: &Scope, force_store: bool) -> Option<ScopeStatus> {
        match self.inner.breaker.tick(scope).await {
            Ok((status, transitions)) => {
                self.store(&status, force_store || !transitions.is_empty()).await;
                Some(status)
            }
            Err(e) => {
                tracing::debug!(phone_number_id = %scope.phone_number_id, error = %e, "tick failed");
                None
            }
        }
    }

    async fn tick_all(&self) {
        let scopes = self.known_scopes();
        let concurrency = self.inner.cfg.coordinator.tick_concurrency.max(1);
        futures::stream::iter(scopes)
            .for_each_concurrent(concurrency, |scope| async move {
                self.tick_scope(&scope, false).await;
            })
            .await;
        self.inner.metrics.ticks.inc();
    }

    /// Reads the scope index other services fill; writes the config of newly seen scopes.
    async fn discover(&self) {
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

    /// Handles one transition event published by any instance.
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
        self.tick_scope(&scope, true).await;
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

    /// Runs the loops until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        self.write_all_configs().await;
        self.discover().await;
        let events = self
            .inner
            .nats
            .queue_subscribe("bw.breaker.v1.*", EVENTS_QUEUE_GROUP.to_string())
            .await
            .map_err(|e| anyhow::anyhow!("cannot subscribe to breaker events: {e}"))?;
        let tracker = TaskTracker::new();

        let this = self.clone();
        let token = shutdown.clone();
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

        let this = self.clone();
        let token = shutdown.clone();
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
                    if last_resync.elapsed() >= Duration::from_millis(c.config_resync_ms) {
                        last_resync = Instant::now();
                        this.write_all_configs().await;
                    }
                    this.tick_all().await;
                }
            }
            .instrument(tracing::info_span!("coordinator.tick")),
        );

        shutdown.cancelled().await;
        tracker.close();
        if tokio::time::timeout(Duration::from_secs(5), tracker.wait()).await.is_err() {
            tracing::warn!("coordinator tasks did not stop within 5 s");
        }
        Ok(())
    }
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
    deps.admin.mount(admin::router(coordinator.clone()));
    deps.health.set_started();
    coordinator.run(shutdown).await
}
