//! Ingest: the front door of Breakwater.
//!
//! It accepts producer send requests over NATS request/reply (`bw.send.v1.<phone_number_id>`, queue group
//! `bw-ingest`) and HTTP (`POST /v1/messages`), validates them, stores them durably in BW_SEND (message id =
//! operation id) and creates their ledger entry, answering each with an `IntakeReply`. It receives Meta
//! webhooks (verification handshake, HMAC-checked deliveries stored raw in BW_WEBHOOKS before answering 200),
//! processes the stored deliveries asynchronously (statuses → ledger, inbound messages → BW_INBOUND, error
//! codes → signals), and reconciles unknown send outcomes from BW_UNKNOWN by the per-category policy. It
//! publishes the outcome feed (BW_FEED) and, when configured, POSTs its events to producers' URLs as signed
//! HTTP callbacks ([`callback`]).
//!
//! Must not: call Meta, lose or silently drop valid input, answer a webhook 200 before it is stored, log
//! message bodies, secrets or full phone numbers. Any number of instances share every consumer.
//!
//! Entry point: [`run`] (or [`run_on`] with listeners bound by the caller).

mod asyncfail;
mod auth;
mod bodies;
pub mod callback;
mod capacity;
mod cidr;
mod config;
pub mod egress;
pub mod feed;
mod guard;
mod http;
mod inbound;
pub mod inbound_rate;
mod intake;
mod metrics;
mod processing;
mod processor;
mod reconciler;
mod secret;
pub mod signals;
mod template_category;
pub mod validate;
pub mod webhook;

pub use auth::{ApiKeyConfig, AuthMode, key_sha256};
pub use bodies::{BODIES_BUCKET, OBJECT_HEADER};
pub use callback::CallbackConfig;
pub use config::{
    Config, DEFAULT_CONFIG, EgressConfig, FeedConfig, HttpConfig, IntakeConfig, ReconcilerConfig, ShutdownConfig,
    WebhookConfig,
};
pub use intake::OrderConfig;
pub use reconciler::{Policies, Policy};

use crate::capacity::limits_not_applied;
use crate::config::refused_destination;
use async_nats::jetstream::consumer::{self, pull};
use bw_common::service::Deps;
use bw_wire::names;
use bw_wire::tenancy::TenancyMode;
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Secret values the local stack, the drill, the simulator and the tests use; a production ingest with one of
/// them accepts deliveries anyone can sign.
const LOCAL_APP_SECRETS: [&str; 5] =
    ["local-app-secret", "local-sim-app-secret", "sim-app-secret", "drill-app-secret", "test-app-secret"];

/// Start-up warnings about the configuration (never printing a secret).
fn warn_about(cfg: &Config, keys: &auth::Keys) {
    if cfg.tenancy.mode == TenancyMode::Dev {
        tracing::warn!(
            "tenancy.mode = \"dev\": any producer may send as any number (every number is the tenant `default`'s); \
             run with the sender registry (bwctl senders add) outside the local stack"
        );
        let named = |t: &Option<String>| t.as_deref().is_some_and(|t| t != bw_wire::tenancy::DEFAULT_TENANT);
        for (name, _) in cfg.intake.api_keys.iter().filter(|(_, k)| named(&k.tenant)) {
            tracing::warn!(key = %name, "intake.api_keys.{name}.tenant is ignored in dev mode: the key acts for `default`");
        }
        for (name, _) in cfg.callbacks.iter().filter(|(_, c)| named(&c.tenant)) {
            tracing::warn!(callback = %name, "callbacks.{name}.tenant is ignored in dev mode: it reads `default`'s events");
        }
    }
    if cfg.webhook.app_secret.is_empty() {
        tracing::warn!("webhook.app_secret is empty: every webhook delivery will be refused with 401");
    } else if LOCAL_APP_SECRETS.contains(&cfg.webhook.app_secret.as_str())
        && !bw_common::config::points_at_this_machine(&cfg.nats.url)
    {
        tracing::warn!(
            "webhook.app_secret is a well-known local default outside the local stack: set the Meta app secret (BW_INGEST__WEBHOOK__APP_SECRET)"
        );
    }
    for (name, c) in &cfg.callbacks {
        if c.url.starts_with("http://") && !bw_common::config::points_at_this_machine(&c.url) {
            let url = callback::masked_url(&c.url);
            tracing::warn!(callback = %name, url = %url, "callback over plain http: events travel unencrypted");
        }
    }
    match keys.mode() {
        AuthMode::Disabled => {
            tracing::warn!("intake.auth = \"disabled\": the HTTP intake accepts requests without an API key")
        }
        AuthMode::Required if keys.is_empty() => tracing::warn!(
            "intake.auth = \"required\" and no intake.api_keys configured: every HTTP intake request is refused with 401"
        ),
        AuthMode::Required => {}
    }
}

