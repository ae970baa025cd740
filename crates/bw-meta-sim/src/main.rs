//! `bw-meta-sim`: the Meta Cloud API simulator as a process, for benchmarks and the demo drill.
//!
//! `bw-meta-sim [--config sim.toml] [--listen 127.0.0.1:8089]
//! [--scenario flash-sale-outage|mixed-ambiguous|error-codes|account-signals|<file.toml>]
//! [--webhook-url URL] [--app-secret S]
//! [--token T]... [--no-limits] [--dump-path oracle.json]`
//! Flags override the config file. On SIGINT/SIGTERM it stops and writes the oracle dump when a path is set.

use bw_meta_sim::{MetaSim, Scenario, SimConfig};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "bw-meta-sim", about = "Meta WhatsApp Cloud API simulator")]
struct Args {
    /// TOML config (see the crate docs for fields).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// `flash-sale-outage`, `mixed-ambiguous`, `error-codes`, `account-signals`, `normal`, or a scenario TOML file.
    #[arg(long)]
    scenario: Option<String>,
    /// Where status webhooks are POSTed.
    #[arg(long)]
    webhook_url: Option<String>,
    /// Secret for X-Hub-Signature-256.
    #[arg(long, env = "BW_META_SIM_APP_SECRET", hide_env_values = true)]
    app_secret: Option<String>,
    /// Accepted bearer token (repeatable; comma-separated in the env var).
    #[arg(long = "token", env = "BW_META_SIM_TOKENS", value_delimiter = ',', hide_env_values = true)]
    tokens: Vec<String>,
    /// Disable every limit (throughput, pair, app, WABA).
    #[arg(long)]
    no_limits: bool,
    /// Oracle dump written on shutdown.
    #[arg(long)]
    dump_path: Option<PathBuf>,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let cfg = match build_config(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("bw-meta-sim: invalid configuration: {e:#}");
            std::process::exit(64);
        }
    };
    let sim = match MetaSim::start(cfg).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("bw-meta-sim: cannot start: {e:#}");
            std::process::exit(1);
        }
    };
    println!("bw-meta-sim listening on {}", sim.base_url());
    wait_for_signal().await;
    tracing::info!("shutting down");
    sim.shutdown().await;
}

fn build_config(args: Args) -> anyhow::Result<SimConfig> {
    let mut cfg = match &args.config {
        Some(path) => SimConfig::from_toml(&std::fs::read_to_string(path)?)?,
        None => SimConfig { listen: SocketAddr::from(([127, 0, 0, 1], 8089)), ..SimConfig::default() },
    };
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(s) = &args.scenario {
        cfg.scenario = Some(Scenario::load(s)?);
    }
    if let Some(u) = args.webhook_url {
        cfg.webhook.url = Some(u);
    }
    if let Some(s) = args.app_secret {
        cfg.app_secret = s;
    }
    if !args.tokens.is_empty() {
        cfg.access_tokens = args.tokens;
    }
    if args.no_limits {
        cfg.limits.enabled = false;
    }
    if let Some(p) = args.dump_path {
        cfg.dump_path = Some(p);
    }
    cfg.validate()?;
    Ok(cfg)
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
