//! Moving a message to its next place. Order for every move: publish to the destination durably (with a
//! message id, so a redelivered source does not publish twice), then update the ledger, then ack the source.
//! A crash anywhere in between is healed by redelivery: the ledger check in `prepare` acks what was moved.
//!
//! Every move returns a [`Settle`] (what to tell the broker, and the typed [`Outcome`]); [`Worker::settle`] is
//! the one function that applies it: the acknowledgement, the span's `result` field, the result metric and
//! the outcome event.

use crate::backoff::{RETRY_LATER, decorrelated_jitter, retry_after_pauses};
use crate::worker::{Work, Worker};
use bw_common::disposition::{Label, Settle};
use bw_common::ledger::WamidLink;
use bw_common::moves::{Destination, publish_then_record};
use bw_common::time::now_ms;
use bw_proto::v1::{
    Attempt, DlqEnvelope, DlqReason, ErrorInfo, LedgerEntry, OperationState, QuarantineEntry, QuarantineReason,
    SendRequest, Signal, UnknownOutcome,
};
use bw_wire::names;
use prost::Message as _;
use std::time::Duration;

/// Each process raises the `dlq_limit` signal at most this often per sender.
const DLQ_LIMIT_SIGNAL_EVERY: Duration = Duration::from_secs(10);

/// The ledger reason of a message Meta accepted and holds for its template's quality assessment (template pacing,
/// `message_status: held_for_quality_assessment`, meta-cloud-api.md §3.5): not failed and never resent; Meta
/// releases it (sent, delivered follow) or drops it (failed 132015, when the template is paused: then a new
/// attempt waits in the template's quarantine scope).
pub(crate) const HELD_FOR_QUALITY_REASON: &str = "held_for_quality_assessment: Meta holds it while the template's \
     quality is assessed (pacing); not failed, never resent; a status webhook moves it on";

/// What one delivery of a message ended in (metric label `result`, span field `result`, outcome event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Sent,
    /// Accepted by Meta, but the ledger stayed unavailable: left unacknowledged for redelivery, whose
    /// on-the-wire mark sends it to reconciliation.
    SentUnrecorded,
    Retry,
    RateLimited,
    /// Refused by admission for now and given back to the broker for its slot.
    Held,
    /// A marketing message held back (delayed redelivery, ledger unchanged) while its sender has priority
    /// messages waiting in the DLQ or the priority replay lane.
    PriorityFirst,
    /// Held by its portfolio's messaging-limit budget (delayed redelivery, `budget.rs`).
    BudgetHeld,
    Dlq,
    Quarantined,
    Unknown,
    Expired,
    /// Ended FAILED without a call (a gate: marketing to an undeliverable country or a suppressed recipient).
    Failed,
    /// Already sent or moved by an earlier delivery (or owned by another live one): nothing to do.
    AlreadyHandled,
    Undecodable,
    /// A move or ledger write failed; redelivered shortly.
    MovePending,
}

impl Label for Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Sent => "sent",
            Outcome::SentUnrecorded => "sent_unrecorded",
            Outcome::Retry => "retry",
            Outcome::RateLimited => "rate_limited",
            Outcome::Held => "held",
            Outcome::PriorityFirst => "priority_first",
            Outcome::BudgetHeld => "budget_held",
            Outcome::Dlq => "dlq",
            Outcome::Quarantined => "quarantined",
            Outcome::Unknown => "unknown",
            Outcome::Expired => "expired",
            Outcome::Failed => "failed",
            Outcome::AlreadyHandled => "already_handled",
            Outcome::Undecodable => "undecodable",
            Outcome::MovePending => "move_pending",
        }
    }
}

/// What the outcome event of a settled delivery carries.
pub(crate) struct Event<'a> {
    pub err: &'a ErrorInfo,
    pub wamid: &'a str,
    pub latency_us: u64,
}

/// Ack with `outcome` when the ledger write went through, else redeliver shortly.
fn done_if(ok: bool, outcome: Outcome) -> Settle<Outcome> {
    if ok { Settle::ack(outcome) } else { Settle::nak(Outcome::MovePending, RETRY_LATER) }
}

