//! `bw-stack`: every Breakwater service in one process, for local use (production runs each service as its own
//! binary, N copies each). Each service reads its usual config (compiled defaults, then `BW_<SERVICE>__*`
//! environment variables) and serves its own admin port; `--with-simulator` also starts the Meta simulator
//! and points the dispatcher and its webhooks at it. The operator console (`bw-console`) listens on 127.0.0.1:9180
//! unless `BW_CONSOLE__CONSOLE__LISTEN` says otherwise. Stop with SIGTERM or Ctrl-C.
//!
//! Tenancy: the stack runs ingest, the dispatcher and replay in dev mode (`tenancy.mode = "dev"`: the tenant
//! `default` owns every number, nothing to register) unless the environment sets a mode
//! (`BW_INGEST__TENANCY__MODE=registry`, and the same for the dispatcher and replay); it says so at start.
//!
//! Example: `scripts/setup.sh --start && cargo run --release -p bw-stack -- --with-simulator`; add
//! `--otlp http://127.0.0.1:4318/v1/traces` to export traces (to Jaeger, for instance).

use bw_common::service::{Deps, ServiceConfig, load_config, run_service};
use clap::Parser;
use std::collections::HashMap;
use std::future::Future;
use tokio_util::sync::CancellationToken;

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Every Breakwater service in one process (local use)")]
struct Args {
    /// Also run the Meta simulator on this address and aim the dispatcher and its webhooks at it. The simulator
    /// accepts the dispatcher's access token and signs with ingest's app secret, whatever they are set to.
    #[arg(long)]
    with_simulator: bool,
    #[arg(long, default_value = "127.0.0.1:8089")]
    simulator_listen: std::net::SocketAddr,
    /// Export every service's spans (one trace per operation) to this OTLP/HTTP traces endpoint, e.g. Jaeger's
    /// `http://127.0.0.1:4318/v1/traces`. The services share this process, so their spans carry the service
    /// name `bw-stack`; span names (`ingest.intake`, `dispatch`, `meta.send`, `replay.entry`...) tell them apart.
    #[arg(long, value_name = "URL")]
    otlp: Option<String>,
}

/// The services that check senders, by their environment prefix.
const TENANCY_SERVICES: [&str; 3] = ["INGEST", "DISPATCHER", "REPLAY"];

/// Dev mode for every service whose mode the environment does not set; true when any runs in it.
fn dev_mode_unless_set(env: &mut HashMap<String, String>) -> bool {
    let mut dev = false;
    for service in TENANCY_SERVICES {
        let mode = env.entry(format!("BW_{service}__TENANCY__MODE")).or_insert_with(|| "dev".to_string());
        dev |= mode.trim() == "dev";
    }
    dev
}

/// Credentials of the local stack when the environment sets none.
const SIM_TOKEN: &str = "local-access-token";
const SIM_SECRET: &str = "local-app-secret";

fn load<C: ServiceConfig>(service: &str, defaults: &str, env: &HashMap<String, String>) -> anyhow::Result<C> {
    load_config(service, defaults, None, env).map_err(|e| anyhow::anyhow!("bw-{service}: {e}"))
}

/// Starts one service on the shared token through the common skeleton, in `set`.
fn start<C, F, Fut>(
    set: &mut tokio::task::JoinSet<(&'static str, anyhow::Result<()>)>,
    service: &'static str,
    cfg: C,
    run: F,
    token: CancellationToken,
) where
    C: ServiceConfig,
    F: FnOnce(C, Deps, CancellationToken) -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    set.spawn(async move { (service, run_service(service, cfg, run, token).await) });
}

