//! Harness for the cross-service tests: real nats-server and redis-server (bw-testkit), the Meta simulator,
//! and the real services' `run()` started in-process with their real config loaders, each with its own
//! cancellation token so a test can stop one instance while the others keep going.
//!
//! Tenancy: the relaxed starts ([`Harness::start_ingest`], [`Harness::start_dispatcher`],
//! [`Harness::start_replay`]) run in dev mode (`tenancy.mode = "dev"`, one tenant owning every number), a relaxed
//! setting a test may override; a dispatcher at the compiled defaults checks the sender registry, so a test
//! registers its senders to the tenant `default` first ([`Harness::register`]; [`Harness::submit_orders`] and
//! [`Harness::preload`] do it for theirs). The producer connection takes its replies on `default`'s inbox
//! prefix, which ingest answers in either mode.

use bw_common::ledger::{Ledger, Versioned};
use bw_common::nats::Buckets;
use bw_common::service::Deps;
use bw_proto::v1::OperationState;
use bw_testkit::{NatsServer, RedisServer};
use std::collections::HashMap;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// App secret the simulator signs webhooks with and ingest verifies.
pub const APP_SECRET: &str = "e2e-app-secret";
/// The producer API key the end-to-end ingest accepts on its HTTP intake (any sender).
pub const INTAKE_API_KEY: &str = "e2e-producer-key";
/// Access token the dispatcher sends and the simulator accepts.
pub const ACCESS_TOKEN: &str = "e2e-access-token";
/// WABA of the test senders.
pub const WABA_ID: &str = "102290129340398";

/// The shared request of the tests and benchmarks: a transactional `order_confirmation` template from `phone`
/// to a recipient unique to `i` (`+5491<i, 9 digits>`), operation id `op`.
pub fn order(phone: &str, op: &str, i: usize) -> bw_proto::v1::SendRequest {
    bw_client::Request::template(op, WABA_ID, phone, &format!("+5491{i:09}"), "order_confirmation", "es_AR")
        .param("1")
        .category(bw_proto::v1::Category::Transactional)
        .build()
}

/// Settings of an ingest process of the benchmarks (the real binary, compiled defaults but for where things
/// are, and dev tenancy: the benchmarks measure the pipeline; a registered sender costs one cached map read):
/// these servers, intake and Meta's webhooks on `http`, signed with `app_secret`.
/// A status webhook delivery as Meta sends it: `statuses` of sender `phone` of [`WABA_ID`] (JSON text).
pub fn status_webhook(phone: &str, statuses: Vec<serde_json::Value>) -> String {
    serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": WABA_ID, "changes": [{
        "field": "messages", "value": {"messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550783881", "phone_number_id": phone}, "statuses": statuses}}]}]})
    .to_string()
}

/// POSTs `body` to the webhook route of the ingest serving HTTP on `ingest_http`, signed with [`APP_SECRET`]:
/// the HTTP status of its answer.
pub async fn post_webhook(ingest_http: &str, body: String) -> u16 {
    reqwest::Client::new()
        .post(format!("http://{ingest_http}/webhooks/meta"))
        .header("content-type", "application/json")
        .header("X-Hub-Signature-256", bw_meta_sim::webhook::signature(APP_SECRET, body.as_bytes()))
        .body(body)
        .send()
        .await
        .expect("ingest answers")
        .status()
        .as_u16()
}

pub fn ingest_process(nats_url: &str, redis_url: &str, http: &str, app_secret: &str) -> Vec<(&'static str, String)> {
    vec![
        ("nats.url", nats_url.to_string()),
        // Per-recipient order sets (on by default) live in Redis: ingest does not start without it.
        ("redis.url", redis_url.to_string()),
        ("http.listen", http.to_string()),
        ("webhook.app_secret", app_secret.to_string()),
        ("webhook.verify_token", "bench-verify".to_string()),
        ("tenancy.mode", "dev".to_string()),
    ]
}

/// Settings of a dispatcher process of the benchmarks (compiled defaults but for where things are, and dev
/// tenancy like [`ingest_process`]): these servers, the simulator at `meta_url` with its access `token`.
pub fn dispatcher_process(nats_url: &str, redis_url: &str, meta_url: &str, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("nats.url", nats_url.to_string()),
        ("redis.url", redis_url.to_string()),
        ("meta.base_url", meta_url.to_string()),
        ("meta.access_token", token.to_string()),
        ("tenancy.mode", "dev".to_string()),
    ]
}

