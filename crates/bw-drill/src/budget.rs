//! The portfolio messaging limit's rows (issue #36 item 2; meta-cloud-api.md §3.3), in a scenario that announces
//! a tier (`business_capability_update`): every message the dispatchers' budget held, judged for two rules.
//!
//! - **No OTP held within the reserve:** an authentication message is held only once the portfolio used its
//!   whole limit. The figures are the ones its hold wrote into the ledger (the feed event whose reason starts
//!   with [`HELD_PREFIX`]: "N of L unique users reached"), read as the run published them.
//! - **Marketing held first:** no authentication, utility or support message held before the first marketing
//!   one, by the `budget_held` outcomes' times (every hold, from every dispatcher) and the feed's.
//!
//! Pure functions of what the drill observed, unit-tested without a drill.

use bw_meta_sim::{EventKind, Scenario};
use bw_proto::v1::Category;
use std::collections::BTreeMap;

/// The start of the ledger reason a budget hold writes (`bw-dispatcher` `budget::HELD_PREFIX`; the drill reads
/// the feed as a producer would, so it matches the text rather than linking the service).
pub const HELD_PREFIX: &str = "held: portfolio messaging limit";

/// A hold the drill saw: seconds since the drill's start, the operation, and the portfolio's figures when the
/// feed carried them (None for a `budget_held` outcome, which has no figures).
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    pub t: f64,
    pub operation_id: String,
    pub figures: Option<(i64, i64)>,
}

/// The figures of a hold's reason: (unique users reached, limit).
pub fn figures(reason: &str) -> Option<(i64, i64)> {
    let rest = reason.strip_prefix(HELD_PREFIX)?;
    let head = &rest[..rest.find(" unique users reached")?];
    let (used, limit) = head.rsplit(": ").next()?.split_once(" of ")?;
    Some((used.trim().parse().ok()?, limit.trim().parse().ok()?))
}

/// Whether the scenario announces a portfolio tier, so the budget's rows are its own.
pub fn announces_tier(scenario: &Scenario) -> bool {
    scenario.events.iter().any(|e| matches!(e.kind, EventKind::BusinessCapabilityUpdate { .. }))
}

/// The two rows' figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BudgetCheck {
    /// Distinct operations held, by category label.
    pub held: BTreeMap<String, u64>,
    /// First hold of each category, seconds since the start.
    pub first_held_s: BTreeMap<String, f64>,
    /// Authentication messages held, and those of them held while the portfolio had not used its whole limit.
    pub otp_held: u64,
    pub otp_within_reserve: u64,
    /// Authentication holds whose figures the feed gave (the others were seen only as outcomes).
    pub otp_with_figures: u64,
    /// The figures of the first marketing hold: (used, limit).
    pub marketing_first_figures: Option<(i64, i64)>,
    /// Holds of authentication, utility or support messages before the first marketing hold.
    pub priority_before_marketing: u64,
}

impl BudgetCheck {
    fn count(&self, category: Category) -> u64 {
        self.held.get(category.label()).copied().unwrap_or(0)
    }

    /// Marketing was held at all: the reserve was entered, so the reserve row has something to judge.
    pub fn reserve_entered(&self) -> bool {
        self.count(Category::Marketing) > 0
    }

    /// Every held OTP's figures were read from the feed (else the row is not measured).
    pub fn otp_figures_complete(&self) -> bool {
        self.otp_with_figures == self.otp_held
    }

    pub fn otp_kept_reserve(&self) -> bool {
        self.otp_within_reserve == 0
    }

    pub fn marketing_first(&self) -> bool {
        let first = self.first_held_s.iter().min_by(|a, b| a.1.total_cmp(b.1)).map(|(c, _)| c.as_str());
        self.priority_before_marketing == 0 && first == Some(Category::Marketing.label())
    }

    pub fn any_held(&self) -> bool {
        self.held.values().any(|n| *n > 0)
    }
}