/// Listeners bound by the caller (tests bind port 0 and read the addresses first).
pub struct Listeners {
    /// Producer intake, and the webhook routes when `webhook` is None.
    pub http: TcpListener,
    /// Separate listener for the webhook routes.
    pub webhook: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses of `cfg.http`.
    pub async fn bind(cfg: &HttpConfig) -> anyhow::Result<Listeners> {
        let http = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|e| anyhow::anyhow!("cannot bind http listener on {}: {e}", cfg.listen))?;
        let webhook = if cfg.webhook_listen.is_empty() {
            None
        } else {
            Some(
                TcpListener::bind(&cfg.webhook_listen)
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot bind webhook listener on {}: {e}", cfg.webhook_listen))?,
            )
        };
        Ok(Listeners { http, webhook })
    }
}

/// Runs ingest until `shutdown`, binding the listeners from `cfg.http`.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    let listeners = Listeners::bind(&cfg.http).await?;
    run_on(cfg, deps, listeners, shutdown).await
}

/// Creates (or binds to) the durable pull consumer of the webhook processor.
async fn webhook_consumer(js: &async_nats::jetstream::Context, cfg: &WebhookConfig) -> anyhow::Result<pull::Stream> {
    let stream = js.get_stream(names::WEBHOOK_STREAM).await?;
    let config = pull::Config {
        durable_name: Some(names::WEBHOOK_CONSUMER.to_string()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_millis(cfg.ack_wait_ms),
        max_deliver: -1,
        max_ack_pending: (cfg.max_in_flight * 64).max(1024) as i64,
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(names::WEBHOOK_CONSUMER, config).await?;
    Ok(consumer.stream().max_messages_per_batch(cfg.max_in_flight.max(1)).messages().await?)
}

/// Creates (or binds to) the durable pull consumer of the reconciler.
async fn reconciler_consumer(
    js: &async_nats::jetstream::Context,
    cfg: &ReconcilerConfig,
) -> anyhow::Result<pull::Stream> {
    let stream = js.get_stream(names::UNKNOWN_STREAM).await?;
    let config = pull::Config {
        durable_name: Some(names::RECONCILER_CONSUMER.to_string()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        max_deliver: -1,
        // Entries waiting for their review time sit in delayed redelivery; keep room for many.
        max_ack_pending: 100_000,
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(names::RECONCILER_CONSUMER, config).await?;
    Ok(consumer.stream().max_messages_per_batch(cfg.max_in_flight.max(1)).messages().await?)
}

/// Pulls from `messages` and runs `handle` on each, at most `max_in_flight` at once, until `shutdown`.
async fn consume<F, Fut>(
    mut messages: pull::Stream,
    max_in_flight: usize,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    handle: F,
) where
    F: Fn(async_nats::jetstream::Message) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1)));
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
        };
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            n = messages.next() => n,
        };
        match next {
            Some(Ok(msg)) => {
                let fut = handle(msg);
                tracker.spawn(async move {
                    let _permit = permit;
                    fut.await;
                });
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pull consumer error; continuing");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            None => break,
        }
    }
}

