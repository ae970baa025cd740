//! Periodic checks: stream state (DLQ depth and oldest age per scope, streams near their limits, quarantine
//! growth, unknown-outcome backlog), scope snapshots of firing breaker alerts, escalation, quiet resolution,
//! and storm-key resolution. Every instance runs them; the CAS state makes the results idempotent.

use crate::config::{AlertingConfig, RulesConfig};
use crate::engine::Engine;
use crate::metrics::labels;
use crate::model::{AlertStateExt as _, FLEET, Firing, Rule, STORM_TARGET, dedup_key, storm_key};
use async_nats::jetstream::{self, kv};
use bw_common::nats::LaneReading;
use bw_proto::v1::AlertState;
use bw_proto::v1::{BreakerState, ScopeSnapshot, Severity};
use bw_wire::names;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use std::collections::{HashMap, HashSet, VecDeque};

/// Conditions found by one pass over the streams: which rules were evaluated and which keys violate them.
#[derive(Default)]
struct Findings {
    evaluated: HashSet<Rule>,
    violating: HashSet<String>,
}

/// Periodic checker; keeps the quarantine samples between ticks.
pub(crate) struct Poller {
    engine: Engine,
    js: jetstream::Context,
    /// BW_SEND's and BW_DLQ's partitions: each is its own stream with its own limit.
    send: names::SendPartitions,
    /// The ledger partitions' streams (`KV_BW_LEDGER`, ...), watched for their limits like BW_SEND.
    ledger_streams: Vec<String>,
    scopes: kv::Store,
    rules: RulesConfig,
    alerting: AlertingConfig,
    /// (time, BW_QUARANTINE last sequence): the last sequence only grows, whatever operators delete.
    quarantine_samples: VecDeque<(i64, u64)>,
}

/// Whether a BW_SEND partition is unserved, and for how long (seconds): messages wait undelivered (or the
/// partition holds messages and no dispatcher ever made its consumers), no dispatcher has a pull request waiting
/// on any lane, and for at least `after_s` both the last delivery (if any) and the oldest stored message
/// (`oldest_ms`) lie behind. So a partition that was quiet for an hour is not unserved the moment a message
/// arrives, nor one whose dispatchers are still starting. A served partition never fires: a busy dispatcher
/// delivers continuously, an idle one keeps pull requests parked; messages delayed on purpose (retries, holds)
/// are delivered already, not undelivered.
pub(crate) fn unserved(
    stored: u64,
    oldest_ms: Option<i64>,
    lanes: &[LaneReading],
    now_ms: i64,
    after_s: u64,
) -> Option<f64> {
    let undelivered = if lanes.is_empty() { stored } else { lanes.iter().map(|l| l.undelivered).sum() };
    if undelivered == 0 || lanes.iter().any(|l| l.waiting > 0) {
        return None;
    }
    let since = |at: Option<i64>| at.map_or(f64::INFINITY, |at| (now_ms - at).max(0) as f64 / 1000.0);
    let idle_s = since(lanes.iter().filter_map(|l| l.last).max()).min(since(oldest_ms));
    (idle_s >= after_s as f64).then_some(idle_s)
}

fn age_s(now_ms: i64, then: time::OffsetDateTime) -> f64 {
    let then_ms = (then.unix_timestamp_nanos() / 1_000_000) as i64;
    ((now_ms - then_ms).max(0) as f64) / 1000.0
}

impl Poller {
    pub(crate) fn new(
        engine: Engine,
        js: jetstream::Context,
        send: names::SendPartitions,
        ledger_streams: Vec<String>,
        scopes: kv::Store,
        rules: RulesConfig,
        alerting: AlertingConfig,
    ) -> Poller {
        Poller { engine, js, send, ledger_streams, scopes, rules, alerting, quarantine_samples: VecDeque::new() }
    }

    /// One full pass. Errors are logged; a rule whose input could not be read resolves nothing this tick.
    pub(crate) async fn tick(&mut self) {
        let now = bw_common::time::now_ms();
        let mut found = Findings::default();
        let checks = [
            self.check_dlq(now, &mut found).await,
            self.check_limits(now, &mut found).await,
            self.check_send_served(now, &mut found).await,
            self.check_quarantine(now, &mut found).await,
            self.check_unknown(now, &mut found).await,
        ];
        for e in checks.into_iter().filter_map(Result::err) {
            tracing::warn!(error = format!("{e:#}"), "stream check failed");
        }
        match self.engine.store.all().await {
            Ok(states) => self.review(now, states, &found).await,
            Err(e) => tracing::warn!(error = %e, "cannot read alert states"),
        }
        self.engine.metrics.polls.inc();
    }

