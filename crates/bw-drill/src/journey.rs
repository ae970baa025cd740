//! Per-category figures of the drill's report, from the ledger (what ingest accepted, when, and where each
//! operation ended) and the simulator's oracle (when Meta accepted it, for which sender and recipient):
//!
//! - the delay from acceptance at ingest to Meta's acceptance (p50 / p99);
//! - for the messages that went through the DLQ: the time from Meta's recovery until the last of them was
//!   accepted, and how many were late against the target "within (priority backlog ÷ sender rate) + 5 s after
//!   the sender closed", the drain time counting the breaker's ramp after the close ([`drain_seconds`]);
//! - order violations: a later message to a recipient accepted by Meta before an earlier one of the same sender
//!   (counted on the later message's category);
//! - live promotions Meta accepted while a dead-lettered priority message of the same sender still waited.
//!
//! Pure functions over plain data, unit-tested below.

use bw_meta_sim::OracleSnapshot;
use bw_proto::v1::{Category, LedgerEntry, OperationState};
use serde::Serialize;
use std::collections::BTreeMap;

/// Slack added to the priority recovery target (issue target: backlog ÷ rate + 5 s).
pub const PRIORITY_SLACK_MS: i64 = 5_000;

/// Figures of one category.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CategoryRow {
    pub category: String,
    /// Accepted by ingest.
    pub messages: u64,
    /// Accepted by Meta (oracle), once or more.
    pub accepted_by_meta: u64,
    pub expired: u64,
    pub quarantined: u64,
    /// Ingest → Meta acceptance, seconds.
    pub delay_p50_s: Option<f64>,
    pub delay_p99_s: Option<f64>,
    /// Messages that went through the DLQ and were accepted by Meta after a replay.
    pub dead_lettered: u64,
    pub dead_lettered_delay_p50_s: Option<f64>,
    pub dead_lettered_delay_p99_s: Option<f64>,
    /// From Meta's recovery until the last dead-lettered message of the category was accepted, seconds.
    pub last_dead_lettered_after_recovery_s: Option<f64>,
    /// Later messages to a recipient accepted by Meta before an earlier one of the same sender.
    pub order_violations: u64,
}

/// Per-category figures plus the fleet-wide recovery checks.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Journey {
    pub categories: Vec<CategoryRow>,
    /// Dead-lettered priority messages accepted later than (sender's priority backlog ÷ sender rate) + 5 s
    /// after their sender closed.
    pub priority_late: u64,
    /// Dead-lettered priority messages the target applies to (their sender closed after the outage).
    pub priority_checked: u64,
    /// Live (never dead-lettered) marketing messages accepted by Meta after the recovery while a dead-lettered
    /// priority message of the same sender was still waiting.
    pub promotions_ahead_of_priority: u64,
    /// The target per sender, so a miss can be traced to its sender.
    pub priority_by_sender: Vec<SenderRecovery>,
}

/// The priority recovery target of one sender.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SenderRecovery {
    pub sender: String,
    /// Dead-lettered priority messages, and how many were accepted after the bound.
    pub checked: u64,
    pub late: u64,
    /// Seconds from Meta's recovery to the sender's close, to the bound, and to its last dead-lettered priority
    /// message's acceptance.
    pub closed_s: f64,
    pub bound_s: f64,
    pub last_s: f64,
}

/// What the journey is computed from.
pub struct JourneyInputs<'a> {
    pub entries: &'a [LedgerEntry],
    pub oracle: &'a OracleSnapshot,
    /// Unix ms Meta recovered (end of the outage), if the scenario had one.
    pub recovery_unix_ms: Option<i64>,
    /// Unix ms each sender's breaker closed after the recovery.
    pub closed_unix_ms: &'a BTreeMap<String, i64>,
    /// The rate each sender runs at, msg/s.
    pub sender_rate: f64,
    /// The breaker's ramp after a close: its length, ms, and the share of the rate it starts from.
    pub ramp_ms: u64,
    pub ramp_start: f64,
}

/// Seconds a sender needs for `n` messages from its close, at `rate` msg/s after a linear ramp from
/// `ramp_start` of it over `ramp_ms` (the breaker's ramp, `lua/scope_prelude.lua` `ramp_fraction`; issue #17
/// requires it: after any pause sending resumes gradually).
pub fn drain_seconds(n: f64, rate: f64, ramp_ms: u64, ramp_start: f64) -> f64 {
    let rate = rate.max(0.001);
    let ramp = ramp_ms as f64 / 1000.0;
    let start = ramp_start.clamp(0.01, 1.0);
    if ramp <= 0.0 || start >= 1.0 {
        return n / rate;
    }
    let ramp_area = rate * ramp * (1.0 + start) / 2.0;
    if n >= ramp_area {
        return ramp + (n - ramp_area) / rate;
    }
    // rate·(start·t + (1 − start)·t² / (2·ramp)) = n
    let a = (1.0 - start) / (2.0 * ramp);
    (-start + (start * start + 4.0 * a * n / rate).sqrt()) / (2.0 * a)
}

