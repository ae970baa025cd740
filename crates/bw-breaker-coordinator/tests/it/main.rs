//! Coordinator tests against a real nats-server (JetStream) and redis-server: cooldown → HALF_OPEN without
//! traffic, snapshots in BW_SCOPES, transition events, config hashes, discovery, reload, admin API.

use bw_breaker::{AdmitItem, Breaker, BreakerConfig, OutcomeItem, OutcomeKind, Scope, TrafficClass};
use bw_breaker_coordinator::{Config, Coordinator, DEFAULT_CONFIG};
use bw_common::proto::{BreakerState, BreakerTransition, ScopeSnapshot};
use futures::StreamExt;
use prost::Message as _;
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(15);

fn limits_text(rate: f64) -> String {
    format!(
        "[limits.default]\nmin_calls = 4\nfailure_threshold = 0.5\ncooldown_ms = 400\ncooldown_jitter = 0.0\n\
         [limits.scopes.\"5551\"]\nwaba_id = \"w1\"\nrate_per_s = {rate}\n"
    )
}

struct Harness {
    _nats: bw_testkit::NatsServer,
    _redis: bw_testkit::RedisServer,
    _dir: tempfile::TempDir,
    limits_path: std::path::PathBuf,
    deps: bw_common::service::Deps,
    admin: String,
    token: CancellationToken,
    redis: redis::aio::ConnectionManager,
}

async fn start() -> Harness {
    bw_common::service::install_crypto();
    let nats = bw_testkit::NatsServer::start();
    let redis = bw_testkit::RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let limits_path = dir.path().join("limits.toml");
    std::fs::write(&limits_path, limits_text(7.0)).expect("write limits");
    let file = dir.path().join("coordinator.toml");
    std::fs::write(
        &file,
        format!(
            "[nats]\nurl = \"{}\"\n[redis]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n\
             [coordinator]\ntick_ms = 50\nscope_discovery_ms = 100\nlimits_file = \"{}\"\nlimits_poll_ms = 100\n",
            nats.url(),
            redis.url(),
            limits_path.display()
        ),
    )
    .expect("write config");
    let cfg: Config =
        bw_common::config::load("breaker-coordinator", DEFAULT_CONFIG, Some(&file), &HashMap::new()).expect("config");
    let deps = bw_common::service::Deps::connect("breaker-coordinator", &cfg.nats, Some(&cfg.redis), WAIT)
        .await
        .expect("deps");
    let coordinator = Coordinator::new(cfg, &deps).expect("coordinator");
    let token = CancellationToken::new();
    let addr = bw_common::admin::serve(
        "127.0.0.1:0",
        deps.health.clone(),
        deps.metrics.clone(),
        Some(bw_breaker_coordinator::admin::router(coordinator.clone())),
        token.clone(),
    )
    .await
    .expect("admin");
    tokio::spawn(coordinator.run(token.clone()));
    let conn = deps.redis.clone().expect("redis");
    Harness {
        _nats: nats,
        _redis: redis,
        _dir: dir,
        limits_path,
        deps,
        admin: format!("http://{addr}"),
        token,
        redis: conn,
    }
}

impl Harness {
    /// A dispatcher-like breaker with the library's compiled defaults (min_calls 50): the coordinator's config
    /// hash must be what makes 4 calls enough to trip.
    fn client(&self) -> Breaker {
        Breaker::new(self.deps.redis.clone(), Some(self.deps.nats.clone()), BreakerConfig::default())
    }

    async fn cfg_field(&self, scope: &Scope, field: &str) -> Option<String> {
        let mut conn = self.redis.clone();
        redis::cmd("HGET").arg(bw_breaker::scripts::cfg_key(scope)).arg(field).query_async(&mut conn).await.ok()?
    }

    async fn kv_state(&self, phone: &str) -> Option<ScopeSnapshot> {
        let entry = self.deps.buckets.scopes.get(phone).await.ok()??;
        ScopeSnapshot::decode(entry.as_ref()).ok()
    }

    async fn post(&self, path: &str) -> (u16, serde_json::Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.admin))
            .body("{\"reason\":\"test\"}")
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = reqwest::get(format!("{}{path}", self.admin)).await.expect("get");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

