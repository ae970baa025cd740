//! Send slots, the adaptive rate (AIMD on 130429) and the ramp after a pause, at the compiled default config.

use crate::support::*;
use bw_breaker::{
    AdmitItem, Breaker, Decision, DenyReason, OutcomeItem, OutcomeKind, Scope, ScopeLimits, TrafficClass,
};
use bw_common::classify::RateScope;
use bw_proto::v1::BreakerState;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn batch(tag: &str, n: usize) -> Vec<AdmitItem> {
    (0..n).map(|i| AdmitItem { recipient_key: format!("{tag}-{i}"), class: TrafficClass::Priority }).collect()
}

fn throughput() -> OutcomeKind {
    OutcomeKind::RateLimited { scope: RateScope::PhoneNumber, pause_ms: RateScope::PhoneNumber.default_pause_ms() }
}

fn allowed(decisions: &[Decision]) -> usize {
    decisions.iter().filter(|d| matches!(d, Decision::Allow { .. })).count()
}

/// Waits until the scope admits priority traffic again (its pause ended).
async fn until_unpaused(breaker: &Breaker, scope: &Scope) {
    let ok = bw_testkit::wait_until(WAIT, || async {
        !matches!(
            breaker.admit(scope, &batch("probe", 0)).await.decisions.first(),
            Some(Decision::Deny { reason: DenyReason::Paused, .. })
        ) && breaker.status(scope).await.is_ok_and(|s| s.snapshot.paused_until_unix_ms == 0)
    })
    .await;
    assert!(ok, "the pause never ended");
}

#[tokio::test]
async fn the_sends_of_every_dispatcher_get_slots_spaced_at_the_sender_rate() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let scope = scope();
    let mut dispatchers = Vec::new();
    for _ in 0..4 {
        dispatchers.push(breaker(&redis.url(), limits.clone()).await);
    }
    // Four dispatchers admit at the same moment: the bucket's burst is shared, and the admitted sends get slots
    // one emission interval (1000 / 60 ms) apart fleet-wide instead of leaving together.
    let scope = &scope;
    let answers = futures::future::join_all(
        dispatchers.iter().enumerate().map(|(i, b)| async move { b.admit(scope, &batch(&format!("d{i}"), 5)).await }),
    )
    .await;
    let mut slots: Vec<i64> = Vec::new();
    for a in &answers {
        assert!(!a.degraded);
        for d in &a.decisions {
            if let Decision::Allow { wait_ms, .. } = d {
                slots.push(a.server_now_ms + *wait_ms as i64);
            }
        }
    }
    slots.sort();
    assert!((10..=12).contains(&slots.len()), "the burst of 10 is shared: {}", slots.len());
    let gap = (1000.0 / limits.rate_per_s).floor() as i64;
    for pair in slots.windows(2) {
        assert!(pair[1] - pair[0] >= gap, "slots {slots:?} closer than {gap} ms");
    }
}

#[tokio::test]
async fn a_130429_cuts_the_rate_fleet_wide_and_successes_creep_it_back_never_above_the_configured_rate() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let here = breaker(&redis.url(), limits.clone()).await;
    let there = breaker(&redis.url(), limits.clone()).await;
    let scope = scope();
    assert_eq!(here.status(&scope).await.expect("status").adaptive_share, 1.0);
    here.record(&scope, &outcomes(1, throughput(), false)).await;
    // Another dispatcher spaces its slots at the cut rate: 60 x 0.7 = 42/s, so at least 23 ms apart (once the
    // ramp after the pause is over).
    until_unpaused(&there, &scope).await;
    let ramped = bw_testkit::wait_until(WAIT, || async {
        there.status(&scope).await.is_ok_and(|s| s.snapshot.ramp_fraction >= 1.0 && s.tokens >= 3.0)
    })
    .await;
    assert!(ramped);
    let a = there.admit(&scope, &batch("x", 3)).await;
    let waits: Vec<u64> = a
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Allow { wait_ms, .. } => Some(*wait_ms),
            _ => None,
        })
        .collect();
    assert!(waits.len() >= 2, "{a:?}");
    let gap = (1000.0 / (limits.rate_per_s * limits.aimd_decrease)).floor() as u64;
    for w in waits.windows(2) {
        assert!(w[1] - w[0] >= gap, "waits {waits:?}, gap {gap}");
    }
    // Additive increase per success, capped at the configured rate.
    there.record(&scope, &outcomes(50, OutcomeKind::Success, false)).await;
    let share = here.status(&scope).await.expect("status").adaptive_share;
    let want = limits.aimd_decrease + 50.0 * limits.aimd_increase;
    assert!((share - want).abs() < 1e-3, "share {share}, want {want}");
    there.record(&scope, &outcomes(1_000, OutcomeKind::Success, false)).await;
    assert_eq!(here.status(&scope).await.expect("status").adaptive_share, 1.0);
}

