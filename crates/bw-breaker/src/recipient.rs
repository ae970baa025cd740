//! A recipient's marketing state within one tenant (`lua/recipient_marketing.lua`): the 131049 cool-off and the
//! 131050 / 130472 suppression, shared by every sender of the tenant (meta-cloud-api.md §2.3, scope
//! RECIPIENT × marketing). Keys hold a hash of the recipient's digits, never the number.

use crate::error::{BreakerError, RedisConn, invoke};
use std::sync::LazyLock;

pub(crate) static RECIPIENT_MARKETING: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/recipient_marketing.lua")));

/// How long a suppression (131050, 130472) is kept after the last answer that recorded it: 180 days. Meta lifts
/// 131050 only when the user resumes (a `user_preferences` webhook); past this a send tries again and Meta's
/// answer records the suppression anew (one refused send, never billed).
pub const SUPPRESSION_KEEP_MS: u64 = 180 * 24 * 3_600_000;

/// The Redis key of a recipient's marketing state in a tenant. `recipient_key` is
/// `bw_common::mask::recipient_key` (16 hex characters of a hash).
pub fn marketing_key(tenant: &str, recipient_key: &str) -> String {
    format!("bw:{{mkt:{tenant}}}:r:{recipient_key}")
}

/// What holds marketing to one recipient now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MarketingState {
    /// Deferred (131049) until this time, Unix ms; 0: not deferred.
    pub deferred_until_ms: i64,
    /// Suppressed for good by this code (131050, 130472); 0: not suppressed.
    pub suppressed_code: i64,
    /// Redis's clock when read, Unix ms.
    pub now_ms: i64,
}

impl MarketingState {
    /// Milliseconds until the deferral ends (0: not deferred).
    pub fn deferred_for_ms(&self) -> u64 {
        (self.deferred_until_ms - self.now_ms).max(0) as u64
    }
}

/// The marketing states of recipients, over Redis. Cheap to clone.
#[derive(Clone)]
pub struct RecipientMarketing {
    conn: RedisConn,
}

impl RecipientMarketing {
    pub fn new(conn: RedisConn) -> RecipientMarketing {
        RecipientMarketing { conn }
    }

    async fn call(&self, key: &str, mode: &str, code: i64, ms: u64) -> Result<MarketingState, BreakerError> {
        let mut inv = RECIPIENT_MARKETING.prepare_invoke();
        inv.key(key).arg(mode).arg(code).arg(ms);
        let mut reply = crate::scripts::Reply::new(invoke(&self.conn, &inv).await?)?;
        let deferred_until_ms = reply.int()?;
        let _deferral_code = reply.int()?;
        let suppressed_code = reply.int()?;
        let now_ms = reply.int()?;
        Ok(MarketingState { deferred_until_ms, suppressed_code, now_ms })
    }

    /// The state of `recipient_key` in `tenant`.
    pub async fn read(&self, tenant: &str, recipient_key: &str) -> Result<MarketingState, BreakerError> {
        self.call(&marketing_key(tenant, recipient_key), "read", 0, 0).await
    }

    /// 131049: defers marketing to the recipient for `ms` (never shortens a deferral in force).
    pub async fn defer(
        &self,
        tenant: &str,
        recipient_key: &str,
        code: i64,
        ms: u64,
    ) -> Result<MarketingState, BreakerError> {
        self.call(&marketing_key(tenant, recipient_key), "defer", code, ms).await
    }

    /// 131050 / 130472: marketing to the recipient fails fast from now on ([`SUPPRESSION_KEEP_MS`]).
    pub async fn suppress(&self, tenant: &str, recipient_key: &str, code: i64) -> Result<MarketingState, BreakerError> {
        self.call(&marketing_key(tenant, recipient_key), "suppress", code, SUPPRESSION_KEEP_MS).await
    }

    /// The user resumed marketing (`user_preferences` `resume`): lifts a suppression by `code` (131050) only;
    /// another code's suppression (130472) and a 131049 deferral stay.
    pub async fn resume(&self, tenant: &str, recipient_key: &str, code: i64) -> Result<MarketingState, BreakerError> {
        self.call(&marketing_key(tenant, recipient_key), "resume", code, 0).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_the_tenant_and_a_hash_never_the_number() {
        let rk = bw_common::mask::recipient_key("+15551234567");
        let key = marketing_key("acme", &rk);
        assert_eq!(key, format!("bw:{{mkt:acme}}:r:{rk}"));
        assert!(!key.contains("5551234567"));
        assert_eq!(rk.len(), 16);
    }
}
