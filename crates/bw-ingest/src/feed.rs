//! Outcome feed and status query for producers.
//!
//! Design (needs no change in other services): the feed publisher is a durable pull consumer
//! ([`FEED_CONSUMER`]) on the stream behind the ledger KV bucket (`KV_BW_LEDGER`; one per partition with
//! `nats.ledger_partitions` > 1, each publisher reading every partition), shared by every ingest
//! instance. Each ledger revision becomes one [`OutcomeEvent`] published to [`FEED_STREAM`] on
//! `bw.feed.v1.<tenant>.<phone_number_id>.<operation_id>` (`tenancy::feed_subject`: the tenant and the producer's
//! own id, both taken from the ledger key) with `Nats-Msg-Id = <operation key>.<revision>`: a redelivery
//! after a crash, or two instances racing, store it once. Then the revision is acked. The consumer is created
//! with "new revisions only", so a first start does not replay the whole ledger; after that it resumes where
//! it stopped. BW_LEDGER keeps one revision per key: an entry that changes again before the publisher reads it
//! is published at its newer revision only (the latest state of every operation always reaches the feed; a lag
//! can coalesce intermediate states).
//!
//! Events carry no recipient and no body (the ledger has neither). The status query (`bw.status.v1.<phone>`,
//! NATS request/reply, and `GET /v1/messages/{operation_id}`) answers the current entry and its journey: the
//! events the feed holds for the operation, oldest first. It answers only the asking tenant's operations: the
//! tenant of the subject's number (or of the HTTP key) scopes the id into its operation key, and the answer goes
//! only to the tenant's inbox (a query naming another reply subject is not answered at all).

use crate::metrics::Metrics;
use async_nats::jetstream::{self, consumer, stream};
use bw_common::disposition::{Label, Settle, apply};
use bw_common::ledger::Ledger;
use bw_common::registry::Owner;
use bw_proto::v1::{LedgerEntry, OperationState, OutcomeEvent, OutcomeKind, StatusQuery, StatusReply};
use bw_wire::tenancy;
use futures::StreamExt;
use prost::Message as _;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Durable consumer of the feed publisher on the ledger's stream.
pub use bw_wire::names::FEED_CONSUMER;
/// The feed stream.
pub use bw_wire::names::FEED_STREAM;
/// Sender token of an operator's status query (bwctl): answers for any sender. NATS accounts keep it from
/// producers (deploy/nats/).
pub use bw_wire::names::STATUS_ANY;
/// Subject of the status query, one token per sender; [`STATUS_ANY`] asks without naming the sender (operators).
pub use bw_wire::names::STATUS_WILDCARD;
/// Longest journey returned.
const MAX_JOURNEY: usize = 500;

/// The status query subject of a sender.
pub fn status_subject(phone_number_id: &str) -> String {
    bw_wire::names::status_subject(phone_number_id)
}

/// What the producer reads from an entry.
pub fn kind_of(entry: &LedgerEntry) -> OutcomeKind {
    match entry.state() {
        OperationState::Queued if entry.in_flight_since_unix_ms > 0 => OutcomeKind::Sending,
        OperationState::Queued if entry.replays > 0 => OutcomeKind::Replayed,
        OperationState::Queued if entry.transient_failures > 0 => OutcomeKind::Retrying,
        OperationState::Queued | OperationState::Unspecified => OutcomeKind::Accepted,
        OperationState::Sent | OperationState::Delivered | OperationState::Read
            if entry.flagged_unknown && entry.reason.starts_with("unknown outcome resolved") =>
        {
            OutcomeKind::Resolved
        }
        OperationState::Sent => OutcomeKind::Sent,
        OperationState::Delivered => OutcomeKind::Delivered,
        OperationState::Read => OutcomeKind::Read,
        OperationState::Failed => OutcomeKind::Failed,
        OperationState::Dlq => OutcomeKind::DeadLettered,
        OperationState::Quarantined => OutcomeKind::Quarantined,
        OperationState::Expired => OutcomeKind::Expired,
        OperationState::Unknown => OutcomeKind::Unknown,
        OperationState::Held => OutcomeKind::Held,
    }
}