#[tokio::test]
async fn open_scope_goes_half_open_without_traffic_and_everything_is_published() {
    let h = start().await;
    let scope = Scope::new("w1", "5551");
    assert!(
        bw_testkit::wait_until(WAIT, || async { h.cfg_field(&scope, "rate_per_s").await.as_deref() == Some("7") })
            .await,
        "config hash of the configured scope written"
    );
    let mut events = h.deps.nats.subscribe(bw_common::names::breaker_subject("5551")).await.expect("subscribe");
    h.deps.nats.flush().await.expect("flush");
    let client = h.client();
    let failures: Vec<OutcomeItem> = (0..4)
        .map(|i| OutcomeItem { recipient_key: format!("r{i}"), kind: OutcomeKind::Transient, canary: false })
        .collect();
    let result = client.record(&scope, &failures).await;
    assert_eq!(result.state, BreakerState::Open, "the coordinator's min_calls = 4 applies");
    // Nobody sends: the coordinator's tick moves it to HALF_OPEN after the 400 ms cooldown.
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let msg = tokio::time::timeout(WAIT, events.next()).await.expect("event in time").expect("event");
        let t = BreakerTransition::decode(msg.payload.as_ref()).expect("decodes");
        seen.push((t.from(), t.to(), t.incident_id.clone()));
    }
    assert_eq!((seen[0].0, seen[0].1), (BreakerState::Closed, BreakerState::Open));
    assert_eq!((seen[1].0, seen[1].1), (BreakerState::Open, BreakerState::HalfOpen));
    assert_eq!(seen[0].2, seen[1].2, "one incident");
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            h.kv_state("5551").await.map(|s| s.state() == BreakerState::HalfOpen && s.trips == 1).unwrap_or(false)
        })
        .await,
        "BW_SCOPES holds the HALF_OPEN snapshot"
    );
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &h.deps.metrics.lock().expect("registry")).expect("encode");
    assert!(text.contains("bw_breaker_trips_total{scope=\"5551\"} 1"), "{text}");
    assert!(text.contains("bw_breaker_state{scope=\"5551\"} 3"), "{text}");
}

#[tokio::test]
async fn admin_api_forces_resets_lists_and_reloads() {
    let h = start().await;
    // A scope first seen by a dispatcher is discovered through the index and gets the default config.
    let other = Scope::new("w2", "5552");
    let admission =
        h.client().admit(&other, &[AdmitItem { recipient_key: "x".into(), class: TrafficClass::Priority }]).await;
    assert!(!admission.degraded);
    assert!(
        bw_testkit::wait_until(WAIT, || async { h.cfg_field(&other, "min_calls").await.as_deref() == Some("4") }).await,
        "discovered scope gets the default limits"
    );
    let (status, body) = h.post("/admin/breakers/5551/force-open").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "FORCED_OPEN");
    assert!(!body["incident_id"].as_str().unwrap_or_default().is_empty());
    assert!(
        bw_testkit::wait_until(WAIT, || async {
            h.kv_state("5551").await.map(|s| s.state() == BreakerState::ForcedOpen).unwrap_or(false)
        })
        .await
    );
    let (status, body) = h.get("/admin/breakers").await;
    assert_eq!(status, 200);
    let scopes = body["scopes"].as_array().expect("list");
    assert_eq!(scopes.len(), 2, "{body}");
    assert_eq!(scopes[0]["phone_number_id"], "5551");
    assert_eq!(scopes[0]["limits"]["rate_per_s"], 7.0);
    let (status, body) = h.post("/admin/breakers/5551/reset").await;
    assert_eq!(status, 200);
    assert_eq!(body["state"], "CLOSED");
    assert_eq!(body["incident_id"], "");
    assert_eq!(h.post("/admin/breakers/999/force-open").await.0, 404);
    assert_eq!(h.post("/admin/breakers/5551/explode").await.0, 404);
    // Reload after an edit of the limits file, through the admin call (the file watcher may be first).
    std::fs::write(&h.limits_path, limits_text(9.0)).expect("rewrite");
    let (status, _) = h.post("/admin/reload").await;
    assert_eq!(status, 200);
    assert_eq!(h.cfg_field(&Scope::new("w1", "5551"), "rate_per_s").await.as_deref(), Some("9"));
    // A broken file is refused and the previous limits stay.
    std::fs::write(&h.limits_path, "[limits.default]\nfailure_threshold = 7.0\n").expect("rewrite");
    let (status, body) = h.post("/admin/reload").await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap_or_default().contains("failure_threshold"), "{body}");
    assert_eq!(h.cfg_field(&Scope::new("w1", "5551"), "rate_per_s").await.as_deref(), Some("9"));
}
