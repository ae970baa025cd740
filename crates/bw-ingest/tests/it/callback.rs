//! Signed HTTP callbacks: feed events POSTed to a real local receiver (an axum server on a loopback port) that
//! records every request and answers from a script (500, 429 with Retry-After, 400 for its first calls, then
//! 200). Retry delays are shortened in these configs, and the receiver's 127.0.0.1 is allowed explicitly
//! (`egress.allow_cidrs`; the compiled default allows no loopback address); `compiled_defaults_*` and
//! `callback_destinations_*` check the defaults users run.

use crate::support::{self, WAIT, start};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bw_client::{Client, Request};
use bw_ingest::callback::{ATTEMPT_HEADER, EVENT_ID_HEADER, SIGNATURE_HEADER, STATE_BUCKET};
use bw_ingest::{CallbackConfig, Config};
use bw_proto::v1::OperationState;
use hmac::{KeyInit, Mac};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

const WABA: &str = "1001";
const PHONE: &str = "2002";
const OTHER_PHONE: &str = "2003";
const RECIPIENT: &str = "+5491155551234";
const BODY_TEXT: &str = "hola, tu pedido 8812 ya salio";
const SECRET: &str = "cb-secret-Zq81";

/// One recorded request.
#[derive(Debug, Clone)]
struct Seen {
    event_id: String,
    attempt: u32,
    signature: String,
    content_type: String,
    body: Vec<u8>,
}

/// An answer of the script.
#[derive(Debug, Clone, Copy)]
enum Reply {
    Status(u16),
    RetryAfter(u16, u64),
}

#[derive(Default)]
struct Inner {
    seen: Vec<Seen>,
    script: VecDeque<Reply>,
    /// Answer once the script is used up (200 unless set).
    then: Option<u16>,
}

/// The producer's receiver.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Inner>>);

impl Receiver {
    /// Starts a receiver answering `script` for its first calls, then `then` (200 when None).
    async fn start(script: Vec<Reply>, then: Option<u16>) -> (Receiver, String) {
        let r = Receiver::default();
        {
            let mut inner = r.0.lock().expect("lock");
            inner.script = script.into();
            inner.then = then;
        }
        let router = axum::Router::new().route("/hooks/bw", axum::routing::post(record)).with_state(r.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind receiver");
        let url = format!("http://{}/hooks/bw?token=q-secret", listener.local_addr().expect("addr"));
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        (r, url)
    }

    fn seen(&self) -> Vec<Seen> {
        self.0.lock().expect("lock").seen.clone()
    }

    fn of(&self, op: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.event_id.starts_with(&format!("{op}."))).collect()
    }

    async fn wait_for(&self, op: &str, n: usize) -> bool {
        bw_testkit::wait_until(WAIT, || async { self.of(op).len() >= n }).await
    }
}

async fn record(State(r): State<Receiver>, headers: HeaderMap, body: bytes::Bytes) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut inner = r.0.lock().expect("lock");
    inner.seen.push(Seen {
        event_id: header(EVENT_ID_HEADER),
        attempt: header(ATTEMPT_HEADER).parse().unwrap_or(0),
        signature: header(SIGNATURE_HEADER),
        content_type: header("content-type"),
        body: body.to_vec(),
    });
    let reply = inner.script.pop_front().unwrap_or(Reply::Status(inner.then.unwrap_or(200)));
    let code = |s: u16| StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    match reply {
        Reply::Status(s) => code(s).into_response(),
        Reply::RetryAfter(s, secs) => (code(s), [("retry-after", secs.to_string())]).into_response(),
    }
}

/// A callback for PHONE with short retry delays.
fn callback(url: &str) -> CallbackConfig {
    CallbackConfig {
        url: url.to_string(),
        secret: SECRET.into(),
        tenant: Some(bw_wire::tenancy::DEFAULT_TENANT.into()),
        phone_number_ids: vec![PHONE.into()],
        kinds: vec![],
        timeout_ms: 5_000,
        max_in_flight: 16,
        retry_ms: vec![50, 100],
        retry_after_max_ms: 5_000,
        max_age_ms: 86_400_000,
    }
}

