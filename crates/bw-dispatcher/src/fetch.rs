//! Fetching: the lanes' durable pull consumers in BW_SEND, the no-wait fetch bound and the long polls of an
//! idle dispatcher (the loop itself is [`crate::run`]), and [`Worker::prepare`], the checks each fetched message
//! passes before admission (decode, ledger, deadline, registry, async re-entry, gates).

use crate::backoff::RETRY_LATER;
use crate::settle::Outcome;
use crate::worker::{Work, Worker};
use async_nats::jetstream::{
    self,
    consumer::{self, pull},
};
use bw_common::disposition::Settle;
use bw_common::time::now_ms;
use bw_proto::v1::{ErrorInfo, OperationState, QuarantineReason, SendRequest};
use bw_wire::names::{self, Lane};
use futures::StreamExt;
use prost::Message as _;
use std::time::{Duration, Instant};

/// Client-side bound on waiting for the answer to a long-poll pull request.
pub(crate) const FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// Client-side bound on one no-wait fetch of a batch (see the fetch loop in [`crate::run`]).
pub(crate) const FETCH_BOUND: Duration = Duration::from_secs(10);

/// An outstanding long-poll pull request (one message) on a lane.
pub(crate) struct Parked {
    pub(crate) since: tokio::time::Instant,
    pub(crate) batch: pull::Batch,
}

/// Takes the message a parked request received, if any, and clears the slot when the request is over
/// (answered, expired, failed, or unanswered for too long).
pub(crate) fn take_parked(slot: &mut Option<Parked>) -> Option<async_nats::jetstream::Message> {
    use futures::FutureExt;
    let parked = slot.as_mut()?;
    match parked.batch.next().now_or_never() {
        Some(Some(Ok(m))) => {
            *slot = None;
            Some(m)
        }
        Some(_) => {
            *slot = None;
            None
        }
        None => {
            if parked.since.elapsed() > FETCH_TIMEOUT * 2 {
                *slot = None;
            }
            None
        }
    }
}

/// Waits, at most about `idle_wait`, for a message on any lane: every lane without an outstanding long-poll
/// gets one (among the consumers `serving` marks), then the first message to arrive is returned. The other
/// requests stay parked for the next turn.
pub(crate) async fn idle_wait_any(
    consumers: &[(Lane, consumer::Consumer<pull::Config>)],
    serving: &[bool],
    parked: &mut [Option<Parked>],
    idle_wait: Duration,
) -> Option<(Lane, async_nats::jetstream::Message)> {
    use futures::FutureExt;
    for ((slot, (lane, consumer)), serve) in parked.iter_mut().zip(consumers).zip(serving) {
        if slot.is_none() && *serve {
            match tokio::time::timeout(FETCH_TIMEOUT, consumer.batch().max_messages(1).expires(idle_wait).messages())
                .await
            {
                Ok(Ok(batch)) => *slot = Some(Parked { since: tokio::time::Instant::now(), batch }),
                Ok(Err(e)) => tracing::debug!(lane = lane.token(), error = %e, "long poll failed"),
                Err(_) => tracing::debug!(lane = lane.token(), "long poll unanswered"),
            }
        }
    }
    let polls: Vec<_> = parked
        .iter_mut()
        .enumerate()
        .filter_map(|(i, slot)| slot.as_mut().map(|p| async move { (i, p.batch.next().await) }.boxed()))
        .collect();
    if polls.is_empty() {
        return None;
    }
    let ((i, next), _, _) =
        tokio::time::timeout(idle_wait + FETCH_TIMEOUT, futures::future::select_all(polls)).await.ok()?;
    parked[i] = None;
    match next {
        Some(Ok(m)) => Some((consumers[i].0, m)),
        _ => None,
    }
}

/// Creates (or binds to) the durable pull consumer of a lane in BW_SEND (partition 0).
pub async fn lane_consumer(
    js: &async_nats::jetstream::Context,
    lane: Lane,
    ack_wait: Duration,
) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    partition_lane_consumer(js, 0, lane, ack_wait).await
}

/// Creates (or binds to) the durable pull consumer of a lane in one BW_SEND partition (the same name on every
/// partition's stream).
pub async fn partition_lane_consumer(
    js: &async_nats::jetstream::Context,
    partition: usize,
    lane: Lane,
    ack_wait: Duration,
) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(names::SendPartitions::stream(partition)).await?;
    let config = pull::Config {
        durable_name: Some(lane.dispatcher_consumer().to_string()),
        filter_subject: names::SendPartitions::lane_filter(partition, lane),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending: 50_000,
        ..Default::default()
    };
    Ok(stream.get_or_create_consumer(lane.dispatcher_consumer(), config).await?)
}

