//! Handling of one fetched batch: prepare (`fetch.rs`), admit (one breaker round trip per scope),
//! send concurrently, record outcomes (batched), and move every message to its next place.

use crate::meta::MetaAnswer;
use crate::route::{self, Next, Policy};
use crate::send::{Flown, Sending};
use crate::settle::Outcome;
use crate::worker::{Work, Worker};
use async_nats::jetstream;
use bw_breaker::{AdmitItem, Decision, DenyReason, OutcomeItem, OutcomeKind, PauseEnd, PauseSource, PauseSpec, Scope};
use bw_common::classify::{ErrorClass, Only, Pause, RateScope};
use bw_common::disposition::Settle;
use bw_common::time::now_ms;
use bw_proto::v1::{DispatchOutcome, ErrorInfo, QuarantineReason};
use bw_wire::names::Lane;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prost::Message as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Outcome buffers are flushed to Redis at this size or age, so the breaker learns of failures quickly even
/// when a few calls in the batch hang.
const RECORD_FLUSH_ITEMS: usize = 32;
const RECORD_FLUSH_AGE: Duration = Duration::from_millis(20);

type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Outcomes waiting to be recorded in the breaker, by scope.
#[derive(Default)]
struct Outcomes {
    by_scope: HashMap<(String, String), Vec<OutcomeItem>>,
    /// Operations leaving their recipients' order sets, recorded in the same round trip.
    releases: HashMap<(String, String), Vec<bw_breaker::OrderRelease>>,
    count: usize,
    /// When the oldest buffered outcome came in.
    oldest: Option<Instant>,
}

impl Outcomes {
    fn push(&mut self, w: &Work, kind: OutcomeKind, canary: bool) {
        self.by_scope
            .entry((w.request.waba_id.clone(), w.request.phone_number_id.clone()))
            .or_default()
            .push(OutcomeItem { recipient_key: bw_common::mask::recipient_key(&w.request.recipient), kind, canary });
        self.count += 1;
        self.oldest.get_or_insert_with(Instant::now);
    }

    fn release(&mut self, w: &Work) {
        self.releases
            .entry((w.request.waba_id.clone(), w.request.phone_number_id.clone()))
            .or_default()
            .push(crate::order::release_of(w));
    }
}

/// What one batch has under way: sends (mark, then the call), final moves, and messages held for a slot.
#[derive(Default)]
struct Flight {
    sends: FuturesUnordered<Sending>,
    finals: FuturesUnordered<Pending>,
    held: Vec<Held>,
}

/// A message refused for now, held in memory until its slot instead of going back through the broker.
struct Held {
    due: Instant,
    since: Instant,
    work: Work,
}

