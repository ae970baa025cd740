//! Reconciler of unknown outcomes (durable consumer `reconciler` on BW_UNKNOWN).
//!
//! An entry waits until its review time. If a status webhook moved the ledger out of UNKNOWN meanwhile, the
//! entry is simply acked (the message was sent; it is never resent). Otherwise the category policy applies:
//! `resend` → BW_DLQ (reason UNKNOWN_NO_STATUS, ledger DLQ, still flagged unknown), `quarantine` →
//! BW_QUARANTINE (UNKNOWN_REVIEW, a human decides), `expire` → ledger EXPIRED (stale OTPs are worse than none).
//! Moves follow the house order: publish to the destination with a message id, update the ledger, ack; every
//! delivery is settled by `bw_common::disposition::apply`.
//!
//! Every delivery of an entry is one `ingest.reconcile` span (fields `operation_id`, `decision`: ledger_behind,
//! waiting, resolved, resend, quarantine, expire, retry, undecodable) whose parent is the trace context the
//! dispatcher wrote into the entry's headers, so reconciliation shows in the operation's own trace; the DLQ and
//! quarantine entries it writes carry that span on, so a replay after `resend` stays in the trace too. A status
//! webhook that resolves the operation meanwhile is its own trace (Meta sends no trace context): its
//! `ingest.process_webhook` span gets an `ingest.resolve_unknown` child with the same `operation_id`
//! (see `processor.rs`), and the `resolved` reconcile span closes the operation's trace.

use crate::metrics::Metrics;
use async_nats::jetstream;
use bw_common::disposition::{self, Label, Settle};
use bw_common::ledger::Ledger;
use bw_common::time::now_ms;
use bw_proto::v1::{
    Category, DlqEnvelope, DlqReason, OperationState, QuarantineEntry, QuarantineReason, RejectReason, RejectedRequest,
    UnknownOutcome,
};
use bw_wire::names;
use prost::Message as _;
use serde::Deserialize;
use std::time::Duration;
use tracing::Instrument;

const RETRY_LATER: Duration = Duration::from_secs(1);

/// What to do with an unknown outcome that got no status before its review time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Dead-letter it for replay (a duplicate at Meta is possible; the ledger keeps it flagged).
    Resend,
    /// Keep it for a human.
    Quarantine,
    /// Drop it as stale (ledger EXPIRED).
    Expire,
}

impl Policy {
    fn label(self) -> &'static str {
        match self {
            Policy::Resend => "resend",
            Policy::Quarantine => "quarantine",
            Policy::Expire => "expire",
        }
    }

    fn decision(self) -> Decision {
        match self {
            Policy::Resend => Decision::Resend,
            Policy::Quarantine => Decision::Quarantine,
            Policy::Expire => Decision::Expire,
        }
    }
}

/// What the review of one BW_UNKNOWN delivery decided (the span's `decision`, the metric's `action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The ledger does not say UNKNOWN yet: the dispatcher's update is still on its way.
    LedgerBehind,
    /// Before its review time.
    Waiting,
    /// A status moved the ledger on: nothing to do.
    Resolved,
    Resend,
    Quarantine,
    Expire,
    /// A read, publish or ledger write failed: redelivered after [`RETRY_LATER`].
    Retry,
    /// Not an `UnknownOutcome`: kept in BW_REJECTED.
    Undecodable,
}

impl Label for Decision {
    fn label(self) -> &'static str {
        match self {
            Decision::LedgerBehind => "ledger_behind",
            Decision::Waiting => "waiting",
            Decision::Resolved => "resolved",
            Decision::Resend => "resend",
            Decision::Quarantine => "quarantine",
            Decision::Expire => "expire",
            Decision::Retry => "retry",
            Decision::Undecodable => "undecodable",
        }
    }
}

/// Policy per category.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policies {
    pub authentication: Policy,
    pub transactional: Policy,
    pub support: Policy,
    pub marketing: Policy,
}

impl Policies {
    /// The policy of a category (unspecified categories go to a human).
    pub fn for_category(&self, category: Category) -> Policy {
        match category {
            Category::Authentication => self.authentication,
            Category::Transactional => self.transactional,
            Category::Support => self.support,
            Category::Marketing => self.marketing,
            Category::Unspecified => Policy::Quarantine,
        }
    }
}