impl Worker {
    /// Applies a delivery's decision: acknowledgement, span field, result metric, and (when given) the outcome
    /// event. The only place the dispatcher settles a message it has a [`Work`] for.
    pub(crate) async fn settle(&self, w: &Work, settle: Settle<Outcome>, event: Option<Event<'_>>) {
        // Journal mode: every settle but a pending move follows a durable outcome (or a try that created
        // nothing), so the journaled attempt is settled; a pending move leaves it open, and abandoned.
        if settle.result != Outcome::MovePending
            && let Some(on_wire) = &w.on_wire
        {
            on_wire.resolve();
        }
        if let Some(e) = event
            && settle.result != Outcome::MovePending
        {
            self.outcome(w, settle.result.label(), e.err, e.wamid, e.latency_us);
        }
        bw_common::disposition::apply(&w.msg, settle, &w.span, |label| self.metrics.result(label)).await;
    }

    fn attempt_record(&self, w: &Work, err: &ErrorInfo) -> Attempt {
        Attempt {
            number: w.attempt(),
            at_unix_ms: now_ms(),
            via: if w.lane.is_replay() { "replay".into() } else { "dispatcher".into() },
            meta_code: err.meta_code,
            http_status: err.http_status,
            detail: err.details.chars().take(200).collect(),
        }
    }

    fn headers(&self, w: &Work, msg_id: &str) -> async_nats::HeaderMap {
        let mut h = names::msg_id_headers(msg_id);
        bw_wire::trace::inject(&w.span, &mut h);
        h
    }

    /// A stable id for "this delivery of this message moved to X": the source stream sequence is unique per
    /// enqueue, so a redelivery after a crash maps to the same id and JetStream drops the copy.
    fn move_id(&self, w: &Work, dest: &str) -> String {
        let seq = w.msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        names::move_msg_id(&w.request.operation_id, dest, seq)
    }