impl Worker {
    pub(crate) async fn process_batch(self: Arc<Self>, batch: Vec<(Lane, jetstream::Message)>) {
        let mut f = Flight::default();
        // A message whose sender is known to be OPEN is refused as soon as its own checks are done, without
        // waiting for the rest of the batch or a round trip; the others are admitted together.
        let mut preparing: FuturesUnordered<_> = batch.into_iter().map(|(lane, msg)| self.prepare(lane, msg)).collect();
        let mut to_admit = Vec::new();
        loop {
            tokio::select! {
                prepared = preparing.next() => match prepared {
                    None => break,
                    Some(None) => {}
                    Some(Some(mut w)) => match self.known_open(&w) {
                        Some(admission) => {
                            w.decided_after = w.received.elapsed();
                            let state = format!("{:?}", admission.state);
                            if let Some(decision) = admission.decisions.into_iter().next() {
                                self.apply(w, decision, &state, &admission.incident_id, &mut f);
                            }
                        }
                        None => to_admit.push(w),
                    },
                },
                Some(()) = f.finals.next(), if !f.finals.is_empty() => {}
            }
        }
        let to_admit = self.priority_gate(to_admit, &mut f).await;
        self.admit_round(to_admit, &mut f).await;
        let mut last_round = Instant::now();
        let round_gap = Duration::from_millis(self.cfg.readmit_interval_ms);

        let mut outcomes = Outcomes::default();
        while !(f.sends.is_empty() && f.held.is_empty()) {
            let flush_at = outcomes.oldest.map(|since| since + RECORD_FLUSH_AGE);
            // Held messages go back to admission together, at most once per round gap, so a sender refilling
            // a token per millisecond costs one round trip per few messages, not one per message.
            let readmit_at = f.held.iter().map(|h| h.due).min().map(|due| due.max(last_round + round_gap));
            tokio::select! {
                Some(done) = f.sends.next(), if !f.sends.is_empty() => {
                    let (w, canary, answer, took) = match done {
                        Flown::Answered(w, canary, answer, took) => (w, canary, answer, took),
                        Flown::Late(w) => {
                            self.metrics.late_slots.inc();
                            tracing::debug!(parent: &w.span, misses = w.slot_misses, "send slot missed; admitted again");
                            let now = Instant::now();
                            f.held.push(Held { due: now, since: now, work: w });
                            self.metrics.held.inc();
                            continue;
                        }
                        Flown::Done => continue,
                    };
                    self.metrics.meta_seconds.observe(took.as_secs_f64());
                    for kind in outcome_kinds(&answer) {
                        outcomes.push(&w, kind, canary);
                    }
                    if w.request.keeps_order && crate::order::answer_releases(&answer) {
                        outcomes.release(&w);
                    }
                    let this = self.clone();
                    f.finals.push(Box::pin(async move { this.on_answer(w, answer, took).await }));
                    if outcomes.count >= RECORD_FLUSH_ITEMS {
                        self.flush_outcomes(&mut outcomes).await;
                    }
                }
                Some(()) = f.finals.next(), if !f.finals.is_empty() => {}
                _ = sleep_until_opt(flush_at), if flush_at.is_some() => self.flush_outcomes(&mut outcomes).await,
                _ = sleep_until_opt(readmit_at), if readmit_at.is_some() => {
                    let now = Instant::now() + Duration::from_millis(1);
                    let (due, later): (Vec<Held>, Vec<Held>) = std::mem::take(&mut f.held).into_iter().partition(|h| h.due <= now);
                    f.held = later;
                    self.metrics.held.dec_by(due.len() as i64);
                    last_round = Instant::now();
                    let works = due
                        .into_iter()
                        .map(|mut h| {
                            h.work.waited += h.since.elapsed();
                            h.work
                        })
                        .collect();
                    // The priority gate again: a promotion held here since before its sender's outage must not
                    // go as a HALF_OPEN canary (or after the close) while that outage's priority messages wait.
                    let works = self.priority_gate(works, &mut f).await;
                    self.admit_round(works, &mut f).await;
                }
                _ = self.shutdown.cancelled(), if !f.held.is_empty() => {
                    // Shutting down: held messages go back to the broker for their slot.
                    self.metrics.held.dec_by(f.held.len() as i64);
                    for h in f.held.drain(..) {
                        let this = self.clone();
                        let delay = h.due.saturating_duration_since(Instant::now());
                        f.finals.push(Box::pin(async move { this.release(h.work, delay).await }));
                    }
                }
            }
        }
        self.flush_outcomes(&mut outcomes).await;
        while f.finals.next().await.is_some() {}
    }

    /// The refusal of a message whose sender is known to be OPEN, without a round trip. Never for a message that
    /// keeps order: its order gate is read first, so it cannot follow an earlier one into the DLQ
    /// (`crate::order`).
    fn known_open(&self, w: &Work) -> Option<bw_breaker::Admission> {
        if w.request.keeps_order { None } else { self.breaker.admit_known_open(&w.scope(), 1) }
    }

    /// One admission round: one breaker round trip per scope for `works`. Admitted messages start their mark and
    /// send; refusals with a short wait are held for another round, the rest go to their next place.
    async fn admit_round(self: &Arc<Self>, works: Vec<Work>, f: &mut Flight) {
        let mut groups: HashMap<(String, String), Vec<Work>> = HashMap::new();
        for w in works {
            groups.entry((w.request.waba_id.clone(), w.request.phone_number_id.clone())).or_default().push(w);
        }
        // The scopes of a batch are admitted concurrently, so one sender's round trip never delays another's.
        let hold_max_ms = self.cfg.live_priority_hold_max_ms;
        let admitted = futures::future::join_all(groups.into_values().map(|mut works| async move {
            // Tokens and send slots go out in this order: class, nearest deadline, oldest (priority.rs).
            works.sort_by_key(|w| {
                crate::priority::admission_order(
                    w.class(hold_max_ms),
                    w.request.deadline_unix_ms,
                    w.request.accepted_at_unix_ms,
                )
            });
            let scope = works[0].scope();
            let items: Vec<AdmitItem> = works
                .iter()
                .map(|w| AdmitItem {
                    recipient_key: bw_common::mask::recipient_key(&w.request.recipient),
                    class: w.class(hold_max_ms),
                })
                .collect();
            let gate: Vec<String> = works.iter().map(crate::order::gate_id).collect();
            let admission = self.breaker.admit_ordered(&scope, &items, &gate).await;
            for w in &mut works {
                w.decided_after = w.received.elapsed().saturating_sub(w.waited);
            }
            self.check_blockers(&scope, &mut works, &admission).await;
            (works, admission)
        }))
        .await;
        for (works, admission) in admitted {
            let state = format!("{:?}", admission.state);
            for (mut w, decision) in works.into_iter().zip(admission.decisions) {
                w.slot_gap_ms = admission.slot_gap_ms;
                self.apply(w, decision, &state, &admission.incident_id, f);
            }
        }
    }