/// The event of one ledger revision: the producer's own operation id and its tenant, from the entry's key.
pub fn event_of(entry: &LedgerEntry, revision: u64) -> OutcomeEvent {
    let (tenant, operation_id) = tenancy::split_operation_key(&entry.operation_id);
    OutcomeEvent {
        operation_id: operation_id.to_string(),
        tenant: tenant.to_string(),
        revision,
        kind: kind_of(entry) as i32,
        state: entry.state,
        waba_id: entry.waba_id.clone(),
        phone_number_id: entry.phone_number_id.clone(),
        category: entry.category,
        wamid: entry.wamid.clone(),
        meta_code: entry.last_code,
        reason: entry.reason.clone(),
        incident_id: entry.incident_id.clone(),
        attempts: entry.attempts,
        replays: entry.replays,
        flagged_unknown: entry.flagged_unknown,
        accepted_at_unix_ms: entry.accepted_at_unix_ms,
        at_unix_ms: entry.updated_at_unix_ms,
        trace_id: bw_common::telemetry::trace_id_of(&entry.traceparent),
    }
}

/// Creates (or binds to) the feed stream, with a byte limit of `max_bytes` (applied to an existing stream too).
/// At its limits the oldest events go (DiscardOld), as they do after 7 days: the feed is a view of the ledger,
/// which stays the record (the status query), and a full feed must never stall the ledger's publisher.
pub(crate) async fn ensure_stream(js: &jetstream::Context, replicas: usize, max_bytes: i64) -> anyhow::Result<()> {
    let config = stream::Config {
        name: FEED_STREAM.to_string(),
        description: Some("Breakwater outcome feed: one event per ledger revision, per sender".into()),
        subjects: vec![bw_wire::names::FEED_ALL.to_string()],
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: Duration::from_secs(7 * 24 * 3600),
        max_messages: 50_000_000,
        max_bytes,
        duplicate_window: Duration::from_secs(120),
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        ..Default::default()
    };
    let stream = js
        .get_or_create_stream(config.clone())
        .await
        .map_err(|e| anyhow::anyhow!("cannot create stream {FEED_STREAM}: {e}"))?;
    if let Err(e) = bw_common::nats::apply_stream_limits(js, stream.cached_info(), &config).await {
        crate::capacity::limits_not_applied(FEED_STREAM, &format!("{e:#}"));
    }
    Ok(())
}

/// Creates (or binds to) the feed publisher's durable consumer on the stream of one ledger partition's bucket.
pub(crate) async fn consumer(
    js: &jetstream::Context,
    ledger: &jetstream::kv::Store,
    max_in_flight: usize,
) -> anyhow::Result<consumer::pull::Stream> {
    let stream = js.get_stream(&ledger.stream_name).await?;
    let config = consumer::pull::Config {
        durable_name: Some(FEED_CONSUMER.to_string()),
        deliver_policy: consumer::DeliverPolicy::New,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_secs(30),
        max_deliver: -1,
        max_ack_pending: (max_in_flight * 64).max(1024) as i64,
        ..Default::default()
    };
    let consumer = stream.get_or_create_consumer(FEED_CONSUMER, config).await?;
    Ok(consumer.stream().max_messages_per_batch(max_in_flight.max(1)).messages().await?)
}

/// What became of one ledger revision (the `result` label of `bw_feed_events_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// Published (or already, by another instance).
    Event,
    /// A delete or purge of a ledger key: nothing to tell.
    Deleted,
    /// Not a ledger entry (never written by Breakwater): skipped.
    Undecodable,
    /// The feed stream did not take it: redelivered later.
    Retry,
}