/// Runs ingest on listeners bound by the caller until `shutdown`, then drains in-flight work.
pub async fn run_on(cfg: Config, deps: Deps, listeners: Listeners, shutdown: CancellationToken) -> anyhow::Result<()> {
    cfg.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let metrics = metrics::Metrics::register(&deps.metrics);
    let ledger = bw_common::ledger::Ledger::new(&deps.buckets);
    let budget = Duration::from_secs(30);
    let max_payload = deps.nats.server_info().max_payload;
    let limits = &cfg.nats.limits;
    // Streams and buckets created before they had byte limits (or whose limits changed) get them now.
    let started = std::time::Instant::now();
    let refused = || deps.refusals.since(started).is_some();
    let applied = deps
        .startup_step("stream limits", budget, || bw_common::nats::apply_limits(&deps.js, &cfg.nats, &refused))
        .await?;
    if !applied.updated.is_empty() {
        tracing::info!(streams = ?applied.updated, "byte limits and discard policies applied to existing streams");
    }
    for (stream, error) in &applied.failed {
        limits_not_applied(stream, error);
    }
    let bodies = deps
        .startup_step("large-body object store", budget, || {
            bodies::Bodies::ensure(&deps.js, cfg.nats.replicas, max_payload, limits.bodies_max_bytes)
        })
        .await?;
    deps.startup_step("feed stream", budget, || {
        feed::ensure_stream(&deps.js, cfg.nats.replicas, limits.feed_max_bytes)
    })
    .await?;
    let capacity = Arc::new(capacity::Capacity::new(
        deps.buckets.send,
        deps.buckets.ledger.len(),
        cfg.intake.storage_full_ratio,
        &deps.metrics,
    ));
    capacity.refresh(&deps.js).await;
    let egress = Arc::new(egress::Policy::from_config(&cfg.egress.allow_cidrs).map_err(|e| anyhow::anyhow!(e))?);
    let registry = bw_common::registry::view_for(cfg.tenancy.mode, &deps, cfg.nats.replicas, shutdown.clone()).await?;
    let display_tz: chrono_tz::Tz = cfg.feed.display_time_zone.parse().unwrap_or(chrono_tz::UTC);
    let order = match (&deps.redis, cfg.order.keep.is_empty()) {
        (_, true) => None,
        (Some(redis), false) => Some(intake::Order {
            book: bw_breaker::OrderBook::new(
                redis.clone(),
                Duration::from_millis(cfg.redis.timeout_ms),
                cfg.order.ttl_ms,
            ),
            cfg: cfg.order.clone(),
        }),
        (None, false) => {
            // Only when embedded without Redis (tests of other parts); the binary connects whenever order is on.
            tracing::warn!(categories = ?cfg.order.keep, "no redis connection: per-recipient order is not kept");
            None
        }
    };
    let intake = Arc::new(intake::Intake {
        order,
        bodies: bodies.clone(),
        js: deps.js.clone(),
        send: deps.buckets.send,
        ledger: ledger.clone(),
        limits: cfg.intake.limits(),
        metrics: metrics.clone(),
        registry: registry.clone(),
        tenancy: cfg.tenancy.mode,
        capacity: capacity.clone(),
        templates: deps
            .redis
            .clone()
            .map(|redis| template_category::TemplateCategory::new(redis, Duration::from_millis(cfg.redis.timeout_ms))),
    });
    let keys =
        auth::Keys::new(cfg.intake.auth, &cfg.intake.api_keys, cfg.tenancy.mode).map_err(|e| anyhow::anyhow!(e))?;
    warn_about(&cfg, &keys);
    let state = http::HttpState {
        intake: intake.clone(),
        js: deps.js.clone(),
        metrics: metrics.clone(),
        verify_token: Arc::from(cfg.webhook.verify_token.as_str()),
        app_secret: Arc::from(cfg.webhook.app_secret.as_bytes()),
        max_webhook_bytes: cfg.webhook.max_body_bytes,
        webhook_guard: Arc::new(guard::WebhookGuard::new(&cfg.webhook).map_err(|e| anyhow::anyhow!(e))?),
        max_intake_body_bytes: cfg.intake.max_request_bytes.saturating_mul(4),
        intake_slots: Arc::new(tokio::sync::Semaphore::new(cfg.intake.max_in_flight)),
        keys: Arc::new(keys),
        ledger: ledger.clone(),
        display_tz,
        status_enabled: cfg.feed.status_enabled,
    };
    let tracker = TaskTracker::new();

    // Consumers are created before readiness so a failure to bind them fails start-up.
    // A cluster still electing leaders times out for a while: retry within a budget first.
    let webhook_messages = if cfg.webhook.process {
        Some(deps.startup_step("webhook consumer", budget, || webhook_consumer(&deps.js, &cfg.webhook)).await?)
    } else {
        None
    };
    let unknown_messages = if cfg.reconciler.enabled {
        Some(deps.startup_step("reconciler consumer", budget, || reconciler_consumer(&deps.js, &cfg.reconciler)).await?)
    } else {
        None
    };

    // One feed consumer per ledger partition.
    let mut feed_messages = Vec::new();
    if cfg.feed.enabled {
        for store in &deps.buckets.ledger {
            let messages = deps
                .startup_step("feed consumer", budget, || feed::consumer(&deps.js, store, cfg.feed.max_in_flight))
                .await?;
            feed_messages.push((store.stream_name.clone(), messages));
        }
    }

    // Callbacks: their retry-state bucket and one durable consumer each on BW_FEED.
    let mut callbacks = Vec::new();
    if !cfg.callbacks.is_empty() {
        let retry_state = deps
            .startup_step("callback retry-state bucket", budget, || {
                callback::open_state(&deps.js, cfg.nats.replicas, limits.service_bucket_max_bytes)
            })
            .await?;
        for (name, c) in &cfg.callbacks {
            // The destination is resolved now and at each connection (egress).
            let url = reqwest::Url::parse(&c.url).map_err(|_| anyhow::anyhow!("callbacks.{name}.url is not a URL"))?;
            match egress.check_destination(&url).await {
                Ok(egress::Destination::Allowed) => {}
                Ok(egress::Destination::Unresolved(e)) => tracing::warn!(
                    callback = %name,
                    error = %e,
                    "callback host does not resolve now; each delivery resolves and checks it again"
                ),
                Err(refused) => {
                    return Err(anyhow::anyhow!("invalid configuration: {}", refused_destination(name, refused)));
                }
            }
            let tenant = callback::tenant_of(c, cfg.tenancy.mode);
            let senders = deps
                .startup_step("callback senders", budget, || callback::owned_senders(name, c, tenant, &registry))
                .await?;
            if senders.is_empty() {
                // No filter left would mean every tenant's events: the callback does not run.
                tracing::error!(
                    callback = %name,
                    tenant = %tenant,
                    "callback not started: none of its phone_number_ids is registered to its tenant"
                );
                continue;
            }
            let messages = deps
                .startup_step("callback consumer", budget, || callback::consumer(&deps.js, name, c, tenant, &senders))
                .await?;
            let cb = callback::Callback::new(name, c, retry_state.clone(), metrics.clone(), egress.clone())?;
            callbacks.push((Arc::new(cb), messages, c.max_in_flight, callback::consumer_name(name)));
        }
    }

    let tasks = Tasks { tracker: tracker.clone(), shutdown: shutdown.clone() };
    tasks.spawn(capacity.clone().run(deps.js.clone(), Duration::from_secs(1), shutdown.clone()));
    let http_addr = spawn_http(&tasks, listeners, state, &cfg.webhook.path)?;
    if cfg.intake.nats_enabled {
        spawn_nats_intake(&tasks, &deps.nats, intake.clone(), cfg.intake.max_in_flight).await?;
    }
    if let Some(messages) = webhook_messages {
        let processor = processing::Processor {
            js: deps.js.clone(),
            ledger: ledger.clone(),
            dedup: deps.buckets.webhook_dedup.clone(),
            metrics: metrics.clone(),
            bodies: bodies.clone(),
            send: deps.buckets.send,
            windows: inbound::Windows::new(deps.redis.clone(), Duration::from_millis(cfg.redis.timeout_ms)),
            inbound_rate: inbound_rate::InboundRate::from_config(deps.redis.as_ref(), &cfg.inbound_rate),
        };
        spawn_processor(&tasks, messages, processor, cfg.webhook.max_in_flight);
    }
    if let Some(messages) = unknown_messages {
        let reconciler = reconciler::Reconciler {
            js: deps.js.clone(),
            send: deps.buckets.send,
            ledger: ledger.clone(),
            scopes: deps.buckets.scopes.clone(),
            policies: cfg.reconciler.policy.clone(),
            review_delay_ms: cfg.reconciler.review_delay_ms as i64,
            recheck: Duration::from_millis(cfg.reconciler.recheck_ms.max(100)),
            metrics: metrics.clone(),
        };
        spawn_reconciler(&tasks, messages, reconciler, cfg.reconciler.max_in_flight);
    }
    let publisher = feed::Publisher { js: deps.js.clone(), metrics: metrics.clone() };
    spawn_feed(&tasks, feed_messages, publisher, cfg.feed.max_in_flight);
    spawn_callbacks(&tasks, callbacks);
    if cfg.feed.status_enabled {
        spawn_status(&tasks, &deps.nats, intake.clone()).await?;
    }
    // The intake and status subscriptions are on the server before ingest reports ready (a producer that waits
    // for /readyz then never meets "no responders").
    deps.nats.flush().await.map_err(|e| anyhow::anyhow!("nats flush before ready: {e}"))?;
    deps.health.set_started();
    tracing::info!(http = %http_addr, nats_intake = cfg.intake.nats_enabled, "ingest ready");

    shutdown.cancelled().await;
    tracker.close();
    let grace = Duration::from_millis(cfg.shutdown.grace_ms);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!(grace_ms = cfg.shutdown.grace_ms, "in-flight work did not finish within the grace period");
    }
    Ok(())
}

