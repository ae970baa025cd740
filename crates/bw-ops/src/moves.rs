//! Moves out of the DLQ and the quarantine, shared by the replay service and `bwctl` so both obey the same
//! rules and neither can send a message twice.
//!
//! Order of every move: ledger compare-and-set first (it decides who wins when the service and an operator
//! race), then publish to the destination with a deterministic Nats-Msg-Id, then the caller acks or deletes
//! the source. A crash between the steps is healed on the next pass: the ledger then says QUEUED with this
//! module's marker reason, and the publish is repeated with the same msg id, which JetStream drops if the
//! first one landed.

use crate::OpsError;
use crate::inspect::{DlqItem, QuarantineItem, quarantine_reason_label};
use crate::pace::Gate;
use async_nats::jetstream;
use bw_common::ledger::Ledger;
use bw_common::nats::{Buckets, publish_durable};
use bw_common::registry::RegistryView;
use bw_common::time::now_ms;
use bw_proto::v1::{
    Attempt, DlqEnvelope, DlqReason, ErrorInfo, LedgerEntry, OperationState, QuarantineEntry, QuarantineReason,
    SendRequest, Signal, send_request,
};
use bw_wire::names;
use bw_wire::names::{REPLAY_HEADER, UNDECODABLE_HEADER, quarantine_msg_id, replay_msg_id};
use prost::Message;
use std::time::Duration;

/// Rules a replay obeys.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Replays after which a message that is back in the DLQ is poison (quarantined).
    pub max_replays: u32,
    /// Customer service window for free-form text, milliseconds (24 h).
    pub window_ms: i64,
    /// Whether `not_before_unix_ms` delays the replay (the CLI's "replay now" ignores it).
    pub honor_not_before: bool,
    /// Recorded in the appended [`Attempt`]: "replay" or "operator".
    pub via: String,
}

impl Default for Rules {
    fn default() -> Self {
        Rules { max_replays: 5, window_ms: 24 * 3600 * 1000, honor_not_before: true, via: "replay".into() }
    }
}

/// What to do with a DLQ entry, decided from the entry, its ledger record and the clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Meta accepted it already: drop the DLQ copy (a duplicate prevented).
    AlreadyAccepted,
    /// The ledger is final without Meta (expired or purged), or the quarantine holds the operation: drop the DLQ
    /// copy.
    AlreadyFinal,
    /// The operation is live somewhere else for now: keep the entry and look again shortly (see
    /// [`check_dlq_entry`]).
    Elsewhere(&'static str),
    /// Its deadline passed: ledger EXPIRED, drop.
    Expired,
    /// Free-form text outside the 24 h window: quarantine WINDOW_CLOSED.
    WindowClosed,
    /// A previous pass updated the ledger but may not have published: publish again with the same msg id.
    Resume { replay: u32 },
    /// Replayed `max_replays` times already: quarantine POISON.
    Poison { replays: u32 },
    /// Not before this many milliseconds.
    NotYet { wait_ms: i64 },
    /// Replay it as replay number `replay`.
    Replay { replay: u32 },
}

/// Marker reason this module writes into the ledger when it queues a replay.
fn replay_reason(replay: u32, from: &str) -> String {
    format!("replay {replay} from {from}")
}

/// True for free-form text whose recipient last wrote more than `window_ms` ago (unknown: not closed;
/// Meta then decides and a 131047 ends in quarantine through the dispatcher). Templates are always allowed.
pub fn window_closed(request: &SendRequest, now_ms: i64, window_ms: i64) -> bool {
    matches!(request.payload, Some(send_request::Payload::Text(_)))
        && request.customer_last_inbound_unix_ms > 0
        && now_ms - request.customer_last_inbound_unix_ms > window_ms
}

fn deadline_passed(request: &SendRequest, now_ms: i64) -> bool {
    request.deadline_unix_ms > 0 && now_ms >= request.deadline_unix_ms
}

