//! Asynchronous processing of stored webhooks (durable consumer `webhook-processor` on BW_WEBHOOKS, shared by
//! every ingest instance).
//!
//! Per delivery: parse the envelope; for each status, find its operation (`biz_opaque_callback_data`, else the
//! BW_WAMID map) and apply it to the ledger forward-only (a late "sent" never overwrites "read"; the first
//! terminal fact stays: a late "failed" never overrides "delivered"/"read" and nothing revives a "failed", the
//! other fact is recorded in the entry's reason, see [`conflicting_fact`]; a "failed" is matched to its own
//! attempt and only a permanent code sets FAILED, any other queues a new attempt: `asyncfail`), raise signals
//! for error codes;
//! forward inbound customer messages to BW_INBOUND. Work that hit an unavailable broker is retried by a delayed
//! redelivery of the whole delivery. A repeated item (Meta delivers at least once; a retried delivery) does
//! nothing again: a status whose facts the ledger already holds writes nothing, and the items whose effects are
//! not in the ledger (a status with an error code, which raises signals; an inbound message) are skipped by
//! their dedup key in KV BW_WEBHOOK_DEDUP, written only after the item's effects are stored. So a plain status
//! costs one durable write, its ledger transition. Bad bodies are acked, logged and counted: they never block
//! the consumer. A body stored in the object store (over the server's `max_payload`, see `bodies`) is read from
//! there and deleted once every item in it is handled. Statuses of different messages are applied concurrently
//! (of one message, in document order); a long delivery tells the broker it is in progress. Every delivery ends
//! in one typed [`Processed`] applied by `bw_common::disposition::apply`.
//!
//! Tracing: each delivery is an `ingest.process_webhook` span. A status that moves an operation out of UNKNOWN
//! opens an `ingest.resolve_unknown` child (`operation_id`, `status`): Meta's webhooks carry no trace context,
//! so the operation id is what ties this trace to the operation's own (where `ingest.reconcile` records
//! `decision=resolved`); search both by `operation_id`.

use crate::bodies::OBJECT_HEADER;
use crate::processing::{Processor, Retry};
use crate::webhook::{self, ValueError};
use async_nats::jetstream::{self, kv};
use bw_common::classify::{ErrorClass, classify_code};
use bw_common::disposition::{Label, Settle, apply};
use bw_common::time::now_ms;
use bw_proto::v1::{DeliveryStatus, InboundMessage, OperationState, Signal, StatusUpdate, StoredWebhook};
use bw_wire::names;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;
use tracing::Instrument;

const RETRY_LATER: Duration = Duration::from_secs(1);

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

/// Meta may deliver "failed" and "delivered"/"read" in either order on multi-device accounts. The first
/// terminal fact is kept: a late "failed" never overrides "delivered" or "read" (the message reached a device),
/// and a late "delivered"/"read" never revives a "failed" (failed is terminal in the ledger). The other fact is
/// recorded in the entry's reason (and a late failure's code in `last_code`). Returns that note when `target`
/// contradicts `current`.
pub(crate) fn conflicting_fact(current: OperationState, target: OperationState, code: i64) -> Option<String> {
    use OperationState::{Delivered, Failed, Read};
    match (current, target) {
        (Delivered | Read, Failed) => Some(format!("a later failed status ({code}) was recorded, not applied")),
        (Failed, Delivered | Read) => Some(format!("a later {} status was recorded, not applied", target.label())),
        _ => None,
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

/// What became of one stored delivery (the `result` label of `bw_webhooks_processed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processed {
    /// Every item handled.
    Ok,
    /// Some item hit an unavailable broker: redelivered later, handled items are skipped then.
    Retry,
    /// Signed by Meta but not understood: kept in BW_REJECTED.
    BadJson,
    /// The stored record itself is undecodable (never written by ingest): dropped.
    Undecodable,
    /// Its large body is gone from the object store: a previous delivery of it finished and deleted it.
    BodyGone,
}

impl Label for Processed {
    fn label(self) -> &'static str {
        match self {
            Processed::Ok => "ok",
            Processed::Retry => "retry",
            Processed::BadJson => "bad_json",
            Processed::Undecodable => "undecodable",
            Processed::BodyGone => "body_gone",
        }
    }
}

