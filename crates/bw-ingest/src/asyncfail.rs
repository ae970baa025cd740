//! Asynchronous failures follow the same table as synchronous ones (`bw_common::classify`, channel `Async`).
//!
//! A `failed` status is matched to the attempt that sent its wamid, not to the operation's latest attempt: one
//! of an earlier attempt (the entry holds a newer wamid) changes nothing but the journey. One of the current
//! attempt sets FAILED only when its code is permanent and not quarantined. Any other code (transient, rate
//! limit, hold, template quarantine, unclassified, or none at all) means Meta accepted the message and did not
//! deliver it: the operation goes back to QUEUED as a new attempt, in one compare-and-set from SENT
//! ([`bw_common::ledger::Ledger::reopen`]) that names the failed wamid (`async_pending_wamid`), and the request
//! that attempt sent (kept in its wamid link) is published to the dispatcher with the code, under a message id
//! per attempt. The dispatcher routes that code as if the previous send had just failed synchronously
//! (crates/bw-dispatcher/src/attempt.rs). A repeated webhook finds the entry QUEUED with that wamid pending and
//! publishes the same attempt again, which the stream's dedup drops (this also covers a crash between the
//! ledger write and the publish); once the dispatcher routed it, a repeat does nothing. A status that overtakes
//! its attempt's SENT write (the entry is QUEUED without its wamid) waits for that write (`send_unrecorded`).

use crate::processing::{Processor, Retry};
use bw_common::classify::{Channel, Classification, ErrorClass, classify};
use bw_proto::v1::{LedgerEntry, OperationState, StatusUpdate};

/// Meta accepted the attempt and has not delivered it: sent, or held by template pacing (a held message Meta
/// drops fails with 132015, and gets a new attempt like a sent one).
fn accepted_undelivered(state: OperationState) -> bool {
    matches!(state, OperationState::Sent | OperationState::Held)
}

/// How long a failed status waits for the dispatcher to record its send: past it the send is taken as
/// abandoned (the dispatcher died after its POST), and the status settles the operation as before.
const SEND_RECORD_GRACE_MS: i64 = 60_000;

/// The dispatcher records an attempt's wamid only with its SENT write, after Meta's answer, so a failed status
/// can overtake that write: the entry is still QUEUED and does not hold the status's wamid. Matching it then
/// would take a retried attempt's failure for an earlier attempt's and drop it, so it waits while the attempt
/// is recently on the wire (its mark) or the status itself is recent (Meta's timestamp), whichever is later.
fn send_unrecorded(entry: &LedgerEntry, status_wamid: &str, status_at_ms: i64, now_ms: i64) -> bool {
    if entry.state() != OperationState::Queued || entry.wamid == status_wamid {
        return false;
    }
    let recent = |at: i64| at > 0 && now_ms - at < SEND_RECORD_GRACE_MS;
    recent(entry.in_flight_since_unix_ms) || recent(status_at_ms)
}

/// What a `failed` status's code means for its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Permanent and not quarantined: the operation ends FAILED.
    Final,
    /// Anything else: Meta did not deliver it, a new attempt goes to the dispatcher.
    NewAttempt,
}

/// The classification of a `failed` status's code; a status without a code (0) is classified as one without an
/// error body (unclassified, for a person).
pub(crate) fn classification(code: i64) -> Classification {
    classify((code != 0).then_some(code), None, 0, Channel::Async)
}

/// The fate of a `failed` status with `code` (the webhook carries no subcode).
pub(crate) fn fate(code: i64) -> Fate {
    let c = classification(code);
    if c.class == ErrorClass::Permanent && !c.quarantine { Fate::Final } else { Fate::NewAttempt }
}

/// What [`Processor::failed_status`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Apply the status as before (FAILED, or a conflicting fact recorded beside a terminal one).
    Apply,
    /// Handled here (re-queued, or recorded in the journey only).
    Done,
}

/// Whether `wamid` belongs to an attempt older than the entry's current one.
fn earlier_attempt(entry: &LedgerEntry, wamid: &str) -> bool {
    !entry.wamid.is_empty() && entry.wamid != wamid
}

/// Whether the attempt that sent `wamid` was already queued again by its asynchronous failure.
fn requeued(entry: &LedgerEntry, wamid: &str) -> bool {
    entry.wamid == wamid && entry.async_failures > 0 && !entry.state().is_accepted_by_meta()
}

fn note(entry: &LedgerEntry, note: &str) -> Option<LedgerEntry> {
    if entry.reason.contains(note) {
        return None;
    }
    let mut next = entry.clone();
    next.reason = if entry.reason.is_empty() { note.to_string() } else { format!("{}; {note}", entry.reason) };
    Some(next)
}

