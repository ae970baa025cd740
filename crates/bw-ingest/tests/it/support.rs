//! Shared harness: a NATS server, an ingest instance on bound listeners, and helpers to inspect streams.
//!
//! Ingest runs at the compiled default tenancy (the sender registry): [`start`] registers the test senders
//! ([`SENDERS`]) to the tenant `default` first, so their operation keys are the bare ids, and the producer
//! connection ([`Env::nats`]) takes its replies on `default`'s inbox prefix.
#![expect(clippy::disallowed_methods, reason = "the test support drains streams without a service handler")]

use bw_common::ledger::Ledger;
use bw_common::registry::Registry;
use bw_common::service::Deps;
use bw_ingest::{Config, Listeners};
use bw_proto::v1::{LedgerEntry, OperationState, OutcomeEvent, SenderRecord};
use bw_testkit::NatsServer;
use bw_wire::tenancy::{self, DEFAULT_TENANT};
use std::net::SocketAddr;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub(crate) const APP_SECRET: &str = "test-app-secret";
pub(crate) const VERIFY_TOKEN: &str = "test-verify-token";
/// The producer key the tests configure (allowed for the intake tests' phone number id 2002).
pub(crate) const API_KEY: &str = "test-producer-key";
pub(crate) const WAIT: Duration = Duration::from_secs(10);
/// The senders the tests use, registered to the tenant `default` by [`start`]: (phone_number_id, waba_id).
pub(crate) const SENDERS: [(&str, &str); 3] =
    [("2002", "1001"), ("2003", "1001"), ("106540352242922", "102290129340398")];