    pub(crate) async fn update_ledger(
        &self,
        w: &Work,
        f: impl FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    ) -> bool {
        match self.ledger.update_from(&w.request.operation_id, Some(w.ledger.clone()), f).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(parent: &w.span, error = %e, "ledger update failed; message will be redelivered");
                false
            }
        }
    }

    /// Where a move of `w` to `dest` (dlq, quarantine, unknown) publishes, with its deterministic message id.
    fn destination(&self, w: &Work, dest: &str, subject: String, payload: bytes::Bytes) -> Destination {
        Destination { subject, headers: self.headers(w, &self.move_id(w, dest)), payload }
    }

    /// Moves `w` to `dest` through the shared routine (publish → ledger → ack) and settles it: acked with
    /// `outcome` once both steps landed, else redelivered shortly (the move is idempotent).
    async fn move_to(
        &self,
        w: &Work,
        destination: Destination,
        outcome: Outcome,
        event: Event<'_>,
        update: impl FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
    ) {
        let dest = destination.subject.clone();
        let op = &w.request.operation_id;
        match publish_then_record(&self.js, &self.ledger, op, Some(w.ledger.clone()), destination, update).await {
            Ok(_) => self.settle(w, Settle::ack(outcome), Some(event)).await,
            Err(e) => {
                if let bw_common::moves::MoveError::Publish(p) = &e
                    && p.stream_full()
                    && outcome == Outcome::Dlq
                {
                    self.dlq_limit(w).await;
                }
                tracing::warn!(parent: &w.span, dest = %dest, error = %e, "move not completed; message will be \
                    redelivered");
                self.settle(w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
            }
        }
    }

    /// Holds `w` for `delay` without keeping it in its lane consumer's pending set (the budget gate: a flash sale
    /// past its portfolio's messaging limit must not stop the lane's other messages). A delivery from a lane is
    /// parked: a copy of the same request, with its replay number, goes to the sender's held subject in the same
    /// BW_SEND partition (deterministic message id, so a redelivery after a crash publishes nothing new), then
    /// this delivery is acked; the held consumer delivers the copy, which passes every check again. A delivery
    /// from the held consumer, or one whose copy could not be published, is redelivered after `delay`. Either
    /// way it stays QUEUED in the ledger and in BW_SEND, and the on-the-wire mark keeps any second copy unsent.
    pub(crate) async fn hold_out_of_lane(&self, w: &Work, outcome: Outcome, delay: Duration, event: Option<Event<'_>>) {
        if names::SendPartitions::held_lane(&w.msg.subject).is_none() {
            let subject = self.send.held_subject(w.lane, &w.request.phone_number_id);
            let mut headers = self.headers(w, &self.move_id(w, "held"));
            if let Some(replay) = w.msg.headers.as_ref().and_then(|h| h.get(names::REPLAY_HEADER)) {
                headers.insert(names::REPLAY_HEADER, replay.clone());
            }
            match bw_common::nats::publish_durable(&self.js, subject, headers, w.msg.payload.clone()).await {
                Ok(_) => return self.settle(w, Settle::ack(outcome), event).await,
                Err(e) => tracing::warn!(parent: &w.span, error = %e, "held message not parked; back to its lane"),
            }
        }
        self.settle(w, Settle::nak(outcome, delay), event).await;
    }

    /// Meta refused for now (rate limit): clear the on-the-wire mark and redeliver after `delay`.
    pub(crate) async fn held_back(&self, w: Work, delay: Duration, err: ErrorInfo) {
        let ok = self
            .update_ledger(&w, |cur| {
                let mut e = cur.cloned().unwrap_or_default();
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                Some(e)
            })
            .await;
        let settle = Settle::nak(Outcome::RateLimited, if ok { delay } else { RETRY_LATER });
        self.settle(&w, settle, Some(Event { err: &err, wamid: "", latency_us: 0 })).await;
    }

    pub(crate) async fn sent(&self, w: Work, wamid: String, held: bool, took: Duration) {
        // Meta has the message: the ledger must say so before the ack. A short outage of the broker is ridden
        // out here; past it the message stays unacknowledged and its redelivery finds the on-the-wire mark,
        // so it is reconciled through status webhooks instead of being sent again.
        // The wamid link (unless `dispatch.wamid_link` is off) is written alongside the outcome, not after it:
        // one write's latency less per message (the pipeline bench's sends wait on it), and a link that lands
        // while the outcome does not is what a status webhook without `biz_opaque_callback_data` needs to settle
        // the operation (it moves forward from QUEUED, and a redelivery then finds it handled). It is written once
        // per accepted answer either way.
        let (this, work, id) = (self, &w, wamid.as_str());
        let record = retry_after_pauses(
            &[200, 500, 1_000, 2_000],
            move || async move {
                bw_common::disposition::progress(&work.msg).await;
            },
            move || async move { if this.try_sent(work, id, held).await { Ok(()) } else { Err(()) } },
        );
        let link = async {
            // The link keeps this attempt's request: a retriable `failed` status re-queues it (attempt.rs).
            if self.cfg.wamid_link { self.ledger.link_attempt(&wamid, &link_of(&w)).await } else { Ok(()) }
        };
        let (recorded, linked) = tokio::join!(record, link);
        if let Err(e) = linked {
            // Statuses carry biz_opaque_callback_data, so the link is only a fallback.
            tracing::debug!(parent: &w.span, error = %e, "wamid link not stored");
        }
        if recorded.is_ok() {
            crate::journal::crash_point("after_outcome");
            let event = Event { err: &ErrorInfo::default(), wamid: &wamid, latency_us: took.as_micros() as u64 };
            self.settle(&w, Settle::ack(Outcome::Sent), Some(event)).await;
            return;
        }
        w.span.record("result", Outcome::SentUnrecorded.label());
        self.metrics.result(Outcome::SentUnrecorded.label());
        tracing::warn!(parent: &w.span, "Meta accepted the message but the ledger stayed unavailable; left for \
            redelivery and reconciliation");
    }

    /// Records Meta's acceptance: SENT, or HELD when Meta holds it for the template's quality assessment (a
    /// state of its own: not failed, never resent; its status webhooks move it on, `asyncfail` re-queues a drop).
    async fn try_sent(&self, w: &Work, wamid: &str, held: bool) -> bool {
        self.update_ledger(w, |cur| {
            let mut e = cur.cloned().unwrap_or_default();
            e.set_state(if held { OperationState::Held } else { OperationState::Sent });
            e.in_flight_since_unix_ms = 0;
            e.in_flight_token.clear();
            e.wamid = wamid.to_string();
            e.attempts += 1;
            e.reason.clear();
            if held {
                e.reason = HELD_FOR_QUALITY_REASON.to_string();
            }
            e.transient_failures = 0;
            e.first_failure_at_unix_ms = 0;
            Some(e)
        })
        .await
    }

    /// The ledger's retry state of this delivery, for [`crate::route::after_answer`]; draws the next jitter.
    pub(crate) fn tries(&self, w: &Work) -> crate::route::Tries {
        let entry = &w.ledger.entry;
        let since =
            if entry.first_failure_at_unix_ms > 0 { (now_ms() - entry.first_failure_at_unix_ms).max(0) } else { 0 };
        let previous =
            if entry.last_retry_delay_ms > 0 { entry.last_retry_delay_ms as u64 } else { self.cfg.retry_base_ms };
        crate::route::Tries {
            lane: w.lane,
            failures: entry.transient_failures,
            since_first_failure_ms: since as u64,
            jitter_ms: decorrelated_jitter(self.cfg.retry_base_ms, self.cfg.retry_cap_ms, previous),
        }
    }

    /// Transient failure that created nothing: a delayed redelivery after `delay_ms`, counted in the ledger's
    /// retry state.
    pub(crate) async fn retry(&self, w: Work, err: ErrorInfo, delay_ms: u64) {
        let now = now_ms();
        let entry = &w.ledger.entry;
        let failures = entry.transient_failures + 1;
        let first = if entry.first_failure_at_unix_ms > 0 { entry.first_failure_at_unix_ms } else { now };
        let code = err.meta_code;
        let ok = self
            .update_ledger(&w, |cur| {
                let mut e = cur.cloned().unwrap_or_default();
                e.attempts += 1;
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                e.transient_failures = failures;
                e.first_failure_at_unix_ms = first;
                e.last_retry_delay_ms = delay_ms as i64;
                e.last_code = code;
                e.reason = "transient error; retrying".into();
                Some(e)
            })
            .await;
        let settle = Settle::nak(Outcome::Retry, if ok { Duration::from_millis(delay_ms) } else { RETRY_LATER });
        self.settle(&w, settle, Some(Event { err: &err, wamid: "", latency_us: 0 })).await;
    }

    /// The DLQ after a failed try or a refusal: `not_before_ms` from now (a limit's wait), or for a replayed
    /// message the next step of replay's jitter schedule.
    pub(crate) async fn dead_letter(
        &self,
        w: Work,
        reason: DlqReason,
        incident: &str,
        err: ErrorInfo,
        not_before_ms: u64,
    ) {
        let mut w = w;
        if reason == DlqReason::RecipientDeferred && w.request.keeps_order {
            // A marketing message cooling off (131049) for a day must not hold later messages to the recipient
            // (an order confirmation): it leaves the order chain, and its replay is not gated by it.
            self.release_order(&w).await;
            w.request.keeps_order = false;
        }
        let now = now_ms();
        let entry = &w.ledger.entry;
        let (not_before, previous) = if not_before_ms > 0 {
            (now + not_before_ms as i64, 0)
        } else if w.lane.is_replay() && reason != DlqReason::BreakerOpen {
            let d = bw_common::jitter::next_replay_delay(
                entry.replays,
                entry.last_retry_delay_ms.max(0) as u64,
                &mut rand::rng(),
            );
            (now + d as i64, d as i64)
        } else {
            (0, 0)
        };
        let incident = match incident {
            "" => self.open_incident(&w).await,
            known => known.to_string(),
        };
        self.to_dlq(w, reason, &incident, err, not_before, previous).await;
    }

    /// The incident of the scope when it is not CLOSED right now (one Redis read, only for DLQ moves whose
    /// refusal did not name one: retries exhausted, a long pause after an answer). Every DLQ entry written while
    /// a scope is OPEN so carries its incident, and replays with it. Empty when CLOSED or Redis is unreachable.
    async fn open_incident(&self, w: &Work) -> String {
        use bw_proto::v1::BreakerState;
        match self.breaker.snapshot(&w.scope()).await {
            Ok(s) if !matches!(s.state(), BreakerState::Closed | BreakerState::Unspecified) => s.incident_id,
            Ok(_) => String::new(),
            Err(e) => {
                tracing::debug!(parent: &w.span, error = %e, "scope state unavailable; dlq entry without incident");
                String::new()
            }
        }
    }

    pub(crate) async fn to_dlq(
        &self,
        w: Work,
        reason: DlqReason,
        incident: &str,
        err: ErrorInfo,
        not_before_unix_ms: i64,
        previous_delay_ms: i64,
    ) {
        let mut request = w.request.clone();
        request.attempts.push(self.attempt_record(&w, &err));
        let first_error =
            request.attempts.iter().find(|a| a.meta_code != 0 || a.http_status != 0 || !a.detail.is_empty()).map(|a| {
                ErrorInfo {
                    meta_code: a.meta_code,
                    http_status: a.http_status,
                    details: a.detail.clone(),
                    at_unix_ms: a.at_unix_ms,
                    ..Default::default()
                }
            });
        let envelope = DlqEnvelope {
            request: Some(request),
            reason: reason as i32,
            first_error: first_error.or_else(|| Some(err.clone())),
            last_error: Some(err.clone()),
            incident_id: incident.to_string(),
            dead_lettered_at_unix_ms: now_ms(),
            replay_attempts: w.ledger.entry.replays,
            not_before_unix_ms,
            previous_delay_ms,
        };
        let counts_attempt = reason != DlqReason::BreakerOpen;
        let subject = self.send.dlq_subject(w.request.category(), &w.request.phone_number_id);
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.move_to(
            &w,
            self.destination(&w, "dlq", subject, envelope.encode_to_vec().into()),
            Outcome::Dlq,
            event,
            |cur| {
                if !still_ours(cur, &w) {
                    return None;
                }
                let mut e = cur.cloned().unwrap_or_default();
                e.set_state(OperationState::Dlq);
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                if counts_attempt {
                    e.attempts += 1;
                }
                e.incident_id = incident.to_string();
                e.last_code = err.meta_code;
                e.reason = format!("dlq: {}", reason.label());
                e.transient_failures = 0;
                e.first_failure_at_unix_ms = 0;
                // For a replayed message this is the replay back-off, the "previous" of the next jitter draw.
                e.last_retry_delay_ms = previous_delay_ms;
                Some(e)
            },
        )
        .await;
    }

    pub(crate) async fn to_quarantine(&self, w: Work, reason: QuarantineReason, err: ErrorInfo) {
        let detail = format!("meta code {}: {}", err.meta_code, err.details);
        let ledger_reason = format!("permanent error {}", err.meta_code);
        self.to_quarantine_with(w, reason, err, String::new(), detail, ledger_reason).await;
    }

    /// Quarantines `w` after Meta's answer under a quarantine scope (`gates.rs`): `detail` (naming the scope)
    /// is the entry's detail and the ledger's reason, which the producer's feed shows.
    pub(crate) async fn to_quarantine_scoped(
        &self,
        w: Work,
        reason: QuarantineReason,
        err: ErrorInfo,
        scope_key: String,
        detail: String,
    ) {
        self.to_quarantine_with(w, reason, err, scope_key, detail.clone(), detail).await;
    }

    async fn to_quarantine_with(
        &self,
        w: Work,
        reason: QuarantineReason,
        err: ErrorInfo,
        scope_key: String,
        detail: String,
        ledger_reason: String,
    ) {
        let mut request = w.request.clone();
        request.attempts.push(self.attempt_record(&w, &err));
        let entry = QuarantineEntry {
            request: Some(request),
            reason: reason as i32,
            error: Some(err.clone()),
            detail,
            quarantined_at_unix_ms: now_ms(),
            incident_id: String::new(),
            scope_key,
        };
        let subject = names::quarantine_subject(&w.request.phone_number_id);
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.move_to(
            &w,
            self.destination(&w, "quarantine", subject, entry.encode_to_vec().into()),
            Outcome::Quarantined,
            event,
            |cur| {
                if !still_ours(cur, &w) {
                    return None;
                }
                let mut e = cur.cloned().unwrap_or_default();
                e.set_state(OperationState::Quarantined);
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                e.attempts += 1;
                e.last_code = err.meta_code;
                e.reason = ledger_reason.clone();
                Some(e)
            },
        )
        .await;
    }

    /// Quarantines a message that was never sent (no attempt is counted): `detail` says why, in the entry and as
    /// the ledger's reason, which the producer's feed shows. It ended here, so its recipient's order goes on.
    pub(crate) async fn quarantine_unsent(&self, w: Work, reason: QuarantineReason, detail: String) {
        self.quarantine_unsent_scoped(w, reason, detail, String::new()).await;
    }

    /// [`Worker::quarantine_unsent`] under a quarantine scope (a held template, `gates.rs`).
    pub(crate) async fn quarantine_unsent_scoped(
        &self,
        w: Work,
        reason: QuarantineReason,
        detail: String,
        scope_key: String,
    ) {
        self.release_order(&w).await;
        let now = now_ms();
        let err = ErrorInfo { details: detail.clone(), at_unix_ms: now, ..Default::default() };
        let entry = QuarantineEntry {
            request: Some(w.request.clone()),
            reason: reason as i32,
            error: Some(err.clone()),
            detail: detail.clone(),
            quarantined_at_unix_ms: now,
            incident_id: String::new(),
            scope_key,
        };
        let subject = names::quarantine_subject(&w.request.phone_number_id);
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.move_to(
            &w,
            self.destination(&w, "quarantine", subject, entry.encode_to_vec().into()),
            Outcome::Quarantined,
            event,
            |cur| {
                if !still_ours(cur, &w) {
                    return None;
                }
                let mut e = cur.cloned().unwrap_or_default();
                e.set_state(OperationState::Quarantined);
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                e.reason = detail.clone();
                Some(e)
            },
        )
        .await;
    }

    /// The request may have reached Meta: never resend blindly; wait for a status webhook.
    pub(crate) async fn to_unknown(&self, w: Work, err: ErrorInfo) {
        let mut request = w.request.clone();
        request.attempts.push(self.attempt_record(&w, &err));
        let now = now_ms();
        let entry = UnknownOutcome {
            request: Some(request),
            error: Some(err.clone()),
            sent_at_unix_ms: now,
            review_at_unix_ms: now + self.cfg.unknown_review_ms as i64,
        };
        let subject = names::unknown_subject(&w.request.phone_number_id);
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.move_to(
            &w,
            self.destination(&w, "unknown", subject, entry.encode_to_vec().into()),
            Outcome::Unknown,
            event,
            |cur| {
                let mut e = cur.cloned().unwrap_or_default();
                // A status webhook may have proven the send already; keep that state, but remember the
                // outcome was once unknown (a duplicate at Meta cannot be ruled out for it).
                if !e.state().is_accepted_by_meta() {
                    e.set_state(OperationState::Unknown);
                }
                e.attempts += 1;
                e.in_flight_since_unix_ms = 0;
                e.in_flight_token.clear();
                e.flagged_unknown = true;
                e.reason = "outcome unknown; waiting for a status webhook".into();
                Some(e)
            },
        )
        .await;
    }

    /// Ends the operation FAILED with `reason` without a call (a gate refused it for good, `gates.rs`). It ended
    /// here, so its recipient's order goes on.
    pub(crate) async fn fail_unsent(&self, w: Work, reason: String) {
        self.release_order(&w).await;
        let ok = self
            .update_ledger(&w, |cur| {
                if !still_ours(cur, &w) {
                    return None;
                }
                let mut e = cur.cloned().unwrap_or_default();
                e.set_state(OperationState::Failed);
                e.reason = reason.clone();
                Some(e)
            })
            .await;
        let err = ErrorInfo { details: reason.clone(), at_unix_ms: now_ms(), ..Default::default() };
        let event = Event { err: &err, wamid: "", latency_us: 0 };
        self.settle(&w, done_if(ok, Outcome::Failed), Some(event)).await;
    }

    /// Ends the operation EXPIRED with `reason` (it cannot make its deadline; nothing was sent).
    pub(crate) async fn expire(&self, w: Work, reason: String) {
        // It ended for good: the messages waiting behind it in its recipient's order go on.
        self.release_order(&w).await;
        let ok = self
            .update_ledger(&w, |cur| {
                let mut e = cur.cloned().unwrap_or_default();
                e.set_state(OperationState::Expired);
                e.reason = reason.clone();
                Some(e)
            })
            .await;
        let event = Event { err: &ErrorInfo::default(), wamid: "", latency_us: 0 };
        self.settle(&w, done_if(ok, Outcome::Expired), Some(event)).await;
    }

    /// BW_DLQ refused an entry of this sender because it is full: the message stays in BW_SEND (redelivered,
    /// nothing lost) and the `dlq_limit` signal tells the on-call person (alert `dlq_limit`, runbook
    /// dlq-growing). Raised at most once per sender per [`DLQ_LIMIT_SIGNAL_EVERY`] by each process; alerting
    /// deduplicates the rest.
    async fn dlq_limit(&self, w: &Work) {
        let now = std::time::Instant::now();
        let due = {
            let mut last = self.dlq_limit_signalled.lock().unwrap_or_else(|p| p.into_inner());
            let phone = &w.request.phone_number_id;
            match last.get(phone) {
                Some(at) if now.duration_since(*at) < DLQ_LIMIT_SIGNAL_EVERY => false,
                _ => {
                    last.insert(phone.clone(), now);
                    true
                }
            }
        };
        if due {
            let stream = self.send.dlq_stream_of(&w.request.phone_number_id);
            tracing::error!(parent: &w.span, stream = %stream, "the DLQ is full: dead-letter moves are refused and the \
                messages stay queued");
            let err = ErrorInfo {
                details: format!("{stream} refused a dead-letter entry: the stream is at its limit"),
                ..Default::default()
            };
            self.signal("dlq_limit", w, &err).await;
        }
    }

    pub(crate) async fn signal(&self, kind: &str, w: &Work, err: &ErrorInfo) {
        let signal = Signal {
            kind: kind.to_string(),
            waba_id: w.request.waba_id.clone(),
            phone_number_id: w.request.phone_number_id.clone(),
            meta_code: err.meta_code,
            detail: err.details.chars().take(200).collect(),
            at_unix_ms: now_ms(),
            operation_id: w.request.operation_id.clone(),
        };
        let _ = self.nats.publish(names::signal_subject(kind), signal.encode_to_vec().into()).await;
    }

    /// Keeps undecodable bytes in BW_REJECTED; true when stored.
    pub(crate) async fn reject_raw(&self, msg: &async_nats::jetstream::Message, error: &str) -> bool {
        let rejected = bw_proto::v1::RejectedRequest {
            raw: msg.payload.to_vec(),
            source: msg.subject.to_string(),
            reason: bw_proto::v1::RejectReason::Undecodable as i32,
            error: error.to_string(),
            at_unix_ms: now_ms(),
            raw_size: msg.payload.len() as u64,
        };
        bw_common::nats::publish_durable(
            &self.js,
            names::rejected_subject("dispatcher"),
            async_nats::HeaderMap::new(),
            rejected.encode_to_vec().into(),
        )
        .await
        .is_ok()
    }
}