impl Label for Published {
    fn label(self) -> &'static str {
        match self {
            Published::Event => "published",
            Published::Deleted => "deleted",
            Published::Undecodable => "undecodable",
            Published::Retry => "retry",
        }
    }
}

/// Publishes ledger revisions to the feed.
pub(crate) struct Publisher {
    pub js: jetstream::Context,
    pub metrics: Metrics,
}

impl Publisher {
    pub(crate) async fn handle(&self, msg: jetstream::Message) {
        let span = tracing::debug_span!("ingest.feed", result = tracing::field::Empty);
        let settle = self.settle(&msg).await;
        apply(&msg, settle, &span, |label| self.metrics.feed(label)).await;
    }

    async fn settle(&self, msg: &jetstream::Message) -> Settle<Published> {
        let deleted = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("KV-Operation"))
            .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
        if deleted || msg.payload.is_empty() {
            return Settle::ack(Published::Deleted);
        }
        let Ok(entry) = LedgerEntry::decode(msg.payload.as_ref()) else {
            return Settle::ack(Published::Undecodable);
        };
        let revision = msg.info().map(|i| i.stream_sequence).unwrap_or(0);
        let event = event_of(&entry, revision);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{}.{revision}", entry.operation_id).as_str());
        let subject = tenancy::feed_subject(&event.tenant, &entry.phone_number_id, &event.operation_id);
        match bw_common::nats::publish_durable(&self.js, subject, headers, event.encode_to_vec().into()).await {
            Ok(_) => Settle::ack(Published::Event),
            Err(e) => {
                tracing::warn!(operation_id = %entry.operation_id, error = %e, "feed event not stored; retrying");
                Settle::nak(Published::Retry, Duration::from_secs(1))
            }
        }
    }
}

/// The events the feed holds for an operation (its key's tenant and id), oldest first (at most [`MAX_JOURNEY`]).
pub(crate) async fn journey(
    js: &jetstream::Context,
    phone_number_id: &str,
    key: &str,
) -> Result<Vec<OutcomeEvent>, String> {
    let (tenant, operation_id) = tenancy::split_operation_key(key);
    let stream = js.get_stream(FEED_STREAM).await.map_err(|e| format!("feed unavailable: {e}"))?;
    let config = consumer::pull::Config {
        filter_subject: tenancy::feed_subject(tenant, phone_number_id, operation_id),
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::None,
        inactive_threshold: Duration::from_secs(30),
        ..Default::default()
    };
    let mut c = stream.create_consumer(config).await.map_err(|e| format!("feed unavailable: {e}"))?;
    let pending = c.info().await.map_err(|e| format!("feed unavailable: {e}"))?.num_pending as usize;
    let mut out = Vec::new();
    if pending > 0 {
        let want = pending.min(MAX_JOURNEY);
        let mut batch = c
            .fetch()
            .max_messages(want)
            .expires(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| format!("feed unavailable: {e}"))?;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| format!("feed unavailable: {e}"))?;
            if let Ok(ev) = OutcomeEvent::decode(m.payload.as_ref()) {
                out.push(ev);
            }
        }
    }
    let name = c.cached_info().name.clone();
    let _ = stream.delete_consumer(&name).await;
    Ok(out)
}

/// Answers a status query for `tenant`'s `operation_id` (its own id; None: an operator, who names the operation
/// key). `sender` is the phone number id the asker may see (None: any).
pub(crate) async fn status(
    ledger: &Ledger,
    js: &jetstream::Context,
    tenant: Option<&str>,
    operation_id: &str,
    sender: Option<&str>,
) -> StatusReply {
    let mut reply = StatusReply { operation_id: operation_id.to_string(), ..Default::default() };
    let key = match tenant {
        Some(t) if bw_wire::tenancy::valid_operation_id(operation_id) => tenancy::operation_key(t, operation_id),
        None if tenancy::valid_operation_key(operation_id) => operation_id.to_string(),
        _ => {
            reply.error = "operation_id must be 1..=128 characters of [A-Za-z0-9_=.-]".into();
            return reply;
        }
    };
    let current = match ledger.get(&key).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "ledger unavailable for a status query");
            reply.error = "ledger unavailable; retry".into();
            return reply;
        }
    };
    let Some(current) = current.filter(|c| sender.is_none_or(|s| s == c.entry.phone_number_id)) else {
        return reply;
    };
    reply.found = true;
    match journey(js, &current.entry.phone_number_id, &key).await {
        Ok(events) => reply.journey = events,
        Err(e) => reply.error = e,
    }
    reply.current = Some(event_of(&current.entry, current.revision));
    reply
}