impl Processor {
    /// Handles a `failed` status of operation `op` by its attempt and its code (module docs).
    pub(crate) async fn failed_status(&self, s: &StatusUpdate, op: &str) -> Result<Step, Retry> {
        let Some(current) = self.ledger.get(op).await? else { return Ok(Step::Apply) };
        let entry = &current.entry;
        let code = s.error_code;
        if send_unrecorded(entry, &s.wamid, s.timestamp_unix_s.saturating_mul(1000), bw_common::time::now_ms()) {
            // Redelivered in a second (the whole webhook, which is idempotent): by then the dispatcher has
            // written SENT with this wamid, and the status is matched to its own attempt (a new attempt or
            // FAILED by its code), not taken for an earlier attempt's or applied to a message not yet recorded.
            self.metrics.status("failed_before_sent");
            return Err(Retry(format!("a failed status ({code}) arrived before its send was recorded")));
        }
        if earlier_attempt(entry, &s.wamid) {
            let text = format!("a failed status ({code}) of an earlier attempt was recorded, not applied");
            self.ledger.update(op, |cur| note(cur?, &text)).await?;
            self.metrics.status("failed_earlier_attempt");
            tracing::info!(operation_id = %op, code, "failed status of an earlier attempt; journey only");
            return Ok(Step::Done);
        }
        if requeued(entry, &s.wamid) {
            if entry.async_pending_wamid == s.wamid {
                // A repeat before the dispatcher routed it (or the publish after the re-queue failed): the same
                // attempt again, which the stream keeps once.
                self.publish_attempt(s, op, entry).await?;
            }
            self.metrics.duplicate("status");
            return Ok(Step::Done);
        }
        if fate(code) == Fate::Final || !accepted_undelivered(entry.state()) {
            // Final, or no attempt of it is known to be accepted and undelivered (delivered/read stay terminal;
            // a failed status before the send was recorded settles the operation as before).
            return Ok(Step::Apply);
        }
        let Some(link) = self.ledger.wamid_link(&s.wamid).await? else {
            return Ok(self.not_kept(op, code));
        };
        if link.operation_id != op || link.send_request().is_none() {
            return Ok(self.not_kept(op, code));
        }
        let attempt = if link.attempt > 0 { link.attempt } else { entry.attempts.max(1) };
        let class = classification(code).class;
        let wamid = s.wamid.clone();
        let reopened = self
            .ledger
            .reopen(op, |cur| {
                let cur = cur?;
                if !accepted_undelivered(cur.state()) || cur.wamid != wamid {
                    return None;
                }
                let mut next = cur.clone();
                next.set_state(OperationState::Queued);
                next.async_pending_wamid = wamid.clone();
                next.async_failures += 1;
                next.last_code = code;
                next.in_flight_since_unix_ms = 0;
                next.in_flight_token.clear();
                // No number for the new attempt: the dispatcher counts routing this failure as a try of its own
                // (`attempts` grows by one for it, then by one for the send), as it counts a synchronous one.
                next.reason = format!(
                    "attempt {attempt} failed after acceptance ({code}, {}); queued as a new attempt",
                    class.label()
                );
                Some(next)
            })
            .await?;
        match reopened {
            Some(v) if v.entry.state() == OperationState::Queued && v.entry.async_pending_wamid == s.wamid => {
                self.publish_attempt(s, op, &v.entry).await?;
                self.metrics.status("failed_new_attempt");
                tracing::info!(operation_id = %op, code, attempt, "async failure: queued as a new attempt");
                Ok(Step::Done)
            }
            // Moved meanwhile (another status, the reconciler): apply as before, which keeps terminal facts.
            _ => Ok(Step::Apply),
        }
    }

    /// The request of the re-queued attempt goes to the dispatcher with the async error it carries.
    async fn publish_attempt(&self, s: &StatusUpdate, op: &str, entry: &LedgerEntry) -> Result<(), Retry> {
        let link = self.ledger.wamid_link(&s.wamid).await?;
        let Some((link, mut request)) = link.and_then(|l| l.send_request().map(|r| (l, r))) else {
            // The re-queue was written from this link, which a bucket limit may have dropped since: nothing to
            // send. The entry stays QUEUED with the wamid pending; an operator resends or drops it.
            tracing::error!(operation_id = %op, "re-queued attempt's request is gone; resend it with bwctl op resend");
            return Ok(());
        };
        let attempt = if link.attempt > 0 { link.attempt } else { entry.attempts.max(1) };
        request.async_error_code = s.error_code;
        request.async_error_subcode = 0;
        request.async_error_title = s.error_title.chars().take(200).collect();
        request.async_failed_wamid = s.wamid.clone();
        request.async_failed_attempt = attempt;
        let id = bw_common::attempts::msg_id(op, attempt + 1);
        let lane = bw_wire::names::Lane::for_category(request.category());
        bw_common::attempts::publish(&self.js, self.send, lane, &request, &id, entry.replays)
            .await
            .map_err(|e| Retry(format!("new attempt not queued: {e}")))?;
        Ok(())
    }