/// Decides what to do with a DLQ entry. Pure; `ledger` is None when the operation has no ledger record.
pub fn check_dlq_entry(envelope: &DlqEnvelope, ledger: Option<&LedgerEntry>, now_ms: i64, rules: &Rules) -> Check {
    let request = envelope.request.clone().unwrap_or_default();
    let state = ledger.map(|l| l.state()).unwrap_or(OperationState::Dlq);
    if state.is_accepted_by_meta() {
        return Check::AlreadyAccepted;
    }
    if matches!(state, OperationState::Expired | OperationState::Quarantined) {
        return Check::AlreadyFinal;
    }
    if let Some(l) = ledger
        && state == OperationState::Queued
    {
        if l.replays > envelope.replay_attempts && l.reason == replay_reason(l.replays, "dlq") {
            return Check::Resume { replay: l.replays };
        }
        // The ledger still says QUEUED: the delivery that wrote this entry has not recorded the move yet (it
        // publishes first, then writes the ledger), or a live copy of the operation is in BW_SEND. Replaying now
        // would make a second copy, and the on-the-wire mark the delivery leaves until its ledger write would
        // turn that copy into an unknown outcome. The move completes (ledger DLQ) or the live copy settles the
        // operation; either way the next look decides.
        return Check::Elsewhere("a move of this operation is unfinished (ledger QUEUED)");
    }
    if deadline_passed(&request, now_ms) {
        return Check::Expired;
    }
    if window_closed(&request, now_ms, rules.window_ms) {
        return Check::WindowClosed;
    }
    let replays = ledger.map(|l| l.replays).unwrap_or(envelope.replay_attempts);
    if replays >= rules.max_replays {
        return Check::Poison { replays };
    }
    if rules.honor_not_before && envelope.not_before_unix_ms > now_ms {
        return Check::NotYet { wait_ms: envelope.not_before_unix_ms - now_ms };
    }
    Check::Replay { replay: replays + 1 }
}

/// What a move did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Published to the replay lane as replay `replay` (`duplicate`: JetStream had it already).
    Replayed { replay: u32, duplicate: bool },
    /// Meta accepted it earlier; the stale copy can go.
    AlreadyAccepted,
    /// Already final without Meta (expired, purged); the stale copy can go.
    AlreadyFinal,
    /// Marked EXPIRED now.
    Expired,
    /// Quarantined now.
    Quarantined(QuarantineReason),
    /// Not yet: try again after this long (keep the source).
    NotYet(Duration),
    /// Someone else changed the ledger meanwhile; keep the source and look again later.
    Changed,
    /// Left alone (keep the source), with a reason for the operator.
    Skipped(String),
    /// Purged by an operator: ledger EXPIRED with reason "purged by operator".
    Purged,
    /// The pacing gate closed before the move (breaker opened, shutdown): nothing changed, keep the source.
    Stopped,
}

impl Outcome {
    /// Whether the source message can be removed (acked or deleted).
    pub fn source_done(&self) -> bool {
        !matches!(self, Outcome::NotYet(_) | Outcome::Changed | Outcome::Skipped(_) | Outcome::Stopped)
    }

    /// Short label for metrics and reports.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Replayed { .. } => "replayed",
            Outcome::AlreadyAccepted => "already_sent",
            Outcome::AlreadyFinal => "already_final",
            Outcome::Expired => "expired",
            Outcome::Quarantined(QuarantineReason::Poison) => "poison",
            Outcome::Quarantined(QuarantineReason::WindowClosed) => "window_closed",
            Outcome::Quarantined(QuarantineReason::SenderRevoked) => "sender_revoked",
            Outcome::Quarantined(QuarantineReason::Unclassified) => "unclassified",
            Outcome::Quarantined(_) => "quarantined",
            Outcome::NotYet(_) => "not_before",
            Outcome::Changed => "changed",
            Outcome::Skipped(_) => "skipped",
            Outcome::Purged => "purged",
            Outcome::Stopped => "stopped",
        }
    }
}

/// A different sender that takes over a scope's messages (failover).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub waba_id: String,
    pub phone_number_id: String,
}

/// Performs moves. Cheap to clone.
#[derive(Clone)]
pub struct Mover {
    js: jetstream::Context,
    send: names::SendPartitions,
    ledger: Ledger,
    rules: Rules,
    /// With a registry (the replay service in registry mode), a DLQ entry is replayed only while its sender may
    /// still send it; without one (bwctl, dev mode) the dispatcher's own check before the send applies.
    registry: Option<RegistryView>,
}

