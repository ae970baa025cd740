//! A business portfolio's messaging-limit budget (`lua/portfolio_budget.lua`, meta-cloud-api.md §3.3) and the
//! customer service windows that exempt a recipient from it.
//!
//! Meta limits the unique users a portfolio reaches with business-initiated messages outside a customer service
//! window in a rolling 24 h, shared by every number of the portfolio. The budget counts them exactly (a sorted
//! set of recipient keys by last counted send, about 10 MB at 100,000 recipients, see
//! docs/messaging-limit.md); a reply inside an open window (an inbound message of that user to that number in
//! the last 24 h, recorded by ingest) is not counted. Keys hold a hash of the recipient's digits
//! (`bw_common::mask::recipient_key`), never the number.

use crate::error::{BreakerError, RedisConn, invoke};
use std::sync::LazyLock;

pub(crate) static PORTFOLIO_BUDGET: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/portfolio_budget.lua")));

/// Meta's rolling window of the limit and of a customer service window: 24 h.
pub const WINDOW_MS: u64 = 24 * 3_600_000;

/// The lowest tier (a new portfolio's): the budget of a portfolio whose tier nobody stated, the safe reading.
pub const LOWEST_TIER: i64 = 250;

/// The set of portfolios that have a budget, for `bwctl scopes` (members: portfolio ids).
pub const PORTFOLIOS_KEY: &str = "bw:budget-portfolios";

/// The budget's sorted set of a portfolio (recipient key → last counted send, ms).
pub fn budget_key(portfolio: &str) -> String {
    format!("bw:{{pf:{portfolio}}}:budget")
}

/// The budget's hash of a portfolio (limit, its source, the last hold).
pub fn budget_cfg_key(portfolio: &str) -> String {
    format!("bw:{{pf:{portfolio}}}:budget:cfg")
}

/// The open customer service window of `recipient_key` with the business number `phone_number_id`.
pub fn window_key(phone_number_id: &str, recipient_key: &str) -> String {
    format!("bw:csw:{{{phone_number_id}}}:{recipient_key}")
}

/// What the budget said of one business-initiated message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The recipient's customer service window is open: not counted.
    WindowOpen,
    /// The recipient was counted in the last 24 h already: not a new user.
    Known,
    /// A new user, counted now.
    Counted,
    /// The portfolio is unlimited: not counted.
    Unlimited,
    /// Over the cap of its class: held; a slot frees in `wait_ms` at the latest (the window slides).
    Held { wait_ms: u64 },
}

/// One admission's answer: the verdict, the users counted in the window, the portfolio's limit (-1 unlimited).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admit {
    pub verdict: Verdict,
    pub used: i64,
    pub limit: i64,
}

/// One message for [`PortfolioBudget::admit_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetItem {
    pub recipient_key: String,
    /// Authentication, utility or support: may use the reserve.
    pub reserved: bool,
    /// The recipient's customer service window with the sending number is open: not counted.
    pub window_open: bool,
}

/// A portfolio's budget as `bwctl scopes` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BudgetState {
    pub used: i64,
    pub limit: i64,
    /// Who set the limit ("webhook", "operator"); empty when it is the caller's fallback.
    pub source: String,
    /// The value as Meta gave it (`TIER_2K`, 2000, ...).
    pub raw: String,
    pub set_at_ms: i64,
    /// When the oldest counted user leaves the window, Unix ms (0: nobody counted).
    pub oldest_ms: i64,
    /// The last hold, Unix ms (0: never), and whether it held a reserved class.
    pub held_at_ms: i64,
    pub held_reserved: bool,
    pub now_ms: i64,
}

/// The reserve's cap for marketing: `limit` less `reserve_permille` of it (what the script applies).
pub fn marketing_cap(limit: i64, reserve_permille: u32) -> i64 {
    if limit < 0 {
        return -1;
    }
    limit * (1000 - i64::from(reserve_permille.min(1000))) / 1000
}

/// Unique users of a tier as Meta spells it (`TIER_2K`, `TIER_250`, `2000`, `TIER_UNLIMITED`, `-1`): -1 for
/// unlimited, 0 when not understood. `TIER_1K` reads 1,000 here; Meta renamed that tier 2,000, and a value
/// read low only holds earlier (the safe side).
pub fn tier_users(raw: &str) -> i64 {
    let t = raw.trim().to_ascii_uppercase();
    let t = t.strip_prefix("TIER_").unwrap_or(&t);
    match t {
        "UNLIMITED" | "-1" => -1,
        _ => {
            let (digits, scale) = match t.strip_suffix('K') {
                Some(d) => (d, 1000),
                None => (t, 1),
            };
            digits.parse::<i64>().ok().filter(|n| *n > 0).map(|n| n.saturating_mul(scale)).unwrap_or(0)
        }
    }
}