/// Subscribes to `bw.status.v1.*` (queue group of the intake), before the service reports ready.
pub(crate) async fn subscribe_status(nats: &async_nats::Client) -> anyhow::Result<async_nats::Subscriber> {
    nats.queue_subscribe(STATUS_WILDCARD, bw_wire::names::INTAKE_QUEUE_GROUP.to_string())
        .await
        .map_err(|e| anyhow::anyhow!("cannot subscribe to {STATUS_WILDCARD}: {e}"))
}

/// Who asks a status query on `bw.status.v1.<token>`.
enum Asker {
    /// An operator ([`STATUS_ANY`]): any operation, named by its key.
    Operator,
    /// The tenant owning the subject's number.
    Tenant(String),
    /// The number is not registered, or the registry could not be read: nothing to answer but why.
    Nobody(&'static str),
}

/// Serves the status-query subscription (see [`subscribe_status`]) until `shutdown`.
pub(crate) async fn serve_status(
    mut sub: async_nats::Subscriber,
    intake: Arc<crate::intake::Intake>,
    nats: async_nats::Client,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(64));
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            next = sub.next() => match next { Some(m) => m, None => break },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else { break };
        let (intake, nats) = (intake.clone(), nats.clone());
        tracker.spawn(async move {
            let _permit = permit;
            let token = msg.subject.as_str().rsplit('.').next().unwrap_or("").to_string();
            let asker = if token == STATUS_ANY {
                Asker::Operator
            } else {
                match intake.registry.owner(&token, "").await {
                    Ok(Owner::Known { tenant, .. }) => Asker::Tenant(tenant),
                    Ok(Owner::Unregistered) => Asker::Nobody("phone_number_id is not in the sender registry"),
                    Err(e) => {
                        tracing::warn!(error = %e, "sender registry unavailable for a status query");
                        Asker::Nobody("sender registry unavailable; retry")
                    }
                }
            };
            let tenant = match &asker {
                Asker::Tenant(t) => Some(t.as_str()),
                Asker::Operator | Asker::Nobody(_) => None,
            };
            // Checked before anything is read: a query whose reply subject is not the asker's inbox is not answered.
            if let Some(to) = &msg.reply
                && !intake.reply_allowed(tenant, to)
            {
                intake.refuse_reply("status", to);
                return;
            }
            let reply = match (StatusQuery::decode(msg.payload.as_ref()), &asker) {
                (Err(_), _) => StatusReply { error: "body is not a protobuf StatusQuery".into(), ..Default::default() },
                (Ok(q), Asker::Nobody(why)) => {
                    StatusReply { operation_id: q.operation_id, error: why.to_string(), ..Default::default() }
                }
                (Ok(q), Asker::Operator) => status(&intake.ledger, &intake.js, None, &q.operation_id, None).await,
                (Ok(q), Asker::Tenant(t)) => {
                    status(&intake.ledger, &intake.js, Some(t), &q.operation_id, Some(token.as_str())).await
                }
            };
            if let Some(to) = msg.reply
                && let Err(e) = nats.publish(to, reply.encode_to_vec().into()).await
            {
                tracing::debug!(error = %e, "status reply not sent");
            }
        });
    }
    let _ = sub.unsubscribe().await;
    Ok(())
}