    /// Acts on one admission decision: an admitted message starts its mark and send; a refusal with a short
    /// wait is held for another round; any other refusal goes to its next place.
    fn apply(self: &Arc<Self>, mut w: Work, decision: Decision, state: &str, incident: &str, f: &mut Flight) {
        w.span.record("breaker_state", state);
        // A message that cannot make its deadline ends EXPIRED now, before any call (priority.rs).
        let (wait_ms, refusal) = match decision {
            Decision::Allow { wait_ms, .. } => (wait_ms, None),
            Decision::Deny { reason, retry_after_ms } => (retry_after_ms, Some(reason)),
        };
        if crate::priority::misses_deadline(w.request.deadline_unix_ms, now_ms(), wait_ms) {
            w.decision = refusal.map(|r| r.label()).unwrap_or("allow");
            w.span.record("decision", w.decision);
            self.metrics.decision(w.decision);
            let this = self.clone();
            let reason = crate::priority::expiry_reason(refusal);
            f.finals.push(Box::pin(async move { this.expire(w, reason).await }));
            return;
        }
        match decision {
            Decision::Allow { canary, wait_ms } => {
                w.decision = if canary { "canary" } else { "allow" };
                w.span.record("decision", w.decision);
                self.metrics.decision(w.decision);
                f.sends.push(self.send_at_slot(w, canary, wait_ms));
            }
            Decision::Deny { reason, mut retry_after_ms } => {
                if reason == DenyReason::OrderWait {
                    retry_after_ms = crate::order::hold_ms(&w);
                    w.order_polls = w.order_polls.saturating_add(1);
                }
                let label = reason.label();
                w.decision = label;
                w.span.record("decision", label);
                self.metrics.decision(label);
                let wait = Duration::from_millis(retry_after_ms);
                let holdable = crate::route::holdable(reason);
                let hold_max = Duration::from_millis(self.cfg.hold_max_ms);
                if holdable && w.received.elapsed() + wait <= hold_max && !self.shutdown.is_cancelled() {
                    let now = Instant::now();
                    f.held.push(Held { due: now + wait, since: now, work: w });
                    self.metrics.held.inc();
                    return;
                }
                let incident = incident.to_string();
                let this = self.clone();
                f.finals.push(Box::pin(async move { this.on_denied(w, reason, retry_after_ms, &incident).await }));
            }
        }
    }

    /// The priority gate (priority.rs): marketing messages of a sender with a priority backlog, and young live
    /// priority messages of a sender whose older priority replays are in the rh lane, go back to the broker for
    /// `priority_hold_ms` (ledger unchanged); the rest go on to admission.
    async fn priority_gate(self: &Arc<Self>, works: Vec<Work>, f: &mut Flight) -> Vec<Work> {
        let mut pass = Vec::with_capacity(works.len());
        for w in works {
            let r = &w.request;
            let phone = &r.phone_number_id;
            let older_first = crate::priority::holds_live_priority(
                w.lane,
                r.accepted_at_unix_ms,
                r.deadline_unix_ms,
                bw_common::time::now_ms(),
                self.cfg.live_priority_hold_max_ms,
            );
            let gated = crate::priority::gated(w.lane) && self.backlog.waiting(phone).await > 0;
            let hold = gated || (older_first && self.backlog.replaying(phone).await > 0);
            if hold {
                w.span.record("decision", "priority_first");
                self.metrics.decision("priority_first");
                let this = self.clone();
                // A held promotion backs off; a held live priority message comes back after the plain hold.
                let delay = Duration::from_millis(if gated {
                    let delivered = w.msg.info().map(|i| i.delivered).unwrap_or(1);
                    crate::priority::gated_hold_ms(self.cfg.priority_hold_ms, delivered)
                } else {
                    self.cfg.priority_hold_ms
                });
                f.finals.push(Box::pin(async move {
                    this.settle(&w, Settle::nak(Outcome::PriorityFirst, delay), None).await
                }));
            } else {
                pass.push(w);
            }
        }
        pass
    }