/// The portfolio of a number: its sender-registry `portfolio_id`, else the configured one of its WABA
/// (`budget.portfolios`), else the WABA itself (a portfolio per WABA). The dispatcher counts, and the
/// coordinator applies Meta's tier, under the same id.
pub fn portfolio_of(registered: &str, waba_id: &str, by_waba: &std::collections::BTreeMap<String, String>) -> String {
    if !registered.is_empty() {
        return registered.to_string();
    }
    by_waba.get(waba_id).cloned().unwrap_or_else(|| waba_id.to_string())
}

/// The budgets and windows, over Redis. Cheap to clone.
#[derive(Clone)]
pub struct PortfolioBudget {
    conn: RedisConn,
}

impl PortfolioBudget {
    pub fn new(conn: RedisConn) -> PortfolioBudget {
        PortfolioBudget { conn }
    }

    /// A business-initiated message of `portfolio` to `recipient_key`. `fallback_limit` is the limit when none is
    /// stored (config, else [`LOWEST_TIER`]); `reserved` for authentication and utility, which may use the whole
    /// limit, while marketing stops `reserve_permille` short of it.
    pub async fn admit(
        &self,
        portfolio: &str,
        recipient_key: &str,
        fallback_limit: i64,
        reserve_permille: u32,
        reserved: bool,
        window_open: bool,
    ) -> Result<Admit, BreakerError> {
        let item = BudgetItem { recipient_key: recipient_key.to_string(), reserved, window_open };
        let mut answers = self.admit_many(portfolio, fallback_limit, reserve_permille, &[item]).await?;
        answers.pop().ok_or_else(|| BreakerError::BadReply("no answer".into()))
    }

    /// [`Self::admit`] for several messages of one portfolio in one round trip, admitted in the order given (so
    /// the last new users of a nearly full budget are held, as one at a time would hold them).
    pub async fn admit_many(
        &self,
        portfolio: &str,
        fallback_limit: i64,
        reserve_permille: u32,
        items: &[BudgetItem],
    ) -> Result<Vec<Admit>, BreakerError> {
        let mut inv = PORTFOLIO_BUDGET.prepare_invoke();
        inv.key(budget_key(portfolio)).key(budget_cfg_key(portfolio)).arg("admit_many");
        inv.arg(WINDOW_MS).arg(fallback_limit).arg(reserve_permille);
        for i in items {
            inv.arg(&i.recipient_key).arg(u8::from(i.reserved)).arg(u8::from(i.window_open));
        }
        let mut reply = crate::scripts::Reply::new(invoke(&self.conn, &inv).await?)?;
        if reply.remaining() != 4 * items.len() {
            return Err(BreakerError::BadReply(format!("{} values for {} messages", reply.remaining(), items.len())));
        }
        let mut out = Vec::with_capacity(items.len());
        for _ in items {
            let (verdict, used, limit, wait_ms) = (reply.int()?, reply.int()?, reply.int()?, reply.int()?);
            let verdict = match verdict {
                0 => Verdict::WindowOpen,
                1 => Verdict::Known,
                2 => Verdict::Counted,
                3 => Verdict::Unlimited,
                _ => Verdict::Held { wait_ms: wait_ms.max(1) as u64 },
            };
            out.push(Admit { verdict, used, limit });
        }
        Ok(out)
    }

    /// Sets a portfolio's limit (-1 unlimited) from `source` ("webhook", "operator"); returns the previous stored
    /// limit (0: none). A limit of 0 is refused: it is Meta's "not understood", never a tier.
    pub async fn set_limit(&self, portfolio: &str, limit: i64, source: &str, raw: &str) -> Result<i64, BreakerError> {
        Ok(self.set(portfolio, limit, source, raw, "").await?.0)
    }

    /// Sets a portfolio's limit only when none is stored (a Graph read at start never overrides a webhook).
    /// Returns the limit in force afterwards.
    pub async fn seed_limit(&self, portfolio: &str, limit: i64, source: &str, raw: &str) -> Result<i64, BreakerError> {
        Ok(self.set(portfolio, limit, source, raw, "seed").await?.1)
    }

    async fn set(&self, pf: &str, limit: i64, source: &str, raw: &str, how: &str) -> Result<(i64, i64), BreakerError> {
        let mut inv = PORTFOLIO_BUDGET.prepare_invoke();
        inv.key(budget_key(pf)).key(budget_cfg_key(pf)).arg("set").arg(limit).arg(source).arg(raw).arg(how);
        let mut reply = crate::scripts::Reply::new(invoke(&self.conn, &inv).await?)?;
        let (previous, now) = (reply.int()?, reply.int()?);
        self.note(pf).await?;
        Ok((previous, now))
    }

    /// A portfolio's budget now.
    pub async fn read(&self, portfolio: &str, fallback_limit: i64) -> Result<BudgetState, BreakerError> {
        let mut inv = PORTFOLIO_BUDGET.prepare_invoke();
        inv.key(budget_key(portfolio)).key(budget_cfg_key(portfolio)).arg("read").arg(WINDOW_MS).arg(fallback_limit);
        let mut reply = crate::scripts::Reply::new(invoke(&self.conn, &inv).await?)?;
        Ok(BudgetState {
            used: reply.int()?,
            limit: reply.int()?,
            source: reply.string()?,
            raw: reply.string()?,
            set_at_ms: reply.int()?,
            oldest_ms: reply.int()?,
            held_at_ms: reply.int()?,
            held_reserved: reply.int()? == 1,
            now_ms: reply.int()?,
        })
    }