/// Registers `senders` (phone_number_id, waba_id) to the tenant `default` in the sender registry, as `bwctl
/// senders add` does (again for a number already registered to it: its WABA is updated).
pub async fn register_senders(js: &async_nats::jetstream::Context, senders: &[(&str, &str)]) {
    let registry = bw_common::registry::Registry::open(js, 1).await.expect("sender registry opens");
    for (phone, waba) in senders {
        let record = bw_proto::v1::SenderRecord {
            phone_number_id: phone.to_string(),
            waba_id: waba.to_string(),
            tenant: bw_wire::tenancy::DEFAULT_TENANT.to_string(),
            updated_at_unix_ms: bw_common::time::now_ms(),
            ..Default::default()
        };
        registry.add(&record).await.expect("sender registered");
    }
}

/// A producer connection of `tenant`: replies come back on the tenant's inbox prefix.
pub async fn producer_connection(url: &str, tenant: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .custom_inbox_prefix(bw_wire::tenancy::inbox_prefix(tenant))
        .connect(url)
        .await
        .expect("producer connects")
}

/// A process's status line from `/proc`: its command name, parent pid and CPU seconds (user + system), or None
/// when it is gone (or not on Linux).
pub fn process_stat(pid: &str) -> Option<(String, u32, f64)> {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let ticks = *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    });
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields after it start after the last ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // ppid is field 4 of the line; utime and stime are 14 and 15 (2, 12 and 13 after the name).
    Some((comm, f.get(1)?.parse().ok()?, (num(11) + num(12)) / ticks))
}

/// CPU seconds (user + system) process `pid` has used; 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    process_stat(&pid.to_string()).map(|s| s.2).unwrap_or(0.0)
}

/// Calls per Redis command so far (`INFO commandstats`: `cmdstat_<name>:calls=N,...`); a script's calls are
/// under `evalsha`, the commands it ran under their own names. The benches diff two readings.
pub async fn redis_command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
) -> std::collections::BTreeMap<String, f64> {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("redis info");
    stats
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// Offers `n` items evenly spaced `gap` apart from now (a producer at a steady rate): `offer(i)` runs at its
/// time on a task of its own. Returns once every task is done, with the time the last was offered (unix ms).
pub async fn paced<F, Fut>(n: usize, gap: Duration, offer: F) -> u64
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let started = std::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        tokio::time::sleep_until((started + gap * i as u32).into()).await;
        tasks.spawn(offer(i));
        while tasks.try_join_next().is_some() {}
    }
    let produced = bw_common::time::now_ms().max(0) as u64;
    while tasks.join_next().await.is_some() {}
    produced
}

/// One running service instance.
pub struct Instance {
    pub token: CancellationToken,
    pub handle: JoinHandle<anyhow::Result<()>>,
}

impl Instance {
    /// Cancels the instance and waits for its `run` to return.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.token.cancel();
        self.handle.await?
    }
}

/// Servers, simulator and service instances of one test.
pub struct Harness {
    pub nats: NatsServer,
    pub redis: RedisServer,
    pub sim: bw_meta_sim::SimHandle,
    pub client: async_nats::Client,
    pub js: async_nats::jetstream::Context,
    pub buckets: Buckets,
    pub ledger: Ledger,
    /// Where ingest serves HTTP (intake and Meta webhooks).
    pub ingest_http: String,
    /// `nats.ledger_partitions` of the harness and of every service it starts.
    pub ledger_partitions: usize,
    /// `nats.send_partitions` of the harness and of every service it starts.
    pub send_partitions: usize,
    instances: Vec<Instance>,
}

fn env_for(service: &str, pairs: &[(&str, String)]) -> HashMap<String, String> {
    let prefix = format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"));
    pairs.iter().map(|(k, v)| (format!("{prefix}{}", k.to_ascii_uppercase().replace('.', "__")), v.clone())).collect()
}

/// `dispatch.wire_guarantee` of every dispatcher the harness starts when `BW_E2E_WIRE_GUARANTEE` is set (e.g.
/// `journal`: the whole suite then runs on the wire journal); a test's own setting still wins.
fn wire_guarantee_from_env() -> Option<(&'static str, String)> {
    std::env::var("BW_E2E_WIRE_GUARANTEE").ok().filter(|v| !v.is_empty()).map(|v| ("dispatch.wire_guarantee", v))
}