    /// A retriable failure whose request is not kept (`dispatch.wamid_link` off, or the link expired): FAILED
    /// as before, nothing can send it again.
    fn not_kept(&self, op: &str, code: i64) -> Step {
        tracing::warn!(
            operation_id = %op,
            code,
            "retriable async failure, but the attempt's request is not kept (dispatch.wamid_link off?): FAILED"
        );
        self.metrics.status("failed_not_kept");
        Step::Apply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_permanent_unquarantined_code_is_final() {
        // (code, fate): transient, rate limits, a quarantined template code, unclassified and no code at all
        // come back as a new attempt; permanent codes end the operation.
        let table = [
            (131000, Fate::NewAttempt),
            (131016, Fate::NewAttempt),
            (130429, Fate::NewAttempt),
            (131049, Fate::NewAttempt),
            (132015, Fate::NewAttempt),
            (0, Fate::NewAttempt),
            (999_999, Fate::NewAttempt),
            (131026, Fate::Final),
            (131051, Fate::Final),
        ];
        for (code, want) in table {
            assert_eq!(fate(code), want, "code {code}: {:?}", classification(code));
        }
    }

    #[test]
    fn a_quarantined_code_is_never_final() {
        for code in [132001, 132015, 132016, 0, 424_242] {
            assert!(classification(code).class != ErrorClass::Permanent || classification(code).quarantine);
            assert_eq!(fate(code), Fate::NewAttempt, "{code}");
        }
    }

    #[test]
    fn a_failed_status_waits_only_for_a_recent_unrecorded_send() {
        let now = 1_000_000;
        let mut e = LedgerEntry::default();
        e.set_state(OperationState::Queued);
        assert!(!send_unrecorded(&e, "wamid.A", 0, now), "not on the wire, no status time");
        e.in_flight_since_unix_ms = 990_000;
        assert!(send_unrecorded(&e, "wamid.A", 0, now));
        assert!(!send_unrecorded(&e, "wamid.A", 0, 990_000 + SEND_RECORD_GRACE_MS), "a stale mark settles as before");
        e.in_flight_since_unix_ms = 0;
        assert!(send_unrecorded(&e, "wamid.A", 995_000, now), "a recent status waits without a mark");
        assert!(!send_unrecorded(&e, "wamid.A", now - SEND_RECORD_GRACE_MS, now), "an old status does not");
        e.set_state(OperationState::Sent);
        assert!(!send_unrecorded(&e, "wamid.A", 995_000, now), "recorded");
    }

    #[test]
    fn a_retried_attempts_failure_waits_for_its_own_wamid() {
        // Attempt 1 (wamid.A) failed after acceptance and was re-queued; attempt 2 is on the wire and its
        // failed status (wamid.B) overtakes its SENT write: it waits, it is not taken for attempt 1's.
        let mut e = LedgerEntry { wamid: "wamid.A".into(), in_flight_since_unix_ms: 999_000, ..Default::default() };
        e.set_state(OperationState::Queued);
        assert!(send_unrecorded(&e, "wamid.B", 999_500, 1_000_000));
        assert!(!send_unrecorded(&e, "wamid.A", 999_500, 1_000_000), "a repeat of attempt 1's status does not wait");
        e.wamid = "wamid.B".into();
        e.set_state(OperationState::Sent);
        assert!(!send_unrecorded(&e, "wamid.B", 999_500, 1_000_000), "recorded: matched to attempt 2");
    }

    #[test]
    fn a_status_is_matched_to_its_own_attempt() {
        let mut entry = LedgerEntry { wamid: "wamid.B".into(), ..Default::default() };
        entry.set_state(OperationState::Sent);
        assert!(earlier_attempt(&entry, "wamid.A"), "attempt 2 holds wamid.B: wamid.A is earlier");
        assert!(!earlier_attempt(&entry, "wamid.B"));
        entry.set_state(OperationState::Queued);
        entry.async_failures = 1;
        assert!(requeued(&entry, "wamid.B"), "its failure already queued attempt 3");
        entry.set_state(OperationState::Sent);
        assert!(!requeued(&entry, "wamid.B"), "SENT again: a new failure of it re-queues");
    }
}
