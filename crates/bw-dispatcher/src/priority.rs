//! Priority follows the message, and deadlines drive recovery.
//!
//! Four rules, applied per sender (phone_number_id):
//!
//! 1. **Lanes.** Lanes are served in the order `rh` (priority replays), `hi` (live priority), `lo` (marketing),
//!    `rp` (marketing replays) (`bw_wire::names::Lane::ALL`). A priority replay is admitted as
//!    `TrafficClass::OlderPriority` (priority: it may take the transactional reserve and needs no replay
//!    headroom); only a marketing replay keeps `TrafficClass::Replay`. The 80 % / 90 % usage rules and the reserve
//!    apply as before, by class.
//! 2. **The priority gate.** A marketing message (`lo` or `rp`) of a sender that has a priority backlog — priority
//!    entries in the DLQ (`bw.dlq.v1.p.<phone>`) or priority replays still in BW_SEND (`rh` lane, including ones being
//!    dispatched) — is held back: a delayed redelivery, not the DLQ, ledger unchanged. The gate looks when a message is
//!    fetched and again each time a message waiting in memory for its slot goes back to admission: a promotion refused
//!    for tokens just before its sender's outage otherwise went as the HALF_OPEN canary, ahead of every priority
//!    message that outage dead-lettered. The delay is `priority_hold_ms` at the first delivery and doubles with each
//!    one up to 8 × ([`gated_hold_ms`]): a promotion behind a 20 s priority backlog comes back 7 times instead of 40
//!    (at a fixed 500 ms the drill's dispatchers redelivered 1,700 held promotions a second, the broker's largest load
//!    after the outage). [`Backlog`] learns every sender's backlog from stream-info requests with subjects (one on the
//!    BW_DLQ and one on the BW_SEND stream of each partition the dispatcher serves), cached per process for
//!    `priority_backlog_refresh_ms`. Stale counts are bounded by that interval: a priority entry dead-lettered just
//!    after a refresh lets that sender's promotions through for at most one interval; a backlog that just cleared holds
//!    them for at most one interval plus 8 × `priority_hold_ms` (messages fetched for the first time since then go at
//!    once). With several dispatchers each caches its own reading (one pair of requests per interval per instance, and
//!    only while it handles marketing messages); they may disagree for up to one interval, never longer. The gate is
//!    skipped for a sender the dispatcher knows is OPEN: its marketing messages fail fast into the DLQ as before
//!    instead of cycling through the broker during the outage. A reading that fails keeps the last known counts
//!    (logged) until a refresh succeeds. Every priority entry in the DLQ counts, including one waiting for its
//!    not-before time or held for manual release (`replay.hold_categories`): it is still an accepted message that has
//!    not gone, so the sender's promotions wait with it (the DLQ runbook says so; hold marketing only to avoid it).
//! 3. **Older priority first.** Within the priority class the older message goes first: a live priority
//!    message (`hi`) of a sender whose priority replays are in the `rh` lane is held back the same way (delayed
//!    redelivery after `priority_hold_ms`, ledger unchanged), so the dead-lettered messages, older and nearer
//!    their deadline, take the sender's whole rate once it closes and drain in backlog ÷ rate. Only the `rh`
//!    lane counts, not the DLQ: an entry waiting there for its not-before time, held for manual release or
//!    behind an OPEN breaker must not stop live OTPs. A live message is held at most until it is
//!    `live_priority_hold_max_ms` old (then it goes in turn with the replays; a replay stuck behind a
//!    recipient's pair back-off or a huge backlog never holds live OTPs longer than that), and never when its
//!    deadline is nearer than that.
//!    The same rule holds fleet-wide in admission: a priority replay (and a live priority message whose deadline
//!    is nearer than `live_priority_hold_max_ms`) is admitted as `TrafficClass::OlderPriority`. While one of
//!    them waits for the sender's tokens, the sender's other priority messages (the live ones older than the
//!    cap, which the gate above no longer holds) take only a full bucket, so the tokens go to the older ones
//!    whichever dispatcher asks first (`lua/admit_send.lua`). Without this the live messages past the cap took
//!    most of the rate in the drill and the last replays trickled out at 2-5 msg/s for 6-30 s (each refused,
//!    redelivered, refused again).
//! 4. **Deadlines.** A message whose deadline passed, or cannot be met — the admission's send slot, or the
//!    refusal's retry-after (for an OPEN breaker: its `open_until`), lies past the deadline — ends EXPIRED with a
//!    precise reason before any call to Meta ([`misses_deadline`], reasons in [`expiry_reason`]). Replay does
//!    the same for a DLQ entry whose deadline passed while its sender stayed OPEN (`bw_ops::moves`), when it
//!    takes the entry (a canary while HALF_OPEN, or after the close); until then the ledger says DLQ.
//!
//! Order inside a batch: every admission round sorts each sender's messages by class (priority, marketing,
//! marketing replay), then deadline (nearest first; none counts as last), then acceptance time
//! ([`admission_order`]), and the admission script hands out tokens and send slots in that order. What "close
//! to the deadline first" means honestly: it holds within one fetched batch (up to `batch_size` messages,
//! plus those held in memory for another round). Across batches JetStream delivers each lane FIFO, so an OTP
//! with a near deadline behind a long queue of the same lane waits its turn; the expiry rule then ends it
//! EXPIRED before any call rather than sending it late. Replay fetches priority entries in DLQ order (oldest
//! first) and the dispatcher sorts what it fetched the same way.