impl Harness {
    /// Starts servers and the simulator (its webhooks aimed at the ingest HTTP address reserved here).
    pub async fn start(sim_cfg: bw_meta_sim::SimConfig) -> Harness {
        Harness::start_partitioned(sim_cfg, 1).await
    }

    /// Like [`Harness::start`], with the ledger split into `ledger_partitions` buckets for the harness and
    /// every service it starts.
    pub async fn start_partitioned(sim_cfg: bw_meta_sim::SimConfig, ledger_partitions: usize) -> Harness {
        Harness::start_split(sim_cfg, ledger_partitions, 1).await
    }

    /// Like [`Harness::start`], with the ledger in `ledger_partitions` buckets and BW_SEND in `send_partitions`
    /// streams, for the harness and every service it starts.
    pub async fn start_split(
        mut sim_cfg: bw_meta_sim::SimConfig,
        ledger_partitions: usize,
        send_partitions: usize,
    ) -> Harness {
        bw_common::crypto::install_crypto();
        let nats = NatsServer::start();
        let redis = RedisServer::start();
        let ingest_http = format!("127.0.0.1:{}", bw_testkit::free_port());
        sim_cfg.app_secret = APP_SECRET.into();
        sim_cfg.access_tokens = vec![ACCESS_TOKEN.into()];
        sim_cfg.waba_id = WABA_ID.into();
        if sim_cfg.webhook.url.is_none() {
            sim_cfg.webhook.url = Some(format!("http://{ingest_http}/webhooks/meta"));
        }
        let sim = bw_meta_sim::MetaSim::start(sim_cfg).await.expect("simulator starts");
        let client = producer_connection(&nats.url(), bw_wire::tenancy::DEFAULT_TENANT).await;
        let js = async_nats::jetstream::new(client.clone());
        let mut nats_cfg = bw_common::config::NatsConfig::single(nats.url(), "bw-e2e");
        nats_cfg.ledger_partitions = ledger_partitions;
        nats_cfg.send_partitions = send_partitions;
        let buckets = bw_common::nats::ensure_topology(&js, &nats_cfg).await.expect("topology");
        let ledger = Ledger::new(&buckets);
        Harness {
            nats,
            redis,
            sim,
            client,
            js,
            buckets,
            ledger,
            ingest_http,
            ledger_partitions,
            send_partitions,
            instances: Vec::new(),
        }
    }

    /// Connections of a service: the harness's NATS with the partitions of the service's own loaded config,
    /// and Redis as that config says (the harness's single node unless a test points it elsewhere, e.g. at a
    /// Redis Cluster).
    async fn deps(
        &self,
        service: &str,
        nats: &bw_common::config::NatsConfig,
        redis: Option<&bw_common::config::RedisConfig>,
    ) -> Deps {
        let mut nats_cfg = bw_common::config::NatsConfig::single(self.nats.url(), format!("e2e-{service}"));
        nats_cfg.ledger_partitions = nats.ledger_partitions;
        nats_cfg.send_partitions = nats.send_partitions;
        Deps::connect(service, &nats_cfg, redis, Duration::from_secs(10)).await.expect("deps connect")
    }

