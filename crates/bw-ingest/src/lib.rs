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
pub mod egress;
pub mod feed;
mod guard;
mod http;
mod inbound;
pub mod inbound_rate;
mod intake;
mod metrics;
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
pub use reconciler::{Policies, Policy};

use async_nats::jetstream::consumer::{self, pull};
use bw_common::config::{AdminConfig, ConfigError, NatsConfig, RedisConfig, TelemetryConfig};
use bw_common::names;
use bw_common::service::{Deps, ServiceConfig};
use bw_common::tenancy::{TenancyConfig, TenancyMode};
use futures::StreamExt;
use serde::Deserialize;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Ingest configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub nats: NatsConfig,
    pub admin: AdminConfig,
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    pub http: HttpConfig,
    pub intake: IntakeConfig,
    pub webhook: WebhookConfig,
    pub reconciler: ReconcilerConfig,
    pub feed: FeedConfig,
    pub shutdown: ShutdownConfig,
    /// Where the per-recipient order sets live (the breaker's Redis).
    pub redis: RedisConfig,
    pub order: OrderConfig,
    /// Signed HTTP callbacks to producers, by name (none by default).
    #[serde(default)]
    pub callbacks: std::collections::BTreeMap<String, CallbackConfig>,
    /// Who owns which sender: the sender registry (compiled default) or dev mode.
    #[serde(default)]
    pub tenancy: TenancyConfig,
    /// Where outgoing requests (callbacks) may connect.
    pub egress: EgressConfig,
    pub inbound_rate: inbound_rate::InboundRateConfig,
}

/// Destinations of outgoing requests ([`egress`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressConfig {
    /// Ranges (CIDR, or single addresses) callbacks may reach although they are loopback, private, link-local
    /// and the like. Empty: only global addresses.
    pub allow_cidrs: Vec<String>,
}

/// Per-recipient order (see `bw_breaker::order`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderConfig {
    /// Categories whose messages to one recipient reach Meta in the order ingest accepted them (by label:
    /// "authentication", "transactional", "support", "marketing").
    pub keep: Vec<String>,
    /// An order set lives this long after its last registration.
    pub ttl_ms: u64,
}

impl OrderConfig {
    /// Whether messages of `category` keep order.
    pub fn keeps(&self, category: bw_common::proto::Category) -> bool {
        self.keep.iter().any(|k| k == category.label())
    }
}

/// Outcome feed and status query.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// Run the feed publisher (durable consumer feed-publisher on the ledger's stream) in this instance.
    pub enabled: bool,
    /// Serve status queries on bw.status.v1.* (and GET /v1/messages/{operation_id}).
    pub status_enabled: bool,
    /// Revisions handled at once per instance.
    pub max_in_flight: usize,
    /// IANA time zone in which status answers show times beside UTC.
    pub display_time_zone: String,
}

/// HTTP listeners.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Producer intake, and the webhook routes unless `webhook_listen` is set.
    pub listen: String,
    /// Separate address for the webhook routes; empty serves them on `listen`.
    pub webhook_listen: String,
}

/// Producer intake.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntakeConfig {
    pub nats_enabled: bool,
    /// Requests handled at once per instance, by the NATS and the HTTP intake each; the HTTP intake answers
    /// 429 with Retry-After past it, the NATS intake waits.
    pub max_in_flight: usize,
    /// Fill of BW_SEND or the ledger (bytes or messages, of its limit) from which new requests are refused
    /// with REJECT_REASON_STORAGE_FULL.
    pub storage_full_ratio: f64,
    pub max_request_bytes: usize,
    pub max_text_chars: usize,
    pub max_template_params: usize,
    pub max_param_chars: usize,
    pub max_components_bytes: usize,
    pub max_labels: usize,
    /// HTTP intake authentication (`required` by default: no configured key, no HTTP intake).
    pub auth: AuthMode,
    /// Producer keys by name: sha256 of the key and the senders it may send for.
    #[serde(default)]
    pub api_keys: std::collections::BTreeMap<String, ApiKeyConfig>,
}

