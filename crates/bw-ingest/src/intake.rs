//! Producer intake: validate a send request, store it durably in BW_SEND and create its ledger entry, or
//! keep the rejected input in BW_REJECTED. Shared by the NATS request/reply listener and the HTTP route.
//!
//! Tenancy: the tenant of a request is the sender registry's owner of its number (on NATS the subject's number;
//! over HTTP the key's tenant, which must own it), never anything the request says; the request's waba_id must be
//! the registered one. A NATS reply goes only under the tenant's inbox prefix (`tenancy::reply_allowed`): a
//! request naming any other reply subject is not processed at all, since ingest's user may publish to internal
//! subjects (the ledger's KV) and the requester chooses the subject. The accepted request's `operation_id` is
//! replaced by its operation key (`tenancy::operation_key`), which everything after this module uses; replies
//! show the producer its own id.
//!
//! Order on acceptance: ledger check (a retry after the dedup window) → for a category that keeps per-recipient
//! order, registration in the recipient's order set (`bw_breaker::OrderBook`; a failure refuses the request as
//! UNAVAILABLE, a retry keeps its first place) → publish to BW_SEND with
//! `Nats-Msg-Id = operation id` (a retry inside the window is dropped by JetStream) → ledger create (QUEUED).
//! A crash between the publish and the ledger create is healed by the producer's retry (duplicate publish,
//! then the create) or by the dispatcher, which creates a missing entry.
//!
//! Category: a template Meta moved to MARKETING is accepted as marketing, on the marketing lane, with the reason
//! in its ledger entry ([`crate::template_category`]; the producer's category stands while Redis is down).
//!
//! Limits before work: a NATS payload over `intake.max_request_bytes` is refused as OVERSIZE before it is
//! decoded; a new operation is refused with STORAGE_FULL while BW_SEND or the ledger is near full
//! ([`crate::capacity`]).

use crate::metrics::Metrics;
use crate::validate::{self, Limits, Rejection};
use async_nats::HeaderMap;
use async_nats::jetstream;
use bw_common::ledger::Ledger;
use bw_common::registry::{Owner, RegistryView, SenderRefusal};
use bw_common::time::now_ms;
use bw_proto::v1::{IntakeReply, OperationState, RejectReason, RejectedRequest, SendRequest};
use bw_wire::names;
use bw_wire::tenancy::{self, TenancyMode};
use futures::StreamExt;
use prost::Message as _;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

/// Where a request came from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Source<'a> {
    /// NATS: the subject it arrived on.
    Nats {
        subject: &'a str,
    },
    Http,
}

impl Source<'_> {
    fn label(&self) -> &'static str {
        match self {
            Source::Nats { .. } => "nats",
            Source::Http => "http",
        }
    }

    /// The phone number id token of the subject (None for HTTP).
    fn subject_phone(&self) -> Option<&str> {
        match self {
            Source::Nats { subject } => Some(subject.strip_prefix(INTAKE_PREFIX.as_str()).unwrap_or("")),
            Source::Http => None,
        }
    }
}

/// Who sends a request, as far as tenancy goes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Caller<'a> {
    /// NATS: the owner of the subject's number is the tenant (looked up before the reply subject was checked;
    /// None when the registry could not be read then).
    Subject(Option<&'a Owner>),
    /// HTTP: the key's tenant, which must own the number (None: authentication disabled, whoever owns it).
    Key(Option<&'a str>),
}

static INTAKE_PREFIX: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| names::intake_subject(""));

/// Bytes of a rejected input kept in its BW_REJECTED record when the whole input does not fit in one.
pub(crate) const KEPT_PREFIX: usize = 4096;

/// Per-recipient order: the order book and which categories keep order.
pub(crate) struct Order {
    pub book: bw_breaker::OrderBook,
    pub cfg: OrderConfig,
}

/// Per-recipient order (see `bw_breaker::order`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderConfig {
    /// Categories whose messages to one recipient reach Meta in the order ingest accepted them (by label:
    /// "authentication", "transactional", "support", "marketing").
    pub keep: Vec<String>,
    /// An order set lives this long after its last registration.
    pub ttl_ms: u64,
}

