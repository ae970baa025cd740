//! The move of a work item to its next place, in the order every consumer of a work stream uses: publish to
//! the destination durably (with a deterministic message id) → update the ledger → the caller acks the source.
//!
//! Crash behaviour, step by step:
//! - before the publish lands: nothing changed; the source is redelivered and the move is tried again;
//! - after the publish, before the ledger update: the destination has the item, the ledger still names the
//!   source; the redelivered source repeats the move, JetStream drops the second publish (same message id
//!   within the dedup window) and the ledger update then lands;
//! - after the ledger update, before the ack: the redelivered source finds the ledger naming the destination
//!   and is acked without a second move (each consumer's "already handled" check).
//!
//! Used by the dispatcher (to the DLQ, the quarantine, BW_UNKNOWN) and the reconciler. Moves *out of* the DLQ
//! and the quarantine (`bw_ops::moves`) update the ledger first: there the compare-and-set decides who wins
//! when replay and an operator act on one entry at once, and the publish is repeated on the next pass.

use crate::ledger::{Ledger, LedgerError, Versioned};
use crate::nats::PublishError;
use async_nats::jetstream;
use bw_proto::v1::LedgerEntry;

/// The step a move stopped at; the source must be redelivered.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("publish to the destination failed: {0}")]
    Publish(#[from] PublishError),
    #[error("ledger update failed after the publish: {0}")]
    Ledger(#[from] LedgerError),
}

/// Where a move goes: stream subject, message id and the encoded item.
pub struct Destination {
    pub subject: String,
    pub headers: async_nats::HeaderMap,
    pub payload: bytes::Bytes,
}

/// Publishes `dest` durably, then updates the operation's ledger entry with `update` (compare-and-set from
/// `known` when given). Returns the stored entry; the caller acks its source only on `Ok`.
pub async fn publish_then_record<F>(
    js: &jetstream::Context,
    ledger: &Ledger,
    operation_id: &str,
    known: Option<Versioned>,
    dest: Destination,
    update: F,
) -> Result<Option<LedgerEntry>, MoveError>
where
    F: FnMut(Option<&LedgerEntry>) -> Option<LedgerEntry>,
{
    crate::nats::publish_durable(js, dest.subject, dest.headers, dest.payload).await?;
    Ok(ledger.update_from(operation_id, known, update).await?)
}