impl IntakeConfig {
    /// The validation limits.
    pub fn limits(&self) -> validate::Limits {
        validate::Limits {
            max_request_bytes: self.max_request_bytes,
            max_text_chars: self.max_text_chars,
            max_template_params: self.max_template_params,
            max_param_chars: self.max_param_chars,
            max_components_bytes: self.max_components_bytes,
            max_labels: self.max_labels,
        }
    }
}

/// Meta webhooks.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    pub path: String,
    #[serde(deserialize_with = "secret::string")]
    pub verify_token: String,
    #[serde(deserialize_with = "secret::string")]
    pub app_secret: String,
    pub max_body_bytes: usize,
    /// Delivery bodies being read and stored at once per instance; past it 503 with Retry-After.
    pub max_bodies_in_flight: usize,
    /// A body not received whole within this long gets 408.
    pub body_read_timeout_ms: u64,
    /// Badly signed (or unsigned) requests a source may send at once, and how many more per minute.
    pub bad_signature_burst: u32,
    pub bad_signature_per_minute: u32,
    /// Sources whose bad signatures are counted at most (bounded memory).
    pub bad_signature_sources: usize,
    /// Proxies (CIDR) whose `X-Forwarded-For` names the source of a request.
    pub trusted_proxies: Vec<String>,
    pub process: bool,
    pub max_in_flight: usize,
    pub ack_wait_ms: u64,
}

impl std::fmt::Debug for WebhookConfig {
    // Secrets never appear in logs, even through a debug print of the config.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookConfig")
            .field("path", &self.path)
            .field("verify_token", &"<redacted>")
            .field("app_secret", &"<redacted>")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_bodies_in_flight", &self.max_bodies_in_flight)
            .field("body_read_timeout_ms", &self.body_read_timeout_ms)
            .field("bad_signature_burst", &self.bad_signature_burst)
            .field("bad_signature_per_minute", &self.bad_signature_per_minute)
            .field("bad_signature_sources", &self.bad_signature_sources)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("process", &self.process)
            .finish_non_exhaustive()
    }
}

/// Unknown-outcome reconciler.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerConfig {
    pub enabled: bool,
    pub review_delay_ms: u64,
    pub recheck_ms: u64,
    pub max_in_flight: usize,
    pub policy: Policies,
}

/// Shutdown behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShutdownConfig {
    pub grace_ms: u64,
}

impl ServiceConfig for Config {
    fn nats(&self) -> &NatsConfig {
        &self.nats
    }
    fn redis(&self) -> Option<&bw_common::config::RedisConfig> {
        (!self.order.keep.is_empty() || self.inbound_rate.enabled).then_some(&self.redis) // order sets, inbound count
    }
    fn admin(&self) -> &AdminConfig {
        &self.admin
    }
    fn telemetry(&self) -> &TelemetryConfig {
        &self.telemetry
    }
    fn validate(&self) -> Result<(), String> {
        Config::validate(self)
    }
    fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown.grace_ms)
    }
    fn readiness_needs_redis(&self) -> bool {
        // Without Redis only order-keeping intake is refused (UNAVAILABLE, retried by producers); webhooks,
        // statuses and the other categories go on, so readiness must not depend on it.
        false
    }
}