impl OrderConfig {
    /// Whether messages of `category` keep order.
    pub fn keeps(&self, category: bw_proto::v1::Category) -> bool {
        self.keep.iter().any(|k| k == category.label())
    }
}

/// The intake pipeline; cheap to share behind an `Arc`.
pub(crate) struct Intake {
    /// None: no category keeps order (or ingest runs without Redis).
    pub order: Option<Order>,
    pub js: jetstream::Context,
    /// Which BW_SEND partition each sender's requests go to.
    pub send: names::SendPartitions,
    pub ledger: Ledger,
    pub limits: Limits,
    pub metrics: Metrics,
    pub bodies: crate::bodies::Bodies,
    /// Who owns which sender (every number the tenant `default`'s in dev mode).
    pub registry: RegistryView,
    pub tenancy: TenancyMode,
    /// How full BW_SEND and the ledger are.
    pub capacity: Arc<crate::capacity::Capacity>,
    /// Meta's category of templates (None: ingest runs without Redis, the producer's category stands).
    pub templates: Option<crate::template_category::TemplateCategory>,
}

/// Decodes a protobuf `SendRequest`. A body carrying both `text` and `template` is refused like the JSON
/// intake refuses it (protobuf decoding alone would silently keep the last one).
pub(crate) fn decode(raw: &[u8]) -> Result<SendRequest, Rejection> {
    let request = SendRequest::decode(raw)
        .map_err(|e| Rejection::new(RejectReason::Undecodable, format!("body is not a protobuf SendRequest: {e}")))?;
    if validate::has_both_payloads(raw) {
        return Err(validate::both_payloads());
    }
    Ok(request)
}

fn reply_rejected(operation_id: &str, rejection: &Rejection) -> IntakeReply {
    IntakeReply {
        accepted: false,
        operation_id: operation_id.to_string(),
        duplicate: false,
        reason: rejection.reason as i32,
        error: rejection.error.clone(),
    }
}

/// The precise rejection of a sender the caller may not use. Sender ids are Meta's ids, not personal data.
fn sender_rejection(refusal: SenderRefusal, phone_number_id: &str) -> Rejection {
    match refusal {
        SenderRefusal::NotRegistered => Rejection::new(
            RejectReason::SenderNotRegistered,
            format!(
                "phone_number_id {phone_number_id} is not in the sender registry; an operator registers it to \
                 its tenant with `bwctl senders add`"
            ),
        ),
        SenderRefusal::NotOwned => Rejection::new(
            RejectReason::SenderNotOwned,
            format!("phone_number_id {phone_number_id} is not one of this API key's tenant's senders"),
        ),
        SenderRefusal::WabaMismatch => Rejection::new(
            RejectReason::WabaMismatch,
            format!("waba_id is not the WABA registered for phone_number_id {phone_number_id}"),
        ),
    }
}

fn reply_accepted(operation_id: &str, duplicate: bool) -> IntakeReply {
    IntakeReply { accepted: true, operation_id: operation_id.to_string(), duplicate, ..Default::default() }
}

impl Intake {
    /// Handles raw protobuf bytes (NATS, or HTTP with a protobuf body). Input over the size limit is refused
    /// before it is decoded (decoding is the costly part, and its operation id is not needed to refuse it).
    pub(crate) async fn handle_bytes(
        &self,
        raw: &[u8],
        source: Source<'_>,
        caller: Caller<'_>,
        span: &tracing::Span,
    ) -> IntakeReply {
        if raw.len() > self.limits.max_request_bytes {
            let r = validate::oversize(raw.len(), &self.limits);
            return self.reject(raw, source, "", r).await;
        }
        match decode(raw) {
            Ok(request) => self.handle(request, raw, raw.len(), source, caller, span).await,
            Err(r) => self.reject(raw, source, "", r).await,
        }
    }