/// Pending deliveries the held consumer of a partition may have: held messages wait in its pending set between
/// their redeliveries, apart from the lanes' (50,000 each), so a flash sale past its portfolio's messaging limit
/// never stops a lane. Past this many, further held messages wait undelivered in the stream (nothing is lost).
pub(crate) const HELD_MAX_ACK_PENDING: i64 = 1_000_000;

/// Creates (or binds to) the durable pull consumer of the held messages in one BW_SEND partition: the requests
/// the portfolio budget holds, parked out of their lanes (`Worker::park`).
pub async fn held_consumer(
    js: &async_nats::jetstream::Context,
    partition: usize,
    ack_wait: Duration,
) -> anyhow::Result<consumer::Consumer<pull::Config>> {
    let stream = js.get_stream(names::SendPartitions::stream(partition)).await?;
    let config = pull::Config {
        durable_name: Some(names::HELD_CONSUMER.to_string()),
        filter_subject: names::SendPartitions::held_filter(partition),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait,
        max_deliver: -1,
        max_ack_pending: HELD_MAX_ACK_PENDING,
        ..Default::default()
    };
    Ok(stream.get_or_create_consumer(names::HELD_CONSUMER, config).await?)
}

/// The partitions an instance serves: those configured (in order, once each), or every one.
pub(crate) fn served_partitions(configured: &[usize], send: names::SendPartitions) -> Vec<usize> {
    let mut served: Vec<usize> = Vec::new();
    for &p in configured.iter().filter(|p| **p < send.count()) {
        if !served.contains(&p) {
            served.push(p);
        }
    }
    if served.is_empty() { send.all().collect() } else { served }
}

/// Indexes into the consumers (`per_lane` partitions of each lane, lane after lane) in fetch order for turn
/// `turn`: lanes in serving order, and within each lane the partitions starting at `turn mod per_lane`.
pub(crate) fn fetch_order(consumers: usize, per_lane: usize, turn: usize) -> impl Iterator<Item = usize> {
    let per_lane = per_lane.max(1);
    let start = turn % per_lane;
    (0..consumers).map(move |i| {
        let (lane, k) = (i / per_lane, i % per_lane);
        lane * per_lane + (start + k) % per_lane
    })
}

