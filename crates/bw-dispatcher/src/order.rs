//! Per-recipient order in the dispatcher (issue #14; the shared state is `bw_breaker::order`).
//!
//! A message ingest marked `keeps_order` is admitted through the order gate
//! ([`bw_breaker::Breaker::admit_ordered`]): while an earlier accepted message to the same recipient is still in
//! the recipient's order set it is refused with `order_wait`, before any other check. What the refused one does:
//! - first it waits in memory, re-admitted after [`ORDER_HOLD_MS`], then after twice as long each time up to
//!   [`ORDER_HOLD_MAX_MS`], for at most `hold_max_ms` (the earlier one is often in the same batch or on the wire,
//!   and is released within milliseconds);
//! - then it goes back to BW_SEND as a delayed redelivery whose delay doubles per delivery
//!   ([`redelivery_ms`]: from 250 ms up to 5 s while the earlier one is still in BW_SEND, up to 15 s while it sits
//!   in the DLQ). It never goes to the DLQ itself: the DLQ holds at most the first waiting message of each
//!   recipient, so replay (any number of workers) can only send that one, in its turn, and a replayed follower
//!   can never fill the replay lane and stall replay of the message it waits for. A follower waiting for a DLQ
//!   entry costs one fetch, one ledger read and one admission item per 15 s; it expires at its deadline like
//!   any message.
//!
//! Releases: Meta's answer releases an operation in the outcome batch it is recorded in (accepted, unknown,
//! permanent error → quarantine); a stale on-the-wire mark (→ BW_UNKNOWN) or an expiry releases it here. A
//! blocking member whose release was lost, or that an operator or replay ended (quarantine, purge = EXPIRED), is
//! found by the first message it blocks: [`Worker::check_blockers`] reads its ledger entry once per delivery and
//! blocker, and removes it when the entry is final, quarantined or unknown, or missing for more than
//! [`MISSING_GRACE_MS`] (a crash between ingest's registration and its publish).

use crate::backoff::doubled;
use crate::meta::MetaAnswer;
use crate::worker::{Waiting, Work, Worker};
use bw_breaker::{Admission, OrderRelease, Scope};
use bw_proto::v1::OperationState;
use std::collections::HashMap;

/// A message refused with order_wait is first re-admitted from memory after this long, then after twice as long
/// each time up to [`ORDER_HOLD_MAX_MS`] (while within `hold_max_ms`): 6 admissions in its first second instead
/// of 50 at a fixed 20 ms, which at saturation (the earlier one waiting for the sender's tokens) made order
/// waits the most frequent admission decision.
pub(crate) const ORDER_HOLD_MS: u64 = 20;
pub(crate) const ORDER_HOLD_MAX_MS: u64 = 320;
/// A blocking member with no ledger entry is removed once it was registered this long ago: ingest registers,
/// then publishes, then creates the entry, all within its request timeout.
pub(crate) const MISSING_GRACE_MS: u64 = 30_000;
const REDELIVERY_BASE_MS: u64 = 250;
const REDELIVERY_CAP_MS: u64 = 5_000;
const REDELIVERY_CAP_DLQ_MS: u64 = 15_000;

/// How long a message refused with order_wait waits in memory before it is admitted again.
pub(crate) fn hold_ms(w: &Work) -> u64 {
    hold_after(w.order_polls, w.order_wait.as_ref().is_some_and(|o| o.released))
}

/// The in-memory wait after `polls` earlier order_wait refusals (0 when the blocker was just removed).
fn hold_after(polls: u8, released: bool) -> u64 {
    if released { 0 } else { doubled(ORDER_HOLD_MS, polls.into(), ORDER_HOLD_MAX_MS) }
}

/// Delay of the redelivery of a message refused with order_wait: doubling per delivery of the message.
pub(crate) fn redelivery_ms(w: &Work) -> u64 {
    let delivered = w.msg.info().map(|i| i.delivered).unwrap_or(1).clamp(1, 32) as u32;
    let cap = if w.order_wait.as_ref().is_some_and(|o| o.in_dlq) { REDELIVERY_CAP_DLQ_MS } else { REDELIVERY_CAP_MS };
    doubled(REDELIVERY_BASE_MS, delivered - 1, cap)
}

/// The gate's operation id for a message (empty: not gated).
pub(crate) fn gate_id(w: &Work) -> String {
    if w.request.keeps_order { w.request.operation_id.clone() } else { String::new() }
}

/// Whether Meta's answer takes the operation out of its recipient's order set: it reached Meta (accepted, or
/// maybe: unknown) or can never be sent again (a permanent error, quarantined).
pub(crate) fn answer_releases(answer: &MetaAnswer) -> bool {
    match answer {
        MetaAnswer::Accepted { .. } | MetaAnswer::Unknown { .. } => true,
        MetaAnswer::Rejected { meaning, .. } => meaning.class == bw_common::classify::ErrorClass::Permanent,
        MetaAnswer::NotSent { .. } => false,
    }
}