use bw_breaker::{DenyReason, TrafficClass};
use bw_wire::names::{self, Lane};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// True when a message with this deadline (unix ms, 0 = none) would go out after it if it waited `wait_ms`
/// from `now_ms`.
pub(crate) fn misses_deadline(deadline_unix_ms: i64, now_ms: i64, wait_ms: u64) -> bool {
    deadline_unix_ms > 0 && now_ms.saturating_add(wait_ms as i64) > deadline_unix_ms
}

/// The ledger reason of a message expired because it cannot make its deadline. `refusal` is None for an
/// admitted message whose send slot lies past the deadline.
pub(crate) fn expiry_reason(refusal: Option<DenyReason>) -> String {
    match refusal {
        None => "deadline passed before sending".into(),
        Some(DenyReason::BreakerOpen | DenyReason::ForcedOpen) => {
            "deadline before the sender's breaker reopens; never sent".into()
        }
        Some(reason) => format!("deadline before the sender may send again ({}); never sent", reason.label()),
    }
}

/// Rank of a traffic class in serving order (lower first).
fn class_rank(class: TrafficClass) -> u8 {
    match class {
        TrafficClass::Priority | TrafficClass::OlderPriority => 0,
        TrafficClass::Marketing => 1,
        TrafficClass::Replay => 2,
    }
}

/// Sort key of a message inside one sender's admission round: class, then deadline (nearest first, none last),
/// then acceptance time.
pub(crate) fn admission_order(class: TrafficClass, deadline_unix_ms: i64, accepted_at_unix_ms: i64) -> (u8, i64, i64) {
    let deadline = if deadline_unix_ms > 0 { deadline_unix_ms } else { i64::MAX };
    (class_rank(class), deadline, accepted_at_unix_ms)
}

/// True when the gate applies to a message of this lane: marketing, live or replayed.
pub(crate) fn gated(lane: Lane) -> bool {
    lane.is_marketing()
}

/// True when a live message's deadline (unix ms, 0 = none) is nearer than `max_hold_ms`: rule 3 never holds it,
/// and admission serves it before the sender's other live priority traffic (`TrafficClass::OlderPriority`).
pub(crate) fn near_deadline(deadline_unix_ms: i64, now_ms: i64, max_hold_ms: u64) -> bool {
    max_hold_ms > 0 && deadline_unix_ms > 0 && deadline_unix_ms.saturating_sub(now_ms) <= max_hold_ms as i64
}

/// True when rule 3 may hold a live priority message: it is young enough (accepted less than `max_hold_ms`
/// ago) and its deadline, if any, is further away than that.
pub(crate) fn holds_live_priority(
    lane: Lane,
    accepted_at_unix_ms: i64,
    deadline_unix_ms: i64,
    now_ms: i64,
    max_hold_ms: u64,
) -> bool {
    let max_hold = max_hold_ms as i64;
    lane == Lane::High
        && max_hold > 0
        && now_ms.saturating_sub(accepted_at_unix_ms) < max_hold
        && !near_deadline(deadline_unix_ms, now_ms, max_hold_ms)
}