    /// Gives a held message back to the broker, redelivered after `delay`.
    async fn release(&self, w: Work, delay: Duration) {
        self.settle(&w, Settle::nak(Outcome::Held, delay), None).await;
    }

    /// Records the buffered outcomes, one breaker round trip per scope, the scopes concurrently (as admission
    /// does): a flush of outcomes spread over many senders costs one round trip of waiting, not one per sender,
    /// while the batch's sends are not polled. Each scope's batch then feeds its token's pooled evidence (a second
    /// round trip, on the token's slot), which opens the numbers failing with the token
    /// (`Breaker::record_pooled`); the number's own checks ran first, unchanged.
    async fn flush_outcomes(&self, outcomes: &mut Outcomes) {
        let mut taken = std::mem::take(outcomes);
        let records = taken.by_scope.into_iter().map(|(key, items)| {
            let releases = taken.releases.remove(&key).unwrap_or_default();
            let (waba_id, phone_number_id) = key;
            async move {
                let scope = Scope { waba_id, phone_number_id };
                self.breaker.record_releasing(&scope, &items, &releases).await;
                self.breaker.record_pooled(&scope, &items).await;
            }
        });
        futures::future::join_all(records).await;
    }

    fn policy(&self) -> Policy {
        Policy {
            max_retries: self.cfg.max_retries,
            retry_budget_ms: self.cfg.retry_budget_ms,
            long_pause_ms: self.cfg.long_pause_ms,
        }
    }

    async fn on_denied(&self, w: Work, reason: DenyReason, retry_after_ms: u64, incident: &str) {
        let retry_after_ms =
            if reason == DenyReason::OrderWait { crate::order::redelivery_ms(&w) } else { retry_after_ms };
        match route::after_denial(reason, retry_after_ms, &self.policy()) {
            Next::Dlq { reason: dlq, not_before_ms, .. } => {
                let details = match reason {
                    DenyReason::BreakerOpen | DenyReason::ForcedOpen => "breaker open: failed fast",
                    _ => "sender paused",
                };
                let err = ErrorInfo { details: details.into(), at_unix_ms: now_ms(), ..Default::default() };
                self.dead_letter(w, dlq, incident, err, not_before_ms).await;
            }
            Next::HoldBack { delay_ms } => self.release(w, Duration::from_millis(delay_ms)).await,
            other => {
                // after_denial only dead-letters or holds back; anything else is a bug in the table.
                tracing::error!(parent: &w.span, next = ?other, "unexpected route for a refusal; held back");
                self.release(w, Duration::from_millis(retry_after_ms)).await;
            }
        }
    }

    /// Carries out what [`route::after_answer`] decided for Meta's answer.
    pub(crate) async fn on_answer(&self, w: Work, answer: MetaAnswer, took: Duration) {
        let next = route::after_answer(&answer, &self.tries(&w), &self.policy());
        self.note_marketing_answer(&w, &answer).await;
        let err = match &answer {
            MetaAnswer::Accepted { usage_percent, .. } => {
                self.metrics.meta_response("200");
                match usage_percent {
                    Some(pct) => self.breaker.observe_usage(&w.scope(), *pct).await,
                    None => {
                        self.metrics.no_usage_headers.inc();
                        self.breaker.observe_no_usage(&w.scope()).await;
                    }
                }
                ErrorInfo::default()
            }
            MetaAnswer::Rejected { code, http_status, details, fbtrace_id, .. } => {
                self.metrics.meta_response(&code.to_string());
                ErrorInfo {
                    meta_code: *code,
                    http_status: u32::from(*http_status),
                    details: details.clone(),
                    fbtrace_id: fbtrace_id.clone(),
                    at_unix_ms: now_ms(),
                }
            }
            MetaAnswer::NotSent { details } => {
                self.metrics.meta_response("not_sent");
                ErrorInfo { details: details.clone(), at_unix_ms: now_ms(), ..Default::default() }
            }
            MetaAnswer::Unknown { details, http_status } => {
                self.metrics.meta_response("unknown");
                ErrorInfo {
                    details: details.clone(),
                    http_status: u32::from(*http_status),
                    at_unix_ms: now_ms(),
                    ..Default::default()
                }
            }
        };
        match next {
            Next::Sent { wamid, held } => self.sent(w, wamid, held, took).await,
            Next::Retry { delay_ms } => self.retry(w, err, delay_ms).await,
            Next::HoldBack { delay_ms } => self.held_back(w, Duration::from_millis(delay_ms), err).await,
            Next::Dlq { reason, not_before_ms, signal } => {
                if let Some(kind) = signal {
                    self.signal(kind, &w, &err).await;
                }
                self.dead_letter(w, reason, "", err, not_before_ms).await;
            }
            Next::Quarantine {
                reason: reason @ (QuarantineReason::TemplateHeld | QuarantineReason::Unclassified),
                ..
            } => {
                self.quarantine_scoped(w, reason, err, &answer).await;
            }
            Next::Quarantine { reason, signal } => {
                if let Some(kind) = signal {
                    self.signal(kind, &w, &err).await;
                }
                self.to_quarantine(w, reason, err).await;
            }
            Next::Unknown => self.to_unknown(w, err).await,
        }
    }

