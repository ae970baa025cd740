//! Asynchronous processing of stored webhooks (durable consumer `webhook-processor` on BW_WEBHOOKS, shared by
//! every ingest instance).
//!
//! Per delivery: parse the envelope; for each status, drop it if its `(wamid, status)` was handled before
//! (KV BW_WEBHOOK_DEDUP), find its operation (`biz_opaque_callback_data`, else the BW_WAMID map), apply it to
//! the ledger forward-only (a late "sent" never overwrites "read"; "failed" is terminal), raise signals for
//! error codes; forward inbound customer messages to BW_INBOUND. Work that hit an unavailable broker is
//! retried by a delayed redelivery of the whole delivery; items already handled are skipped by the dedup
//! keys, which are written only after an item's effects are stored. Bad bodies are acked, logged and counted:
//! they never block the consumer.

use crate::metrics::Metrics;
use crate::webhook::{self, ValueError};
use async_nats::jetstream::{self, AckKind, kv};
use bw_common::classify::{ErrorClass, classify_code};
use bw_common::ledger::{Ledger, LedgerError};
use bw_common::names;
use bw_common::proto::{DeliveryStatus, InboundMessage, OperationState, Signal, StatusUpdate, StoredWebhook};
use bw_common::time::now_ms;
use prost::Message as _;
use std::time::Duration;

const RETRY_LATER: Duration = Duration::from_secs(1);

/// A step failed because the broker was unavailable; the delivery is redelivered later.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Retry(String);

impl From<LedgerError> for Retry {
    fn from(e: LedgerError) -> Self {
        Retry(e.to_string())
    }
}

/// Handles stored webhook deliveries.
pub(crate) struct Processor {
    pub js: jetstream::Context,
    pub ledger: Ledger,
    pub dedup: kv::Store,
    pub metrics: Metrics,
}

fn target_state(status: DeliveryStatus) -> Option<OperationState> {
    match status {
        DeliveryStatus::Sent => Some(OperationState::Sent),
        DeliveryStatus::Delivered => Some(OperationState::Delivered),
        // A played voice message was also read.
        DeliveryStatus::Read | DeliveryStatus::Played => Some(OperationState::Read),
        DeliveryStatus::Failed => Some(OperationState::Failed),
        DeliveryStatus::Unspecified => None,
    }
}

fn status_label(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Sent => "sent",
        DeliveryStatus::Delivered => "delivered",
        DeliveryStatus::Read => "read",
        DeliveryStatus::Failed => "failed",
        DeliveryStatus::Played => "played",
        DeliveryStatus::Unspecified => "unspecified",
    }
}

