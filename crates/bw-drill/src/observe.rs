//! What the drill sees while it runs: breaker transitions, dispatch outcomes and alerts from NATS
//! ([`spawn_watchers`] fills [`Observed`]), stream depths, and the reads that heal the view after a restart.

use crate::{budget, errors, scoped};
use async_nats::jetstream;
use bw_common::nats::Buckets;
use bw_proto::v1::{Alert, AlertState, BreakerState, BreakerTransition, DispatchOutcome, OutcomeEvent};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Mutex;

/// The drill's own connection to the stack, and what it observes through it.
pub(crate) struct Live {
    pub nats: async_nats::Client,
    pub js: jetstream::Context,
    pub buckets: Buckets,
    pub observed: Arc<Mutex<Observed>>,
    /// The drill's time 0 (the producer starts right after).
    pub started: Instant,
    pub watchers: Vec<tokio::task::JoinHandle<()>>,
}

impl Live {
    /// Connects as the tenant `default`'s producer does (its inbox) and starts watching.
    pub(crate) async fn connect(nats_url: &str) -> anyhow::Result<Live> {
        let nats = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(bw_wire::tenancy::inbox_prefix(bw_wire::tenancy::DEFAULT_TENANT))
            .connect(nats_url)
            .await?;
        let js = jetstream::new(nats.clone());
        let nats_cfg = bw_common::config::NatsConfig::single(nats_url.to_string(), "bw-drill");
        let buckets = bw_common::nats::ensure_topology(&js, &nats_cfg).await?;
        let started = Instant::now();
        let observed = Observed { started_unix_ms: bw_common::time::now_ms(), ..Default::default() };
        let observed = Arc::new(Mutex::new(observed));
        let watchers = spawn_watchers(nats.clone(), observed.clone(), started).await?;
        Ok(Live { nats, js, buckets, observed, started, watchers })
    }
}

/// Breaker events and dispatch outcomes as the drill observed them.
#[derive(Default)]
pub struct Observed {
    /// (seconds since start, from, to, phone) per transition.
    pub transitions: Vec<(f64, BreakerState, BreakerState, String)>,
    pub states: BTreeMap<String, BreakerState>,
    pub sent_total: u64,
    pub calls_total: u64,
    pub failed_calls_total: u64,
    pub by_result: BTreeMap<String, u64>,
    /// Decision time (µs) of messages refused while OPEN, and their whole handling time including the durable
    /// move to the DLQ.
    pub fail_fast_us: Vec<u64>,
    pub fail_fast_moved_us: Vec<u64>,
    /// Per sender, every call Meta answered, as (seconds since start, counted as a breaker failure): the report
    /// replays the breaker's window over them to find when the error rate crossed the threshold.
    pub calls: BTreeMap<String, Vec<(f64, bool)>>,
    /// Wall clock (unix ms) at the drill's time 0, to place observed calls in the breaker's window buckets.
    pub started_unix_ms: i64,
    /// When the last message from a live lane (hi, lo) was sent, seconds since start.
    pub last_live_sent_s: f64,
    /// When each replayed message (rh and rp lanes) was sent, seconds since start.
    pub replay_sent_s: Vec<f64>,
    /// Every error answer Meta gave a call: (seconds since start, code, sender).
    pub answers: Vec<errors::ObservedAnswer>,
    pub error_answers_total: u64,
    /// Per sender, what its outcomes said.
    pub senders: BTreeMap<String, SenderCounts>,
    /// Alerts by dedup key, as last published on `bw.alert.v1.*`.
    pub alerts: BTreeMap<String, Alert>,
    /// Per sender, when each of its messages was sent (seconds since start): the per-sender timeline.
    pub sent_at: BTreeMap<String, Vec<f64>>,
    /// Per sender, sends refused because its WABA was paused (`waba_paused`).
    pub waba_paused: BTreeMap<String, u64>,
    /// Operations a WABA restriction held: refused as `waba_paused`, or answered with a restriction code.
    pub held_ops: BTreeSet<String>,
    /// Holds by the portfolio messaging-limit budget: every `budget_held` outcome, and each feed revision that
    /// wrote a hold's reason with the portfolio's figures ([`crate::budget`]).
    pub budget_holds: Vec<budget::Hold>,
}

/// One sender's outcome counts.
#[derive(Debug, Default, Clone)]
pub struct SenderCounts {
    pub sent: u64,
    pub dlq_moves: u64,
    pub rate_limited: u64,
    pub error_answers: u64,
}