impl Config {
    /// Loads the config from the compiled defaults, an optional file and an env map, and validates it.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &std::collections::HashMap<String, String>,
    ) -> Result<Config, ConfigError> {
        // Secrets are taken verbatim: quoted so the loader's scalar parsing never turns them into numbers (and
        // a type error never prints them).
        let env: std::collections::HashMap<String, String> = env
            .iter()
            .map(|(k, v)| {
                let upper = k.to_ascii_uppercase();
                let secret = upper.starts_with("BW_INGEST__")
                    && ["__VERIFY_TOKEN", "__APP_SECRET", "__SHA256", "__SECRET"].iter().any(|s| upper.ends_with(s));
                (k.clone(), if secret { toml_quoted(v) } else { v.clone() })
            })
            .collect();
        bw_common::service::load_config("ingest", DEFAULT_CONFIG, file, &env)
    }

    /// Checks values serde cannot.
    pub fn validate(&self) -> Result<(), String> {
        let invalid = |m: &str| Err(m.to_string());
        if !self.webhook.path.starts_with('/') || self.webhook.path == "/v1/messages" {
            return invalid("webhook.path must start with '/' and differ from /v1/messages");
        }
        if self.webhook.max_body_bytes == 0 || self.intake.max_request_bytes == 0 {
            return invalid("webhook.max_body_bytes and intake.max_request_bytes must be > 0");
        }
        auth::Keys::new(self.intake.auth, &self.intake.api_keys, self.tenancy.mode)?;
        if self.feed.display_time_zone.parse::<chrono_tz::Tz>().is_err() {
            return invalid("feed.display_time_zone must be an IANA zone name such as America/Argentina/Buenos_Aires");
        }
        if self.feed.max_in_flight == 0 {
            return invalid("feed.max_in_flight must be > 0");
        }
        if self.intake.max_in_flight == 0 || self.webhook.max_in_flight == 0 || self.reconciler.max_in_flight == 0 {
            return invalid("max_in_flight values must be > 0");
        }
        if !(self.intake.storage_full_ratio > 0.0 && self.intake.storage_full_ratio <= 1.0) {
            return invalid("intake.storage_full_ratio must be > 0 and at most 1");
        }
        let w = &self.webhook;
        if w.max_bodies_in_flight == 0 || w.body_read_timeout_ms == 0 {
            return invalid("webhook.max_bodies_in_flight and webhook.body_read_timeout_ms must be > 0");
        }
        if w.bad_signature_burst == 0 || w.bad_signature_per_minute == 0 || w.bad_signature_sources == 0 {
            return invalid(
                "webhook.bad_signature_burst, bad_signature_per_minute and bad_signature_sources must be > 0",
            );
        }
        cidr::parse_all("webhook.trusted_proxies", &w.trusted_proxies)?;
        let egress = egress::Policy::from_config(&self.egress.allow_cidrs)?;
        use bw_common::proto::Category;
        let known = [Category::Authentication, Category::Transactional, Category::Support, Category::Marketing];
        if let Some(bad) = self.order.keep.iter().find(|k| !known.iter().any(|c| c.label() == k.as_str())) {
            return Err(format!(
                "order.keep: unknown category `{bad}` (expected authentication, transactional, support or marketing)"
            ));
        }
        if self.order.ttl_ms == 0 {
            return invalid("order.ttl_ms must be > 0");
        }
        for (name, c) in &self.callbacks {
            callback::validate(name, c, self.tenancy.mode)?;
            let url = reqwest::Url::parse(&c.url).map_err(|_| format!("callbacks.{name}.url is not a URL"))?;
            if let Err(refused) = egress.check_literal(&url) {
                return Err(refused_destination(name, refused));
            }
        }
        Ok(())
    }
}

/// The configuration error of a callback whose destination the egress policy refuses. It names the callback
/// and the kind of address, never the address or the URL (which may hold credentials).
fn refused_destination(name: &str, refused: egress::Refused) -> String {
    format!(
        "callbacks.{name}.url: its host is or resolves to a {} address, which callbacks may not reach (it could \
         reach this machine, the cloud's metadata service or a private network); if the receiver really lives \
         there, list its range in egress.allow_cidrs",
        refused.range
    )
}

/// Reports a stream whose byte limit could not be applied: it keeps working as before, without the disk bound.
pub(crate) fn limits_not_applied(stream: &str, error: &str) {
    tracing::error!(
        stream,
        error,
        "stream byte limit not applied: it can fill the disk; give ingest's NATS user $JS.API.STREAM.UPDATE on it \
         (deploy/nats/accounts.conf) and restart ingest, or set max_bytes on the stream as a NATS administrator"
    );
}