impl Processor {
    /// Handles one stored delivery and acks or naks it.
    pub(crate) async fn handle(&self, msg: jetstream::Message) {
        let stored = match StoredWebhook::decode(msg.payload.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "stored webhook undecodable; dropped");
                self.metrics.processed("undecodable");
                let _ = msg.ack().await;
                return;
            }
        };
        let parsed = match webhook::parse(&stored.body) {
            Ok(p) => p,
            Err(e) => {
                // Signed by Meta but not understood: keep the bytes for inspection, never just drop them.
                let rejected = bw_common::proto::RejectedRequest {
                    raw: stored.body.clone(),
                    source: "webhook".into(),
                    reason: bw_common::proto::RejectReason::Undecodable as i32,
                    error: e.to_string(),
                    at_unix_ms: now_ms(),
                };
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("webhook.{}", stored.body_sha256).as_str());
                let kept = bw_common::nats::publish_durable(
                    &self.js,
                    names::rejected_subject("webhook"),
                    headers,
                    rejected.encode_to_vec().into(),
                )
                .await;
                if kept.is_err() {
                    let _ = msg.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                    return;
                }
                tracing::warn!(error = %e, body_sha256 = %stored.body_sha256, "webhook body not understood; kept in BW_REJECTED");
                self.metrics.processed("bad_json");
                let _ = msg.ack().await;
                return;
            }
        };
        let mut failed: Option<Retry> = None;
        for s in &parsed.statuses {
            if let Err(e) = self.status(s).await {
                failed.get_or_insert(e);
            }
        }
        for m in &parsed.inbound {
            if let Err(e) = self.inbound(m).await {
                failed.get_or_insert(e);
            }
        }
        for e in &parsed.errors {
            self.value_error(e).await;
        }
        if parsed.unknown_statuses > 0 {
            self.metrics.status("unrecognised");
        }
        match failed {
            None => {
                self.metrics.processed("ok");
                let _ = msg.ack().await;
            }
            Some(e) => {
                tracing::warn!(error = %e, body_sha256 = %stored.body_sha256, "webhook processing incomplete; redelivering");
                self.metrics.processed("retry");
                let _ = msg.ack_with(AckKind::Nak(Some(RETRY_LATER))).await;
            }
        }
    }

    async fn seen(&self, key: &str) -> Result<bool, Retry> {
        match self.dedup.get(key).await {
            Ok(v) => Ok(v.is_some()),
            Err(e) => Err(Retry(format!("dedup lookup failed: {e}"))),
        }
    }

    async fn mark(&self, key: &str) {
        match self.dedup.create(key, bytes::Bytes::from_static(b"1")).await {
            Ok(_) => {}
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
            // The effects are stored and idempotent: a missing key only costs a repeat later.
            Err(e) => tracing::debug!(error = %e, "dedup key not written"),
        }
    }

    async fn operation_of(&self, s: &StatusUpdate) -> Result<Option<String>, Retry> {
        if !s.operation_id.is_empty() && bw_common::ledger::valid_operation_id(&s.operation_id) {
            self.ledger.link_wamid(&s.wamid, &s.operation_id).await?;
            return Ok(Some(s.operation_id.clone()));
        }
        Ok(self.ledger.operation_for_wamid(&s.wamid).await?)
    }

    /// Applies one status to the ledger (forward-only) and raises signals for error codes.
    pub(crate) async fn status(&self, s: &StatusUpdate) -> Result<(), Retry> {
        let status = s.status();
        let Some(target) = target_state(status) else { return Ok(()) };
        let key = webhook::status_dedup_key(&s.wamid, status);
        if self.seen(&key).await? {
            self.metrics.duplicate("status");
            return Ok(());
        }
        let Some(op) = self.operation_of(s).await? else {
            // Not sent through Breakwater (or its ledger entry expired).
            self.metrics.status("unmatched");
            self.mark(&key).await;
            return Ok(());
        };
        let wamid = s.wamid.clone();
        let (code, title) = (s.error_code, s.error_title.clone());
        let stored = self
            .ledger
            .update(&op, |cur| {
                let cur = cur?;
                let mut next = cur.clone();
                next.set_state(target);
                if next.wamid.is_empty() {
                    next.wamid = wamid.clone();
                }
                if target == OperationState::Failed {
                    next.last_code = code;
                    next.reason = format!("failed status: {code}");
                } else if cur.state() == OperationState::Unknown {
                    next.reason = format!("unknown outcome resolved by a {} status", status_label(status));
                }
                Some(next)
            })
            .await?;
        match stored {
            None => self.metrics.status("unmatched"),
            Some(entry) if entry.state() == target => {
                self.metrics.status(status_label(status));
                tracing::debug!(operation_id = %op, status = status_label(status), "status applied");
            }
            Some(entry) => {
                self.metrics.status("stale");
                tracing::debug!(
                    operation_id = %op,
                    status = status_label(status),
                    kept = entry.state().label(),
                    "out-of-order status kept out"
                );
            }
        }
        if code != 0 {
            let waba = match self.ledger.get(&op).await {
                Ok(Some(v)) => v.entry.waba_id,
                _ => String::new(),
            };
            self.signals(&waba, &s.phone_number_id, code, &title, &op).await;
        }
        self.mark(&key).await;
        Ok(())
    }

    async fn inbound(&self, m: &InboundMessage) -> Result<(), Retry> {
        if m.wamid.is_empty() {
            return Ok(());
        }
        let key = webhook::inbound_dedup_key(&m.wamid);
        if self.seen(&key).await? {
            self.metrics.duplicate("inbound");
            return Ok(());
        }
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", key.as_str());
        let subject = names::inbound_subject(&m.phone_number_id);
        let duplicate = bw_common::nats::publish_durable(&self.js, subject, headers, m.encode_to_vec().into())
            .await
            .map_err(|e| Retry(e.to_string()))?;
        // Two deliveries of the same message processed at once both pass the check above; the stream's
        // message-id dedup keeps one, and says so.
        if duplicate {
            self.metrics.duplicate("inbound");
        } else {
            self.metrics.inbound_forwarded.inc();
        }
        self.mark(&key).await;
        Ok(())
    }

    async fn value_error(&self, e: &ValueError) {
        tracing::warn!(code = e.code, phone_number_id = %e.phone_number_id, "webhook carries an account-level error");
        self.signals(&e.waba_id, &e.phone_number_id, e.code, &e.title, "").await;
    }

    /// Publishes `status_error` (always) and `credentials` (for credential-class codes) signals.
    async fn signals(&self, waba: &str, phone: &str, code: i64, title: &str, op: &str) {
        let mut kinds = vec!["status_error"];
        if classify_code(code) == ErrorClass::Credentials {
            kinds.push("credentials");
        }
        for kind in kinds {
            let signal = Signal {
                kind: kind.to_string(),
                waba_id: waba.to_string(),
                phone_number_id: phone.to_string(),
                meta_code: code,
                detail: title.chars().take(200).collect(),
                at_unix_ms: now_ms(),
                operation_id: op.to_string(),
            };
            let published = bw_common::nats::publish_durable(
                &self.js,
                names::signal_subject(kind),
                async_nats::HeaderMap::new(),
                signal.encode_to_vec().into(),
            )
            .await;
            if let Err(e) = published {
                tracing::warn!(error = %e, kind, code, "signal not published");
            }
        }
    }
}