/// Message counts of the streams that hold operations.
#[derive(Debug, Default, Clone, Copy)]
pub struct Depths {
    pub send: u64,
    pub dlq: u64,
    pub unknown: u64,
    pub quarantine: u64,
    /// Every count was read (false while the broker is unreachable: the zeros then mean nothing).
    pub read: bool,
}

/// Reads the stream depths (one info call per stream).
pub async fn depths(js: &jetstream::Context) -> Depths {
    async fn count(js: &jetstream::Context, name: &str) -> Option<u64> {
        let mut s = js.get_stream(name).await.ok()?;
        s.info().await.ok().map(|i| i.state.messages)
    }
    /// The sum over partition streams, unread if any one is.
    async fn count_all(js: &jetstream::Context, streams: impl Iterator<Item = String>) -> Option<u64> {
        let mut total = Some(0);
        for name in streams {
            total = total.zip(count(js, &name).await).map(|(t, n)| t + n);
        }
        total
    }
    // Every partition of BW_SEND and BW_DLQ (a kind is unread if any of its partitions is).
    let send = bw_common::nats::send_partitions(js).await.unwrap_or_default();
    let (send, dlq, unknown, quarantine) = (
        count_all(js, send.streams()).await,
        count_all(js, send.dlq_streams()).await,
        count(js, names::UNKNOWN_STREAM).await,
        count(js, names::QUARANTINE_STREAM).await,
    );
    Depths {
        read: send.is_some() && dlq.is_some() && unknown.is_some() && quarantine.is_some(),
        send: send.unwrap_or(0),
        dlq: dlq.unwrap_or(0),
        unknown: unknown.unwrap_or(0),
        quarantine: quarantine.unwrap_or(0),
    }
}

/// The drill learns breaker states from transitions; when the breaker state was lost (Redis restarted empty)
/// no transition is ever published for a scope that was OPEN. The scope snapshot the coordinator writes is then
/// the authority: a CLOSED snapshot written after the scope's last observed transition closes it in the view.
pub(crate) async fn heal_states(scopes: &async_nats::jetstream::kv::Store, observed: &Arc<Mutex<Observed>>) {
    let suspects: Vec<(String, f64)> = {
        let o = observed.lock().await;
        o.states
            .iter()
            .filter(|(_, s)| matches!(s, BreakerState::Open | BreakerState::HalfOpen))
            .filter_map(|(phone, _)| {
                let last = o.transitions.iter().rev().find(|t| &t.3 == phone)?.0;
                Some((phone.clone(), o.started_unix_ms as f64 + last * 1000.0))
            })
            .collect()
    };
    for (phone, last_ms) in suspects {
        let Ok(Some(bytes)) = scopes.get(&phone).await else { continue };
        let Ok(snap) = bw_proto::v1::ScopeSnapshot::decode(bytes) else { continue };
        let closed =
            matches!(BreakerState::try_from(snap.state), Ok(BreakerState::Closed | BreakerState::ForcedClosed));
        if closed && snap.updated_at_unix_ms as f64 > last_ms {
            observed.lock().await.states.insert(phone, BreakerState::Closed);
        }
    }
}

/// Alerts resolved while the drill's subscription was cut (a nats-server restart) are read back from the
/// alert state bucket, the authority of the alerting service.
pub(crate) async fn heal_alerts(kv: &async_nats::jetstream::kv::Store, observed: &Arc<Mutex<Observed>>) {
    let firing: Vec<String> = {
        let o = observed.lock().await;
        o.alerts.values().filter(|a| a.resolved_at_unix_ms == 0).map(|a| a.dedup_key.clone()).collect()
    };
    for key in firing {
        let Ok(Some(value)) = kv.get(&key).await else { continue };
        if let Some(alert) = AlertState::decode(value).ok().and_then(|s| s.alert).filter(|a| !a.dedup_key.is_empty())
            && alert.resolved_at_unix_ms > 0
        {
            observed.lock().await.alerts.insert(key, alert);
        }
    }
}