/// A canary goes at `canaries_per_s` while the scope is HALF_OPEN, far below any number's throughput: its
/// 130429 pauses the sender like any other, but is no evidence that the sender's rate is too high, so it does not
/// cut the adaptive share (an outage of k such answers used to leave the share at 0.7^k after the close).
#[tokio::test]
async fn a_130429_answering_a_canary_pauses_the_sender_but_does_not_cut_its_rate() {
    let redis = bw_testkit::RedisServer::start();
    let b = breaker(&redis.url(), ScopeLimits::default()).await;
    let scope = scope();
    b.record(&scope, &outcomes(1, throughput(), true)).await;
    let status = b.status(&scope).await.expect("status");
    assert!(status.snapshot.paused_until_unix_ms > 0, "the canary's 130429 pauses the sender: {status:?}");
    assert_eq!(status.adaptive_share, 1.0, "and does not cut its rate");
    // The same answer to a send at throughput cuts it.
    let other = crate::support::scope();
    b.record(&other, &outcomes(1, throughput(), false)).await;
    assert_eq!(b.status(&other).await.expect("status").adaptive_share, ScopeLimits::default().aimd_decrease);
}

/// A 130429 while Meta fails the number's calls (transient failures at or above the trip threshold in the
/// window) is an outage's answer, not evidence about the sender's rate: it pauses the sender but does not cut the
/// adaptive share. The same 130429 with the window's failures below the threshold cuts it.
#[tokio::test]
async fn a_130429_during_an_outage_pauses_the_sender_but_does_not_cut_its_rate() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let b = breaker(&redis.url(), limits.clone()).await;
    let outage = scope();
    // One 503 in two calls: 50 % failures, far above the threshold, too few calls to trip.
    b.record(&outage, &outcomes(1, OutcomeKind::Success, false)).await;
    b.record(&outage, &outcomes(1, OutcomeKind::Transient, false)).await;
    b.record(&outage, &outcomes(1, throughput(), false)).await;
    let status = b.status(&outage).await.expect("status");
    assert_eq!(status.snapshot.state(), BreakerState::Closed, "{status:?}");
    assert!(status.snapshot.paused_until_unix_ms > 0, "the 130429 pauses the sender: {status:?}");
    assert_eq!(status.adaptive_share, 1.0, "but does not cut its rate during the outage");
    // One 503 in 41 calls (2.4 %, below the 5 % threshold): the 130429 is about throughput and cuts.
    let healthy = crate::support::scope();
    b.record(&healthy, &outcomes(40, OutcomeKind::Success, false)).await;
    b.record(&healthy, &outcomes(1, OutcomeKind::Transient, false)).await;
    b.record(&healthy, &outcomes(1, throughput(), false)).await;
    assert!(limits.failure_threshold > 1.0 / 41.0);
    assert_eq!(b.status(&healthy).await.expect("status").adaptive_share, limits.aimd_decrease);
    // An outage's first second: 200 healthy calls in the window, then 503s to two recipients (1 %, below the
    // threshold, not yet a fast trip) and a 130429: Meta is failing, the 130429 does not cut.
    let starting = crate::support::scope();
    b.record(&starting, &outcomes(200, OutcomeKind::Success, false)).await;
    b.record(&starting, &outcomes(2, OutcomeKind::Transient, false)).await;
    b.record(&starting, &outcomes(1, throughput(), false)).await;
    let status = b.status(&starting).await.expect("status");
    assert_eq!(status.snapshot.state(), BreakerState::Closed, "{status:?}");
    assert_eq!(status.adaptive_share, 1.0, "a 130429 amid an outage's first 503s cut the rate: {status:?}");
}