fn entry_from(request: &SendRequest, replays: u32, state: OperationState) -> LedgerEntry {
    LedgerEntry { replays, ..bw_common::ledger::entry_for(request, state) }
}

impl Mover {
    /// A mover over the topology's buckets.
    pub fn new(js: jetstream::Context, buckets: &Buckets, rules: Rules) -> Mover {
        Mover { js, send: buckets.send, ledger: Ledger::new(buckets), rules, registry: None }
    }

    /// Checks each DLQ entry's sender (and failover target) against `registry` before replaying it: an entry
    /// whose number the registry no longer assigns to the operation's tenant, under the request's WABA, goes to
    /// the quarantine (`SENDER_REVOKED`) instead.
    pub fn with_registry(mut self, registry: RegistryView) -> Mover {
        self.registry = Some(registry);
        self
    }

    /// Why `request`, going out as `target` when one is set, may not be replayed (None: it may).
    async fn revoked(&self, request: &SendRequest, target: Option<&Target>) -> Result<Option<String>, OpsError> {
        let Some(registry) = &self.registry else { return Ok(None) };
        let mut outgoing = request.clone();
        if let Some(t) = target {
            outgoing.waba_id = t.waba_id.clone();
            outgoing.phone_number_id = t.phone_number_id.clone();
        }
        let refusal = registry.revoked(&outgoing).await.map_err(|e| OpsError::nats("sender registry", e))?;
        Ok(refusal.map(|r| r.revoked_detail(&outgoing.phone_number_id)))
    }

    /// How BW_SEND is split (where a replayed entry goes back to).
    pub fn send_partitions(&self) -> names::SendPartitions {
        self.send
    }

    /// The rules in force.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// Handles one DLQ entry: checks it, then replays, expires or quarantines it. The caller acks the DLQ
    /// message when [`Outcome::source_done`], else naks it (with the delay of [`Outcome::NotYet`]).
    /// With a `gate`, a replay passes it right before the ledger update and the publish (other outcomes
    /// publish nothing to the lane and do not wait).
    pub async fn replay_dlq_entry(
        &self,
        envelope: &DlqEnvelope,
        target: Option<&Target>,
        gate: Option<&Gate>,
    ) -> Result<Outcome, OpsError> {
        let Some(request) = envelope.request.as_ref() else {
            return Ok(Outcome::Skipped("dlq entry without a request".into()));
        };
        let op = request.operation_id.as_str();
        if envelope.reason() == DlqReason::Unclassified {
            // An unclassified code is never replayed (it would loop until POISON): entries an older dispatcher
            // left in the DLQ move to the quarantine under the code's scope, for a person.
            let code = envelope.last_error.as_ref().map_or(0, |e| e.meta_code);
            let scope = format!("code:{code}");
            let detail = format!(
                "held in quarantine scope {scope}: Meta answered code {code}, which Breakwater does not know; waits \
                 for an operator (moved from the DLQ, never replayed)"
            );
            let error = envelope.last_error.clone();
            return self
                .quarantine_scoped(
                    request,
                    QuarantineReason::Unclassified,
                    &detail,
                    &envelope.incident_id,
                    error,
                    scope,
                )
                .await;
        }
        let current = self.ledger.get(op).await?.map(|v| v.entry);
        match check_dlq_entry(envelope, current.as_ref(), now_ms(), &self.rules) {
            Check::AlreadyAccepted => Ok(Outcome::AlreadyAccepted),
            Check::AlreadyFinal => Ok(Outcome::AlreadyFinal),
            Check::Expired => self.expire(request, OperationState::Dlq, "deadline passed in the dlq").await,
            Check::WindowClosed => {
                self.quarantine(
                    request,
                    QuarantineReason::WindowClosed,
                    "free-form text outside the 24 h window",
                    &envelope.incident_id,
                    envelope.last_error.clone(),
                )
                .await
            }
            Check::Poison { replays } => {
                let detail = format!("still failing after {replays} replays");
                let outcome = self
                    .quarantine(
                        request,
                        QuarantineReason::Poison,
                        &detail,
                        &envelope.incident_id,
                        envelope.last_error.clone(),
                    )
                    .await?;
                if outcome == Outcome::Quarantined(QuarantineReason::Poison) {
                    self.signal_poison(request, &detail).await?;
                }
                Ok(outcome)
            }
            Check::NotYet { wait_ms } => Ok(Outcome::NotYet(Duration::from_millis(wait_ms.max(1) as u64))),
            Check::Elsewhere(why) => Ok(Outcome::Skipped(why.into())),
            Check::Resume { .. } | Check::Replay { .. } if let Some(detail) = self.revoked(request, target).await? => {
                let reason = QuarantineReason::SenderRevoked;
                let error = envelope.last_error.clone();
                self.quarantine(request, reason, &detail, &envelope.incident_id, error).await
            }
            Check::Resume { replay } => {
                if let Some(g) = gate
                    && !g.pass().await
                {
                    return Ok(Outcome::Stopped);
                }
                self.publish_replay(request, replay, target).await
            }
            Check::Replay { replay } => {
                if let Some(g) = gate
                    && !g.pass().await
                {
                    return Ok(Outcome::Stopped);
                }
                let base =
                    current.unwrap_or_else(|| entry_from(request, envelope.replay_attempts, OperationState::Dlq));
                self.queue_and_publish(request, base, replay, "dlq", target).await
            }
        }
    }