/// Judges the holds; `category` gives each operation's category (from the ledger).
pub fn check(holds: &[Hold], category: impl Fn(&str) -> Option<Category>) -> BudgetCheck {
    let mut c = BudgetCheck::default();
    // Per operation: its category, first hold, and the figures of its first hold that carried some.
    type Held = (Category, f64, Option<(i64, i64)>);
    let mut ops: BTreeMap<&str, Held> = BTreeMap::new();
    let mut sorted: Vec<&Hold> = holds.iter().collect();
    sorted.sort_by(|a, b| a.t.total_cmp(&b.t));
    for h in sorted {
        let cat = category(&h.operation_id).unwrap_or(Category::Unspecified);
        let e = ops.entry(h.operation_id.as_str()).or_insert((cat, h.t, None));
        e.2 = e.2.or(h.figures);
    }
    let first_marketing = ops.values().filter(|o| o.0 == Category::Marketing).map(|o| o.1).reduce(f64::min);
    c.marketing_first_figures = ops
        .values()
        .filter(|o| o.0 == Category::Marketing && o.2.is_some())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .and_then(|o| o.2);
    for (cat, t, figures) in ops.values() {
        *c.held.entry(cat.label().to_string()).or_default() += 1;
        let first = c.first_held_s.entry(cat.label().to_string()).or_insert(*t);
        *first = first.min(*t);
        if cat.is_priority() && first_marketing.is_none_or(|m| *t < m) {
            c.priority_before_marketing += 1;
        }
        if *cat == Category::Authentication {
            c.otp_held += 1;
            if let Some((used, limit)) = figures {
                c.otp_with_figures += 1;
                // Unlimited (-1) never holds; any other limit not yet reached is room in the reserve.
                if *limit < 0 || used < limit {
                    c.otp_within_reserve += 1;
                }
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(t: f64, op: &str, figures: Option<(i64, i64)>) -> Hold {
        Hold { t, operation_id: op.into(), figures }
    }

    fn cat(op: &str) -> Option<Category> {
        Some(match op.as_bytes().first() {
            Some(b'm') => Category::Marketing,
            Some(b'a') => Category::Authentication,
            Some(b'u') => Category::Transactional,
            _ => return None,
        })
    }

    #[test]
    fn figures_come_from_the_dispatchers_reason() {
        // The text `bw-dispatcher` budget::held_reason writes.
        let r = "held: portfolio messaging limit of portfolio 506914307656634: 9000 of 10000 unique users reached in \
                 24 h, marketing may use 9000 (the rest is reserved for authentication and utility); waits for the \
                 window to slide or the tier to rise";
        assert_eq!(figures(r), Some((9000, 10000)));
        assert_eq!(figures("retries exhausted"), None);
        assert_eq!(figures(&format!("{HELD_PREFIX} of portfolio p: x of 10 unique users reached")), None);
    }

    #[test]
    fn marketing_first_and_otps_held_only_past_the_whole_limit() {
        let holds = [
            hold(60.0, "m1", Some((9000, 10000))),
            hold(60.5, "m1", None),
            hold(61.0, "m2", None),
            hold(80.0, "u1", Some((10000, 10000))),
            hold(80.2, "a1", Some((10000, 10000))),
            hold(81.0, "a1", None),
        ];
        let c = check(&holds, cat);
        assert_eq!((c.held["marketing"], c.held["transactional"], c.held["authentication"]), (2, 1, 1));
        assert_eq!(c.marketing_first_figures, Some((9000, 10000)));
        assert!(c.reserve_entered() && c.otp_kept_reserve() && c.marketing_first(), "{c:?}");

        // An OTP held at 9,500 of 10,000: within the reserve.
        let mut bad = holds.to_vec();
        bad.push(hold(70.0, "a2", Some((9500, 10000))));
        let c = check(&bad, cat);
        assert_eq!(c.otp_within_reserve, 1);
        assert!(!c.otp_kept_reserve() && c.marketing_first());

        // A utility message held before any marketing: marketing was not held first.
        let mut bad = holds.to_vec();
        bad.push(hold(59.0, "u2", Some((10000, 10000))));
        let c = check(&bad, cat);
        assert_eq!(c.priority_before_marketing, 1);
        assert!(!c.marketing_first());

        // An OTP seen held only as an outcome, never with figures: not shown to be past the limit.
        let c = check(&[hold(60.0, "m1", None), hold(70.0, "a3", None)], cat);
        assert!(!c.otp_figures_complete() && c.marketing_first());
        // Nothing held: nothing measured.
        assert!(!check(&[], cat).any_held());
    }
}