    /// Publishes a DispatchOutcome event (fire and forget; the ledger is the source of truth).
    pub(crate) fn outcome(&self, w: &Work, result: &str, err: &ErrorInfo, wamid: &str, latency_us: u64) {
        if !self.cfg.publish_outcomes {
            return;
        }
        let event = DispatchOutcome {
            operation_id: w.request.operation_id.clone(),
            waba_id: w.request.waba_id.clone(),
            phone_number_id: w.request.phone_number_id.clone(),
            result: result.to_string(),
            meta_code: err.meta_code,
            http_status: err.http_status,
            wamid: wamid.to_string(),
            attempt: w.attempt(),
            at_unix_ms: now_ms(),
            decision: w.decision.to_string(),
            meta_latency_us: latency_us,
            handling_us: w.received.elapsed().saturating_sub(w.waited).as_micros() as u64,
            decision_us: w.decided_after.as_micros() as u64,
            lane: w.lane.token().to_string(),
        };
        let nats = self.nats.clone();
        let subject = bw_wire::names::outcome_subject(&w.request.phone_number_id);
        tokio::spawn(async move {
            let _ = nats.publish(subject, event.encode_to_vec().into()).await;
        });
    }
}

/// What the breaker learns from an answer (one or two items). Unknown outcomes count as transient failures
/// (Meta is not answering as it should); rate limits feed their limiter (the app's and the WABA's as pauses of
/// those scopes, with Meta's code); holds pause exactly their scope (token, app, WABA or number) for the
/// answer's hint or the default pause, or until lifted; a transient code with a pause of its own (maintenance)
/// counts as a failure and pauses the number; permanent and unclassified errors never count.
pub(crate) fn outcome_kinds(answer: &MetaAnswer) -> Vec<OutcomeKind> {
    let MetaAnswer::Rejected { meaning, code, retry_after_ms, .. } = answer else {
        return vec![match answer {
            MetaAnswer::Accepted { .. } => OutcomeKind::Success,
            _ => OutcomeKind::Transient,
        }];
    };
    let hint = answer.pause_hint_ms();
    let pause = |end: PauseEnd| {
        OutcomeKind::Pause(PauseSpec {
            scope: meaning.scope,
            code: *code,
            end,
            marketing_only: meaning.only == Only::Marketing,
            source: PauseSource::Answer,
        })
    };
    let end = match (meaning.pause, meaning.pause_ms(hint)) {
        (Pause::Probe(_), Some(ms)) => Some(PauseEnd::Probe(ms)),
        (_, Some(ms)) => Some(PauseEnd::For(ms)),
        (Pause::UntilLifted, None) => Some(PauseEnd::Lifted),
        _ => None,
    };
    match meaning.class {
        ErrorClass::Transient => {
            // Meta's own "service unavailable" codes also feed the pool's second test.
            let mut kinds = vec![OutcomeKind::transient(*code)];
            if meaning.paused_scope().is_some()
                && let Some(end) = end
            {
                kinds.push(pause(end));
            }
            kinds
        }
        ErrorClass::RateLimit(scope @ (RateScope::App | RateScope::Waba)) => {
            vec![pause(PauseEnd::For(meaning.pause_ms(hint).unwrap_or(scope.default_pause_ms())))]
        }
        // The limiters of the number, the pair, the recipient and the Flow take Retry-After alone, as
        // `route::rate_hint` does (the AIMD on 130429 is tuned to it).
        ErrorClass::RateLimit(scope) => {
            vec![OutcomeKind::RateLimited { scope, pause_ms: retry_after_ms.unwrap_or(scope.default_pause_ms()) }]
        }
        ErrorClass::Hold => match end {
            Some(end) if meaning.paused_scope().is_some() => vec![pause(end)],
            _ => vec![OutcomeKind::Permanent],
        },
        ErrorClass::Permanent | ErrorClass::Unclassified => vec![OutcomeKind::Permanent],
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