    /// Ledger CAS to QUEUED with `replays = replay` (only from `replay - 1` and not final), then publish.
    async fn queue_and_publish(
        &self,
        request: &SendRequest,
        base: LedgerEntry,
        replay: u32,
        from: &str,
        target: Option<&Target>,
    ) -> Result<Outcome, OpsError> {
        let marker = replay_reason(replay, from);
        let expected_state = base.state();
        let stored = self
            .ledger
            .update(&request.operation_id, |cur| {
                let cur = cur.cloned().unwrap_or_else(|| base.clone());
                let state = cur.state();
                if state.is_accepted_by_meta() || state == OperationState::Expired || cur.replays + 1 != replay {
                    return None;
                }
                if from == "quarantine" && state != expected_state {
                    return None;
                }
                let mut next = cur;
                next.set_state(OperationState::Queued);
                next.replays = replay;
                next.reason = marker.clone();
                if let Some(t) = target {
                    next.waba_id = t.waba_id.clone();
                    next.phone_number_id = t.phone_number_id.clone();
                }
                Some(next)
            })
            .await?;
        match stored {
            Some(e) if e.state() == OperationState::Queued && e.replays == replay && e.reason == marker => {
                self.publish_replay(request, replay, target).await
            }
            Some(e) if e.state().is_accepted_by_meta() => Ok(Outcome::AlreadyAccepted),
            Some(e) if e.state() == OperationState::Expired => Ok(Outcome::AlreadyFinal),
            _ => Ok(Outcome::Changed),
        }
    }

