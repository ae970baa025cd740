//! A number's throughput as Meta states it, and the inbound messages that count against it
//! (meta-cloud-api.md §3.1: 80 messages per second by default, 1,000 after an automatic upgrade, inbound and
//! outbound of every type counted together; §4.5: `phone_number_quality_update` `THROUGHPUT_UPGRADE`).
//!
//! The limit lives in its own hash per number, `bw:{<waba>:<phone>}:tput`, in the number's hash slot, so
//! `admit_send.lua` reads it in the admission call and every dispatcher sends at the rate it implies: the limit
//! times `throughput_margin` (0.925, today's 74 of 80), never above the limit. Config may state the limit too
//! (`throughput_mps` per scope); the webhook's value wins, being Meta's latest word. Inbound messages ingest sees
//! take tokens from the same bucket the sends take them from (`lua/observe_inbound.lua`).
//! Both change only in Lua (`lua/throughput_set.lua`, `lua/observe_inbound.lua`).

use crate::config::ScopeLimits;
use crate::error::{BreakerError, RedisConn, invoke};
use crate::types::Scope;
use std::sync::LazyLock;
use std::time::Duration;

static THROUGHPUT_SET: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../../lua/scope_prelude.lua"),
        "\n",
        include_str!("../../../lua/throughput_set.lua")
    ))
});

static OBSERVE_INBOUND: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("../../../lua/scope_prelude.lua"),
        "\n",
        include_str!("../../../lua/observe_inbound.lua")
    ))
});

/// The messages per second Meta allows a number after `THROUGHPUT_UPGRADE` (reference §3.1: "up to 1,000").
pub const UPGRADED_MPS: u32 = 1_000;

pub use crate::scripts::throughput_key;

/// What the throughput hash of a number holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThroughputState {
    /// Meta's stated messages per second from its webhook (0: none recorded).
    pub mps: u32,
    /// When it was recorded, Unix ms (Redis time).
    pub at_ms: i64,
    /// The webhook event that stated it (`THROUGHPUT_UPGRADE`).
    pub event: String,
    /// Inbound messages counted against the number's throughput so far.
    pub inbound_total: i64,
}

/// What counting inbound messages left in the sender bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InboundCounted {
    /// Tokens left (negative: a debt the sends wait out, at most one second of the rate).
    pub tokens: f64,
    /// The number's configured sender rate (messages per second) the count was made at.
    pub rate_per_s: f64,
    pub inbound_total: i64,
}

/// The sender rate `limits` give a number whose Meta-stated limit is `stated_mps` (0: not stated): the Rust
/// mirror of `throughput_rate` in `lua/scope_prelude.lua`, for docs, snapshots and tests.
pub fn configured_rate(limits: &ScopeLimits, stated_mps: u32) -> f64 {
    let limit = if stated_mps > 0 { f64::from(stated_mps) } else { limits.throughput_mps };
    if limit <= 0.0 {
        return limits.rate_per_s;
    }
    limit * limits.throughput_margin.clamp(0.01, 1.0)
}

/// Numbers' throughput over Redis. Cheap to clone.
#[derive(Clone)]
pub struct Throughput {
    conn: RedisConn,
    timeout: Duration,
    /// The compiled limits, passed to the scripts as the scope's defaults (its config hash overrides them).
    defaults: String,
}

impl Throughput {
    pub fn new(conn: RedisConn, timeout: Duration, defaults: &ScopeLimits) -> Throughput {
        Throughput { conn, timeout, defaults: defaults.encode() }
    }

    async fn run(&self, script: &'static str, inv: redis::ScriptInvocation<'_>) -> Result<redis::Value, BreakerError> {
        match tokio::time::timeout(self.timeout, invoke(&self.conn, &inv)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(BreakerError::Timeout { script, timeout_ms: self.timeout.as_millis() as u64 }),
        }
    }

    async fn call(&self, scope: &Scope, mode: &str, mps: u32, event: &str) -> Result<ThroughputState, BreakerError> {
        let mut inv = THROUGHPUT_SET.prepare_invoke();
        inv.key(throughput_key(scope)).arg(mode).arg(mps).arg(event);
        let mut reply = crate::scripts::Reply::new(self.run("throughput_set", inv).await?)?;
        Ok(ThroughputState {
            mps: u32::try_from(reply.int()?.max(0)).unwrap_or(u32::MAX),
            at_ms: reply.int()?,
            event: reply.string()?,
            inbound_total: reply.int()?,
        })
    }