fn with(url: &str, edit: impl FnOnce(&mut CallbackConfig)) -> impl FnOnce(&mut Config) {
    let mut c = callback(url);
    edit(&mut c);
    move |cfg: &mut Config| {
        cfg.callbacks.insert("crm".into(), c);
        cfg.egress.allow_cidrs = vec!["127.0.0.1".into()];
    }
}

async fn send(env: &support::Env, op: &str, phone: &str) {
    let reply = Client::new(env.nats.clone())
        .send(&Request::text(op, WABA, phone, RECIPIENT, BODY_TEXT).build())
        .await
        .expect("intake reply");
    assert!(reply.accepted, "{reply:?}");
}

fn hmac_hex(body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The callback consumer's unacknowledged and undelivered counts.
async fn backlog(env: &support::Env) -> (usize, u64) {
    let stream = env.js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed stream");
    let info = stream.consumer_info("callback-crm").await.expect("callback consumer");
    (info.num_ack_pending, info.num_pending)
}

/// Waits until the callback consumer has settled everything it was given.
async fn settled(env: &support::Env) -> bool {
    bw_testkit::wait_until(WAIT, || async { backlog(env).await == (0, 0) }).await
}

/// The value of `bw_callback_deliveries_total{callback="crm",result=...}` (0 when absent).
fn deliveries(text: &str, result: &str) -> u64 {
    let key = format!("bw_callback_deliveries_total{{callback=\"crm\",result=\"{result}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

async fn wait_metric(env: &support::Env, result: &str, n: u64) -> bool {
    bw_testkit::wait_until(WAIT, || async { deliveries(&env.metrics_text(), result) >= n }).await
}

#[tokio::test]
async fn callback_events_reach_the_receiver_signed_with_their_id_and_no_personal_data() {
    let (receiver, url) = Receiver::start(vec![], None).await;
    let env = start(with(&url, |_| {})).await;
    // Another sender's event is not this callback's.
    send(&env, "cb-other", OTHER_PHONE).await;
    send(&env, "cb-1", PHONE).await;
    assert!(receiver.wait_for("cb-1", 1).await, "the accepted event arrives: {:?}", receiver.seen());
    env.ledger
        .update("cb-1", |cur| {
            let mut next = cur?.clone();
            next.set_state(OperationState::Sent);
            next.wamid = "wamid.CB1".into();
            next.attempts = 1;
            Some(next)
        })
        .await
        .expect("ledger");
    assert!(receiver.wait_for("cb-1", 2).await, "the sent event arrives: {:?}", receiver.seen());

    let seen = receiver.of("cb-1");
    let mut kinds = Vec::new();
    for s in &seen {
        assert_eq!(s.signature, hmac_hex(&s.body), "signed with the callback secret over the raw body");
        assert!(bw_ingest::webhook::signature_valid(SECRET.as_bytes(), &s.body, Some(&s.signature)));
        assert_eq!(s.content_type, "application/json");
        assert_eq!(s.attempt, 1);
        let v: serde_json::Value = serde_json::from_slice(&s.body).expect("json body");
        assert_eq!(s.event_id, format!("cb-1.{}", v["revision"]), "{v}");
        assert_eq!(v["event_id"], s.event_id.as_str());
        assert_eq!((v["operation_id"].as_str(), v["phone_number_id"].as_str()), (Some("cb-1"), Some(PHONE)));
        assert!(v["at_ms"].as_i64().is_some_and(|ms| ms > 0), "{v}");
        assert!(v["at"].as_str().is_some_and(|t| t.ends_with('Z') && t.contains('T')), "{v}");
        let text = String::from_utf8_lossy(&s.body);
        for personal in ["5491155551234", "1155551234", "55551234", BODY_TEXT, "pedido"] {
            assert!(!text.contains(personal), "`{personal}` in {text}");
        }
        kinds.push((v["kind"].as_str().unwrap_or("").to_string(), v["state"].as_str().unwrap_or("").to_string()));
        if v["kind"] == "sent" {
            assert_eq!(v["wamid"], "wamid.CB1");
        }
    }
    kinds.sort();
    assert_eq!(kinds, vec![("accepted".into(), "queued".into()), ("sent".into(), "sent".into())]);
    assert!(settled(&env).await, "both acked");
    assert!(receiver.of("cb-other").is_empty(), "another sender's event was delivered");
    let metrics = env.metrics_text();
    assert_eq!(deliveries(&metrics, "delivered"), 2, "{metrics}");
    assert!(metrics.contains("bw_callback_request_seconds_count{callback=\"crm\"} 2"), "{metrics}");
    assert!(!metrics.contains(SECRET) && !metrics.contains("q-secret"));
    env.stop().await;
}

#[tokio::test]
async fn a_callback_answered_500_twice_gets_the_same_event_three_times_then_is_done() {
    let (receiver, url) = Receiver::start(vec![Reply::Status(500), Reply::Status(500)], None).await;
    let env = start(with(&url, |_| {})).await;
    send(&env, "cb-retry", PHONE).await;
    assert!(receiver.wait_for("cb-retry", 3).await, "three attempts: {:?}", receiver.seen());
    assert!(settled(&env).await, "acked after the 200");
    assert!(wait_metric(&env, "delivered", 1).await);
    let seen = receiver.of("cb-retry");
    assert_eq!(seen.iter().map(|s| s.attempt).collect::<Vec<_>>(), vec![1, 2, 3], "no 4th after the 200");
    assert!(seen.iter().all(|s| s.event_id == seen[0].event_id && s.body == seen[0].body), "one event, same body");
    let metrics = env.metrics_text();
    assert_eq!((deliveries(&metrics, "retried"), deliveries(&metrics, "delivered")), (2, 1), "{metrics}");
    // The retry state is gone once delivered.
    let state = env.js.get_key_value(STATE_BUCKET).await.expect("retry-state bucket");
    assert!(state.get(format!("crm.{}", seen[0].event_id)).await.expect("kv read").is_none());
    env.stop().await;
}

#[tokio::test]
async fn a_callback_answered_429_with_retry_after_is_retried() {
    let (receiver, url) = Receiver::start(vec![Reply::RetryAfter(429, 1)], None).await;
    let env = start(with(&url, |_| {})).await;
    send(&env, "cb-429", PHONE).await;
    assert!(receiver.wait_for("cb-429", 2).await, "retried after Retry-After: {:?}", receiver.seen());
    assert!(settled(&env).await);
    assert_eq!(receiver.of("cb-429").iter().map(|s| s.attempt).collect::<Vec<_>>(), vec![1, 2]);
    let metrics = env.metrics_text();
    assert_eq!((deliveries(&metrics, "retried"), deliveries(&metrics, "delivered")), (1, 1), "{metrics}");
    env.stop().await;
}

#[tokio::test]
async fn a_callback_answered_400_is_not_retried() {
    let (receiver, url) = Receiver::start(vec![], Some(400)).await;
    let env = start(with(&url, |_| {})).await;
    send(&env, "cb-400", PHONE).await;
    assert!(receiver.wait_for("cb-400", 1).await);
    // Terminated: the broker never hands it out again.
    assert!(settled(&env).await, "refused events leave the consumer");
    assert!(wait_metric(&env, "refused", 1).await);
    assert_eq!(receiver.of("cb-400").len(), 1, "{:?}", receiver.seen());
    let metrics = env.metrics_text();
    assert_eq!(deliveries(&metrics, "retried"), 0, "{metrics}");
    // The event is still in the feed for the producer.
    assert!(env.count(bw_ingest::feed::FEED_STREAM).await >= 1);
    env.stop().await;
}

#[tokio::test]
async fn a_callback_event_past_its_max_age_is_dropped() {
    let (receiver, url) = Receiver::start(vec![], Some(503)).await;
    let env = start(with(&url, |c| {
        c.retry_ms = vec![100];
        c.max_age_ms = 400;
    }))
    .await;
    send(&env, "cb-old", PHONE).await;
    assert!(wait_metric(&env, "expired", 1).await, "dropped at its max age: {}", env.metrics_text());
    assert!(settled(&env).await);
    let tries = receiver.of("cb-old").len();
    assert!(tries >= 1, "tried before the max age");
    let metrics = env.metrics_text();
    assert_eq!(deliveries(&metrics, "retried") as usize, tries - 1, "{metrics}");
    assert_eq!(deliveries(&metrics, "expired"), 1, "{metrics}");
    env.stop().await;
}

#[tokio::test]
async fn two_ingest_instances_deliver_each_callback_event_once() {
    let (receiver, url) = Receiver::start(vec![], None).await;
    let env = start(with(&url, |_| {})).await;
    let mut cfg = support::test_config(&env.server.url());
    with(&url, |_| {})(&mut cfg);
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let token = tokio_util::sync::CancellationToken::new();
    let second = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "second ready");
    for i in 0..20 {
        send(&env, &format!("cb-two-{i}"), PHONE).await;
    }
    let distinct = || {
        let mut ids: Vec<String> = receiver.seen().into_iter().map(|s| s.event_id).collect();
        ids.sort();
        ids.dedup();
        ids.len()
    };
    assert!(bw_testkit::wait_until(WAIT, || async { distinct() == 20 }).await, "{:?}", receiver.seen());
    assert!(settled(&env).await);
    let seen = receiver.seen();
    // Every answer was 200, so no retry: each event exactly once across both instances.
    assert_eq!(seen.len(), 20, "{seen:?}");
    assert!(seen.iter().all(|s| s.attempt == 1));
    let mut counts: HashMap<String, usize> = HashMap::new();
    for s in &seen {
        *counts.entry(s.event_id.clone()).or_default() += 1;
    }
    assert!(counts.values().all(|n| *n == 1), "{counts:?}");
    token.cancel();
    tokio::time::timeout(WAIT, second).await.expect("second stops").expect("joins").expect("ok");
    env.stop().await;
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

const URL_KEY: &str = "BW_INGEST__CALLBACKS__CRM__URL";
const SECRET_KEY: &str = "BW_INGEST__CALLBACKS__CRM__SECRET";
const PHONES_KEY: &str = "BW_INGEST__CALLBACKS__CRM__PHONE_NUMBER_IDS";
const TENANT_KEY: &str = "BW_INGEST__CALLBACKS__CRM__TENANT";

#[test]
fn callback_configs_that_cannot_work_are_refused_without_the_secret() {
    let ok =
        [(URL_KEY, "https://crm.example/hooks"), (SECRET_KEY, SECRET), (PHONES_KEY, "[\"2002\"]"), (TENANT_KEY, "crm")];
    let load = |over: &[(&str, &str)]| {
        let mut pairs: Vec<(&str, &str)> =
            ok.iter().filter(|(k, _)| !over.iter().any(|(o, _)| o == k)).copied().collect();
        pairs.extend(over.iter().filter(|(_, v)| !v.is_empty()).copied());
        Config::load(None, &env(&pairs))
    };
    assert!(load(&[]).is_ok(), "{:?}", load(&[]).err());
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[(URL_KEY, "ftp://crm.example/hooks")], "callbacks.crm.url: scheme `ftp` is not http or https"),
        (&[(URL_KEY, "crm.example/hooks")], "callbacks.crm.url must be an absolute http:// or https:// URL"),
        (&[(SECRET_KEY, "")], "callbacks.crm.secret is empty"),
        (&[(PHONES_KEY, "")], "callbacks.crm.phone_number_ids is empty"),
        (&[(PHONES_KEY, "[]")], "callbacks.crm.phone_number_ids is empty"),
        (&[(TENANT_KEY, "")], "callbacks.crm.tenant is required"),
        (&[(TENANT_KEY, "CRM")], "callbacks.crm.tenant must be"),
        (&[("BW_INGEST__CALLBACKS__CRM__TIMEOUT_MS", "0")], "callbacks.crm.timeout_ms must be > 0"),
        (&[("BW_INGEST__CALLBACKS__CRM__KINDS", "[\"deliverd\"]")], "callbacks.crm.kinds: unknown kind `deliverd`"),
        (&[("BW_INGEST__CALLBACKS__CRM__RETRY_MS", "[]")], "callbacks.crm.retry_ms"),
    ];
    for (over, expect) in cases {
        let err = load(over).expect_err("refused").to_string();
        assert!(err.contains(expect), "{over:?}: `{err}` should contain `{expect}`");
        assert!(!err.contains(SECRET), "the secret in `{err}`");
    }
    // A secret that looks like a number stays text and is never printed.
    let cfg = load(&[(SECRET_KEY, "8675309123")]).expect("numeric secret loads");
    assert_eq!(cfg.callbacks["crm"].secret, "8675309123");
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("8675309123") && !shown.contains(SECRET), "{shown}");
}

