//! Handling of one fetched batch: prepare (decode, ledger, deadline), admit (one breaker round trip per scope),
//! send concurrently, record outcomes (batched), and move every message to its next place.

use crate::DispatchConfig;
use crate::meta::{MetaAnswer, MetaClient};
use crate::metrics::Metrics;
use crate::moves::{Outcome, RETRY_LATER};
use crate::route::{self, Next, Policy};
use async_nats::jetstream;
use bw_breaker::{
    AdmitItem, Breaker, Decision, DenyReason, OutcomeItem, OutcomeKind, PauseEnd, PauseSource, PauseSpec, Scope,
    TrafficClass,
};
use bw_common::classify::{ErrorClass, Only, Pause, RateScope};
use bw_common::disposition::Settle;
use bw_common::ledger::{Ledger, Versioned};
use bw_common::names::Lane;
use bw_common::proto::{DispatchOutcome, ErrorInfo, OperationState, QuarantineReason, SendRequest};
use bw_common::time::now_ms;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use prost::Message as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

pub(crate) struct Worker {
    pub js: jetstream::Context,
    /// Which BW_SEND and BW_DLQ partition each sender is in (`nats.send_partitions`).
    pub send: bw_common::names::SendPartitions,
    pub nats: async_nats::Client,
    pub ledger: Ledger,
    /// Who owns which sender (checked before each send in registry mode).
    pub registry: bw_common::registry::RegistryView,
    pub breaker: Breaker,
    pub meta: MetaClient,
    pub cfg: DispatchConfig,
    pub metrics: Metrics,
    pub shutdown: tokio_util::sync::CancellationToken,
    /// This instance's id in on-the-wire mark tokens.
    pub instance: String,
    /// Every sender's priority backlog, for the priority gate (`priority.rs`).
    pub backlog: crate::priority::Backlog,
    /// Per sender, this process's own allowance for late sends and when it was last refilled, used only while
    /// Redis does not answer (`claim_late_here`; the fleet-wide one lives in Redis).
    pub late_allowance: std::sync::Mutex<HashMap<String, (f64, Instant)>>,
    /// Concurrent late claims of one sender, joined into one round trip (`late.rs`).
    pub(crate) late_claims: crate::late::Coalescer,
    /// When this process last raised the `dlq_limit` signal per sender (`moves.rs`).
    pub dlq_limit_signalled: std::sync::Mutex<HashMap<String, Instant>>,
    /// How long the on-the-wire mark's write takes here (`MarkLead`): the mark starts that long before the send
    /// slot, so the request leaves at its slot instead of a write's latency after it.
    pub(crate) mark_lead: MarkLead,
    /// Quarantine scopes and recipient marketing state (`gates.rs`).
    pub(crate) gates: crate::gates::Gates,
}

/// A running estimate of the on-the-wire mark's write latency in this process, microseconds: a fast rise
/// (half of the way to a slower write) and a slow fall (an eighth of the way to a faster one), so the lead
/// covers most writes. Capped at [`MARK_LEAD_MAX`]: a broker stall is not something to plan slots around
/// (the late-send rule handles it).
#[derive(Default)]
pub(crate) struct MarkLead(std::sync::atomic::AtomicU64);

/// The longest lead the mark gets before its send slot.
const MARK_LEAD_MAX: Duration = Duration::from_millis(100);

impl MarkLead {
    pub(crate) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(std::sync::atomic::Ordering::Relaxed)).min(MARK_LEAD_MAX)
    }

    pub(crate) fn observe(&self, took: Duration) {
        let took = took.min(MARK_LEAD_MAX * 2).as_micros() as u64;
        let _ =
            self.0.fetch_update(std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed, |cur| {
                Some(if took > cur { cur + (took - cur) / 2 } else { cur - (cur - took) / 8 })
            });
    }
}