/// The wamid link of an accepted send: its operation, its attempt and its request (without the carried async
/// error, which belonged to the attempt before).
pub(crate) fn link_of(w: &Work) -> WamidLink {
    WamidLink {
        operation_id: w.request.operation_id.clone(),
        attempt: w.attempt(),
        request: without_async_error(&w.request).encode_to_vec(),
    }
}

/// `request` without the fields of an earlier attempt's asynchronous failure.
pub(crate) fn without_async_error(request: &SendRequest) -> SendRequest {
    SendRequest {
        async_error_code: 0,
        async_error_subcode: 0,
        async_error_title: String::new(),
        async_failed_wamid: String::new(),
        async_failed_attempt: 0,
        ..request.clone()
    }
}

/// True while the ledger entry is still the one this delivery works from: QUEUED and not replayed since it was
/// read (no entry at all counts too, as before). Otherwise another copy owns the operation — the replayed one, or
/// a concurrent delivery of this one that already moved it — and a move by this copy must not overwrite that
/// place: its publish may even have been dropped as a duplicate of an earlier move whose entry replay has since
/// taken out, and writing "DLQ" then would name a place that holds nothing (an operation lost).
fn still_ours(cur: Option<&LedgerEntry>, w: &Work) -> bool {
    still_queued_since(cur, w.ledger.entry.replays)
}

fn still_queued_since(cur: Option<&LedgerEntry>, replays_read: u32) -> bool {
    cur.is_none_or(|c| c.state() == OperationState::Queued && c.replays == replays_read)
}

#[cfg(test)]
mod tests {
    use super::still_queued_since;
    use bw_proto::v1::{LedgerEntry, OperationState};

    #[test]
    fn a_move_by_a_copy_the_ledger_has_moved_past_writes_nothing() {
        let entry = |state: OperationState, replays: u32| {
            let mut e = LedgerEntry { replays, ..Default::default() };
            e.set_state(state);
            e
        };
        assert!(still_queued_since(None, 0), "no entry yet: the move creates it, as before");
        assert!(still_queued_since(Some(&entry(OperationState::Queued, 1)), 1));
        // Replay took the operation out of the DLQ since this copy read the ledger: the replayed copy owns it.
        assert!(!still_queued_since(Some(&entry(OperationState::Queued, 2)), 1));
        // Another delivery of the same message moved it already (its DLQ entry may be replayed by now).
        assert!(!still_queued_since(Some(&entry(OperationState::Dlq, 1)), 1));
        assert!(!still_queued_since(Some(&entry(OperationState::Sent, 1)), 1));
    }
}