/// Per-sender counts, as last read.
#[derive(Default)]
struct Reading {
    at: Option<Instant>,
    counts: Arc<HashMap<String, u64>>,
}

/// Per-process cache of every sender's priority backlog (priority DLQ entries plus `rh` lane messages, for the
/// marketing gate) and of its `rh` lane alone (rule 3). Each reading is refreshed only when asked for, so a
/// dispatcher that sees no marketing never reads the DLQ, and one that sees no live priority never reads the
/// rh lane on its own.
pub(crate) struct Backlog {
    js: async_nats::jetstream::Context,
    /// The BW_SEND partitions whose `rh` lanes are read: those this dispatcher serves, which hold every sender
    /// it gates (a sender lives in one partition).
    partitions: Vec<usize>,
    refresh: Duration,
    backlog: tokio::sync::Mutex<Reading>,
    replays: tokio::sync::Mutex<Reading>,
}

impl Backlog {
    pub(crate) fn new(js: async_nats::jetstream::Context, partitions: Vec<usize>, refresh: Duration) -> Backlog {
        Backlog {
            js,
            partitions,
            refresh,
            backlog: tokio::sync::Mutex::new(Reading::default()),
            replays: tokio::sync::Mutex::new(Reading::default()),
        }
    }

    /// Priority messages of `phone_number_id` waiting in the DLQ or the `rh` lane, as of at most one refresh
    /// interval ago. Concurrent callers share one refresh.
    pub(crate) async fn waiting(&self, phone_number_id: &str) -> u64 {
        self.count(&self.backlog, true, phone_number_id).await
    }

    /// Priority replays of `phone_number_id` in the `rh` lane (rule 3), as of at most one refresh interval ago.
    pub(crate) async fn replaying(&self, phone_number_id: &str) -> u64 {
        self.count(&self.replays, false, phone_number_id).await
    }

    async fn count(&self, cache: &tokio::sync::Mutex<Reading>, with_dlq: bool, phone_number_id: &str) -> u64 {
        let mut reading = cache.lock().await;
        if reading.at.is_none_or(|at| at.elapsed() >= self.refresh) {
            match self.read(with_dlq).await {
                Ok(counts) => reading.counts = Arc::new(counts),
                Err(e) => tracing::warn!(error = %e, "priority backlog unavailable; keeping the last reading"),
            }
            reading.at = Some(Instant::now());
        }
        reading.counts.get(phone_number_id).copied().unwrap_or(0)
    }

    async fn read(&self, with_dlq: bool) -> anyhow::Result<HashMap<String, u64>> {
        let mut waiting = HashMap::new();
        let mut sources: Vec<(String, String)> = self
            .partitions
            .iter()
            .map(|&p| (names::SendPartitions::stream(p), names::SendPartitions::lane_filter(p, Lane::PriorityReplay)))
            .collect();
        if with_dlq {
            // The DLQ follows the send partitions: the same partitions hold these senders' dead letters.
            for &p in &self.partitions {
                sources.push((names::SendPartitions::dlq_stream(p), names::SendPartitions::dlq_priority_wildcard(p)));
            }
        }
        for (stream, filter) in &sources {
            let handle = self.js.get_stream(stream).await?;
            let mut subjects = handle.info_with_subjects(filter).await?;
            while let Some(item) = subjects.next().await {
                let (subject, count) = item?;
                if count > 0 {
                    *waiting.entry(names::phone_of_subject(&subject).to_string()).or_default() += count as u64;
                }
            }
        }
        Ok(waiting)
    }
}