/// Handles BW_UNKNOWN entries.
pub(crate) struct Reconciler {
    pub js: jetstream::Context,
    /// Which DLQ partition each sender's entries go to.
    pub send: names::SendPartitions,
    pub ledger: Ledger,
    /// BW_SCOPES snapshots (written by the coordinator): the incident of a scope that is not CLOSED.
    pub scopes: async_nats::jetstream::kv::Store,
    pub policies: Policies,
    /// Used when an entry carries no review time: `sent_at + review_delay`.
    pub review_delay_ms: i64,
    /// Longest wait before looking at a waiting entry again.
    pub recheck: Duration,
    pub metrics: Metrics,
}

/// Headers of a move: its message id and the trace context of the current reconcile span.
fn headers(msg_id: &str) -> async_nats::HeaderMap {
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", msg_id);
    bw_wire::trace::inject(&tracing::Span::current(), &mut h);
    h
}

impl Reconciler {
    /// Handles one BW_UNKNOWN entry inside its `ingest.reconcile` span and settles it through
    /// [`disposition::apply`]. Every decision but `retry` is counted in the `action` metric.
    pub(crate) async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::info_span!(
            "ingest.reconcile",
            operation_id = tracing::field::Empty,
            decision = tracing::field::Empty
        );
        bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
        let settle = self.review(&msg, &span).instrument(span.clone()).await;
        span.record("decision", settle.result.label());
        disposition::apply(&msg, settle, &span, |action| {
            if settle.result != Decision::Retry {
                self.metrics.reconciled(action);
            }
        })
        .await;
    }

    /// Reviews one entry: what to tell the broker and what was decided.
    async fn review(&self, msg: &jetstream::Message, span: &tracing::Span) -> Settle<Decision> {
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        let entry = match UnknownOutcome::decode(msg.payload.as_ref()) {
            Ok(e) if e.request.is_some() => e,
            _ => return self.keep_undecodable(msg).await,
        };
        let request = entry.request.clone().unwrap_or_default();
        let op = request.operation_id.clone();
        span.record("operation_id", op.as_str());
        let current = match self.ledger.get(&op).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(operation_id = %op, error = %e, "ledger unavailable; retrying");
                return Settle::nak(Decision::Retry, RETRY_LATER);
            }
        };
        // The dispatcher stores the entry here before it moves the ledger to UNKNOWN; until that update lands
        // (or the dispatcher's redelivery repeats it) the ledger still says QUEUED. Acking then would drop the
        // only copy, so wait for the ledger to catch up.
        if current.as_ref().is_none_or(|c| c.entry.state() == OperationState::Queued) {
            return Settle::nak(Decision::LedgerBehind, RETRY_LATER);
        }
        if current.as_ref().is_some_and(|c| c.entry.state() != OperationState::Unknown) {
            tracing::info!(operation_id = %op, "unknown outcome already resolved");
            return Settle::ack(Decision::Resolved);
        }
        let review_at = if entry.review_at_unix_ms > 0 {
            entry.review_at_unix_ms
        } else {
            entry.sent_at_unix_ms + self.review_delay_ms
        };
        let now = now_ms();
        if now < review_at {
            let wait = Duration::from_millis((review_at - now) as u64).min(self.recheck);
            return Settle::nak(Decision::Waiting, wait);
        }
        let policy = self.policies.for_category(request.category());
        let mut incident = String::new();
        let moved = match policy {
            Policy::Resend => match self.resend(&entry, seq).await {
                Some(id) => {
                    incident = id;
                    true
                }
                None => false,
            },
            Policy::Quarantine => self.quarantine(&entry, seq).await,
            // The request is kept for an operator's resend (`bw_ops::resend`): no wamid link holds it.
            Policy::Expire => {
                let link = bw_common::ledger::WamidLink {
                    operation_id: op.clone(),
                    attempt: current.as_ref().map(|c| c.entry.attempts).unwrap_or(0),
                    request: request.encode_to_vec(),
                };
                let pseudo = bw_common::ledger::unknown_outcome_link(&op);
                self.ledger.link_attempt(&pseudo, &link).await.is_ok()
            }
        };
        if !moved {
            return Settle::nak(Decision::Retry, RETRY_LATER);
        }
        let (state, reason) = match policy {
            Policy::Resend => (OperationState::Dlq, "dlq: unknown outcome, no status"),
            Policy::Quarantine => (OperationState::Quarantined, "quarantined: unknown outcome, no status"),
            Policy::Expire => (OperationState::Expired, "expired: unknown outcome, no status; not resent"),
        };
        let updated = self
            .ledger
            .update(&op, |cur| {
                // A status may have arrived since the read above: then it wins and nothing changes.
                let mut next = match cur {
                    Some(c) if c.state() != OperationState::Unknown => return None,
                    Some(c) => c.clone(),
                    None => bw_common::ledger::entry_for(&request, OperationState::Unknown),
                };
                next.set_state(state);
                next.flagged_unknown = true;
                next.reason = reason.to_string();
                if policy == Policy::Resend {
                    next.incident_id = incident.clone();
                }
                Some(next)
            })
            .await;
        match updated {
            Ok(_) => {
                tracing::info!(operation_id = %op, policy = policy.label(), "unknown outcome reviewed");
                Settle::ack(policy.decision())
            }
            Err(e) => {
                tracing::warn!(operation_id = %op, error = %e, "ledger update failed; retrying");
                Settle::nak(Decision::Retry, RETRY_LATER)
            }
        }
    }

    /// Dead-letters the entry; Some(incident it carries, empty when the scope is CLOSED) once published.
    async fn resend(&self, entry: &UnknownOutcome, seq: u64) -> Option<String> {
        let request = entry.request.clone().unwrap_or_default();
        let replays = match self.ledger.get(&request.operation_id).await {
            Ok(Some(v)) => v.entry.replays,
            _ => 0,
        };
        let incident_id = self.open_incident(&request.phone_number_id).await;
        let envelope = DlqEnvelope {
            reason: DlqReason::UnknownNoStatus as i32,
            incident_id: incident_id.clone(),
            first_error: entry.error.clone(),
            last_error: entry.error.clone(),
            dead_lettered_at_unix_ms: now_ms(),
            replay_attempts: replays,
            request: Some(request.clone()),
            ..Default::default()
        };
        let id = format!("{}.unknown-dlq.{seq}", request.operation_id);
        let subject = self.send.dlq_subject(request.category(), &request.phone_number_id);
        match bw_common::nats::publish_durable(&self.js, subject, headers(&id), envelope.encode_to_vec().into()).await {
            Ok(_) => Some(incident_id),
            Err(e) => {
                tracing::warn!(operation_id = %request.operation_id, error = %e, "dlq publish failed; retrying");
                None
            }
        }
    }

    /// The incident of the sender's breaker when its BW_SCOPES snapshot says it is not CLOSED (else empty), so a
    /// DLQ entry written while the scope is OPEN carries the incident like the dispatcher's do.
    async fn open_incident(&self, phone_number_id: &str) -> String {
        use bw_proto::v1::{BreakerState, ScopeSnapshot};
        match self.scopes.get(phone_number_id).await {
            Ok(Some(bytes)) => match ScopeSnapshot::decode(bytes.as_ref()) {
                Ok(s) if !matches!(s.state(), BreakerState::Closed | BreakerState::Unspecified) => s.incident_id,
                _ => String::new(),
            },
            _ => String::new(),
        }
    }

    async fn quarantine(&self, entry: &UnknownOutcome, seq: u64) -> bool {
        let request = entry.request.clone().unwrap_or_default();
        let q = QuarantineEntry {
            reason: QuarantineReason::UnknownReview as i32,
            error: entry.error.clone(),
            detail: "outcome unknown and no status webhook arrived before the review time".into(),
            quarantined_at_unix_ms: now_ms(),
            request: Some(request.clone()),
            ..Default::default()
        };
        let id = format!("{}.unknown-quarantine.{seq}", request.operation_id);
        let subject = names::quarantine_subject(&request.phone_number_id);
        match bw_common::nats::publish_durable(&self.js, subject, headers(&id), q.encode_to_vec().into()).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(operation_id = %request.operation_id, error = %e, "quarantine publish failed; retrying");
                false
            }
        }
    }

    /// Moves an undecodable entry to BW_REJECTED (then it is acked); a retry when the move failed.
    async fn keep_undecodable(&self, msg: &jetstream::Message) -> Settle<Decision> {
        let record = RejectedRequest {
            raw: msg.payload.to_vec(),
            source: msg.subject.to_string(),
            reason: RejectReason::Undecodable as i32,
            error: "BW_UNKNOWN entry is not an UnknownOutcome with a request".into(),
            at_unix_ms: now_ms(),
            raw_size: msg.payload.len() as u64,
        };
        let kept = bw_common::nats::publish_durable(
            &self.js,
            names::rejected_subject("unknown"),
            async_nats::HeaderMap::new(),
            record.encode_to_vec().into(),
        )
        .await;
        if kept.is_ok() {
            tracing::warn!("undecodable BW_UNKNOWN entry moved to BW_REJECTED");
            Settle::ack(Decision::Undecodable)
        } else {
            Settle::nak(Decision::Retry, RETRY_LATER)
        }
    }
}
