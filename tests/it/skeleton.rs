//! The one service skeleton: every binary refuses an invalid config with a clear message and exit status 64
//! (before it touches the network), and the wind-down keeps the admin server answering, `/readyz` 503, until
//! in-flight work has settled and NATS is drained.

use bw_common::config::{AdminConfig, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::service::{Deps, ServiceConfig, run_service};
use bw_testkit::{NatsServer, free_port, wait_until};
use serde::Deserialize;
use std::process::Command;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Invalid settings of each binary, and the words its refusal must contain.
const INVALID: &[(&str, &str, &str, &str)] = &[
    ("dispatcher", "BW_DISPATCHER__DISPATCH__ACK_WAIT_MS", "5000", "ack_wait_ms must exceed meta.request_timeout_ms"),
    ("ingest", "BW_INGEST__WEBHOOK__PATH", "/v1/messages", "webhook.path"),
    ("breaker-coordinator", "BW_BREAKER_COORDINATOR__LIMITS__DEFAULT__FAILURE_THRESHOLD", "1.5", "failure_threshold"),
    ("replay", "BW_REPLAY__REPLAY__RATE_PER_S", "0.0", "replay.rate_per_s"),
    ("alerting", "BW_ALERTING__DISPLAY__TIME_ZONE", "Mars/Olympus_Mons", "Mars/Olympus_Mons"),
    // Checked once for every service (service::load_config), so every binary refuses both ends.
    ("dispatcher", "BW_DISPATCHER__NATS__LEDGER_PARTITIONS", "0", PARTITIONS_OUT_OF_RANGE),
    ("dispatcher", "BW_DISPATCHER__NATS__LEDGER_PARTITIONS", "65", PARTITIONS_OUT_OF_RANGE),
    ("ingest", "BW_INGEST__NATS__LEDGER_PARTITIONS", "0", PARTITIONS_OUT_OF_RANGE),
    ("ingest", "BW_INGEST__NATS__LEDGER_PARTITIONS", "65", PARTITIONS_OUT_OF_RANGE),
    ("breaker-coordinator", "BW_BREAKER_COORDINATOR__NATS__LEDGER_PARTITIONS", "0", PARTITIONS_OUT_OF_RANGE),
    ("breaker-coordinator", "BW_BREAKER_COORDINATOR__NATS__LEDGER_PARTITIONS", "65", PARTITIONS_OUT_OF_RANGE),
    ("replay", "BW_REPLAY__NATS__LEDGER_PARTITIONS", "0", PARTITIONS_OUT_OF_RANGE),
    ("replay", "BW_REPLAY__NATS__LEDGER_PARTITIONS", "65", PARTITIONS_OUT_OF_RANGE),
    ("alerting", "BW_ALERTING__NATS__LEDGER_PARTITIONS", "0", PARTITIONS_OUT_OF_RANGE),
    ("alerting", "BW_ALERTING__NATS__LEDGER_PARTITIONS", "65", PARTITIONS_OUT_OF_RANGE),
];
const PARTITIONS_OUT_OF_RANGE: &str = "nats.ledger_partitions must be between 1 and 64";

#[test]
fn every_binary_refuses_an_invalid_config_with_status_64_and_the_reason() {
    let bin_dir = bw_drill::stack::bin_dir();
    for (service, key, value, expect) in INVALID {
        let bin = bin_dir.join(format!("bw-{service}"));
        assert!(bin.exists(), "{} missing: scripts/test.sh builds the binaries first", bin.display());
        // NATS on a port nothing listens on: an invalid config must be refused before any connection attempt.
        let nats_key = format!("BW_{}__NATS__URL", service.to_ascii_uppercase().replace('-', "_"));
        let out = Command::new(&bin)
            .env(key, value)
            .env(nats_key, format!("nats://127.0.0.1:{}", free_port()))
            .output()
            .expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "bw-{service} with {key}={value}: {stderr}");
        assert!(stderr.contains("invalid configuration"), "bw-{service}: {stderr}");
        assert!(stderr.contains(expect), "bw-{service} should name `{expect}`: {stderr}");
        // And an unknown key is refused by name, never ignored.
        let typo = format!("BW_{}__ADMIN__LISTN", service.to_ascii_uppercase().replace('-', "_"));
        let out = Command::new(&bin).env(&typo, "x").output().expect("binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "bw-{service} with {typo}: {stderr}");
        assert!(stderr.contains("listn"), "bw-{service} should name the unknown key: {stderr}");
    }
}

#[test]
fn a_secret_that_looks_like_a_number_is_text_and_never_printed() {
    let bin = bw_drill::stack::bin_dir().join("bw-ingest");
    // A valid numeric verify token is accepted as text: ingest gets past config loading and fails only on the
    // unreachable NATS (exit 1), never on the token, and never prints it.
    let out = Command::new(&bin)
        .env("BW_INGEST__WEBHOOK__VERIFY_TOKEN", "8675309123")
        .env("BW_INGEST__WEBHOOK__APP_SECRET", "4242424242")
        .env("BW_INGEST__NATS__URL", format!("nats://127.0.0.1:{}", free_port()))
        .output()
        .expect("binary runs");
    let all = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_ne!(out.status.code(), Some(64), "a numeric token is a valid token: {all}");
    assert!(!all.contains("8675309123") && !all.contains("4242424242"), "a secret was printed: {all}");
}

/// A minimal service config for driving the skeleton directly.
#[derive(Deserialize)]
struct ProbeConfig {
    nats: NatsConfig,
    admin: AdminConfig,
    #[serde(default)]
    telemetry: TelemetryConfig,
}

impl ServiceConfig for ProbeConfig {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&RedisConfig> {
        None
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn shutdown_grace(&self) -> Duration {
        Duration::from_secs(60)
    }
}

/// `bw-stack` runs every service in one process. One that cannot start (here ingest, whose admin port another
/// listener holds) stops the whole stack with exit status 1 and its name in the log: the stack never goes on
/// without it, looking up while its intake is missing.
#[tokio::test]
async fn the_local_stack_stops_with_the_service_that_could_not_start() {
    let nats = NatsServer::start();
    let redis = bw_testkit::RedisServer::start();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_addr = taken.local_addr().expect("addr").to_string();
    let log_path = nats.dir().join("bw-stack.log");
    let child = crate::stack_command(&nats.url(), &redis.url(), &taken_addr, &log_path).spawn().expect("bw-stack runs");
    let child = std::sync::Mutex::new(child);
    let exited = || child.lock().expect("lock").try_wait().ok().flatten();
    // Before the fix the stack ran on without ingest until stopped: bounded here, never a hang.
    let stopped = wait_until(Duration::from_secs(60), || async { exited().is_some() }).await;
    let mut child = child.into_inner().expect("lock");
    if !stopped {
        let _ = child.kill();
    }
    let status = child.wait().expect("exit status");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(stopped, "bw-stack went on without ingest: {log}");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("service failed; stopping the stack"), "{log}");
    assert!(log.contains("bw-ingest") && log.contains("cannot bind admin server"), "{log}");
    drop(taken);
}

async fn status(client: &reqwest::Client, url: &str) -> Option<u16> {
    client.get(url).timeout(Duration::from_secs(2)).send().await.ok().map(|r| r.status().as_u16())
}

#[tokio::test]
async fn readiness_turns_503_at_once_and_the_admin_server_answers_until_the_work_has_settled() {
    let nats = NatsServer::start();
    let port = free_port();
    let cfg: ProbeConfig = bw_common::service::load_config(
        "probe",
        &format!("[nats]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\n", nats.url()),
        None,
        &Default::default(),
    )
    .expect("probe config");
    let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = CancellationToken::new();
    let service = tokio::spawn(run_service(
        "probe",
        cfg,
        move |_cfg: ProbeConfig, deps: Deps, shutdown: CancellationToken| async move {
            deps.health.set_started();
            shutdown.cancelled().await;
            // In-flight work that takes a while to settle after the signal.
            let _ = draining_tx.send(());
            let _ = release_rx.await;
            Ok(())
        },
        stop.clone(),
    ));
    bw_common::crypto::install_crypto();
    let client = reqwest::Client::new();
    let (readyz, metrics) = (format!("http://127.0.0.1:{port}/readyz"), format!("http://127.0.0.1:{port}/metrics"));
    assert!(
        wait_until(Duration::from_secs(30), || async { status(&client, &readyz).await == Some(200) }).await,
        "the probe service never became ready"
    );

    stop.cancel();
    draining_rx.await.expect("the service saw the shutdown");
    assert!(
        wait_until(Duration::from_secs(10), || async { status(&client, &readyz).await == Some(503) }).await,
        "readiness did not turn 503 during the drain"
    );
    assert_eq!(status(&client, &metrics).await, Some(200), "/metrics must answer during the drain");
    assert!(!service.is_finished(), "the skeleton returned before the work settled");

    release_tx.send(()).expect("service still waiting");
    service.await.expect("joined").expect("clean stop");
    assert_eq!(status(&client, &readyz).await, None, "the admin server stops once the wind-down is over");
}
