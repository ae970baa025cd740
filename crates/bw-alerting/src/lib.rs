//! The alerting service: watches Breakwater and tells humans when something needs them.
//!
//! Inputs: breaker transitions (`bw.breaker.v1.>`) and signals (`bw.signal.v1.>`) from BW_EVENTS through one
//! shared durable consumer (each event is handled by one instance), and periodic reads of stream state
//! (BW_DLQ depth and oldest age per sender, streams near their limits, BW_SEND partitions no dispatcher takes
//! from, BW_QUARANTINE growth, BW_UNKNOWN backlog) and of BW_SCOPES snapshots. Every alert lives in the KV bucket BW_ALERTS under its dedup key and
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
pub use model::{CONSUMER, EVENT_FILTERS, Rule, STATE_BUCKET, dedup_key, storm_key};

use async_nats::jetstream::Message;
use async_nats::jetstream::consumer::{self, AckPolicy, DeliverPolicy, pull};
use bw_common::disposition::{Label, Settle, apply};
use bw_common::service::Deps;
use bw_wire::names;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// The alert held in a value of the [`STATE_BUCKET`] (what tools read to learn an alert's current state
/// without having seen every `bw.alert.v1.*` message). None when the value is not an alert state.
pub fn alert_from_state(value: &[u8]) -> Option<bw_proto::v1::Alert> {
    use prost::Message as _;
    bw_proto::v1::AlertState::decode(value).ok()?.alert.filter(|a| !a.dedup_key.is_empty())
}

/// Compiled defaults, every key commented.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// How long in-flight notifications may take to drain on shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the alerting service until `shutdown` is cancelled.
pub async fn run(cfg: Config, deps: Deps, shutdown: CancellationToken) -> anyhow::Result<()> {
    cfg.validate().map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let metrics = metrics::Metrics::register(&deps.metrics);
    let ttl = Duration::from_secs(cfg.alerting.state_ttl_hours * 3600);
    let store =
        state::StateStore::open(&deps.js, cfg.nats.replicas, ttl, cfg.nats.limits.service_bucket_max_bytes).await?;
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
        deps.buckets.send,
        deps.buckets.ledger.iter().map(|s| s.stream_name.clone()).collect(),
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

/// What handling one event came to: its kind and result (the `result` span field and the
/// `bw_alert_events_total{kind, result}` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventResult {
    /// Handled (an alert fired, escalated, resolved, or nothing needed doing).
    Handled,
    /// Undecodable or incomplete payload: retrying cannot help.
    Malformed,
    /// Alert state unavailable: redelivered after a short delay.
    Retry,
}

impl Label for EventResult {
    fn label(self) -> &'static str {
        match self {
            EventResult::Handled => "ok",
            EventResult::Malformed => "malformed",
            EventResult::Retry => "retry",
        }
    }
}

/// Delay before an event whose alert state was unavailable is redelivered.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// The one decision of the event consumer: what a handler's outcome means for the message.
pub(crate) fn settle(outcome: Result<(), engine::EventError>) -> Settle<EventResult> {
    match outcome {
        Ok(()) => Settle::ack(EventResult::Handled),
        Err(e @ engine::EventError::Malformed { .. }) => {
            tracing::warn!(error = %e, "malformed event dropped");
            Settle::term(EventResult::Malformed)
        }
        Err(e) => {
            tracing::warn!(error = %e, "event not handled; will be redelivered");
            Settle::nak(EventResult::Retry, RETRY_DELAY)
        }
    }
}

async fn handle(engine: &engine::Engine, msg: Message) {
    let subject = msg.subject.to_string();
    let kind = if bw_wire::names::is_breaker_subject(&subject) { "breaker" } else { "signal" };
    let span = tracing::info_span!("alerting.event", subject = %subject, result = tracing::field::Empty);
    bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
    let outcome = async {
        if kind == "breaker" {
            engine.on_breaker(&subject, &msg.payload).await
        } else {
            engine.on_signal(&subject, &msg.payload).await
        }
    }
    .instrument(span.clone())
    .await;
    let decision = span.in_scope(|| settle(outcome));
    apply(&msg, decision, &span, |result| {
        engine.metrics.events.get_or_create(&metrics::labels([("kind", kind), ("result", result)])).inc();
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::{EventResult, settle};
    use crate::engine::EventError;
    use crate::state::StateError;
    use bw_common::disposition::Disposition;

    #[test]
    fn alert_states_read_back_their_alert() {
        use prost::Message as _;
        let alert =
            bw_proto::v1::Alert { dedup_key: "breaker_open.1".into(), resolved_at_unix_ms: 5, ..Default::default() };
        let state = bw_proto::v1::AlertState { alert: Some(alert.clone()), last_seen_unix_ms: 3, individual: true };
        assert_eq!(super::alert_from_state(&state.encode_to_vec()), Some(alert));
        assert_eq!(super::alert_from_state(b"\xff\xff"), None);
        assert_eq!(super::alert_from_state(&[]), None);
    }

    #[test]
    fn malformed_events_are_terminated_and_unavailable_state_is_retried() {
        assert_eq!(settle(Ok(())).disposition, Disposition::Ack);
        let malformed =
            settle(Err(EventError::Malformed { what: "Signal", subject: "bw.signal.v1.x".into(), detail: "x".into() }));
        assert_eq!((malformed.disposition, malformed.result), (Disposition::Term, EventResult::Malformed));
        let retry = settle(Err(EventError::State(StateError::Unavailable { key: "k".into(), detail: "d".into() })));
        assert_eq!(retry.result, EventResult::Retry);
        assert!(matches!(retry.disposition, Disposition::Nak(d) if d == super::RETRY_DELAY));
    }
}