    /// Starts an ingest instance serving HTTP on `ingest_http` (the first one) or a free port, in dev tenancy
    /// unless `overrides` set `tenancy.mode`.
    pub async fn start_ingest(&mut self, overrides: &[(&str, String)]) -> usize {
        let listen = if self.instances.is_empty() { self.ingest_http.clone() } else { "127.0.0.1:0".into() };
        let mut pairs = vec![
            ("nats.url", self.nats.url()),
            ("nats.ledger_partitions", self.ledger_partitions.to_string()),
            ("nats.send_partitions", self.send_partitions.to_string()),
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("http.listen", listen),
            ("webhook.app_secret", APP_SECRET.to_string()),
            ("webhook.verify_token", "e2e-verify".to_string()),
            ("intake.api_keys.e2e.sha256", bw_ingest::key_sha256(INTAKE_API_KEY)),
            ("intake.api_keys.e2e.tenant", bw_wire::tenancy::DEFAULT_TENANT.to_string()),
            ("intake.api_keys.e2e.phone_number_ids", r#"["*"]"#.to_string()),
            ("tenancy.mode", "dev".to_string()),
        ];
        pairs.extend(overrides.iter().cloned());
        let cfg = bw_ingest::Config::load(None, &env_for("ingest", &pairs)).expect("ingest config");
        // The order sets live in Redis (the compiled default keeps order for every category but authentication).
        let redis = bw_common::service::ServiceConfig::redis(&cfg).cloned();
        let deps = self.deps("ingest", bw_common::service::ServiceConfig::nats(&cfg), redis.as_ref()).await;
        let health = deps.health.clone();
        let index = self.keep(|token| tokio::spawn(bw_ingest::run(cfg, deps, token)));
        // Ready means subscribed: the first request of a test never meets "no responders", however slow the
        // machine.
        let ready = bw_testkit::wait_until(Duration::from_secs(30), || async { health.check().await.is_empty() }).await;
        assert!(ready, "ingest ready");
        index
    }

    /// Starts a dispatcher instance talking to the simulator (relaxed timings, dev tenancy).
    pub async fn start_dispatcher(&mut self, overrides: &[(&str, String)]) -> usize {
        let mut pairs = vec![
            ("nats.url", self.nats.url()),
            ("nats.ledger_partitions", self.ledger_partitions.to_string()),
            ("nats.send_partitions", self.send_partitions.to_string()),
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("meta.base_url", self.sim.base_url()),
            ("meta.access_token", ACCESS_TOKEN.to_string()),
            ("meta.request_timeout_ms", "2000".to_string()),
            ("dispatch.ack_wait_ms", "5000".to_string()),
            ("dispatch.retry_base_ms", "100".to_string()),
            ("dispatch.retry_cap_ms", "500".to_string()),
            ("dispatch.idle_wait_ms", "50".to_string()),
            ("tenancy.mode", "dev".to_string()),
        ];
        pairs.extend(wire_guarantee_from_env());
        pairs.extend(overrides.iter().cloned());
        let cfg = bw_dispatcher::Config::load(None, &env_for("dispatcher", &pairs)).expect("dispatcher config");
        let deps = self.deps("dispatcher", bw_common::service::ServiceConfig::nats(&cfg), Some(&cfg.redis)).await;
        self.keep(|token| tokio::spawn(bw_dispatcher::run(cfg, deps, token)))
    }

    /// Starts a dispatcher at the compiled default configuration: only where NATS, Redis and Meta are (and the
    /// token) is set, nothing relaxed for speed. It checks the sender registry: register the test's senders
    /// ([`Harness::register`]).
    pub async fn start_dispatcher_at_defaults(&mut self) -> usize {
        self.start_dispatcher_at_defaults_but(&[]).await
    }

    /// [`Harness::start_dispatcher_at_defaults`] with the given settings changed (and nothing else).
    pub async fn start_dispatcher_at_defaults_but(&mut self, changed: &[(&str, String)]) -> usize {
        let mut pairs = vec![
            ("nats.url", self.nats.url()),
            ("nats.ledger_partitions", self.ledger_partitions.to_string()),
            ("nats.send_partitions", self.send_partitions.to_string()),
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("meta.base_url", self.sim.base_url()),
            ("meta.access_token", ACCESS_TOKEN.to_string()),
        ];
        pairs.extend(wire_guarantee_from_env());
        pairs.extend(changed.iter().cloned());
        let cfg = bw_dispatcher::Config::load(None, &env_for("dispatcher", &pairs)).expect("dispatcher config");
        let deps = self.deps("dispatcher", bw_common::service::ServiceConfig::nats(&cfg), Some(&cfg.redis)).await;
        self.keep(|token| tokio::spawn(bw_dispatcher::run(cfg, deps, token)))
    }

    /// Starts a replay instance (relaxed timings, dev tenancy).
    pub async fn start_replay(&mut self, overrides: &[(&str, String)]) -> usize {
        let mut pairs = vec![
            ("tenancy.mode", "dev".to_string()),
            ("nats.url", self.nats.url()),
            ("nats.ledger_partitions", self.ledger_partitions.to_string()),
            ("nats.send_partitions", self.send_partitions.to_string()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("replay.soak_ms", "0".to_string()),
            ("replay.idle_ms", "100".to_string()),
        ];
        pairs.extend(overrides.iter().cloned());
        let cfg: bw_replay::Config =
            bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &env_for("replay", &pairs))
                .expect("replay config");
        let deps = self.deps("replay", bw_common::service::ServiceConfig::nats(&cfg), None).await;
        self.keep(|token| tokio::spawn(bw_replay::run(cfg, deps, token)))
    }

    /// Starts a breaker-coordinator (fast ticks and scope snapshots, admin API on a free port).
    pub async fn start_coordinator(&mut self, overrides: &[(&str, String)]) -> usize {
        let mut pairs = vec![
            ("nats.url", self.nats.url()),
            ("nats.ledger_partitions", self.ledger_partitions.to_string()),
            ("nats.send_partitions", self.send_partitions.to_string()),
            ("redis.url", self.redis.url()),
            ("admin.listen", "127.0.0.1:0".to_string()),
            ("coordinator.tick_ms", "100".to_string()),
            ("coordinator.scope_discovery_ms", "200".to_string()),
            ("coordinator.snapshot_refresh_ms", "500".to_string()),
        ];
        pairs.extend(overrides.iter().cloned());
        let cfg = bw_breaker_coordinator::Config::load(None, &env_for("breaker-coordinator", &pairs))
            .expect("coordinator config");
        let deps =
            self.deps("breaker-coordinator", bw_common::service::ServiceConfig::nats(&cfg), Some(&cfg.redis)).await;
        self.keep(|token| tokio::spawn(bw_breaker_coordinator::run(cfg, deps, token)))
    }

    /// Keeps a started instance; returns its index.
    fn keep(&mut self, start: impl FnOnce(CancellationToken) -> JoinHandle<anyhow::Result<()>>) -> usize {
        let token = CancellationToken::new();
        let handle = start(token.clone());
        self.instances.push(Instance { token, handle });
        self.instances.len() - 1
    }

    /// Stops instance `index` gracefully (SIGTERM path) and returns what its `run` returned.
    pub async fn stop(&mut self, index: usize) -> anyhow::Result<()> {
        let token = self.instances[index].token.clone();
        token.cancel();
        let handle = std::mem::replace(&mut self.instances[index].handle, tokio::spawn(async { Ok(()) }));
        handle.await?
    }

    /// Aborts instance `index` without any chance to finish (the in-process stand-in for kill -9).
    pub fn abort(&mut self, index: usize) {
        self.instances[index].handle.abort();
    }

    /// A producer client.
    pub fn producer(&self) -> bw_client::Client {
        bw_client::Client::new(self.client.clone())
    }

    /// Registers `phones` (of [`WABA_ID`]) to the tenant `default` ([`register_senders`]).
    pub async fn register(&self, phones: &[&str]) {
        let senders: Vec<(&str, &str)> = phones.iter().map(|p| (*p, WABA_ID)).collect();
        register_senders(&self.js, &senders).await;
    }

    /// Reads an operation's ledger entry.
    pub async fn ledger_entry(&self, operation_id: &str) -> Option<Versioned> {
        self.ledger.get(operation_id).await.ok().flatten()
    }

    /// Stores requests exactly as ingest does (the live high lane of the sender's BW_SEND partition with `Nats-Msg-Id` = operation id,
    /// then the QUEUED ledger entry), pipelined: a backlog that exists before any dispatcher starts.
    pub async fn preload(&self, requests: &[bw_proto::v1::SendRequest]) {
        use prost::Message as _;
        let senders: std::collections::BTreeSet<(&str, &str)> =
            requests.iter().map(|r| (r.phone_number_id.as_str(), r.waba_id.as_str())).collect();
        register_senders(&self.js, &senders.into_iter().collect::<Vec<_>>()).await;
        let mut acks = Vec::with_capacity(2048);
        for r in requests {
            let subject = self.buckets.send.outbox_subject(bw_wire::names::Lane::High, &r.phone_number_id);
            let headers = bw_wire::names::msg_id_headers(&r.operation_id);
            acks.push(self.js.publish_with_headers(subject, headers, r.encode_to_vec().into()).await.expect("publish"));
            if acks.len() == 2048 {
                for a in acks.drain(..) {
                    a.await.expect("stored");
                }
            }
        }
        for a in acks.drain(..) {
            a.await.expect("stored");
        }
        let mut creates = tokio::task::JoinSet::new();
        for r in requests {
            let ledger = self.ledger.clone();
            let entry = bw_common::ledger::entry_for(r, OperationState::Queued);
            creates.spawn(async move { ledger.create(&entry).await.expect("ledger create") });
            while creates.len() > 512 {
                creates.join_next().await;
            }
        }
        while creates.join_next().await.is_some() {}
    }

    /// Submits `n` transactional order confirmations ([`order`]) from `phone` to distinct recipients through
    /// ingest, concurrently, asserting each is accepted; returns their operation ids (`<prefix>-0000`...).
    pub async fn submit_orders(&self, phone: &str, prefix: &str, n: usize) -> Vec<String> {
        self.register(&[phone]).await;
        let producer = self.producer();
        let mut ops = Vec::new();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let op = format!("{prefix}-{i:04}");
            let r = order(phone, &op, i);
            let p = producer.clone();
            tasks.spawn(async move { p.send(&r).await.map(|reply| reply.accepted) });
            ops.push(op);
        }
        while let Some(r) = tasks.join_next().await {
            assert!(r.expect("task").expect("answer"), "accepted");
        }
        ops
    }

