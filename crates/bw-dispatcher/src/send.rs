//! The send of an admitted message: it waits for its send slot, takes the on-the-wire mark by compare-and-set
//! (or, in journal mode, is named in its partition's wire journal), and POSTs to Meta; a send that reaches the
//! wire well after its slot goes back to admission (`Flown::Late`) unless the sender's small fleet-wide late
//! allowance lets it go.

use crate::backoff::{RETRY_LATER, retry_after_pauses};
use crate::meta::MetaAnswer;
use crate::settle::Outcome;
use crate::worker::{Work, Worker};
use bw_common::disposition::Settle;
use bw_common::time::now_ms;
use bw_proto::v1::{ErrorInfo, OperationState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

pub(crate) type Sending = std::pin::Pin<Box<dyn std::future::Future<Output = Flown> + Send>>;

/// What became of an admitted message's send.
pub(crate) enum Flown {
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

impl Worker {
    /// The mark and send of an admitted message, at its send slot `wait_ms` from now.
    pub(crate) fn send_at_slot(self: &Arc<Self>, w: Work, canary: bool, wait_ms: u64) -> Sending {
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
        Box::pin(async move {
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
            let on_wire = if this.journals.is_some() {
                this.journal_in_flight(w, canary).await
            } else {
                this.mark_in_flight(w, canary).await
            };
            let Some((w, canary)) = on_wire else { return Flown::Done };
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
        })
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
                tracing::warn!(parent: &w.span, error = %e, "ledger unavailable before sending; message will be \
                    redelivered");
                self.settle(&w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                None
            }
        }
    }

    /// Journal mode's counterpart of [`Self::mark_in_flight`]: the send is named in its partition's journal (one
    /// record per group, `journal.rs`) before it may go. A second copy of an operation with an attempt under way
    /// here waits for its redelivery, when the ledger says how the first ended; one whose attempt an earlier
    /// owner left without an outcome goes to BW_UNKNOWN; and a partition this dispatcher does not own (any more)
    /// sends nothing: the delivery goes back for its owner.
    async fn journal_in_flight(&self, mut w: Work, canary: bool) -> Option<(Work, bool)> {
        use crate::journal::Refusal;
        let Some(part) = self.journal_of(&w.request.phone_number_id).cloned() else {
            self.settle(&w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
            return None;
        };
        match part.append(&w.request.operation_id, w.attempt(), w.ledger.revision).await {
            Ok(on_wire) => {
                w.on_wire = Some(on_wire);
                crate::journal::crash_point("after_journal");
                Some((w, canary))
            }
            Err(Refusal::Abandoned) => {
                w.on_wire = part.take_abandoned(&w.request.operation_id);
                self.to_unknown(w, crate::journal::abandoned_error()).await;
                None
            }
            Err(refusal @ (Refusal::Live | Refusal::NotOwner)) => {
                if refusal == Refusal::Live {
                    self.metrics.mark_conflicts.inc();
                }
                self.settle(&w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                None
            }
        }
    }

    /// The wire journal of the send partition of number `phone_number_id`, in journal mode when this dispatcher
    /// serves it.
    pub(crate) fn journal_of(&self, phone_number_id: &str) -> Option<&Arc<crate::journal::PartJournal>> {
        self.journals.as_ref()?.part(self.send.of(phone_number_id))
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
        crate::journal::crash_point("after_post");
        answer.record_on(&span);
        Flown::Answered(w, canary, answer, took)
    }

    /// Takes back this delivery's on-the-wire mark before any request left (its send slot was missed), keeping
    /// the ledger revision for the next mark. Err (with the message, mark still set) when the ledger refused
    /// or was unavailable: the caller then sends as marked.
    async fn unmark(&self, mut w: Work) -> Result<Work, Work> {
        // Journal mode: nothing left; the journaled attempt is settled unsent (the next admission journals anew).
        if let Some(on_wire) = w.on_wire.take() {
            on_wire.resolve();
            return Ok(w);
        }
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
}
