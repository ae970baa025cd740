//! Operations helpers shared by the replay service, the `bwctl` CLI, tests and the drill.
//!
//! What lives here: the accounting that proves every accepted operation is in exactly one place
//! ([`account`]), non-consuming reads of the work-queue streams ([`scan`]), DLQ and quarantine inspection and
//! statistics ([`inspect`]), quarantine scopes listed, released and dropped together ([`quarantine`]), breaker
//! incidents in the DLQ (stats, replay progress, the finished event, hold and release: [`incident`]), the moves out of the DLQ and the quarantine that replay and the CLI share so both
//! obey the same no-duplicate rules ([`moves`]), the replay jitter schedule the dispatcher uses
//! (`bw_common::jitter::next_replay_delay`), the operator batch actions `bwctl` runs ([`ops`]), the offline change of
//! the ledger's partition count ([`repartition`]), the producers' NATS users generated from the sender registry
//! ([`senders`]), the move of ledger entries from before tenants to their tenant's key ([`tenants`]), the
//! operators' audit stream the console and bwctl write ([`audit`]) and a small token bucket ([`pace`]).
//!
//! What must not live here: anything that talks to Meta or to Redis. This crate depends on `bw-common` only;
//! services may depend on it, it never depends on a service.

pub mod account;
pub mod audit;
pub mod incident;
pub mod inspect;
/// The replay back-off schedule now lives with the dispatcher's shared plumbing.
pub mod moves;
pub mod ops;
pub mod pace;
pub mod quarantine;
pub mod repartition;
pub mod resend;
pub mod scan;
pub mod senders;
pub mod tenants;
pub mod views;

use bw_common::ledger::LedgerError;
use bw_common::nats::PublishError;

/// Failures of the operations helpers. All of them mean "the broker did not answer as expected": nothing was
/// changed that a retry would not heal.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("nats request on `{what}` failed: {detail}")]
    Nats { what: String, detail: String },
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Publish(#[from] PublishError),
}

impl OpsError {
    pub(crate) fn nats(what: impl Into<String>, detail: impl std::fmt::Display) -> OpsError {
        OpsError::Nats { what: what.into(), detail: detail.to_string() }
    }
}
