//! Per-recipient order (issue #14): for one sender and one recipient, a message of a category that keeps order
//! never reaches Meta before an earlier accepted one that is still waiting.
//!
//! The state is one Redis sorted set per (sender, recipient) under the sender's hash tag
//! (`bw:{<waba>:<phone>}:ord:<recipient_key>`, [`crate::scripts::order_key`]): ingest registers each accepted
//! operation ([`OrderBook::register`], `lua/order_register.lua`) before storing it in BW_SEND; admission
//! ([`crate::Breaker::admit_ordered`], `lua/admit_send.lua`) refuses a member while an earlier member is still
//! there ([`crate::DenyReason::OrderWait`], naming it in [`Blocker`]); the member leaves when Meta accepted it or
//! it ended for good ([`crate::Breaker::record_releasing`] in the outcome batch, [`crate::Breaker::release_order`]
//! otherwise). Why this cannot deadlock and how a lost release heals: `lua/order_register.lua`.
//!
//! Must not: put a phone number in a key (only `bw_common::mask::recipient_key`), or gate a category that does
//! not keep order (ingest registers only those; an operation that is not a member is never refused).

use crate::breaker::Breaker;
use crate::error::{BreakerError, RedisConn, invoke};
use crate::scripts;
use crate::types::Scope;
pub use crate::types::{Blocker, OrderRelease};
use std::time::Duration;

/// What [`OrderBook::register`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// False when the operation was already a member (a producer's retry keeps its first place).
    pub added: bool,
    /// Its score: Redis time of the first registration, microseconds (unique within the set).
    pub score_us: i64,
}

/// Registers accepted operations in their recipients' order sets (ingest's side of the order gate).
#[derive(Clone)]
pub struct OrderBook {
    redis: RedisConn,
    timeout: Duration,
    ttl_ms: u64,
}

impl OrderBook {
    /// An order book over `redis`; each call times out after `timeout`; a set lives `ttl_ms` after its last
    /// registration.
    pub fn new(redis: RedisConn, timeout: Duration, ttl_ms: u64) -> OrderBook {
        OrderBook { redis, timeout, ttl_ms }
    }

    /// Registers `operation_id` as the latest accepted message of `scope` to `recipient_key`. One round trip.
    pub async fn register(
        &self,
        scope: &Scope,
        recipient_key: &str,
        operation_id: &str,
    ) -> Result<Registration, BreakerError> {
        let inv = scripts::register_invocation(scope, recipient_key, operation_id, self.ttl_ms);
        let value = match tokio::time::timeout(self.timeout, invoke(&self.redis, &inv)).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err(BreakerError::Redis(e)),
            Err(_) => {
                return Err(BreakerError::Timeout {
                    script: "order_register",
                    timeout_ms: self.timeout.as_millis() as u64,
                });
            }
        };
        let mut reply = scripts::Reply::new(value)?;
        Ok(Registration { added: reply.int()? == 1, score_us: reply.int()? })
    }

    /// The members of an order set in order (tests, operators).
    pub async fn members(&self, scope: &Scope, recipient_key: &str) -> Result<Vec<String>, BreakerError> {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(scripts::order_key(scope, recipient_key)).arg(0).arg(-1);
        let fut = async {
            match &self.redis {
                RedisConn::Single(conn) => cmd.query_async::<Vec<String>>(&mut conn.clone()).await,
                RedisConn::Cluster(conn) => cmd.query_async::<Vec<String>>(&mut conn.clone()).await,
            }
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(BreakerError::Timeout { script: "zrange", timeout_ms: self.timeout.as_millis() as u64 }),
        }
    }
}

impl Breaker {
    /// Removes operations of `scope` from their recipients' order sets outside an outcome batch (a move to
    /// BW_UNKNOWN, an expiry, a blocking member the ledger shows ended). One round trip; returns how many
    /// were members.
    pub async fn release_order(&self, scope: &Scope, releases: &[OrderRelease]) -> Result<u64, BreakerError> {
        if releases.is_empty() {
            return Ok(0);
        }
        let value = self.call("order_release", scripts::release_invocation(scope, releases)).await?;
        match value {
            redis::Value::Int(n) => Ok(n.max(0) as u64),
            other => Err(BreakerError::BadReply(format!("expected an integer, got {other:?}"))),
        }
    }
}