const ORDERED: [Category; 4] =
    [Category::Authentication, Category::Transactional, Category::Support, Category::Marketing];

/// One operation as the journey sees it.
struct Op<'a> {
    entry: &'a LedgerEntry,
    /// First acceptance by Meta, unix ms.
    meta_ms: Option<i64>,
    /// Position of that acceptance among all of Meta's (exact where milliseconds tie; 0 from an old oracle).
    meta_seq: u64,
    recipient_key: Option<&'a str>,
}

impl Op<'_> {
    fn dead_lettered(&self) -> bool {
        self.entry.replays > 0 || !self.entry.incident_id.is_empty()
    }
}

pub fn compute(i: &JourneyInputs<'_>) -> Journey {
    let by_op: BTreeMap<&str, &bw_meta_sim::OracleEntry> =
        i.oracle.messages.iter().filter_map(|m| Some((m.operation_id.as_deref()?, m))).collect();
    let ops: Vec<Op<'_>> = i
        .entries
        .iter()
        .map(|entry| {
            let m = by_op.get(entry.operation_id.as_str());
            Op {
                entry,
                meta_ms: m.map(|m| m.first_accepted_ms as i64),
                meta_seq: m.map(|m| m.first_accept_seq).unwrap_or(0),
                recipient_key: m.map(|m| m.recipient_key.as_str()),
            }
        })
        .collect();

    let violations = order_violations(&ops);
    let mut categories = Vec::new();
    for category in ORDERED {
        let of: Vec<&Op<'_>> = ops.iter().filter(|o| o.entry.category() == category).collect();
        if of.is_empty() {
            continue;
        }
        // Milliseconds from ingest's acceptance to Meta's (one machine's clock; never below 0).
        let delay = |o: &&Op<'_>| o.meta_ms.map(|m| (m - o.entry.accepted_at_unix_ms).max(0) as u64);
        let mut all: Vec<u64> = of.iter().filter_map(delay).collect();
        let mut dead: Vec<u64> = of.iter().filter(|o| o.dead_lettered()).filter_map(delay).collect();
        let last_dead = of.iter().filter(|o| o.dead_lettered()).filter_map(|o| o.meta_ms).max();
        let state = |s: OperationState| of.iter().filter(|o| o.entry.state() == s).count() as u64;
        categories.push(CategoryRow {
            category: category.label().to_string(),
            messages: of.len() as u64,
            accepted_by_meta: of.iter().filter(|o| o.meta_ms.is_some()).count() as u64,
            expired: state(OperationState::Expired),
            quarantined: state(OperationState::Quarantined),
            dead_lettered: dead.len() as u64,
            delay_p50_s: crate::figures::percentile(&mut all, 0.50),
            delay_p99_s: crate::figures::percentile(&mut all, 0.99),
            dead_lettered_delay_p50_s: crate::figures::percentile(&mut dead, 0.50),
            dead_lettered_delay_p99_s: crate::figures::percentile(&mut dead, 0.99),
            last_dead_lettered_after_recovery_s: match (last_dead, i.recovery_unix_ms) {
                (Some(last), Some(rec)) => Some((last - rec) as f64 / 1000.0),
                _ => None,
            },
            order_violations: violations.get(&category).copied().unwrap_or(0),
        });
    }

    // Priority recovery, per sender.
    let mut priority_late = 0;
    let mut priority_checked = 0;
    let mut promotions_ahead = 0;
    let mut by_sender = Vec::new();
    let mut senders: BTreeMap<&str, Vec<&Op<'_>>> = BTreeMap::new();
    for o in &ops {
        senders.entry(o.entry.phone_number_id.as_str()).or_default().push(o);
    }
    for (sender, of) in senders {
        let waiting: Vec<i64> = of
            .iter()
            .filter(|o| o.entry.category().is_priority() && o.dead_lettered())
            .filter_map(|o| o.meta_ms)
            .collect();
        let Some(last_priority) = waiting.iter().copied().max() else { continue };
        if let Some(closed) = i.closed_unix_ms.get(sender) {
            let drain = drain_seconds(waiting.len() as f64, i.sender_rate, i.ramp_ms, i.ramp_start);
            let bound = closed + (drain * 1000.0) as i64 + PRIORITY_SLACK_MS;
            let late = waiting.iter().filter(|at| **at > bound).count() as u64;
            priority_checked += waiting.len() as u64;
            priority_late += late;
            let rec = i.recovery_unix_ms.unwrap_or(*closed);
            let after = |at: i64| (at - rec) as f64 / 1000.0;
            by_sender.push(SenderRecovery {
                sender: sender.to_string(),
                checked: waiting.len() as u64,
                late,
                closed_s: after(*closed),
                bound_s: after(bound),
                last_s: after(last_priority),
            });
        }
        if let Some(rec) = i.recovery_unix_ms {
            promotions_ahead += of
                .iter()
                .filter(|o| o.entry.category() == Category::Marketing && !o.dead_lettered())
                .filter_map(|o| o.meta_ms)
                .filter(|at| *at >= rec && *at < last_priority)
                .count() as u64;
        }
    }
    Journey {
        categories,
        priority_late,
        priority_checked,
        promotions_ahead_of_priority: promotions_ahead,
        priority_by_sender: by_sender,
    }
}

