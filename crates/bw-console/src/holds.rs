//! A sender's holds that live in Redis by recipient, for the sender page (issue #39 "Sender"): pair back-offs
//! (131056, `bw:{<waba>:<phone>}:pair:<recipient_key>`, field `b` = back-off until, `x` = back-offs in a row) and
//! the tenant's recipient holds on those same recipients (`bw:{mkt:<tenant>}:r:<recipient_key>`: the 131049
//! marketing cool-off, the 131050 / 130472 suppressions), and Meta's stated throughput of the number.
//!
//! There is no per-sender index of these keys: a bounded SCAN of the sender's pair keys finds its recent
//! recipients (a pair hash lives while its GCRA or back-off does), at most [`SCAN_STEPS`] steps of COUNT 1,000
//! (about 50,000 keys looked at) and [`MAX_PAIRS`] pairs; the page says when it stopped short. Recipient holds of
//! the tenant on recipients this sender has not written to lately are not shown (they do not hold it now).
//! Recipients are shown by the last 4 characters of their key (a hash of the digits; never the number).

use bw_breaker::recipient::RecipientMarketing;
use bw_breaker::throughput::{Throughput, ThroughputState};
use bw_breaker::{RedisConn, Scope, ScopeLimits};
use std::time::Duration;

/// SCAN steps per page render.
pub const SCAN_STEPS: usize = 50;
/// Pair hashes read per page render.
pub const MAX_PAIRS: usize = 500;
const TIMEOUT: Duration = Duration::from_millis(500);

/// A pair back-off in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairHold {
    /// The recipient, masked (`…` and the last 4 characters of its key).
    pub recipient: String,
    pub until_ms: i64,
    pub backoffs: i64,
}

/// A tenant's hold on a recipient of this sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipientHold {
    pub recipient: String,
    /// 131049 (cool-off until `until_ms`), 131050 or 130472 (suppressed, `until_ms` 0).
    pub code: i64,
    pub until_ms: i64,
}

/// What the sender page shows from Redis.
#[derive(Debug, Clone, Default)]
pub struct Holds {
    pub pairs: Vec<PairHold>,
    pub recipients: Vec<RecipientHold>,
    pub throughput: ThroughputState,
    /// The SCAN or the pair count hit its cap: more may exist.
    pub partial: bool,
    pub now_ms: i64,
}

/// A recipient key as the page shows it.
pub fn mask_key(recipient_key: &str) -> String {
    let tail: String = recipient_key.chars().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
    format!("…{tail}")
}

/// Reads the holds of `scope` (sending for `tenant`).
pub async fn read(conn: &RedisConn, scope: &Scope, tenant: &str) -> anyhow::Result<Holds> {
    let RedisConn::Single(manager) = conn else {
        anyhow::bail!("pair and recipient holds are shown on a single Redis node only (SCAN)");
    };
    let mut manager = manager.clone();
    let throughput = Throughput::new(conn.clone(), TIMEOUT, &ScopeLimits::default()).read(scope).await?;
    let prefix = bw_breaker::scripts::pair_key(scope, "");
    let (mut cursor, mut keys, mut partial) = (0u64, Vec::new(), true);
    for _ in 0..SCAN_STEPS {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut manager)
            .await?;
        keys.extend(found);
        if keys.len() >= MAX_PAIRS {
            keys.truncate(MAX_PAIRS);
            break;
        }
        if next == 0 {
            partial = false;
            break;
        }
        cursor = next;
    }
    let now_ms = bw_common::time::now_ms();
    let marketing = RecipientMarketing::new(conn.clone());
    let mut holds = Holds { throughput, partial, now_ms, ..Default::default() };
    for key in &keys {
        let Some(rk) = key.strip_prefix(&prefix) else { continue };
        let (until, backoffs): (Option<i64>, Option<i64>) =
            redis::cmd("HMGET").arg(key).arg("b").arg("x").query_async(&mut manager).await?;
        let until = until.unwrap_or(0);
        if until > now_ms {
            holds.pairs.push(PairHold { recipient: mask_key(rk), until_ms: until, backoffs: backoffs.unwrap_or(0) });
        }
        let state = marketing.read(tenant, rk).await?;
        if state.suppressed_code != 0 {
            holds.recipients.push(RecipientHold { recipient: mask_key(rk), code: state.suppressed_code, until_ms: 0 });
        } else if state.deferred_until_ms > state.now_ms {
            holds.recipients.push(RecipientHold {
                recipient: mask_key(rk),
                code: 131_049,
                until_ms: state.deferred_until_ms,
            });
        }
    }
    holds.pairs.sort_by_key(|p| std::cmp::Reverse(p.until_ms));
    holds.recipients.sort_by_key(|r| (r.code, std::cmp::Reverse(r.until_ms)));
    Ok(holds)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_shows_its_last_four_characters_only() {
        assert_eq!(super::mask_key("0123456789abcdef"), "…cdef");
        assert_eq!(super::mask_key("ab"), "…ab");
    }
}
