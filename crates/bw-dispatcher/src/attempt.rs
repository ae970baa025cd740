//! Re-entry of an asynchronous failure: a new attempt queued by ingest after a `failed` status whose code is not
//! final (crates/bw-ingest/src/asyncfail.rs). Meta accepted the previous attempt and did not deliver it, so
//! sending again cannot deliver twice. The request carries Meta's code (`async_error_*`) and the ledger names
//! the failed wamid (`async_pending_wamid`) until this delivery routes it, once, exactly as if the previous send
//! had just failed synchronously with that code: the breaker learns the same outcome (an async 130429 slows the
//! number, a hold pauses its scope) and [`crate::route::after_answer`] decides where the message goes (a retry
//! after the usual back-off, a hold, the DLQ, the quarantine). A redelivery finds the wamid cleared and goes on
//! to an ordinary send through admission and the on-the-wire mark, which guard it as they guard every send.

use crate::backoff::RETRY_LATER;
use crate::meta::MetaAnswer;
use crate::settle::Outcome;
use crate::worker::{Work, Worker};
use bw_breaker::OutcomeItem;
use bw_common::classify::{Channel, classify};
use bw_common::disposition::Settle;
use bw_proto::v1::{OperationState, SendRequest};
use std::time::Duration;

/// Meta's answer the carried asynchronous failure stands for: a refusal with its code, classified for the async
/// channel by the one table. A status webhook carries no HTTP status of the send nor any retry hint, so the
/// defaults of the code's row apply.
pub(crate) fn async_answer(request: &SendRequest) -> MetaAnswer {
    let subcode = (request.async_error_subcode != 0).then_some(request.async_error_subcode);
    MetaAnswer::Rejected {
        meaning: classify(Some(request.async_error_code), subcode, 0, Channel::Async),
        code: request.async_error_code,
        http_status: 0,
        details: format!(
            "attempt {} failed after acceptance: {}",
            request.async_failed_attempt,
            request.async_error_title.chars().take(200).collect::<String>()
        ),
        fbtrace_id: String::new(),
        retry_after_ms: None,
        regain_ms: None,
    }
}

/// Whether this delivery carries an asynchronous failure the ledger still waits to see routed.
pub(crate) fn pending(w: &Work) -> bool {
    let wamid = &w.request.async_failed_wamid;
    !wamid.is_empty() && w.ledger.entry.async_pending_wamid == *wamid
}

impl Worker {
    /// Routes the carried asynchronous failure of `w` (once) and returns None; returns the message untouched
    /// when it carries none still pending, for an ordinary send.
    pub(crate) async fn reenter(&self, mut w: Work) -> Option<Work> {
        if !pending(&w) {
            return Some(w);
        }
        let wamid = w.request.async_failed_wamid.clone();
        // Whether the write that landed was this delivery's (as of the closure's last run).
        let mut cleared_here = false;
        // Cleared first, under compare-and-set: the failure is routed once, whichever delivery gets here. The
        // async failures so far count as this dispatch pass's transient failures, so a message Meta keeps failing
        // asynchronously runs out of retries as one failing synchronously does (`dispatch.max_retries`).
        let cleared = self
            .ledger
            .update_versioned(&w.request.operation_id, Some(w.ledger.clone()), |cur| {
                cleared_here = false;
                let e = cur?;
                if e.state() != OperationState::Queued || e.async_pending_wamid != wamid {
                    return None;
                }
                cleared_here = true;
                let mut e = e.clone();
                e.async_pending_wamid.clear();
                e.transient_failures = e.transient_failures.max(e.async_failures.saturating_sub(1));
                Some(e)
            })
            .await;
        match cleared {
            Ok(Some(v)) if v.entry.state() == OperationState::Queued && v.entry.async_pending_wamid.is_empty() => {
                w.ledger = v;
                if !cleared_here {
                    // Another delivery routed it meanwhile: this one is an ordinary send now, guarded by the mark.
                    return Some(w);
                }
            }
            Ok(_) => {
                self.settle(&w, Settle::ack(Outcome::AlreadyHandled), None).await;
                return None;
            }
            Err(e) => {
                tracing::warn!(parent: &w.span, error = %e, "ledger unavailable at an async failure's re-entry");
                self.settle(&w, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                return None;
            }
        }
        let answer = async_answer(&w.request);
        tracing::info!(
            parent: &w.span,
            meta_code = w.request.async_error_code,
            failed_attempt = w.request.async_failed_attempt,
            "asynchronous failure routed as a synchronous one"
        );
        let recipient_key = bw_common::mask::recipient_key(&w.request.recipient);
        let items: Vec<OutcomeItem> = crate::process::outcome_kinds(&answer)
            .into_iter()
            .map(|kind| OutcomeItem { recipient_key: recipient_key.clone(), kind, canary: false })
            .collect();
        self.breaker.record(&w.scope(), &items).await;
        self.on_answer(w, answer, Duration::ZERO).await;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settle::without_async_error;
    use bw_common::classify::ErrorClass;

    fn failed(code: i64) -> SendRequest {
        SendRequest {
            operation_id: "crm/op-1".into(),
            async_error_code: code,
            async_error_title: "Something went wrong".into(),
            async_failed_wamid: "wamid.A".into(),
            async_failed_attempt: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_carried_code_is_classified_for_the_async_channel() {
        let MetaAnswer::Rejected { meaning, code, .. } = async_answer(&failed(131000)) else { panic!("rejected") };
        assert_eq!((meaning.class, code), (ErrorClass::Transient, 131000));
        let MetaAnswer::Rejected { meaning, .. } = async_answer(&failed(130429)) else { panic!("rejected") };
        assert!(matches!(meaning.class, ErrorClass::RateLimit(_)), "{meaning:?}");
    }

    #[test]
    fn the_link_keeps_the_request_without_the_earlier_failure() {
        let clean = without_async_error(&failed(131000));
        assert_eq!(clean, SendRequest { operation_id: "crm/op-1".into(), ..Default::default() });
    }
}