/// Where the subsystems' tasks run: tracked for the shutdown grace, stopped by `shutdown`.
struct Tasks {
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Tasks {
    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tracker.spawn(task);
    }

    /// Runs `handle` on each message of `messages` (see [`consume`]) in a task of its own.
    fn consume<F, Fut>(&self, messages: pull::Stream, max_in_flight: usize, span: tracing::Span, handle: F)
    where
        F: Fn(async_nats::jetstream::Message) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tracker, shutdown) = (self.tracker.clone(), self.shutdown.clone());
        self.spawn(consume(messages, max_in_flight, tracker, shutdown, handle).instrument(span));
    }
}

/// The HTTP intake and the webhook routes, on one listener or two. Returns the intake's address.
fn spawn_http(
    tasks: &Tasks,
    listeners: Listeners,
    state: http::HttpState,
    webhook_path: &str,
) -> anyhow::Result<std::net::SocketAddr> {
    let intake_router = http::intake_routes(state.clone());
    let webhook_router = http::webhook_routes(state, webhook_path);
    let (main_router, separate) = match listeners.webhook {
        Some(l) => (intake_router, Some((l, webhook_router))),
        None => (intake_router.merge(webhook_router), None),
    };
    let http_addr = listeners.http.local_addr()?;
    tasks.spawn(serve_http(listeners.http, main_router, tasks.shutdown.clone()));
    if let Some((listener, router)) = separate {
        tracing::info!(webhook = %listener.local_addr()?, "webhook listener bound");
        tasks.spawn(serve_http(listener, router, tasks.shutdown.clone()));
    }
    Ok(http_addr)
}