fn secs(v: Option<f64>) -> String {
    crate::figures::secs_or(v, "-")
}

/// The per-category table and the recovery checks as text lines.
pub fn text(j: &Journey) -> String {
    let mut s = String::from(
        "per category: messages / accepted by Meta / expired / quarantined | ingest->Meta p50 p99 | dead-lettered n p50 p99, last accepted after recovery | order violations\n",
    );
    for r in &j.categories {
        s.push_str(&format!(
            "  {:<14} {:>6} / {:>6} / {:>4} / {:>4} | {:>8} {:>8} | {:>5} {:>8} {:>8}, {:>8} | {}\n",
            r.category,
            r.messages,
            r.accepted_by_meta,
            r.expired,
            r.quarantined,
            secs(r.delay_p50_s),
            secs(r.delay_p99_s),
            r.dead_lettered,
            secs(r.dead_lettered_delay_p50_s),
            secs(r.dead_lettered_delay_p99_s),
            secs(r.last_dead_lettered_after_recovery_s),
            r.order_violations,
        ));
    }
    s.push_str(&format!(
        "dead-lettered priority messages accepted later than backlog / rate + 5 s after their sender closed: {} of {}; live promotions accepted while a dead-lettered priority message of the same sender waited: {}\n",
        j.priority_late, j.priority_checked, j.promotions_ahead_of_priority
    ));
    for r in &j.priority_by_sender {
        s.push_str(&format!(
            "  sender {}: {} of {} late; after Meta's recovery it closed at {:.1} s, bound {:.1} s, last accepted {:.1} s\n",
            r.sender, r.late, r.checked, r.closed_s, r.bound_s, r.last_s
        ));
    }
    s
}

