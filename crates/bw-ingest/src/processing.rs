//! The webhook processor's state ([`Processor`]) and its one error ([`Retry`]), in a leaf module: processor.rs
//! (statuses, inbound messages), asyncfail.rs (failed statuses) and signals.rs (account signals) each extend it.

use crate::bodies::Bodies;
use crate::metrics::Metrics;
use async_nats::jetstream::{self, kv};
use bw_common::ledger::{Ledger, LedgerError};
use bw_wire::names;

/// A step failed because the broker was unavailable; the delivery is redelivered later.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Retry(pub(crate) String);

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
    pub bodies: Bodies,
    /// Where a new attempt after an asynchronous failure goes (BW_SEND's partitions, as intake publishes).
    pub send: names::SendPartitions,
    /// Customer service windows opened by inbound messages (`inbound.rs`); absent without Redis.
    pub windows: Option<crate::inbound::Windows>,
    /// Counts forwarded inbound messages against their number's throughput (None: off, or no Redis).
    pub inbound_rate: Option<crate::inbound_rate::InboundRate>,
}