/// A message that passed the pre-checks and waits for admission.
pub(crate) struct Work {
    pub lane: Lane,
    pub msg: jetstream::Message,
    pub request: SendRequest,
    pub ledger: Versioned,
    pub span: tracing::Span,
    /// When this delivery was handed to the worker.
    pub received: Instant,
    /// Admission decision label, for outcome events.
    pub decision: &'static str,
    /// Time from `received` to the admission decision, less the time spent waiting in memory for a slot.
    pub decided_after: Duration,
    /// Time spent waiting in memory for an admission slot.
    pub waited: Duration,
    /// Set when the order gate refused it: what it waits for (`crate::order`).
    pub order_wait: Option<crate::order::Waiting>,
    /// Times this delivery reached the wire too late for its send slot and went back to admission.
    pub slot_misses: u8,
    /// How often this delivery was refused with order_wait (its in-memory re-admission backs off).
    pub order_polls: u8,
    /// The sender's slot spacing (ms) in the admission that admitted it (0: unknown).
    pub slot_gap_ms: f64,
}

impl Work {
    pub(crate) fn scope(&self) -> Scope {
        Scope { waba_id: self.request.waba_id.clone(), phone_number_id: self.request.phone_number_id.clone() }
    }

    /// Admission class. Priority follows the message: a priority replay (`rh`) is priority traffic, and goes
    /// before the sender's live priority traffic fleet-wide (older first), as does a live one close to its
    /// deadline (`priority.rs`, rule 3); only a marketing replay (`rp`) takes the replay class (spare rate only).
    pub(crate) fn class(&self, live_priority_hold_max_ms: u64) -> TrafficClass {
        match self.lane {
            Lane::Replay => TrafficClass::Replay,
            Lane::PriorityReplay => TrafficClass::OlderPriority,
            _ if self.request.category().is_priority() => {
                let near =
                    crate::priority::near_deadline(self.request.deadline_unix_ms, now_ms(), live_priority_hold_max_ms);
                if near { TrafficClass::OlderPriority } else { TrafficClass::Priority }
            }
            _ => TrafficClass::Marketing,
        }
    }

    pub(crate) fn attempt(&self) -> u32 {
        self.ledger.entry.attempts + 1
    }
}

/// Outcome buffers are flushed to Redis at this size or age, so the breaker learns of failures quickly even
/// when a few calls in the batch hang.
const RECORD_FLUSH_ITEMS: usize = 32;
const RECORD_FLUSH_AGE: Duration = Duration::from_millis(20);

type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
type Sending = std::pin::Pin<Box<dyn std::future::Future<Output = Flown> + Send>>;

/// What became of an admitted message's send.
enum Flown {
    /// The request went to Meta: its answer (or transport failure), and whether it was a canary.
    Answered(Work, bool, MetaAnswer, Duration),
    /// It reached the wire more than `late_send_tolerance_ms` after its send slot (the process, the broker or
    /// the ledger stalled): it did not go, and goes back to admission for a new slot, so sends whose slots
    /// passed meanwhile never leave together as a burst Meta would refuse with 130429.
    Late(Work),
    /// Nothing left to do here (another delivery owns it, or it went back to the broker).
    Done,
}