/// Order violations by the category of the later message: pairs of one sender and recipient, ordered by
/// acceptance at ingest (equal times are not ordered), where Meta accepted the later one first.
fn order_violations(ops: &[Op<'_>]) -> BTreeMap<Category, u64> {
    // (accepted at ingest, Meta's acceptance order, category) per (sender, recipient key).
    type Sends = Vec<(i64, (u64, i64), Category)>;
    let mut pairs: BTreeMap<(&str, &str), Sends> = BTreeMap::new();
    for o in ops {
        if let (Some(meta), Some(rk)) = (o.meta_ms, o.recipient_key) {
            // Meta's order: its acceptance sequence where the oracle has one, else the millisecond.
            let order = if o.meta_seq > 0 { (o.meta_seq, 0) } else { (0, meta) };
            pairs.entry((o.entry.phone_number_id.as_str(), rk)).or_default().push((
                o.entry.accepted_at_unix_ms,
                order,
                o.entry.category(),
            ));
        }
    }
    let mut out = BTreeMap::new();
    for (_, mut list) in pairs {
        list.sort_unstable_by_key(|(accepted, meta, _)| (*accepted, *meta));
        for (k, later) in list.iter().enumerate() {
            if list[..k].iter().any(|earlier| earlier.0 < later.0 && earlier.1 > later.1) {
                *out.entry(later.2).or_default() += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_meta_sim::OracleEntry;

    fn entry(op: &str, sender: &str, category: Category, accepted: i64, replays: u32) -> LedgerEntry {
        LedgerEntry {
            operation_id: op.into(),
            phone_number_id: sender.into(),
            category: category as i32,
            accepted_at_unix_ms: accepted,
            replays,
            state: OperationState::Sent as i32,
            ..Default::default()
        }
    }

    fn accepted(op: &str, sender: &str, recipient: &str, at: u64) -> OracleEntry {
        OracleEntry {
            operation_id: Some(op.into()),
            phone_number_id: sender.into(),
            recipient_key: recipient.into(),
            recipient_masked: String::new(),
            wamids: vec![format!("wamid.{op}")],
            first_accepted_ms: at,
            first_accept_seq: 0,
            last_accepted_ms: at,
            count: 1,
            unacknowledged: 0,
            acknowledged: vec![true],
            message_type: "template".into(),
            failed: 0,
        }
    }

    #[test]
    fn a_later_message_accepted_first_is_a_violation_of_its_category() {
        let entries = [
            entry("confirm", "s", Category::Transactional, 1_000, 1),
            entry("shipped", "s", Category::Transactional, 2_000, 0),
            entry("other", "s", Category::Marketing, 3_000, 0),
            entry("otp", "s", Category::Authentication, 2_500, 0),
        ];
        let oracle = OracleSnapshot {
            messages: vec![
                accepted("confirm", "s", "r1", 9_000),
                accepted("shipped", "s", "r1", 4_000),
                accepted("other", "s", "r2", 3_100),
                accepted("otp", "s", "r1", 3_000),
            ],
            ..Default::default()
        };
        let j = compute(&JourneyInputs {
            entries: &entries,
            oracle: &oracle,
            recovery_unix_ms: Some(5_000),
            closed_unix_ms: &BTreeMap::new(),
            sender_rate: 10.0,
            ramp_ms: 0,
            ramp_start: 1.0,
        });
        let row = |c: &str| j.categories.iter().find(|r| r.category == c).expect("row").clone();
        assert_eq!(row("transactional").order_violations, 1);
        // The OTP overtook the confirmation too (authentication does not keep order, but it is counted).
        assert_eq!(row("authentication").order_violations, 1);
        assert_eq!(row("marketing").order_violations, 0);
        assert_eq!(row("transactional").dead_lettered, 1);
        assert_eq!(row("transactional").last_dead_lettered_after_recovery_s, Some(4.0));
        assert_eq!(row("transactional").delay_p99_s, Some(8.0));
    }

    #[test]
    fn the_drain_time_counts_the_ramp_after_the_close() {
        assert_eq!(drain_seconds(720.0, 72.0, 0, 0.1), 10.0, "no ramp: backlog ÷ rate");
        // A 5 s ramp from 10 % carries 72 × 5 × 0.55 = 198 messages, the rest go at the full rate.
        assert!((drain_seconds(720.0, 72.0, 5_000, 0.1) - (5.0 + 522.0 / 72.0)).abs() < 1e-9);
        // Inside the ramp: the time whose ramp area is the backlog.
        let t = drain_seconds(50.0, 72.0, 5_000, 0.1);
        let area = 72.0 * (0.1 * t + 0.9 * t * t / 10.0);
        assert!((area - 50.0).abs() < 1e-6, "{t} s carries {area}");
    }

    #[test]
    fn priority_recovery_target_and_promotions_ahead_are_per_sender() {
        let entries = [
            entry("p1", "a", Category::Authentication, 0, 1),
            entry("p2", "a", Category::Transactional, 0, 1),
            entry("m-live", "a", Category::Marketing, 0, 0),
            entry("m-live-b", "b", Category::Marketing, 0, 0),
        ];
        let oracle = OracleSnapshot {
            messages: vec![
                accepted("p1", "a", "r1", 10_500),
                accepted("p2", "a", "r2", 20_000),
                accepted("m-live", "a", "r3", 11_000),
                accepted("m-live-b", "b", "r4", 11_000),
            ],
            ..Default::default()
        };
        let closed = BTreeMap::from([("a".to_string(), 10_000)]);
        let j = compute(&JourneyInputs {
            entries: &entries,
            oracle: &oracle,
            recovery_unix_ms: Some(9_000),
            closed_unix_ms: &closed,
            sender_rate: 2.0,
            ramp_ms: 0,
            ramp_start: 1.0,
        });
        // Bound: 10 s + 2 / 2 per s + 5 s = 16 s: p2 at 20 s is late.
        assert_eq!((j.priority_checked, j.priority_late), (2, 1));
        // Sender a's live promotion went out at 11 s while p2 waited; sender b had no priority backlog.
        assert_eq!(j.promotions_ahead_of_priority, 1);
    }
}
