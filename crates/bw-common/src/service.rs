//! The one service skeleton every Breakwater binary and `bw-stack` use.
//!
//! A service declares its name, its compiled defaults, its config type (a [`ServiceConfig`], validated one way:
//! [`load_config`]), optional admin routes (mounted on [`Deps::admin`]) and `run(config, deps, shutdown)`.
//!
//! Start-up: parse `--config` → load and validate the config (exit 64 with the reason on an invalid one) →
//! telemetry → connect NATS (and Redis) with bounded retry → ensure the JetStream topology → admin server →
//! `run`.
//!
//! Wind-down, the same for every service ([`run_service`]): on the first SIGTERM/SIGINT readiness turns 503 at
//! once; `run` sees its token cancelled, stops taking new work and settles what is in flight within the
//! service's grace ([`ServiceConfig::shutdown_grace`]); past the grace (plus a margin) the skeleton abandons it
//! (JetStream redelivers whatever was not settled); then NATS is drained (every publish flushed, subscriptions
//! closed) and only then does the admin server stop, so `/readyz` (503) and `/metrics` answer until the end.

use crate::admin::{self, AdminRoutes, Health, MetricsRegistry};
use crate::config::{AdminConfig, ConfigError, NatsConfig, RedisConfig, TelemetryConfig};
use crate::nats::Buckets;
use async_nats::jetstream;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the skeleton waits past a service's grace before it abandons the work still running.
const ABANDON_MARGIN: Duration = Duration::from_secs(2);
/// Bound on draining NATS at the end of the wind-down.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long start-up waits for NATS, Redis and the JetStream topology.
const STARTUP_WAIT: Duration = Duration::from_secs(30);

/// The common sections every service config has, and its validation.
pub trait ServiceConfig: DeserializeOwned + Send + 'static {
    fn nats(&self) -> &NatsConfig;
    /// None for services that never talk to Redis.
    fn redis(&self) -> Option<&RedisConfig>;
    fn admin(&self) -> &AdminConfig;
    fn telemetry(&self) -> &TelemetryConfig;
    /// Checks what the types cannot: relations between fields, ranges. The message names the field.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
    /// How long in-flight work may take to settle after shutdown is asked for.
    fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(10)
    }
    /// Whether `/readyz` fails while Redis does not answer (when [`ServiceConfig::redis`] is set). Ingest says
    /// no: it uses Redis for part of its intake only and must keep receiving Meta's webhooks without it.
    fn readiness_needs_redis(&self) -> bool {
        true
    }
}

/// Loads a service's config (compiled defaults → optional file → `BW_<SERVICE>__*` env) and validates it: the
/// only way any binary, `bw-stack` or test gets a service config.
pub fn load_config<C: ServiceConfig>(
    service: &str,
    defaults: &str,
    file: Option<&Path>,
    env: &HashMap<String, String>,
) -> Result<C, ConfigError> {
    let cfg: C = crate::config::load(service, defaults, file, env)?;
    let partitions = cfg.nats().ledger_partitions;
    if !(1..=bw_wire::names::MAX_LEDGER_PARTITIONS).contains(&partitions) {
        return Err(ConfigError::Invalid(format!(
            "nats.ledger_partitions must be between 1 and {}, got {partitions}",
            bw_wire::names::MAX_LEDGER_PARTITIONS
        )));
    }
    let send = cfg.nats().send_partitions;
    if !(1..=bw_wire::names::MAX_SEND_PARTITIONS).contains(&send) {
        return Err(ConfigError::Invalid(format!(
            "nats.send_partitions must be between 1 and {}, got {send}",
            bw_wire::names::MAX_SEND_PARTITIONS
        )));
    }
    cfg.nats().limits.validate().map_err(ConfigError::Invalid)?;
    cfg.validate().map_err(ConfigError::Invalid)?;
    Ok(cfg)
}

/// Connections and shared handles given to a service's `run`.
#[derive(Clone)]
pub struct Deps {
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub buckets: Buckets,
    pub redis: Option<crate::redis_conn::RedisConn>,
    pub metrics: MetricsRegistry,
    pub health: Arc<Health>,
    /// Service-specific admin routes; mount them once what they need is built.
    pub admin: AdminRoutes,
    /// What NATS refused this service's connection (start-up steps stop on it: [`Deps::startup_step`]).
    pub refusals: crate::nats::Refusals,
}