/// A running ingest with its own NATS server.
pub(crate) struct Env {
    pub(crate) server: NatsServer,
    /// A producer connection of the tenant `default` (replies on its inbox prefix).
    pub(crate) nats: async_nats::Client,
    pub(crate) js: async_nats::jetstream::Context,
    pub(crate) deps: Deps,
    pub(crate) ledger: Ledger,
    pub(crate) http: SocketAddr,
    pub(crate) token: CancellationToken,
    pub(crate) task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

/// nats-server with deploy/nats/accounts.conf, the very file, its producers' region generated for the tenant `crm`
/// owning 2002 and 2003 (what `bwctl senders nats-accounts` prints), and a password for each of its users
/// (`ingest` is `ingest-pw`, the operator `op-pw`, the producer `producer-crm` is `crm-pw`, on the inbox prefix
/// `_INBOX_crm`).
pub(crate) fn accounts_server() -> NatsServer {
    let conf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/accounts.conf");
    let base = std::fs::read_to_string(&conf).expect("accounts.conf");
    let records: Vec<SenderRecord> = ["2002", "2003"]
        .into_iter()
        .map(|phone| SenderRecord {
            phone_number_id: phone.into(),
            waba_id: "1001".into(),
            tenant: "crm".into(),
            ..Default::default()
        })
        .collect();
    let generated = bw_ops::senders::render_accounts(&base, &records).expect("producers generated");
    let path = std::env::temp_dir().join(format!("bw-ingest-accounts-{}.conf", bw_testkit::free_port()));
    std::fs::write(&path, generated).expect("written");
    let server = NatsServer::start_with_config(
        &path,
        &[
            ("BW_NATS_INGEST_PASSWORD", "ingest-pw"),
            ("BW_NATS_DISPATCHER_PASSWORD", "dispatcher-pw"),
            ("BW_NATS_REPLAY_PASSWORD", "replay-pw"),
            ("BW_NATS_BREAKER_COORDINATOR_PASSWORD", "coordinator-pw"),
            ("BW_NATS_ALERTING_PASSWORD", "alerting-pw"),
            ("BW_NATS_CONSOLE_PASSWORD", "console-pw"),
            ("BW_NATS_OPERATOR_PASSWORD", "op-pw"),
            ("BW_NATS_PRODUCER_CRM_PASSWORD", "crm-pw"),
        ],
    );
    let _ = std::fs::remove_file(&path);
    server
}

/// The compiled defaults with test-friendly values.
pub(crate) fn test_config(nats_url: &str) -> Config {
    let mut cfg = Config::load(None, &Default::default()).expect("defaults load");
    cfg.nats.url = nats_url.to_string();
    cfg.admin.listen = "127.0.0.1:0".into();
    cfg.http.listen = "127.0.0.1:0".into();
    cfg.webhook.app_secret = APP_SECRET.into();
    cfg.webhook.verify_token = VERIFY_TOKEN.into();
    cfg.intake.api_keys.insert(
        "test".into(),
        bw_ingest::ApiKeyConfig {
            sha256: bw_ingest::key_sha256(API_KEY),
            tenant: Some(DEFAULT_TENANT.into()),
            phone_number_ids: vec!["2002".into()],
            waba_ids: vec![],
        },
    );
    cfg.reconciler.review_delay_ms = 500;
    cfg.shutdown.grace_ms = 2_000;
    cfg
}

/// Registers `phone` (of `waba`) to `tenant` in the sender registry, as `bwctl senders add` does.
pub(crate) async fn register(js: &async_nats::jetstream::Context, phone: &str, waba: &str, tenant: &str) {
    let registry = Registry::open(js, 1).await.expect("registry opens");
    let record = SenderRecord {
        phone_number_id: phone.into(),
        waba_id: waba.into(),
        tenant: tenant.into(),
        updated_at_unix_ms: bw_common::time::now_ms(),
        ..Default::default()
    };
    registry.add(&record).await.expect("sender registered");
}

/// A producer connection of `tenant`: its replies come back on the tenant's inbox prefix.
pub(crate) async fn producer(url: &str, tenant: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .custom_inbox_prefix(tenancy::inbox_prefix(tenant))
        .connect(url)
        .await
        .expect("producer connects")
}

/// Starts NATS and ingest; `edit` adjusts the config first.
pub(crate) async fn start(edit: impl FnOnce(&mut Config)) -> Env {
    start_registered(&[], edit).await
}

/// [`start`] with `senders` (phone_number_id, waba_id, tenant) registered too before ingest starts.
pub(crate) async fn start_registered(senders: &[(&str, &str, &str)], edit: impl FnOnce(&mut Config)) -> Env {
    let server = NatsServer::start();
    let mut cfg = test_config(&server.url());
    edit(&mut cfg);
    let admin = async_nats::connect(server.url()).await.expect("nats connects");
    let admin_js = async_nats::jetstream::new(admin);
    let defaults = SENDERS.iter().map(|(phone, waba)| (*phone, *waba, DEFAULT_TENANT));
    for (phone, waba, tenant) in defaults.chain(senders.iter().copied()) {
        register(&admin_js, phone, waba, tenant).await;
    }
    let deps = Deps::connect("ingest", &cfg.nats, None, WAIT).await.expect("deps connect");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind http");
    let http = listener.local_addr().expect("local addr");
    let token = CancellationToken::new();
    let task =
        tokio::spawn(bw_ingest::run_on(cfg, deps.clone(), Listeners { http: listener, webhook: None }, token.clone()));
    let health = deps.health.clone();
    assert!(bw_testkit::wait_until(WAIT, || async { health.check().await.is_empty() }).await, "ingest ready");
    Env {
        nats: producer(&server.url(), DEFAULT_TENANT).await,
        js: deps.js.clone(),
        ledger: Ledger::new(&deps.buckets),
        deps,
        server,
        http,
        token,
        task: Some(task),
    }
}

impl Env {
    /// Number of messages currently in a stream.
    pub(crate) async fn count(&self, stream: &str) -> u64 {
        let s = self.js.get_stream(stream).await.expect("stream exists");
        s.get_info().await.expect("stream info").state.messages
    }