    /// Waits until every operation's ledger state is one of `states`.
    pub async fn wait_all(&self, ops: &[String], states: &[OperationState], timeout: Duration) -> bool {
        bw_testkit::wait_until(timeout, || async {
            for op in ops {
                if !self.ledger_entry(op).await.is_some_and(|v| states.contains(&v.entry.state())) {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// Waits until the operation's ledger state is one of `states`.
    pub async fn wait_state(&self, operation_id: &str, states: &[OperationState], timeout: Duration) -> bool {
        bw_testkit::wait_until(timeout, || async {
            self.ledger_entry(operation_id).await.is_some_and(|v| states.contains(&v.entry.state()))
        })
        .await
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        for i in &self.instances {
            i.token.cancel();
            i.handle.abort();
        }
    }
}

/// Per-recipient order violations in Meta's acceptances (the simulator's oracle): pairs (earlier, later) of
/// `accepted`, given in the order ingest accepted them, to the same sender and recipient, where Meta accepted
/// the later one first. Operations Meta never accepted are left out.
pub fn order_violations(oracle: &bw_meta_sim::OracleSnapshot, accepted: &[String]) -> Vec<(String, String)> {
    let mut last: HashMap<(String, String), (String, u64)> = HashMap::new();
    let mut out = Vec::new();
    for op in accepted {
        let Some(e) = oracle.get(op) else { continue };
        let key = (e.phone_number_id.clone(), e.recipient_key.clone());
        if let Some((prev, seq)) = last.get(&key)
            && e.first_accept_seq < *seq
        {
            out.push((prev.clone(), op.clone()));
            continue;
        }
        last.insert(key, (op.clone(), e.first_accept_seq));
    }
    out
}

/// Breaker limits that trip after a few failed calls and recover within a second or two (the compiled defaults
/// need minutes of failures), as overrides under a prefix: `breaker.defaults` for the dispatcher,
/// `limits.default` for the coordinator. A test that uses it says so; everything else stays at the defaults.
#[derive(Debug, Clone, Copy)]
pub struct FastBreaker {
    pub min_calls: u32,
    pub close_after_successes: u32,
    pub rate_per_s: u32,
    pub burst: u32,
    pub canaries_per_s: u32,
}

impl Default for FastBreaker {
    fn default() -> Self {
        FastBreaker { min_calls: 5, close_after_successes: 2, rate_per_s: 200, burst: 20, canaries_per_s: 20 }
    }
}

impl FastBreaker {
    /// The overrides under `prefix`: a trip at 50 % failures once `min_calls` were made (the bare rate,
    /// `failure_z` 0, so a handful of calls trips), 0.5–1 s cooldowns
    /// without jitter or ramp, and a pair burst that never gets in the way.
    pub fn settings(&self, prefix: &str) -> Vec<(String, String)> {
        let numbers = [
            ("min_calls", self.min_calls),
            ("rate_per_s", self.rate_per_s),
            ("burst", self.burst),
            ("canaries_per_s", self.canaries_per_s),
            ("close_after_successes", self.close_after_successes),
        ];
        let fixed = [
            ("failure_threshold", "0.5"),
            ("failure_z", "0.0"),
            ("cooldown_ms", "500"),
            ("cooldown_max_ms", "1000"),
            ("cooldown_jitter", "0"),
            ("ramp_ms", "0"),
            ("pair_burst", "1000"),
        ];
        fixed
            .iter()
            .map(|(k, v)| (format!("{prefix}.{k}"), v.to_string()))
            .chain(numbers.iter().map(|(k, v)| (format!("{prefix}.{k}"), v.to_string())))
            .collect()
    }
}

/// Owned overrides as the `(&str, String)` pairs the `start_*` functions take.
pub fn pairs(v: &[(String, String)]) -> Vec<(&str, String)> {
    v.iter().map(|(k, val)| (k.as_str(), val.clone())).collect()
}
