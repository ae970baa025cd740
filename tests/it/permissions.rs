//! NATS users (deploy/nats/accounts.conf, the very file, with its producers' region generated for the test's
//! senders as `bwctl senders nats-accounts` does): every service runs as its own least-privilege user with
//! its own inbox prefix at the compiled default tenancy (the sender registry, which the operator writes and
//! ingest, the dispatcher and replay read), messages go end to end through the Meta simulator (one dead-letters and is replayed,
//! one is purged by the operator; two are quarantined, and the operator purges one and replays the other), every
//! bwctl command that uses NATS runs as the operator user, and nats-server logs no permissions violation; then
//! what a user must not do is refused (the server logs it and the client gets an error), the operator included.
#![expect(clippy::disallowed_methods, reason = "the test acks as each NATS user to prove what its permissions allow")]

use bw_common::config::NatsConfig;
use bw_common::service::Deps;
use bw_e2e::{ACCESS_TOKEN, APP_SECRET, INTAKE_API_KEY, WABA_ID};
use bw_meta_sim::{Fault, FaultKind, Scenario, Selection, SimConfig, Window};
use bw_proto::v1::{Category, OperationState, SendRequest};
use bw_testkit::{NatsServer, RedisServer};
use bw_wire::names;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PHONE: &str = "106540352249001";
/// A second sender, whose DLQ entry the operator purges.
const PHONE_PURGED: &str = "106540352249002";
const WAIT: Duration = Duration::from_secs(30);
const SENT: [OperationState; 3] = [OperationState::Sent, OperationState::Delivered, OperationState::Read];

/// The five service users of accounts.conf (user name = service name) and the environment variable with the
/// password of each.
const SERVICES: [(&str, &str); 5] = [
    ("ingest", "BW_NATS_INGEST_PASSWORD"),
    ("dispatcher", "BW_NATS_DISPATCHER_PASSWORD"),
    ("replay", "BW_NATS_REPLAY_PASSWORD"),
    ("breaker-coordinator", "BW_NATS_BREAKER_COORDINATOR_PASSWORD"),
    ("alerting", "BW_NATS_ALERTING_PASSWORD"),
];

fn password(user: &str) -> String {
    format!("{user}-test-pw")
}

/// The test's senders, both registered to the tenant `default` (their operation keys are the bare ids).
const SENDERS: [&str; 2] = [PHONE, PHONE_PURGED];
/// The producers' tenant.
const TENANT: &str = bw_wire::tenancy::DEFAULT_TENANT;

fn accounts_conf() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/nats/accounts.conf")
}

/// nats-server with deploy/nats/accounts.conf as committed (no producer) and a password for every user.
fn server() -> NatsServer {
    server_with(&accounts_conf())
}

/// nats-server with deploy/nats/accounts.conf whose producers' region holds the user of [`TENANT`] owning
/// [`SENDERS`] (what `bwctl senders nats-accounts` prints once the operator registered them).
fn tenant_server() -> NatsServer {
    let records: Vec<bw_proto::v1::SenderRecord> = SENDERS
        .iter()
        .map(|phone| bw_proto::v1::SenderRecord {
            phone_number_id: phone.to_string(),
            waba_id: WABA_ID.into(),
            tenant: TENANT.into(),
            ..Default::default()
        })
        .collect();
    let base = std::fs::read_to_string(accounts_conf()).expect("accounts.conf");
    let conf = bw_ops::senders::render_accounts(&base, &records).expect("producers generated");
    let path = std::env::temp_dir().join(format!("bw-accounts-tenant-{}.conf", bw_testkit::free_port()));
    std::fs::write(&path, conf).expect("conf written");
    let server = server_with(&path);
    let _ = std::fs::remove_file(&path);
    server
}

/// nats-server with the accounts file `conf` and a password for every user it names.
fn server_with(conf: &Path) -> NatsServer {
    let mut envs: Vec<(&str, String)> = SERVICES.iter().map(|(user, var)| (*var, password(user))).collect();
    envs.push(("BW_NATS_OPERATOR_PASSWORD", password("operator")));
    envs.push(("BW_NATS_CONSOLE_PASSWORD", password("console")));
    let producer = bw_ops::senders::password_var(TENANT);
    envs.push((producer.as_str(), password(&bw_wire::tenancy::nats_user(TENANT))));
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    NatsServer::start_with_config(conf, &envs)
}

/// nats-server with the accounts `scripts/nats-accounts.sh <args>` generates (partitioned ledgers and sends).
fn server_from_script(args: &[&str]) -> NatsServer {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/nats-accounts.sh");
    let generated = std::process::Command::new("bash").arg(&script).args(args).output().expect("script runs");
    assert!(generated.status.success(), "{}", String::from_utf8_lossy(&generated.stderr));
    let conf = std::env::temp_dir().join(format!("bw-accounts-{}.conf", bw_testkit::free_port()));
    std::fs::write(&conf, &generated.stdout).expect("conf written");
    let nats = server_with(&conf);
    let _ = std::fs::remove_file(&conf);
    nats
}

fn url_of(server: &NatsServer, user: &str) -> String {
    format!("nats://{user}:{}@127.0.0.1:{}", password(user), server.port())
}