    /// Waits until a stream holds `n` messages.
    pub(crate) async fn wait_count(&self, stream: &str, n: u64) -> bool {
        bw_testkit::wait_until(WAIT, || async { self.count(stream).await == n }).await
    }

    /// The last message on a subject of a stream.
    pub(crate) async fn last(&self, stream: &str, subject: &str) -> async_nats::jetstream::message::StreamMessage {
        let s = self.js.get_stream(stream).await.expect("stream exists");
        s.get_last_raw_message_by_subject(subject).await.expect("message on subject")
    }

    /// The ledger entry of an operation.
    pub(crate) async fn entry(&self, op: &str) -> Option<LedgerEntry> {
        self.ledger.get(op).await.expect("ledger readable").map(|v| v.entry)
    }

    /// Waits until the ledger shows `state` for `op`.
    pub(crate) async fn wait_state(&self, op: &str, state: OperationState) -> bool {
        bw_testkit::wait_until(WAIT, || async { self.entry(op).await.is_some_and(|e| e.state() == state) }).await
    }

    /// The Prometheus text of the service's registry.
    pub(crate) fn metrics_text(&self) -> String {
        let mut out = String::new();
        let registry = self.deps.metrics.lock().expect("registry lock");
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encode");
        out
    }

    /// Base URL of the HTTP server.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// Stops ingest and checks it returned cleanly.
    pub(crate) async fn stop(mut self) {
        self.token.cancel();
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(WAIT, task).await.expect("stops in time").expect("task joins");
            result.expect("run returns Ok");
        }
    }
}

/// A tenant's durable consumer on its feed subjects of one sender (what a producer binds).
pub(crate) struct Feed(async_nats::jetstream::consumer::pull::Stream);

impl Feed {
    /// Binds (or creates) `durable` on `tenant`'s feed subjects of `phone`.
    pub(crate) async fn follow(js: &async_nats::jetstream::Context, tenant: &str, phone: &str, durable: &str) -> Feed {
        use async_nats::jetstream::consumer;
        let stream = js.get_stream(bw_ingest::feed::FEED_STREAM).await.expect("feed stream");
        let config = consumer::pull::Config {
            durable_name: Some(durable.to_string()),
            filter_subject: tenancy::feed_sender_filter(tenant, phone),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        };
        let consumer = stream.get_or_create_consumer(durable, config).await.expect("feed consumer");
        Feed(consumer.messages().await.expect("feed messages"))
    }

    /// The next event (acked) and the subject it was published on.
    pub(crate) async fn next(&mut self) -> (OutcomeEvent, String) {
        use futures::StreamExt as _;
        use prost::Message as _;
        let msg =
            tokio::time::timeout(WAIT, self.0.next()).await.expect("an event in time").expect("open").expect("ok");
        msg.ack().await.expect("ack");
        (OutcomeEvent::decode(msg.payload.as_ref()).expect("OutcomeEvent"), msg.subject.to_string())
    }
}

/// A ledger entry in `state` for tests that start mid-pipeline.
pub(crate) fn entry_in(op: &str, state: OperationState) -> LedgerEntry {
    LedgerEntry {
        operation_id: op.into(),
        state: state as i32,
        waba_id: "102290129340398".into(),
        phone_number_id: "106540352242922".into(),
        category: bw_proto::v1::Category::Transactional as i32,
        ..Default::default()
    }
}

/// An HTTP client without proxies that presents the test producer key.
pub(crate) fn http_client() -> reqwest::Client {
    bw_common::crypto::install_crypto();
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = format!("Bearer {API_KEY}");
    headers.insert(reqwest::header::AUTHORIZATION, bearer.parse().expect("header value"));
    reqwest::Client::builder().no_proxy().default_headers(headers).build().expect("http client")
}

/// An HTTP client without proxies and without a key.
pub(crate) fn bare_http_client() -> reqwest::Client {
    bw_common::crypto::install_crypto();
    reqwest::Client::builder().no_proxy().build().expect("http client")
}