/// The release of a message's operation.
pub(crate) fn release_of(w: &Work) -> OrderRelease {
    OrderRelease {
        recipient_key: bw_common::mask::recipient_key(&w.request.recipient),
        operation_id: w.request.operation_id.clone(),
    }
}

/// What the ledger says of a blocker.
enum Verdict {
    Wait { in_dlq: bool },
    Gone,
}

impl Worker {
    /// For every message of `works` the admission refused with order_wait, notes what it waits for and, when
    /// the ledger shows that blocker ended or never arrived, removes it from the set (the message is then
    /// admitted again at once). One ledger read per blocker, only when a message meets a new one.
    pub(crate) async fn check_blockers(&self, scope: &Scope, works: &mut [Work], admission: &Admission) {
        let mut todo: HashMap<String, (u64, String)> = HashMap::new();
        for (i, w) in works.iter().enumerate() {
            if let Some(Some(b)) = admission.blockers.get(i)
                && w.order_wait.as_ref().is_none_or(|o| o.blocker != b.operation_id || o.released)
            {
                let rk = bw_common::mask::recipient_key(&w.request.recipient);
                todo.entry(b.operation_id.clone()).or_insert((b.age_ms, rk));
            }
        }
        let verdicts = futures::future::join_all(todo.into_iter().map(|(op, (age_ms, recipient_key))| async move {
            let verdict = match self.ledger.get(&op).await {
                Ok(Some(v)) => match v.entry.state() {
                    OperationState::Queued => Verdict::Wait { in_dlq: false },
                    OperationState::Dlq => Verdict::Wait { in_dlq: true },
                    _ => Verdict::Gone,
                },
                Ok(None) if age_ms >= MISSING_GRACE_MS => Verdict::Gone,
                Ok(None) => Verdict::Wait { in_dlq: false },
                Err(e) => {
                    tracing::debug!(error = %e, "ledger unavailable for an order check");
                    Verdict::Wait { in_dlq: false }
                }
            };
            (op, recipient_key, verdict)
        }))
        .await;
        let gone: Vec<OrderRelease> = verdicts
            .iter()
            .filter(|(_, _, v)| matches!(v, Verdict::Gone))
            .map(|(op, rk, _)| OrderRelease { recipient_key: rk.clone(), operation_id: op.clone() })
            .collect();
        let healed = if gone.is_empty() {
            true
        } else {
            match self.breaker.release_order(scope, &gone).await {
                Ok(n) => {
                    self.metrics.order_healed.inc_by(n);
                    tracing::info!(removed = n, "order members that had ended removed from their sets");
                    true
                }
                Err(e) => {
                    tracing::warn!(error = %e, "order members could not be removed; retried at the next refusal");
                    false
                }
            }
        };
        let verdicts: HashMap<String, Verdict> = verdicts.into_iter().map(|(op, _, v)| (op, v)).collect();
        for (i, w) in works.iter_mut().enumerate() {
            let Some(Some(b)) = admission.blockers.get(i) else { continue };
            let Some(v) = verdicts.get(&b.operation_id) else { continue };
            let (in_dlq, released) = match v {
                Verdict::Wait { in_dlq } => (*in_dlq, false),
                Verdict::Gone => (false, healed),
            };
            w.order_wait = Some(Waiting { blocker: b.operation_id.clone(), in_dlq, released });
        }
    }

    /// Takes a message's operation out of its order set outside an outcome batch (a stale on-the-wire mark sent
    /// it to BW_UNKNOWN, or it expired). A lost release is healed by [`Worker::check_blockers`].
    pub(crate) async fn release_order(&self, w: &Work) {
        if !w.request.keeps_order {
            return;
        }
        if let Err(e) = self.breaker.release_order(&w.scope(), &[release_of(w)]).await {
            tracing::debug!(parent: &w.span, error = %e, "order release lost; healed by the next message it blocks");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_wait_backs_off_from_20_ms_to_320_ms_and_a_released_blocker_goes_at_once() {
        let waits: Vec<u64> = (0..7).map(|polls| hold_after(polls, false)).collect();
        assert_eq!(waits, [20, 40, 80, 160, 320, 320, 320]);
        // Within the default hold_max_ms (1 s): 6 admissions, not 50.
        let mut at = 0;
        let polls = (0..).take_while(|p| {
            at += hold_after(*p, false);
            at <= 1_000
        });
        assert_eq!(polls.count(), 6);
        assert_eq!(hold_after(3, true), 0);
    }

    #[test]
    fn a_doubled_wait_stops_at_its_cap_and_never_overflows() {
        assert_eq!((0..5).map(|d| doubled(250, d, 5_000)).collect::<Vec<_>>(), [250, 500, 1_000, 2_000, 4_000]);
        assert_eq!(doubled(250, 5, 5_000), 5_000);
        assert_eq!(doubled(250, u32::MAX, 5_000), 5_000);
        assert_eq!(doubled(u64::MAX / 2, 3, u64::MAX), u64::MAX);
    }
}
