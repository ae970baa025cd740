//! `bw-breaker-coordinator` binary: the shared start-up sequence around [`bw_breaker_coordinator::run`], which
//! mounts its admin API on the admin server itself (so this main does not start one).

use bw_breaker_coordinator::{Config, DEFAULT_CONFIG};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

const SERVICE: &str = "breaker-coordinator";

#[derive(Parser)]
struct Args {
    /// Path to a TOML config file (layered over the compiled defaults; env BW_BREAKER_COORDINATOR__* wins).
    #[arg(long)]
    config: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let env = bw_common::config::process_env();
    let cfg: Config = match bw_common::config::load(SERVICE, DEFAULT_CONFIG, args.config.as_deref(), &env) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("bw-{SERVICE}: {e}");
            std::process::exit(64);
        }
    };
    if let Err(e) = cfg.initial_limits() {
        eprintln!("bw-{SERVICE}: invalid limits: {e}");
        std::process::exit(64);
    }
    bw_common::service::install_crypto();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bw-{SERVICE}: cannot start runtime: {e}");
            std::process::exit(70);
        }
    };
    let code = runtime.block_on(async move {
        let _telemetry = bw_common::telemetry::init(&format!("bw-{SERVICE}"), &cfg.telemetry);
        let token = bw_common::shutdown::signal_token();
        let wait = Duration::from_secs(30);
        let result = async {
            let deps = bw_common::service::Deps::connect(SERVICE, &cfg.nats, Some(&cfg.redis), wait).await?;
            bw_breaker_coordinator::run(cfg, deps, token.clone()).await
        }
        .await;
        match result {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(service = SERVICE, error = format!("{e:#}"), "service failed");
                1
            }
        }
    });
    runtime.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code)
}
