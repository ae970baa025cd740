//! Breakwater's wire contracts: the prost types generated from `proto/bw/v1/*.proto`.
//!
//! This crate does no I/O and holds no business logic. The generated code lives in `src/gen/` and is
//! committed; the `bootstrap` test regenerates it (with protox, no system `protoc`) and fails when the
//! committed copy is stale. Run `BW_BLESS=1 cargo test -p bw-proto` to rewrite it.

/// Version 1 of the contracts (`package bw.v1`).
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    include!("gen/bw.v1.rs");
}

impl v1::Category {
    /// True for traffic that is served first and may use the transactional reserve.
    pub fn is_priority(self) -> bool {
        matches!(self, v1::Category::Authentication | v1::Category::Transactional | v1::Category::Support)
    }

    /// Short lowercase name used in subjects, metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            v1::Category::Unspecified => "unspecified",
            v1::Category::Authentication => "authentication",
            v1::Category::Transactional => "transactional",
            v1::Category::Support => "support",
            v1::Category::Marketing => "marketing",
        }
    }
}

impl v1::OperationState {
    /// True when nothing more will happen to the operation on its own.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            v1::OperationState::Sent
                | v1::OperationState::Held
                | v1::OperationState::Delivered
                | v1::OperationState::Read
                | v1::OperationState::Failed
                | v1::OperationState::Expired
        )
    }

    /// True when Meta accepted the message: it must never be sent again.
    pub fn is_accepted_by_meta(self) -> bool {
        matches!(
            self,
            v1::OperationState::Sent
                | v1::OperationState::Held
                | v1::OperationState::Delivered
                | v1::OperationState::Read
                | v1::OperationState::Failed
        )
    }

    /// Short lowercase name used in reports and metrics.
    pub fn label(self) -> &'static str {
        match self {
            v1::OperationState::Unspecified => "unspecified",
            v1::OperationState::Queued => "queued",
            v1::OperationState::Sent => "sent",
            v1::OperationState::Delivered => "delivered",
            v1::OperationState::Read => "read",
            v1::OperationState::Failed => "failed",
            v1::OperationState::Dlq => "dlq",
            v1::OperationState::Quarantined => "quarantined",
            v1::OperationState::Expired => "expired",
            v1::OperationState::Unknown => "unknown",
            v1::OperationState::Held => "held",
        }
    }
}

#[cfg(test)]
mod tests;

impl v1::DlqReason {
    /// Short lowercase name, for metrics, `bwctl` and the ledger's reason text.
    pub fn label(self) -> &'static str {
        use v1::DlqReason::*;
        match self {
            Unspecified => "unspecified",
            BreakerOpen => "breaker_open",
            RetriesExhausted => "retries_exhausted",
            Credentials => "credentials",
            UnknownNoStatus => "unknown_no_status",
            Operator => "operator",
            Failover => "failover",
            RateLimited => "rate_limited",
            SpamLimited => "spam_limited",
            RecipientDeferred => "recipient_deferred",
            Unclassified => "unclassified",
            SenderPaused => "sender_paused",
        }
    }
}