/// How often one delivery may miss its send slot and go back to admission; past that it waits for the
/// sender's late allowance and then goes (a machine so slow that every slot is missed must still make
/// progress, and the allowance keeps even those from leaving together).
const MAX_SLOT_MISSES: u8 = 3;
/// Late sends of one sender the fleet may let go at once (`Worker::claim_late`, one bucket per sender in Redis).
/// This adds to the instant burst a sender can reach Meta with (1 + rate × `late_send_tolerance_ms` + this,
/// whatever the number of dispatchers: 7.7 at the defaults, under Meta's 10). 3 is what three dispatchers had
/// with one each: a fleet-wide 1 (refilled every 10 slots) cut the drill's throughput after the outage to a
/// third, because on a loaded machine most sends then run late (the ledger is busy with the DLQ) and each
/// refused one leaves its slot empty and takes a new one.
const LATE_BURST: f64 = 3.0;
/// Slot spacings per late send the allowance refills (10 / 3: three late sends per 10 slots, as three
/// dispatchers had). A late send uses its own missed slot, so over longer windows the wire stays at the rate.
const LATE_REFILL_SLOTS: f64 = 10.0 / 3.0;

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
                let this = self.clone();
                // Mark the message as "on the wire" in the ledger before its request leaves: a later delivery
                // that finds the mark knows this try's outcome is unknown and never resends.
                // The send slot admission handed out: the fleet's sends of this sender are spaced at its rate
                // right up to the wire, instead of bunching after a shared admission round.
                // A send that reaches the wire well after its slot goes back to admission instead, unless this
                // sender's small fleet-wide allowance for late sends lets it go (`Flown::Late`, `Worker::claim_late`).
                let slot = Duration::from_millis(wait_ms);
                let due = Instant::now() + slot;
                let tolerance = Duration::from_millis(self.cfg.late_send_tolerance_ms);
                let checks_lateness = self.cfg.late_send_tolerance_ms > 0;
                let late = move || checks_lateness && Instant::now().saturating_duration_since(due) > tolerance;
                f.sends.push(Box::pin(async move {
                    let mut w = w;
                    // The mark's write starts its usual latency ahead of the slot, so the request itself leaves
                    // at the slot (lateness then measures this process and the broker, not a normal write).
                    let lead = this.mark_lead.get();
                    if wait_ms > 0 {
                        tokio::time::sleep_until(due.checked_sub(lead).unwrap_or(due).into()).await;
                        w.waited += slot.saturating_sub(lead);
                    }
                    let mut excused = false;
                    if late() {
                        if w.slot_misses >= MAX_SLOT_MISSES {
                            this.wait_late_allowance(&w).await;
                        } else if !this.claim_late(&w).await {
                            w.slot_misses += 1;
                            return Flown::Late(w);
                        }
                        excused = true;
                    }
                    let marking = Instant::now();
                    let Some((w, canary)) = this.mark_in_flight(w, canary).await else { return Flown::Done };
                    this.mark_lead.observe(marking.elapsed());
                    // Marked early: the request waits for its slot (at most the lead).
                    tokio::time::sleep_until(due.into()).await;
                    // The mark's write can stall with the broker: look again right before the request leaves.
                    let w = if !excused && late() && !this.claim_late(&w).await {
                        // Back to admission for a new slot while misses remain; else, or when the mark could not
                        // be taken back (this delivery owns it), it sends, but only within the late allowance
                        // (after a broker stall many are in this state at once).
                        let w = if w.slot_misses < MAX_SLOT_MISSES {
                            match this.unmark(w).await {
                                Ok(mut w) => {
                                    w.slot_misses += 1;
                                    return Flown::Late(w);
                                }
                                Err(w) => w,
                            }
                        } else {
                            w
                        };
                        this.wait_late_allowance(&w).await;
                        w
                    } else {
                        w
                    };
                    this.send_marked(w, canary).await
                }));
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

    /// Sets the on-the-wire mark by compare-and-set. Only the delivery whose write set the mark may send: a
    /// delivery that finds another's mark (a second live copy of the operation: a replayed DLQ entry, a producer
    /// retry after the dedup window, a redelivery while the first is still mid-call) leaves without sending, to
    /// BW_UNKNOWN, where the other delivery's outcome or a status webhook settles the operation.
    async fn mark_in_flight(&self, mut w: Work, canary: bool) -> Option<(Work, bool)> {
        let now = now_ms();
        let token = self.delivery_token(&w);
        // A write whose answer is lost (broker failover) may still have landed: retry the same mark a few times
        // rather than give up; our own token on the entry means it did.
        let (ledger, op, expected, token_ref) = (&self.ledger, &w.request.operation_id, &w.ledger, &token);
        let result = retry_after_pauses(
            &[100, 300, 1_000],
            || async {},
            move || async move {
                ledger
                    .update_versioned(op, Some(expected.clone()), |cur| {
                        let e = cur?;
                        if e.state() != OperationState::Queued || e.in_flight_token == *token_ref {
                            return None;
                        }
                        if e.in_flight_since_unix_ms != 0 {
                            return None;
                        }
                        let mut e = e.clone();
                        e.in_flight_since_unix_ms = now;
                        e.in_flight_token = token_ref.clone();
                        Some(e)
                    })
                    .await
            },
        )
        .await;
        match result {
            Ok(Some(v)) if v.entry.state() == OperationState::Queued && v.entry.in_flight_token == token => {
                w.ledger = v;
                Some((w, canary))
            }
            Ok(Some(v)) if v.entry.state() == OperationState::Queued && v.entry.in_flight_since_unix_ms != 0 => {
                // Another live delivery holds the mark: it alone may send.
                self.metrics.mark_conflicts.inc();
                let err = ErrorInfo {
                    details: "another delivery of this operation is on the wire; this one did not send".into(),
                    at_unix_ms: v.entry.in_flight_since_unix_ms,
                    ..Default::default()
                };
                w.ledger = v;
                self.to_unknown(w, err).await;
                None
            }
            Ok(_) => {
                // Another delivery moved it meanwhile; this one has nothing left to do.
                self.settle(&w, Settle::ack(Outcome::AlreadyHandled), None).await;
                None
            }
            Err(e) => {
                tracing::warn!(parent: &w.span, error = %e, "ledger unavailable before sending; message will be redelivered");
                self.settle(&w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                None
            }
        }
    }

    /// Whether a late send of `w`'s sender may still go now, using the sender's late allowance, which every
    /// dispatcher process shares (`claim_late.lua`): at most [`LATE_BURST`] at once per sender, refilled by one per
    /// [`LATE_REFILL_SLOTS`] slot spacings. An isolated late send (a short hiccup) goes and fills the gap its
    /// missed slot left; after a stall, when every send whose slot passed meanwhile is late at once, the allowance
    /// runs out at once and the rest take new slots. So the whole fleet adds at most `LATE_BURST` sends of a sender
    /// above its slot schedule at once, however many dispatchers run, and at most 1 / `LATE_REFILL_SLOTS` of the
    /// sender's rate for a while; every message still went through admission once, so over longer windows the
    /// sender's rate stays the admitted one. While Redis does not answer, each process falls back to an allowance
    /// of its own (`claim_late_here`), so the bound grows by `LATE_BURST` per process for that time. Claims of
    /// one sender made while one is being asked go together in the next call (`late.rs`).
    async fn claim_late(&self, w: &Work) -> bool {
        if w.slot_gap_ms <= 0.0 {
            return false;
        }
        let refill_ms = w.slot_gap_ms * LATE_REFILL_SLOTS;
        let scope = w.scope();
        let ask = |wanted| self.breaker.claim_late_many(&scope, refill_ms, LATE_BURST, wanted);
        match self.late_claims.claim(&scope.index_member(), ask).await {
            Some(granted) => granted,
            None => self.claim_late_here(w, refill_ms),
        }
    }

    /// The late allowance of this process alone, used while Redis does not answer (the breaker then admits from
    /// its local fallback too): the same bucket, kept per sender in this process. Its clock is finer than a ms, so
    /// unlike `claim_late.lua` it needs no larger bucket for senders whose refill is under a ms.
    fn claim_late_here(&self, w: &Work, refill_ms: f64) -> bool {
        let now = Instant::now();
        let mut allowance = self.late_allowance.lock().unwrap_or_else(|p| p.into_inner());
        if allowance.len() > 100_000 {
            allowance.retain(|_, (_, at)| now.saturating_duration_since(*at) < Duration::from_secs(60));
        }
        let (tokens, at) = allowance.entry(w.request.phone_number_id.clone()).or_insert((LATE_BURST, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * 1000.0 / refill_ms).min(LATE_BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Waits until the late allowance of `w`'s sender lets one more late send go (it refills by one
    /// per [`LATE_REFILL_SLOTS`] slot spacings), for a delivery that may not go back to admission again.
    async fn wait_late_allowance(&self, w: &Work) {
        if w.slot_gap_ms <= 0.0 {
            return; // no slot schedule for this sender: nothing to keep apart
        }
        let step = Duration::from_secs_f64((w.slot_gap_ms * LATE_REFILL_SLOTS / 1000.0).min(1.0));
        while !self.claim_late(w).await {
            tokio::time::sleep(step).await;
        }
    }

    /// The request of a message that holds the on-the-wire mark goes to Meta.
    async fn send_marked(&self, w: Work, canary: bool) -> Flown {
        let span = tracing::info_span!(
            parent: &w.span,
            "meta.send",
            outcome = tracing::field::Empty,
            http_status = tracing::field::Empty,
            meta_code = tracing::field::Empty,
        );
        let (answer, took) = self.meta.send(&w.request).instrument(span.clone()).await;
        answer.record_on(&span);
        Flown::Answered(w, canary, answer, took)
    }

    /// Takes back this delivery's on-the-wire mark before any request left (its send slot was missed), keeping
    /// the ledger revision for the next mark. Err (with the message, mark still set) when the ledger refused
    /// or was unavailable: the caller then sends as marked.
    async fn unmark(&self, mut w: Work) -> Result<Work, Work> {
        let token = w.ledger.entry.in_flight_token.clone();
        let result = self
            .ledger
            .update_versioned(&w.request.operation_id, Some(w.ledger.clone()), |cur| {
                let e = cur?;
                if e.state() != OperationState::Queued || e.in_flight_token != token {
                    return None;
                }
                let mut e = e.clone();
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                Some(e)
            })
            .await;
        match result {
            Ok(Some(v)) if v.entry.state() == OperationState::Queued && v.entry.in_flight_token.is_empty() => {
                w.ledger = v;
                Ok(w)
            }
            Ok(_) => Err(w),
            Err(e) => {
                tracing::debug!(parent: &w.span, error = %e, "on-the-wire mark not taken back; sending late");
                Err(w)
            }
        }
    }

    /// Identifies this delivery of this message: instance, stream sequence, delivery count.
    fn delivery_token(&self, w: &Work) -> String {
        let (seq, delivered) = w.msg.info().map(|i| (i.stream_sequence, i.delivered)).unwrap_or((0, 0));
        format!("{}.{seq}.{delivered}", self.instance)
    }

    /// Decodes, checks the ledger and the deadline. Returns None when the message was already handled here.
    async fn prepare(&self, lane: Lane, msg: jetstream::Message) -> Option<Work> {
        let request = match SendRequest::decode(msg.payload.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                // Ingest validates everything it stores, so this is corruption or a foreign publisher. Keep the
                // bytes for inspection and stop redelivery.
                tracing::error!(subject = %msg.subject, error = %e, "undecodable message in BW_SEND; moved to BW_REJECTED");
                let settle = if self.reject_raw(&msg, &e.to_string()).await {
                    Settle::term(Outcome::Undecodable)
                } else {
                    Settle::nak(Outcome::MovePending, RETRY_LATER)
                };
                bw_common::disposition::apply(&msg, settle, &tracing::Span::current(), |l| self.metrics.result(l))
                    .await;
                return None;
            }
        };
        let span = tracing::info_span!(
            "dispatch",
            operation_id = %request.operation_id,
            phone_number_id = %request.phone_number_id,
            recipient = %bw_common::mask::phone(&request.recipient),
            lane = lane.token(),
            attempt = tracing::field::Empty,
            decision = tracing::field::Empty,
            breaker_state = tracing::field::Empty,
            result = tracing::field::Empty,
        );
        bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
        let versioned = match self.ledger.get(&request.operation_id).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                // Ingest stores the message before the ledger entry; a crash in between leaves this case.
                // Never ack a message whose ledger entry could not be created: it would be in no place at all.
                let _ = self.ledger.create(&bw_common::ledger::entry_for(&request, OperationState::Queued)).await;
                match self.ledger.get(&request.operation_id).await {
                    Ok(Some(v)) => v,
                    _ => {
                        let settle = Settle::nak(Outcome::MovePending, RETRY_LATER);
                        bw_common::disposition::apply(&msg, settle, &span, |l| self.metrics.result(l)).await;
                        return None;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(parent: &span, error = %e, "ledger unavailable; message will be redelivered");
                let settle = Settle::nak(Outcome::MovePending, RETRY_LATER);
                bw_common::disposition::apply(&msg, settle, &span, |l| self.metrics.result(l)).await;
                return None;
            }
        };
        // A copy older than the ledger's last replay (a redelivery of a delivery that already moved the
        // operation to the DLQ, which replay has since taken out again) is stale: the newer copy owns it. Acting
        // on it could dead-letter under the old copy's move id, which the stream deduplicates, leaving the
        // ledger at DLQ with no DLQ entry.
        let copy_replay = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(bw_common::names::REPLAY_HEADER))
            .and_then(|v| v.as_str().parse::<u32>().ok())
            .unwrap_or(0);
        if versioned.entry.state() != OperationState::Queued || copy_replay < versioned.entry.replays {
            // Already sent, or already moved elsewhere by an earlier delivery of this same message (a crash
            // between the move and the ack). Never send it again.
            span.in_scope(|| tracing::debug!(state = versioned.entry.state().label(), "already handled; acked"));
            bw_common::disposition::apply(&msg, Settle::ack(Outcome::AlreadyHandled), &span, |l| {
                self.metrics.result(l)
            })
            .await;
            return None;
        }
        span.record("attempt", versioned.entry.attempts + 1);
        let in_flight_since = versioned.entry.in_flight_since_unix_ms;
        let work = Work {
            lane,
            msg,
            request,
            ledger: versioned,
            span,
            received: Instant::now(),
            decision: "",
            decided_after: Duration::ZERO,
            waited: Duration::ZERO,
            order_wait: None,
            slot_misses: 0,
            order_polls: 0,
            slot_gap_ms: 0.0,
        };
        if in_flight_since > 0 {
            // An earlier delivery marked this message on the wire and never recorded an outcome (the instance
            // died, or lost the broker, mid-call). Meta may have it: reconcile, do not resend.
            let err = ErrorInfo {
                details: "an earlier try stopped mid-call; outcome unknown".into(),
                at_unix_ms: in_flight_since,
                ..Default::default()
            };
            // That earlier try is over (the ack wait outlasts a call): Meta has it or never will from it, so the
            // messages behind it may go. (Not on a mark conflict: there the other delivery is live.)
            self.release_order(&work).await;
            self.to_unknown(work, err).await;
            return None;
        }
        // Not sent from a number its tenant no longer holds (removed, moved to another tenant, another WABA).
        match self.registry.revoked(&work.request).await {
            Ok(None) => {}
            Ok(Some(refusal)) => {
                let detail = refusal.revoked_detail(&work.request.phone_number_id);
                tracing::warn!(parent: &work.span, reason = refusal.label(), "{detail}; quarantined");
                self.quarantine_unsent(work, QuarantineReason::SenderRevoked, detail).await;
                return None;
            }
            Err(e) => {
                tracing::warn!(parent: &work.span, error = %e, "sender registry unavailable; redelivered");
                self.settle(&work, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                return None;
            }
        }
        if work.request.deadline_unix_ms > 0 && now_ms() > work.request.deadline_unix_ms {
            self.expire(work, crate::priority::expiry_reason(None)).await;
            return None;
        }
        // A new attempt after an asynchronous failure is first routed as that failure (attempt.rs); an ordinary
        // send, that new attempt's included, then passes the gates.
        let work = self.reenter(work).await?;
        self.gate(work).await
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
        let subject = bw_common::names::outcome_subject(&w.request.phone_number_id);
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

/// Runs `attempt` until it succeeds: once at once, then again after each of `pauses_ms`, running `before_retry`
/// after each pause. Returns the last result.
pub(crate) async fn retry_after_pauses<T, E, A, AF, B, BF>(
    pauses_ms: &[u64],
    mut before_retry: B,
    mut attempt: A,
) -> Result<T, E>
where
    A: FnMut() -> AF,
    AF: std::future::Future<Output = Result<T, E>>,
    B: FnMut() -> BF,
    BF: std::future::Future<Output = ()>,
{
    let mut result = attempt().await;
    for &pause_ms in pauses_ms {
        if result.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        before_retry().await;
        result = attempt().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::retry_after_pauses;
    use std::cell::Cell;

    #[tokio::test(start_paused = true)]
    async fn retries_after_each_pause_until_success() {
        let (tries, hooks) = (Cell::new(0u32), Cell::new(0u32));
        let started = tokio::time::Instant::now();
        let result: Result<u32, ()> = retry_after_pauses(
            &[100, 300, 1_000],
            || async { hooks.set(hooks.get() + 1) },
            || async {
                tries.set(tries.get() + 1);
                if tries.get() == 3 { Ok(tries.get()) } else { Err(()) }
            },
        )
        .await;
        assert_eq!(result, Ok(3));
        assert_eq!(hooks.get(), 2, "the hook runs before each retry only");
        assert_eq!(started.elapsed().as_millis(), 400, "paused 100 then 300 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn gives_the_last_error_after_the_last_pause() {
        let tries = Cell::new(0u32);
        let result: Result<(), u32> = retry_after_pauses(
            &[10, 20],
            || async {},
            || async {
                tries.set(tries.get() + 1);
                Err(tries.get())
            },
        )
        .await;
        assert_eq!(result, Err(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_success_needs_no_pause() {
        let started = tokio::time::Instant::now();
        let result: Result<(), ()> = retry_after_pauses(&[1_000], || async {}, || async { Ok(()) }).await;
        assert_eq!(result, Ok(()));
        assert_eq!(started.elapsed().as_millis(), 0);
    }
}