/// The NATS intake (`bw.send.v1.*`), subscribed before it returns.
async fn spawn_nats_intake(
    tasks: &Tasks,
    nats: &async_nats::Client,
    intake: Arc<intake::Intake>,
    max: usize,
) -> anyhow::Result<()> {
    let (nats, tracker2, token) = (nats.clone(), tasks.tracker.clone(), tasks.shutdown.clone());
    let sub = intake::subscribe_nats(&nats).await?;
    tasks.spawn(
        async move {
            if let Err(e) = intake::serve_nats(sub, intake, nats, max, tracker2, token).await {
                tracing::error!(error = %e, "nats intake stopped");
            }
        }
        .instrument(tracing::info_span!("ingest.nats_intake")),
    );
    Ok(())
}

/// The webhook processor on BW_WEBHOOKS.
fn spawn_processor(tasks: &Tasks, messages: pull::Stream, processor: processing::Processor, max: usize) {
    let processor = Arc::new(processor);
    let span = tracing::info_span!("ingest.consume", stream = names::WEBHOOK_STREAM);
    tasks.consume(messages, max, span, move |msg| {
        let p = processor.clone();
        async move { p.handle(msg).await }
    });
}

/// The unknown-outcome reconciler on BW_UNKNOWN.
fn spawn_reconciler(tasks: &Tasks, messages: pull::Stream, reconciler: reconciler::Reconciler, max: usize) {
    let reconciler = Arc::new(reconciler);
    let span = tracing::info_span!("ingest.consume", stream = names::UNKNOWN_STREAM);
    tasks.consume(messages, max, span, move |msg| {
        let r = reconciler.clone();
        async move { r.handle(msg).await }
    });
}

