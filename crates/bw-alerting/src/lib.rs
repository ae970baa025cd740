//! The alerting service: watches Breakwater and tells humans when something needs them.
//!
//! Inputs: breaker transitions (`bw.breaker.v1.>`) and signals (`bw.signal.v1.>`) from BW_EVENTS through one
//! shared durable consumer (each event is handled by one instance), and periodic reads of stream state
//! (BW_DLQ depth and oldest age per sender, streams near their limits, BW_QUARANTINE growth, BW_UNKNOWN
//! backlog) and of BW_SCOPES snapshots. Every alert lives in the KV bucket BW_ALERTS under its dedup key and
//! changes only by compare-and-set, so with N instances each firing, escalation and resolution is notified
//! exactly once. Notifications go to a generic JSON webhook, a Slack-style and a PagerDuty-style sink with
//! bounded retries, are grouped into digests during storms, and every change is also published on
//! `bw.alert.v1.<rule>`.
//!
//! Must not: talk to Meta, change any message or breaker state, or log sink URLs and routing keys.
//!
//! Entry point: [`run`].

mod config;
mod display;
mod engine;
mod metrics;
mod model;
mod notify;
mod poll;
mod sinks;
mod state;

pub use config::{
    AlertingConfig, Config, DeliveryConfig, DisplayConfig, PagerDutyConfig, RulesConfig, SinkConfig, SinksConfig,
    StormConfig,
};
pub use display::{format_local, format_utc};
pub use model::{CONSUMER, EVENT_FILTERS, Rule, STATE_BUCKET, dedup_key, storm_key};

use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{AckKind, Message};
use bw_common::names;
use bw_common::service::Deps;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// How long in-flight notifications may take to drain on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the alerting service until `shutdown` is cancelled.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    cfg.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let metrics = metrics::Metrics::register(&deps.metrics);
    let ttl = Duration::from_secs(cfg.alerting.state_ttl_hours * 3600);
    let store = state::StateStore::open(&deps.js, cfg.nats.replicas, ttl).await?;
    let tracker = TaskTracker::new();
    let notifier = notify::spawn(&cfg, store.clone(), metrics.clone(), &tracker)?;
    let engine = engine::Engine {
        store,
        gate: Arc::new(notify::StormGate::new(cfg.storm.interval_ms, cfg.storm.max_individual)),
        notifier,
        metrics,
        js: deps.js.clone(),
        runbook_base: cfg.display.runbook_base_url.clone(),
        touch_every_ms: (cfg.alerting.signal_quiet_resolve_ms / 10).max(1) as i64,
        quota_warning_percent: cfg.rules.quota_warning_percent,
        quota_critical_percent: cfg.rules.quota_critical_percent,
    };
    let consumer = event_consumer(&deps, &cfg.alerting).await?;
    let messages = consumer
        .stream()
        .max_messages_per_batch(cfg.alerting.batch_size)
        .messages()
        .await
        .map_err(|e| anyhow::anyhow!("cannot pull from consumer `{CONSUMER}`: {e}"))?;
    tracker.spawn(
        consume(engine.clone(), messages, shutdown.clone())
            .instrument(tracing::info_span!("alerting.consume", stream = names::EVENTS_STREAM)),
    );
    let mut poller = poll::Poller::new(
        engine,
        deps.js.clone(),
        deps.buckets.scopes.clone(),
        cfg.rules.clone(),
        cfg.alerting.clone(),
    );
    let poll_every = Duration::from_millis(cfg.alerting.poll_interval_ms);
    let poll_shutdown = shutdown.clone();
    tracker.spawn(
        async move {
            let mut tick = tokio::time::interval(poll_every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = poll_shutdown.cancelled() => break,
                    _ = tick.tick() => poller.tick().await,
                }
            }
        }
        .instrument(tracing::info_span!("alerting.poll")),
    );
    tracker.close();
    deps.health.set_started();
    tracing::info!(consumer = CONSUMER, "alerting started");
    shutdown.cancelled().await;
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait()).await.is_err() {
        tracing::warn!("shutdown grace expired with notifications still in flight");
    }
    Ok(())
}

async fn event_consumer(deps: &Deps, cfg: &AlertingConfig) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    let stream = deps
        .js
        .get_stream(names::EVENTS_STREAM)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open stream `{}`: {e}", names::EVENTS_STREAM))?;
    let start = time::OffsetDateTime::now_utc() - Duration::from_millis(cfg.initial_lookback_ms);
    let config = pull::Config {
        durable_name: Some(CONSUMER.to_string()),
        description: Some("alerting: breaker transitions and signals".into()),
        filter_subjects: EVENT_FILTERS.iter().map(|s| s.to_string()).collect(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: Duration::from_millis(cfg.ack_wait_ms),
        max_deliver: cfg.max_deliver,
        deliver_policy: DeliverPolicy::ByStartTime { start_time: start },
        ..Default::default()
    };
    // Several instances may race to create it; whoever loses finds it on the next try.
    let mut last_err = None;
    for _ in 0..5 {
        match stream.get_or_create_consumer(CONSUMER, config.clone()).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                last_err = Some(e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Err(anyhow::anyhow!("cannot create consumer `{CONSUMER}`: {}", last_err.map(|e| e.to_string()).unwrap_or_default()))
}

async fn consume(engine: engine::Engine, mut messages: pull::Stream, shutdown: CancellationToken) {
    loop {
        let next = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = messages.next() => next,
        };
        match next {
            Some(Ok(msg)) => handle(&engine, msg).await,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "event pull failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None => break,
        }
    }
}

async fn handle(engine: &engine::Engine, msg: Message) {
    let subject = msg.subject.to_string();
    let span = tracing::info_span!("alerting.event", subject = %subject);
    bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
    let result = async {
        if subject.starts_with("bw.breaker.v1.") {
            ("breaker", engine.on_breaker(&subject, &msg.payload).await)
        } else {
            ("signal", engine.on_signal(&subject, &msg.payload).await)
        }
    }
    .instrument(span)
    .await;
    let (kind, outcome, ack) = match result {
        (kind, Ok(())) => (kind, "ok", AckKind::Ack),
        (kind, Err(e @ engine::EventError::Malformed { .. })) => {
            tracing::warn!(error = %e, "malformed event dropped");
            (kind, "malformed", AckKind::Term)
        }
        (kind, Err(e)) => {
            tracing::warn!(error = %e, "event not handled; will be redelivered");
            (kind, "retry", AckKind::Nak(Some(Duration::from_secs(1))))
        }
    };
    engine.metrics.events.get_or_create(&metrics::labels([("kind", kind), ("result", outcome)])).inc();
    if let Err(e) = msg.ack_with(ack).await {
        tracing::warn!(error = %e, "cannot ack event");
    }
}
