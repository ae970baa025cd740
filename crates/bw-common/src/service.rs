//! The start-up sequence shared by every service binary, and the [`Deps`] handed to `run`.
//!
//! `main` → parse `--config` → load config (exit 64 on error) → telemetry → connect NATS (and Redis) with
//! bounded retry → ensure the JetStream topology → admin server → `run(cfg, deps, token)` → flush telemetry.

use crate::admin::{self, Health, MetricsRegistry};
use crate::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use crate::nats::Buckets;
use async_nats::jetstream;
use serde::de::DeserializeOwned;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The common sections every service config has.
pub trait ServiceConfig: DeserializeOwned + Send + 'static {
    fn nats(&self) -> &NatsConfig;
    /// None for services that never talk to Redis.
    fn redis(&self) -> Option<&RedisConfig>;
    fn admin(&self) -> &AdminConfig;
    fn telemetry(&self) -> &TelemetryConfig;
}

/// Connections and shared handles given to a service's `run`.
#[derive(Clone)]
pub struct Deps {
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub buckets: Buckets,
    pub redis: Option<redis::aio::ConnectionManager>,
    pub metrics: MetricsRegistry,
    pub health: Arc<Health>,
}

impl Deps {
    /// Connects NATS (and Redis when configured), ensures the topology, and prepares health and metrics.
    pub async fn connect(
        service: &str,
        nats_cfg: &NatsConfig,
        redis_cfg: Option<&RedisConfig>,
        wait: Duration,
    ) -> anyhow::Result<Deps> {
        let nats = crate::nats::connect(nats_cfg, service, wait).await?;
        let js = jetstream::new(nats.clone());
        // A cluster still electing its JetStream leaders answers API requests with timeouts for a while.
        let buckets =
            retry_during_startup("jetstream topology", wait, || crate::nats::ensure_topology(&js, nats_cfg)).await?;
        let redis = match redis_cfg {
            Some(r) => Some(crate::redis_conn::connect(&r.url, Duration::from_millis(r.timeout_ms), wait).await?),
            None => None,
        };
        let health = Health::new(Some(nats.clone()), redis.clone());
        Ok(Deps { nats, js, buckets, redis, metrics: admin::new_registry(), health })
    }
}

/// Retries a start-up step (creating streams, consumers) every half second until it succeeds or `budget` has
/// passed, then returns its last error. For steps a broker that is still starting (leader elections) fails.
pub async fn retry_during_startup<T, E, F, Fut>(what: &str, budget: Duration, mut step: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match step().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() + Duration::from_millis(500) < deadline => {
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

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs a service binary: the whole start-up sequence, then `run`, then shutdown. Never returns.
pub fn main<C, F, Fut>(service: &'static str, defaults: &'static str, run: F) -> !
where
    C: ServiceConfig,
    F: FnOnce(C, Deps, CancellationToken) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    use clap::Parser;
    let args = Args::parse();
    let cfg: C = match crate::config::load(service, defaults, args.config.as_deref(), &crate::config::process_env()) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("bw-{service}: {e}");
            std::process::exit(64);
        }
    };
    install_crypto();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bw-{service}: cannot start runtime: {e}");
            std::process::exit(70);
        }
    };
    let code = runtime.block_on(async move {
        let _telemetry = crate::telemetry::init(&format!("bw-{service}"), cfg.telemetry());
        let token = crate::shutdown::signal_token();
        let result = async {
            let deps = Deps::connect(service, cfg.nats(), cfg.redis(), Duration::from_secs(30)).await?;
            let addr =
                admin::serve(&cfg.admin().listen, deps.health.clone(), deps.metrics.clone(), None, token.clone())
                    .await?;
            tracing::info!(service, admin = %addr, "started");
            run(cfg, deps, token.clone()).await
        }
        .await;
        match result {
            Ok(()) => {
                tracing::info!(service, "stopped");
                0
            }
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
    use super::retry_during_startup;
    use std::cell::Cell;
    use std::time::Duration;

    #[tokio::test]
    async fn a_step_that_fails_for_a_while_is_retried_until_it_succeeds() {
        let tries = Cell::new(0);
        let got: Result<u32, String> = retry_during_startup("step", Duration::from_secs(5), || async {
            tries.set(tries.get() + 1);
            if tries.get() < 2 { Err("timed out".to_string()) } else { Ok(7) }
        })
        .await;
        assert_eq!((got, tries.get()), (Ok(7), 2));
    }

    #[tokio::test]
    async fn past_the_budget_the_last_error_is_returned() {
        let tries = Cell::new(0);
        let got: Result<(), String> = retry_during_startup("step", Duration::from_millis(600), || async {
            tries.set(tries.get() + 1);
            Err(format!("try {}", tries.get()))
        })
        .await;
        assert_eq!(got, Err("try 2".to_string()));
    }
}