/// The feed publisher, one consumer per ledger partition.
fn spawn_feed(tasks: &Tasks, feed_messages: Vec<(String, pull::Stream)>, publisher: feed::Publisher, max: usize) {
    let publisher = Arc::new(publisher);
    for (stream, messages) in feed_messages {
        let publisher = publisher.clone();
        let span = tracing::info_span!("ingest.consume", stream = %stream);
        tasks.consume(messages, max, span, move |msg| {
            let p = publisher.clone();
            async move { p.handle(msg).await }
        });
    }
}

/// The HTTP callbacks, one consumer each on BW_FEED.
fn spawn_callbacks(tasks: &Tasks, callbacks: Vec<(Arc<callback::Callback>, pull::Stream, usize, String)>) {
    for (cb, messages, max, consumer) in callbacks {
        let span = tracing::info_span!("ingest.consume", stream = feed::FEED_STREAM, consumer = %consumer);
        tasks.consume(messages, max, span, move |msg| {
            let cb = cb.clone();
            async move { cb.handle(msg).await }
        });
    }
}

/// The status query (`bw.status.v1.*`), subscribed before it returns.
async fn spawn_status(tasks: &Tasks, nats: &async_nats::Client, intake: Arc<intake::Intake>) -> anyhow::Result<()> {
    let nats = nats.clone();
    let (tracker2, token) = (tasks.tracker.clone(), tasks.shutdown.clone());
    let sub = feed::subscribe_status(&nats).await?;
    tasks.spawn(async move {
        if let Err(e) = feed::serve_status(sub, intake, nats, tracker2, token).await {
            tracing::error!(error = %e, "status query listener stopped");
        }
    });
    Ok(())
}

