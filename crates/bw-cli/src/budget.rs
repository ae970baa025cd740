//! The portfolio messaging-limit budgets, shown under `bwctl scopes` (issue #36 item 2): per business portfolio
//! the unique users reached outside a service window in the last 24 h, the limit and who set it, and whether
//! messages are held now. Portfolio ids only, never a phone number.

use crate::fmt;
use bw_breaker::budget::{BudgetState, PortfolioBudget};
use std::io::Write;

/// A hold within this long counts as "holding now" (a held message comes back within `budget.hold_max_ms`).
const HOLDING_RECENT_MS: i64 = 60_000;

/// One row of the table: PORTFOLIO, USED, LIMIT, SOURCE, FREES, HOLDING.
pub fn row(portfolio: &str, s: &BudgetState) -> Vec<String> {
    let limit = match s.limit {
        -1 => "unlimited".to_string(),
        0 => "unknown (dispatcher's budget.limits / unknown_limit)".to_string(),
        n => n.to_string(),
    };
    let source = if s.source.is_empty() { "-".to_string() } else { format!("{} {}", s.source, s.raw) };
    let frees = if s.oldest_ms > 0 { fmt::utc(s.oldest_ms + bw_breaker::budget::WINDOW_MS as i64) } else { "-".into() };
    let holding = if s.held_at_ms > 0 && s.now_ms - s.held_at_ms < HOLDING_RECENT_MS {
        let class = if s.held_reserved { "all classes" } else { "marketing" };
        format!("{class} held (limit reached {} ago)", fmt::age(s.now_ms - s.held_at_ms))
    } else {
        "-".to_string()
    };
    let used = if s.limit > 0 { format!("{} ({}%)", s.used, s.used * 100 / s.limit) } else { s.used.to_string() };
    vec![portfolio.to_string(), used, limit, source, frees, holding]
}

/// Prints the budget table after the scopes; a Redis it cannot reach is said, not fatal.
pub async fn show(redis_url: &str, out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    let conn = match bw_common::redis_conn::connect(
        redis_url,
        std::time::Duration::from_secs(2),
        std::time::Duration::from_secs(5),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            writeln!(out, "\nportfolio budgets: the breaker's Redis is unreachable (--redis-url): {e}")?;
            return Ok(());
        }
    };
    let budget = PortfolioBudget::new(bw_breaker::RedisConn::Single(conn));
    let portfolios = budget.portfolios().await?;
    if portfolios.is_empty() {
        return Ok(());
    }
    let mut rows = Vec::new();
    for p in &portfolios {
        rows.push(row(p, &budget.read(p, 0).await?));
    }
    writeln!(out)?;
    let header = ["PORTFOLIO", "USED-24H", "LIMIT", "SOURCE", "OLDEST-FREES", "HOLDING"];
    write!(out, "{}", fmt::table(&header, &rows))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holding_portfolio_shows_its_figures_and_what_it_holds() {
        let s = BudgetState {
            used: 1800,
            limit: 2000,
            source: "webhook".into(),
            raw: "TIER_2K".into(),
            oldest_ms: 1_000,
            held_at_ms: 90_000,
            held_reserved: false,
            now_ms: 100_000,
            ..Default::default()
        };
        let r = row("506914307656634", &s);
        assert_eq!(r[1], "1800 (90%)");
        assert_eq!(r[2], "2000");
        assert_eq!(r[3], "webhook TIER_2K");
        assert!(r[5].starts_with("marketing held"), "{}", r[5]);
        let idle = BudgetState { limit: -1, held_at_ms: 1, now_ms: 100_000, ..Default::default() };
        let r = row("9", &idle);
        assert_eq!((r[2].as_str(), r[5].as_str()), ("unlimited", "-"));
    }
}