/// The `nats.*` settings of a service running as its own user, as a deployment sets them (accounts.conf header).
fn nats_env(server: &NatsServer, user: &str) -> Vec<(&'static str, String)> {
    vec![("nats.url", url_of(server, user)), ("nats.inbox_prefix", format!("_INBOX_{user}"))]
}

fn env_for(service: &str, pairs: &[(&str, String)]) -> HashMap<String, String> {
    let prefix = format!("BW_{}__", service.to_ascii_uppercase().replace('-', "_"));
    pairs.iter().map(|(k, v)| (format!("{prefix}{}", k.to_ascii_uppercase().replace('.', "__")), v.clone())).collect()
}

/// Connections of `user` the way a service makes them (Deps::connect ensures the topology as that user).
async fn deps_as(server: &NatsServer, user: &str, redis: Option<&bw_common::config::RedisConfig>) -> Deps {
    deps_partitioned(server, user, redis, 1, 1).await
}

/// Like [`deps_as`], with the ledger in `ledger_partitions` partitions and BW_SEND in `send_partitions`.
async fn deps_partitioned(
    server: &NatsServer,
    user: &str,
    redis: Option<&bw_common::config::RedisConfig>,
    ledger_partitions: usize,
    send_partitions: usize,
) -> Deps {
    let cfg = NatsConfig {
        url: url_of(server, user),
        name: format!("test-{user}"),
        inbox_prefix: format!("_INBOX_{user}"),
        replicas: 1,
        ledger_partitions,
        send_partitions,
        tls_ca_file: String::new(),
        limits: Default::default(),
    };
    let mut deps = Deps::connect(user, &cfg, redis, Duration::from_secs(10)).await.expect("connects as its user");
    if user != "operator" {
        // A probe of refused actions: a refused JetStream request is never answered, give up sooner.
        deps.js = async_nats::jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(deps.nats.clone());
    }
    deps
}

/// Lines of the server log that report a permissions violation.
fn violations(server: &NatsServer) -> Vec<String> {
    let log = std::fs::read_to_string(server.dir().join("nats.log")).unwrap_or_default();
    log.lines().filter(|l| l.contains("Violation")).map(str::to_string).collect()
}

/// Waits until the server logged a violation of `user` naming `subject`.
async fn logged_violation(server: &NatsServer, user: &str, subject: &str) -> bool {
    bw_testkit::wait_until(WAIT, || async {
        violations(server).iter().any(|l| l.contains(&format!("/user:{user}\"")) && l.contains(subject))
    })
    .await
}

fn failing(kind: FaultKind) -> Scenario {
    Scenario {
        name: "transient".into(),
        seed: Some(7),
        selection: Selection::Deterministic,
        latency: None,
        windows: vec![Window {
            name: "fail".into(),
            start_ms: 0,
            duration_ms: None,
            error_rate: 1.0,
            faults: vec![Fault { kind, weight: 1 }],
            latency: None,
            phone_number_ids: vec![],
        }],
        ..Scenario::default()
    }
}

fn order(op: &str, phone: &str, i: usize) -> SendRequest {
    bw_client::Request::template(op, WABA_ID, phone, &format!("+54911777{i:05}"), "order_confirmation", "es_AR")
        .param("1")
        .category(Category::Transactional)
        .build()
}

struct Services {
    health: Vec<std::sync::Arc<bw_common::admin::Health>>,
    tokens: Vec<CancellationToken>,
    handles: Vec<JoinHandle<anyhow::Result<()>>>,
}

impl Services {
    fn keep(&mut self, deps: &Deps, start: impl FnOnce(CancellationToken) -> JoinHandle<anyhow::Result<()>>) {
        self.health.push(deps.health.clone());
        let token = CancellationToken::new();
        self.handles.push(start(token.clone()));
        self.tokens.push(token);
    }

    /// Waits until every service started so far reports ready.
    async fn ready(&self) -> bool {
        bw_testkit::wait_until(WAIT, || async {
            for h in &self.health {
                if !h.check().await.is_empty() {
                    return false;
                }
            }
            true
        })
        .await
    }

