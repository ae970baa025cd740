//! Coordinator tests against a real nats-server (JetStream) and redis-server: cooldown → HALF_OPEN without
//! traffic, snapshots in BW_SCOPES, transition events, config hashes, discovery, reload, admin API.

use bw_breaker::{AdmitItem, Breaker, BreakerConfig, OutcomeItem, OutcomeKind, Scope, TrafficClass};
use bw_breaker_coordinator::{Config, Coordinator, DEFAULT_CONFIG};
use bw_proto::v1::{BreakerState, BreakerTransition, ScopeSnapshot};
use futures::StreamExt;
use prost::Message as _;
use std::collections::HashMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) const WAIT: Duration = Duration::from_secs(15);

pub(crate) fn limits_text(rate: f64) -> String {
    format!(
        "[limits.default]\nmin_calls = 4\nfailure_threshold = 0.5\nfailure_z = 0.0\ncooldown_ms = 400\n\
         cooldown_jitter = 0.0\n[limits.scopes.\"5551\"]\nwaba_id = \"w1\"\nrate_per_s = {rate}\n"
    )
}

mod account;
mod auth;
mod fleet;
mod pauses;
mod redis_loss;

/// The operator token the harness configures (its sha256 goes in the config; the token is sent by tests).
pub(crate) const OPERATOR_TOKEN: &str = "test-operator-token-1";

pub(crate) fn sha256_hex(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

pub(crate) struct Servers {
    pub(crate) nats: bw_testkit::NatsServer,
    pub(crate) redis: bw_testkit::RedisServer,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) limits_path: std::path::PathBuf,
}

impl Servers {
    pub(crate) fn start() -> Servers {
        bw_common::crypto::install_crypto();
        let nats = bw_testkit::NatsServer::start();
        let redis = bw_testkit::RedisServer::start();
        let dir = tempfile::tempdir().expect("tempdir");
        let limits_path = dir.path().join("limits.toml");
        std::fs::write(&limits_path, limits_text(7.0)).expect("write limits");
        Servers { nats, redis, dir, limits_path }
    }

    /// A coordinator config file over the compiled defaults: the servers, the limits file, and `extra` TOML
    /// lines (sections of their own).
    pub(crate) fn config(&self, name: &str, extra: &str) -> Config {
        let file = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &file,
            format!(
                "[nats]\nurl = \"{}\"\n[redis]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\n{extra}\n",
                self.nats.url(),
                self.redis.url(),
            ),
        )
        .expect("write config");
        let mut cfg: Config =
            bw_common::config::load("breaker-coordinator", DEFAULT_CONFIG, Some(&file), &HashMap::new())
                .expect("config");
        cfg.coordinator.limits_file = self.limits_path.display().to_string();
        cfg
    }
}

/// One running coordinator with its own connections and admin server.
pub(crate) struct Instance {
    pub(crate) deps: bw_common::service::Deps,
    pub(crate) coordinator: Coordinator,
    pub(crate) admin: String,
    pub(crate) token: CancellationToken,
    pub(crate) task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Instance {
    pub(crate) async fn start(cfg: Config) -> Instance {
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
        let task = tokio::spawn(coordinator.clone().run(token.clone()));
        Instance { deps, coordinator, admin: format!("http://{addr}"), token, task }
    }

    /// POST with an optional bearer token.
    pub(crate) async fn post_as(&self, path: &str, bearer: Option<&str>) -> (u16, serde_json::Value) {
        let mut request = reqwest::Client::new().post(format!("{}{path}", self.admin)).body("{\"reason\":\"test\"}");
        if let Some(t) = bearer {
            request = request.bearer_auth(t);
        }
        let r = request.send().await.expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub(crate) async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let r = reqwest::get(format!("{}{path}", self.admin)).await.expect("get");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(serde_json::Value::Null))
    }

    pub(crate) fn metrics_text(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.deps.metrics.lock().expect("registry"))
            .expect("encode");
        text
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

struct Harness {
    servers: Servers,
    one: Instance,
    redis: bw_common::redis_conn::RedisConn,
}

impl std::ops::Deref for Harness {
    type Target = Instance;
    fn deref(&self) -> &Instance {
        &self.one
    }
}

/// One coordinator with a relaxed tick (50 ms) and discovery (100 ms), and the harness operator token.
async fn start() -> Harness {
    let servers = Servers::start();
    let cfg = servers.config(
        "coordinator",
        &format!(
            "[coordinator]\ntick_ms = 50\nscope_discovery_ms = 100\nlimits_poll_ms = 100\n\
             [operator]\ntoken_sha256 = \"{}\"\n",
            sha256_hex(OPERATOR_TOKEN)
        ),
    );
    let one = Instance::start(cfg).await;
    let redis = one.deps.redis.clone().expect("redis");
    Harness { servers, one, redis }
}

pub(crate) fn client(deps: &bw_common::service::Deps) -> Breaker {
    Breaker::with_conn(deps.redis.clone(), Some(deps.nats.clone()), BreakerConfig::default())
}

impl Harness {
    /// A dispatcher-like breaker with the library's compiled defaults (min_calls 50): the coordinator's config
    /// hash must be what makes 4 calls enough to trip.
    fn client(&self) -> Breaker {
        client(&self.deps)
    }

    async fn cfg_field(&self, scope: &Scope, field: &str) -> Option<String> {
        let mut conn = self.redis.clone();
        redis::cmd("HGET").arg(bw_breaker::scripts::cfg_key(scope)).arg(field).query_async(&mut conn).await.ok()?
    }

    async fn kv_state(&self, phone: &str) -> Option<ScopeSnapshot> {
        kv_state(&self.deps, phone).await
    }

    async fn post(&self, path: &str) -> (u16, serde_json::Value) {
        self.post_as(path, Some(OPERATOR_TOKEN)).await
    }
}

pub(crate) async fn kv_state(deps: &bw_common::service::Deps, phone: &str) -> Option<ScopeSnapshot> {
    let entry = deps.buckets.scopes.get(phone).await.ok()??;
    ScopeSnapshot::decode(entry.as_ref()).ok()
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
    let mut events = h.deps.nats.subscribe(bw_wire::names::breaker_subject("5551")).await.expect("subscribe");
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
    let text = h.metrics_text();
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
    std::fs::write(&h.servers.limits_path, limits_text(9.0)).expect("rewrite");
    let (status, _) = h.post("/admin/reload").await;
    assert_eq!(status, 200);
    assert_eq!(h.cfg_field(&Scope::new("w1", "5551"), "rate_per_s").await.as_deref(), Some("9"));
    // A broken file is refused and the previous limits stay.
    std::fs::write(&h.servers.limits_path, "[limits.default]\nfailure_threshold = 7.0\n").expect("rewrite");
    let (status, body) = h.post("/admin/reload").await;
    assert_eq!(status, 400);
    assert!(body["error"].as_str().unwrap_or_default().contains("failure_threshold"), "{body}");
    assert_eq!(h.cfg_field(&Scope::new("w1", "5551"), "rate_per_s").await.as_deref(), Some("9"));
}
