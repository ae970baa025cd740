//! Storm control and fan-out to the sinks.
//!
//! Per rule, at most `storm.max_individual` firings per interval are notified on their own (the
//! [`StormGate`]); the rest are folded into one digest per rule per interval. A digest also fires the rule's
//! storm key in the state bucket, which the poller resolves once no digested alert of the rule is firing.
//! Each enabled sink has its own worker and bounded queue, so a slow sink never holds up another.

use crate::config::{Config, DeliveryConfig};
use crate::display::runbook_url;
use crate::metrics::{Metrics, labels};
use crate::model::{Firing, Rule, STORM_TARGET, storm_key};
use crate::sinks::{self, Digest, Event, Notice, RenderContext, SinkKind};
use crate::state::StateStore;
use bw_proto::v1::{Alert, Severity};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Local per-rule budget of individual notifications per interval.
pub(crate) struct StormGate {
    interval_ms: i64,
    max_individual: u32,
    windows: Mutex<HashMap<Rule, (i64, u32)>>,
}

impl StormGate {
    pub(crate) fn new(interval_ms: u64, max_individual: u32) -> StormGate {
        StormGate { interval_ms: interval_ms as i64, max_individual, windows: Mutex::new(HashMap::new()) }
    }

    /// Whether a firing of `rule` at `now_ms` may be notified on its own (takes one unit of budget).
    pub(crate) fn admit(&self, rule: Rule, now_ms: i64) -> bool {
        let Ok(mut windows) = self.windows.lock() else {
            return true;
        };
        let window = windows.entry(rule).or_insert((now_ms, 0));
        if now_ms - window.0 >= self.interval_ms {
            *window = (now_ms, 0);
        }
        if window.1 < self.max_individual {
            window.1 += 1;
            true
        } else {
            false
        }
    }
}

enum Outgoing {
    Individual(Notice),
    Digested { rule: Rule, alert: Alert, event: Event },
}

/// Handle the engine and poller use to notify.
#[derive(Clone)]
pub(crate) struct Notifier {
    tx: mpsc::Sender<Outgoing>,
}

impl Notifier {
    /// Notifies `alert` on its own.
    pub(crate) async fn individual(&self, alert: Alert, event: Event, at_unix_ms: i64) {
        let _ = self.tx.send(Outgoing::Individual(Notice::Alert { alert, event, at_unix_ms })).await;
    }

    /// Adds `alert` to the next digest of its rule.
    pub(crate) async fn digested(&self, rule: Rule, alert: Alert, event: Event) {
        let _ = self.tx.send(Outgoing::Digested { rule, alert, event }).await;
    }
}

struct SinkQueue {
    kind: SinkKind,
    tx: mpsc::Sender<(Value, &'static str)>,
}

#[derive(Default)]
struct Pending {
    fired: usize,
    escalated: usize,
    resolved: usize,
    severity: i32,
    scopes: Vec<String>,
}

/// Starts the notifier and one worker per enabled sink on `tracker`. They stop once every [`Notifier`]
/// clone is dropped and the queues are drained (pending digests are flushed first).
pub(crate) fn spawn(
    cfg: &Config,
    store: StateStore,
    metrics: Metrics,
    tracker: &TaskTracker,
) -> anyhow::Result<Notifier> {
    let ctx = RenderContext {
        zone: bw_common::time::parse_zone(&cfg.display.time_zone).map_err(anyhow::Error::msg)?,
        source: cfg.display.source.clone(),
    };
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(cfg.delivery.timeout_ms))
        .build()
        .map_err(|e| anyhow::anyhow!("cannot build http client: {e}"))?;
    let mut queues = Vec::new();
    let sinks = [
        (SinkKind::Webhook, cfg.sinks.webhook.enabled, cfg.sinks.webhook.url.clone()),
        (SinkKind::Slack, cfg.sinks.slack.enabled, cfg.sinks.slack.url.clone()),
        (SinkKind::PagerDuty, cfg.sinks.pagerduty.enabled, cfg.sinks.pagerduty.url.clone()),
    ];
    for (kind, enabled, url) in sinks {
        if !enabled {
            continue;
        }
        let (tx, rx) = mpsc::channel(cfg.delivery.queue_capacity);
        queues.push(SinkQueue { kind, tx });
        tracker.spawn(
            sink_worker(kind, url, rx, http.clone(), cfg.delivery.clone(), metrics.clone())
                .instrument(tracing::info_span!("alerting.sink", sink = kind.name())),
        );
    }
    let (tx, rx) = mpsc::channel(1024);
    let routing_key = cfg.sinks.pagerduty.routing_key.clone();
    let storm = cfg.storm.clone();
    let base = cfg.display.runbook_base_url.clone();
    tracker.spawn(
        async move {
            let mut pending: HashMap<Rule, Pending> = HashMap::new();
            let mut rx = rx;
            let mut tick = tokio::time::interval(Duration::from_millis(storm.interval_ms));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let render = |notice: &Notice| {
                queues_send(&queues, &ctx, &routing_key, notice, &metrics);
            };
            loop {
                tokio::select! {
                    msg = rx.recv() => match msg {
                        Some(Outgoing::Individual(notice)) => render(&notice),
                        Some(Outgoing::Digested { rule, alert, event }) => {
                            let p = pending.entry(rule).or_default();
                            match event {
                                Event::Fired => p.fired += 1,
                                Event::Escalated => p.escalated += 1,
                                Event::Resolved => p.resolved += 1,
                            }
                            p.severity = p.severity.max(alert.severity);
                            if p.scopes.len() < storm.digest_max_listed {
                                p.scopes.push(if alert.scope.is_empty() { alert.dedup_key } else { alert.scope });
                            }
                        }
                        None => {
                            flush(&mut pending, &store, &storm, &base, &metrics, &render).await;
                            break;
                        }
                    },
                    _ = tick.tick() => flush(&mut pending, &store, &storm, &base, &metrics, &render).await,
                }
            }
        }
        .instrument(tracing::info_span!("alerting.notifier")),
    );
    Ok(Notifier { tx })
}