    /// Handles a decoded request. `raw` is kept for BW_REJECTED; `encoded_len` is checked against the limit.
    pub(crate) async fn handle(
        &self,
        request: SendRequest,
        raw: &[u8],
        encoded_len: usize,
        source: Source<'_>,
        caller: Caller<'_>,
        span: &tracing::Span,
    ) -> IntakeReply {
        span.record("operation_id", request.operation_id.as_str());
        match validate::validate(&request, source.subject_phone(), encoded_len, &self.limits, now_ms()) {
            Ok(category) => {
                let owner = match caller {
                    // The subject's number is the body's (validated): its owner is already known.
                    Caller::Subject(Some(owner)) if !self.registry.is_dev() => Ok(owner.clone()),
                    _ => self.registry.owner(&request.phone_number_id, &request.waba_id).await,
                };
                let owner = match owner {
                    Ok(o) => o,
                    Err(e) => {
                        tracing::warn!(error = %e, "sender registry unavailable at intake");
                        return self.unavailable(source, &request.operation_id, "sender registry unavailable");
                    }
                };
                let tenant = match caller {
                    Caller::Subject(_) => None,
                    Caller::Key(tenant) => tenant,
                };
                match owner.admit(tenant, &request.waba_id) {
                    Ok(tenant) => self.accept(request, tenant, category, source, span).await,
                    Err(refusal) => {
                        let r = sender_rejection(refusal, &request.phone_number_id);
                        self.reject(raw, source, &request.operation_id, r).await
                    }
                }
            }
            Err(r) => {
                let op = if bw_wire::tenancy::valid_operation_id(&request.operation_id) {
                    request.operation_id.clone()
                } else {
                    String::new()
                };
                self.reject(raw, source, &op, r).await
            }
        }
    }

    /// Keeps the input in BW_REJECTED and answers the rejection.
    pub(crate) async fn reject(&self, raw: &[u8], source: Source<'_>, op: &str, r: Rejection) -> IntakeReply {
        self.keep_rejected(raw, raw.len() as u64, source, op, r).await
    }

    /// Rejects input that was not read whole (an HTTP body over the cap): `prefix` is what was kept of it,
    /// `size` its size as declared or as read so far.
    pub(crate) async fn reject_cut(&self, prefix: &[u8], size: u64, source: Source<'_>, r: Rejection) -> IntakeReply {
        self.keep_rejected(prefix, size, source, "", r).await
    }

    /// Keeps the input in BW_REJECTED (whole when it fits in one record, else its first [`KEPT_PREFIX`] bytes,
    /// with its size) and answers the rejection.
    async fn keep_rejected(&self, raw: &[u8], size: u64, source: Source<'_>, op: &str, r: Rejection) -> IntakeReply {
        let reason = r.reason.as_str_name();
        self.metrics.intake(source.label(), "rejected", reason);
        tracing::info!(reason, error = %r.error, source = source.label(), "request rejected");
        let (stream_source, origin) = match source {
            Source::Nats { subject } => {
                let phone = source.subject_phone().filter(|p| validate::is_digits(p)).unwrap_or("unknown");
                (phone.to_string(), subject.to_string())
            }
            Source::Http => ("http".to_string(), "http".to_string()),
        };
        // Input too large for one record keeps its first bytes and its size. It never goes to the large-body
        // store: a producer's flood of oversized input must not fill the bucket Meta's deliveries need.
        let raw = if self.bodies.fits_inline(raw.len()) { raw } else { &raw[..raw.len().min(KEPT_PREFIX)] };
        let record = RejectedRequest {
            raw: raw.to_vec(),
            source: origin,
            reason: r.reason as i32,
            error: r.error.clone(),
            at_unix_ms: now_ms(),
            raw_size: size,
        };
        let stored = bw_common::nats::publish_durable(
            &self.js,
            names::rejected_subject(&stream_source),
            HeaderMap::new(),
            record.encode_to_vec().into(),
        )
        .await;
        if let Err(e) = stored {
            // The producer still gets the precise rejection; only the inspection copy is missing.
            tracing::warn!(error = %e, "rejected request not kept in BW_REJECTED");
        }
        reply_rejected(op, &r)
    }