#[test]
fn the_binary_exits_64_on_an_invalid_callback_without_printing_the_secret() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bw-ingest"))
        .env(URL_KEY, "ftp://crm.example/hooks")
        .env(SECRET_KEY, SECRET)
        .env(PHONES_KEY, "*")
        .env(TENANT_KEY, "crm")
        .env("BW_INGEST__NATS__URL", format!("nats://127.0.0.1:{}", bw_testkit::free_port()))
        .output()
        .expect("binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("callbacks.crm.url"), "{stderr}");
    assert!(!stderr.contains(SECRET) && !String::from_utf8_lossy(&out.stdout).contains(SECRET), "{stderr}");
}

#[test]
fn compiled_defaults_run_no_callback_and_fill_a_configured_one_with_the_documented_schedule() {
    let cfg = Config::load(None, &HashMap::new()).expect("defaults load");
    assert!(cfg.callbacks.is_empty(), "no callback by default");
    // Configured through the environment only, with every optional key at its compiled default.
    let cfg = Config::load(
        None,
        &env(&[(URL_KEY, "https://crm.example/hooks"), (SECRET_KEY, SECRET), (PHONES_KEY, "*"), (TENANT_KEY, "crm")]),
    )
    .expect("a minimal callback loads and validates");
    let c = &cfg.callbacks["crm"];
    assert_eq!(c.phone_number_ids, vec!["*".to_string()]);
    assert_eq!(c.retry_ms, vec![1_000, 5_000, 30_000, 120_000, 600_000, 3_600_000]);
    assert_eq!((c.timeout_ms, c.max_in_flight), (5_000, 16));
    assert_eq!((c.retry_after_max_ms, c.max_age_ms), (3_600_000, 86_400_000));
    assert!(c.kinds.is_empty());
    assert_eq!(c.tenant.as_deref(), Some("crm"));
    assert_eq!(bw_ingest::callback::filters("crm", &c.phone_number_ids), vec!["bw.feed.v1.crm.>".to_string()]);
    // The commented example in default.toml, uncommented, is valid and states the same defaults.
    let mut example = String::new();
    let mut inside = false;
    for line in bw_ingest::DEFAULT_CONFIG.lines() {
        if line.starts_with("[callbacks]") {
            inside = true;
            continue;
        }
        if inside && line.starts_with('[') {
            break;
        }
        let Some(rest) = line.strip_prefix("# ") else { continue };
        let is_key =
            rest.split_once(" = ").is_some_and(|(k, _)| k.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        if inside && (rest.starts_with("[callbacks.") || is_key) {
            example.push_str(rest);
            example.push('\n');
        }
    }
    assert!(example.contains("[callbacks.crm]") && example.contains("retry_ms"), "{example}");
    let dir = std::env::temp_dir().join(format!("bw-ingest-cb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("ingest.toml");
    std::fs::write(&file, &example).expect("write");
    let from_file = Config::load(Some(&file), &env(&[(SECRET_KEY, SECRET)])).expect("the documented example loads");
    let d = &from_file.callbacks["crm"];
    assert_eq!(
        (d.retry_ms.clone(), d.timeout_ms, d.max_in_flight, d.retry_after_max_ms, d.max_age_ms),
        (c.retry_ms.clone(), c.timeout_ms, c.max_in_flight, c.retry_after_max_ms, c.max_age_ms),
        "default.toml documents the compiled defaults"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn callbacks_run_as_the_ingest_nats_user_without_a_permissions_violation() {
    let (receiver, url) = Receiver::start(vec![Reply::Status(500)], None).await;
    let server = crate::support::accounts_server();
    let port = server.port();
    // The operator registers the number to `crm`, whose callback this is; ingest runs as its own user at the
    // compiled default tenancy.
    let operator = async_nats::ConnectOptions::with_user_and_password("operator".into(), "op-pw".into())
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("operator connects");
    support::register(&async_nats::jetstream::new(operator), PHONE, WABA, "crm").await;
    let mut cfg = support::test_config(&format!("nats://ingest:ingest-pw@127.0.0.1:{port}"));
    cfg.nats.inbox_prefix = "_INBOX_ingest".into();
    with(&url, |c| c.tenant = Some("crm".into()))(&mut cfg);
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("service connects");
    let token = tokio_util::sync::CancellationToken::new();
    let ingest = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    let violations = || {
        let log = std::fs::read_to_string(server.dir().join("nats.log")).unwrap_or_default();
        log.lines().filter(|l| l.contains("Violation")).map(str::to_string).collect::<Vec<_>>()
    };
    assert!(
        bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await,
        "ingest ready as its user: {:?}",
        violations()
    );
    let producer = bw_client::tenant_options("crm", "crm-pw")
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("producer connects");
    let reply = Client::new(producer)
        .send(&Request::text("cb-perm", WABA, PHONE, RECIPIENT, BODY_TEXT).build())
        .await
        .expect("reply");
    assert!(reply.accepted);
    // A 500 then a 200: the consumer's nak and ack, the retry state's write, read and delete, all as ingest.
    assert!(receiver.wait_for("cb-perm", 2).await, "retried: {:?} {:?}", receiver.seen(), violations());
    let operator = async_nats::ConnectOptions::with_user_and_password("operator".into(), "op-pw".into())
        .connect(format!("127.0.0.1:{port}"))
        .await
        .expect("operator connects");
    let op_js = async_nats::jetstream::new(operator);
    let acked = || async {
        let stream = op_js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed");
        let info = stream.consumer_info("callback-crm").await.expect("consumer");
        (info.num_ack_pending, info.num_pending) == (0, 0)
    };
    assert!(bw_testkit::wait_until(WAIT, acked).await, "acked as ingest: {:?}", violations());
    let seen = receiver.of("cb-perm");
    assert_eq!(seen.iter().map(|s| s.attempt).collect::<Vec<_>>(), vec![1, 2]);
    let state = op_js.get_key_value(STATE_BUCKET).await.expect("bucket");
    let key = format!("crm.{}", seen[0].event_id);
    let last = state.entry(&key).await.expect("kv read");
    assert!(
        last.is_some_and(|e| e.operation != async_nats::jetstream::kv::Operation::Put),
        "the retry state was written, then deleted"
    );
    assert!(violations().is_empty(), "{:?}", violations());
    token.cancel();
    tokio::time::timeout(WAIT, ingest).await.expect("stops").expect("joins").expect("ok");
}

#[tokio::test]
async fn a_callback_delivers_only_its_tenants_events() {
    let (receiver, url) = Receiver::start(vec![], None).await;
    // The CRM's callback lists its own number and the shop's: the shop's is left out at start-up.
    let senders = [("4001", WABA, "crm"), ("4002", "1002", "shop")];
    let env = support::start_registered(
        &senders,
        with(&url, |c| {
            c.tenant = Some("crm".into());
            c.phone_number_ids = vec!["4001".into(), "4002".into()];
        }),
    )
    .await;
    let stream = env.js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed stream");
    let info = stream.consumer_info("callback-crm").await.expect("callback consumer");
    assert_eq!(info.config.filter_subject, "bw.feed.v1.crm.4001.>", "{:?}", info.config);
    assert!(info.config.filter_subjects.is_empty(), "{:?}", info.config);

    let crm = Client::new(support::producer(&env.server.url(), "crm").await);
    let shop = Client::new(support::producer(&env.server.url(), "shop").await);
    assert!(shop.send(&Request::text("cb-t", "1002", "4002", RECIPIENT, BODY_TEXT).build()).await.expect("r").accepted);
    assert!(crm.send(&Request::text("cb-t", WABA, "4001", RECIPIENT, BODY_TEXT).build()).await.expect("r").accepted);
    assert!(receiver.wait_for("cb-t", 1).await, "{:?}", receiver.seen());
    assert!(settled(&env).await);
    let seen = receiver.seen();
    assert_eq!(seen.len(), 1, "the shop's event of the same id is not the CRM's: {seen:?}");
    let v: serde_json::Value = serde_json::from_slice(&seen[0].body).expect("json");
    assert_eq!((v["tenant"].as_str(), v["operation_id"].as_str()), (Some("crm"), Some("cb-t")), "{v}");
    assert_eq!(v["phone_number_id"], "4001");
    env.stop().await;
}

#[tokio::test]
async fn a_callback_consumer_with_a_filter_from_before_tenants_is_updated_at_start() {
    let (_receiver, url) = Receiver::start(vec![], None).await;
    let mut env = start(with(&url, |_| {})).await;
    env.token.cancel();
    let task = env.task.take().expect("running");
    tokio::time::timeout(WAIT, task).await.expect("stops").expect("joins").expect("ok");
    // The consumer as it was before tenants: the sender's subjects without a tenant token.
    let stream = env.js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed stream");
    let old = async_nats::jetstream::consumer::pull::Config {
        durable_name: Some("callback-crm".into()),
        filter_subject: format!("bw.feed.v1.{PHONE}.>"),
        deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
        ack_policy: async_nats::jetstream::consumer::AckPolicy::Explicit,
        ack_wait: std::time::Duration::from_secs(30),
        max_deliver: -1,
        max_ack_pending: 50_000,
        ..Default::default()
    };
    stream.create_consumer(old).await.expect("old consumer");
    // Started again: the filter is the tenant's.
    let mut cfg = support::test_config(&env.server.url());
    with(&url, |_| {})(&mut cfg);
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let token = tokio_util::sync::CancellationToken::new();
    let again = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ready again");
    let info = stream.consumer_info("callback-crm").await.expect("consumer");
    assert_eq!(info.config.filter_subject, format!("bw.feed.v1.default.{PHONE}.>"));
    token.cancel();
    tokio::time::timeout(WAIT, again).await.expect("stops").expect("joins").expect("ok");
}

/// SSRF: at the compiled defaults a callback aimed at the metadata service, a private network or this machine
/// is a configuration error naming the callback and the kind of address (never the address); allowed
/// explicitly, 127.0.0.1 works (every test above).
#[test]
fn callback_destinations_inside_are_refused_by_default_and_named_precisely() {
    for (url, range) in [
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.1:8080/hooks", "private"),
        ("http://[::1]:9000/hooks", "loopback"),
        ("http://127.0.0.1:9000/hooks", "loopback"),
        ("http://[::ffff:a9fe:a9fe]/", "link-local"),
        ("http://100.64.0.7/hooks", "shared (CGNAT)"),
        ("http://224.0.0.1/hooks", "multicast"),
        ("http://[fd00::1]/hooks", "unique-local"),
    ] {
        let err =
            Config::load(None, &env(&[(URL_KEY, url), (SECRET_KEY, SECRET), (PHONES_KEY, "*"), (TENANT_KEY, "crm")]))
                .expect_err("refused")
                .to_string();
        assert!(err.contains("callbacks.crm.url") && err.contains(&format!("a {range} address")), "{url}: {err}");
        assert!(err.contains("egress.allow_cidrs"), "{err}");
        let host = reqwest::Url::parse(url).expect("url").host_str().expect("host").to_string();
        assert!(!err.contains(&host), "the address is not shown: {err}");
    }
    let allowed = env(&[
        (URL_KEY, "http://127.0.0.1:9000/hooks"),
        (SECRET_KEY, SECRET),
        (PHONES_KEY, "*"),
        (TENANT_KEY, "crm"),
        ("BW_INGEST__EGRESS__ALLOW_CIDRS", "[\"127.0.0.1\"]"),
    ]);
    assert!(Config::load(None, &allowed).is_ok(), "allowed explicitly");
    let bad_range = env(&[("BW_INGEST__EGRESS__ALLOW_CIDRS", "[\"10.0.0.1/8\"]")]);
    let err = Config::load(None, &bad_range).expect_err("bad range").to_string();
    assert!(err.contains("egress.allow_cidrs: `10.0.0.1/8`"), "{err}");
}

/// A host name is resolved when ingest starts: `localhost` is loopback, so ingest refuses to start with the
/// callback's name in the error, and starts once loopback is allowed.
#[tokio::test]
async fn a_callback_host_resolving_to_loopback_stops_start_up_unless_allowed() {
    let (receiver, url) = Receiver::start(vec![], None).await;
    let port = reqwest::Url::parse(&url).expect("url").port().expect("port");
    let by_name = format!("http://localhost:{port}/hooks/bw");
    let server = bw_testkit::NatsServer::start();
    let mut cfg = support::test_config(&server.url());
    cfg.callbacks.insert("crm".into(), callback(&by_name));
    let admin = async_nats::connect(server.url()).await.expect("connects");
    support::register(&async_nats::jetstream::new(admin), PHONE, WABA, bw_wire::tenancy::DEFAULT_TENANT).await;
    let deps = bw_common::service::Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps");
    let token = tokio_util::sync::CancellationToken::new();
    let run = bw_ingest::run(cfg.clone(), deps.clone(), token.clone());
    let err = tokio::time::timeout(WAIT, run).await.expect("ends").expect_err("refused at start-up").to_string();
    assert!(err.contains("callbacks.crm.url") && err.contains("loopback"), "{err}");
    assert!(!err.contains("127.0.0.1") && !err.contains("::1"), "no resolved address shown: {err}");
    // Allowed, the name works and events are delivered through it.
    cfg.egress.allow_cidrs = vec!["127.0.0.0/8".into(), "::1".into()];
    let ingest = tokio::spawn(bw_ingest::run(cfg, deps.clone(), token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ready");
    let producer = support::producer(&server.url(), bw_wire::tenancy::DEFAULT_TENANT).await;
    let reply = Client::new(producer)
        .send(&Request::text("cb-localhost", WABA, PHONE, RECIPIENT, BODY_TEXT).build())
        .await
        .expect("reply");
    assert!(reply.accepted);
    assert!(receiver.wait_for("cb-localhost", 1).await, "delivered through the allowed name");
    token.cancel();
    tokio::time::timeout(WAIT, ingest).await.expect("stops").expect("joins").expect("ok");
}