async fn serve_http(listener: TcpListener, router: axum::Router, shutdown: CancellationToken) {
    // The peer address is what the webhook guard limits bad signatures by.
    let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    if let Err(e) = axum::serve(listener, service).with_graceful_shutdown(shutdown.cancelled_owned()).await {
        tracing::error!(error = %e, "http server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn compiled_defaults_refuse_http_intake_without_a_key() {
        let cfg = Config::load(None, &HashMap::new()).expect("defaults load");
        assert_eq!(cfg.intake.auth, AuthMode::Required);
        assert!(cfg.intake.api_keys.is_empty());
        assert_eq!(cfg.tenancy.mode, TenancyMode::Registry, "the sender registry is the compiled default");
        let keys = auth::Keys::new(cfg.intake.auth, &cfg.intake.api_keys, cfg.tenancy.mode).expect("keys");
        assert!(keys.authenticate(None).is_err() && keys.authenticate(Some("anything")).is_err());
    }

    #[test]
    fn secrets_that_look_like_numbers_stay_strings_and_are_never_printed() {
        let hash = key_sha256("k");
        let cfg = Config::load(
            None,
            &env(&[
                ("BW_INGEST__WEBHOOK__VERIFY_TOKEN", "8675309123"),
                ("BW_INGEST__WEBHOOK__APP_SECRET", "0012e5"),
                ("BW_INGEST__INTAKE__API_KEYS__CRM__SHA256", &hash),
                ("BW_INGEST__INTAKE__API_KEYS__CRM__TENANT", "crm"),
                ("BW_INGEST__INTAKE__API_KEYS__CRM__PHONE_NUMBER_IDS", "[106540352242922]"),
            ]),
        )
        .expect("numeric-looking secrets load");
        assert_eq!(cfg.webhook.verify_token, "8675309123");
        assert_eq!(cfg.webhook.app_secret, "0012e5");
        assert_eq!(cfg.intake.api_keys["crm"].phone_number_ids, vec!["106540352242922".to_string()]);
        let shown = format!("{cfg:?}");
        for secret in ["8675309123", "0012e5", hash.as_str()] {
            assert!(!shown.contains(secret), "{secret} printed in {shown}");
        }
        // A secret of another type in a file: refused without showing it.
        let dir = std::env::temp_dir().join(format!("bw-ingest-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("ingest.toml");
        std::fs::write(&file, "[webhook]\nverify_token = 8675309.123\n").expect("write");
        let err = Config::load(Some(&file), &HashMap::new()).expect_err("float refused").to_string();
        assert!(err.contains("quoted string") && !err.contains("8675309"), "{err}");
        // A key without its tenant (registry mode): a config error naming the key.
        let err = Config::load(None, &env(&[("BW_INGEST__INTAKE__API_KEYS__CRM__SHA256", &hash)]))
            .expect_err("no tenant")
            .to_string();
        assert!(err.contains("intake.api_keys.crm.tenant is required") && !err.contains(&hash), "{err}");
        let dev = Config::load(
            None,
            &env(&[("BW_INGEST__INTAKE__API_KEYS__CRM__SHA256", &hash), ("BW_INGEST__TENANCY__MODE", "dev")]),
        )
        .expect("dev mode needs no tenant");
        assert_eq!(dev.tenancy.mode, TenancyMode::Dev);
        // A bad key hash names the key, never the hash.
        let err = Config::load(None, &env(&[("BW_INGEST__INTAKE__API_KEYS__CRM__SHA256", "123456789")]))
            .expect_err("bad hash")
            .to_string();
        assert!(err.contains("api_keys.crm") && !err.contains("123456789"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn local_nats_urls_are_recognised() {
        assert!(bw_common::config::points_at_this_machine("nats://127.0.0.1:4222"));
        assert!(bw_common::config::points_at_this_machine("nats://localhost:4222,nats://127.0.0.1:4223"));
        assert!(!bw_common::config::points_at_this_machine("nats://nats:4222"));
        assert!(!bw_common::config::points_at_this_machine("nats://127.0.0.1:4222,nats://10.0.0.5:4222"));
    }
}