    /// Refuses a new operation while its storage is near full (nothing is stored, not even in BW_REJECTED).
    fn storage_full(&self, source: Source<'_>, op: &str, why: String) -> IntakeReply {
        self.metrics.intake(source.label(), "rejected", RejectReason::StorageFull.as_str_name());
        tracing::warn!(reason = %why, "request refused: storage near full");
        reply_rejected(op, &Rejection::new(RejectReason::StorageFull, why))
    }

    fn unavailable(&self, source: Source<'_>, op: &str, what: &str) -> IntakeReply {
        self.metrics.intake(source.label(), "rejected", RejectReason::Unavailable.as_str_name());
        let r = Rejection::new(RejectReason::Unavailable, format!("{what}; retry with the same operation_id"));
        reply_rejected(op, &r)
    }

    /// Whether a reply to `reply` may be published for a request of `tenant` (None: not known, the sender is
    /// not registered or the registry unreadable: then only the dev rule's inboxes, and the answer carries
    /// nothing of any tenant).
    pub(crate) fn reply_allowed(&self, tenant: Option<&str>, reply: &str) -> bool {
        match tenant {
            Some(t) => tenancy::reply_allowed(self.tenancy, t, reply),
            None => tenancy::reply_allowed(TenancyMode::Dev, tenancy::DEFAULT_TENANT, reply),
        }
    }

    /// Counts and logs a request whose reply subject is not the requester's inbox: it is not processed. Only the
    /// subject's first token is logged (the rest may name an operation or a number).
    pub(crate) fn refuse_reply(&self, source: &'static str, reply: &str) {
        self.metrics.reply_refused(source);
        tracing::warn!(
            source,
            reply_head = tenancy::subject_head(reply),
            "request refused: its reply subject is not under the requester's inbox prefix; not processed"
        );
    }

    /// `request` is valid and its sender is `tenant`'s: stored under its operation key.
    async fn accept(
        &self,
        mut request: SendRequest,
        tenant: &str,
        mut category: bw_proto::v1::Category,
        source: Source<'_>,
        span: &tracing::Span,
    ) -> IntakeReply {
        // The producer's own id answers the producer; the key identifies the operation everywhere inside.
        let op = request.operation_id.clone();
        let key = tenancy::operation_key(tenant, &op);
        request.operation_id = key.clone();
        match self.ledger.get(&key).await {
            Ok(Some(_)) => {
                self.metrics.intake(source.label(), "duplicate", "");
                return reply_accepted(&op, true);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "ledger unavailable at intake");
                return self.unavailable(source, &op, "ledger unavailable");
            }
        }
        // A retry of an accepted operation was answered above; a new one waits while storage is near full.
        if let Some(why) = self.capacity.refusal(&self.send.stream_of(&request.phone_number_id)) {
            return self.storage_full(source, &op, why);
        }
        // Meta's category of the template wins over the producer's: it decides the lane, the order and the budget.
        let mut moved = None;
        if let Some(templates) = &self.templates {
            moved = templates.moved_to_marketing(&request, category, &self.metrics).await;
            if moved.is_some() {
                category = bw_proto::v1::Category::Marketing;
                request.set_category(category);
            }
        }
        // Registered before it is stored, so no dispatcher can see a later message of the recipient before this
        // one is in the set. Never the producer's word: only ingest sets keeps_order.
        request.keeps_order = false;
        let mut accepted_at = now_ms();
        if let Some(order) = self.order.as_ref().filter(|o| o.cfg.keeps(category)) {
            let scope = bw_breaker::Scope::new(&request.waba_id, &request.phone_number_id);
            let recipient_key = bw_common::mask::recipient_key(&request.recipient);
            match order.book.register(&scope, &recipient_key, &key).await {
                // The order set's place is the acceptance time: a retry after a timed-out registration keeps its
                // first place, so its ledger time must too, or a correctly ordered pair reads as out of order.
                Ok(r) if r.score_us > 0 => accepted_at = accepted_at.min(r.score_us / 1000),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "order set unavailable at intake");
                    return self.unavailable(source, &op, "order could not be recorded");
                }
            }
            request.keeps_order = true;
        }
        request.accepted_at_unix_ms = accepted_at;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", key.as_str());
        bw_wire::trace::inject(span, &mut headers);
        let subject = self.send.outbox_subject(names::Lane::for_category(category), &request.phone_number_id);
        let duplicate =
            match bw_common::nats::publish_durable(&self.js, subject, headers, request.encode_to_vec().into()).await {
                Ok(d) => d,
                Err(e) if e.stream_full() => {
                    let why = format!("BW_SEND refused the request ({e}); retry later with the same operation_id");
                    return self.storage_full(source, &op, why);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "send request not stored");
                    return self.unavailable(source, &op, "request could not be stored");
                }
            };
        let mut entry = bw_common::ledger::entry_for(&request, OperationState::Queued);
        entry.category = category as i32;
        entry.accepted_at_unix_ms = accepted_at;
        entry.updated_at_unix_ms = accepted_at;
        entry.traceparent = bw_common::telemetry::traceparent(span);
        if let Some(reason) = moved {
            entry.reason = reason;
        }
        // On a JetStream duplicate the first try may have died before this create: do it anyway (idempotent).
        if let Err(e) = self.ledger.create(&entry).await {
            tracing::warn!(error = %e, "ledger entry not created");
            return self.unavailable(source, &op, "ledger unavailable");
        }
        self.metrics.intake(source.label(), if duplicate { "duplicate" } else { "accepted" }, "");
        tracing::debug!(
            phone_number_id = %request.phone_number_id,
            recipient = %bw_common::mask::phone(&request.recipient),
            category = category.label(),
            duplicate,
            "request accepted"
        );
        reply_accepted(&op, duplicate)
    }
}