    async fn publish_replay(
        &self,
        request: &SendRequest,
        replay: u32,
        target: Option<&Target>,
    ) -> Result<Outcome, OpsError> {
        let mut outgoing = request.clone();
        if let Some(t) = target {
            outgoing.waba_id = t.waba_id.clone();
            outgoing.phone_number_id = t.phone_number_id.clone();
        }
        outgoing.attempts.push(Attempt {
            number: outgoing.attempts.len() as u32 + 1,
            at_unix_ms: now_ms(),
            via: self.rules.via.clone(),
            detail: format!("replay {replay}"),
            ..Default::default()
        });
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, replay_msg_id(&request.operation_id, replay).as_str());
        headers.insert(REPLAY_HEADER, replay.to_string().as_str());
        bw_wire::trace::inject(&tracing::Span::current(), &mut headers);
        // Priority follows the message: a priority entry goes back through the priority replay lane (`rh`),
        // served first and admitted as priority traffic; a marketing one through `rp`.
        let subject = self.send.outbox_subject(names::Lane::for_replay(outgoing.category()), &outgoing.phone_number_id);
        let duplicate = publish_durable(&self.js, subject, headers, outgoing.encode_to_vec().into()).await?;
        Ok(Outcome::Replayed { replay, duplicate })
    }

    async fn expire(&self, request: &SendRequest, from: OperationState, reason: &str) -> Result<Outcome, OpsError> {
        let stored = self
            .ledger
            .update(&request.operation_id, |cur| {
                let mut next = cur.cloned().unwrap_or_else(|| entry_from(request, 0, from));
                if next.state().is_final() {
                    return None;
                }
                next.set_state(OperationState::Expired);
                next.reason = reason.to_string();
                Some(next)
            })
            .await?;
        Ok(match stored.map(|e| e.state()) {
            Some(OperationState::Expired) => Outcome::Expired,
            Some(s) if s.is_accepted_by_meta() => Outcome::AlreadyAccepted,
            _ => Outcome::Changed,
        })
    }

    /// Quarantines a request: publishes a [`QuarantineEntry`], then sets the ledger QUARANTINED (unless Meta
    /// accepted it meanwhile, in which case the entry is harmless and accounting reports it as stale).
    pub async fn quarantine(
        &self,
        request: &SendRequest,
        reason: QuarantineReason,
        detail: &str,
        incident_id: &str,
        error: Option<ErrorInfo>,
    ) -> Result<Outcome, OpsError> {
        self.quarantine_scoped(request, reason, detail, incident_id, error, String::new()).await
    }

    /// [`Mover::quarantine`] under a quarantine scope (`QuarantineEntry.scope_key`).
    pub async fn quarantine_scoped(
        &self,
        request: &SendRequest,
        reason: QuarantineReason,
        detail: &str,
        incident_id: &str,
        error: Option<ErrorInfo>,
        scope_key: String,
    ) -> Result<Outcome, OpsError> {
        let op = request.operation_id.as_str();
        let replays = self.ledger.get(op).await?.map(|v| v.entry.replays).unwrap_or(0);
        let entry = QuarantineEntry {
            request: Some(request.clone()),
            reason: reason as i32,
            error,
            detail: detail.to_string(),
            quarantined_at_unix_ms: now_ms(),
            incident_id: incident_id.to_string(),
            scope_key,
        };
        let mut headers = async_nats::HeaderMap::new();
        let msg_id = quarantine_msg_id(op, replays, quarantine_reason_label(reason));
        headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id.as_str());
        bw_wire::trace::inject(&tracing::Span::current(), &mut headers);
        let subject = names::quarantine_subject(&request.phone_number_id);
        publish_durable(&self.js, subject, headers, entry.encode_to_vec().into()).await?;
        let stored = self
            .ledger
            .update(op, |cur| {
                let mut next = cur.cloned().unwrap_or_else(|| entry_from(request, replays, OperationState::Dlq));
                if next.state().is_final() {
                    return None;
                }
                next.set_state(OperationState::Quarantined);
                next.reason = detail.to_string();
                Some(next)
            })
            .await?;
        Ok(match stored.map(|e| e.state()) {
            Some(OperationState::Quarantined) => Outcome::Quarantined(reason),
            Some(s) if s.is_accepted_by_meta() => Outcome::AlreadyAccepted,
            _ => Outcome::AlreadyFinal,
        })
    }

    async fn signal_poison(&self, request: &SendRequest, detail: &str) -> Result<(), OpsError> {
        let signal = Signal {
            kind: "poison".into(),
            waba_id: request.waba_id.clone(),
            phone_number_id: request.phone_number_id.clone(),
            detail: detail.to_string(),
            at_unix_ms: now_ms(),
            operation_id: request.operation_id.clone(),
            ..Default::default()
        };
        publish_durable(&self.js, names::signal_subject("poison"), Default::default(), signal.encode_to_vec().into())
            .await?;
        Ok(())
    }

    /// Keeps bytes that did not decode (from `source_stream`, sequence `sequence`) in the quarantine, marked with
    /// the `Bw-Undecodable` header, so the source can be acked without losing anything.
    pub async fn quarantine_undecodable(
        &self,
        phone_number_id: &str,
        source_stream: &str,
        sequence: u64,
        raw: bytes::Bytes,
    ) -> Result<(), OpsError> {
        let mut headers = async_nats::HeaderMap::new();
        let msg_id = format!("undecodable.{source_stream}.{sequence}");
        headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id.as_str());
        headers.insert(UNDECODABLE_HEADER, source_stream);
        publish_durable(&self.js, names::quarantine_subject(phone_number_id), headers, raw).await?;
        Ok(())
    }

    /// Replays a quarantined entry now (operator action). The caller deletes the quarantine message when
    /// [`Outcome::source_done`]. The replay limit does not apply (a human decided); deadline and window do.
    pub async fn replay_quarantined(&self, item: &QuarantineItem) -> Result<Outcome, OpsError> {
        let Some(request) = item.entry.request.as_ref() else {
            return Ok(Outcome::Skipped("quarantine entry without a request".into()));
        };
        let Some(current) = self.ledger.get(&request.operation_id).await?.map(|v| v.entry) else {
            return Ok(Outcome::Skipped("no ledger entry (run `bwctl account`)".into()));
        };
        let state = current.state();
        let now = now_ms();
        if state.is_accepted_by_meta() {
            return Ok(Outcome::AlreadyAccepted);
        }
        if state == OperationState::Expired {
            return Ok(Outcome::AlreadyFinal);
        }
        if state == OperationState::Queued && current.reason == replay_reason(current.replays, "quarantine") {
            return self.publish_replay(request, current.replays, None).await;
        }
        if state != OperationState::Quarantined {
            return Ok(Outcome::Skipped(format!("ledger says {}; the operation lives elsewhere", state.label())));
        }
        if deadline_passed(request, now) {
            return self.expire(request, OperationState::Quarantined, "deadline passed in quarantine").await;
        }
        if window_closed(request, now, self.rules.window_ms) {
            return Ok(Outcome::Skipped("free-form text outside the 24 h window; purge it".into()));
        }
        let replay = current.replays + 1;
        self.queue_and_publish(request, current, replay, "quarantine", None).await
    }

    /// Purges a DLQ entry: ledger DLQ → EXPIRED with reason "purged by operator". The caller deletes the
    /// message when [`Outcome::source_done`].
    pub async fn purge_dlq(&self, item: &DlqItem) -> Result<Outcome, OpsError> {
        let request = item.envelope.request.clone().unwrap_or_default();
        self.purge(&request, OperationState::Dlq).await
    }

    /// Purges a quarantine entry: ledger QUARANTINED → EXPIRED with reason "purged by operator".
    pub async fn purge_quarantined(&self, item: &QuarantineItem) -> Result<Outcome, OpsError> {
        let request = item.entry.request.clone().unwrap_or_default();
        self.purge(&request, OperationState::Quarantined).await
    }

    async fn purge(&self, request: &SendRequest, expected: OperationState) -> Result<Outcome, OpsError> {
        let op = request.operation_id.as_str();
        if op.is_empty() {
            return Ok(Outcome::Purged);
        }
        let Some(current) = self.ledger.get(op).await?.map(|v| v.entry) else {
            // Nothing accepted this operation: the entry is debris and may go.
            return Ok(Outcome::Purged);
        };
        let state = current.state();
        if state.is_accepted_by_meta() {
            return Ok(Outcome::AlreadyAccepted);
        }
        if state == OperationState::Expired {
            return Ok(Outcome::AlreadyFinal);
        }
        if state != expected {
            return Ok(Outcome::Skipped(format!("ledger says {}; not purged", state.label())));
        }
        let stored = self
            .ledger
            .update(op, |cur| {
                let cur = cur?;
                if cur.state() != expected {
                    return None;
                }
                let mut next = cur.clone();
                next.set_state(OperationState::Expired);
                next.reason = format!("purged by operator from {}", expected.label());
                Some(next)
            })
            .await?;
        Ok(match stored.map(|e| e.state()) {
            Some(OperationState::Expired) => Outcome::Purged,
            _ => Outcome::Changed,
        })
    }
}

#[cfg(test)]
mod tests;