/// Redelivery delay of a marketing message the priority gate holds back at its `delivered`-th delivery: `base`
/// doubled per earlier delivery, at most 8 × `base`.
pub(crate) fn gated_hold_ms(base: u64, delivered: i64) -> u64 {
    crate::backoff::doubled(base, (delivered.max(1) - 1).min(3) as u32, base.saturating_mul(8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gated_promotion_comes_back_later_each_time_up_to_8_times_the_hold() {
        let delays: Vec<u64> = (1..=6).map(|d| gated_hold_ms(500, d)).collect();
        assert_eq!(delays, [500, 1_000, 2_000, 4_000, 4_000, 4_000]);
        assert_eq!(gated_hold_ms(500, 0), 500);
    }

    #[test]
    fn a_deadline_is_missed_only_when_the_wait_passes_it() {
        assert!(!misses_deadline(0, 1_000, u64::MAX), "no deadline is never missed");
        assert!(!misses_deadline(2_000, 1_000, 1_000), "going out exactly at the deadline makes it");
        assert!(misses_deadline(2_000, 1_000, 1_001));
        assert!(misses_deadline(2_000, 2_001, 0), "a passed deadline is missed without any wait");
    }

    #[test]
    fn priority_then_nearest_deadline_then_oldest() {
        let mut rows = [
            ("replay", admission_order(TrafficClass::Replay, 0, 1)),
            ("promo", admission_order(TrafficClass::Marketing, 0, 1)),
            ("order-old", admission_order(TrafficClass::Priority, 0, 1)),
            ("order-new", admission_order(TrafficClass::Priority, 0, 2)),
            ("otp-far", admission_order(TrafficClass::Priority, 90_000, 0)),
            ("otp-near", admission_order(TrafficClass::Priority, 10_000, 5)),
        ];
        rows.sort_by_key(|r| r.1);
        let order: Vec<&str> = rows.iter().map(|r| r.0).collect();
        assert_eq!(order, ["otp-near", "otp-far", "order-old", "order-new", "promo", "replay"]);
    }

    #[test]
    fn only_marketing_lanes_wait_for_the_priority_backlog() {
        let gated_lanes: Vec<Lane> = Lane::ALL.into_iter().filter(|l| gated(*l)).collect();
        assert_eq!(gated_lanes, [Lane::Low, Lane::Replay]);
    }

    #[test]
    fn only_young_live_priority_messages_far_from_their_deadline_wait_for_the_replays() {
        let now = 100_000;
        let hold = |lane, accepted, deadline| holds_live_priority(lane, accepted, deadline, now, 30_000);
        assert!(hold(Lane::High, now - 1_000, 0), "a fresh live priority message waits for the older replays");
        assert!(hold(Lane::High, now - 1_000, now + 600_000), "an OTP with ten minutes left waits too");
        assert!(!hold(Lane::High, now - 30_000, 0), "held at most until it is live_priority_hold_max_ms old");
        assert!(!hold(Lane::High, now - 1_000, now + 30_000), "never when its deadline is nearer than that");
        for lane in [Lane::PriorityReplay, Lane::Low, Lane::Replay] {
            assert!(!hold(lane, now, 0), "{lane:?} is not a live priority lane");
        }
        assert!(!holds_live_priority(Lane::High, now, 0, now, 0), "0 switches the rule off");
    }

    #[test]
    fn a_live_message_is_near_its_deadline_within_the_hold_cap() {
        let now = 100_000;
        assert!(near_deadline(now + 30_000, now, 30_000), "30 s left at a 30 s cap: goes first");
        assert!(!near_deadline(now + 30_001, now, 30_000));
        assert!(!near_deadline(0, now, 30_000), "no deadline is never near");
        assert!(!near_deadline(now + 1, now, 0), "0 switches the rule off");
        assert_eq!(class_rank(TrafficClass::OlderPriority), class_rank(TrafficClass::Priority), "one class");
    }

    #[test]
    fn expiry_reasons_name_what_stood_in_the_way() {
        assert!(expiry_reason(Some(DenyReason::BreakerOpen)).contains("breaker reopens"));
        assert!(expiry_reason(Some(DenyReason::ForcedOpen)).contains("breaker reopens"));
        let paused = expiry_reason(Some(DenyReason::Paused));
        assert!(paused.contains(DenyReason::Paused.label()), "{paused}");
        assert_eq!(expiry_reason(None), "deadline passed before sending");
    }
}
