//! A real stack in an outage for the console's tests: nats-server and redis-server (bw-testkit), the Meta
//! simulator failing every call with a 503, ingest, the breaker-coordinator and a dispatcher (the breaker trips
//! on the error rate and stays OPEN: cooldowns of an hour), and the console. No replay service runs, so the DLQ
//! holds its entries until the operator acts in the console.

#![allow(dead_code, unreachable_pub)]

pub mod cdp;

use bw_e2e::Harness;
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, SimConfig, Window};
use bw_proto::v1::OperationState;
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const PHONE: &str = "106540352249001";
/// The console key of the operator the tests sign in as.
pub const OPERATOR_KEY: &str = "console-test-operator-key-7f3a";
/// The coordinator's operator token the console holds.
pub const COORDINATOR_TOKEN: &str = "coordinator-test-token-91bd";
pub const WAIT: Duration = Duration::from_secs(60);

pub fn sha256_hex(s: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

pub struct Stack {
    pub h: Harness,
    pub console: String,
    pub ops: Vec<String>,
    /// The operations that went to the DLQ under the breaker's incident.
    pub incident_ops: Vec<String>,
    pub incident: String,
    pub console_stop: CancellationToken,
    pub console_task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    coordinator_stop: CancellationToken,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.console_stop.cancel();
        self.coordinator_stop.cancel();
    }
}

fn meta_down() -> Scenario {
    Scenario {
        name: "meta-down".into(),
        seed: Some(7),
        selection: Selection::Deterministic,
        windows: vec![Window {
            name: "down".into(),
            start_ms: 0,
            duration_ms: None,
            error_rate: 1.0,
            faults: vec![Fault {
                kind: FaultKind::Http { status: 503, meta_body: true, code: None, after_processing: false },
                weight: 1,
            }],
            latency: None,
            phone_number_ids: vec![],
        }],
        ..Scenario::default()
    }
}

/// The recipient of order `i` (bw_e2e::order), digits only: what no page may show.
pub fn recipient_digits(i: usize) -> String {
    format!("5491{i:09}")
}

/// Starts the stack, runs the outage with `n` orders until each is in the DLQ, and starts the console.
pub async fn outage(n: usize) -> Stack {
    let mut h = Harness::start(SimConfig::default()).await;
    h.sim.set_scenario(meta_down());
    let long = |prefix: &str| {
        let mut v = bw_e2e::FastBreaker::default().settings(prefix);
        for (k, val) in v.iter_mut() {
            if k.ends_with(".cooldown_ms") || k.ends_with(".cooldown_max_ms") {
                *val = "3600000".into();
            }
        }
        v
    };
    let coordinator_admin = format!("127.0.0.1:{}", bw_testkit::free_port());
    let mut coordinator = long("limits.default");
    coordinator.push(("admin.listen".into(), coordinator_admin.clone()));
    coordinator.push(("operator.token_sha256".into(), sha256_hex(COORDINATOR_TOKEN)));
    h.start_ingest(&[]).await;
    // Through the services' common skeleton, as bw-stack runs it: that serves the coordinator's admin API, where
    // the console's breaker actions go.
    let mut pairs: Vec<(String, String)> = vec![
        ("nats.url".into(), h.nats.url()),
        ("redis.url".into(), h.redis.url()),
        ("coordinator.tick_ms".into(), "100".into()),
        ("coordinator.scope_discovery_ms".into(), "200".into()),
        ("coordinator.snapshot_refresh_ms".into(), "500".into()),
    ];
    pairs.extend(coordinator);
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("BW_BREAKER_COORDINATOR__{}", k.to_ascii_uppercase().replace('.', "__")), v.clone()))
        .collect();
    let cfg = bw_breaker_coordinator::Config::load(None, &env).expect("coordinator config");
    let coordinator_stop = CancellationToken::new();
    tokio::spawn(bw_common::service::run_service(
        "breaker-coordinator",
        cfg,
        bw_breaker_coordinator::run,
        coordinator_stop.clone(),
    ));
    h.start_dispatcher(&bw_e2e::pairs(&long("breaker.defaults"))).await;
    let ops = h.submit_orders(PHONE, "outage", n).await;
    assert!(h.wait_all(&ops, &[OperationState::Dlq], WAIT).await, "every order ends in the DLQ during the outage");
    let mut incident = String::new();
    let mut incident_ops = Vec::new();
    for op in &ops {
        let e = h.ledger_entry(op).await.expect("ledger").entry;
        if !e.incident_id.is_empty() {
            incident = e.incident_id.clone();
            incident_ops.push(op.clone());
        }
    }
    assert!(!incident_ops.is_empty(), "orders refused while OPEN carry the incident");
    // Meta is back; the breaker stays OPEN (an hour's cooldown) until the operator resets it.
    h.sim.clear_scenario();

    let port = bw_testkit::free_port();
    let pairs: Vec<(&str, String)> = vec![
        ("nats.url", h.nats.url()),
        ("redis.url", h.redis.url()),
        ("admin.listen", "127.0.0.1:0".into()),
        ("console.listen", format!("127.0.0.1:{port}")),
        ("console.coordinator_url", format!("http://{coordinator_admin}")),
        ("console.operator_token", COORDINATOR_TOKEN.into()),
        ("auth.viewers_without_key", "true".into()),
        ("auth.keys", format!(r#"[{{ name = "alice", sha256 = "{}", role = "operator" }}]"#, sha256_hex(OPERATOR_KEY))),
    ];
    let env: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (format!("BW_CONSOLE__{}", k.to_ascii_uppercase().replace('.', "__")), v.clone()))
        .collect();
    let cfg: bw_console::Config =
        bw_common::service::load_config("console", bw_console::DEFAULT_CONFIG, None, &env).expect("console config");
    let deps = bw_common::service::Deps::connect("console", &cfg.nats, Some(&cfg.redis), Duration::from_secs(10))
        .await
        .expect("console deps");
    let console_stop = CancellationToken::new();
    let console_task = Some(tokio::spawn(bw_console::run(cfg, deps, console_stop.clone())));
    let console = format!("http://127.0.0.1:{port}");
    let up = bw_testkit::wait_until(WAIT, || async {
        reqwest::get(format!("{console}/login")).await.is_ok_and(|r| r.status().is_success())
    })
    .await;
    assert!(up, "the console serves");
    Stack { h, console, ops, incident_ops, incident, console_stop, console_task, coordinator_stop }
}