/// A 130429 just before Meta starts failing the number's calls cuts the share (nothing showed an outage yet), but
/// the trip on those failures gives the cut back: the answer came with the outage. Kept, the share stayed cut
/// through the OPEN time and the backlog drained at a fraction of the rate after the close.
#[tokio::test]
async fn a_trip_on_failures_gives_back_the_cut_of_the_130429_just_before_it() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let b = breaker(&redis.url(), limits.clone()).await;
    let scope = scope();
    b.record(&scope, &outcomes(200, OutcomeKind::Success, false)).await;
    b.record(&scope, &outcomes(1, throughput(), false)).await;
    let status = b.status(&scope).await.expect("status");
    assert_eq!(status.adaptive_share, limits.aimd_decrease, "no failure yet: the 130429 cuts");
    assert_eq!(status.snapshot.state(), BreakerState::Closed, "{status:?}");
    // Meta now fails calls to many recipients: a fast trip.
    b.record(&scope, &outcomes(20, OutcomeKind::Transient, false)).await;
    let status = b.status(&scope).await.expect("status");
    assert_eq!(status.snapshot.state(), BreakerState::Open, "{status:?}");
    assert_eq!(status.adaptive_share, 1.0, "the trip on failures gave the cut back: {status:?}");
}

#[tokio::test]
async fn after_a_pause_sending_resumes_gradually() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let breaker = breaker(&redis.url(), limits.clone()).await;
    // A number pause (130429): when it ends the bucket is at the ramp's start, not full.
    let scope = scope();
    breaker.record(&scope, &outcomes(1, throughput(), false)).await;
    until_unpaused(&breaker, &scope).await;
    let a = breaker.admit(&scope, &batch("a", 10)).await;
    assert!(allowed(&a.decisions) <= 2, "the backlog is not released at once: {a:?}");
    // The ramp ends within twice the pause; then the bucket refills to the (cut) full size.
    let full = (limits.burst * limits.aimd_decrease).floor() as usize;
    let refilled = bw_testkit::wait_until(WAIT, || async {
        let s = breaker.status(&scope).await.expect("status");
        s.snapshot.ramp_fraction >= 1.0 && s.tokens >= full as f64 - 0.01
    })
    .await;
    assert!(refilled);
    assert!(allowed(&breaker.admit(&scope, &batch("b", 10)).await.decisions) >= full);

    // An app pause (its own key) ends: the first admission after it starts the ramp on the number as well.
    let scope = crate::support::scope();
    let app_limit = OutcomeKind::RateLimited { scope: RateScope::App, pause_ms: 1_500 };
    breaker.record(&scope, &outcomes(1, app_limit, false)).await;
    let a = breaker.admit(&scope, &batch("c", 1)).await;
    assert!(matches!(a.decisions[0], Decision::Deny { reason: DenyReason::AppPaused, .. }), "{a:?}");
    let ended = bw_testkit::wait_until(WAIT, || async {
        !matches!(
            breaker.admit(&scope, &batch("d", 0)).await.decisions.first(),
            Some(Decision::Deny { reason: DenyReason::AppPaused, .. })
        ) && !matches!(
            breaker.admit(&scope, &batch("e", 1)).await.decisions[0],
            Decision::Deny { reason: DenyReason::AppPaused, .. }
        )
    })
    .await;
    assert!(ended);
    let status = breaker.status(&scope).await.expect("status");
    assert!(status.snapshot.ramp_fraction < 1.0, "ramping after the app pause: {}", status.snapshot.ramp_fraction);
    assert!(allowed(&breaker.admit(&scope, &batch("f", 10)).await.decisions) <= 2);
}

/// A stand-in for Meta's throughput limit: at most `limit` accepted sends in any 1 s (by arrival time).
struct MetaThroughput {
    limit: usize,
    accepted: VecDeque<i64>,
}

impl MetaThroughput {
    fn send(&mut self, at: i64) -> bool {
        while self.accepted.front().is_some_and(|t| *t <= at - 1_000) {
            self.accepted.pop_front();
        }
        if self.accepted.len() >= self.limit {
            return false;
        }
        self.accepted.push_back(at);
        true
    }
}