    /// Adds `portfolio` to [`PORTFOLIOS_KEY`] (what `bwctl scopes` lists).
    pub async fn note(&self, portfolio: &str) -> Result<(), BreakerError> {
        let mut conn = self.conn.clone();
        redis::cmd("SADD").arg(PORTFOLIOS_KEY).arg(portfolio).query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Every portfolio with a budget, sorted.
    pub async fn portfolios(&self) -> Result<Vec<String>, BreakerError> {
        let mut conn = self.conn.clone();
        let mut all: Vec<String> = redis::cmd("SMEMBERS").arg(PORTFOLIOS_KEY).query_async(&mut conn).await?;
        all.sort();
        Ok(all)
    }

    /// An inbound message of `recipient_key` to `phone_number_id` at `at_unix_ms` (Meta's timestamp) opens the
    /// customer service window until 24 h after it. Returns false when that is already over (nothing written).
    /// A later message renews the window; an older one redelivered never shortens it.
    pub async fn open_window(
        &self,
        phone_number_id: &str,
        recipient_key: &str,
        at_unix_ms: i64,
        now_unix_ms: i64,
    ) -> Result<bool, BreakerError> {
        let left = at_unix_ms.min(now_unix_ms) + WINDOW_MS as i64 - now_unix_ms;
        if left <= 0 {
            return Ok(false);
        }
        let mut conn = self.conn.clone();
        // GT: PEXPIRE only lengthens (Redis 7); a new key is created first with its own expiry.
        let key = window_key(phone_number_id, recipient_key);
        let created: bool = redis::cmd("SET")
            .arg(&key)
            .arg(at_unix_ms)
            .arg("PX")
            .arg(left)
            .arg("NX")
            .query_async::<Option<String>>(&mut conn)
            .await?
            .is_some();
        if !created {
            redis::cmd("PEXPIRE").arg(&key).arg(left).arg("GT").query_async::<i64>(&mut conn).await?;
        }
        Ok(true)
    }

    /// True while the customer service window of `recipient_key` with `phone_number_id` is open.
    pub async fn window_open(&self, phone_number_id: &str, recipient_key: &str) -> Result<bool, BreakerError> {
        let open = self.windows_open(phone_number_id, &[recipient_key.to_string()]).await?;
        Ok(open.first().copied().unwrap_or(false))
    }

    /// [`Self::window_open`] for several recipients of one number in one round trip (their keys share the
    /// number's hash slot).
    pub async fn windows_open(
        &self,
        phone_number_id: &str,
        recipient_keys: &[String],
    ) -> Result<Vec<bool>, BreakerError> {
        let mut pipe = redis::pipe();
        for rk in recipient_keys {
            pipe.cmd("EXISTS").arg(window_key(phone_number_id, rk));
        }
        let mut conn = self.conn.clone();
        let found: Vec<i64> = pipe.query_async(&mut conn).await?;
        Ok(found.into_iter().map(|n| n == 1).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_share_the_portfolio_slot_and_hold_no_number() {
        assert_eq!(budget_key("506914307656634"), "bw:{pf:506914307656634}:budget");
        assert_eq!(budget_cfg_key("506914307656634"), "bw:{pf:506914307656634}:budget:cfg");
        let rk = bw_common::mask::recipient_key("+5491155551234");
        let w = window_key("106540352242922", &rk);
        assert_eq!(w, format!("bw:csw:{{106540352242922}}:{rk}"));
        assert!(!w.contains("5491155551234"));
    }

    #[test]
    fn the_portfolio_comes_from_the_registry_then_config_then_the_waba() {
        let by_waba = std::collections::BTreeMap::from([("200".to_string(), "900".to_string())]);
        assert_eq!(portfolio_of("800", "200", &by_waba), "800");
        assert_eq!(portfolio_of("", "200", &by_waba), "900");
        assert_eq!(portfolio_of("", "300", &by_waba), "300");
    }

    #[test]
    fn tiers_read_in_every_form_meta_uses() {
        assert_eq!(tier_users("TIER_2K"), 2_000);
        assert_eq!(tier_users("TIER_250"), 250);
        assert_eq!(tier_users("100000"), 100_000);
        assert_eq!(tier_users("TIER_UNLIMITED"), -1);
        assert_eq!(tier_users("-1"), -1);
        assert_eq!(tier_users("TIER_WHAT"), 0);
        assert_eq!(tier_users(""), 0);
    }

    #[test]
    fn marketing_stops_short_of_the_limit_by_the_reserve() {
        assert_eq!(marketing_cap(2000, 100), 1800);
        assert_eq!(marketing_cap(250, 100), 225);
        assert_eq!(marketing_cap(2000, 0), 2000);
        assert_eq!(marketing_cap(2000, 5000), 0, "a reserve above the whole is the whole");
        assert_eq!(marketing_cap(-1, 100), -1);
    }
}