impl Deps {
    /// Connects NATS (and Redis when configured), ensures the topology, and prepares health and metrics.
    pub async fn connect(
        service: &str,
        nats_cfg: &NatsConfig,
        redis_cfg: Option<&RedisConfig>,
        wait: Duration,
    ) -> anyhow::Result<Deps> {
        let (nats, refusals) = crate::nats::connect_watched(nats_cfg, service, wait).await?;
        let js = jetstream::new(nats.clone());
        // A cluster still electing its JetStream leaders answers API requests with timeouts for a while. The
        // topology's own retry loops stop on a refusal since the same moment as the step does.
        let started = std::time::Instant::now();
        let refused = || refusals.since(started).is_some();
        let buckets = startup_step(&refusals, started, "jetstream topology", wait, || {
            crate::nats::ensure_topology_watched(&js, nats_cfg, &refused)
        })
        .await?;
        let redis = match redis_cfg {
            Some(r) => Some(crate::redis_conn::connect_config(r, wait).await?),
            None => None,
        };
        let health = Health::new(Some(nats.clone()), redis.clone());
        Ok(Deps {
            nats,
            js,
            buckets,
            redis,
            metrics: admin::new_registry(),
            health,
            admin: AdminRoutes::default(),
            refusals,
        })
    }

    /// A start-up step of the service on this connection ([`startup_step`], refusals counted from now).
    pub async fn startup_step<T, E, F, Fut>(&self, what: &str, budget: Duration, step: F) -> anyhow::Result<T>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        startup_step(&self.refusals, std::time::Instant::now(), what, budget, step).await
    }
}

/// Retries a start-up step (creating streams, consumers) every half second until it succeeds or `budget` has
/// passed, then returns its last error: for steps a broker that is still starting (leader elections) fails. It
/// stops at the first failure when NATS refused the connection a permission at or after `started` (retrying
/// cannot grant it), and the error then names the refused subject.
pub async fn startup_step<T, E, F, Fut>(
    refusals: &crate::nats::Refusals,
    started: std::time::Instant,
    what: &str,
    budget: Duration,
    step: F,
) -> anyhow::Result<T>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    retry_unless(what, budget, || refusals.since(started).is_some(), step).await.map_err(|e| {
        match refusals.since(started) {
            Some(refused) => anyhow::anyhow!(
                "{what} failed: {e}; NATS refused this service a permission it needs ({refused}): check the \
                 service's user in accounts.conf (scripts/nats-accounts.sh N for N ledger partitions)"
            ),
            None => anyhow::anyhow!("{what} failed: {e}"),
        }
    })
}