#[tokio::test]
async fn the_fleet_converges_below_a_meta_limit_lower_than_the_configured_rate() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    // Two dispatchers, configured for 60/s; the number really allows 20/s (a coexistence number).
    let fleet = [breaker(&redis.url(), limits.clone()).await, breaker(&redis.url(), limits.clone()).await];
    let scope = scope();
    let mut meta = MetaThroughput { limit: 20, accepted: VecDeque::new() };
    let run = Duration::from_secs(15);
    let started = Instant::now();
    let mut start_ms = None;
    // (arrival ms, refused with 130429)
    let mut sends: Vec<(i64, bool)> = Vec::new();
    let mut round = 0usize;
    while started.elapsed() < run {
        round += 1;
        let b = &fleet[round % 2];
        let a = b.admit(&scope, &batch(&format!("r{round}"), 4)).await;
        assert!(!a.degraded);
        let t0 = *start_ms.get_or_insert(a.server_now_ms);
        let mut results = Vec::new();
        let mut longest = 0;
        let mut retry = 200;
        for d in &a.decisions {
            match d {
                Decision::Allow { wait_ms, .. } => {
                    let at = a.server_now_ms + *wait_ms as i64;
                    let ok = meta.send(at);
                    sends.push((at - t0, !ok));
                    results.push(OutcomeItem {
                        recipient_key: format!("r{round}"),
                        kind: if ok { OutcomeKind::Success } else { throughput() },
                        canary: false,
                    });
                    longest = longest.max(*wait_ms);
                }
                Decision::Deny { retry_after_ms, .. } => retry = retry.min(*retry_after_ms),
            }
        }
        if !results.is_empty() {
            let r = b.record(&scope, &results).await;
            assert!(r.transitions.iter().all(|t| t.to() != BreakerState::Open), "tripped: {:?}", r.transitions);
        }
        // Like a dispatcher: sleep until the last slot, or until the refusal's retry-after.
        let nap = if results.is_empty() { retry.clamp(1, 200) } else { longest };
        tokio::time::sleep(Duration::from_millis(nap)).await;
    }
    let third = sends.last().map_or(0, |s| s.0) / 3;
    let refused = |from: i64, to: i64| sends.iter().filter(|(at, r)| *r && *at >= from && *at < to).count();
    let (first, last) = (refused(0, third), refused(2 * third, i64::MAX));
    let share = fleet[0].status(&scope).await.expect("status").adaptive_share;
    println!("sends {}, 130429 first third {first}, last third {last}, adaptive share {share:.3}", sends.len());
    assert!(first > 0, "Meta's lower limit was hit at first");
    assert!(last < first, "fewer 130429 once the rate has adapted: first {first}, last {last}");
    assert!(share < 0.6, "the learned rate is near Meta's 20/s, not the configured 60/s: {share}");
    assert_eq!(fleet[0].status(&scope).await.expect("status").snapshot.state(), BreakerState::Closed);
}

/// After repeated 130429s the adaptive share shrinks the bucket below the priority reserve plus the replay
/// headroom. With no live traffic nothing else succeeds, so the share only grows back if replay is admitted:
/// once the (smaller) bucket is full, replayed messages go (the drill's DLQ once never drained).
#[tokio::test]
async fn replay_is_admitted_once_a_bucket_shrunk_by_the_adaptive_share_is_full() {
    let redis = bw_testkit::RedisServer::start();
    let limits = ScopeLimits::default();
    let b = breaker(&redis.url(), limits.clone()).await;
    let scope = scope();
    // Separate episodes (aimd_cut_gap_ms apart) cut the share; fewer than the consecutive rate-limit episodes
    // that trip the breaker.
    for _ in 0..limits.consecutive_rate_limits.saturating_sub(1) {
        b.record(&scope, &outcomes(1, throughput(), false)).await;
        tokio::time::sleep(Duration::from_millis(limits.aimd_cut_gap_ms + 50)).await;
    }
    let share = b.status(&scope).await.expect("status").adaptive_share;
    let cap = limits.burst * share;
    assert!(
        cap < limits.burst * limits.reserve_fraction + limits.replay_headroom + 1.0,
        "the share ({share}) leaves a bucket ({cap}) smaller than what replay needed before"
    );
    until_unpaused(&b, &scope).await;
    let replay = [AdmitItem { recipient_key: "replayed".into(), class: TrafficClass::Replay }];
    let admitted = bw_testkit::wait_until(WAIT, || async {
        matches!(b.admit(&scope, &replay).await.decisions.first(), Some(Decision::Allow { .. }))
    })
    .await;
    assert!(
        admitted,
        "replay never admitted: {:?} {:?}",
        b.status(&scope).await.map(|s| s.tokens),
        b.admit(&scope, &replay).await.decisions
    );
}
