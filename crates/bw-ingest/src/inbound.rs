//! Customer service windows from inbound messages (issue #36 item 2): an inbound message of a user to a business
//! number opens their 24 h customer service window (meta-cloud-api.md §3.3, §5), and a template to that user from
//! that number inside it does not count toward the portfolio's messaging limit. Ingest records the window in
//! Redis (`bw_breaker::budget::PortfolioBudget::open_window`, a key per number and recipient hash with a 24 h
//! expiry from Meta's timestamp); the dispatcher's budget gate reads it.
//!
//! A window that could not be recorded (Redis unreachable) is logged and counted, never retried: the recipient
//! then counts toward the budget, the safe direction, and the inbound message itself still flows to BW_INBOUND.

use bw_breaker::budget::PortfolioBudget;
use bw_proto::v1::InboundMessage;
use std::time::Duration;

/// Records windows; absent without Redis.
#[derive(Clone)]
pub(crate) struct Windows {
    budget: PortfolioBudget,
    timeout: Duration,
}

impl Windows {
    pub(crate) fn new(redis: Option<bw_breaker::RedisConn>, timeout: Duration) -> Option<Windows> {
        redis.map(|r| Windows { budget: PortfolioBudget::new(r), timeout })
    }

    /// Opens the window of the message's sender with the number it wrote to. True when recorded.
    pub(crate) async fn record(&self, m: &InboundMessage) -> bool {
        if m.from.is_empty() || m.phone_number_id.is_empty() {
            return false;
        }
        let now = bw_common::time::now_ms();
        let at = if m.timestamp_unix_s > 0 { m.timestamp_unix_s.saturating_mul(1000) } else { now };
        let rk = bw_common::mask::recipient_key(&m.from);
        let opened = self.budget.open_window(&m.phone_number_id, &rk, at, now);
        match tokio::time::timeout(self.timeout, opened).await {
            Ok(Ok(open)) => open,
            Ok(Err(e)) => {
                tracing::warn!(phone_number_id = %m.phone_number_id, error = %e, "service window not recorded");
                false
            }
            Err(_) => {
                tracing::warn!(phone_number_id = %m.phone_number_id, "service window not recorded: redis timed out");
                false
            }
        }
    }
}
