//! A new attempt of an operation: the one way an operation Meta accepted (or whose outcome was unknown) goes
//! back to the dispatcher. Two callers, each after moving the ledger back to QUEUED with
//! [`crate::ledger::Ledger::reopen`]: ingest, for a `failed` status whose code is not final (Meta did not
//! deliver it, so a new attempt cannot deliver twice), and an operator's `bwctl op resend`. The request is the
//! one the failed attempt sent, kept in its wamid link ([`crate::ledger::WamidLink`]).

use crate::nats::PublishError;
use bw_proto::v1::SendRequest;
use bw_wire::names::{self, Lane, SendPartitions};
use prost::Message as _;

/// The message id of attempt `attempt` of `operation_key` in BW_SEND: a repeated webhook or a repeated command
/// queues the same attempt once (JetStream's dedup window), and the ledger's compare-and-set refuses the rest.
pub fn msg_id(operation_key: &str, attempt: u32) -> String {
    format!("{operation_key}.attempt.{attempt}")
}

/// The message id of an operator's `resend`-th resend of `operation_key` (its own series: never the id of an
/// attempt ingest queued).
pub fn resend_msg_id(operation_key: &str, resend: u32) -> String {
    format!("{operation_key}.resend.{resend}")
}

/// Publishes `request` under `msg_id` ([`msg_id`], [`resend_msg_id`]) to the dispatcher's input on `lane` (ingest:
/// the live lane of its category, as intake; an operator: the replay lane, as every operator move), with the
/// ledger's replay count (the dispatcher takes a copy older than the ledger's last replay as stale). It never
/// keeps order: the recipient's order set released the operation when Meta accepted it, and a later message
/// may already be out. Returns whether the stream already held this attempt (a duplicate).
pub async fn publish(
    js: &async_nats::jetstream::Context,
    send: SendPartitions,
    lane: Lane,
    request: &SendRequest,
    msg_id: &str,
    replays: u32,
) -> Result<bool, PublishError> {
    let mut request = request.clone();
    request.keeps_order = false;
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", msg_id);
    headers.insert(names::REPLAY_HEADER, replays.to_string().as_str());
    let subject = send.outbox_subject(lane, &request.phone_number_id);
    crate::nats::publish_durable(js, subject, headers, request.encode_to_vec().into()).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_attempt_has_its_own_message_id() {
        assert_eq!(super::msg_id("crm/op-1", 2), "crm/op-1.attempt.2");
        assert_ne!(super::msg_id("crm/op-1", 2), super::msg_id("crm/op-1", 3));
        assert_ne!(super::msg_id("crm/op-1", 2), super::resend_msg_id("crm/op-1", 2));
    }
}