/// `v` as a TOML basic string.
fn toml_quoted(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

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
        let named = |t: &Option<String>| t.as_deref().is_some_and(|t| t != bw_common::tenancy::DEFAULT_TENANT);
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

    let intake_router = http::intake_routes(state.clone());
    let webhook_router = http::webhook_routes(state, &cfg.webhook.path);
    let (main_router, separate) = match listeners.webhook {
        Some(l) => (intake_router, Some((l, webhook_router))),
        None => (intake_router.merge(webhook_router), None),
    };
    tracker.spawn(capacity.clone().run(deps.js.clone(), Duration::from_secs(1), shutdown.clone()));
    let http_addr = listeners.http.local_addr()?;
    tracker.spawn(serve_http(listeners.http, main_router, shutdown.clone()));
    if let Some((listener, router)) = separate {
        tracing::info!(webhook = %listener.local_addr()?, "webhook listener bound");
        tracker.spawn(serve_http(listener, router, shutdown.clone()));
    }
    if cfg.intake.nats_enabled {
        let (nats, tracker2, token) = (deps.nats.clone(), tracker.clone(), shutdown.clone());
        let max = cfg.intake.max_in_flight;
        let intake = intake.clone();
        let sub = intake::subscribe_nats(&nats).await?;
        tracker.spawn(
            async move {
                if let Err(e) = intake::serve_nats(sub, intake, nats, max, tracker2, token).await {
                    tracing::error!(error = %e, "nats intake stopped");
                }
            }
            .instrument(tracing::info_span!("ingest.nats_intake")),
        );
    }
    if let Some(messages) = webhook_messages {
        let processor = Arc::new(processor::Processor {
            js: deps.js.clone(),
            ledger: ledger.clone(),
            dedup: deps.buckets.webhook_dedup.clone(),
            metrics: metrics.clone(),
            bodies: bodies.clone(),
            send: deps.buckets.send,
            windows: inbound::Windows::new(deps.redis.clone(), Duration::from_millis(cfg.redis.timeout_ms)),
            inbound_rate: inbound_rate::InboundRate::from_config(deps.redis.as_ref(), &cfg.inbound_rate),
        });
        let max = cfg.webhook.max_in_flight;
        tracker.spawn(
            consume(messages, max, tracker.clone(), shutdown.clone(), move |msg| {
                let p = processor.clone();
                async move { p.handle(msg).await }
            })
            .instrument(tracing::info_span!("ingest.consume", stream = names::WEBHOOK_STREAM)),
        );
    }
    if let Some(messages) = unknown_messages {
        let reconciler = Arc::new(reconciler::Reconciler {
            js: deps.js.clone(),
            send: deps.buckets.send,
            ledger: ledger.clone(),
            scopes: deps.buckets.scopes.clone(),
            policies: cfg.reconciler.policy.clone(),
            review_delay_ms: cfg.reconciler.review_delay_ms as i64,
            recheck: Duration::from_millis(cfg.reconciler.recheck_ms.max(100)),
            metrics: metrics.clone(),
        });
        let max = cfg.reconciler.max_in_flight;
        tracker.spawn(
            consume(messages, max, tracker.clone(), shutdown.clone(), move |msg| {
                let r = reconciler.clone();
                async move { r.handle(msg).await }
            })
            .instrument(tracing::info_span!("ingest.consume", stream = names::UNKNOWN_STREAM)),
        );
    }
    let publisher = Arc::new(feed::Publisher { js: deps.js.clone(), metrics: metrics.clone() });
    for (stream, messages) in feed_messages {
        let publisher = publisher.clone();
        tracker.spawn(
            consume(messages, cfg.feed.max_in_flight, tracker.clone(), shutdown.clone(), move |msg| {
                let p = publisher.clone();
                async move { p.handle(msg).await }
            })
            .instrument(tracing::info_span!("ingest.consume", stream = %stream)),
        );
    }
    for (cb, messages, max, consumer) in callbacks {
        tracker.spawn(
            consume(messages, max, tracker.clone(), shutdown.clone(), move |msg| {
                let cb = cb.clone();
                async move { cb.handle(msg).await }
            })
            .instrument(tracing::info_span!("ingest.consume", stream = feed::FEED_STREAM, consumer = %consumer)),
        );
    }
    if cfg.feed.status_enabled {
        let (intake, nats) = (intake.clone(), deps.nats.clone());
        let (tracker2, token) = (tracker.clone(), shutdown.clone());
        let sub = feed::subscribe_status(&nats).await?;
        tracker.spawn(async move {
            if let Err(e) = feed::serve_status(sub, intake, nats, tracker2, token).await {
                tracing::error!(error = %e, "status query listener stopped");
            }
        });
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