async fn stack(args: Args, token: CancellationToken) -> anyhow::Result<()> {
    let mut env = bw_common::config::process_env();
    if dev_mode_unless_set(&mut env) {
        tracing::warn!(
            "dev mode: any producer may send as any number (set BW_INGEST__TENANCY__MODE, \
             BW_DISPATCHER__TENANCY__MODE and BW_REPLAY__TENANCY__MODE to registry to use the sender registry)"
        );
    }
    let sim = if args.with_simulator {
        // Local credentials unless the environment sets others; the simulator takes whichever the services use.
        for (key, value) in
            [("BW_DISPATCHER__META__ACCESS_TOKEN", SIM_TOKEN), ("BW_INGEST__WEBHOOK__APP_SECRET", SIM_SECRET)]
        {
            env.entry(key.to_string()).or_insert_with(|| value.to_string());
        }
        let ingest: bw_ingest::Config = load("ingest", bw_ingest::DEFAULT_CONFIG, &env)?;
        let dispatcher: bw_dispatcher::Config = load("dispatcher", bw_dispatcher::DEFAULT_CONFIG, &env)?;
        let mut cfg = bw_meta_sim::SimConfig {
            listen: args.simulator_listen,
            access_tokens: vec![dispatcher.meta.access_token.clone()],
            app_secret: ingest.webhook.app_secret.clone(),
            ..Default::default()
        };
        cfg.webhook.url = Some(format!("http://{}{}", ingest.http.listen, ingest.webhook.path));
        let sim = bw_meta_sim::MetaSim::start(cfg).await?;
        tracing::info!(url = %sim.base_url(), "Meta simulator started");
        env.entry("BW_DISPATCHER__META__BASE_URL".to_string()).or_insert(sim.base_url());
        Some(sim)
    } else {
        None
    };
    let mut services = tokio::task::JoinSet::new();
    start(
        &mut services,
        "breaker-coordinator",
        load::<bw_breaker_coordinator::Config>("breaker-coordinator", bw_breaker_coordinator::DEFAULT_CONFIG, &env)?,
        bw_breaker_coordinator::run,
        token.clone(),
    );
    start(
        &mut services,
        "ingest",
        load::<bw_ingest::Config>("ingest", bw_ingest::DEFAULT_CONFIG, &env)?,
        bw_ingest::run,
        token.clone(),
    );
    start(
        &mut services,
        "dispatcher",
        load::<bw_dispatcher::Config>("dispatcher", bw_dispatcher::DEFAULT_CONFIG, &env)?,
        bw_dispatcher::run,
        token.clone(),
    );
    start(
        &mut services,
        "replay",
        load::<bw_replay::Config>("replay", bw_replay::DEFAULT_CONFIG, &env)?,
        bw_replay::run,
        token.clone(),
    );
    start(
        &mut services,
        "alerting",
        load::<bw_alerting::Config>("alerting", bw_alerting::DEFAULT_CONFIG, &env)?,
        bw_alerting::run,
        token.clone(),
    );
    // Local use: the console (on loopback) shows its pages without a key unless the environment says otherwise;
    // acting still needs an operator key (BW_CONSOLE__AUTH__KEYS).
    env.entry("BW_CONSOLE__AUTH__VIEWERS_WITHOUT_KEY".to_string()).or_insert_with(|| "true".to_string());
    let console: bw_console::Config = load("console", bw_console::DEFAULT_CONFIG, &env)?;
    tracing::info!(url = %format!("http://{}/", console.console.listen), "operator console (bw-console)");
    start(&mut services, "console", console, bw_console::run, token.clone());
    tracing::info!("all services running; SIGTERM or Ctrl-C stops them");
    // The first service to end (an error at start-up, say a taken port, or later) stops the others: a stack
    // that went on without one of its services would look up while it is not.
    let mut failed = None;
    while let Some(joined) = services.join_next().await {
        let (service, result) = joined.unwrap_or_else(|e| ("?", Err(anyhow::anyhow!("service task failed: {e}"))));
        match result {
            Ok(()) if token.is_cancelled() => {}
            Ok(()) => failed = failed.or_else(|| Some(anyhow::anyhow!("bw-{service} stopped on its own"))),
            Err(e) => {
                tracing::error!(service, error = format!("{e:#}"), "service failed; stopping the stack");
                failed = failed.or_else(|| Some(e.context(format!("bw-{service}"))));
            }
        }
        token.cancel();
    }
    if let Some(sim) = sim {
        sim.shutdown().await;
    }
    failed.map_or(Ok(()), Err)
}

fn main() {
    let args = Args::parse();
    bw_common::crypto::install_crypto();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = runtime.block_on(async move {
        let telemetry = bw_common::config::TelemetryConfig {
            otlp_endpoint: args.otlp.clone().unwrap_or_default(),
            ..Default::default()
        };
        // Dropped after the services stop: flushes the spans still batched.
        let _telemetry = bw_common::telemetry::init("bw-stack", &telemetry);
        let token = bw_common::shutdown::signal_token();
        match stack(args, token).await {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(error = format!("{e:#}"), "stack failed");
                1
            }
        }
    });
    std::process::exit(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stack_runs_in_dev_mode_unless_the_environment_says_otherwise() {
        let mut env = HashMap::new();
        assert!(dev_mode_unless_set(&mut env));
        for service in ["ingest", "dispatcher", "replay"] {
            let key = format!("BW_{}__TENANCY__MODE", service.to_ascii_uppercase());
            assert_eq!(env.get(&key).map(String::as_str), Some("dev"), "{key}");
        }
        let ingest: bw_ingest::Config = load("ingest", bw_ingest::DEFAULT_CONFIG, &env).expect("ingest loads");
        assert_eq!(ingest.tenancy.mode, bw_wire::tenancy::TenancyMode::Dev);

        let mut env: HashMap<String, String> =
            TENANCY_SERVICES.iter().map(|s| (format!("BW_{s}__TENANCY__MODE"), "registry".to_string())).collect();
        assert!(!dev_mode_unless_set(&mut env), "the environment's mode wins");
        let dispatcher: bw_dispatcher::Config =
            load("dispatcher", bw_dispatcher::DEFAULT_CONFIG, &env).expect("dispatcher loads");
        assert_eq!(dispatcher.tenancy.mode, bw_wire::tenancy::TenancyMode::Registry);
    }

    #[test]
    fn the_console_loads_its_defaults_on_loopback() {
        let console: bw_console::Config =
            load("console", bw_console::DEFAULT_CONFIG, &HashMap::new()).expect("console loads");
        assert!(console.console.listen.starts_with("127.0.0.1:"), "{}", console.console.listen);
    }
}