async fn flush(
    pending: &mut HashMap<Rule, Pending>,
    store: &StateStore,
    storm: &crate::config::StormConfig,
    base: &str,
    metrics: &Metrics,
    render: &impl Fn(&Notice),
) {
    let now = bw_common::time::now_ms();
    for (rule, p) in pending.drain() {
        let url = runbook_url(base, rule.runbook());
        if p.fired + p.escalated > 0 {
            // One storm incident per rule; the poller resolves it when no digested alert is firing.
            let firing = Firing {
                rule,
                target: STORM_TARGET.into(),
                scope: String::new(),
                severity: Severity::try_from(p.severity).unwrap_or(Severity::Warning),
                summary: format!("alert storm on {}", rule.name()),
                at_unix_ms: now,
                labels: vec![("storm".into(), "true".into())],
            };
            // The storm key itself is notified individually when it resolves (PagerDuty closes the incident).
            if let Err(e) = store.fire(&firing, &|| true, &url, now, i64::MAX).await {
                tracing::warn!(rule = rule.name(), error = %e, "cannot record storm state");
            }
        }
        metrics.digests.get_or_create(&labels([("rule", rule.name())])).inc();
        render(&Notice::Digest(Digest {
            rule: rule.name().to_string(),
            dedup_key: storm_key(rule),
            severity: p.severity,
            runbook_url: url,
            fired: p.fired,
            resolved: p.resolved,
            escalated: p.escalated,
            listed_scopes: p.scopes,
            interval_ms: storm.interval_ms,
            at_unix_ms: now,
        }));
    }
}

fn queues_send(queues: &[SinkQueue], ctx: &RenderContext, routing_key: &str, notice: &Notice, metrics: &Metrics) {
    let kind = match notice {
        Notice::Alert { .. } => "alert",
        Notice::Digest(_) => "digest",
    };
    for q in queues {
        let body = match q.kind {
            SinkKind::Webhook => sinks::generic(ctx, notice),
            SinkKind::Slack => sinks::slack(ctx, notice),
            SinkKind::PagerDuty => sinks::pagerduty(ctx, routing_key, notice),
        };
        if q.tx.try_send((body, kind)).is_err() {
            metrics.sink_failures.get_or_create(&labels([("sink", q.kind.name())])).inc();
            tracing::error!(sink = q.kind.name(), "sink queue full; notification not delivered to this sink");
        }
    }
}

async fn sink_worker(
    kind: SinkKind,
    url: String,
    mut rx: mpsc::Receiver<(Value, &'static str)>,
    http: reqwest::Client,
    delivery: DeliveryConfig,
    metrics: Metrics,
) {
    let url = Arc::new(url);
    while let Some((body, notice_kind)) = rx.recv().await {
        if sinks::deliver(&http, kind, &url, &body, &delivery, &metrics).await {
            metrics.notifications.get_or_create(&labels([("sink", kind.name()), ("kind", notice_kind)])).inc();
        }
    }
}
