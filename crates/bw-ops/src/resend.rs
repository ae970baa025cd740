//! Operator resend (`bwctl op resend <id> --reason ...`): a FAILED operation, or one whose outcome was unknown
//! and that ended EXPIRED by policy, goes back to the dispatcher as a new attempt, with the reason in its
//! journey. The request is the one its last accepted attempt sent, kept in its wamid link
//! (`bw_common::ledger::WamidLink`), or, for one expired with its outcome unknown (no wamid came back), the one the
//! reconciler kept under `bw_common::ledger::unknown_outcome_link`. It refuses, changing nothing, when the operation is unknown, when the
//! message reached the recipient (delivered, read), and when it is still in flight (queued, on the wire, sent
//! and waiting for its status, in the DLQ, the quarantine or reconciliation: those have their own ways out).
//!
//! A FAILED entry that was flagged unknown may already be a duplicate at Meta; the operator's resend accepts
//! that, which is why it needs a person and a reason.

use crate::OpsError;
use bw_common::ledger::Ledger;
use bw_proto::v1::{LedgerEntry, OperationState};
use bw_wire::names::SendPartitions;

/// Why a resend was refused (nothing changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No ledger entry (never accepted, or expired).
    Unknown,
    /// Delivered or read: the message reached the recipient; never sent again.
    Reached(OperationState),
    /// Still on its way or held elsewhere: the pipeline (or its own command) settles it.
    InFlight(OperationState),
    /// Expired without ever being unknown, or without a kept request: nothing to send again.
    NotResendable(String),
    /// The reason is empty or too long.
    BadReason,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Unknown => write!(f, "no such operation (never accepted, or its ledger entry expired)"),
            Refusal::Reached(s) => write!(f, "the outcome is {}: the message reached the recipient", s.label()),
            Refusal::InFlight(s) => write!(
                f,
                "the operation is {} (still in flight or held: the pipeline settles it; see bwctl op, dlq, \
                 quarantine)",
                s.label()
            ),
            Refusal::NotResendable(why) => write!(f, "not resendable: {why}"),
            Refusal::BadReason => write!(f, "--reason must be 1 to {MAX_REASON} characters"),
        }
    }
}

/// Longest operator reason kept in the journey.
pub const MAX_REASON: usize = 200;

/// What a resend did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resent {
    /// Queued as a new attempt (the n-th resend).
    Queued {
        resend: u32,
    },
    Refused(Refusal),
}

/// Whether `entry` may be resent: FAILED, or flagged unknown and EXPIRED.
pub fn check(entry: &LedgerEntry) -> Result<(), Refusal> {
    use OperationState::*;
    match entry.state() {
        Failed => Ok(()),
        Expired if entry.flagged_unknown => Ok(()),
        Expired => Err(Refusal::NotResendable("expired before it reached Meta (its deadline passed)".into())),
        s @ (Delivered | Read) => Err(Refusal::Reached(s)),
        s => Err(Refusal::InFlight(s)),
    }
}

/// Re-queues operation `key` as a new attempt with the operator's `reason` (non-personal text: the caller masks
/// digits). Err only when the broker did not answer; a refusal changes nothing.
pub async fn resend(
    js: &async_nats::jetstream::Context,
    ledger: &Ledger,
    send: SendPartitions,
    key: &str,
    reason: &str,
) -> Result<Resent, OpsError> {
    let reason = reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON {
        return Ok(Resent::Refused(Refusal::BadReason));
    }
    let Some(current) = ledger.get(key).await? else { return Ok(Resent::Refused(Refusal::Unknown)) };
    if let Err(refusal) = check(&current.entry) {
        return Ok(Resent::Refused(refusal));
    }
    let wamid = current.entry.wamid.clone();
    let mut link = if wamid.is_empty() { None } else { ledger.wamid_link(&wamid).await? };
    if link.is_none() && current.entry.flagged_unknown {
        // Expired with its outcome unknown: no wamid came back; the reconciler kept the request.
        link = ledger.wamid_link(&bw_common::ledger::unknown_outcome_link(key)).await?;
    }
    let Some(request) = link.filter(|l| l.operation_id == key).and_then(|l| l.send_request()) else {
        return Ok(Resent::Refused(Refusal::NotResendable(
            "its request is not kept (no accepted attempt, dispatch.wamid_link off, or the link expired)".into(),
        )));
    };
    let read = current.entry.clone();
    let mut refused = None;
    let reopened = ledger
        .reopen(key, |cur| {
            let cur = cur?;
            // Decided again on the entry as it is now: a status may have landed since the read.
            if let Err(r) = check(cur) {
                refused = Some(r);
                return None;
            }
            refused = None;
            let mut next = cur.clone();
            next.set_state(OperationState::Queued);
            next.resends += 1;
            next.async_pending_wamid.clear();
            next.in_flight_since_unix_ms = 0;
            next.in_flight_token.clear();
            next.transient_failures = 0;
            next.first_failure_at_unix_ms = 0;
            next.reason = format!("operator resend {} after {}: {reason}", next.resends, cur.state().label());
            Some(next)
        })
        .await?;
    if let Some(r) = refused {
        return Ok(Resent::Refused(r));
    }
    let Some(v) = reopened.filter(|v| v.entry.state() == OperationState::Queued && v.entry.resends > read.resends)
    else {
        return Ok(Resent::Refused(Refusal::InFlight(read.state())));
    };
    let id = bw_common::attempts::resend_msg_id(key, v.entry.resends);
    // The replay lane, as every operator move: an operator never publishes on the live lanes (deploy/nats).
    let lane = bw_wire::names::Lane::for_replay(request.category());
    bw_common::attempts::publish(js, send, lane, &request, &id, v.entry.replays).await?;
    Ok(Resent::Queued { resend: v.entry.resends })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(state: OperationState, flagged: bool) -> LedgerEntry {
        let mut e = LedgerEntry { flagged_unknown: flagged, ..Default::default() };
        e.set_state(state);
        e
    }

    #[test]
    fn only_failed_or_flagged_expired_operations_are_resent() {
        use OperationState::*;
        assert_eq!(check(&entry(Failed, false)), Ok(()));
        assert_eq!(check(&entry(Expired, true)), Ok(()));
        assert!(matches!(check(&entry(Expired, false)), Err(Refusal::NotResendable(_))));
        for s in [Delivered, Read] {
            assert_eq!(check(&entry(s, true)), Err(Refusal::Reached(s)));
        }
        for s in [Queued, Sent, Dlq, Quarantined, Unknown] {
            assert_eq!(check(&entry(s, false)), Err(Refusal::InFlight(s)));
        }
    }
}