/// Statuses of different messages are applied concurrently, those of one message in document order.
const STATUS_CONCURRENCY: usize = 16;
/// While a large delivery is worked on, the broker is told so this often (ack wait is 30 s by default).
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

impl Processor {
    /// Handles one stored delivery and settles it (the one place its acknowledgement is decided).
    pub(crate) async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::info_span!("ingest.process_webhook", result = tracing::field::Empty);
        let object = msg.headers.as_ref().and_then(|h| h.get(OBJECT_HEADER)).map(|v| v.as_str().to_string());
        // A delivery of thousands of statuses may take longer than the ack wait on a loaded broker: say it is
        // in progress until the decision is taken.
        let work = self.settle(&msg, object.as_deref()).instrument(span.clone());
        let settle = bw_common::disposition::with_progress(&msg, PROGRESS_EVERY, work).await;
        if settle.result == Processed::Ok
            && let Some(name) = &object
        {
            self.bodies.delete(name).await;
        }
        apply(&msg, settle, &span, |label| self.metrics.processed(label)).await;
    }

    async fn settle(&self, msg: &jetstream::Message, object: Option<&str>) -> Settle<Processed> {
        let mut stored = match StoredWebhook::decode(msg.payload.as_ref()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "stored webhook undecodable; dropped");
                return Settle::term(Processed::Undecodable);
            }
        };
        if let Some(name) = object {
            match self.bodies.get(name).await {
                Ok(Some(body)) => stored.body = body,
                Ok(None) => {
                    tracing::info!(body_sha256 = %stored.body_sha256, "large webhook body already processed and deleted");
                    return Settle::ack(Processed::BodyGone);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "large webhook body unreadable; redelivering");
                    return Settle::nak(Processed::Retry, RETRY_LATER);
                }
            }
        }
        let parsed = match webhook::parse(&stored.body) {
            Ok(p) => p,
            Err(e) => {
                // The typed parser refuses the whole body; account signals are read change by change, so a
                // restriction beside a malformed item still applies (`crate::signals`).
                if self.account_signals(&stored.body, &stored.body_sha256).await.is_err() {
                    return Settle::nak(Processed::Retry, RETRY_LATER);
                }
                return self.keep_bad_json(&stored, &e.to_string()).await;
            }
        };
        let mut failed: Option<Retry> = None;
        // Group statuses by message, keeping document order inside a group.
        let mut groups: Vec<Vec<&StatusUpdate>> = Vec::new();
        let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for s in &parsed.statuses {
            let i = *index.entry(s.wamid.as_str()).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[i].push(s);
        }
        // Bounded concurrency without a higher-ranked closure (which the Send check of spawned tasks refuses).
        let mut pending = groups.into_iter();
        let mut running = futures::stream::FuturesUnordered::new();
        loop {
            while running.len() < STATUS_CONCURRENCY {
                let Some(group) = pending.next() else { break };
                running.push(self.status_group(group));
            }
            match running.next().await {
                Some(Err(e)) => {
                    failed.get_or_insert(e);
                }
                Some(Ok(())) => {}
                None => break,
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
        // Fields beyond `messages` and value-level errors: typed account signals (`crate::signals`).
        if (parsed.ignored_changes > 0 || !parsed.errors.is_empty())
            && let Err(e) = self.account_signals(&stored.body, &stored.body_sha256).await
        {
            failed.get_or_insert(Retry(e));
        }
        if parsed.unknown_statuses > 0 {
            self.metrics.status("unrecognised");
        }
        match failed {
            None => Settle::ack(Processed::Ok),
            Some(e) => {
                tracing::warn!(error = %e, body_sha256 = %stored.body_sha256, "webhook processing incomplete; redelivering");
                Settle::nak(Processed::Retry, RETRY_LATER)
            }
        }
    }

    /// Signed by Meta but not understood: keep the bytes for inspection, never just drop them.
    async fn keep_bad_json(&self, stored: &StoredWebhook, error: &str) -> Settle<Processed> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("webhook.{}", stored.body_sha256).as_str());
        let raw = if self.bodies.fits_inline(stored.body.len()) {
            stored.body.clone()
        } else {
            let name = crate::bodies::rejected_object(&stored.body_sha256);
            if let Err(e) = self.bodies.put(&name, &stored.body).await {
                tracing::warn!(error = %e, "unparsable large webhook body not kept yet; redelivering");
                return Settle::nak(Processed::Retry, RETRY_LATER);
            }
            headers.insert(OBJECT_HEADER, name.as_str());
            Vec::new()
        };
        let rejected = bw_proto::v1::RejectedRequest {
            raw,
            source: "webhook".into(),
            reason: bw_proto::v1::RejectReason::Undecodable as i32,
            error: error.to_string(),
            at_unix_ms: now_ms(),
            raw_size: stored.body.len() as u64,
        };
        let kept = bw_common::nats::publish_durable(
            &self.js,
            names::rejected_subject("webhook"),
            headers,
            rejected.encode_to_vec().into(),
        )
        .await;
        if kept.is_err() {
            return Settle::nak(Processed::Retry, RETRY_LATER);
        }
        tracing::warn!(error, body_sha256 = %stored.body_sha256, "webhook body not understood; kept in BW_REJECTED");
        Settle::ack(Processed::BadJson)
    }

    async fn status_group(&self, group: Vec<&StatusUpdate>) -> Result<(), Retry> {
        for s in group {
            self.status(s).await?;
        }
        Ok(())
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

    /// True when the status names its operation (`biz_opaque_callback_data`, which the dispatcher sets to the
    /// operation key: a tenant's keys hold a `/`); otherwise only the wamid link can.
    fn names_operation(s: &StatusUpdate) -> bool {
        !s.operation_id.is_empty() && bw_wire::tenancy::valid_operation_key(&s.operation_id)
    }

    /// The operation a status belongs to: the one its callback data `named` (see [`Self::names_operation`]),
    /// else the one its wamid is linked to.
    async fn operation_of(&self, s: &StatusUpdate, named: bool) -> Result<Option<String>, Retry> {
        if named {
            self.ledger.link_wamid_once(&s.wamid, &s.operation_id).await?;
            return Ok(Some(s.operation_id.clone()));
        }
        Ok(self.ledger.operation_for_wamid(&s.wamid).await?)
    }

    /// Applies one status to the ledger (forward-only) and raises signals for error codes.
    pub(crate) async fn status(&self, s: &StatusUpdate) -> Result<(), Retry> {
        let status = s.status();
        let Some(target) = target_state(status) else { return Ok(()) };
        // Only a status with an error code raises signals, which a repeat must not raise again: it alone needs a
        // dedup key (a durable write). Any other repeat finds the ledger already holding what it says and writes
        // nothing (`unchanged` below), which is the cheaper proof.
        let key = (s.error_code != 0).then(|| webhook::status_dedup_key(&s.wamid, status));
        if let Some(key) = &key
            && self.seen(key).await?
        {
            self.metrics.duplicate("status");
            return Ok(());
        }
        let named = Self::names_operation(s);
        let found = self.operation_of(s, named).await?;
        // Counted once the status is handled (a retry after a ledger error is not counted twice).
        self.metrics.callback_data(status_label(status), named);
        let Some(op) = found else {
            // Not sent through Breakwater (or its ledger entry expired), or, for a status without
            // biz_opaque_callback_data, sent while `dispatch.wamid_link` was off.
            if !named && status == DeliveryStatus::Failed {
                // A wamid encodes the recipient's number: only its hash is logged.
                tracing::warn!(
                    wamid_sha256 = %bw_common::ledger::wamid_key(&s.wamid),
                    code = s.error_code,
                    "a failed status without biz_opaque_callback_data matched no operation: if it was sent through \
                     Breakwater, its entry stays SENT; keep dispatch.wamid_link on (deploy/runbooks/wamid-link.md)"
                );
                self.metrics.status("unmatched_failed");
            } else {
                self.metrics.status("unmatched");
            }
            if let Some(key) = &key {
                self.mark(key).await;
            }
            return Ok(());
        };
        // A failed status is matched to its own attempt and classified by the one table: only a permanent code
        // of the current attempt reaches the FAILED transition below (asyncfail.rs).
        if status == DeliveryStatus::Failed && self.failed_status(s, &op).await? == crate::asyncfail::Step::Done {
            if s.error_code != 0 {
                self.status_signals(s, &op).await;
            }
            if let Some(key) = &key {
                self.mark(key).await;
            }
            return Ok(());
        }
        let wamid = s.wamid.clone();
        let code = s.error_code;
        // Whether the write that landed moved the operation out of UNKNOWN, and whether the entry already held
        // everything this status says (a repeat: nothing written), as of the closure's last run.
        let mut from_unknown = false;
        let mut unchanged = false;
        let stored = self
            .ledger
            .update(&op, |cur| {
                from_unknown = false;
                unchanged = false;
                let cur = cur?;
                if target == OperationState::Sent
                    && cur.state() == OperationState::Queued
                    && cur.async_failures > 0
                    && cur.wamid == wamid
                {
                    // A late "sent" of an attempt already queued again: the new attempt must still go.
                    return None;
                }
                let mut next = cur.clone();
                if next.wamid.is_empty() {
                    next.wamid = wamid.clone();
                }
                if let Some(reason) = conflicting_fact(cur.state(), target, code) {
                    // The first terminal fact stays; the other is recorded beside it (once).
                    if cur.reason.contains(&reason) {
                        return None;
                    }
                    next.reason = if cur.reason.is_empty() { reason } else { format!("{}; {reason}", cur.reason) };
                    if target == OperationState::Failed {
                        next.last_code = code;
                    }
                    return Some(next);
                }
                next.set_state(target);
                from_unknown = cur.state() == OperationState::Unknown;
                if target == OperationState::Failed {
                    next.last_code = code;
                    next.reason = format!("failed status: {code}");
                } else if cur.state() == OperationState::Unknown {
                    next.reason = format!("unknown outcome resolved by a {} status", status_label(status));
                }
                unchanged = next == *cur;
                (!unchanged).then_some(next)
            })
            .await?;
        match stored {
            None => self.metrics.status("unmatched"),
            Some(_) if unchanged => self.metrics.duplicate("status"),
            Some(entry) if entry.state() == target => {
                self.metrics.status(status_label(status));
                tracing::debug!(operation_id = %op, status = status_label(status), "status applied");
                if from_unknown {
                    // Meta sends no trace context, so this delivery is its own trace: a child span with the
                    // operation id and a span link to the operation's trace (its ingest span, from the ledger),
                    // which the reconciler's `resolved` span closes.
                    let resolved = tracing::info_span!("ingest.resolve_unknown", operation_id = %op, status = status_label(status));
                    bw_common::telemetry::link_to(&resolved, &entry.traceparent);
                    let _resolved = resolved.entered();
                }
            }
            Some(entry) if conflicting_fact(entry.state(), target, code).is_some() => {
                self.metrics.status("conflict");
                tracing::info!(
                    operation_id = %op,
                    status = status_label(status),
                    kept = entry.state().label(),
                    "status contradicts the first terminal fact; recorded, not applied"
                );
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
            self.status_signals(s, &op).await;
        }
        if let Some(key) = &key {
            self.mark(key).await;
        }
        Ok(())
    }

    /// The signals of a status's error code, with its operation's WABA.
    async fn status_signals(&self, s: &StatusUpdate, op: &str) {
        let waba = match self.ledger.get(op).await {
            Ok(Some(v)) => v.entry.waba_id,
            _ => String::new(),
        };
        self.signals(&waba, &s.phone_number_id, s.error_code, &s.error_title, op).await;
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
        if let Some(windows) = &self.windows {
            windows.record(m).await;
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
            if let Some(rate) = &self.inbound_rate {
                rate.count(m).await;
            }
        }
        self.mark(&key).await;
        Ok(())
    }

    async fn value_error(&self, e: &ValueError) {
        tracing::warn!(code = e.code, phone_number_id = %e.phone_number_id, "webhook carries an account-level error");
        self.signals(&e.waba_id, &e.phone_number_id, e.code, &e.title, "").await;
    }

    /// Publishes `status_error` (always) and `credentials` (for codes that hold a token, WABA or number) signals.
    async fn signals(&self, waba: &str, phone: &str, code: i64, title: &str, op: &str) {
        let mut kinds = vec!["status_error"];
        if classify_code(code) == ErrorClass::Hold {
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