    /// Records Meta's stated limit of a number (`mps` > 0) from its webhook `event`; every dispatcher's next
    /// admission sends at the rate it implies.
    pub async fn set_limit(&self, scope: &Scope, mps: u32, event: &str) -> Result<ThroughputState, BreakerError> {
        if mps == 0 {
            return Err(BreakerError::BadReply("a stated throughput must be positive".into()));
        }
        self.call(scope, "set", mps, event).await
    }

    /// What is recorded for a number.
    pub async fn read(&self, scope: &Scope) -> Result<ThroughputState, BreakerError> {
        self.call(scope, "read", 0, "").await
    }

    /// Forgets the webhook's limit: config's `throughput_mps`, else `rate_per_s`, applies again.
    pub async fn clear(&self, scope: &Scope) -> Result<ThroughputState, BreakerError> {
        self.call(scope, "clear", 0, "").await
    }

    /// Counts `n` inbound messages of a number against its throughput (they take tokens of its sender bucket).
    pub async fn observe_inbound(&self, scope: &Scope, n: u32) -> Result<InboundCounted, BreakerError> {
        self.observe(scope, n, None).await
    }

    /// Counts `n` messages the business sent a user from the WhatsApp Business app of a coexistence number
    /// (`smb_message_echoes`): against the number's throughput and the pair's rate (`recipient_key`, as
    /// `bw_common::mask::recipient_key` gives it), as sends of Breakwater's own would be.
    pub async fn observe_echo(
        &self,
        scope: &Scope,
        recipient_key: &str,
        n: u32,
    ) -> Result<InboundCounted, BreakerError> {
        self.observe(scope, n, Some(recipient_key)).await
    }

    async fn observe(&self, scope: &Scope, n: u32, pair: Option<&str>) -> Result<InboundCounted, BreakerError> {
        let mut inv = OBSERVE_INBOUND.prepare_invoke();
        inv.key(crate::scripts::cfg_key(scope))
            .key(crate::scripts::state_key(scope))
            .key(throughput_key(scope))
            .arg(&self.defaults)
            .arg(n.max(1));
        if let Some(recipient_key) = pair {
            inv.key(crate::scripts::pair_key(scope, recipient_key));
        }
        let mut reply = crate::scripts::Reply::new(self.run("observe_inbound", inv).await?)?;
        let float = |s: String| s.parse::<f64>().map_err(|_| BreakerError::BadReply(format!("not a number: {s}")));
        Ok(InboundCounted {
            tokens: float(reply.string()?)?,
            rate_per_s: float(reply.string()?)?,
            inbound_total: reply.int()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_follows_the_stated_limit_at_the_margin_and_never_above_it() {
        let d = ScopeLimits::default();
        assert_eq!(configured_rate(&d, 0), 74.0, "unknown: rate_per_s as configured");
        assert!((configured_rate(&d, 80) - 74.0).abs() < 1e-9, "Meta's default 80 at today's margin is today's 74");
        assert!((configured_rate(&d, UPGRADED_MPS) - 925.0).abs() < 1e-9);
        let configured = ScopeLimits { throughput_mps: 20.0, ..ScopeLimits::default() };
        assert!((configured_rate(&configured, 0) - 18.5).abs() < 1e-9, "a coexistence number from config");
        assert!((configured_rate(&configured, UPGRADED_MPS) - 925.0).abs() < 1e-9, "the webhook wins");
        let reckless = ScopeLimits { throughput_margin: 3.0, ..ScopeLimits::default() };
        assert_eq!(configured_rate(&reckless, UPGRADED_MPS), 1000.0, "never above Meta's limit");
    }

    #[test]
    fn the_key_shares_the_scope_hash_tag() {
        let scope = Scope::new("100", "200");
        assert_eq!(throughput_key(&scope), "bw:{100:200}:tput");
        assert_eq!(crate::scripts::state_key(&scope), "bw:{100:200}:state");
    }
}