async fn spawn_watchers(
    nats: async_nats::Client,
    observed: Arc<Mutex<Observed>>,
    started: Instant,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut transitions = nats.subscribe(names::BREAKER_ALL).await?;
    let mut outcomes = nats.subscribe(names::OUTCOME_ALL).await?;
    let mut alerts = nats.subscribe(names::ALERT_ALL).await?;
    let tenant = bw_wire::tenancy::DEFAULT_TENANT;
    let mut feed = nats.subscribe(bw_wire::tenancy::feed_filter(tenant)).await?;
    let o4 = observed.clone();
    let t4 = tokio::spawn(async move {
        while let Some(msg) = feed.next().await {
            let Ok(e) = OutcomeEvent::decode(msg.payload.as_ref()) else { continue };
            let Some(figures) = budget::figures(&e.reason) else { continue };
            let mut o = o4.lock().await;
            let t = (e.at_unix_ms - o.started_unix_ms) as f64 / 1000.0;
            o.budget_holds.push(budget::Hold { t, operation_id: e.operation_id, figures: Some(figures) });
        }
    });
    let o3 = observed.clone();
    let t3 = tokio::spawn(async move {
        while let Some(msg) = alerts.next().await {
            if let Ok(a) = Alert::decode(msg.payload.as_ref()) {
                let mut o = o3.lock().await;
                o.alerts.insert(a.dedup_key.clone(), a);
            }
        }
    });
    let o1 = observed.clone();
    let t1 = tokio::spawn(async move {
        while let Some(msg) = transitions.next().await {
            if let Ok(t) = BreakerTransition::decode(msg.payload.as_ref()) {
                let phone = t.scope.as_ref().map(|s| s.phone_number_id.clone()).unwrap_or_default();
                let mut o = o1.lock().await;
                o.transitions.push((started.elapsed().as_secs_f64(), t.from(), t.to(), phone.clone()));
                o.states.insert(phone, t.to());
            }
        }
    });
    let t2 = tokio::spawn(async move {
        while let Some(msg) = outcomes.next().await {
            if let Ok(d) = DispatchOutcome::decode(msg.payload.as_ref()) {
                let t = started.elapsed().as_secs_f64();
                let mut o = observed.lock().await;
                *o.by_result.entry(d.result.clone()).or_default() += 1;
                let called = d.decision == "allow" || d.decision == "canary";
                if d.result == "sent" {
                    o.sent_at.entry(d.phone_number_id.clone()).or_default().push(t);
                }
                if d.result == "budget_held" {
                    let t = (d.at_unix_ms - o.started_unix_ms) as f64 / 1000.0;
                    o.budget_holds.push(budget::Hold { t, operation_id: d.operation_id.clone(), figures: None });
                }
                if d.decision == "waba_paused" {
                    *o.waba_paused.entry(d.phone_number_id.clone()).or_default() += 1;
                    o.held_ops.insert(d.operation_id.clone());
                }
                if called && scoped::RESTRICTION_CODES.contains(&d.meta_code) {
                    o.held_ops.insert(d.operation_id.clone());
                }
                let sender = o.senders.entry(d.phone_number_id.clone()).or_default();
                match d.result.as_str() {
                    "sent" => sender.sent += 1,
                    "dlq" => sender.dlq_moves += 1,
                    _ => {}
                }
                if called && d.meta_code != 0 {
                    sender.error_answers += 1;
                    if errors::RATE_LIMIT_CODES.contains(&d.meta_code) {
                        sender.rate_limited += 1;
                    }
                    o.error_answers_total += 1;
                    o.answers.push((t, d.meta_code, d.phone_number_id.clone()));
                }
                if called {
                    // What the breaker's window counts, by Meta's answer (see errors::breaker_failure).
                    if let Some(failure) = errors::breaker_failure(&d.result, d.meta_code, d.http_status) {
                        o.calls.entry(d.phone_number_id.clone()).or_default().push((t, failure));
                    }
                }
                if d.result == "sent" {
                    if d.lane == "rp" || d.lane == "rh" {
                        o.replay_sent_s.push(t);
                    } else {
                        o.last_live_sent_s = o.last_live_sent_s.max(t);
                    }
                }
                match d.result.as_str() {
                    "sent" => {
                        o.sent_total += 1;
                        o.calls_total += 1;
                    }
                    "retry" | "rate_limited" | "unknown" | "quarantined" if called => {
                        o.calls_total += 1;
                        o.failed_calls_total += 1;
                    }
                    "dlq" if called => {
                        o.calls_total += 1;
                        o.failed_calls_total += 1;
                    }
                    "dlq" if d.decision == "breaker_open" || d.decision == "forced_open" => {
                        o.fail_fast_us.push(d.decision_us);
                        o.fail_fast_moved_us.push(d.handling_us);
                    }
                    _ => {}
                }
            }
        }
    });
    Ok(vec![t1, t2, t3, t4])
}