impl Worker {
    /// Decodes, checks the ledger and the deadline. Returns None when the message was already handled here.
    pub(crate) async fn prepare(&self, lane: Lane, msg: jetstream::Message) -> Option<Work> {
        // A held message (parked by the budget gate) keeps the lane it was accepted on.
        let lane = names::SendPartitions::held_lane(&msg.subject).unwrap_or(lane);
        let request = match SendRequest::decode(msg.payload.as_ref()) {
            Ok(r) => r,
            Err(e) => {
                // Ingest validates everything it stores, so this is corruption or a foreign publisher. Keep the
                // bytes for inspection and stop redelivery.
                tracing::error!(subject = %msg.subject, error = %e, "undecodable message in BW_SEND; moved to \
                    BW_REJECTED");
                let settle = if self.reject_raw(&msg, &e.to_string()).await {
                    Settle::term(Outcome::Undecodable)
                } else {
                    Settle::nak(Outcome::MovePending, RETRY_LATER)
                };
                bw_common::disposition::apply(&msg, settle, &tracing::Span::current(), |l| self.metrics.result(l))
                    .await;
                return None;
            }
        };
        let span = tracing::info_span!(
            "dispatch",
            operation_id = %request.operation_id,
            phone_number_id = %request.phone_number_id,
            recipient = %bw_common::mask::phone(&request.recipient),
            lane = lane.token(),
            attempt = tracing::field::Empty,
            decision = tracing::field::Empty,
            breaker_state = tracing::field::Empty,
            result = tracing::field::Empty,
        );
        bw_common::telemetry::set_parent_from(&span, msg.headers.as_ref());
        let versioned = match self.ledger.get(&request.operation_id).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                // Ingest stores the message before the ledger entry; a crash in between leaves this case.
                // Never ack a message whose ledger entry could not be created: it would be in no place at all.
                let _ = self.ledger.create(&bw_common::ledger::entry_for(&request, OperationState::Queued)).await;
                match self.ledger.get(&request.operation_id).await {
                    Ok(Some(v)) => v,
                    _ => {
                        let settle = Settle::nak(Outcome::MovePending, RETRY_LATER);
                        bw_common::disposition::apply(&msg, settle, &span, |l| self.metrics.result(l)).await;
                        return None;
                    }
                }
            }
            Err(e) => {
                tracing::warn!(parent: &span, error = %e, "ledger unavailable; message will be redelivered");
                let settle = Settle::nak(Outcome::MovePending, RETRY_LATER);
                bw_common::disposition::apply(&msg, settle, &span, |l| self.metrics.result(l)).await;
                return None;
            }
        };
        // A copy older than the ledger's last replay (a redelivery of a delivery that already moved the
        // operation to the DLQ, which replay has since taken out again) is stale: the newer copy owns it. Acting
        // on it could dead-letter under the old copy's move id, which the stream deduplicates, leaving the
        // ledger at DLQ with no DLQ entry.
        let copy_replay = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(bw_wire::names::REPLAY_HEADER))
            .and_then(|v| v.as_str().parse::<u32>().ok())
            .unwrap_or(0);
        if versioned.entry.state() != OperationState::Queued || copy_replay < versioned.entry.replays {
            // Already sent, or already moved elsewhere by an earlier delivery of this same message (a crash
            // between the move and the ack). Never send it again.
            span.in_scope(|| tracing::debug!(state = versioned.entry.state().label(), "already handled; acked"));
            // Journal mode: an attempt an earlier owner left open has its outcome now.
            if versioned.entry.state() != OperationState::Queued
                && let Some(part) = self.journal_of(&request.phone_number_id)
                && let Some(abandoned) = part.take_abandoned(&request.operation_id)
            {
                abandoned.resolve();
            }
            bw_common::disposition::apply(&msg, Settle::ack(Outcome::AlreadyHandled), &span, |l| {
                self.metrics.result(l)
            })
            .await;
            return None;
        }
        span.record("attempt", versioned.entry.attempts + 1);
        let in_flight_since = versioned.entry.in_flight_since_unix_ms;
        let work = Work {
            lane,
            msg,
            request,
            ledger: versioned,
            span,
            received: Instant::now(),
            decision: "",
            decided_after: Duration::ZERO,
            waited: Duration::ZERO,
            order_wait: None,
            slot_misses: 0,
            order_polls: 0,
            slot_gap_ms: 0.0,
            on_wire: None,
        };
        if in_flight_since > 0 {
            // An earlier delivery marked this message on the wire and never recorded an outcome (the instance
            // died, or lost the broker, mid-call). Meta may have it: reconcile, do not resend.
            let err = ErrorInfo {
                details: "an earlier try stopped mid-call; outcome unknown".into(),
                at_unix_ms: in_flight_since,
                ..Default::default()
            };
            // That earlier try is over (the ack wait outlasts a call): Meta has it or never will from it, so the
            // messages behind it may go. (Not on a mark conflict: there the other delivery is live.)
            self.release_order(&work).await;
            self.to_unknown(work, err).await;
            return None;
        }
        // Journal mode: the same for a try an earlier owner of the partition journaled without an outcome.
        let mut work = work;
        let part = self.journal_of(&work.request.phone_number_id);
        if let Some(abandoned) = part.and_then(|p| p.take_abandoned(&work.request.operation_id)) {
            work.on_wire = Some(abandoned);
            self.release_order(&work).await;
            self.to_unknown(work, crate::journal::abandoned_error()).await;
            return None;
        }
        // Not sent from a number its tenant no longer holds (removed, moved to another tenant, another WABA).
        match self.registry.revoked(&work.request).await {
            Ok(None) => {}
            Ok(Some(refusal)) => {
                let detail = refusal.revoked_detail(&work.request.phone_number_id);
                tracing::warn!(parent: &work.span, reason = refusal.label(), "{detail}; quarantined");
                self.quarantine_unsent(work, QuarantineReason::SenderRevoked, detail).await;
                return None;
            }
            Err(e) => {
                tracing::warn!(parent: &work.span, error = %e, "sender registry unavailable; redelivered");
                self.settle(&work, Settle::nak(Outcome::MovePending, RETRY_LATER), None).await;
                return None;
            }
        }
        if work.request.deadline_unix_ms > 0 && now_ms() > work.request.deadline_unix_ms {
            self.expire(work, crate::priority::expiry_reason(None)).await;
            return None;
        }
        // A new attempt after an asynchronous failure is first routed as that failure (attempt.rs); an ordinary
        // send, that new attempt's included, then passes the gates.
        let work = self.reenter(work).await?;
        self.gate(work).await
    }
}
