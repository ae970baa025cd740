//! Inbound messages counted against their number's throughput. Meta counts inbound and outbound messages of
//! every type against one per-number limit (meta-cloud-api.md §3.1), so each inbound message the processor
//! forwards takes one token of the number's sender bucket in Redis (`bw_breaker::throughput`,
//! `lua/observe_inbound.lua`), the bucket every dispatcher's admission spends: inbound plus outbound stays under
//! the number's rate.
//!
//! Best effort by design: a count that fails (Redis slow or away) is logged and dropped, never retried, and never
//! holds the webhook: the inbound message itself is already stored and forwarded, and the configured margin under
//! Meta's limit (`throughput_margin`) covers inbound that was not counted.

use bw_breaker::Scope;
use bw_breaker::throughput::Throughput;
use bw_proto::v1::InboundMessage;
use serde::Deserialize;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// How often a failing count is logged, at most.
const WARN_EVERY_MS: i64 = 10_000;

/// `[inbound_rate]` of the ingest config: inbound messages counted against their number's throughput.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboundRateConfig {
    /// Count inbound messages against their number's throughput (needs the breaker's Redis).
    pub enabled: bool,
    /// Timeout of one count, ms; past it the count is dropped.
    pub timeout_ms: u64,
}

impl Default for InboundRateConfig {
    fn default() -> Self {
        InboundRateConfig { enabled: true, timeout_ms: 250 }
    }
}

/// The counter the processor calls for each forwarded inbound message.
pub struct InboundRate {
    throughput: Throughput,
    last_warn_ms: AtomicI64,
}

impl InboundRate {
    pub fn new(redis: bw_common::redis_conn::RedisConn, cfg: &InboundRateConfig) -> InboundRate {
        // The compiled limits stand for a number until the coordinator writes its config hash (as in admission).
        let defaults = bw_breaker::ScopeLimits::default();
        InboundRate {
            throughput: Throughput::new(redis, Duration::from_millis(cfg.timeout_ms.max(1)), &defaults),
            last_warn_ms: AtomicI64::new(0),
        }
    }

    /// The counter `cfg` asks for: None when it is off or ingest runs without Redis.
    pub fn from_config(
        redis: Option<&bw_common::redis_conn::RedisConn>,
        cfg: &InboundRateConfig,
    ) -> Option<InboundRate> {
        redis.filter(|_| cfg.enabled).map(|r| InboundRate::new(r.clone(), cfg))
    }

    /// Counts one inbound message against its number's throughput.
    pub async fn count(&self, m: &InboundMessage) {
        if m.waba_id.is_empty() || m.phone_number_id.is_empty() {
            return;
        }
        let scope = Scope::new(m.waba_id.as_str(), m.phone_number_id.as_str());
        if let Err(e) = self.throughput.observe_inbound(&scope, 1).await {
            let now = bw_common::time::now_ms();
            let last = self.last_warn_ms.load(Ordering::Relaxed);
            if now - last >= WARN_EVERY_MS
                && self.last_warn_ms.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            {
                tracing::warn!(
                    error = %e,
                    phone_number_id = %m.phone_number_id,
                    "inbound message not counted against its number's throughput"
                );
            }
        }
    }
}