    async fn stop(self) {
        for t in &self.tokens {
            t.cancel();
        }
        for h in self.handles {
            h.await.expect("joins").expect("service stops cleanly");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_runs_as_its_own_nats_user_and_nothing_else_is_allowed() {
    // On the heap: the whole journey is one large future, more than a test thread's stack holds.
    Box::pin(services_and_operator_as_their_users()).await;
}

async fn services_and_operator_as_their_users() {
    bw_common::crypto::install_crypto();
    let nats = tenant_server();
    let redis = RedisServer::start();
    let ingest_http = format!("127.0.0.1:{}", bw_testkit::free_port());
    let mut sim_cfg = SimConfig {
        app_secret: APP_SECRET.into(),
        access_tokens: vec![ACCESS_TOKEN.into()],
        waba_id: WABA_ID.into(),
        ..SimConfig::default()
    };
    sim_cfg.webhook.url = Some(format!("http://{ingest_http}/webhooks/meta"));
    let sim = bw_meta_sim::MetaSim::start(sim_cfg).await.expect("simulator starts");
    // The operator registers the senders (bwctl creates the registry's bucket: no service has started yet).
    for phone in SENDERS {
        let (code, out) =
            crate::bwctl(&url_of(&nats, "operator"), &["senders", "add", phone, "--waba", WABA_ID, "--tenant", TENANT])
                .await;
        assert_eq!(code, 0, "bwctl senders add as the operator:\n{out}");
    }
    // The services at their compiled defaults but for where things are and a few speed-ups (retries, Meta's
    // timeout, alerting's poll). Ingest, started first, creates the topology as its user; the others find it.
    let mut services = Services { health: Vec::new(), tokens: Vec::new(), handles: Vec::new() };
    // ingest
    let mut pairs = nats_env(&nats, "ingest");
    pairs.extend([
        ("redis.url", redis.url()),
        ("admin.listen", "127.0.0.1:0".to_string()),
        ("http.listen", ingest_http.clone()),
        ("webhook.app_secret", APP_SECRET.to_string()),
        ("webhook.verify_token", "e2e-verify".to_string()),
        ("intake.api_keys.e2e.sha256", bw_ingest::key_sha256(INTAKE_API_KEY)),
        ("intake.api_keys.e2e.phone_number_ids", r#"["*"]"#.to_string()),
        ("intake.api_keys.e2e.tenant", TENANT.to_string()),
    ]);
    let cfg = bw_ingest::Config::load(None, &env_for("ingest", &pairs)).expect("ingest config");
    let redis_cfg = bw_common::service::ServiceConfig::redis(&cfg).cloned();
    let deps = Deps::connect("ingest", &cfg.nats, redis_cfg.as_ref(), WAIT).await.expect("ingest connects");
    services.keep(&deps.clone(), |t| tokio::spawn(bw_ingest::run(cfg, deps, t)));
    // dispatcher
    let mut pairs = nats_env(&nats, "dispatcher");
    pairs.extend([
        ("redis.url", redis.url()),
        ("admin.listen", "127.0.0.1:0".to_string()),
        ("meta.base_url", sim.base_url()),
        ("meta.access_token", ACCESS_TOKEN.to_string()),
        ("dispatch.retry_base_ms", "100".to_string()),
        ("dispatch.retry_cap_ms", "300".to_string()),
        ("meta.request_timeout_ms", "500".to_string()),
    ]);
    let cfg = bw_dispatcher::Config::load(None, &env_for("dispatcher", &pairs)).expect("dispatcher config");
    let deps = Deps::connect("dispatcher", &cfg.nats, Some(&cfg.redis), WAIT).await.expect("dispatcher connects");
    services.keep(&deps.clone(), |t| tokio::spawn(bw_dispatcher::run(cfg, deps, t)));
    // breaker-coordinator
    let mut pairs = nats_env(&nats, "breaker-coordinator");
    pairs.extend([("redis.url", redis.url()), ("admin.listen", "127.0.0.1:0".to_string())]);
    let cfg = bw_breaker_coordinator::Config::load(None, &env_for("breaker-coordinator", &pairs))
        .expect("coordinator config");
    let deps = Deps::connect("breaker-coordinator", &cfg.nats, Some(&cfg.redis), WAIT).await.expect("connects");
    services.keep(&deps.clone(), |t| tokio::spawn(bw_breaker_coordinator::run(cfg, deps, t)));
    // alerting: polls depths often so the test sees its polls too
    let mut pairs = nats_env(&nats, "alerting");
    pairs.extend([("admin.listen", "127.0.0.1:0".to_string()), ("alerting.poll_interval_ms", "200".to_string())]);
    let cfg: bw_alerting::Config =
        bw_common::config::load("alerting", bw_alerting::DEFAULT_CONFIG, None, &env_for("alerting", &pairs))
            .expect("alerting config");
    let deps = Deps::connect("alerting", &cfg.nats, None, WAIT).await.expect("alerting connects");
    services.keep(&deps.clone(), |t| tokio::spawn(bw_alerting::run(cfg, deps, t)));

    assert!(services.ready().await, "the services start as their users: {:?}", violations(&nats));

    // The operator observes through bwctl's own connection (the services created the topology): ledger, streams.
    let operator = bw_cli::connect(&url_of(&nats, "operator")).await.expect("bwctl connects as the operator");
    let ledger = bw_common::ledger::Ledger::new(&operator.buckets);
    let state_of = |op: &'static str| {
        let ledger = ledger.clone();
        async move { ledger.get(op).await.ok().flatten().map(|v| v.entry) }
    };
    let wait_state = |op: &'static str, states: &'static [OperationState]| async move {
        bw_testkit::wait_until(WAIT, || async { state_of(op).await.is_some_and(|e| states.contains(&e.state())) }).await
    };

    // A producer, as its tenant's user on the tenant's inbox prefix.
    let producer = bw_client::tenant_options(TENANT, password(&bw_wire::tenancy::nats_user(TENANT)))
        .connect(format!("127.0.0.1:{}", nats.port()))
        .await
        .expect("producer connects");
    let producer = bw_client::Client::new(producer);
    let submit = |request: SendRequest| {
        let producer = producer.clone();
        async move {
            let reply = producer.send(&request).await.expect("ingest answers");
            assert!(reply.accepted, "rejected: {}", reply.error);
        }
    };

    // Live traffic reaches Meta, and its status webhooks come back through ingest.
    submit(order("perm-live-1", PHONE, 1)).await;
    submit(order("perm-live-2", PHONE, 2)).await;
    assert!(wait_state("perm-live-1", &SENT).await, "{:?}", state_of("perm-live-1").await);
    assert!(wait_state("perm-live-2", &[OperationState::Read]).await, "{:?}", state_of("perm-live-2").await);
    assert!(producer.status(PHONE, "perm-live-2").await.expect("status answered").found);

    // A webhook delivery over the server's max_payload goes through ingest's object store first.
    let wamid = state_of("perm-live-2").await.expect("entry").wamid;
    let pad = "p".repeat(2_800);
    let statuses: Vec<serde_json::Value> = (0..400)
        .map(|_| {
            serde_json::json!({"id": wamid, "status": "read", "timestamp": "1750030073", "recipient_id": "5491177700002",
                "biz_opaque_callback_data": "perm-live-2", "conversation": {"id": pad, "origin": {"type": "utility"}}})
        })
        .collect();
    let body = bw_e2e::status_webhook(PHONE, statuses);
    assert!(body.len() > 1024 * 1024, "over the default max_payload of accounts.conf");
    assert_eq!(bw_e2e::post_webhook(&ingest_http, body).await, 200, "the large delivery is stored");
    let bodies = operator.js.get_object_store(bw_ingest::BODIES_BUCKET).await.expect("object store");
    let processed = bw_testkit::wait_until(WAIT, || async {
        use futures::StreamExt;
        let Ok(webhooks) = operator.js.get_stream(names::WEBHOOK_STREAM).await else { return false };
        if webhooks.get_info().await.map(|i| i.state.messages).unwrap_or(1) > 0 {
            return false;
        }
        let Ok(mut list) = bodies.list().await else { return false };
        while let Some(o) = list.next().await {
            if o.is_ok_and(|o| o.name.starts_with("webhook.")) {
                return false;
            }
        }
        true
    })
    .await;
    assert!(processed, "the large delivery was processed and its body deleted");

    // Meta accepts one but the answer never comes in time: the dispatcher puts it in BW_UNKNOWN, the status
    // webhooks resolve it (never resent).
    sim.set_scenario(failing(FaultKind::Hang { hold_ms: 2_000, accept: true }));
    submit(order("perm-unknown-1", PHONE, 6)).await;
    let resolved = bw_testkit::wait_until(WAIT, || async {
        state_of("perm-unknown-1").await.is_some_and(|e| e.flagged_unknown && e.state().is_accepted_by_meta())
    })
    .await;
    assert!(resolved, "{:?}", state_of("perm-unknown-1").await);
    assert_eq!(sim.oracle().get("perm-unknown-1").map(|e| e.count), Some(1), "never resent");

    // Meta fails: two operations exhaust their retries into the DLQ.
    sim.set_scenario(failing(FaultKind::Error { code: 131000, http_status: None, subcode: None }));
    submit(order("perm-dlq-1", PHONE, 3)).await;
    submit(order("perm-dlq-2", PHONE_PURGED, 4)).await;
    assert!(wait_state("perm-dlq-1", &[OperationState::Dlq]).await, "{:?}", state_of("perm-dlq-1").await);
    assert!(wait_state("perm-dlq-2", &[OperationState::Dlq]).await, "{:?}", state_of("perm-dlq-2").await);
    let seen = violations(&nats);
    assert!(seen.is_empty(), "the services and the producer did only what their users allow:\n{}", seen.join("\n"));

    // Refused: the dispatcher (like every service) cannot purge the DLQ, delete one of its messages, nor run the
    // operator's purge, which stops at its first read and changes nothing.
    let dispatcher = deps_as(&nats, "dispatcher", None).await;
    let mut dlq = dispatcher.js.get_stream(names::DLQ_STREAM).await.expect("stream info is allowed");
    assert!(dlq.purge().await.is_err(), "the dispatcher purged the DLQ");
    assert!(logged_violation(&nats, "dispatcher", "$JS.API.STREAM.PURGE.BW_DLQ").await);
    let first = dlq.info().await.expect("info").state.first_sequence;
    assert!(dlq.delete_message(first).await.is_err(), "the dispatcher deleted a DLQ message");
    assert!(logged_violation(&nats, "dispatcher", "$JS.API.STREAM.MSG.DELETE.BW_DLQ").await);
    let purge =
        bw_ops::ops::purge_dlq(&dispatcher.js, &dispatcher.buckets, Some(PHONE_PURGED), 10, &mut |_, _| {}).await;
    assert!(purge.is_err(), "the dispatcher ran the operator's purge");
    assert_eq!(state_of("perm-dlq-2").await.map(|e| e.state()), Some(OperationState::Dlq), "left as it was");
    assert_eq!(dlq.info().await.expect("info").state.messages, 2, "both entries are still in the DLQ");

    // Only the operator may: bwctl, as the operator user, looks and purges one sender's DLQ entry.
    let operator_url = url_of(&nats, "operator");
    let bwctl = |args: &'static [&'static str]| crate::bwctl(&operator_url, args);
    for args in [&["scopes"][..], &["dlq", "stats"], &["dlq", "inspect"], &["op", "perm-live-2"]] {
        let (code, out) = bwctl(args).await;
        assert_eq!(code, 0, "bwctl {args:?}:\n{out}");
    }
    let (code, out) = bwctl(&["dlq", "purge", "--scope", PHONE_PURGED, "--yes"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(state_of("perm-dlq-2").await.map(|e| e.state()), Some(OperationState::Expired), "{out}");

    // Meta refuses two for good: they go to the quarantine; the operator looks and purges one.
    sim.set_scenario(failing(FaultKind::Error { code: 131026, http_status: None, subcode: None }));
    submit(order("perm-q-1", PHONE_PURGED, 7)).await;
    submit(order("perm-q-2", PHONE_PURGED, 8)).await;
    assert!(wait_state("perm-q-1", &[OperationState::Quarantined]).await, "{:?}", state_of("perm-q-1").await);
    assert!(wait_state("perm-q-2", &[OperationState::Quarantined]).await, "{:?}", state_of("perm-q-2").await);
    for args in [
        &["quarantine", "stats"][..],
        &["quarantine", "inspect"],
        &["quarantine", "purge", "--ids", "perm-q-2", "--yes"],
    ] {
        let (code, out) = bwctl(args).await;
        assert_eq!(code, 0, "bwctl {args:?}:\n{out}");
    }
    assert_eq!(state_of("perm-q-2").await.map(|e| e.state()), Some(OperationState::Expired));

    // Meta recovers. The operator replays the other quarantined one (through the replay lane to the
    // dispatcher); replay (started now, so it does not replay into the failure) sends the DLQ entry.
    sim.set_scenario(Scenario::default());
    let (code, out) = bwctl(&["quarantine", "replay", "--ids", "perm-q-1"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(wait_state("perm-q-1", &SENT).await, "{:?}", state_of("perm-q-1").await);
    assert_eq!(sim.oracle().get("perm-q-1").map(|e| e.count), Some(1), "accepted once");
    let mut pairs = nats_env(&nats, "replay");
    pairs.extend([("admin.listen", "127.0.0.1:0".to_string()), ("replay.idle_ms", "100".to_string())]);
    let cfg: bw_replay::Config =
        bw_common::config::load("replay", bw_replay::DEFAULT_CONFIG, None, &env_for("replay", &pairs))
            .expect("replay config");
    let deps = Deps::connect("replay", &cfg.nats, None, WAIT).await.expect("replay connects");
    services.keep(&deps.clone(), |t| tokio::spawn(bw_replay::run(cfg, deps, t)));
    assert!(services.ready().await, "replay starts as its user: {:?}", violations(&nats));
    assert!(wait_state("perm-dlq-1", &SENT).await, "{:?}", state_of("perm-dlq-1").await);
    assert_eq!(state_of("perm-dlq-1").await.map(|e| e.replays), Some(1), "replayed once");
    assert_eq!(sim.oracle().get("perm-dlq-1").map(|e| e.count), Some(1), "accepted once");
    assert!(wait_state("perm-dlq-1", &[OperationState::Read]).await, "{:?}", state_of("perm-dlq-1").await);

    // Alerting consumed the events the others published.
    let alerting_saw_events = bw_testkit::wait_until(WAIT, || async {
        let Ok(stream) = operator.js.get_stream(names::EVENTS_STREAM).await else { return false };
        let Ok(mut consumer) = stream.get_consumer::<async_nats::jetstream::consumer::pull::Config>("alerting").await
        else {
            return false;
        };
        consumer.info().await.is_ok_and(|i| i.ack_floor.consumer_sequence > 0)
    })
    .await;
    assert!(alerting_saw_events, "alerting acked events");

    // The accounting check runs as the operator too, and finds every operation in one place.
    let (code, out) = bwctl(&["account"]).await;
    assert_eq!(code, 0, "{out}");
    // (The dispatcher's refused probes above came from a test connection, named test-<user>.)
    let seen: Vec<String> = violations(&nats).into_iter().filter(|l| !l.contains(":test-")).collect();
    assert!(seen.is_empty(), "bwctl did only what the operator user allows:\n{}", seen.join("\n"));

    // The operator cannot break the pipeline: no stream deleted, purged or reconfigured, no service consumer
    // deleted, no send as a producer, nothing on the live lanes.
    let probe = async_nats::ConnectOptions::with_user_and_password("operator".into(), password("operator"))
        .name("test-operator")
        .connect(format!("127.0.0.1:{}", nats.port()))
        .await
        .expect("the operator connects");
    let probe_js = async_nats::jetstream::ContextBuilder::new().timeout(Duration::from_secs(2)).build(probe.clone());
    assert!(probe_js.delete_stream(names::DLQ_STREAM).await.is_err(), "the operator deleted the DLQ");
    assert!(logged_violation(&nats, "operator", "$JS.API.STREAM.DELETE.BW_DLQ").await);
    let mut send = probe_js.get_stream(names::SEND_STREAM).await.expect("stream info is allowed");
    assert!(send.purge().await.is_err(), "the operator purged BW_SEND");
    assert!(logged_violation(&nats, "operator", "$JS.API.STREAM.PURGE.BW_SEND").await);
    let mut config = send.info().await.expect("info").config.clone();
    config.max_age = Duration::from_secs(1);
    assert!(probe_js.update_stream(config).await.is_err(), "the operator reconfigured BW_SEND");
    assert!(logged_violation(&nats, "operator", "$JS.API.STREAM.UPDATE.BW_SEND").await);
    let consumers: Vec<String> = {
        use futures::TryStreamExt;
        send.consumer_names().try_collect().await.expect("consumer names are allowed")
    };
    let lane = consumers.first().cloned().expect("the dispatcher's consumers");
    assert!(send.delete_consumer(&lane).await.is_err(), "the operator deleted {lane}");
    assert!(logged_violation(&nats, "operator", &format!("$JS.API.CONSUMER.DELETE.BW_SEND.{lane}")).await);
    probe.publish(names::intake_subject(PHONE), "x".into()).await.expect("queued locally");
    let live = names::outbox_subject(names::Lane::High, PHONE);
    probe.publish(live.clone(), "x".into()).await.expect("queued locally");
    probe.flush().await.expect("flush");
    assert!(logged_violation(&nats, "operator", "bw.send.v1.").await);
    assert!(logged_violation(&nats, "operator", &live).await);

    // More refusals. A service is not a producer: no send request on bw.send.v1.*.
    dispatcher.nats.publish(names::intake_subject(PHONE), "x".into()).await.expect("queued locally");
    dispatcher.nats.flush().await.expect("flush");
    assert!(logged_violation(&nats, "dispatcher", "bw.send.v1.").await);
    // No service reads another's replies: the dispatcher cannot subscribe to ingest's inbox nor the shared one.
    let _snoop = dispatcher.nats.subscribe("_INBOX_ingest.>".to_string()).await.expect("queued locally");
    let _shared = dispatcher.nats.subscribe("_INBOX.>".to_string()).await.expect("queued locally");
    dispatcher.nats.flush().await.expect("flush");
    assert!(logged_violation(&nats, "dispatcher", "_INBOX_ingest.>").await);
    assert!(logged_violation(&nats, "dispatcher", "\"_INBOX.>\"").await);
    // Alerting cannot read or write the ledger (recipients, bodies).
    let alerting = deps_as(&nats, "alerting", None).await;
    assert!(alerting.buckets.ledger[0].get("perm-live-1").await.is_err(), "alerting read the ledger");
    assert!(logged_violation(&nats, "alerting", "$JS.API.DIRECT.GET.KV_BW_LEDGER").await);
    assert!(alerting.buckets.ledger[0].put("perm-live-1", "x".into()).await.is_err(), "alerting wrote the ledger");
    assert!(logged_violation(&nats, "alerting", "$KV.BW_LEDGER.perm-live-1").await);
    // Replay cannot put anything on the live lanes, only on the replay lanes.
    let replay = deps_as(&nats, "replay", None).await;
    let live = names::outbox_subject(names::Lane::High, PHONE);
    assert!(bw_common::nats::publish_durable(&replay.js, live.clone(), Default::default(), "x".into()).await.is_err());
    assert!(logged_violation(&nats, "replay", &live).await);
    // The coordinator cannot delete a stream; ingest cannot purge the quarantine.
    let coordinator = deps_as(&nats, "breaker-coordinator", None).await;
    assert!(coordinator.js.delete_stream(names::SEND_STREAM).await.is_err());
    assert!(logged_violation(&nats, "breaker-coordinator", "$JS.API.STREAM.DELETE.BW_SEND").await);
    let ingest = deps_as(&nats, "ingest", None).await;
    let quarantine = ingest.js.get_stream(names::QUARANTINE_STREAM).await.expect("stream info is allowed");
    assert!(quarantine.purge().await.is_err(), "ingest purged the quarantine");
    assert!(logged_violation(&nats, "ingest", "$JS.API.STREAM.PURGE.BW_QUARANTINE").await);

    // Every violation the server logged came from this test's probing connections (named test-<user>), none
    // from a running service or the producer.
    let from_services: Vec<String> = violations(&nats).into_iter().filter(|l| !l.contains(":test-")).collect();
    assert!(from_services.is_empty(), "the services did what their users do not allow:\n{}", from_services.join("\n"));

    services.stop().await;
}

/// Any service may start first on an empty server: each user alone creates the whole shared topology.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_user_alone_creates_the_shared_topology() {
    for (user, _) in SERVICES {
        let nats = server();
        let deps = deps_as(&nats, user, None).await;
        let names: Vec<String> = bw_common::nats::stream_configs(&Default::default(), 1, Default::default())
            .into_iter()
            .map(|c| c.name)
            .collect();
        for name in names {
            assert!(deps.js.get_stream(&name).await.is_ok(), "{user} created {name}");
        }
        assert!(violations(&nats).is_empty(), "{user}: {:?}", violations(&nats));
    }
}

/// A ledger and BW_SEND in two partitions each under `scripts/nats-accounts.sh 2 --send 2`: every service user
/// ensures the topology with `nats.ledger_partitions = 2` and `nats.send_partitions = 2`, the ledger's users
/// (ingest, dispatcher, replay) write and read an operation of the second partition, ingest's feed publisher
/// consumes that partition's stream, ingest stores a request of a sender of the second send partition, replay
/// puts one back on its replay lane and reads that lane's depth, the dispatcher consumes both from BW_SEND_1,
/// the operator's bwctl reads every partition, and the server logs no violation; alerting still may not read
/// the ledger, in either partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accounts_for_a_partitioned_ledger_let_each_service_use_every_partition() {
    let nats = server_from_script(&["2", "--send", "2"]);

    // An operation id of the second partition.
    let op = (0..).map(|i| format!("perm-part-{i}")).find(|op| names::ledger_partition(op, 2) == 1).expect("id");
    // A sender of the second send partition.
    let send = names::SendPartitions::new(2);
    let phone = (0..).map(|i| format!("1065403522{i:05}")).find(|p| send.of(p) == 1).expect("phone");
    let request = bw_e2e::order(&phone, &op, 1);
    for (user, _) in SERVICES {
        let deps = deps_partitioned(&nats, user, None, 2, 2).await;
        assert_eq!((deps.buckets.ledger.len(), deps.buckets.wamid.len()), (2, 2), "{user} opened both partitions");
        assert_eq!(deps.buckets.send, send, "{user} created or found both send partitions");
        let store = |lane| {
            let (js, subject) = (deps.js.clone(), send.outbox_subject(lane, &phone));
            let payload = prost::Message::encode_to_vec(&request);
            async move { bw_common::nats::publish_durable(&js, subject, Default::default(), payload.into()).await }
        };
        match user {
            "ingest" => {
                store(names::Lane::High).await.expect("ingest stores onto the second send partition");
            }
            "replay" => {
                store(names::Lane::PriorityReplay).await.expect("replay puts back onto the second send partition");
                let lane = send.outbox_subject(names::Lane::PriorityReplay, &phone);
                let depth = bw_ops::scan::subject_depth(&deps.js, "BW_SEND_1", &lane).await.expect("lane depth");
                assert_eq!(depth, 1);
            }
            _ => {}
        }
        if matches!(user, "ingest" | "dispatcher" | "replay") {
            let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
            let request = bw_e2e::order(PHONE, &op, 1);
            ledger.create(&bw_common::ledger::entry_for(&request, OperationState::Queued)).await.expect("create");
            assert!(ledger.get(&op).await.expect("read").is_some(), "{user} reads the second partition");
        }
        if matches!(user, "ingest" | "dispatcher") {
            // wamid links of every partition: the dispatcher writes one after a send; ingest writes one on a status
            // unless it exists, and reads them to find a status's operation.
            let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
            for i in 0..8 {
                let wamid = format!("wamid.perm-{user}-{i}");
                if user == "dispatcher" {
                    ledger.link_wamid(&wamid, &op).await.expect("link");
                } else {
                    ledger.link_wamid_once(&wamid, &op).await.expect("link");
                    let found = ledger.operation_for_wamid(&wamid).await.expect("read");
                    assert_eq!(found.as_deref(), Some(op.as_str()));
                }
            }
            let stream = deps.js.get_stream(&deps.buckets.wamid[1].stream_name).await.expect("stream info");
            let in_second = stream.cached_info().state.messages;
            assert!(in_second > 0, "some of the links are in the second partition");
        }
        if user == "ingest" {
            // The feed publisher's durable consumer on the second partition's stream.
            let stream = deps.js.get_stream("KV_BW_LEDGER_1").await.expect("stream info");
            let config = async_nats::jetstream::consumer::pull::Config {
                durable_name: Some("feed-publisher".into()),
                ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
                ..Default::default()
            };
            stream.get_or_create_consumer("feed-publisher", config).await.expect("feed consumer on partition 1");
        }
    }
    // The dispatcher consumes what ingest and replay stored in the second send partition.
    let dispatcher = deps_partitioned(&nats, "dispatcher", None, 2, 2).await;
    for lane in [names::Lane::PriorityReplay, names::Lane::High] {
        use futures::StreamExt;
        let consumer = bw_dispatcher::partition_lane_consumer(&dispatcher.js, 1, lane, Duration::from_secs(5))
            .await
            .expect("consumer on BW_SEND_1");
        let mut batch = consumer.fetch().max_messages(1).messages().await.expect("fetch");
        let msg = batch.next().await.expect("one message").expect("delivered");
        assert_eq!(names::phone_of_subject(&msg.subject), phone);
        msg.double_ack().await.expect("acked");
    }
    // The DLQ follows: the dispatcher dead-letters into BW_DLQ_1, the operator sees the entry, and replay's
    // consumer of that sender takes it from there.
    let envelope = bw_proto::v1::DlqEnvelope { request: Some(request.clone()), ..Default::default() };
    let dlq_subject = send.dlq_subject(request.category(), &phone);
    let payload = prost::Message::encode_to_vec(&envelope);
    bw_common::nats::publish_durable(&dispatcher.js, dlq_subject.clone(), Default::default(), payload.into())
        .await
        .expect("the dispatcher dead-letters into the second partition");
    let operator = bw_cli::connect(&url_of(&nats, "operator")).await.expect("bwctl connects as the operator");
    let (items, _) = bw_ops::inspect::dlq_items(&operator.js, operator.buckets.send, None).await.expect("dlq read");
    assert_eq!(items.iter().map(|i| i.subject.as_str()).collect::<Vec<_>>(), [dlq_subject.as_str()]);
    let replay = deps_partitioned(&nats, "replay", None, 2, 2).await;
    let stream = replay.js.get_stream("BW_DLQ_1").await.expect("dlq partition");
    let config = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some(bw_wire::names::replay_class_consumer("p", &phone)),
        filter_subject: send.dlq_class_filter("p", &phone),
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(&bw_wire::names::replay_class_consumer("p", &phone), config).await;
    let consumer = consumer.expect("replay's consumer on BW_DLQ_1");
    {
        use futures::StreamExt;
        let mut batch = consumer.fetch().max_messages(1).messages().await.expect("fetch");
        batch.next().await.expect("the entry").expect("delivered").double_ack().await.expect("acked");
    }
    assert_eq!(operator.buckets.ledger.len(), 2, "bwctl found both partitions");
    assert_eq!(operator.buckets.send, send, "bwctl found both send partitions");
    let report = bw_ops::account::account(&operator.js, &operator.buckets).await.expect("operator accounts");
    assert_eq!(report.stream_messages.get(names::SEND_STREAM), Some(&0), "every send partition read, drained");
    let entries = bw_ops::account::ledger_entries(&operator.js, &operator.buckets).await.expect("operator reads");
    assert!(entries.iter().any(|e| e.operation_id == op), "the operator reads the second partition");
    assert_eq!(violations(&nats), Vec::<String>::new(), "no permissions violation");

    let alerting = deps_partitioned(&nats, "alerting", None, 2, 2).await;
    assert!(alerting.buckets.ledger[1].get(&op).await.is_err(), "alerting read the second partition");
}

/// A service whose NATS user lacks a right it needs stops its start-up at the first refusal and names the
/// refused subject, instead of retrying for the whole start-up budget (30 s for the dispatcher's consumers)
/// and failing with a bare timeout. Here: the dispatcher set to a two-partition ledger under the
/// one-partition accounts.conf, whose dispatcher user may not create the second partition's bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_nats_right_stops_start_up_at_once_and_names_the_refused_subject() {
    let nats = server();
    let cfg = NatsConfig {
        url: url_of(&nats, "dispatcher"),
        name: "test-dispatcher".into(),
        inbox_prefix: "_INBOX_dispatcher".into(),
        replicas: 1,
        ledger_partitions: 2,
        send_partitions: 1,
        tls_ca_file: String::new(),
        limits: Default::default(),
    };
    // A budget no JetStream request timeout comes near: an error naming the subject can only come from the stop.
    let failed = Deps::connect("dispatcher", &cfg, None, Duration::from_secs(120)).await.err().expect("start-up fails");
    let message = format!("{failed:#}");
    assert!(message.contains("KV_BW_LEDGER_1"), "names the refused subject: {message}");
    assert!(message.contains("accounts.conf"), "says where the right is granted: {message}");
    assert!(message.contains("jetstream topology"), "names the step: {message}");
    assert!(!message.contains(&password("dispatcher")), "never prints the password: {message}");
}

/// The wire journal (`dispatch.wire_guarantee = "journal"`) under `scripts/nats-accounts.sh 1 --send 2`: the
/// dispatcher, as its own user, creates each send partition's journal stream and the partitions' lease bucket,
/// takes both partitions over (an OWNER record in each journal) with no violation logged; another service's
/// user may neither append to a journal nor write a partition's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_keeps_its_wire_journal_as_its_own_user_and_no_other_service_writes_it() {
    let nats = server_from_script(&["1", "--send", "2"]);
    let redis = RedisServer::start();

    let mut pairs = nats_env(&nats, "dispatcher");
    pairs.extend([
        ("nats.send_partitions", "2".to_string()),
        ("redis.url", redis.url()),
        ("admin.listen", "127.0.0.1:0".to_string()),
        // No message is sent here: Meta is never called.
        ("meta.base_url", "http://127.0.0.1:9".to_string()),
        ("meta.access_token", ACCESS_TOKEN.to_string()),
        ("tenancy.mode", "dev".to_string()),
        ("dispatch.wire_guarantee", "journal".to_string()),
        ("dispatch.wire_lease_ms", "1000".to_string()),
    ]);
    let cfg = bw_dispatcher::Config::load(None, &env_for("dispatcher", &pairs)).expect("dispatcher config");
    let deps = Deps::connect("dispatcher", &cfg.nats, Some(&cfg.redis), WAIT).await.expect("dispatcher connects");
    let mut services = Services { health: Vec::new(), tokens: Vec::new(), handles: Vec::new() };
    services.keep(&deps.clone(), |t| tokio::spawn(bw_dispatcher::run(cfg, deps, t)));
    assert!(services.ready().await, "the dispatcher starts in journal mode: {:?}", violations(&nats));

    // Read as the dispatcher's own user: each journal holds its OWNER record once the partition is taken over.
    let dispatcher = deps_partitioned(&nats, "dispatcher", None, 1, 2).await;
    for partition in 0..2 {
        let stream = names::WireJournal(partition).stream();
        let owned = bw_testkit::wait_until(WAIT, || async {
            match dispatcher.js.get_stream(&stream).await {
                Ok(mut s) => s.info().await.is_ok_and(|i| i.state.last_sequence >= 1),
                Err(_) => false,
            }
        })
        .await;
        assert!(owned, "{stream} taken over: {:?}", violations(&nats));
    }
    assert_eq!(violations(&nats), Vec::<String>::new(), "no permissions violation");

    for (user, subject) in [
        ("ingest", names::WireJournal(0).sends_subject()),
        ("replay", names::WireJournal(1).owner_subject()),
        ("breaker-coordinator", format!("$KV.{}.p0", names::WIRE_OWNERS_BUCKET)),
    ] {
        let other = deps_partitioned(&nats, user, None, 1, 2).await;
        let _ = other.nats.publish(subject.clone(), "forged".into()).await;
        let _ = other.nats.flush().await;
        assert!(logged_violation(&nats, user, &subject).await, "{user} may not write {subject}");
    }
    services.stop().await;
}