/// Subscribes to `bw.send.v1.*` in the ingest queue group. Done before the service reports ready (and flushed
/// then), so a ready ingest has producers' requests routed to it.
pub(crate) async fn subscribe_nats(nats: &async_nats::Client) -> anyhow::Result<async_nats::Subscriber> {
    nats.queue_subscribe(names::INTAKE_WILDCARD, names::INTAKE_QUEUE_GROUP.to_string())
        .await
        .map_err(|e| anyhow::anyhow!("cannot subscribe to {}: {e}", names::INTAKE_WILDCARD))
}

/// Serves the intake subscription (see [`subscribe_nats`]) until `shutdown`, with at most `max_in_flight`
/// requests handled at once.
pub(crate) async fn serve_nats(
    mut sub: async_nats::Subscriber,
    intake: Arc<Intake>,
    nats: async_nats::Client,
    max_in_flight: usize,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1)));
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = sub.next() => match next {
                Some(m) => m,
                None => break,
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        let intake = intake.clone();
        let nats = nats.clone();
        tracker.spawn(async move {
            let _permit = permit;
            let source = Source::Nats { subject: msg.subject.as_str() };
            // The tenant decides where a reply may go, so it is known before anything else is done.
            let owner = match intake.registry.owner(source.subject_phone().unwrap_or(""), "").await {
                Ok(o) => Some(o),
                Err(e) => {
                    tracing::warn!(error = %e, "sender registry unavailable at intake");
                    None
                }
            };
            if let Some(to) = &msg.reply
                && !intake.reply_allowed(owner.as_ref().and_then(Owner::tenant), to)
            {
                intake.refuse_reply("intake", to);
                return;
            }
            let span = tracing::info_span!("ingest.intake", source = "nats", operation_id = tracing::field::Empty);
            bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
            let reply = intake
                .handle_bytes(&msg.payload, source, Caller::Subject(owner.as_ref()), &span)
                .instrument(span.clone())
                .await;
            if let Some(to) = msg.reply
                && let Err(e) = nats.publish(to, reply.encode_to_vec().into()).await
            {
                tracing::debug!(parent: &span, error = %e, "intake reply not sent; the producer will retry");
            }
        });
    }
    let _ = sub.unsubscribe().await;
    Ok(())
}