async fn retry_unless<T, E, F, Fut>(what: &str, budget: Duration, stop: impl Fn() -> bool, mut step: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if !stop() && tokio::time::Instant::now() + Duration::from_millis(500) < deadline => {
                tracing::warn!(step = what, error = %e, "start-up step failed; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

#[derive(clap::Parser)]
struct Args {
    /// Path to a TOML config file (layered over the compiled defaults; env BW_<SERVICE>__* wins).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Runs one service from a validated config until `stop` is cancelled, with the shared wind-down (module docs).
/// `bw-stack` runs several of these on one token; each binary's [`main`] runs one.
pub async fn run_service<C, F, Fut>(
    service: &'static str,
    cfg: C,
    run: F,
    stop: CancellationToken,
) -> anyhow::Result<()>
where
    C: ServiceConfig,
    F: FnOnce(C, Deps, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut deps = Deps::connect(service, cfg.nats(), cfg.redis(), STARTUP_WAIT).await?;
    if !cfg.readiness_needs_redis() {
        deps.health = Health::new(Some(deps.nats.clone()), None);
    }
    // The admin server outlives the service's own token: it stops only after the drain below.
    let admin_stop = CancellationToken::new();
    let _admin_guard = admin_stop.clone().drop_guard();
    let addr = admin::serve_with(
        &cfg.admin().listen,
        deps.health.clone(),
        deps.metrics.clone(),
        &deps.admin,
        admin_stop.clone(),
    )
    .await?;
    tracing::info!(service, admin = %addr, "started");
    let health = deps.health.clone();
    let asked = stop.clone();
    let readiness = tokio::spawn(async move {
        asked.cancelled().await;
        health.set_shutting_down();
    });
    let grace = cfg.shutdown_grace();
    let nats = deps.nats.clone();
    let mut work = tokio::spawn(run(cfg, deps.clone(), stop.clone()));
    let result = tokio::select! {
        joined = &mut work => joined.unwrap_or_else(|e| Err(anyhow::anyhow!("service task failed: {e}"))),
        _ = async { stop.cancelled().await; tokio::time::sleep(grace + ABANDON_MARGIN).await } => {
            tracing::warn!(service, grace_ms = grace.as_millis() as u64, "in-flight work did not settle within the grace; JetStream will redeliver it");
            work.abort();
            Ok(())
        }
    };
    // A service that returns on its own (an error) is not ready either while it winds down.
    deps.health.set_shutting_down();
    readiness.abort();
    match tokio::time::timeout(DRAIN_TIMEOUT, nats.drain()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(service, error = %e, "NATS drain failed"),
        Err(_) => tracing::warn!(service, "NATS drain did not finish in time"),
    }
    tracing::info!(service, "stopped");
    result
}

/// Runs a service binary: the whole start-up sequence, [`run_service`], then exit. Never returns. Exit status 64
/// for an invalid config (with the reason on stderr), 1 when the service failed, 0 after a clean stop.
pub fn main<C, F, Fut>(service: &'static str, defaults: &'static str, run: F) -> !
where
    C: ServiceConfig,
    F: FnOnce(C, Deps, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    use clap::Parser;
    let args = Args::parse();
    let cfg: C = match load_config(service, defaults, args.config.as_deref(), &crate::config::process_env()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("bw-{service}: {e}");
            std::process::exit(64);
        }
    };
    crate::crypto::install_crypto();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bw-{service}: cannot start runtime: {e}");
            std::process::exit(70);
        }
    };
    let code = runtime.block_on(async move {
        let _telemetry = crate::telemetry::init(&format!("bw-{service}"), cfg.telemetry());
        let stop = crate::shutdown::signal_token();
        match run_service(service, cfg, run, stop).await {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(service, error = format!("{e:#}"), "service failed");
                1
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::startup_step;
    use crate::nats::Refusals;
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn a_step_that_fails_for_a_while_is_retried_until_it_succeeds() {
        let tries = Cell::new(0);
        let got = startup_step(&Refusals::default(), Instant::now(), "step", Duration::from_secs(5), || async {
            tries.set(tries.get() + 1);
            if tries.get() < 2 { Err("timed out".to_string()) } else { Ok(7) }
        })
        .await;
        assert_eq!((got.ok(), tries.get()), (Some(7), 2));
    }

    #[tokio::test]
    async fn past_the_budget_the_last_error_is_returned() {
        let tries = Cell::new(0);
        let got: anyhow::Result<()> =
            startup_step(&Refusals::default(), Instant::now(), "step", Duration::from_millis(600), || async {
                tries.set(tries.get() + 1);
                Err(format!("try {}", tries.get()))
            })
            .await;
        assert_eq!(got.map_err(|e| e.to_string()), Err("step failed: try 2".to_string()));
    }

    #[tokio::test]
    async fn a_refusal_stops_the_step_at_its_first_failure_and_is_named() {
        let refusals = Refusals::default();
        let tries = Cell::new(0);
        let started = Instant::now();
        let got: anyhow::Result<()> = startup_step(&refusals, started, "step", Duration::from_secs(30), || async {
            tries.set(tries.get() + 1);
            refusals.note("publish to \"$JS.API.STREAM.CREATE.X\"".to_string());
            Err("timed out".to_string())
        })
        .await;
        let error = got.expect_err("refused").to_string();
        assert_eq!(tries.get(), 1, "retried after a refusal: {error}");
        assert!(error.contains("$JS.API.STREAM.CREATE.X") && error.contains("accounts.conf"), "{error}");
    }

    #[tokio::test]
    async fn a_refusal_before_the_step_began_does_not_stop_it() {
        let refusals = Refusals::default();
        refusals.note("publish to \"old\"".to_string());
        // The step's start: the first instant after the refusal (the clock can read the same twice).
        let started = loop {
            let t = Instant::now();
            if refusals.since(t).is_none() {
                break t;
            }
        };
        let tries = Cell::new(0);
        let got = startup_step(&refusals, started, "step", Duration::from_secs(5), || async {
            tries.set(tries.get() + 1);
            if tries.get() < 2 { Err("timed out".to_string()) } else { Ok(()) }
        })
        .await;
        assert!(got.is_ok() && tries.get() == 2);
    }
}