    async fn fire(&self, found: &mut Findings, f: Firing) {
        found.violating.insert(dedup_key(f.rule, &f.target));
        if let Err(e) = self.engine.fire(f).await {
            tracing::warn!(error = %e, "cannot fire alert");
        }
    }

    async fn check_dlq(&self, now: i64, found: &mut Findings) -> anyhow::Result<()> {
        // Every DLQ partition (one per send partition); their subjects are distinct.
        let mut total = 0;
        let mut per_subject = Vec::new();
        for partition in self.send.all() {
            let stream = self.js.get_stream(names::SendPartitions::dlq_stream(partition)).await?;
            let mut subjects = stream.info_with_subjects(names::SendPartitions::dlq_all(partition)).await?;
            let first_seq = subjects.info.state.first_sequence;
            total += subjects.info.state.messages;
            while let Some((subject, count)) = subjects.try_next().await? {
                per_subject.push((stream.clone(), first_seq, subject, count as u64));
            }
        }
        // Oldest message per scope: one first-by-subject lookup each, a few at a time.
        let ages: Vec<(String, u64, Option<f64>)> = futures::stream::iter(per_subject)
            .map(|(stream, first_seq, subject, count)| async move {
                let age = stream.get_first_raw_message_by_subject(&subject, first_seq.max(1)).await.ok();
                (subject, count, age.map(|m| age_s(now, m.time)))
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let metrics = &self.engine.metrics;
        metrics.dlq_depth.set(total as i64);
        metrics.dlq_scopes.set(ages.len() as i64);
        metrics.dlq_oldest_age.set(ages.iter().filter_map(|(_, _, a)| *a).fold(0.0, f64::max));
        found.evaluated.extend([Rule::DlqDepth, Rule::DlqOldestAge]);
        // One subject per class and sender (names::dlq_subject): a sender's depth is the sum, its age the oldest.
        let mut per_sender: std::collections::BTreeMap<String, (u64, f64)> = std::collections::BTreeMap::new();
        for (subject, depth, age) in ages {
            let slot = per_sender.entry(names::phone_of_subject(&subject).to_string()).or_default();
            slot.0 += depth;
            slot.1 = slot.1.max(age.unwrap_or(0.0));
        }
        for (phone, (depth, age)) in per_sender {
            let labels =
                vec![("depth".to_string(), depth.to_string()), ("oldest_age_s".to_string(), format!("{age:.0}"))];
            if depth >= self.rules.dlq_depth_threshold {
                let summary = format!("DLQ holds {depth} messages for sender {phone} (oldest {:.0} min)", age / 60.0);
                let f = self.firing(Rule::DlqDepth, &phone, Severity::Warning, summary, now, labels.clone());
                self.fire(found, f).await;
            }
            if age >= self.rules.dlq_oldest_age_s as f64 {
                let summary =
                    format!("oldest DLQ message of sender {phone} waits for {:.0} min ({depth} in DLQ)", age / 60.0);
                let f = self.firing(Rule::DlqOldestAge, &phone, Severity::Warning, summary, now, labels);
                self.fire(found, f).await;
            }
        }
        Ok(())
    }

    fn firing(
        &self,
        rule: Rule,
        target: &str,
        severity: Severity,
        summary: String,
        now: i64,
        labels: Vec<(String, String)>,
    ) -> Firing {
        let scope = if target == FLEET { String::new() } else { target.to_string() };
        Firing { rule, target: target.to_string(), scope, severity, summary, at_unix_ms: now, labels }
    }

    /// `stream_near_limit`: the streams that refuse a publish when full (DiscardNew) and hold work that must
    /// not be lost, by the fuller of their message and byte limits.
    async fn check_limits(&self, now: i64, found: &mut Findings) -> anyhow::Result<()> {
        let others = [names::UNKNOWN_STREAM, names::QUARANTINE_STREAM, names::WEBHOOK_STREAM].map(String::from);
        let ledger = self.ledger_streams.iter().cloned();
        for name in self.send.streams().chain(self.send.dlq_streams()).chain(others).chain(ledger) {
            let name = name.as_str();
            let mut stream = self.js.get_stream(name).await?;
            let info = stream.info().await?;
            let (messages, max) = (info.state.messages, info.config.max_messages);
            let (bytes, max_bytes) = (info.state.bytes, info.config.max_bytes);
            let stream_label = labels([("stream", name)]);
            let metrics = &self.engine.metrics;
            metrics.stream_messages.get_or_create(&stream_label).set(messages as i64);
            metrics.stream_max_messages.get_or_create(&stream_label).set(max);
            metrics.stream_bytes.get_or_create(&stream_label).set(bytes as i64);
            metrics.stream_max_bytes.get_or_create(&stream_label).set(max_bytes);
            let of = |n: u64, max: i64| if max > 0 { n as f64 / max as f64 } else { 0.0 };
            let (by_messages, by_bytes) = (of(messages, max), of(bytes, max_bytes));
            if by_messages.max(by_bytes) >= self.rules.stream_near_limit_ratio {
                let summary = if by_bytes > by_messages {
                    format!(
                        "{name} holds {bytes} of at most {max_bytes} bytes ({:.0}%); at the limit new messages are \
                         refused",
                        100.0 * by_bytes
                    )
                } else {
                    format!(
                        "{name} holds {messages} of at most {max} messages ({:.0}%); at the limit new messages are \
                         refused",
                        100.0 * by_messages
                    )
                };
                let labels = vec![
                    ("messages".into(), messages.to_string()),
                    ("max_messages".into(), max.to_string()),
                    ("bytes".into(), bytes.to_string()),
                    ("max_bytes".into(), max_bytes.to_string()),
                ];
                let f = self.firing(Rule::StreamNearLimit, name, Severity::Critical, summary, now, labels);
                self.fire(found, f).await;
            }
        }
        found.evaluated.insert(Rule::StreamNearLimit);
        Ok(())
    }

    /// `send_unserved`: per BW_SEND partition, whether some dispatcher takes its messages (its four lane
    /// consumers: undelivered messages, waiting pull requests, last delivery).
    async fn check_send_served(&self, now: i64, found: &mut Findings) -> anyhow::Result<()> {
        for partition in self.send.all() {
            let name = names::SendPartitions::stream(partition);
            let stream = self.js.get_stream(&name).await?;
            let state = &stream.cached_info().state;
            let stored = state.messages;
            let oldest = (stored > 0).then(|| (state.first_timestamp.unix_timestamp_nanos() / 1_000_000) as i64);
            // A refused or unanswered request leaves the rule unevaluated this tick rather than taking the
            // partition for unserved.
            let lanes = bw_common::nats::dispatcher_lanes(&stream).await?;
            if let Some(idle_s) = unserved(stored, oldest, &lanes, now, self.rules.send_unserved_after_s) {
                let summary = format!(
                    "{name} holds {stored} messages and no dispatcher has taken one for {idle_s:.0} s: every \
                     dispatcher serving partition {partition} is down, or none has it in dispatch.partitions"
                );
                let labels = vec![("stream".to_string(), name.clone()), ("messages".to_string(), stored.to_string())];
                let f = self.firing(Rule::SendUnserved, &name, Severity::Critical, summary, now, labels);
                self.fire(found, f).await;
            }
        }
        found.evaluated.insert(Rule::SendUnserved);
        Ok(())
    }

    async fn check_quarantine(&mut self, now: i64, found: &mut Findings) -> anyhow::Result<()> {
        let mut stream = self.js.get_stream(names::QUARANTINE_STREAM).await?;
        let last_seq = stream.info().await?.state.last_sequence;
        let window = self.rules.quarantine_growth_window_ms as i64;
        self.quarantine_samples.push_back((now, last_seq));
        while self.quarantine_samples.len() > 2 && self.quarantine_samples[1].0 <= now - window {
            self.quarantine_samples.pop_front();
        }
        let Some(&(oldest_at, oldest_seq)) = self.quarantine_samples.front() else {
            return Ok(());
        };
        let growth = last_seq.saturating_sub(oldest_seq);
        if growth >= self.rules.quarantine_growth_threshold && growth > 0 {
            let summary = format!(
                "{growth} messages quarantined in the last {:.0} min (permanent errors or poison messages)",
                (now - oldest_at) as f64 / 60_000.0
            );
            let labels = vec![("growth".into(), growth.to_string())];
            let f = self.firing(Rule::QuarantineGrowth, FLEET, Severity::Warning, summary, now, labels);
            self.fire(found, f).await;
        }
        // Only a full window of history may say "no growth" (a freshly started instance has too little).
        if now - oldest_at >= window || found.violating.contains(&dedup_key(Rule::QuarantineGrowth, FLEET)) {
            found.evaluated.insert(Rule::QuarantineGrowth);
        }
        Ok(())
    }

    async fn check_unknown(&self, now: i64, found: &mut Findings) -> anyhow::Result<()> {
        let mut stream = self.js.get_stream(names::UNKNOWN_STREAM).await?;
        let state = stream.info().await?.state.clone();
        let age = if state.messages > 0 { age_s(now, state.first_timestamp) } else { 0.0 };
        self.engine.metrics.unknown_oldest_age.set(age);
        if state.messages >= self.rules.unknown_backlog_threshold.max(1)
            || (state.messages > 0 && age >= self.rules.unknown_oldest_age_s as f64)
        {
            let summary = format!(
                "{} messages with an unknown outcome wait for reconciliation (oldest {:.0} min)",
                state.messages,
                age / 60.0
            );
            let labels =
                vec![("backlog".into(), state.messages.to_string()), ("oldest_age_s".into(), format!("{age:.0}"))];
            let f = self.firing(Rule::UnknownBacklog, FLEET, Severity::Warning, summary, now, labels);
            self.fire(found, f).await;
        }
        found.evaluated.insert(Rule::UnknownBacklog);
        Ok(())
    }

    async fn snapshot(&self, phone: &str) -> Option<ScopeSnapshot> {
        let bytes = self.scopes.get(phone).await.ok()??;
        ScopeSnapshot::decode(bytes).ok()
    }

    /// Escalates, resolves and counts the alert states.
    async fn review(&self, now: i64, states: Vec<(String, AlertState)>, found: &Findings) {
        let mut active: HashMap<Rule, i64> = Rule::ALL.iter().map(|r| (*r, 0)).collect();
        let mut digested_firing: HashSet<Rule> = HashSet::new();
        let mut storms = Vec::new();
        for (key, state) in states {
            let Some(alert) = state.alert.as_ref().filter(|_| state.is_firing()) else {
                continue;
            };
            let Some(rule) = Rule::from_name(&alert.rule) else {
                continue;
            };
            if key == storm_key(rule) {
                storms.push((rule, key));
                continue;
            }
            *active.entry(rule).or_default() += 1;
            if !state.individual {
                digested_firing.insert(rule);
            }
            let result = match rule {
                Rule::BreakerOpen => self.review_breaker(now, &key, &state).await,
                r if r.resolves_when_quiet()
                    && now - state.last_seen_unix_ms >= self.alerting.signal_quiet_resolve_ms as i64 =>
                {
                    self.engine.resolve(rule, &key, now, false).await
                }
                r if found.evaluated.contains(&r) && !found.violating.contains(&key) => {
                    self.engine.resolve(rule, &key, now, false).await
                }
                _ => Ok(()),
            };
            if let Err(e) = result {
                tracing::warn!(dedup_key = %key, error = %e, "cannot update alert");
            }
        }
        for (rule, key) in storms {
            if !digested_firing.contains(&rule)
                && let Err(e) = self.engine.resolve(rule, &key, now, false).await
            {
                tracing::warn!(dedup_key = %key, error = %e, "cannot resolve storm");
            }
        }
        for (rule, n) in active {
            self.engine.metrics.active.get_or_create(&labels([("rule", rule.name())])).set(n);
        }
    }

    async fn review_breaker(&self, now: i64, key: &str, state: &AlertState) -> Result<(), crate::state::StateError> {
        let Some(alert) = state.alert.as_ref() else {
            return Ok(());
        };
        let phone = key.strip_prefix("breaker_open.").unwrap_or_default();
        if phone == STORM_TARGET {
            return Ok(());
        }
        // A CLOSED snapshot newer than the firing heals a missed CLOSED event. "Newer" is either the state's
        // own `since` or, when the breaker state was lost (Redis restarted empty: CLOSED with `since` 0 and no
        // transition published), the time the authority last read it as CLOSED (`updated_at`).
        if let Some(snap) = self.snapshot(phone).await {
            let closed =
                matches!(BreakerState::try_from(snap.state), Ok(BreakerState::Closed) | Ok(BreakerState::ForcedClosed));
            if let Some(at) = closed_after(&snap, alert.started_at_unix_ms).filter(|_| closed) {
                return self.engine.resolve(Rule::BreakerOpen, key, at, true).await;
            }
        }
        let forced = alert.labels.get("forced").is_some_and(|v| v == "true");
        let open_ms = now - alert.started_at_unix_ms;
        if !forced && state.severity() != Severity::Critical && open_ms >= self.rules.breaker_escalate_after_ms {
            let summary = format!("{} — still OPEN after {} s: escalated", alert.summary, open_ms / 1000);
            return self.engine.escalate(Rule::BreakerOpen, key, Severity::Critical, &summary).await;
        }
        Ok(())
    }
}

/// When a CLOSED snapshot shows the breaker closed after `started_ms`: its `since` if that is later, else its
/// `updated_at` if that is (the state was reset without a transition), else never.
fn closed_after(snap: &ScopeSnapshot, started_ms: i64) -> Option<i64> {
    if snap.since_unix_ms >= started_ms {
        Some(snap.since_unix_ms)
    } else if snap.updated_at_unix_ms > started_ms {
        Some(snap.updated_at_unix_ms)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{closed_after, unserved};
    use bw_common::nats::LaneReading;
    use bw_proto::v1::ScopeSnapshot;

    /// At the compiled default (120 s, read from default.toml): waiting messages with nobody waiting on any lane
    /// fire once both the last delivery and the oldest message are 120 s old; a parked pull request, a recent
    /// delivery, a fresh message or nothing undelivered never fires.
    #[test]
    fn a_partition_is_unserved_when_messages_wait_and_no_dispatcher_pulls() {
        let cfg: crate::Config = bw_common::config::load("alerting", crate::DEFAULT_CONFIG, None, &Default::default())
            .expect("compiled defaults");
        let after = cfg.rules.send_unserved_after_s;
        assert_eq!(after, 120);
        let now = 1_000_000_000;
        let lane = |undelivered, waiting, last_ago_s: Option<i64>| LaneReading {
            undelivered,
            waiting,
            last: last_ago_s.map(|s| now - s * 1000),
        };
        let ago = |s: i64| Some(now - s * 1000);
        let idle = |ago| [lane(5, 0, Some(ago)), lane(0, 0, Some(ago + 10)), lane(0, 0, None), lane(0, 0, None)];
        assert_eq!(unserved(5, ago(900), &idle(119), now, after), None, "a delivery 119 s ago");
        assert_eq!(unserved(5, ago(900), &idle(120), now, after), Some(120.0));
        assert_eq!(unserved(5, ago(30), &idle(3_600), now, after), None, "quiet for an hour, a message 30 s old");
        assert_eq!(unserved(5, ago(121), &idle(3_600), now, after), Some(121.0));
        assert_eq!(unserved(7, ago(119), &[], now, after), None, "no consumers yet: dispatchers may be starting");
        assert_eq!(unserved(7, ago(125), &[], now, after), Some(125.0), "no dispatcher ever made the consumers");
        assert_eq!(unserved(0, None, &[], now, after), None, "nothing stored");
        let never = [lane(3, 0, None), lane(0, 0, None)];
        assert_eq!(unserved(3, ago(200), &never, now, after), Some(200.0), "consumers but never a delivery");
        let parked = [lane(5, 0, Some(600)), lane(0, 1, Some(600))];
        assert_eq!(unserved(5, ago(900), &parked, now, after), None, "an idle dispatcher's parked pull: served");
        let delayed = [lane(0, 0, Some(600))];
        let held = unserved(9, ago(900), &delayed, now, after);
        assert_eq!(held, None, "delivered and held back on purpose, nothing undelivered");
    }

    #[test]
    fn a_closed_snapshot_heals_only_when_written_after_the_firing() {
        let snap =
            |since, updated| ScopeSnapshot { since_unix_ms: since, updated_at_unix_ms: updated, ..Default::default() };
        assert_eq!(closed_after(&snap(1_500, 1_600), 1_000), Some(1_500), "closed after the trip");
        assert_eq!(closed_after(&snap(0, 1_600), 1_000), Some(1_600), "state reset, read CLOSED later");
        assert_eq!(closed_after(&snap(0, 900), 1_000), None, "a snapshot older than the trip says nothing");
        assert_eq!(closed_after(&snap(500, 1_000), 1_000), None);
    }
}
